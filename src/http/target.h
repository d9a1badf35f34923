#pragma once
// Decoding an HTTP request target ("/v1/x%20y?model=a&n=3") into the path
// and query parameters a Request carries, the way cpprestsdk's web::uri does
// it: %XX escapes decoded (a '%' without two hex digits is an error; '+'
// stays '+'), the query split at '&', pairs without '=' dropped, a later
// duplicate winning. An absolute-form target ("http://host/path") is reduced
// to its path. Pure.

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "src/http/headers.h"

namespace tandem::http {

// InvalidArgument("invalid request URI: ...") for a malformed escape.
absl::Status decodeTarget(std::string_view target, std::string& path, QueryParams& query);

}  // namespace tandem::http
