#pragma once
// JSON helpers shared by the emulator: YAML bodies, the small JSONPath
// subset printer columns and scale paths use, timestamps, base64.
//
// Supported JSONPath: ".a.b", ".a[0].b", ".a[?(@.type==\"Ready\")].status"
// (an equality filter picks the first match). Nothing else: a real server
// also evaluates ranges, wildcards and unions.

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "src/common/clock.h"

namespace tandem::apiserver {

// Parses YAML (one document; JSON is YAML) into JSON. Quoted scalars stay
// strings; plain ones become null, booleans, integers or floats where they
// read as such (YAML 1.2 core schema). Throws std::runtime_error with the
// parser's message.
nlohmann::json yamlToJson(std::string_view text);

// The value at a simple JSONPath, or nullopt when any step is missing.
std::optional<nlohmann::json> evalJsonPath(const nlohmann::json& root, std::string_view path);
// Sets the value at a dotted path (".spec.replicas"), creating objects on the way.
void setJsonPath(nlohmann::json& root, std::string_view path, nlohmann::json value);

// "2024-05-01T12:00:00Z" (RFC 3339, seconds) and with microseconds, as
// metav1.Time and metav1.MicroTime serialise. `at` comes from the server's clock.
std::string rfc3339(WallTime at);
std::string rfc3339Micro(WallTime at);

std::string base64Encode(std::string_view bytes);

// A random lowercase alphanumeric suffix (generateName) and a random UUID.
std::string randomSuffix(size_t n);
std::string newUid();

}  // namespace tandem::apiserver
