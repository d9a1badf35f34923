#pragma once
// Header and query maps shared by the server and the client.
//
// Header names compare case-insensitively (RFC 9110); repeated headers arrive
// joined with ", " (that is how cpprestsdk hands them over). Values are kept
// as sent. Query parameters are percent-decoded and case-sensitive.

#include <algorithm>
#include <cctype>
#include <map>
#include <string>
#include <string_view>

namespace tandem::http {

// Orders ASCII strings ignoring case; transparent so lookups take string_view.
struct CaseInsensitiveLess {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const {
    return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
      return std::tolower(static_cast<unsigned char>(x)) < std::tolower(static_cast<unsigned char>(y));
    });
  }
};

using Headers = std::map<std::string, std::string, CaseInsensitiveLess>;
using QueryParams = std::map<std::string, std::string, std::less<>>;

}  // namespace tandem::http
