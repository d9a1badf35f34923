#include "src/jinja/template.h"

#include <cmath>
#include <ctime>

#include "absl/strings/cord.h"
#include "src/common/strings.h"
#include "src/jinja/lexer.h"
#include "src/jinja/parser.h"

namespace tandem::jinja {
namespace {

// ---- UTF-8 and Python string helpers ----

// Byte offsets of each code point of `s`, plus s.size() at the end.
std::vector<size_t> codePoints(const std::string& s) {
  std::vector<size_t> at;
  at.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) at.push_back(i);
  }
  at.push_back(s.size());
  return at;
}

size_t numCodePoints(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

// Python's str.strip() with no argument strips these (ASCII part).
bool isPySpace(char c) {
  const auto u = static_cast<unsigned char>(c);
  return c == ' ' || (u >= 0x09 && u <= 0x0D) || (u >= 0x1C && u <= 0x1F);
}

std::string stripChars(const std::string& s, const Value* chars, bool left, bool right) {
  auto strip = [&](char c) {
    if (chars == nullptr || chars->isNone()) return isPySpace(c);
    return chars->asString().find(c) != std::string::npos;
  };
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e && strip(s[b])) ++b;
  }
  if (right) {
    while (e > b && strip(s[e - 1])) --e;
  }
  return s.substr(b, e - b);
}

std::string asciiLower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::string asciiUpper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string replaceAll(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` between every code point
    std::vector<size_t> at = codePoints(s);
    for (size_t i = 0; i + 1 < at.size(); ++i) {
      if (count < 0 || static_cast<int64_t>(i) < count) out += to;
      out.append(s, at[i], at[i + 1] - at[i]);
    }
    if (count < 0 || static_cast<int64_t>(at.size()) - 1 < count) out += to;
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t f = s.find(from, pos);
    if (f == std::string::npos) break;
    out.append(s, pos, f - pos);
    out += to;
    pos = f + from.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

// Python's slice index adjustment (PySlice_AdjustIndices).
std::vector<int64_t> sliceIndices(int64_t len, std::optional<int64_t> start, std::optional<int64_t> stop,
                                  int64_t step) {
  int64_t b, e;
  if (step > 0) {
    b = start ? (*start < 0 ? std::max<int64_t>(*start + len, 0) : std::min(*start, len)) : 0;
    e = stop ? (*stop < 0 ? std::max<int64_t>(*stop + len, 0) : std::min(*stop, len)) : len;
  } else {
    b = start ? (*start < 0 ? std::max<int64_t>(*start + len, -1) : std::min(*start, len - 1)) : len - 1;
    e = stop ? (*stop < 0 ? std::max<int64_t>(*stop + len, -1) : std::min(*stop, len - 1)) : -1;
  }
  std::vector<int64_t> out;
  for (int64_t i = b; step > 0 ? i < e : i > e; i += step) out.push_back(i);
  return out;
}

// Jinja2's object_type_repr, as its Undefined messages quote it.
std::string typeRepr(const Value& v) {
  if (v.isNone()) return "None";
  return v.typeName() + " object";
}

Value noAttribute(const Value& obj, std::string_view name) {
  return Value::undefined(strCat("'", typeRepr(obj), "' has no attribute '", name, "'"));
}

bool isStrMethod(std::string_view n) {
  static constexpr std::string_view kMethods[] = {"startswith", "endswith", "strip", "lstrip", "rstrip",
                                                  "split",      "upper",    "lower", "replace", "find",
                                                  "join",       "capitalize", "title", "count", "rsplit"};
  for (auto m : kMethods) {
    if (m == n) return true;
  }
  return false;
}
bool isDictMethod(std::string_view n) { return n == "items" || n == "keys" || n == "values" || n == "get"; }
bool isGlobal(std::string_view n) {
  return n == "raise_exception" || n == "strftime_now" || n == "namespace" || n == "range" || n == "dict";
}

Value bind(const Value& self, std::string name) {
  auto c = std::make_shared<Callable>();
  c->name = std::move(name);
  c->self = std::make_shared<const Value>(self);
  return Value(Value::CallablePtr(std::move(c)));
}

Value makeList(Array a) { return Value(std::make_shared<Array>(std::move(a))); }

// The items of an iterable: list items, dict keys, string characters.
// Undefined iterates as empty, as Jinja2's.
std::optional<Array> iterate(const Value& v) {
  if (v.isArray()) return v.asArray();
  if (v.isUndefined()) return Array{};
  if (v.isObject()) {
    Array keys;
    for (const auto& [k, x] : v.asObject().items) keys.emplace_back(k);
    return keys;
  }
  if (v.isString()) {
    const std::string& s = v.asString();
    std::vector<size_t> at = codePoints(s);
    Array chars;
    for (size_t i = 0; i + 1 < at.size(); ++i) chars.emplace_back(s.substr(at[i], at[i + 1] - at[i]));
    return chars;
  }
  return std::nullopt;
}

// Arguments of a call, filter or test, evaluated.
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;

  // Positional `i`, else keyword `name`, else null.
  const Value* get(size_t i, std::string_view name) const {
    if (i < pos.size()) return &pos[i];
    for (const auto& [k, v] : kw) {
      if (k == name) return &v;
    }
    return nullptr;
  }
};

enum class Flow { kNormal, kBreak, kContinue };

class Renderer {
 public:
  Renderer(const std::string& name, const Object& vars, const RenderOptions& options)
      : name_(name), vars_(vars), options_(options) {
    frames_.emplace_back();
  }

  absl::StatusOr<std::string> run(const Body& body) {
    TANDEM_ASSIGN_OR_RETURN(Flow flow, renderBody(body));
    (void)flow;  // break/continue outside a loop is refused when it runs
    return std::move(out_);
  }

 private:
  using Frame = std::vector<std::pair<std::string, Value>>;

  absl::Status error(SourcePos p, std::string_view what) const {
    return absl::InvalidArgumentError(strCat(name_, ":", p.line, ":", p.col, ": ", what));
  }

  // ---- variables ----

  const Value* lookup(std::string_view name) const {
    for (auto f = frames_.rbegin(); f != frames_.rend(); ++f) {
      for (auto it = f->rbegin(); it != f->rend(); ++it) {
        if (it->first == name) return &it->second;
      }
    }
    return vars_.find(name);
  }

  void assign(std::string_view name, Value v) {
    Frame& f = frames_.back();
    for (auto& [k, x] : f) {
      if (k == name) {
        x = std::move(v);
        return;
      }
    }
    f.emplace_back(std::string(name), std::move(v));
  }

  // ---- statements ----

  absl::StatusOr<Flow> renderBody(const Body& body) {
    for (const NodePtr& n : body) {
      TANDEM_ASSIGN_OR_RETURN(Flow flow, renderNode(*n));
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  absl::StatusOr<Flow> renderNode(const Node& n) {
    switch (n.kind) {
      case Node::Kind::kText:
        out_ += n.text;
        return Flow::kNormal;
      case Node::Kind::kOutput: {
        if (isStringSum(*n.expr)) {
          TANDEM_RETURN_IF_ERROR(appendStringSum(*n.expr));
          return Flow::kNormal;
        }
        Value tmp;
        TANDEM_ASSIGN_OR_RETURN(const Value* v, evalRef(*n.expr, tmp));
        if (v->isString()) {
          out_ += v->asString();
        } else {
          out_ += v->str();
        }
        return Flow::kNormal;
      }
      case Node::Kind::kIf:
        for (const auto& [cond, body] : n.branches) {
          Value tmp;
          TANDEM_ASSIGN_OR_RETURN(const Value* c, evalRef(*cond, tmp));
          if (c->truthy()) return renderBody(body);
        }
        return renderBody(n.else_body);
      case Node::Kind::kFor:
        return renderFor(n);
      case Node::Kind::kSet:
        return renderSet(n);
      case Node::Kind::kSetBlock: {
        std::string saved = std::move(out_);
        out_.clear();
        auto flow = renderBody(n.body);
        std::string captured = std::move(out_);
        out_ = std::move(saved);
        if (!flow.ok()) return flow.status();
        assign(n.targets[0], Value(std::move(captured)));
        return Flow::kNormal;
      }
      case Node::Kind::kBreak:
      case Node::Kind::kContinue:
        if (loop_depth_ == 0) {
          return error(n.pos, strCat("'", n.kind == Node::Kind::kBreak ? "break" : "continue", "' outside a loop"));
        }
        return n.kind == Node::Kind::kBreak ? Flow::kBreak : Flow::kContinue;
      case Node::Kind::kGeneration:
        return renderBody(n.body);
    }
    return Flow::kNormal;
  }

  // Whether `e` is 'literal' + x + y + ...: every partial sum is then a
  // string (or an error), so its parts can go to the output one by one.
  static bool isStringSum(const Expr& e) {
    const Expr* x = &e;
    while (x->kind == Expr::Kind::kBinary && x->name == "+") x = x->args[0].get();
    return x != &e && x->kind == Expr::Kind::kLiteral && x->value.isString();
  }

  // Appends the value of `e`, an isStringSum or part of one, to the output.
  absl::Status appendStringSum(const Expr& e) {
    if (e.kind != Expr::Kind::kBinary || e.name != "+") {  // the leftmost literal
      out_ += e.value.asString();
      return absl::OkStatus();
    }
    TANDEM_RETURN_IF_ERROR(appendStringSum(*e.args[0]));
    Value tmp;
    TANDEM_ASSIGN_OR_RETURN(const Value* b, evalRef(*e.args[1], tmp));
    if (b->isString()) {
      out_ += b->asString();
      return absl::OkStatus();
    }
    // str + non-str: binary() gives Python's error.
    absl::StatusOr<Value> r = binary(e.pos, e.name, Value(std::string()), *b);
    return r.ok() ? error(e.pos, "unsupported operand for +") : r.status();
  }

  absl::StatusOr<Flow> renderSet(const Node& n) {
    TANDEM_ASSIGN_OR_RETURN(Value v, eval(*n.expr));
    if (n.attr.empty()) {
      assign(n.targets[0], std::move(v));
      return Flow::kNormal;
    }
    const Value* ns = lookup(n.targets[0]);
    if (ns == nullptr || !ns->isNamespace()) {
      return error(n.pos, strCat("cannot assign attribute '", n.attr, "' on '", n.targets[0],
                                 "': only a namespace() has assignable attributes"));
    }
    ns->asNamespace().attrs->set(n.attr, std::move(v));
    return Flow::kNormal;
  }

  absl::Status bindTargets(const Node& n, const Value& item) {
    if (n.targets.size() == 1) {
      assign(n.targets[0], item);
      return absl::OkStatus();
    }
    std::optional<Array> parts = iterate(item);
    if (!parts || parts->size() != n.targets.size()) {
      return error(n.pos, strCat("cannot unpack ", item.typeName(), " into ", n.targets.size(), " loop variables"));
    }
    for (size_t i = 0; i < n.targets.size(); ++i) assign(n.targets[i], (*parts)[i]);
    return absl::OkStatus();
  }

  absl::StatusOr<Flow> renderFor(const Node& n) {
    Value seq_tmp;
    TANDEM_ASSIGN_OR_RETURN(const Value* seq, evalRef(*n.expr, seq_tmp));
    // A list is iterated in place (shared, as Python's for shares it);
    // other iterables are listed first.
    std::shared_ptr<const Array> all;
    if (seq->isArray()) {
      all = seq->arrayPtr();
    } else {
      std::optional<Array> items = iterate(*seq);
      if (!items) return error(n.expr->pos, strCat("'", seq->typeName(), "' object is not iterable"));
      all = std::make_shared<const Array>(std::move(*items));
    }
    if (n.cond) {  // `for x in xs if c`: loop.* count the items kept
      auto kept = std::make_shared<Array>();
      for (const Value& item : *all) {
        frames_.emplace_back();
        absl::Status s = bindTargets(n, item);
        absl::StatusOr<Value> c = s.ok() ? eval(*n.cond) : absl::StatusOr<Value>(s);
        frames_.pop_back();
        if (!c.ok()) return c.status();
        if (c->truthy()) kept->push_back(item);
      }
      all = std::move(kept);
    }
    if (all->empty()) return renderBody(n.else_body);
    ++loop_depth_;
    absl::StatusOr<Flow> result = Flow::kNormal;
    // One frame for the loop, emptied per iteration (keeping its capacity):
    // each iteration starts with only `loop` and the targets bound.
    frames_.emplace_back();
    std::shared_ptr<LoopInfo> info;
    for (size_t i = 0; i < all->size(); ++i) {
      frames_.back().clear();
      // Reuse the LoopInfo unless the template kept the previous `loop`
      // (e.g. in a namespace attribute).
      if (info == nullptr || info.use_count() > 1) {
        info = std::make_shared<LoopInfo>();
        info->items = all;
      }
      info->index = i;
      assign("loop", Value(Value::LoopPtr(info)));
      absl::Status s = bindTargets(n, (*all)[i]);
      if (!s.ok()) result = s;
      if (result.ok()) result = renderBody(n.body);
      if (!result.ok() || *result == Flow::kBreak) break;
    }
    frames_.pop_back();
    --loop_depth_;
    if (!result.ok()) return result.status();
    return Flow::kNormal;
  }

  // ---- expressions ----

  // Evaluates `e` without copying where it can: the result points at a
  // literal, a variable or an item of a list, dict or namespace reachable
  // from one (valid for the rest of the statement, as nothing is assigned
  // while an expression is evaluated), else at `tmp`, which then holds the
  // computed value.
  absl::StatusOr<const Value*> evalRef(const Expr& e, Value& tmp) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return &e.value;
      case Expr::Kind::kName:
        if (const Value* v = lookup(e.name)) return v;
        tmp = evalUnboundName(e);
        return &tmp;
      case Expr::Kind::kGetAttr: {
        Value obj_tmp;
        TANDEM_ASSIGN_OR_RETURN(const Value* obj, evalRef(*e.args[0], obj_tmp));
        if (const Value* v = storedAttr(*obj, e.name)) return keepOrCopy(v, obj == &obj_tmp, tmp);
        if (obj->isObject() && e.missing_in_dict != nullptr && !isDictMethod(e.name)) {  // as getAttr's noAttribute, with the message made once
          tmp = Value::undefined(e.missing_in_dict);
          return &tmp;
        }
        TANDEM_ASSIGN_OR_RETURN(tmp, getAttr(e.pos, *obj, e.name));
        return &tmp;
      }
      case Expr::Kind::kGetItem: {
        Value obj_tmp, key_tmp;
        TANDEM_ASSIGN_OR_RETURN(const Value* obj, evalRef(*e.args[0], obj_tmp));
        TANDEM_ASSIGN_OR_RETURN(const Value* key, evalRef(*e.args[1], key_tmp));
        if (const Value* v = storedItem(*obj, *key)) return keepOrCopy(v, obj == &obj_tmp, tmp);
        TANDEM_ASSIGN_OR_RETURN(tmp, getItem(e.pos, *obj, *key));
        return &tmp;
      }
      default:
        break;
    }
    TANDEM_ASSIGN_OR_RETURN(tmp, eval(e));
    return &tmp;
  }

  // `v` points into a container of the parent value; when that parent is a
  // temporary about to go, `v` is copied into `tmp`.
  static const Value* keepOrCopy(const Value* v, bool parent_is_temporary, Value& tmp) {
    if (!parent_is_temporary) return v;
    tmp = *v;
    return &tmp;
  }

  // obj.name where it is a stored dict item or namespace attribute (what
  // getAttr would return), else null.
  static const Value* storedAttr(const Value& obj, std::string_view name) {
    if (obj.isObject()) return isDictMethod(name) ? nullptr : obj.asObject().find(name);
    if (obj.isNamespace()) return obj.asNamespace().attrs->find(name);
    return nullptr;
  }

  // obj[key] where it is a stored dict item or list item (what getItem
  // would return), else null.
  static const Value* storedItem(const Value& obj, const Value& key) {
    if (obj.isObject() && key.isString()) return obj.asObject().find(key.asString());
    if (obj.isArray() && (key.isInt() || key.isBool())) {
      const Array& a = obj.asArray();
      const auto n = static_cast<int64_t>(a.size());
      int64_t i = key.asInt();
      if (i < 0) i += n;
      return i >= 0 && i < n ? &a[static_cast<size_t>(i)] : nullptr;
    }
    return nullptr;
  }

  // A name no frame or variable binds: a global function, else undefined.
  static Value evalUnboundName(const Expr& e) {
    if (isGlobal(e.name)) {
      auto c = std::make_shared<Callable>();
      c->name = e.name;
      return Value(Value::CallablePtr(std::move(c)));
    }
    return Value::undefined(strCat("'", e.name, "' is undefined"));
  }

  absl::StatusOr<Value> eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.value;
      case Expr::Kind::kName:
      case Expr::Kind::kGetAttr:
      case Expr::Kind::kGetItem: {
        Value tmp;
        TANDEM_ASSIGN_OR_RETURN(const Value* v, evalRef(e, tmp));
        if (v == &tmp) return tmp;
        return *v;
      }
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        Array a;
        a.reserve(e.args.size());
        for (const ExprPtr& x : e.args) {
          TANDEM_ASSIGN_OR_RETURN(Value v, eval(*x));
          a.push_back(std::move(v));
        }
        return makeList(std::move(a));
      }
      case Expr::Kind::kDict: {
        auto o = std::make_shared<Object>();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          TANDEM_ASSIGN_OR_RETURN(Value k, eval(*e.args[i]));
          if (!k.isString()) return error(e.args[i]->pos, "dict keys must be strings here");
          TANDEM_ASSIGN_OR_RETURN(Value v, eval(*e.args[i + 1]));
          o->set(k.asString(), std::move(v));
        }
        return Value(std::move(o));
      }
      case Expr::Kind::kSlice:
        return evalSlice(e);
      case Expr::Kind::kCall:
        return evalCall(e);
      case Expr::Kind::kFilter:
        return evalFilter(e);
      case Expr::Kind::kTest: {
        Value tmp;
        TANDEM_ASSIGN_OR_RETURN(const Value* subject, evalRef(*e.args[0], tmp));
        TANDEM_ASSIGN_OR_RETURN(Args args, evalArgs(e, 1));
        TANDEM_ASSIGN_OR_RETURN(bool r, applyTest(e.pos, e.name, *subject, args));
        return Value(r != e.negated);
      }
      case Expr::Kind::kNot: {
        Value tmp;
        TANDEM_ASSIGN_OR_RETURN(const Value* v, evalRef(*e.args[0], tmp));
        return Value(!v->truthy());
      }
      case Expr::Kind::kNeg:
      case Expr::Kind::kPos: {
        TANDEM_ASSIGN_OR_RETURN(Value v, eval(*e.args[0]));
        TANDEM_RETURN_IF_ERROR(failIfUndefined(e.pos, v));
        if (!v.isNumber()) {
          return error(e.pos, strCat("bad operand type for unary ", e.kind == Expr::Kind::kNeg ? "-" : "+", ": '",
                                     v.typeName(), "'"));
        }
        if (e.kind == Expr::Kind::kPos) return v.isBool() ? Value(v.asInt()) : v;
        return v.isFloat() ? Value(-v.asDouble()) : Value(-v.asInt());
      }
      case Expr::Kind::kBinary: {
        Value a_tmp, b_tmp;
        TANDEM_ASSIGN_OR_RETURN(const Value* a, evalRef(*e.args[0], a_tmp));
        TANDEM_ASSIGN_OR_RETURN(const Value* b, evalRef(*e.args[1], b_tmp));
        if (e.name == "+" && a == &a_tmp && a->isString() && b->isString()) {
          // A computed left string grows in place, so a + b + c + ... builds
          // one string rather than one per +.
          std::string s = std::move(a_tmp).takeString();
          s += b->asString();
          return Value(std::move(s));
        }
        return binary(e.pos, e.name, *a, *b);
      }
      case Expr::Kind::kCompare: {
        Value left_tmp;
        TANDEM_ASSIGN_OR_RETURN(const Value* left, evalRef(*e.args[0], left_tmp));
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right_tmp;
          TANDEM_ASSIGN_OR_RETURN(const Value* right, evalRef(*e.args[i + 1], right_tmp));
          TANDEM_ASSIGN_OR_RETURN(bool r, compare(e.args[i + 1]->pos, e.ops[i], *left, *right));
          if (!r) return Value(false);
          if (right == &right_tmp) {
            left_tmp = std::move(right_tmp);
            left = &left_tmp;
          } else {
            left = right;
          }
        }
        return Value(true);
      }
      case Expr::Kind::kAnd: {
        Value tmp;
        TANDEM_ASSIGN_OR_RETURN(const Value* a, evalRef(*e.args[0], tmp));
        if (!a->truthy()) return *a;
        return eval(*e.args[1]);
      }
      case Expr::Kind::kOr: {
        Value tmp;
        TANDEM_ASSIGN_OR_RETURN(const Value* a, evalRef(*e.args[0], tmp));
        if (a->truthy()) return *a;
        return eval(*e.args[1]);
      }
      case Expr::Kind::kCondExpr: {
        Value tmp;
        TANDEM_ASSIGN_OR_RETURN(const Value* c, evalRef(*e.args[1], tmp));
        if (c->truthy()) return eval(*e.args[0]);
        if (!e.args[2]) return Value::undefined("the inline if expression evaluated to false and no else was given");
        return eval(*e.args[2]);
      }
    }
    return error(e.pos, "unknown expression");
  }

  absl::Status failIfUndefined(SourcePos p, const Value& v) const {
    if (v.isUndefined()) return error(p, v.undefinedHint());
    return absl::OkStatus();
  }

  absl::StatusOr<Args> evalArgs(const Expr& e, size_t from) {
    Args a;
    for (size_t i = from; i < e.args.size(); ++i) {
      TANDEM_ASSIGN_OR_RETURN(Value v, eval(*e.args[i]));
      a.pos.push_back(std::move(v));
    }
    for (const auto& [k, x] : e.kwargs) {
      TANDEM_ASSIGN_OR_RETURN(Value v, eval(*x));
      a.kw.emplace_back(k, std::move(v));
    }
    return a;
  }

  absl::StatusOr<Value> loopAttr(SourcePos p, const LoopInfo& l, std::string_view name) const {
    const auto n = static_cast<int64_t>(l.items->size());
    const auto i = static_cast<int64_t>(l.index);
    if (name == "index") return Value(i + 1);
    if (name == "index0") return Value(i);
    if (name == "revindex") return Value(n - i);
    if (name == "revindex0") return Value(n - i - 1);
    if (name == "first") return Value(i == 0);
    if (name == "last") return Value(i == n - 1);
    if (name == "length") return Value(n);
    if (name == "depth") return Value(int64_t{1});
    if (name == "depth0") return Value(int64_t{0});
    if (name == "previtem") {
      if (i == 0) return Value::undefined("there is no previous item");
      return (*l.items)[l.index - 1];
    }
    if (name == "nextitem") {
      if (i == n - 1) return Value::undefined("there is no next item");
      return (*l.items)[l.index + 1];
    }
    if (name == "cycle" || name == "changed") return error(p, strCat("loop.", name, " is not supported"));
    return Value::undefined(strCat("'LoopContext object' has no attribute '", name, "'"));
  }

  absl::StatusOr<Value> getAttr(SourcePos p, const Value& obj, std::string_view name) {
    if (obj.isUndefined()) return error(p, obj.undefinedHint());
    if (obj.isObject()) {
      if (isDictMethod(name)) return bind(obj, std::string(name));
      if (const Value* v = obj.asObject().find(name)) return *v;
      return noAttribute(obj, name);
    }
    if (obj.isString()) {
      if (isStrMethod(name)) return bind(obj, std::string(name));
      return noAttribute(obj, name);
    }
    if (obj.isNamespace()) {
      if (const Value* v = obj.asNamespace().attrs->find(name)) return *v;
      return Value::undefined(strCat("'Namespace object' has no attribute '", name, "'"));
    }
    if (obj.isLoop()) return loopAttr(p, obj.asLoop(), name);
    return noAttribute(obj, name);
  }

  absl::StatusOr<Value> getItem(SourcePos p, const Value& obj, const Value& key) {
    if (obj.isUndefined()) return error(p, obj.undefinedHint());
    if (key.isUndefined()) return error(p, key.undefinedHint());
    if (obj.isObject() && key.isString()) {
      if (const Value* v = obj.asObject().find(key.asString())) return *v;
      return getAttr(p, obj, key.asString());
    }
    if ((obj.isArray() || obj.isString()) && (key.isInt() || key.isBool())) {
      const int64_t n =
          obj.isArray() ? static_cast<int64_t>(obj.asArray().size()) : static_cast<int64_t>(numCodePoints(obj.asString()));
      int64_t i = key.asInt();
      if (i < 0) i += n;
      if (i < 0 || i >= n) {
        return Value::undefined(strCat("'", typeRepr(obj), "' has no element ", key.asInt()));
      }
      if (obj.isArray()) return obj.asArray()[static_cast<size_t>(i)];
      std::vector<size_t> at = codePoints(obj.asString());
      return Value(obj.asString().substr(at[static_cast<size_t>(i)], at[static_cast<size_t>(i) + 1] - at[static_cast<size_t>(i)]));
    }
    if (key.isString()) return getAttr(p, obj, key.asString());
    std::string k;
    key.appendRepr(k);
    return Value::undefined(strCat("'", typeRepr(obj), "' has no element ", k));
  }

  absl::StatusOr<Value> evalSlice(const Expr& e) {
    Value obj_tmp;
    TANDEM_ASSIGN_OR_RETURN(const Value* obj_ref, evalRef(*e.args[0], obj_tmp));
    const Value& obj = *obj_ref;
    TANDEM_RETURN_IF_ERROR(failIfUndefined(e.pos, obj));
    std::optional<int64_t> parts[3];
    for (int i = 0; i < 3; ++i) {
      if (!e.args[1 + i]) continue;
      TANDEM_ASSIGN_OR_RETURN(Value v, eval(*e.args[1 + i]));
      if (v.isNone()) continue;
      if (!v.isInt() && !v.isBool()) return error(e.args[1 + i]->pos, "slice indices must be integers or none");
      parts[i] = v.asInt();
    }
    const int64_t step = parts[2].value_or(1);
    if (step == 0) return error(e.pos, "slice step cannot be zero");
    if (obj.isArray()) {
      const Array& a = obj.asArray();
      const std::vector<int64_t> indices = sliceIndices(static_cast<int64_t>(a.size()), parts[0], parts[1], step);
      Array out;
      out.reserve(indices.size());
      for (int64_t i : indices) out.push_back(a[static_cast<size_t>(i)]);
      return makeList(std::move(out));
    }
    if (obj.isString()) {
      const std::string& s = obj.asString();
      std::vector<size_t> at = codePoints(s);
      std::string out;
      for (int64_t i : sliceIndices(static_cast<int64_t>(at.size()) - 1, parts[0], parts[1], step)) {
        const auto u = static_cast<size_t>(i);
        out.append(s, at[u], at[u + 1] - at[u]);
      }
      return Value(std::move(out));
    }
    return error(e.pos, strCat("'", obj.typeName(), "' object is not subscriptable"));
  }

  // ---- operators ----

  absl::StatusOr<Value> binary(SourcePos p, std::string_view op, const Value& a, const Value& b) {
    if (op == "~") return Value(a.str() + b.str());
    TANDEM_RETURN_IF_ERROR(failIfUndefined(p, a));
    TANDEM_RETURN_IF_ERROR(failIfUndefined(p, b));
    if (op == "+") {
      if (a.isString() && b.isString()) return Value(a.asString() + b.asString());
      if (a.isArray() && b.isArray()) {
        Array out = a.asArray();
        out.insert(out.end(), b.asArray().begin(), b.asArray().end());
        return makeList(std::move(out));
      }
    }
    if (op == "*" && ((a.isString() || a.isArray()) && (b.isInt() || b.isBool()))) {
      const int64_t n = b.asInt();
      if (a.isString()) {
        std::string out;
        for (int64_t i = 0; i < n; ++i) out += a.asString();
        return Value(std::move(out));
      }
      Array out;
      for (int64_t i = 0; i < n; ++i) out.insert(out.end(), a.asArray().begin(), a.asArray().end());
      return makeList(std::move(out));
    }
    if (!a.isNumber() || !b.isNumber()) {
      if (op == "%" && a.isString()) return error(p, "'%' string formatting is not supported");
      return error(p, strCat("unsupported operand type(s) for ", op, ": '", a.typeName(), "' and '", b.typeName(), "'"));
    }
    const bool floats = a.isFloat() || b.isFloat();
    if (op == "/") {
      if (b.asDouble() == 0) return error(p, "division by zero");
      return Value(a.asDouble() / b.asDouble());
    }
    if (floats) {
      const double x = a.asDouble(), y = b.asDouble();
      if (op == "+") return Value(x + y);
      if (op == "-") return Value(x - y);
      if (op == "*") return Value(x * y);
      if (op == "**") return Value(std::pow(x, y));
      if (y == 0) return error(p, "float division by zero");
      if (op == "//") return Value(std::floor(x / y));
      if (op == "%") {
        double m = std::fmod(x, y);
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        return Value(m);
      }
    } else {
      const int64_t x = a.asInt(), y = b.asInt();
      if (op == "+") return Value(x + y);
      if (op == "-") return Value(x - y);
      if (op == "*") return Value(x * y);
      if (op == "**") {
        if (y < 0) return Value(std::pow(static_cast<double>(x), static_cast<double>(y)));
        int64_t r = 1;
        for (int64_t i = 0; i < y; ++i) r *= x;
        return Value(r);
      }
      if (y == 0) return error(p, "integer division or modulo by zero");
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --q;
        m += y;
      }
      if (op == "//") return Value(q);
      if (op == "%") return Value(m);
    }
    return error(p, strCat("unknown operator ", op));
  }

  absl::StatusOr<bool> contains(SourcePos p, const Value& item, const Value& seq) {
    if (seq.isString()) {
      if (!item.isString()) {
        return error(p, strCat("'in <string>' requires string as left operand, not ", item.typeName()));
      }
      return seq.asString().find(item.asString()) != std::string::npos;
    }
    if (seq.isArray()) {
      for (const Value& x : seq.asArray()) {
        if (x.equals(item)) return true;
      }
      return false;
    }
    if (seq.isObject()) return item.isString() && seq.asObject().find(item.asString()) != nullptr;
    if (seq.isUndefined()) return false;  // Undefined iterates as empty
    return error(p, strCat("argument of type '", seq.typeName(), "' is not iterable"));
  }

  absl::StatusOr<bool> compare(SourcePos p, std::string_view op, const Value& a, const Value& b) {
    if (op == "==") return a.equals(b);
    if (op == "!=") return !a.equals(b);
    if (op == "in") return contains(p, a, b);
    if (op == "notin") {
      TANDEM_ASSIGN_OR_RETURN(bool r, contains(p, a, b));
      return !r;
    }
    TANDEM_RETURN_IF_ERROR(failIfUndefined(p, a));
    TANDEM_RETURN_IF_ERROR(failIfUndefined(p, b));
    int c;
    if (a.isNumber() && b.isNumber()) {
      const double x = a.asDouble(), y = b.asDouble();
      c = x < y ? -1 : x > y ? 1 : 0;
    } else if (a.isString() && b.isString()) {
      c = a.asString().compare(b.asString());
    } else {
      return error(p, strCat("'", op, "' not supported between instances of '", a.typeName(), "' and '",
                             b.typeName(), "'"));
    }
    if (op == "<") return c < 0;
    if (op == "<=") return c <= 0;
    if (op == ">") return c > 0;
    return c >= 0;
  }

  // ---- calls ----

  absl::StatusOr<Value> evalCall(const Expr& e) {
    const Expr& callee_expr = *e.args[0];
    if (callee_expr.kind == Expr::Kind::kGetAttr) {
      // A method call (s.startswith(x), d.get(k)) calls on the object in
      // place, without binding a copy of it.
      Value self_tmp;
      TANDEM_ASSIGN_OR_RETURN(const Value* self, evalRef(*callee_expr.args[0], self_tmp));
      if (self->isString() && isStrMethod(callee_expr.name)) {
        TANDEM_ASSIGN_OR_RETURN(Args args, evalArgs(e, 1));
        return callStrMethod(e.pos, self->asString(), callee_expr.name, args);
      }
      if (self->isObject() && isDictMethod(callee_expr.name)) {
        TANDEM_ASSIGN_OR_RETURN(Args args, evalArgs(e, 1));
        return callDictMethod(e.pos, self->asObject(), callee_expr.name, args);
      }
      TANDEM_ASSIGN_OR_RETURN(Value callee, getAttr(callee_expr.pos, *self, callee_expr.name));
      return callValue(e, callee);
    }
    TANDEM_ASSIGN_OR_RETURN(Value callee, eval(callee_expr));
    return callValue(e, callee);
  }

  // Calls `callee`, the value of e.args[0], with e's arguments.
  absl::StatusOr<Value> callValue(const Expr& e, const Value& callee) {
    TANDEM_RETURN_IF_ERROR(failIfUndefined(e.pos, callee));
    if (!callee.isCallable()) return error(e.pos, strCat("'", callee.typeName(), "' object is not callable"));
    TANDEM_ASSIGN_OR_RETURN(Args args, evalArgs(e, 1));
    const Callable& c = callee.asCallable();
    if (c.self == nullptr) return callGlobal(e.pos, c.name, args);
    if (c.self->isString()) return callStrMethod(e.pos, c.self->asString(), c.name, args);
    return callDictMethod(e.pos, c.self->asObject(), c.name, args);
  }

  absl::StatusOr<std::string> stringArg(SourcePos p, const Args& args, size_t i, std::string_view name,
                                        std::string_view fn) {
    const Value* v = args.get(i, name);
    if (v == nullptr) return error(p, strCat(fn, "() is missing its argument '", name, "'"));
    if (!v->isString()) return error(p, strCat(fn, "() argument '", name, "' must be a string, not ", v->typeName()));
    return v->asString();
  }

  absl::StatusOr<Value> callGlobal(SourcePos p, std::string_view name, const Args& args) {
    if (name == "raise_exception") {
      const Value* msg = args.get(0, "message");
      absl::Status s = absl::InvalidArgumentError(msg ? msg->str() : "");
      s.SetPayload(kRaisedPayload, absl::Cord("1"));
      return s;
    }
    if (name == "strftime_now") {
      TANDEM_ASSIGN_OR_RETURN(std::string fmt, stringArg(p, args, 0, "format", name));
      const std::time_t t = std::chrono::system_clock::to_time_t(options_.now);
      std::tm tm{};
      gmtime_r(&t, &tm);
      char buf[512];
      const size_t n = std::strftime(buf, sizeof(buf), fmt.c_str(), &tm);
      return Value(std::string(buf, n));
    }
    if (name == "namespace" || name == "dict") {
      auto o = std::make_shared<Object>();
      if (const Value* init = args.get(0, "")) {
        if (!init->isObject()) return error(p, strCat(name, "() takes a dict or keyword arguments"));
        *o = init->asObject();
      }
      for (const auto& [k, v] : args.kw) o->set(k, v);
      if (name == "dict") return Value(std::move(o));
      return Value(Namespace{std::move(o)});
    }
    if (name == "range") {
      int64_t r[3] = {0, 0, 1};
      if (args.pos.empty() || args.pos.size() > 3) return error(p, "range() takes 1 to 3 integers");
      for (size_t i = 0; i < args.pos.size(); ++i) {
        if (!args.pos[i].isInt()) return error(p, "range() takes integers");
      }
      if (args.pos.size() == 1) {
        r[1] = args.pos[0].asInt();
      } else {
        r[0] = args.pos[0].asInt();
        r[1] = args.pos[1].asInt();
        if (args.pos.size() == 3) r[2] = args.pos[2].asInt();
      }
      if (r[2] == 0) return error(p, "range() step must not be zero");
      Array out;
      for (int64_t i = r[0]; r[2] > 0 ? i < r[1] : i > r[1]; i += r[2]) out.emplace_back(i);
      return makeList(std::move(out));
    }
    return error(p, strCat("unknown function ", name));
  }

  absl::StatusOr<Value> callStrMethod(SourcePos p, const std::string& s, std::string_view name, const Args& args) {
    if (name == "startswith" || name == "endswith") {
      const Value* arg = args.get(0, "prefix");
      if (arg == nullptr) return error(p, strCat(name, "() takes one argument"));
      std::vector<std::string> options;
      if (arg->isString()) {
        options.push_back(arg->asString());
      } else if (arg->isArray()) {
        for (const Value& x : arg->asArray()) {
          if (!x.isString()) return error(p, strCat(name, "() takes a string or a tuple of strings"));
          options.push_back(x.asString());
        }
      } else {
        return error(p, strCat(name, "() takes a string or a tuple of strings, not ", arg->typeName()));
      }
      for (const std::string& o : options) {
        if (name == "startswith" ? s.starts_with(o) : s.ends_with(o)) return Value(true);
      }
      return Value(false);
    }
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const Value* chars = args.get(0, "chars");
      if (chars && !chars->isString() && !chars->isNone()) return error(p, strCat(name, "() arg must be None or str"));
      return Value(stripChars(s, chars, name != "rstrip", name != "lstrip"));
    }
    if (name == "split" || name == "rsplit") {
      const Value* sep = args.get(0, "sep");
      const Value* max = args.get(1, "maxsplit");
      const int64_t maxsplit = max && max->isInt() ? max->asInt() : -1;
      Array parts;
      if (sep == nullptr || sep->isNone()) {
        if (name == "rsplit" && maxsplit >= 0) return error(p, "rsplit() with maxsplit and no separator is not supported");
        size_t i = 0;
        int64_t done = 0;
        while (true) {
          while (i < s.size() && isPySpace(s[i])) ++i;
          if (i >= s.size()) break;
          if (maxsplit >= 0 && done == maxsplit) {
            size_t e = s.size();
            while (e > i && isPySpace(s[e - 1])) --e;
            parts.emplace_back(s.substr(i, e - i));
            break;
          }
          size_t j = i;
          while (j < s.size() && !isPySpace(s[j])) ++j;
          parts.emplace_back(s.substr(i, j - i));
          ++done;
          i = j;
        }
        return makeList(std::move(parts));
      }
      if (!sep->isString()) return error(p, strCat(name, "() separator must be a string"));
      const std::string& d = sep->asString();
      if (d.empty()) return error(p, "empty separator");
      if (name == "split") {
        size_t pos = 0;
        int64_t done = 0;
        while (maxsplit < 0 || done < maxsplit) {
          const size_t f = s.find(d, pos);
          if (f == std::string::npos) break;
          parts.emplace_back(s.substr(pos, f - pos));
          pos = f + d.size();
          ++done;
        }
        parts.emplace_back(s.substr(pos));
      } else {
        size_t end = s.size();
        int64_t done = 0;
        Array rev;
        while (maxsplit < 0 || done < maxsplit) {
          if (end < d.size()) break;
          const size_t f = s.rfind(d, end - d.size());
          if (f == std::string::npos) break;
          rev.emplace_back(s.substr(f + d.size(), end - f - d.size()));
          end = f;
          ++done;
        }
        rev.emplace_back(s.substr(0, end));
        parts.assign(rev.rbegin(), rev.rend());
      }
      return makeList(std::move(parts));
    }
    if (name == "upper") return Value(asciiUpper(s));
    if (name == "lower") return Value(asciiLower(s));
    if (name == "capitalize") {
      std::string out = asciiLower(s);
      if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
      return Value(std::move(out));
    }
    if (name == "title") {
      std::string out = s;
      bool start = true;
      for (char& c : out) {
        const bool alpha = std::isalpha(static_cast<unsigned char>(c));
        c = static_cast<char>(start ? std::toupper(static_cast<unsigned char>(c))
                                    : std::tolower(static_cast<unsigned char>(c)));
        start = !alpha;
      }
      return Value(std::move(out));
    }
    if (name == "replace") {
      TANDEM_ASSIGN_OR_RETURN(std::string from, stringArg(p, args, 0, "old", name));
      TANDEM_ASSIGN_OR_RETURN(std::string to, stringArg(p, args, 1, "new", name));
      const Value* count = args.get(2, "count");
      return Value(replaceAll(s, from, to, count && count->isInt() ? count->asInt() : -1));
    }
    if (name == "find" || name == "count") {
      TANDEM_ASSIGN_OR_RETURN(std::string sub, stringArg(p, args, 0, "sub", name));
      if (name == "find") {
        const size_t f = s.find(sub);
        return Value(f == std::string::npos ? int64_t{-1} : static_cast<int64_t>(numCodePoints(s.substr(0, f))));
      }
      if (sub.empty()) return Value(static_cast<int64_t>(numCodePoints(s) + 1));
      int64_t n = 0;
      for (size_t f = s.find(sub); f != std::string::npos; f = s.find(sub, f + sub.size())) ++n;
      return Value(n);
    }
    if (name == "join") {
      const Value* items = args.get(0, "iterable");
      std::optional<Array> parts = items ? iterate(*items) : std::nullopt;
      if (!parts) return error(p, "join() takes an iterable of strings");
      std::string out;
      for (size_t i = 0; i < parts->size(); ++i) {
        if (!(*parts)[i].isString()) return error(p, strCat("join(): item ", i, " is not a string"));
        if (i > 0) out += s;
        out += (*parts)[i].asString();
      }
      return Value(std::move(out));
    }
    return error(p, strCat("str.", name, "() is not supported"));
  }

  absl::StatusOr<Value> callDictMethod(SourcePos p, const Object& o, std::string_view name, const Args& args) {
    if (name == "items") {
      Array out;
      for (const auto& [k, v] : o.items) out.push_back(makeList(Array{Value(k), v}));
      return makeList(std::move(out));
    }
    if (name == "keys" || name == "values") {
      Array out;
      for (const auto& [k, v] : o.items) out.push_back(name == "keys" ? Value(k) : v);
      return makeList(std::move(out));
    }
    if (name == "get") {
      const Value* key = args.get(0, "key");
      if (key == nullptr) return error(p, "get() takes a key");
      if (key->isString()) {
        if (const Value* v = o.find(key->asString())) return *v;
      }
      const Value* d = args.get(1, "default");
      return d ? *d : Value(None{});
    }
    return error(p, strCat("dict.", name, "() is not supported"));
  }

  // ---- filters ----

  absl::StatusOr<Value> evalFilter(const Expr& e) {
    Value tmp;
    TANDEM_ASSIGN_OR_RETURN(const Value* v, evalRef(*e.args[0], tmp));
    TANDEM_ASSIGN_OR_RETURN(Args args, evalArgs(e, 1));
    return applyFilter(e.pos, e.name, *v, args);
  }

  absl::StatusOr<Array> sequenceOf(SourcePos p, const Value& v, std::string_view filter) {
    std::optional<Array> items = iterate(v);
    if (!items) return error(p, strCat("filter '", filter, "': '", v.typeName(), "' object is not iterable"));
    return std::move(*items);
  }

  // `attribute` may be dotted ("function.name"), as Jinja2's.
  absl::StatusOr<Value> attributeOf(SourcePos p, const Value& item, const std::string& attribute) {
    Value cur = item;
    size_t start = 0;
    while (true) {
      const size_t dot = attribute.find('.', start);
      const std::string part = attribute.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      TANDEM_ASSIGN_OR_RETURN(cur, getItem(p, cur, Value(part)));
      if (dot == std::string::npos) return cur;
      start = dot + 1;
    }
  }

  absl::StatusOr<Value> applyFilter(SourcePos p, std::string_view name, const Value& v, const Args& args) {
    if (name == "trim") return Value(stripChars(v.str(), args.get(0, "chars"), true, true));
    if (name == "string") return v.isString() ? v : Value(v.str());
    if (name == "upper") return Value(asciiUpper(v.str()));
    if (name == "lower") return Value(asciiLower(v.str()));
    if (name == "capitalize") {
      std::string out = asciiLower(v.str());
      if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
      return Value(std::move(out));
    }
    if (name == "safe") return v;
    if (name == "length" || name == "count") {
      if (v.isString()) return Value(static_cast<int64_t>(numCodePoints(v.asString())));
      if (v.isArray()) return Value(static_cast<int64_t>(v.asArray().size()));
      if (v.isObject()) return Value(static_cast<int64_t>(v.asObject().items.size()));
      if (v.isUndefined()) return Value(int64_t{0});
      return error(p, strCat("filter 'length': object of type '", v.typeName(), "' has no len()"));
    }
    if (name == "tojson") {
      const Value* indent = args.get(0, "indent");
      if (indent && !indent->isInt() && !indent->isNone()) return error(p, "filter 'tojson': indent must be an integer");
      absl::StatusOr<std::string> j = toJson(v, indent && indent->isInt() ? static_cast<int>(indent->asInt()) : -1);
      if (!j.ok()) return error(p, strCat("filter 'tojson': ", j.status().message()));
      return Value(std::move(*j));
    }
    if (name == "default" || name == "d") {
      const Value* boolean = args.get(1, "boolean");
      const bool use_default = v.isUndefined() || (boolean && boolean->truthy() && !v.truthy());
      if (!use_default) return v;
      const Value* d = args.get(0, "default_value");
      return d ? *d : Value("");
    }
    if (name == "replace") {
      TANDEM_ASSIGN_OR_RETURN(std::string from, stringArg(p, args, 0, "old", "replace"));
      TANDEM_ASSIGN_OR_RETURN(std::string to, stringArg(p, args, 1, "new", "replace"));
      const Value* count = args.get(2, "count");
      return Value(replaceAll(v.str(), from, to, count && count->isInt() ? count->asInt() : -1));
    }
    if (name == "first" || name == "last") {
      TANDEM_ASSIGN_OR_RETURN(Array items, sequenceOf(p, v, name));
      if (items.empty()) return Value::undefined(strCat("No ", name, " item, sequence was empty."));
      return name == "first" ? items.front() : items.back();
    }
    if (name == "list") {
      TANDEM_ASSIGN_OR_RETURN(Array items, sequenceOf(p, v, name));
      return makeList(std::move(items));
    }
    if (name == "reverse") {
      if (v.isString()) {
        std::vector<size_t> at = codePoints(v.asString());
        std::string out;
        for (size_t i = at.size() - 1; i > 0; --i) out.append(v.asString(), at[i - 1], at[i] - at[i - 1]);
        return Value(std::move(out));
      }
      TANDEM_ASSIGN_OR_RETURN(Array items, sequenceOf(p, v, name));
      return makeList(Array(items.rbegin(), items.rend()));
    }
    if (name == "join") {
      TANDEM_ASSIGN_OR_RETURN(Array items, sequenceOf(p, v, name));
      const Value* sep = args.get(0, "d");
      const Value* attribute = args.get(1, "attribute");
      std::string out;
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0 && sep) out += sep->str();
        if (attribute) {
          TANDEM_ASSIGN_OR_RETURN(Value a, attributeOf(p, items[i], attribute->str()));
          out += a.str();
        } else {
          out += items[i].str();
        }
      }
      return Value(std::move(out));
    }
    if (name == "items") {
      if (v.isUndefined()) return makeList({});
      if (!v.isObject()) return error(p, strCat("filter 'items': can only get item pairs from a mapping, not ",
                                                v.typeName()));
      return callDictMethod(p, v.asObject(), "items", args);
    }
    if (name == "int" || name == "float" || name == "abs") return numberFilter(p, name, v, args);
    if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
      return selectFilter(p, name, v, args);
    }
    if (name == "map") return mapFilter(p, v, args);
    if (name == "unique") {
      TANDEM_ASSIGN_OR_RETURN(Array items, sequenceOf(p, v, name));
      Array out;
      for (const Value& x : items) {
        bool seen = false;
        for (const Value& y : out) seen = seen || y.equals(x);
        if (!seen) out.push_back(x);
      }
      return makeList(std::move(out));
    }
    return error(p, strCat("the filter '", name, "' is not supported"));
  }

  absl::StatusOr<Value> numberFilter(SourcePos p, std::string_view name, const Value& v, const Args& args) {
    if (name == "abs") {
      if (!v.isNumber()) return error(p, strCat("filter 'abs': bad operand type '", v.typeName(), "'"));
      return v.isFloat() ? Value(std::fabs(v.asDouble())) : Value(static_cast<int64_t>(std::llabs(v.asInt())));
    }
    const Value* d = args.get(0, "default");
    if (v.isNumber()) return name == "int" ? Value(static_cast<int64_t>(v.asDouble())) : Value(v.asDouble());
    if (v.isString()) {
      const std::string s = stripChars(v.asString(), nullptr, true, true);
      char* end = nullptr;
      const double x = std::strtod(s.c_str(), &end);
      if (!s.empty() && end == s.c_str() + s.size()) {
        return name == "int" ? Value(static_cast<int64_t>(x)) : Value(x);
      }
    }
    if (d) return *d;
    return name == "int" ? Value(int64_t{0}) : Value(0.0);
  }

  absl::StatusOr<Value> selectFilter(SourcePos p, std::string_view name, const Value& v, const Args& args) {
    TANDEM_ASSIGN_OR_RETURN(Array items, sequenceOf(p, v, name));
    const bool by_attr = name == "selectattr" || name == "rejectattr";
    const bool keep_if = name == "selectattr" || name == "select";
    size_t next = 0;
    std::string attribute;
    if (by_attr) {
      if (args.pos.empty() || !args.pos[0].isString()) return error(p, strCat("filter '", name, "' needs an attribute name"));
      attribute = args.pos[0].asString();
      next = 1;
    }
    std::string test;
    if (next < args.pos.size()) {
      if (!args.pos[next].isString()) return error(p, strCat("filter '", name, "': the test name must be a string"));
      test = args.pos[next].asString();
    }
    Args test_args;
    for (size_t i = next + 1; i < args.pos.size(); ++i) test_args.pos.push_back(args.pos[i]);
    Array out;
    for (const Value& item : items) {
      Value subject = item;
      if (by_attr) {
        TANDEM_ASSIGN_OR_RETURN(subject, attributeOf(p, item, attribute));
      }
      bool r;
      if (test.empty()) {
        r = subject.truthy();
      } else {
        TANDEM_ASSIGN_OR_RETURN(r, applyTest(p, test, subject, test_args));
      }
      if (r == keep_if) out.push_back(item);
    }
    return makeList(std::move(out));
  }

  absl::StatusOr<Value> mapFilter(SourcePos p, const Value& v, const Args& args) {
    TANDEM_ASSIGN_OR_RETURN(Array items, sequenceOf(p, v, "map"));
    Array out;
    if (const Value* attribute = args.get(99, "attribute")) {
      const Value* d = args.get(99, "default");
      for (const Value& item : items) {
        TANDEM_ASSIGN_OR_RETURN(Value a, attributeOf(p, item, attribute->str()));
        out.push_back(a.isUndefined() && d ? *d : a);
      }
      return makeList(std::move(out));
    }
    if (args.pos.empty() || !args.pos[0].isString()) return error(p, "filter 'map' needs a filter name or attribute=");
    Args filter_args;
    filter_args.pos.assign(args.pos.begin() + 1, args.pos.end());
    filter_args.kw = args.kw;
    for (const Value& item : items) {
      TANDEM_ASSIGN_OR_RETURN(Value r, applyFilter(p, args.pos[0].asString(), item, filter_args));
      out.push_back(std::move(r));
    }
    return makeList(std::move(out));
  }

  // ---- tests ----

  absl::StatusOr<bool> applyTest(SourcePos p, std::string_view name, const Value& v, const Args& args) {
    if (name == "defined") return !v.isUndefined();
    if (name == "undefined") return v.isUndefined();
    if (name == "none") return v.isNone();
    if (name == "boolean") return v.isBool();
    if (name == "true") return v.isBool() && v.asBool();
    if (name == "false") return v.isBool() && !v.asBool();
    if (name == "string") return v.isString();
    if (name == "mapping") return v.isObject();
    if (name == "number") return v.isNumber();
    if (name == "integer") return v.isInt();
    if (name == "float") return v.isFloat();
    // Undefined has __iter__, __len__ and __getitem__ in Jinja2.
    if (name == "iterable") return v.isString() || v.isArray() || v.isObject() || v.isUndefined();
    if (name == "sequence") return v.isString() || v.isArray() || v.isObject() || v.isUndefined();
    if (name == "callable") return v.isCallable();
    if (name == "lower" || name == "upper") {
      if (!v.isString()) return false;
      return v.asString() == (name == "lower" ? asciiLower(v.asString()) : asciiUpper(v.asString()));
    }
    if (name == "odd" || name == "even" || name == "divisibleby") {
      if (!v.isInt() && !v.isBool()) return error(p, strCat("test '", name, "' needs an integer"));
      if (name == "divisibleby") {
        const Value* n = args.get(0, "num");
        if (n == nullptr || !n->isInt() || n->asInt() == 0) return error(p, "test 'divisibleby' needs a non-zero integer");
        return v.asInt() % n->asInt() == 0;
      }
      return (v.asInt() % 2 != 0) == (name == "odd");
    }
    const Value* other = args.get(0, "other");
    if (name == "eq" || name == "equalto" || name == "==" || name == "sameas") {
      if (other == nullptr) return error(p, strCat("test '", name, "' needs a value to compare with"));
      return v.equals(*other) && (name != "sameas" || v.typeName() == other->typeName());
    }
    if (name == "ne" || name == "!=") {
      if (other == nullptr) return error(p, strCat("test '", name, "' needs a value to compare with"));
      return !v.equals(*other);
    }
    if (name == "in") {
      const Value* seq = args.get(0, "seq");
      if (seq == nullptr) return error(p, "test 'in' needs a sequence");
      return contains(p, v, *seq);
    }
    if (name == "gt" || name == "ge" || name == "lt" || name == "le" || name == "greaterthan" || name == "lessthan") {
      if (other == nullptr) return error(p, strCat("test '", name, "' needs a value to compare with"));
      const std::string op = name == "gt" || name == "greaterthan" ? ">" : name == "ge" ? ">=" : name == "le" ? "<=" : "<";
      return compare(p, op, v, *other);
    }
    return error(p, strCat("the test '", name, "' is not supported"));
  }

  const std::string& name_;
  const Object& vars_;
  const RenderOptions& options_;
  std::vector<Frame> frames_;
  int loop_depth_ = 0;
  std::string out_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Template>> Template::parse(std::string_view source, const ParseOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(std::vector<Token> tokens, tokenize(source, options.name));
  TANDEM_ASSIGN_OR_RETURN(Body body, jinja::parse(std::move(tokens), options.name));
  return std::unique_ptr<Template>(new Template(options.name, std::move(body)));
}

absl::StatusOr<std::string> Template::render(const Object& vars, const RenderOptions& options) const {
  return Renderer(name_, vars, options).run(body_);
}

}  // namespace tandem::jinja
