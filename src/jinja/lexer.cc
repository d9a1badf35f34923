#include "src/jinja/lexer.h"

#include <cctype>
#include <charconv>

#include "src/common/strings.h"

namespace tandem::jinja {
namespace {

bool isSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// Jinja2 normalises newlines and drops one trailing newline.
std::string normalize(std::string_view source) {
  std::string s;
  s.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      s.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      s.push_back(source[i]);
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

void appendUtf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

class Lexer {
 public:
  Lexer(std::string source, std::string_view name) : src_(std::move(source)), name_(name) {}

  absl::StatusOr<std::vector<Token>> run() {
    bool line_starting = true;  // Jinja2: the last match ended a line
    while (pos_ < src_.size()) {
      size_t start = findTagStart(pos_);
      std::string text = src_.substr(pos_, start - pos_);
      if (start == src_.size()) {
        emitText(std::move(text), posAt(pos_));
        pos_ = start;
        break;
      }
      const char kind = src_[start + 1];  // '{', '%' or '#'
      const char sign = start + 2 < src_.size() ? src_[start + 2] : '\0';
      if (sign == '-') {
        while (!text.empty() && isSpace(text.back())) text.pop_back();
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: only spaces/tabs between the line start and the tag.
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if (l_pos > 0 || line_starting) {
          bool only_ws = l_pos < text.size();
          for (size_t i = l_pos; i < text.size(); ++i) only_ws = only_ws && isSpace(text[i]);
          if (only_ws) text.resize(l_pos);
        }
      }
      emitText(std::move(text), posAt(pos_));
      pos_ = start + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      if (kind == '#') {
        TANDEM_RETURN_IF_ERROR(skipComment(start));
      } else {
        TANDEM_RETURN_IF_ERROR(lexTag(kind == '{', start));
      }
      line_starting = pos_ > 0 && src_[pos_ - 1] == '\n';
    }
    Token eof;
    eof.kind = TokenKind::kEof;
    eof.pos = posAt(src_.size());
    tokens_.push_back(std::move(eof));
    return std::move(tokens_);
  }

 private:
  size_t findTagStart(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return src_.size();
  }

  SourcePos posAt(size_t offset) {
    // Positions are mostly asked for in increasing order: advance a cursor.
    if (offset < cursor_) {
      cursor_ = 0;
      cursor_pos_ = SourcePos{};
    }
    for (; cursor_ < offset && cursor_ < src_.size(); ++cursor_) {
      if (src_[cursor_] == '\n') {
        ++cursor_pos_.line;
        cursor_pos_.col = 1;
      } else {
        ++cursor_pos_.col;
      }
    }
    return cursor_pos_;
  }

  void emitText(std::string text, SourcePos pos) {
    if (text.empty()) return;
    Token t;
    t.kind = TokenKind::kText;
    t.text = std::move(text);
    t.pos = pos;
    tokens_.push_back(std::move(t));
  }

  void push(TokenKind kind, std::string text, size_t at) {
    Token t;
    t.kind = kind;
    t.text = std::move(text);
    t.pos = posAt(at);
    tokens_.push_back(std::move(t));
  }

  absl::Status error(size_t at, std::string_view what) {
    const SourcePos p = posAt(at);
    return absl::InvalidArgumentError(strCat(name_, ":", p.line, ":", p.col, ": ", what));
  }

  // After an end marker: "-" strips all following whitespace; a block or
  // comment end without "+" eats one newline (trim_blocks).
  void afterEnd(char sign, bool block_or_comment) {
    if (sign == '-') {
      while (pos_ < src_.size() && isSpace(src_[pos_])) ++pos_;
    } else if (sign != '+' && block_or_comment && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
  }

  absl::Status skipComment(size_t start) {
    const size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) return error(start, "unterminated comment: no #}");
    const char sign = end > pos_ ? src_[end - 1] : '\0';
    pos_ = end + 2;
    afterEnd(sign == '-' || sign == '+' ? sign : '\0', true);
    return absl::OkStatus();
  }

  // The tokens of one {{ ... }} or {% ... %}, up to and including its end.
  absl::Status lexTag(bool variable, size_t start) {
    push(variable ? TokenKind::kVarBegin : TokenKind::kBlockBegin, variable ? "{{" : "{%", start);
    const char close = variable ? '}' : '%';
    int depth = 0;  // open brackets: "}}" inside {{ {'a': {}} }} is not the end
    while (true) {
      while (pos_ < src_.size() && isSpace(src_[pos_])) ++pos_;
      if (pos_ >= src_.size()) {
        return error(start, variable ? "unterminated expression: no }}" : "unterminated tag: no %}");
      }
      const char c = src_[pos_];
      auto at = [&](size_t i, char ch) { return i < src_.size() && src_[i] == ch; };
      if (depth == 0 || !variable) {
        if ((c == '-' || c == '+') && at(pos_ + 1, close) && at(pos_ + 2, '}')) {
          push(variable ? TokenKind::kVarEnd : TokenKind::kBlockEnd, "", pos_);
          pos_ += 3;
          afterEnd(c, !variable);
          return absl::OkStatus();
        }
        if (c == close && at(pos_ + 1, '}')) {
          push(variable ? TokenKind::kVarEnd : TokenKind::kBlockEnd, "", pos_);
          pos_ += 2;
          afterEnd('\0', !variable);
          return absl::OkStatus();
        }
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos_;
        while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        push(TokenKind::kName, src_.substr(pos_, e - pos_), pos_);
        pos_ = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        TANDEM_RETURN_IF_ERROR(lexNumber());
      } else if (c == '\'' || c == '"') {
        TANDEM_RETURN_IF_ERROR(lexString(c));
      } else {
        static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op(1, c);
        for (std::string_view two : kTwo) {
          if (src_.compare(pos_, 2, two) == 0) op = std::string(two);
        }
        if (op.size() == 1 && std::string_view("+-*/%~=<>.:|,()[]{}").find(c) == std::string_view::npos) {
          return error(pos_, strCat("unexpected character '", std::string(1, c), "'"));
        }
        if (c == '(' || c == '[' || c == '{') ++depth;
        if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
        push(TokenKind::kOp, op, pos_);
        pos_ += op.size();
      }
    }
  }

  absl::Status lexNumber() {
    const size_t start = pos_;
    size_t e = pos_;
    auto digits = [&] {
      while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
    };
    digits();
    bool is_float = false;
    if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      is_float = true;
      ++e;
      digits();
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t f = e + 1;
      if (f < src_.size() && (src_[f] == '+' || src_[f] == '-')) ++f;
      if (f < src_.size() && std::isdigit(static_cast<unsigned char>(src_[f]))) {
        is_float = true;
        e = f;
        digits();
      }
    }
    std::string text;
    for (size_t i = start; i < e; ++i) {
      if (src_[i] != '_') text.push_back(src_[i]);
    }
    Token t;
    t.pos = posAt(start);
    t.text = text;
    if (is_float) {
      t.kind = TokenKind::kFloat;
      t.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      t.kind = TokenKind::kInt;
      auto r = std::from_chars(text.data(), text.data() + text.size(), t.int_value);
      if (r.ec != std::errc()) return error(start, strCat("integer ", text, " is out of range"));
    }
    tokens_.push_back(std::move(t));
    pos_ = e;
    return absl::OkStatus();
  }

  // A quoted string with Python's escapes (\n, \t, \\, \', \", \xNN, \uNNNN).
  absl::Status lexString(char quote) {
    const size_t start = pos_;
    std::string value;
    size_t i = pos_ + 1;
    for (; i < src_.size() && src_[i] != quote; ++i) {
      if (src_[i] != '\\' || i + 1 >= src_.size()) {
        value.push_back(src_[i]);
        continue;
      }
      const char e = src_[++i];
      auto hex = [&](int n) -> int64_t {
        if (i + static_cast<size_t>(n) >= src_.size()) return -1;
        uint32_t v = 0;
        for (int k = 1; k <= n; ++k) {
          const char h = src_[i + static_cast<size_t>(k)];
          if (!std::isxdigit(static_cast<unsigned char>(h))) return -1;
          v = v * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0'
                                                                                          : std::tolower(h) - 'a' + 10);
        }
        i += static_cast<size_t>(n);
        return v;
      };
      switch (e) {
        case 'n': value.push_back('\n'); break;
        case 't': value.push_back('\t'); break;
        case 'r': value.push_back('\r'); break;
        case 'b': value.push_back('\b'); break;
        case 'f': value.push_back('\f'); break;
        case 'v': value.push_back('\v'); break;
        case 'a': value.push_back('\a'); break;
        case '0': value.push_back('\0'); break;
        case '\\': value.push_back('\\'); break;
        case '\'': value.push_back('\''); break;
        case '"': value.push_back('"'); break;
        case '\n': break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          const int64_t cp = hex(e == 'x' ? 2 : e == 'u' ? 4 : 8);
          if (cp < 0) return error(i - 1, strCat("bad \\", std::string(1, e), " escape in string"));
          appendUtf8(value, static_cast<uint32_t>(cp));
          break;
        }
        default:
          value.push_back('\\');
          value.push_back(e);
      }
    }
    if (i >= src_.size()) return error(start, "unterminated string");
    push(TokenKind::kString, std::move(value), start);
    pos_ = i + 1;
    return absl::OkStatus();
  }

  std::string src_;
  std::string_view name_;
  size_t pos_ = 0;
  size_t cursor_ = 0;
  SourcePos cursor_pos_;
  std::vector<Token> tokens_;
};

}  // namespace

absl::StatusOr<std::vector<Token>> tokenize(std::string_view source, std::string_view name) {
  return Lexer(normalize(source), name).run();
}

}  // namespace tandem::jinja
