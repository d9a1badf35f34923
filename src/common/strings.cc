#include "src/common/strings.h"

#include <climits>

namespace tandem {

bool isValidUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  while (p < end) {
    unsigned char c = *p;
    if (c < 0x80) {
      ++p;
      continue;
    }
    int len;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;  // stray continuation byte or 0xF8..0xFF
    }
    if (end - p < len) return false;
    for (int i = 1; i < len; ++i) {
      if ((p[i] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i] & 0x3F);
    }
    static constexpr uint32_t kMinForLen[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMinForLen[len]) return false;              // overlong
    if (cp > 0x10FFFF) return false;                     // beyond Unicode
    if (cp >= 0xD800 && cp <= 0xDFFF) return false;      // UTF-16 surrogate
    p += len;
  }
  return true;
}

std::string hexEncode(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

int hexDigitValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::optional<int64_t> parseByteSize(std::string_view s) {
  size_t digits = 0;
  while (digits < s.size() && s[digits] >= '0' && s[digits] <= '9') ++digits;
  if (digits == 0) return std::nullopt;
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + digits, value);
  if (ec != std::errc() || end != s.data() + digits) return std::nullopt;
  const std::string_view unit = s.substr(digits);
  struct Unit {
    std::string_view name;
    int64_t factor;
  };
  static constexpr Unit kUnits[] = {
      {"", 1},
      {"B", 1},
      {"Ki", int64_t{1} << 10},
      {"KiB", int64_t{1} << 10},
      {"Mi", int64_t{1} << 20},
      {"MiB", int64_t{1} << 20},
      {"Gi", int64_t{1} << 30},
      {"GiB", int64_t{1} << 30},
      {"Ti", int64_t{1} << 40},
      {"TiB", int64_t{1} << 40},
      {"K", 1000},
      {"KB", 1000},
      {"M", 1000 * 1000},
      {"MB", 1000 * 1000},
      {"G", int64_t{1000} * 1000 * 1000},
      {"GB", int64_t{1000} * 1000 * 1000},
      {"T", int64_t{1000} * 1000 * 1000 * 1000},
      {"TB", int64_t{1000} * 1000 * 1000 * 1000},
  };
  for (const Unit& u : kUnits) {
    if (unit != u.name) continue;
    if (value > INT64_MAX / u.factor) return std::nullopt;
    return value * u.factor;
  }
  return std::nullopt;
}

}  // namespace tandem
