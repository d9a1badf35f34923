#include "e2e/replay/flags.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "src/common/status.h"

namespace tandem::replay {

// (flags.h) Walks args[begin..] as "--name value" / "--name=value" pairs (a switch
// named by `is_switch` takes no value unless given with '='), each flag at
// most once, handing each to `set`. Returns whether --help was among them.
absl::StatusOr<bool> readFlags(const std::vector<std::string>& args, size_t begin, bool (*is_switch)(std::string_view),
                               const FlagSetter& set) {
  absl::flat_hash_set<std::string> seen;
  for (size_t i = begin; i < args.size();) {
    std::string_view arg = args[i++];
    if (!arg.starts_with("--")) return absl::InvalidArgumentError(strCat("unexpected argument '", arg, "'"));
    const size_t eq = arg.find('=');
    const std::string name(arg.substr(0, eq));
    if (!seen.insert(name).second) return absl::InvalidArgumentError(strCat(name, " given twice"));
    std::optional<std::string> value;
    if (eq != std::string_view::npos) {
      value = std::string(arg.substr(eq + 1));
    } else if (!is_switch(name)) {
      if (i >= args.size()) return absl::InvalidArgumentError(strCat(name, " needs a value"));
      value = args[i++];
    }
    if (name == "--help") return true;
    TANDEM_RETURN_IF_ERROR(set(name, value));
  }
  return false;
}

absl::StatusOr<std::vector<std::string>> parseNameList(std::string_view flag, const std::optional<std::string>& value,
                                                       const std::function<absl::Status(const std::string&)>& check) {
  if (!value || value->empty()) return absl::InvalidArgumentError(strCat(flag, " needs a value"));
  std::vector<std::string> out;
  std::string_view rest = *value;
  while (true) {
    const size_t comma = rest.find(',');
    std::string name(rest.substr(0, comma));
    TANDEM_RETURN_IF_ERROR(check(name));
    if (std::find(out.begin(), out.end(), name) != out.end()) {
      return absl::InvalidArgumentError(strCat(flag, " names ", name, " twice"));
    }
    out.push_back(std::move(name));
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return out;
}

}  // namespace tandem::replay
