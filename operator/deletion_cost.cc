#include "operator/deletion_cost.h"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace tandem::op {

absl::StatusOr<DecodeLoad> parseDecodeLoad(std::string_view text) {
  DecodeLoad load;
  bool seen = false;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty() || line[0] == '#') continue;
    // name{labels} value  |  name value
    const size_t name_end = line.find_first_of("{ ");
    if (name_end == std::string_view::npos) continue;
    const std::string_view name = line.substr(0, name_end);
    int64_t* into = name == "tandem_requests_running"    ? &load.running
                    : name == "tandem_requests_waiting"  ? &load.waiting
                    : name == "tandem_sessions_resident" ? &load.sessions
                                                         : nullptr;
    if (into == nullptr) continue;
    const size_t value_at = line.rfind(' ');
    if (value_at == std::string_view::npos) continue;
    const std::string value(line.substr(value_at + 1));
    char* parsed_end = nullptr;
    const double v = std::strtod(value.c_str(), &parsed_end);
    if (parsed_end == value.c_str() || v < 0) continue;
    *into += static_cast<int64_t>(v);
    seen = true;
  }
  if (!seen) {
    return absl::InvalidArgumentError(
        "no tandem_requests_running, tandem_requests_waiting or tandem_sessions_resident in the agent's metrics");
  }
  return load;
}

int32_t deletionCost(const DecodeLoad& load) {
  const int64_t cost = (load.running + load.waiting) * 1000 + load.sessions;
  return static_cast<int32_t>(std::clamp<int64_t>(cost, 0, INT32_MAX));
}

}  // namespace tandem::op
