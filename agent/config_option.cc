#include "agent/config_option.h"

#include <algorithm>

namespace tandem::agent {

absl::Status checkOneOf(const char* flag, std::string_view v, const std::vector<std::string>& one_of) {
  if (one_of.empty() || std::find(one_of.begin(), one_of.end(), v) != one_of.end()) return absl::OkStatus();
  std::string allowed;
  for (const auto& a : one_of) allowed += (allowed.empty() ? "" : ", ") + a;
  return absl::InvalidArgumentError(strCat("--", flag, ": \"", v, "\" is not one of: ", allowed));
}

Option stringOption(const char* flag, const char* section, const char* key, const char* help,
                    std::string AgentConfig::*member, std::vector<std::string> one_of) {
  return {flag,
          section,
          key,
          help,
          [member](const AgentConfig& c) { return c.*member; },
          [=](AgentConfig& c, std::string_view v) -> absl::Status {
            TANDEM_RETURN_IF_ERROR(checkOneOf(flag, v, one_of));
            c.*member = std::string(v);
            return absl::OkStatus();
          },
          [=](AgentConfig& c, ConfigMap& m) { m.field(key, &(c.*member), {.one_of = one_of}); }};
}

Option durationOption(const char* flag, const char* section, const char* key, const char* help,
                      std::chrono::nanoseconds AgentConfig::*member) {
  return {flag,
          section,
          key,
          help,
          [member](const AgentConfig& c) { return strCat(std::chrono::duration<double>(c.*member).count(), "s"); },
          [=](AgentConfig& c, std::string_view v) -> absl::Status {
            auto d = parseDuration(v);
            if (!d.ok()) return absl::InvalidArgumentError(strCat("--", flag, ": ", toStd(d.status().message())));
            c.*member = *d;
            return absl::OkStatus();
          },
          [=](AgentConfig& c, ConfigMap& m) { m.field(key, &(c.*member), {.min = 0}); }};
}

absl::StatusOr<std::vector<HostPort>> parsePeerList(std::string_view what, std::string_view v) {
  std::vector<HostPort> out;
  size_t start = 0;
  while (true) {
    const size_t comma = std::min(v.find(',', start), v.size());
    TANDEM_ASSIGN_OR_RETURN(HostPort p, parseHostPort(what, v.substr(start, comma - start)));
    for (const HostPort& q : out) {
      if (q.host == p.host && q.port == p.port)
        return absl::InvalidArgumentError(strCat(what, ": ", p.host, ":", p.port, " is listed twice in \"", v, "\""));
    }
    out.push_back(std::move(p));
    if (comma == v.size()) return out;
    start = comma + 1;
  }
}

}  // namespace tandem::agent
