#include "src/common/config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "src/common/strings.h"

namespace tandem {

struct ConfigDoc::Impl {
  struct Entry {
    std::string key;
    YAML::Mark key_mark;
    YAML::Node node;
    bool consumed = false;
  };
  struct MapState {
    std::string path;
    YAML::Mark mark;
    std::vector<Entry> entries;
    std::vector<std::string> asked;  // keys the code looked for, for "known keys" hints
  };

  std::string source;
  std::vector<MapState> maps;
  std::vector<std::string> errors;

  std::string where(const YAML::Mark& m) const {
    if (m.is_null()) return source;
    return strCat(source, ":", m.line + 1, ":", m.column + 1);
  }
  void error(const YAML::Mark& m, std::string_view path, std::string_view msg) {
    errors.push_back(strCat(where(m), ": ", path, ": ", msg));
  }

  // Registers a mapping node and returns its index. Duplicate keys are errors.
  size_t addMap(const YAML::Node& node, std::string path) {
    MapState st;
    st.path = std::move(path);
    st.mark = node.Mark();
    if (node.IsMap()) {
      for (auto it = node.begin(); it != node.end(); ++it) {
        std::string key = it->first.IsScalar() ? it->first.Scalar() : std::string("<non-scalar key>");
        bool dup = std::any_of(st.entries.begin(), st.entries.end(), [&](const Entry& e) { return e.key == key; });
        if (dup) {
          error(it->first.Mark(), join(st.path, key), "duplicate key");
          continue;
        }
        st.entries.push_back({key, it->first.Mark(), it->second, false});
      }
    }
    maps.push_back(std::move(st));
    return maps.size() - 1;
  }

  void ask(size_t map, std::string_view key) {
    auto& asked = maps[map].asked;
    if (std::find(asked.begin(), asked.end(), key) == asked.end()) asked.emplace_back(key);
  }

  static std::string join(std::string_view path, std::string_view key) {
    return path.empty() ? std::string(key) : strCat(path, ".", key);
  }
};

namespace {

std::string describe(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null: return "null";
    case YAML::NodeType::Map: return "a mapping";
    case YAML::NodeType::Sequence: return "a sequence";
    case YAML::NodeType::Scalar: return strCat("\"", n.Scalar(), "\"");
    default: return "nothing";
  }
}

template <typename T>
constexpr std::string_view typeName() {
  if constexpr (std::is_same_v<T, bool>) return "boolean (true or false)";
  else if constexpr (std::is_same_v<T, std::string>) return "string";
  else if constexpr (std::is_same_v<T, double>) return "number";
  else if constexpr (std::is_same_v<T, std::vector<std::string>>) return "sequence of strings";
  else if constexpr (std::is_same_v<T, std::chrono::nanoseconds>) return "duration (e.g. 250ms, 30s, 5m)";
  else if constexpr (std::is_unsigned_v<T>) return "non-negative integer";
  else return "integer";
}

// Converts one node to T. Returns an error message (without path) on failure.
template <typename T>
std::optional<std::string> convert(const YAML::Node& n, T* out) {
  auto wrongType = [&] { return strCat("expected ", typeName<T>(), ", got ", describe(n)); };
  if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    if (!n.IsSequence()) return wrongType();
    std::vector<std::string> v;
    for (const auto& item : n) {
      if (!item.IsScalar()) return strCat("expected ", typeName<T>(), ", got an item that is ", describe(item));
      v.push_back(item.Scalar());
    }
    *out = std::move(v);
    return std::nullopt;
  } else {
    if (!n.IsScalar()) return wrongType();
    const std::string& s = n.Scalar();
    if constexpr (std::is_same_v<T, std::string>) {
      *out = s;
    } else if constexpr (std::is_same_v<T, bool>) {
      if (s == "true" || s == "True" || s == "TRUE") *out = true;
      else if (s == "false" || s == "False" || s == "FALSE") *out = false;
      else return wrongType();
    } else if constexpr (std::is_same_v<T, double>) {
      double v = 0;
      auto res = std::from_chars(s.data(), s.data() + s.size(), v);
      if (res.ec != std::errc() || res.ptr != s.data() + s.size() || !std::isfinite(v)) return wrongType();
      *out = v;
    } else if constexpr (std::is_same_v<T, std::chrono::nanoseconds>) {
      auto d = parseDuration(s);
      if (!d.ok()) return strCat(toStd(d.status().message()));
      *out = *d;
    } else {
      T v{};
      const char* begin = s.data();
      if constexpr (std::is_unsigned_v<T>) {
        if (!s.empty() && s[0] == '-') return wrongType();
      }
      if (!s.empty() && s[0] == '+') ++begin;
      auto res = std::from_chars(begin, s.data() + s.size(), v);
      if (res.ec == std::errc::result_out_of_range) {
        return strCat("value ", s, " is out of range for a ", sizeof(T) * 8, "-bit ", typeName<T>());
      }
      if (res.ec != std::errc() || res.ptr != s.data() + s.size() || begin == s.data() + s.size()) return wrongType();
      *out = v;
    }
    return std::nullopt;
  }
}

template <typename T>
std::optional<double> numericValue(const T& v) {
  if constexpr (std::is_same_v<T, std::chrono::nanoseconds>) return std::chrono::duration<double>(v).count();
  else if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) return static_cast<double>(v);
  else return std::nullopt;
}

std::string formatBound(double v) { return strCat(v); }

}  // namespace

template <typename T>
bool ConfigMap::field(std::string_view key, T* out, const FieldSpec& spec) {
  ConfigDoc::Impl& d = *doc_->impl_;
  std::string path = ConfigDoc::Impl::join(d.maps[index_].path, key);
  d.ask(index_, key);
  ConfigDoc::Impl::Entry* entry = nullptr;
  for (auto& e : d.maps[index_].entries) {
    if (e.key == key) entry = &e;
  }
  if (entry == nullptr) {
    if (spec.required) d.error(d.maps[index_].mark, path, "required key is missing");
    return false;
  }
  entry->consumed = true;
  T value = *out;
  if (auto err = convert<T>(entry->node, &value)) {
    d.error(entry->node.Mark(), path, *err);
    return false;
  }
  if (auto num = numericValue(value)) {
    if ((spec.min && *num < *spec.min) || (spec.max && *num > *spec.max)) {
      std::string range = spec.min && spec.max ? strCat("between ", formatBound(*spec.min), " and ", formatBound(*spec.max))
                          : spec.min          ? strCat("at least ", formatBound(*spec.min))
                                              : strCat("at most ", formatBound(*spec.max));
      d.error(entry->node.Mark(), path, strCat("value ", entry->node.Scalar(), " out of range: must be ", range));
      return false;
    }
  }
  if constexpr (std::is_same_v<T, std::string>) {
    if (!spec.one_of.empty() && std::find(spec.one_of.begin(), spec.one_of.end(), value) == spec.one_of.end()) {
      std::string allowed;
      for (const auto& a : spec.one_of) allowed += (allowed.empty() ? "" : ", ") + a;
      d.error(entry->node.Mark(), path, strCat("\"", value, "\" is not one of: ", allowed));
      return false;
    }
  }
  *out = std::move(value);
  return true;
}

template bool ConfigMap::field<bool>(std::string_view, bool*, const FieldSpec&);
template bool ConfigMap::field<int32_t>(std::string_view, int32_t*, const FieldSpec&);
template bool ConfigMap::field<int64_t>(std::string_view, int64_t*, const FieldSpec&);
template bool ConfigMap::field<uint32_t>(std::string_view, uint32_t*, const FieldSpec&);
template bool ConfigMap::field<uint64_t>(std::string_view, uint64_t*, const FieldSpec&);
template bool ConfigMap::field<double>(std::string_view, double*, const FieldSpec&);
template bool ConfigMap::field<std::string>(std::string_view, std::string*, const FieldSpec&);
template bool ConfigMap::field<std::vector<std::string>>(std::string_view, std::vector<std::string>*, const FieldSpec&);
template bool ConfigMap::field<std::chrono::nanoseconds>(std::string_view, std::chrono::nanoseconds*, const FieldSpec&);

ConfigMap ConfigMap::section(std::string_view key, const FieldSpec& spec) {
  ConfigDoc::Impl& d = *doc_->impl_;
  std::string path = ConfigDoc::Impl::join(d.maps[index_].path, key);
  d.ask(index_, key);
  for (auto& e : d.maps[index_].entries) {
    if (e.key != key) continue;
    e.consumed = true;
    if (e.node.IsMap()) return ConfigMap(doc_, d.addMap(e.node, path));
    if (!e.node.IsNull()) d.error(e.node.Mark(), path, strCat("expected a mapping, got ", describe(e.node)));
    return ConfigMap(doc_, d.addMap(YAML::Node(), path));
  }
  if (spec.required) d.error(d.maps[index_].mark, path, "required section is missing");
  return ConfigMap(doc_, d.addMap(YAML::Node(), path));
}

std::vector<ConfigMap> ConfigMap::sectionList(std::string_view key, const FieldSpec& spec) {
  ConfigDoc::Impl& d = *doc_->impl_;
  std::string path = ConfigDoc::Impl::join(d.maps[index_].path, key);
  std::vector<ConfigMap> out;
  d.ask(index_, key);
  for (auto& e : d.maps[index_].entries) {
    if (e.key != key) continue;
    e.consumed = true;
    if (e.node.IsNull()) return out;
    if (!e.node.IsSequence()) {
      d.error(e.node.Mark(), path, strCat("expected a sequence of mappings, got ", describe(e.node)));
      return out;
    }
    for (size_t i = 0; i < e.node.size(); ++i) {
      std::string item_path = strCat(path, "[", i, "]");
      YAML::Node item = e.node[i];
      if (!item.IsMap()) {
        d.error(item.Mark(), item_path, strCat("expected a mapping, got ", describe(item)));
        continue;
      }
      out.push_back(ConfigMap(doc_, d.addMap(item, item_path)));
    }
    return out;
  }
  if (spec.required) d.error(d.maps[index_].mark, path, "required key is missing");
  return out;
}

bool ConfigMap::has(std::string_view key) const {
  for (const auto& e : doc_->impl_->maps[index_].entries) {
    if (e.key == key) return true;
  }
  return false;
}

void ConfigMap::fail(std::string_view key, std::string_view message) {
  ConfigDoc::Impl& d = *doc_->impl_;
  YAML::Mark mark = d.maps[index_].mark;
  for (const auto& e : d.maps[index_].entries) {
    if (e.key == key) mark = e.node.Mark();
  }
  d.error(mark, ConfigDoc::Impl::join(d.maps[index_].path, key), message);
}

const std::string& ConfigMap::path() const { return doc_->impl_->maps[index_].path; }

ConfigDoc::ConfigDoc(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ConfigDoc::ConfigDoc(ConfigDoc&&) noexcept = default;
ConfigDoc& ConfigDoc::operator=(ConfigDoc&&) noexcept = default;
ConfigDoc::~ConfigDoc() = default;

absl::StatusOr<ConfigDoc> ConfigDoc::fromString(std::string_view text, std::string_view source) {
  auto impl = std::make_unique<Impl>();
  impl->source = std::string(source);
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    // e.msg lacks the position; e.mark has it (0-based).
    return absl::InvalidArgumentError(
        strCat(source, ":", e.mark.line + 1, ":", e.mark.column + 1, ": invalid YAML: ", e.msg));
  }
  if (root.IsDefined() && !root.IsNull() && !root.IsMap()) {
    return absl::InvalidArgumentError(
        strCat(impl->where(root.Mark()), ": the top level must be a mapping of keys, got ", describe(root)));
  }
  impl->addMap(root, "");
  return ConfigDoc(std::move(impl));
}

absl::StatusOr<ConfigDoc> ConfigDoc::fromFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(strCat("config file ", path, ": cannot open (", std::strerror(errno), ")"));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::UnavailableError(strCat("config file ", path, ": read failed"));
  return fromString(ss.str(), path);
}

absl::Status ConfigDoc::finish() {
  for (const auto& m : impl_->maps) {
    std::vector<std::string> asked = m.asked;
    std::sort(asked.begin(), asked.end());
    std::string known;
    for (const auto& k : asked) known += (known.empty() ? "" : ", ") + k;
    for (const auto& e : m.entries) {
      if (e.consumed) continue;
      impl_->error(e.key_mark, Impl::join(m.path, e.key),
                   known.empty() ? std::string("unknown key") : strCat("unknown key (known keys here: ", known, ")"));
    }
  }
  if (impl_->errors.empty()) return absl::OkStatus();
  std::string msg;
  for (const auto& e : impl_->errors) msg += (msg.empty() ? "" : "\n") + e;
  return absl::InvalidArgumentError(msg);
}

absl::StatusOr<std::chrono::nanoseconds> parseDuration(std::string_view text) {
  auto bad = [&] {
    return absl::InvalidArgumentError(
        strCat("expected a duration like 250ms, 30s, 5m or 1h, got \"", text, "\""));
  };
  if (text == "0") return std::chrono::nanoseconds(0);
  size_t unit_pos = text.find_first_not_of("0123456789.");
  if (unit_pos == 0 || unit_pos == std::string_view::npos) return bad();
  double v = 0;
  auto res = std::from_chars(text.data(), text.data() + unit_pos, v);
  if (res.ec != std::errc() || res.ptr != text.data() + unit_pos) return bad();
  std::string_view unit = text.substr(unit_pos);
  double scale;
  if (unit == "ns") scale = 1;
  else if (unit == "us") scale = 1e3;
  else if (unit == "ms") scale = 1e6;
  else if (unit == "s") scale = 1e9;
  else if (unit == "m") scale = 60e9;
  else if (unit == "h") scale = 3600e9;
  else return bad();
  double ns = v * scale;
  if (ns > 9.2e18) return absl::InvalidArgumentError(strCat("duration \"", text, "\" is too long"));
  return std::chrono::nanoseconds(static_cast<int64_t>(std::llround(ns)));
}

}  // namespace tandem
