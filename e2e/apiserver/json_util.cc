#include "e2e/apiserver/json_util.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <random>
#include <stdexcept>

#include <yaml-cpp/yaml.h>

#include "src/common/strings.h"

namespace tandem::apiserver {

using nlohmann::json;

namespace {

json scalarToJson(const YAML::Node& node) {
  const std::string& s = node.Scalar();
  if (node.Tag() == "!") return s;  // quoted: always a string
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  // Integers and floats; anything that does not parse completely is a string.
  try {
    size_t used = 0;
    long long v = std::stoll(s, &used, 10);
    if (used == s.size()) return v;
  } catch (...) {
  }
  if (s.find_first_of("0123456789") != std::string::npos &&
      s.find_first_not_of("0123456789+-.eE") == std::string::npos) {
    try {
      size_t used = 0;
      double d = std::stod(s, &used);
      if (used == s.size()) return d;
    } catch (...) {
    }
  }
  return s;
}

json nodeToJson(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
    case YAML::NodeType::Scalar:
      return scalarToJson(node);
    case YAML::NodeType::Sequence: {
      json a = json::array();
      for (const auto& item : node) a.push_back(nodeToJson(item));
      return a;
    }
    case YAML::NodeType::Map: {
      json o = json::object();
      for (const auto& kv : node) o[kv.first.as<std::string>()] = nodeToJson(kv.second);
      return o;
    }
  }
  return nullptr;
}

// One step of a path: a key, an index, or a filter [?(@.key=="value")].
struct Step {
  enum class Kind { kKey, kIndex, kFilter } kind;
  std::string key;
  size_t index = 0;
  std::string filterKey;
  json filterValue;
};

std::vector<Step> parsePath(std::string_view path) {
  std::vector<Step> steps;
  size_t i = 0;
  if (!path.empty() && path.front() == '{' && path.back() == '}') path = path.substr(1, path.size() - 2);
  while (i < path.size()) {
    if (path[i] == '.') {
      ++i;
      size_t end = path.find_first_of(".[", i);
      if (end == std::string_view::npos) end = path.size();
      if (end > i) steps.push_back({Step::Kind::kKey, std::string(path.substr(i, end - i))});
      i = end;
    } else if (path[i] == '[') {
      size_t end = path.find(']', i);
      if (end == std::string_view::npos) throw std::runtime_error("unterminated [ in JSONPath");
      std::string_view inner = path.substr(i + 1, end - i - 1);
      if (inner.starts_with("?(@.")) {
        // ?(@.type=="Ready")
        size_t eq = inner.find("==");
        if (eq == std::string_view::npos || !inner.ends_with(")"))
          throw std::runtime_error("unsupported JSONPath filter");
        Step s{Step::Kind::kFilter};
        s.filterKey = std::string(inner.substr(4, eq - 4));
        std::string_view v = inner.substr(eq + 2, inner.size() - eq - 3);
        if (v.size() >= 2 && (v.front() == '"' || v.front() == '\'')) {
          s.filterValue = std::string(v.substr(1, v.size() - 2));
        } else {
          s.filterValue = json::parse(v, nullptr, false);
        }
        steps.push_back(s);
      } else if (inner.size() >= 2 && (inner.front() == '\'' || inner.front() == '"')) {
        steps.push_back({Step::Kind::kKey, std::string(inner.substr(1, inner.size() - 2))});
      } else {
        Step s{Step::Kind::kIndex};
        s.index = std::stoul(std::string(inner));
        steps.push_back(s);
      }
      i = end + 1;
    } else {
      size_t end = path.find_first_of(".[", i);
      if (end == std::string_view::npos) end = path.size();
      steps.push_back({Step::Kind::kKey, std::string(path.substr(i, end - i))});
      i = end;
    }
  }
  return steps;
}

}  // namespace

json yamlToJson(std::string_view text) {
  try {
    return nodeToJson(YAML::Load(std::string(text)));
  } catch (const YAML::Exception& e) {
    throw std::runtime_error(e.what());
  }
}

std::optional<json> evalJsonPath(const json& root, std::string_view path) {
  std::vector<Step> steps;
  try {
    steps = parsePath(path);
  } catch (...) {
    return std::nullopt;
  }
  const json* cur = &root;
  for (const auto& step : steps) {
    switch (step.kind) {
      case Step::Kind::kKey: {
        if (!cur->is_object()) return std::nullopt;
        auto it = cur->find(step.key);
        if (it == cur->end()) return std::nullopt;
        cur = &*it;
        break;
      }
      case Step::Kind::kIndex:
        if (!cur->is_array() || step.index >= cur->size()) return std::nullopt;
        cur = &(*cur)[step.index];
        break;
      case Step::Kind::kFilter: {
        if (!cur->is_array()) return std::nullopt;
        const json* found = nullptr;
        for (const auto& item : *cur) {
          if (item.is_object() && item.contains(step.filterKey) && item[step.filterKey] == step.filterValue) {
            found = &item;
            break;
          }
        }
        if (found == nullptr) return std::nullopt;
        cur = found;
        break;
      }
    }
  }
  return *cur;
}

void setJsonPath(json& root, std::string_view path, json value) {
  json* cur = &root;
  for (const auto& step : parsePath(path)) {
    if (step.kind != Step::Kind::kKey) throw std::runtime_error("only dotted paths can be set");
    if (!cur->is_object()) *cur = json::object();
    cur = &(*cur)[step.key];
  }
  *cur = std::move(value);
}

std::string rfc3339(WallTime at) {
  std::time_t t = std::chrono::system_clock::to_time_t(at);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string rfc3339Micro(WallTime at) {
  std::time_t t = std::chrono::system_clock::to_time_t(at);
  auto micros = std::chrono::duration_cast<std::chrono::microseconds>(at.time_since_epoch()).count() % 1000000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
  char frac[16];
  std::snprintf(frac, sizeof(frac), ".%06lldZ", static_cast<long long>(micros));
  return strCat(buf, frac);
}

std::string base64Encode(std::string_view bytes) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    uint32_t v = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8) | uint8_t(bytes[i + 2]);
    out += {kAlphabet[(v >> 18) & 63], kAlphabet[(v >> 12) & 63], kAlphabet[(v >> 6) & 63], kAlphabet[v & 63]};
  }
  if (i + 1 == bytes.size()) {
    uint32_t v = uint8_t(bytes[i]) << 16;
    out += {kAlphabet[(v >> 18) & 63], kAlphabet[(v >> 12) & 63], '=', '='};
  } else if (i + 2 == bytes.size()) {
    uint32_t v = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8);
    out += {kAlphabet[(v >> 18) & 63], kAlphabet[(v >> 12) & 63], kAlphabet[(v >> 6) & 63], '='};
  }
  return out;
}

namespace {
std::mt19937_64& rng() {
  thread_local std::mt19937_64 gen{std::random_device{}()};
  return gen;
}
}  // namespace

std::string randomSuffix(size_t n) {
  static constexpr char kChars[] = "bcdfghjklmnpqrstvwxz2456789";  // what apiserver's generateName uses
  std::string s;
  for (size_t i = 0; i < n; ++i) s += kChars[rng()() % (sizeof(kChars) - 1)];
  return s;
}

std::string newUid() {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 32; ++i) {
    if (i == 8 || i == 12 || i == 16 || i == 20) s += '-';
    s += kHex[rng()() % 16];
  }
  return s;
}

}  // namespace tandem::apiserver
