#pragma once
// Tokens -> statements, with Jinja2's grammar and operator precedence
// (lowest first): `a if c else b`, or, and, not, comparisons and `in`,
// + -, ~, * / // %, **, unary - +, then primary with postfix (.attr,
// [i], [a:b:c], (args)), filters (| f(args)) and tests (is [not] t(args)).
//
// Statements: if/elif/else, for (with `if` filter, tuple targets, else),
// set (name, namespace attribute, block set), break/continue,
// generation. Every other tag is refused by name and position
// ("chat_template:3:4: the \"macro\" block is not supported").

#include <string_view>
#include <vector>

#include "src/common/status.h"
#include "src/jinja/ast.h"
#include "src/jinja/lexer.h"

namespace tandem::jinja {

[[nodiscard]] absl::StatusOr<Body> parse(std::vector<Token> tokens, std::string_view name);

}  // namespace tandem::jinja
