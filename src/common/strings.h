#pragma once
// Small string helpers.
//
// Debian's Abseil is built with its own absl::string_view (not an alias of
// std::string_view), so absl::StrCat/StrSplit do not accept std::string_view.
// Tandem code uses std::string_view everywhere and these helpers instead;
// absl::Status messages are converted at the edge with toStd().

#include <charconv>
#include <concepts>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "absl/strings/string_view.h"

namespace tandem {

inline std::string_view toStd(absl::string_view s) { return std::string_view(s.data(), s.size()); }

namespace strings_internal {
inline void append(std::string& out, std::string_view s) { out.append(s); }
inline void append(std::string& out, const char* s) { out.append(s); }
inline void append(std::string& out, const std::string& s) { out.append(s); }
inline void append(std::string& out, absl::string_view s) { out.append(s.data(), s.size()); }
inline void append(std::string& out, char c) { out.push_back(c); }
inline void append(std::string& out, bool b) { out.append(b ? "true" : "false"); }
template <typename T>
  requires(std::is_integral_v<T> && !std::is_same_v<T, bool> && !std::is_same_v<T, char>)
void append(std::string& out, T v) {
  char buf[24];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, res.ptr);
}
template <typename T>
  requires std::is_floating_point_v<T>
void append(std::string& out, T v) {
  char buf[32];
  auto res = std::to_chars(buf, buf + sizeof(buf), static_cast<double>(v));
  out.append(buf, res.ptr);
}
}  // namespace strings_internal

// Concatenates strings, string views, characters, booleans and numbers
// (shortest round-trip form for floating point).
template <typename... Args>
std::string strCat(const Args&... args) {
  std::string out;
  (strings_internal::append(out, args), ...);
  return out;
}

// True when `s` is well-formed UTF-8 (no overlong forms, surrogates or
// code points above U+10FFFF). Used to reject non-UTF-8 request bodies.
bool isValidUtf8(std::string_view s);

// A size in bytes: digits, then optionally a unit: Ki, Mi, Gi, Ti (or KiB,
// MiB, GiB, TiB: powers of 1024), K, M, G, T (or KB, MB, GB, TB: powers of
// 1000) or B, as in "40Gi", "512MiB", "2G", "1048576". Nothing else (no
// sign, fraction or space); nullopt when it does not parse or overflows.
std::optional<int64_t> parseByteSize(std::string_view s);

// `bytes` as lower-case hex digits, two per byte.
std::string hexEncode(std::string_view bytes);
// The value of one hex digit (either case), or -1 for any other character.
int hexDigitValue(char c);

}  // namespace tandem
