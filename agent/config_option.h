#pragma once
// The option table behind tandem-agent's flags and YAML file: each option
// knows its flag, its YAML section and key, its help line and how to read
// itself from either. agent_config.cc owns the table and its sections;
// sections that belong to one role live beside that role's code
// (router/router_options.cc). Internal to agent/.

#include <charconv>
#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/agent_config.h"
#include "src/common/config.h"
#include "src/common/status.h"
#include "src/common/strings.h"

namespace tandem::agent {

// One option: its flag, its YAML path (section.key), help, and how to set it
// from a flag string or a YAML map. The same table drives --help, the YAML
// reader and the flag parser.
struct Option {
  const char* flag;
  const char* section;  // "" for top level
  const char* key;
  const char* help;
  std::function<std::string(const AgentConfig&)> show;
  std::function<absl::Status(AgentConfig&, std::string_view)> fromFlag;
  std::function<void(AgentConfig&, ConfigMap&)> fromYaml;
};

template <typename T>
absl::Status parseNumber(std::string_view flag, std::string_view text, T* out, double min, double max) {
  T v{};
  auto res = std::from_chars(text.data(), text.data() + text.size(), v);
  if (res.ec != std::errc() || res.ptr != text.data() + text.size()) {
    return absl::InvalidArgumentError(strCat("--", flag, ": expected a number, got \"", text, "\""));
  }
  if (static_cast<double>(v) < min || static_cast<double>(v) > max) {
    return absl::InvalidArgumentError(strCat("--", flag, ": ", text, " is out of range [", min, ", ", max, "]"));
  }
  *out = v;
  return absl::OkStatus();
}

template <typename T>
Option numberOption(const char* flag, const char* section, const char* key, const char* help, T AgentConfig::*member,
                    double min, double max) {
  return {flag,
          section,
          key,
          help,
          [member](const AgentConfig& c) { return strCat(c.*member); },
          [=](AgentConfig& c, std::string_view v) { return parseNumber(flag, v, &(c.*member), min, max); },
          [=](AgentConfig& c, ConfigMap& m) { m.field(key, &(c.*member), {.min = min, .max = max}); }};
}

// A number in one of AgentConfig's nested structs (engine:, router:).
template <typename S, typename T>
Option nestedNumber(const char* flag, const char* section, const char* key, const char* help, S AgentConfig::*outer,
                    T S::*member, double min, double max) {
  return {flag,
          section,
          key,
          help,
          [=](const AgentConfig& c) { return strCat(c.*outer.*member); },
          [=](AgentConfig& c, std::string_view v) { return parseNumber(flag, v, &(c.*outer.*member), min, max); },
          [=](AgentConfig& c, ConfigMap& m) { m.field(key, &(c.*outer.*member), {.min = min, .max = max}); }};
}

// A true|false switch in one of AgentConfig's nested structs.
template <typename S>
Option nestedBool(const char* flag, const char* section, const char* key, const char* help, S AgentConfig::*outer,
                  bool S::*member) {
  return {flag,
          section,
          key,
          help,
          [=](const AgentConfig& c) { return std::string(c.*outer.*member ? "true" : "false"); },
          [=](AgentConfig& c, std::string_view v) -> absl::Status {
            if (v != "true" && v != "false") {
              return absl::InvalidArgumentError(strCat("--", flag, ": expected true or false, got \"", v, "\""));
            }
            c.*outer.*member = v == "true";
            return absl::OkStatus();
          },
          [=](AgentConfig& c, ConfigMap& m) { m.field(key, &(c.*outer.*member)); }};
}

// `v` is one of `one_of` (any value when it is empty).
absl::Status checkOneOf(const char* flag, std::string_view v, const std::vector<std::string>& one_of);

Option stringOption(const char* flag, const char* section, const char* key, const char* help,
                    std::string AgentConfig::*member, std::vector<std::string> one_of = {});

Option durationOption(const char* flag, const char* section, const char* key, const char* help,
                      std::chrono::nanoseconds AgentConfig::*member);

// A comma-separated list of HOST:PORT, none twice (`what` names the flag or
// key in errors).
absl::StatusOr<std::vector<HostPort>> parsePeerList(std::string_view what, std::string_view v);

// The router role's section (router/router_options.cc).
void addRouterOptions(std::vector<Option>& options);

}  // namespace tandem::agent
