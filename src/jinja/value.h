#pragma once
// The values a Jinja template computes with: Python's types as Jinja2 sees
// them (None, bool, int, float, str, list, dict) plus Jinja's own
// (Undefined, namespace, the `loop` variable, callables). JSON converts in
// with its key order kept (nlohmann::ordered_json), as Python's json.loads
// keeps it; str() and tojson print as Python does, so rendered text is
// byte-identical to Jinja2's.
//
// Lists, dicts and namespaces are shared (shared_ptr), as Python shares
// them: copying a Value is cheap and a namespace assigned in a loop body is
// seen outside it. Values are not thread-safe; each render owns its own.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/common/status.h"

namespace tandem::jinja {

class Value;
using Array = std::vector<Value>;

// A dict: keys in insertion order, as Python's. Linear lookup: chat
// messages and tool schemas have a handful of keys.
struct Object {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const;
  void set(std::string key, Value value);
};

// Jinja2's default Undefined: prints as "", is falsy, iterates as empty;
// anything else (attribute, subscript, arithmetic) is an error carrying
// `hint`, Jinja2's message ("'x' is undefined", "'dict object' has no
// attribute 'y'"). The message is shared, so an Undefined copies cheaply
// and a template can make its common ones once (Expr::missing_in_dict).
struct Undefined {
  std::shared_ptr<const std::string> hint;  // null: no message
};
struct None {};

// The `loop` variable of one iteration of a for loop.
struct LoopInfo {
  std::shared_ptr<const Array> items;  // the (filtered) sequence iterated
  size_t index = 0;                    // 0-based
};

// A function value: a global (raise_exception, namespace, ...) when `self`
// is null, else method `name` bound to `*self` ("abc".startswith).
struct Callable {
  std::string name;
  std::shared_ptr<const Value> self;
};

struct Namespace {
  std::shared_ptr<Object> attrs;
};

class Value {
 public:
  using ArrayPtr = std::shared_ptr<Array>;
  using ObjectPtr = std::shared_ptr<Object>;
  using LoopPtr = std::shared_ptr<const LoopInfo>;
  using CallablePtr = std::shared_ptr<const Callable>;
  using Storage = std::variant<Undefined, None, bool, int64_t, double, std::string, ArrayPtr, ObjectPtr, Namespace,
                               LoopPtr, CallablePtr>;

  Value() : v_(Undefined{}) {}
  Value(None) : v_(None{}) {}
  Value(bool b) : v_(b) {}
  Value(int i) : v_(int64_t{i}) {}
  Value(int64_t i) : v_(i) {}
  Value(double d) : v_(d) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(std::string_view s) : v_(std::string(s)) {}
  Value(const char* s) : v_(std::string(s)) {}
  Value(Array a) : v_(std::make_shared<Array>(std::move(a))) {}
  Value(ArrayPtr a) : v_(std::move(a)) {}
  Value(ObjectPtr o) : v_(std::move(o)) {}
  Value(Namespace n) : v_(std::move(n)) {}
  Value(LoopPtr l) : v_(std::move(l)) {}
  Value(CallablePtr c) : v_(std::move(c)) {}
  static Value undefined(std::string hint) { return undefined(std::make_shared<const std::string>(std::move(hint))); }
  static Value undefined(std::shared_ptr<const std::string> hint) { return Value(Storage(Undefined{std::move(hint)})); }

  static Value fromJson(const nlohmann::ordered_json& j);
  static Value fromJson(const nlohmann::json& j);

  bool isUndefined() const { return std::holds_alternative<Undefined>(v_); }
  bool isNone() const { return std::holds_alternative<None>(v_); }
  bool isBool() const { return std::holds_alternative<bool>(v_); }
  bool isInt() const { return std::holds_alternative<int64_t>(v_); }
  bool isFloat() const { return std::holds_alternative<double>(v_); }
  // Python's numbers.Number: bool counts, as it is an int in Python.
  bool isNumber() const { return isBool() || isInt() || isFloat(); }
  bool isString() const { return std::holds_alternative<std::string>(v_); }
  bool isArray() const { return std::holds_alternative<ArrayPtr>(v_); }
  bool isObject() const { return std::holds_alternative<ObjectPtr>(v_); }
  bool isNamespace() const { return std::holds_alternative<Namespace>(v_); }
  bool isLoop() const { return std::holds_alternative<LoopPtr>(v_); }
  bool isCallable() const { return std::holds_alternative<CallablePtr>(v_); }

  bool asBool() const { return std::get<bool>(v_); }
  int64_t asInt() const { return isBool() ? int64_t{asBool()} : std::get<int64_t>(v_); }
  double asDouble() const { return isFloat() ? std::get<double>(v_) : static_cast<double>(asInt()); }
  const std::string& asString() const { return std::get<std::string>(v_); }
  // Moves the string out (call only if isString()); the Value is left an empty string.
  std::string takeString() && { return std::move(std::get<std::string>(v_)); }
  const Array& asArray() const { return *std::get<ArrayPtr>(v_); }
  const ArrayPtr& arrayPtr() const { return std::get<ArrayPtr>(v_); }
  const Object& asObject() const { return *std::get<ObjectPtr>(v_); }
  const Namespace& asNamespace() const { return std::get<Namespace>(v_); }
  const LoopInfo& asLoop() const { return *std::get<LoopPtr>(v_); }
  const Callable& asCallable() const { return *std::get<CallablePtr>(v_); }
  const std::string& undefinedHint() const {
    static const std::string kNoHint;
    const auto& hint = std::get<Undefined>(v_).hint;
    return hint ? *hint : kNoHint;
  }

  // Python's bool(): "", [], {}, 0, None and Undefined are false.
  bool truthy() const;
  // Python's str(): None -> "None", True -> "True", 1.0 -> "1.0",
  // ['a'] -> "['a']", {'k': 1} -> "{'k': 1}"; Undefined -> "".
  std::string str() const;
  // Python's repr() (strings quoted), as str() prints list items.
  void appendRepr(std::string& out) const;
  // Python's ==, with 1 == 1.0 == True.
  bool equals(const Value& other) const;
  // Jinja2's name for the type in messages: "dict object", "str object"...
  std::string typeName() const;

 private:
  explicit Value(Storage v) : v_(std::move(v)) {}
  Storage v_;
};

// Python's repr() of a float (shortest round trip: 1.0, 0.1, 1e-05, 1e+16).
std::string pythonFloatRepr(double d);

// Hugging Face's tojson: json.dumps(value, ensure_ascii=False,
// indent=indent, sort_keys=False): ", " and ": " separators without indent,
// "," and ": " with it; non-ASCII text as is. Undefined, callables and
// other non-JSON values are an error naming the type.
[[nodiscard]] absl::StatusOr<std::string> toJson(const Value& value, int indent = -1);

}  // namespace tandem::jinja
