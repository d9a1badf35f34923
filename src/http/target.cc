#include "src/http/target.h"

#include "src/common/strings.h"

namespace tandem::http {

namespace {

absl::Status percentDecode(std::string_view in, std::string& out) {
  out.clear();
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out += in[i];
      continue;
    }
    int hi = i + 2 < in.size() ? hexDigitValue(in[i + 1]) : -1;
    int lo = i + 2 < in.size() ? hexDigitValue(in[i + 2]) : -1;
    if (hi < 0 || lo < 0) {
      return absl::InvalidArgumentError("invalid request URI: two hexadecimal digits must follow '%'");
    }
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status decodeTarget(std::string_view target, std::string& path, QueryParams& query) {
  if (size_t scheme = target.find("://"); !target.starts_with("/") && scheme != std::string_view::npos) {
    size_t slash = target.find('/', scheme + 3);
    target = slash == std::string_view::npos ? std::string_view("/") : target.substr(slash);
  }
  if (size_t hash = target.find('#'); hash != std::string_view::npos) target = target.substr(0, hash);
  size_t mark = target.find('?');
  std::string_view rawPath = target.substr(0, mark);
  std::string_view rawQuery = mark == std::string_view::npos ? std::string_view() : target.substr(mark + 1);
  if (absl::Status s = percentDecode(rawPath, path); !s.ok()) return s;
  query.clear();
  while (!rawQuery.empty()) {
    size_t amp = rawQuery.find('&');
    std::string_view pair = rawQuery.substr(0, amp);
    rawQuery = amp == std::string_view::npos ? std::string_view() : rawQuery.substr(amp + 1);
    size_t eq = pair.find('=');
    if (eq == std::string_view::npos) continue;
    std::string name, value;
    if (absl::Status s = percentDecode(pair.substr(0, eq), name); !s.ok()) return s;
    if (absl::Status s = percentDecode(pair.substr(eq + 1), value); !s.ok()) return s;
    query[std::move(name)] = std::move(value);
  }
  return absl::OkStatus();
}

}  // namespace tandem::http
