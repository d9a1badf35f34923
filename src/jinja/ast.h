#pragma once
// The parsed template: statements (Node) and expressions (Expr). Built once
// by the parser, read-only afterwards; the renderer walks it per render.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "src/jinja/lexer.h"
#include "src/jinja/value.h"

namespace tandem::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,   // value
    kName,      // name
    kList,      // args: the items
    kTuple,     // args: the items (evaluated as a list)
    kDict,      // args: key, value, key, value, ...
    kGetAttr,   // args[0].name
    kGetItem,   // args[0][args[1]]
    kSlice,     // args[0][args[1]:args[2]:args[3]], absent parts null
    kCall,      // args[0](args[1..], kwargs)
    kFilter,    // args[0] | name(args[1..], kwargs)
    kTest,      // args[0] is [not] name(args[1..]); negated
    kNot,       // not args[0]
    kNeg,       // -args[0]
    kPos,       // +args[0]
    kBinary,    // args[0] op args[1]: + - * / // % ** ~
    kCompare,   // args[0] ops[0] args[1] ops[1] args[2]...: == != < <= > >= in notin
    kAnd,       // args[0] and args[1]
    kOr,        // args[0] or args[1]
    kCondExpr,  // args[0] if args[1] else args[2] (args[2] null: undefined)
  };
  Kind kind;
  SourcePos pos;
  std::string name;  // variable, attribute, filter, test or operator
  Value value;       // kLiteral
  bool negated = false;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // kCompare
  // kGetAttr: the message of the Undefined that a dict without attribute
  // `name` gives, made once at parse time.
  std::shared_ptr<const std::string> missing_in_dict;
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // branches: (cond, body)..., else_body
    kFor,       // for targets in expr [if cond]: body [else: else_body]
    kSet,       // set targets[0] = expr, or set targets[0].attr = expr
    kSetBlock,  // set targets[0] %} body {% endset
    kBreak,
    kContinue,
    kGeneration,  // {% generation %} body {% endgeneration %}: renders body
  };
  Kind kind;
  SourcePos pos;
  std::string text;
  ExprPtr expr;
  ExprPtr cond;  // kFor's filter
  std::vector<std::string> targets;
  std::string attr;  // kSet on a namespace attribute
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
};

}  // namespace tandem::jinja
