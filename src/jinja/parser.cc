#include "src/jinja/parser.h"

#include <set>

#include "src/common/strings.h"

namespace tandem::jinja {
namespace {

// Tags Jinja2 has that this subset does not: refused by name.
const std::set<std::string, std::less<>>& unsupportedTags() {
  static const auto* tags = new std::set<std::string, std::less<>>{
      "macro", "call", "filter", "include", "import", "from",  "extends",  "block", "with",
      "raw",   "autoescape", "do", "trans",  "pluralize", "print", "endmacro", "endcall"};
  return *tags;
}

class Parser {
 public:
  Parser(std::vector<Token> tokens, std::string_view name) : toks_(std::move(tokens)), name_(name) {}

  absl::StatusOr<Body> run() {
    Body body;
    TANDEM_RETURN_IF_ERROR(subparse({}, &body));
    if (cur().kind != TokenKind::kEof) {
      return error(cur().pos, strCat("unexpected \"", cur().text, "\": no block is open to end"));
    }
    return body;
  }

 private:
  const Token& cur() const { return toks_[i_]; }
  const Token& peek(size_t n = 1) const { return toks_[std::min(i_ + n, toks_.size() - 1)]; }
  void next() {
    if (i_ + 1 < toks_.size()) ++i_;
  }
  bool isOp(std::string_view op) const { return cur().kind == TokenKind::kOp && cur().text == op; }
  bool isName(std::string_view n) const { return cur().kind == TokenKind::kName && cur().text == n; }

  absl::Status error(SourcePos p, std::string_view what) const {
    return absl::InvalidArgumentError(strCat(name_, ":", p.line, ":", p.col, ": ", what));
  }

  std::string describe(const Token& t) const {
    switch (t.kind) {
      case TokenKind::kEof: return "end of template";
      case TokenKind::kBlockEnd: return "end of tag '%}'";
      case TokenKind::kVarEnd: return "end of expression '}}'";
      case TokenKind::kText: return "template text";
      case TokenKind::kString: return strCat("string '", t.text, "'");
      default: return strCat("'", t.text, "'");
    }
  }

  absl::Status expectOp(std::string_view op) {
    if (!isOp(op)) return error(cur().pos, strCat("expected '", op, "', got ", describe(cur())));
    next();
    return absl::OkStatus();
  }

  absl::Status expect(TokenKind kind, std::string_view what) {
    if (cur().kind != kind) return error(cur().pos, strCat("expected ", what, ", got ", describe(cur())));
    next();
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> expectName(std::string_view what) {
    if (cur().kind != TokenKind::kName) return error(cur().pos, strCat("expected ", what, ", got ", describe(cur())));
    std::string n = cur().text;
    next();
    return n;
  }

  // Statements until a {% tag %} named in `ends` (left unconsumed: cur() is its name).
  absl::Status subparse(const std::vector<std::string_view>& ends, Body* body) {
    while (true) {
      const Token& t = cur();
      switch (t.kind) {
        case TokenKind::kEof:
          if (!ends.empty()) {
            return error(t.pos, strCat("unexpected end of template: expected {% ", ends.back(), " %}"));
          }
          return absl::OkStatus();
        case TokenKind::kText: {
          auto n = makeNode(Node::Kind::kText, t.pos);
          n->text = t.text;
          body->push_back(std::move(n));
          next();
          break;
        }
        case TokenKind::kVarBegin: {
          auto n = makeNode(Node::Kind::kOutput, t.pos);
          next();
          TANDEM_ASSIGN_OR_RETURN(n->expr, parseExpression());
          TANDEM_RETURN_IF_ERROR(expect(TokenKind::kVarEnd, "'}}'"));
          body->push_back(std::move(n));
          break;
        }
        case TokenKind::kBlockBegin: {
          next();
          if (cur().kind != TokenKind::kName) return error(cur().pos, "expected a tag name after {%");
          for (std::string_view e : ends) {
            if (cur().text == e) return absl::OkStatus();
          }
          TANDEM_RETURN_IF_ERROR(parseStatement(body));
          break;
        }
        default:
          return error(t.pos, strCat("unexpected ", describe(t)));
      }
    }
  }

  static NodePtr makeNode(Node::Kind kind, SourcePos pos) {
    auto n = std::make_unique<Node>();
    n->kind = kind;
    n->pos = pos;
    return n;
  }

  absl::Status parseStatement(Body* body) {
    const Token tag = cur();
    const std::string& name = tag.text;
    if (name == "if") return parseIf(body);
    if (name == "for") return parseFor(body);
    if (name == "set") return parseSet(body);
    if (name == "break" || name == "continue") {
      next();
      body->push_back(makeNode(name == "break" ? Node::Kind::kBreak : Node::Kind::kContinue, tag.pos));
      return expect(TokenKind::kBlockEnd, "'%}'");
    }
    if (name == "generation") {
      next();
      auto n = makeNode(Node::Kind::kGeneration, tag.pos);
      TANDEM_RETURN_IF_ERROR(expect(TokenKind::kBlockEnd, "'%}'"));
      TANDEM_RETURN_IF_ERROR(subparse({"endgeneration"}, &n->body));
      TANDEM_RETURN_IF_ERROR(endTag());
      body->push_back(std::move(n));
      return absl::OkStatus();
    }
    if (unsupportedTags().contains(name)) {
      return error(tag.pos, strCat("the \"", name, "\" block is not supported"));
    }
    if (name.starts_with("end") || name == "elif" || name == "else") {
      return error(tag.pos, strCat("unexpected {% ", name, " %}: no matching block is open"));
    }
    return error(tag.pos, strCat("unknown tag \"", name, "\""));
  }

  // Consumes the end tag's name and its %}.
  absl::Status endTag() {
    next();
    return expect(TokenKind::kBlockEnd, "'%}'");
  }

  absl::Status parseIf(Body* body) {
    auto n = makeNode(Node::Kind::kIf, cur().pos);
    next();
    while (true) {
      TANDEM_ASSIGN_OR_RETURN(ExprPtr cond, parseTupleOrExpr(/*with_condexpr=*/false));
      TANDEM_RETURN_IF_ERROR(expect(TokenKind::kBlockEnd, "'%}'"));
      Body branch;
      TANDEM_RETURN_IF_ERROR(subparse({"elif", "else", "endif"}, &branch));
      n->branches.emplace_back(std::move(cond), std::move(branch));
      if (isName("elif")) {
        next();
        continue;
      }
      if (isName("else")) {
        next();
        TANDEM_RETURN_IF_ERROR(expect(TokenKind::kBlockEnd, "'%}'"));
        TANDEM_RETURN_IF_ERROR(subparse({"endif"}, &n->else_body));
      }
      break;
    }
    TANDEM_RETURN_IF_ERROR(endTag());
    body->push_back(std::move(n));
    return absl::OkStatus();
  }

  // Loop targets: `x`, `k, v` or `(k, v)`.
  absl::Status parseTargets(std::vector<std::string>* targets) {
    const bool paren = isOp("(");
    if (paren) next();
    while (true) {
      TANDEM_ASSIGN_OR_RETURN(std::string t, expectName("a variable name"));
      targets->push_back(std::move(t));
      if (!isOp(",")) break;
      next();
    }
    if (paren) TANDEM_RETURN_IF_ERROR(expectOp(")"));
    return absl::OkStatus();
  }

  absl::Status parseFor(Body* body) {
    auto n = makeNode(Node::Kind::kFor, cur().pos);
    next();
    TANDEM_RETURN_IF_ERROR(parseTargets(&n->targets));
    if (!isName("in")) return error(cur().pos, strCat("expected 'in' in the for loop, got ", describe(cur())));
    next();
    TANDEM_ASSIGN_OR_RETURN(n->expr, parseTupleOrExpr(/*with_condexpr=*/false));
    if (isName("if")) {
      next();
      TANDEM_ASSIGN_OR_RETURN(n->cond, parseExpression());
    }
    if (isName("recursive")) return error(cur().pos, "recursive for loops are not supported");
    TANDEM_RETURN_IF_ERROR(expect(TokenKind::kBlockEnd, "'%}'"));
    TANDEM_RETURN_IF_ERROR(subparse({"endfor", "else"}, &n->body));
    if (isName("else")) {
      next();
      TANDEM_RETURN_IF_ERROR(expect(TokenKind::kBlockEnd, "'%}'"));
      TANDEM_RETURN_IF_ERROR(subparse({"endfor"}, &n->else_body));
    }
    TANDEM_RETURN_IF_ERROR(endTag());
    body->push_back(std::move(n));
    return absl::OkStatus();
  }

  absl::Status parseSet(Body* body) {
    const SourcePos pos = cur().pos;
    next();
    TANDEM_ASSIGN_OR_RETURN(std::string target, expectName("a variable name after 'set'"));
    std::string attr;
    if (isOp(".")) {
      next();
      TANDEM_ASSIGN_OR_RETURN(attr, expectName("an attribute name"));
    }
    if (isOp(",")) return error(cur().pos, "assigning several variables at once ('set a, b = ...') is not supported");
    if (isOp("=")) {
      next();
      auto n = makeNode(Node::Kind::kSet, pos);
      n->targets.push_back(std::move(target));
      n->attr = std::move(attr);
      TANDEM_ASSIGN_OR_RETURN(n->expr, parseTupleOrExpr(/*with_condexpr=*/true));
      TANDEM_RETURN_IF_ERROR(expect(TokenKind::kBlockEnd, "'%}'"));
      body->push_back(std::move(n));
      return absl::OkStatus();
    }
    if (!attr.empty()) return error(cur().pos, "a block set cannot assign a namespace attribute");
    if (isOp("|")) return error(cur().pos, "filters on a block set are not supported");
    auto n = makeNode(Node::Kind::kSetBlock, pos);
    n->targets.push_back(std::move(target));
    TANDEM_RETURN_IF_ERROR(expect(TokenKind::kBlockEnd, "'=' or '%}'"));
    TANDEM_RETURN_IF_ERROR(subparse({"endset"}, &n->body));
    TANDEM_RETURN_IF_ERROR(endTag());
    body->push_back(std::move(n));
    return absl::OkStatus();
  }

  // ---- expressions ----

  static ExprPtr makeExpr(Expr::Kind kind, SourcePos pos) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->pos = pos;
    return e;
  }

  // An expression, or a bare tuple `a, b` (if / for / set allow one).
  absl::StatusOr<ExprPtr> parseTupleOrExpr(bool with_condexpr) {
    const SourcePos pos = cur().pos;
    TANDEM_ASSIGN_OR_RETURN(ExprPtr first, with_condexpr ? parseExpression() : parseOr());
    if (!isOp(",")) return first;
    auto t = makeExpr(Expr::Kind::kTuple, pos);
    t->args.push_back(std::move(first));
    while (isOp(",")) {
      next();
      if (cur().kind == TokenKind::kBlockEnd || cur().kind == TokenKind::kVarEnd) break;
      TANDEM_ASSIGN_OR_RETURN(ExprPtr e, with_condexpr ? parseExpression() : parseOr());
      t->args.push_back(std::move(e));
    }
    return t;
  }

  absl::StatusOr<ExprPtr> parseExpression() {
    const SourcePos pos = cur().pos;
    TANDEM_ASSIGN_OR_RETURN(ExprPtr expr, parseOr());
    while (isName("if")) {
      next();
      auto c = makeExpr(Expr::Kind::kCondExpr, pos);
      TANDEM_ASSIGN_OR_RETURN(ExprPtr cond, parseOr());
      ExprPtr otherwise;
      if (isName("else")) {
        next();
        TANDEM_ASSIGN_OR_RETURN(otherwise, parseExpression());
      }
      c->args.push_back(std::move(expr));
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(otherwise));
      expr = std::move(c);
    }
    return expr;
  }

  absl::StatusOr<ExprPtr> parseOr() {
    TANDEM_ASSIGN_OR_RETURN(ExprPtr left, parseAnd());
    while (isName("or")) {
      auto e = makeExpr(Expr::Kind::kOr, cur().pos);
      next();
      TANDEM_ASSIGN_OR_RETURN(ExprPtr right, parseAnd());
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }

  absl::StatusOr<ExprPtr> parseAnd() {
    TANDEM_ASSIGN_OR_RETURN(ExprPtr left, parseNot());
    while (isName("and")) {
      auto e = makeExpr(Expr::Kind::kAnd, cur().pos);
      next();
      TANDEM_ASSIGN_OR_RETURN(ExprPtr right, parseNot());
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }

  absl::StatusOr<ExprPtr> parseNot() {
    if (isName("not")) {
      auto e = makeExpr(Expr::Kind::kNot, cur().pos);
      next();
      TANDEM_ASSIGN_OR_RETURN(ExprPtr inner, parseNot());
      e->args.push_back(std::move(inner));
      return e;
    }
    return parseCompare();
  }

  absl::StatusOr<ExprPtr> parseCompare() {
    const SourcePos pos = cur().pos;
    TANDEM_ASSIGN_OR_RETURN(ExprPtr left, parseMath1());
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().kind == TokenKind::kOp &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" || cur().text == ">" ||
           cur().text == ">=")) {
        op = cur().text;
        next();
      } else if (isName("in")) {
        op = "in";
        next();
      } else if (isName("not") && peek().kind == TokenKind::kName && peek().text == "in") {
        op = "notin";
        next();
        next();
      } else {
        break;
      }
      if (!cmp) {
        cmp = makeExpr(Expr::Kind::kCompare, pos);
        cmp->args.push_back(std::move(left));
      }
      TANDEM_ASSIGN_OR_RETURN(ExprPtr right, parseMath1());
      cmp->ops.push_back(std::move(op));
      cmp->args.push_back(std::move(right));
    }
    return cmp ? std::move(cmp) : std::move(left);
  }

  absl::StatusOr<ExprPtr> binary(ExprPtr left, std::string op, SourcePos pos, ExprPtr right) {
    auto e = makeExpr(Expr::Kind::kBinary, pos);
    e->name = std::move(op);
    e->args.push_back(std::move(left));
    e->args.push_back(std::move(right));
    return e;
  }

  absl::StatusOr<ExprPtr> parseMath1() {
    TANDEM_ASSIGN_OR_RETURN(ExprPtr left, parseConcat());
    while (isOp("+") || isOp("-")) {
      const Token op = cur();
      next();
      TANDEM_ASSIGN_OR_RETURN(ExprPtr right, parseConcat());
      TANDEM_ASSIGN_OR_RETURN(left, binary(std::move(left), op.text, op.pos, std::move(right)));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> parseConcat() {
    TANDEM_ASSIGN_OR_RETURN(ExprPtr left, parseMath2());
    while (isOp("~")) {
      const Token op = cur();
      next();
      TANDEM_ASSIGN_OR_RETURN(ExprPtr right, parseMath2());
      TANDEM_ASSIGN_OR_RETURN(left, binary(std::move(left), "~", op.pos, std::move(right)));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> parseMath2() {
    TANDEM_ASSIGN_OR_RETURN(ExprPtr left, parsePow());
    while (isOp("*") || isOp("/") || isOp("//") || isOp("%")) {
      const Token op = cur();
      next();
      TANDEM_ASSIGN_OR_RETURN(ExprPtr right, parsePow());
      TANDEM_ASSIGN_OR_RETURN(left, binary(std::move(left), op.text, op.pos, std::move(right)));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> parsePow() {
    TANDEM_ASSIGN_OR_RETURN(ExprPtr left, parseUnary(true));
    while (isOp("**")) {
      const Token op = cur();
      next();
      TANDEM_ASSIGN_OR_RETURN(ExprPtr right, parseUnary(true));
      TANDEM_ASSIGN_OR_RETURN(left, binary(std::move(left), "**", op.pos, std::move(right)));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> parseUnary(bool with_filter) {
    ExprPtr node;
    if (isOp("-") || isOp("+")) {
      auto e = makeExpr(isOp("-") ? Expr::Kind::kNeg : Expr::Kind::kPos, cur().pos);
      next();
      TANDEM_ASSIGN_OR_RETURN(ExprPtr inner, parseUnary(false));
      e->args.push_back(std::move(inner));
      node = std::move(e);
    } else {
      TANDEM_ASSIGN_OR_RETURN(node, parsePrimary());
    }
    TANDEM_ASSIGN_OR_RETURN(node, parsePostfix(std::move(node)));
    if (with_filter) return parseFilterExpr(std::move(node));
    return node;
  }

  absl::StatusOr<ExprPtr> parsePrimary() {
    const Token& t = cur();
    const SourcePos pos = t.pos;
    switch (t.kind) {
      case TokenKind::kName: {
        auto e = makeExpr(Expr::Kind::kLiteral, pos);
        if (t.text == "true" || t.text == "True") {
          e->value = Value(true);
        } else if (t.text == "false" || t.text == "False") {
          e->value = Value(false);
        } else if (t.text == "none" || t.text == "None") {
          e->value = Value(None{});
        } else {
          e->kind = Expr::Kind::kName;
          e->name = t.text;
        }
        next();
        return e;
      }
      case TokenKind::kString: {
        std::string s;
        while (cur().kind == TokenKind::kString) {  // adjacent literals concatenate
          s += cur().text;
          next();
        }
        auto e = makeExpr(Expr::Kind::kLiteral, pos);
        e->value = Value(std::move(s));
        return e;
      }
      case TokenKind::kInt:
      case TokenKind::kFloat: {
        auto e = makeExpr(Expr::Kind::kLiteral, pos);
        e->value = t.kind == TokenKind::kInt ? Value(t.int_value) : Value(t.float_value);
        next();
        return e;
      }
      case TokenKind::kOp:
        if (t.text == "(") return parseParen();
        if (t.text == "[") return parseList();
        if (t.text == "{") return parseDict();
        break;
      default:
        break;
    }
    return error(pos, strCat("unexpected ", describe(t), " where an expression was expected"));
  }

  absl::StatusOr<ExprPtr> parseParen() {
    const SourcePos pos = cur().pos;
    next();
    if (isOp(")")) {
      next();
      return makeExpr(Expr::Kind::kTuple, pos);
    }
    TANDEM_ASSIGN_OR_RETURN(ExprPtr first, parseExpression());
    if (isOp(")")) {
      next();
      return first;
    }
    auto t = makeExpr(Expr::Kind::kTuple, pos);
    t->args.push_back(std::move(first));
    while (isOp(",")) {
      next();
      if (isOp(")")) break;
      TANDEM_ASSIGN_OR_RETURN(ExprPtr e, parseExpression());
      t->args.push_back(std::move(e));
    }
    TANDEM_RETURN_IF_ERROR(expectOp(")"));
    return t;
  }

  absl::StatusOr<ExprPtr> parseList() {
    auto l = makeExpr(Expr::Kind::kList, cur().pos);
    next();
    while (!isOp("]")) {
      if (!l->args.empty()) {
        TANDEM_RETURN_IF_ERROR(expectOp(","));
        if (isOp("]")) break;
      }
      TANDEM_ASSIGN_OR_RETURN(ExprPtr e, parseExpression());
      l->args.push_back(std::move(e));
    }
    next();
    return l;
  }

  absl::StatusOr<ExprPtr> parseDict() {
    auto d = makeExpr(Expr::Kind::kDict, cur().pos);
    next();
    while (!isOp("}")) {
      if (!d->args.empty()) {
        TANDEM_RETURN_IF_ERROR(expectOp(","));
        if (isOp("}")) break;
      }
      TANDEM_ASSIGN_OR_RETURN(ExprPtr k, parseExpression());
      TANDEM_RETURN_IF_ERROR(expectOp(":"));
      TANDEM_ASSIGN_OR_RETURN(ExprPtr v, parseExpression());
      d->args.push_back(std::move(k));
      d->args.push_back(std::move(v));
    }
    next();
    return d;
  }

  absl::StatusOr<ExprPtr> parsePostfix(ExprPtr node) {
    while (true) {
      if (isOp(".")) {
        const SourcePos pos = cur().pos;
        next();
        if (cur().kind == TokenKind::kInt) {  // x.0 is x[0] in Jinja
          auto e = makeExpr(Expr::Kind::kGetItem, pos);
          auto idx = makeExpr(Expr::Kind::kLiteral, cur().pos);
          idx->value = Value(cur().int_value);
          next();
          e->args.push_back(std::move(node));
          e->args.push_back(std::move(idx));
          node = std::move(e);
          continue;
        }
        auto e = makeExpr(Expr::Kind::kGetAttr, pos);
        TANDEM_ASSIGN_OR_RETURN(e->name, expectName("an attribute name after '.'"));
        e->missing_in_dict = std::make_shared<const std::string>(strCat("'dict object' has no attribute '", e->name, "'"));
        e->args.push_back(std::move(node));
        node = std::move(e);
      } else if (isOp("[")) {
        TANDEM_ASSIGN_OR_RETURN(node, parseSubscript(std::move(node)));
      } else if (isOp("(")) {
        TANDEM_ASSIGN_OR_RETURN(node, parseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> parseSubscript(ExprPtr node) {
    const SourcePos pos = cur().pos;
    next();
    ExprPtr parts[3];
    int n = 0;
    bool slice = false;
    while (true) {
      if (!isOp(":") && !isOp("]")) {
        TANDEM_ASSIGN_OR_RETURN(parts[n], parseExpression());
      }
      if (isOp(":")) {
        if (n == 2) return error(cur().pos, "a slice has at most three parts");
        slice = true;
        ++n;
        next();
        continue;
      }
      break;
    }
    if (isOp(",")) return error(cur().pos, "tuple subscripts are not supported");
    TANDEM_RETURN_IF_ERROR(expectOp("]"));
    auto e = makeExpr(slice ? Expr::Kind::kSlice : Expr::Kind::kGetItem, pos);
    e->args.push_back(std::move(node));
    if (slice) {
      for (auto& p : parts) e->args.push_back(std::move(p));
    } else {
      if (!parts[0]) return error(pos, "empty subscript []");
      e->args.push_back(std::move(parts[0]));
    }
    return e;
  }

  // (args) of a call, filter or test into `e` (positional after e->args[0]).
  absl::Status parseArgs(Expr* e) {
    TANDEM_RETURN_IF_ERROR(expectOp("("));
    while (!isOp(")")) {
      if (!e->args.empty() && (e->args.size() > 1 || !e->kwargs.empty())) {
        TANDEM_RETURN_IF_ERROR(expectOp(","));
        if (isOp(")")) break;
      }
      if (isOp("*") || isOp("**")) return error(cur().pos, "*args and **kwargs in calls are not supported");
      if (cur().kind == TokenKind::kName && peek().kind == TokenKind::kOp && peek().text == "=") {
        std::string key = cur().text;
        next();
        next();
        TANDEM_ASSIGN_OR_RETURN(ExprPtr v, parseExpression());
        e->kwargs.emplace_back(std::move(key), std::move(v));
        continue;
      }
      if (!e->kwargs.empty()) return error(cur().pos, "a positional argument follows a keyword argument");
      TANDEM_ASSIGN_OR_RETURN(ExprPtr v, parseExpression());
      e->args.push_back(std::move(v));
    }
    next();
    return absl::OkStatus();
  }

  absl::StatusOr<ExprPtr> parseCall(ExprPtr node) {
    auto e = makeExpr(Expr::Kind::kCall, cur().pos);
    e->args.push_back(std::move(node));
    TANDEM_RETURN_IF_ERROR(parseArgs(e.get()));
    return e;
  }

  absl::StatusOr<ExprPtr> parseFilterExpr(ExprPtr node) {
    while (true) {
      if (isOp("|")) {
        next();
        auto e = makeExpr(Expr::Kind::kFilter, cur().pos);
        TANDEM_ASSIGN_OR_RETURN(e->name, expectName("a filter name after '|'"));
        e->args.push_back(std::move(node));
        if (isOp("(")) TANDEM_RETURN_IF_ERROR(parseArgs(e.get()));
        node = std::move(e);
      } else if (isName("is")) {
        next();
        auto e = makeExpr(Expr::Kind::kTest, cur().pos);
        if (isName("not")) {
          e->negated = true;
          next();
        }
        e->pos = cur().pos;
        TANDEM_ASSIGN_OR_RETURN(e->name, expectName("a test name after 'is'"));
        e->args.push_back(std::move(node));
        if (isOp("(")) {
          TANDEM_RETURN_IF_ERROR(parseArgs(e.get()));
        } else if ((cur().kind == TokenKind::kName || cur().kind == TokenKind::kString ||
                    cur().kind == TokenKind::kInt || cur().kind == TokenKind::kFloat || isOp("[") || isOp("{")) &&
                   !isName("else") && !isName("or") && !isName("and") && !isName("if")) {
          if (isName("is")) return error(cur().pos, "tests cannot be chained with 'is'");
          TANDEM_ASSIGN_OR_RETURN(ExprPtr arg, parsePrimary());
          TANDEM_ASSIGN_OR_RETURN(arg, parsePostfix(std::move(arg)));
          e->args.push_back(std::move(arg));
        }
        node = std::move(e);
      } else if (isOp("(")) {
        TANDEM_ASSIGN_OR_RETURN(node, parseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  std::vector<Token> toks_;
  std::string_view name_;
  size_t i_ = 0;
};

}  // namespace

absl::StatusOr<Body> parse(std::vector<Token> tokens, std::string_view name) {
  return Parser(std::move(tokens), name).run();
}

}  // namespace tandem::jinja
