#include "e2e/apiserver/cel.h"

#include <cctype>
#include <vector>

#include "src/common/status.h"
#include "src/common/strings.h"

namespace tandem::apiserver {

using nlohmann::json;

struct CelProgram::Node {
  enum class Kind { kLiteral, kVariable, kSelect, kHas, kSize, kNot, kNeg, kAnd, kOr, kCompare, kArith };
  Kind kind;
  json literal;           // kLiteral
  std::string name;       // kVariable: self/oldSelf; kSelect: the field; kCompare/kArith: the operator
  std::shared_ptr<const Node> a, b;
};

namespace {

using Node = CelProgram::Node;
using NodePtr = std::shared_ptr<const Node>;

NodePtr make(Node::Kind kind, std::string name = "", NodePtr a = nullptr, NodePtr b = nullptr, json literal = nullptr) {
  auto n = std::make_shared<Node>();
  n->kind = kind;
  n->name = std::move(name);
  n->a = std::move(a);
  n->b = std::move(b);
  n->literal = std::move(literal);
  return n;
}

class Parser {
 public:
  explicit Parser(std::string_view text) : s_(text) {}

  absl::StatusOr<NodePtr> parse() {
    TANDEM_ASSIGN_OR_RETURN(NodePtr n, orExpr());
    skip();
    if (pos_ != s_.size()) return error(strCat("unexpected \"", s_.substr(pos_, 12), "\""));
    return n;
  }
  bool usesOldSelf() const { return uses_old_self_; }

 private:
  absl::Status error(std::string_view why) const {
    return absl::InvalidArgumentError(strCat("compilation failed at character ", pos_, ": ", why));
  }
  void skip() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool eat(std::string_view token) {
    skip();
    if (s_.substr(pos_, token.size()) != token) return false;
    pos_ += token.size();
    return true;
  }
  bool peek(std::string_view token) {
    skip();
    return s_.substr(pos_, token.size()) == token;
  }

  absl::StatusOr<NodePtr> orExpr() {
    TANDEM_ASSIGN_OR_RETURN(NodePtr left, andExpr());
    while (eat("||")) {
      TANDEM_ASSIGN_OR_RETURN(NodePtr right, andExpr());
      left = make(Node::Kind::kOr, "", left, right);
    }
    return left;
  }
  absl::StatusOr<NodePtr> andExpr() {
    TANDEM_ASSIGN_OR_RETURN(NodePtr left, compare());
    while (eat("&&")) {
      TANDEM_ASSIGN_OR_RETURN(NodePtr right, compare());
      left = make(Node::Kind::kAnd, "", left, right);
    }
    return left;
  }
  absl::StatusOr<NodePtr> compare() {
    TANDEM_ASSIGN_OR_RETURN(NodePtr left, additive());
    for (const char* op : {"<=", ">=", "==", "!=", "<", ">"}) {
      if (peek(op) && !(std::string_view(op) == "<" && peek("<=")) && !(std::string_view(op) == ">" && peek(">="))) {
        eat(op);
        TANDEM_ASSIGN_OR_RETURN(NodePtr right, additive());
        return make(Node::Kind::kCompare, op, left, right);
      }
    }
    return left;
  }
  absl::StatusOr<NodePtr> additive() {
    TANDEM_ASSIGN_OR_RETURN(NodePtr left, unary());
    while (true) {
      std::string op = peek("+") ? "+" : peek("-") ? "-" : "";
      if (op.empty()) return left;
      eat(op);
      TANDEM_ASSIGN_OR_RETURN(NodePtr right, unary());
      left = make(Node::Kind::kArith, op, left, right);
    }
  }
  absl::StatusOr<NodePtr> unary() {
    if (peek("!=")) return error("unexpected \"!=\"");
    if (eat("!")) {
      TANDEM_ASSIGN_OR_RETURN(NodePtr n, unary());
      return make(Node::Kind::kNot, "", n);
    }
    if (eat("-")) {
      TANDEM_ASSIGN_OR_RETURN(NodePtr n, unary());
      return make(Node::Kind::kNeg, "", n);
    }
    return postfix();
  }
  absl::StatusOr<NodePtr> postfix() {
    TANDEM_ASSIGN_OR_RETURN(NodePtr n, primary());
    while (true) {
      skip();
      if (peek("[")) return error("indexing ([...]) is not supported here");
      if (!eat(".")) return n;
      std::string field = ident();
      if (field.empty()) return error("expected a field name after \".\"");
      if (peek("(")) return error(strCat("method calls (.", field, "()) are not supported here"));
      n = make(Node::Kind::kSelect, field, n);
    }
  }
  std::string ident() {
    skip();
    size_t start = pos_;
    while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_')) ++pos_;
    if (start < s_.size() && std::isdigit(static_cast<unsigned char>(s_[start]))) {
      pos_ = start;
      return "";
    }
    return std::string(s_.substr(start, pos_ - start));
  }
  absl::StatusOr<NodePtr> primary() {
    skip();
    if (pos_ >= s_.size()) return error("unexpected end of the rule");
    const char c = s_[pos_];
    if (eat("(")) {
      TANDEM_ASSIGN_OR_RETURN(NodePtr n, orExpr());
      if (!eat(")")) return error("expected \")\"");
      return n;
    }
    if (c == '\'' || c == '"') {
      ++pos_;
      std::string out;
      while (pos_ < s_.size() && s_[pos_] != c) {
        if (s_[pos_] == '\\' && pos_ + 1 < s_.size()) ++pos_;
        out.push_back(s_[pos_++]);
      }
      if (pos_ >= s_.size()) return error("unterminated string");
      ++pos_;
      return make(Node::Kind::kLiteral, "", nullptr, nullptr, out);
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t start = pos_;
      bool real = false;
      while (pos_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '.')) {
        real = real || s_[pos_] == '.';
        ++pos_;
      }
      const std::string text(s_.substr(start, pos_ - start));
      if (pos_ < s_.size() && (s_[pos_] == 'u' || s_[pos_] == 'e' || s_[pos_] == 'E')) {
        return error("unsigned and exponent literals are not supported here");
      }
      return make(Node::Kind::kLiteral, "", nullptr, nullptr,
                  real ? json(std::stod(text)) : json(static_cast<int64_t>(std::stoll(text))));
    }
    const std::string word = ident();
    if (word.empty()) return error(strCat("unexpected \"", s_.substr(pos_, 1), "\""));
    if (word == "true" || word == "false") return make(Node::Kind::kLiteral, "", nullptr, nullptr, word == "true");
    if (word == "null") return make(Node::Kind::kLiteral, "", nullptr, nullptr, nullptr);
    if (word == "self" || word == "oldSelf") {
      uses_old_self_ = uses_old_self_ || word == "oldSelf";
      return make(Node::Kind::kVariable, word);
    }
    if (word == "has" || word == "size") {
      if (!eat("(")) return error(strCat(word, " needs an argument in parentheses"));
      TANDEM_ASSIGN_OR_RETURN(NodePtr arg, orExpr());
      if (!eat(")")) return error(strCat("expected \")\" closing ", word, "("));
      if (word == "has" && arg->kind != Node::Kind::kSelect) {
        return error("has() takes a field selection, e.g. has(self.spec.model)");
      }
      return make(word == "has" ? Node::Kind::kHas : Node::Kind::kSize, "", arg);
    }
    if (peek("(")) return error(strCat("the function ", word, "() is not supported here (has and size are)"));
    return error(strCat("undeclared reference to \"", word, "\" (only self and oldSelf are)"));
  }

  std::string_view s_;
  size_t pos_ = 0;
  bool uses_old_self_ = false;
};

absl::StatusOr<json> eval(const Node& n, const json& self, const json* old_self);

absl::StatusOr<bool> truth(const Node& n, const json& self, const json* old_self) {
  TANDEM_ASSIGN_OR_RETURN(json v, eval(n, self, old_self));
  if (!v.is_boolean()) return absl::InvalidArgumentError("no such overload: a condition is not a bool");
  return v.get<bool>();
}

size_t codePoints(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

absl::StatusOr<json> eval(const Node& n, const json& self, const json* old_self) {
  switch (n.kind) {
    case Node::Kind::kLiteral:
      return n.literal;
    case Node::Kind::kVariable:
      if (n.name == "self") return self;
      if (old_self == nullptr) return absl::InvalidArgumentError("oldSelf is not defined on a create");
      return *old_self;
    case Node::Kind::kSelect: {
      TANDEM_ASSIGN_OR_RETURN(json base, eval(*n.a, self, old_self));
      if (!base.is_object()) return absl::InvalidArgumentError(strCat("no such key: ", n.name));
      auto it = base.find(n.name);
      if (it == base.end()) return absl::InvalidArgumentError(strCat("no such key: ", n.name));
      return *it;
    }
    case Node::Kind::kHas: {
      TANDEM_ASSIGN_OR_RETURN(json base, eval(*n.a->a, self, old_self));
      return base.is_object() && base.contains(n.a->name);
    }
    case Node::Kind::kSize: {
      TANDEM_ASSIGN_OR_RETURN(json v, eval(*n.a, self, old_self));
      if (v.is_string()) return static_cast<int64_t>(codePoints(v.get<std::string>()));
      if (v.is_array() || v.is_object()) return static_cast<int64_t>(v.size());
      return absl::InvalidArgumentError("no such overload: size() of a scalar");
    }
    case Node::Kind::kNot: {
      TANDEM_ASSIGN_OR_RETURN(bool v, truth(*n.a, self, old_self));
      return !v;
    }
    case Node::Kind::kNeg: {
      TANDEM_ASSIGN_OR_RETURN(json v, eval(*n.a, self, old_self));
      if (v.is_number_integer()) return -v.get<int64_t>();
      if (v.is_number()) return -v.get<double>();
      return absl::InvalidArgumentError("no such overload: -x of a non-number");
    }
    case Node::Kind::kAnd:
    case Node::Kind::kOr: {
      // CEL's && and || are commutative with errors absorbed by a deciding
      // side: false && error is false, true || error is true.
      const bool is_and = n.kind == Node::Kind::kAnd;
      absl::StatusOr<bool> l = truth(*n.a, self, old_self);
      if (l.ok() && *l != is_and) return *l;
      absl::StatusOr<bool> r = truth(*n.b, self, old_self);
      if (r.ok() && *r != is_and) return *r;
      if (!l.ok()) return l.status();
      if (!r.ok()) return r.status();
      return is_and;
    }
    case Node::Kind::kArith: {
      TANDEM_ASSIGN_OR_RETURN(json l, eval(*n.a, self, old_self));
      TANDEM_ASSIGN_OR_RETURN(json r, eval(*n.b, self, old_self));
      if (n.name == "+" && l.is_string() && r.is_string()) return l.get<std::string>() + r.get<std::string>();
      if (!l.is_number() || !r.is_number()) return absl::InvalidArgumentError(strCat("no such overload: ", n.name));
      if (l.is_number_integer() && r.is_number_integer()) {
        return n.name == "+" ? l.get<int64_t>() + r.get<int64_t>() : l.get<int64_t>() - r.get<int64_t>();
      }
      return n.name == "+" ? l.get<double>() + r.get<double>() : l.get<double>() - r.get<double>();
    }
    case Node::Kind::kCompare: {
      TANDEM_ASSIGN_OR_RETURN(json l, eval(*n.a, self, old_self));
      TANDEM_ASSIGN_OR_RETURN(json r, eval(*n.b, self, old_self));
      const std::string& op = n.name;
      if (op == "==" || op == "!=") {
        const bool eq = l.is_number() && r.is_number() ? l.get<double>() == r.get<double>() : l == r;
        return op == "==" ? eq : !eq;
      }
      int cmp = 0;
      if (l.is_number() && r.is_number()) {
        const double a = l.get<double>(), b = r.get<double>();
        cmp = a < b ? -1 : a > b ? 1 : 0;
      } else if (l.is_string() && r.is_string()) {
        cmp = l.get<std::string>().compare(r.get<std::string>());
      } else {
        return absl::InvalidArgumentError(strCat("no such overload: ", op, " of mixed types"));
      }
      return op == "<" ? cmp < 0 : op == "<=" ? cmp <= 0 : op == ">" ? cmp > 0 : cmp >= 0;
    }
  }
  return absl::InternalError("unknown node");
}

}  // namespace

absl::StatusOr<CelProgram> CelProgram::compile(std::string_view expression) {
  Parser p(expression);
  TANDEM_ASSIGN_OR_RETURN(NodePtr root, p.parse());
  CelProgram program;
  program.root_ = std::move(root);
  program.uses_old_self_ = p.usesOldSelf();
  return program;
}

absl::StatusOr<bool> CelProgram::evaluate(const json& self, const json* old_self) const {
  return truth(*root_, self, old_self);
}

}  // namespace tandem::apiserver
