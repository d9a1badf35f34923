#include "src/jinja/value.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "src/common/strings.h"

namespace tandem::jinja {

const Value* Object::find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Object::set(std::string key, Value value) {
  for (auto& [k, v] : items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

namespace {

template <typename J>
Value convertJson(const J& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
    case nlohmann::json::value_t::discarded:
      return Value(None{});
    case nlohmann::json::value_t::boolean:
      return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned:
      return Value(static_cast<int64_t>(j.template get<uint64_t>()));
    case nlohmann::json::value_t::number_float:
      return Value(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value(j.template get_ref<const std::string&>());
    case nlohmann::json::value_t::array: {
      auto a = std::make_shared<Array>();
      a->reserve(j.size());
      for (const auto& x : j) a->push_back(convertJson(x));
      return Value(std::move(a));
    }
    case nlohmann::json::value_t::object: {
      auto o = std::make_shared<Object>();
      o->items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) o->items.emplace_back(it.key(), convertJson(it.value()));
      return Value(std::move(o));
    }
    case nlohmann::json::value_t::binary:
      break;
  }
  return Value(None{});
}

// Python's repr() of a str: single quotes unless the text has ' and no ".
void appendStringRepr(std::string& out, const std::string& s) {
  const char quote = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  out.push_back(quote);
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == quote || ch == '\\') {
      out.push_back('\\');
      out.push_back(ch);
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\r') {
      out += "\\r";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out.push_back(ch);
    }
  }
  out.push_back(quote);
}

void appendJsonString(std::string& out, const std::string& s) {
  out.push_back('"');
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(ch);
        }
    }
  }
  out.push_back('"');
}

void newline(std::string& out, int indent, int level) {
  out.push_back('\n');
  out.append(static_cast<size_t>(indent * level), ' ');
}

absl::Status appendJson(std::string& out, const Value& v, int indent, int level) {
  if (v.isNone()) {
    out += "null";
  } else if (v.isBool()) {
    out += v.asBool() ? "true" : "false";
  } else if (v.isInt()) {
    out += std::to_string(v.asInt());
  } else if (v.isFloat()) {
    const double d = v.asDouble();
    if (std::isnan(d)) {
      out += "NaN";
    } else if (std::isinf(d)) {
      out += d > 0 ? "Infinity" : "-Infinity";
    } else {
      out += pythonFloatRepr(d);
    }
  } else if (v.isString()) {
    appendJsonString(out, v.asString());
  } else if (v.isArray()) {
    const Array& a = v.asArray();
    if (a.empty()) {
      out += "[]";
      return absl::OkStatus();
    }
    out.push_back('[');
    for (size_t i = 0; i < a.size(); ++i) {
      if (i > 0) out += indent >= 0 ? "," : ", ";
      if (indent >= 0) newline(out, indent, level + 1);
      TANDEM_RETURN_IF_ERROR(appendJson(out, a[i], indent, level + 1));
    }
    if (indent >= 0) newline(out, indent, level);
    out.push_back(']');
  } else if (v.isObject() || v.isNamespace()) {
    if (v.isNamespace()) return absl::InvalidArgumentError("Object of type Namespace is not JSON serializable");
    const Object& o = v.asObject();
    if (o.items.empty()) {
      out += "{}";
      return absl::OkStatus();
    }
    out.push_back('{');
    for (size_t i = 0; i < o.items.size(); ++i) {
      if (i > 0) out += indent >= 0 ? "," : ", ";
      if (indent >= 0) newline(out, indent, level + 1);
      appendJsonString(out, o.items[i].first);
      out += ": ";
      TANDEM_RETURN_IF_ERROR(appendJson(out, o.items[i].second, indent, level + 1));
    }
    if (indent >= 0) newline(out, indent, level);
    out.push_back('}');
  } else {
    const char* type = v.isUndefined() ? "Undefined" : v.isLoop() ? "LoopContext" : "function";
    return absl::InvalidArgumentError(strCat("Object of type ", type, " is not JSON serializable"));
  }
  return absl::OkStatus();
}

}  // namespace

Value Value::fromJson(const nlohmann::ordered_json& j) { return convertJson(j); }
Value Value::fromJson(const nlohmann::json& j) { return convertJson(j); }

bool Value::truthy() const {
  return std::visit(
      [](const auto& x) -> bool {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, Undefined> || std::is_same_v<T, None>) return false;
        if constexpr (std::is_same_v<T, bool>) return x;
        if constexpr (std::is_same_v<T, int64_t>) return x != 0;
        if constexpr (std::is_same_v<T, double>) return x != 0.0;
        if constexpr (std::is_same_v<T, std::string>) return !x.empty();
        if constexpr (std::is_same_v<T, ArrayPtr>) return !x->empty();
        if constexpr (std::is_same_v<T, ObjectPtr>) return !x->items.empty();
        return true;
      },
      v_);
}

std::string pythonFloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // Shortest round-trip digits, then Python's layout: positional for
  // exponents -5 < e < 16, else d.ddde+XX.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const size_t epos = sci.find('e');
  std::string mant = sci.substr(0, epos);
  const int exp = std::stoi(sci.substr(epos + 1));
  std::string sign;
  if (!mant.empty() && mant[0] == '-') {
    sign = "-";
    mant.erase(0, 1);
  }
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits.push_back(c);
  }
  if (exp < -4 || exp >= 16) {
    std::string m = digits.substr(0, 1);
    if (digits.size() > 1) m += "." + digits.substr(1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return sign + m + ebuf;
  }
  std::string out;
  if (exp < 0) {
    out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
    out = digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
  } else {
    out = digits.substr(0, static_cast<size_t>(exp) + 1) + "." + digits.substr(static_cast<size_t>(exp) + 1);
  }
  return sign + out;
}

void Value::appendRepr(std::string& out) const {
  if (isString()) {
    appendStringRepr(out, asString());
  } else {
    out += str();
  }
}

std::string Value::str() const {
  return std::visit(
      [this](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, Undefined>) return "";
        if constexpr (std::is_same_v<T, None>) return "None";
        if constexpr (std::is_same_v<T, bool>) return x ? "True" : "False";
        if constexpr (std::is_same_v<T, int64_t>) return std::to_string(x);
        if constexpr (std::is_same_v<T, double>) return pythonFloatRepr(x);
        if constexpr (std::is_same_v<T, std::string>) return x;
        if constexpr (std::is_same_v<T, ArrayPtr>) {
          std::string out = "[";
          for (size_t i = 0; i < x->size(); ++i) {
            if (i > 0) out += ", ";
            (*x)[i].appendRepr(out);
          }
          return out + "]";
        }
        if constexpr (std::is_same_v<T, ObjectPtr>) {
          std::string out = "{";
          for (size_t i = 0; i < x->items.size(); ++i) {
            if (i > 0) out += ", ";
            appendStringRepr(out, x->items[i].first);
            out += ": ";
            x->items[i].second.appendRepr(out);
          }
          return out + "}";
        }
        if constexpr (std::is_same_v<T, Namespace>) return "<Namespace>";
        if constexpr (std::is_same_v<T, LoopPtr>) return "<LoopContext>";
        if constexpr (std::is_same_v<T, CallablePtr>) return strCat("<function ", x->name, ">");
        (void)this;
        return "";
      },
      v_);
}

bool Value::equals(const Value& other) const {
  if (isNumber() && other.isNumber()) {
    if (isFloat() || other.isFloat()) return asDouble() == other.asDouble();
    return asInt() == other.asInt();
  }
  if (v_.index() != other.v_.index()) return false;
  if (isUndefined() || isNone()) return true;
  if (isString()) return asString() == other.asString();
  if (isArray()) {
    const Array &a = asArray(), &b = other.asArray();
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!a[i].equals(b[i])) return false;
    }
    return true;
  }
  if (isObject()) {
    const Object &a = asObject(), &b = other.asObject();
    if (a.items.size() != b.items.size()) return false;
    for (const auto& [k, v] : a.items) {
      const Value* w = b.find(k);
      if (w == nullptr || !v.equals(*w)) return false;
    }
    return true;
  }
  if (isNamespace()) return asNamespace().attrs == other.asNamespace().attrs;
  if (isLoop()) return &asLoop() == &other.asLoop();
  return &asCallable() == &other.asCallable();
}

std::string Value::typeName() const {
  if (isUndefined()) return "Undefined";
  if (isNone()) return "NoneType";
  if (isBool()) return "bool";
  if (isInt()) return "int";
  if (isFloat()) return "float";
  if (isString()) return "str";
  if (isArray()) return "list";
  if (isObject()) return "dict";
  if (isNamespace()) return "Namespace";
  if (isLoop()) return "LoopContext";
  return "function";
}

absl::StatusOr<std::string> toJson(const Value& value, int indent) {
  std::string out;
  TANDEM_RETURN_IF_ERROR(appendJson(out, value, indent, 0));
  return out;
}

}  // namespace tandem::jinja
