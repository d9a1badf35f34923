#pragma once
// Template source -> tokens, with Jinja2's whitespace rules as Hugging Face
// configures them (trim_blocks and lstrip_blocks on):
//   {%- / {{- / {#-   strip all whitespace before the tag;
//   -%} / -}} / -#}   strip all whitespace after it;
//   %} and #}         eat one newline right after (trim_blocks), unless +%};
//   {% and {#         alone on their line after spaces/tabs: those are
//                     dropped (lstrip_blocks), unless {%+.
// One trailing newline of the source is dropped (keep_trailing_newline off)
// and \r\n becomes \n, as Jinja2 does. Comments produce no tokens.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "src/common/status.h"

namespace tandem::jinja {

struct SourcePos {
  int line = 1;
  int col = 1;
};

enum class TokenKind {
  kText,        // template data, `text` already whitespace-controlled
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,        // identifiers and keywords (if, in, not, true, ...)
  kString,      // `text` is the unescaped value
  kInt,
  kFloat,
  kOp,          // `text` is the operator: + - * / // % ** ~ == != < <= > >= = . : | , ( ) [ ] { }
  kEof,
};

struct Token {
  TokenKind kind = TokenKind::kEof;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0;
  SourcePos pos;
};

// Errors (an unterminated tag, comment or string, a character no token
// starts with) name `name:line:col`.
[[nodiscard]] absl::StatusOr<std::vector<Token>> tokenize(std::string_view source, std::string_view name);

}  // namespace tandem::jinja
