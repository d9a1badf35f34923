#pragma once
// Command-line flags as tandem-replay and tandem-sim read them: "--name
// value" or "--name=value", each flag at most once, errors naming the flag.

#include <charconv>
#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"
#include "src/common/strings.h"

namespace tandem::replay {

using FlagSetter = std::function<absl::Status(const std::string& name, const std::optional<std::string>& value)>;

// Walks args[begin..] as "--name value" / "--name=value" pairs (a switch
// named by `is_switch` takes no value unless given with '='), each flag at
// most once, handing each to `set`. Returns whether --help was among them.
absl::StatusOr<bool> readFlags(const std::vector<std::string>& args, size_t begin, bool (*is_switch)(std::string_view),
                               const FlagSetter& set);

// A number of type T, at least `min`.
template <typename T>
absl::StatusOr<T> parseNumber(std::string_view flag, const std::optional<std::string>& value, T min) {
  if (!value) return absl::InvalidArgumentError(strCat(flag, " needs a value"));
  T out{};
  const char* end = value->data() + value->size();
  auto [ptr, ec] = std::from_chars(value->data(), end, out);
  if (ec != std::errc() || ptr != end || value->empty()) {
    return absl::InvalidArgumentError(strCat(flag, ": '", *value, "' is not a number"));
  }
  if constexpr (std::is_floating_point_v<T>) {
    if (!std::isfinite(out)) return absl::InvalidArgumentError(strCat(flag, ": '", *value, "' is not finite"));
  }
  if (out < min) return absl::InvalidArgumentError(strCat(flag, " must be >= ", min, ", got ", *value));
  return out;
}

// A comma-separated list of names ("a,b,c"), each passed by `check` and
// none twice; errors name the flag.
absl::StatusOr<std::vector<std::string>> parseNameList(std::string_view flag, const std::optional<std::string>& value,
                                                       const std::function<absl::Status(const std::string&)>& check);

}  // namespace tandem::replay
