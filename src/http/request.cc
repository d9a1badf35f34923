// CallContext and Request (server.h): what a handler sees of one call.

#include <nlohmann/json.hpp>

#include "absl/time/time.h"
#include "src/common/log.h"
#include "src/common/strings.h"
#include "src/http/error.h"
#include "src/http/server.h"

namespace tandem::http {

std::string_view cancelReasonName(CancelReason reason) {
  switch (reason) {
    case CancelReason::kNone:
      return "none";
    case CancelReason::kDeadline:
      return "deadline";
    case CancelReason::kClientDisconnected:
      return "client_disconnected";
    case CancelReason::kShutdown:
      return "shutdown";
  }
  return "unknown";
}

void CallContext::onCancel(std::function<void()> callback) {
  {
    absl::MutexLock lock(&mu_);
    if (!cancelled()) {
      callbacks_.push_back(std::move(callback));
      return;
    }
  }
  callback();
}

bool CallContext::waitCancelled(Duration timeout) const {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(this, &CallContext::cancelled), absl::FromChrono(timeout));
  return cancelled();
}

bool CallContext::cancel(CancelReason reason) {
  std::vector<std::function<void()>> callbacks;
  {
    absl::MutexLock lock(&mu_);
    if (cancelled()) return false;
    reason_.store(reason, std::memory_order_release);
    callbacks.swap(callbacks_);
  }
  for (auto& callback : callbacks) {
    try {
      callback();
    } catch (const std::exception& e) {
      Logger("http").error("onCancel callback threw", {{"what", e.what()}});
    } catch (...) {
      Logger("http").error("onCancel callback threw a non-std exception");
    }
  }
  return true;
}

Request::Request(std::string method, std::string path, QueryParams query, Headers headers, std::string body,
                 std::shared_ptr<CallContext> context)
    : method_(std::move(method)),
      path_(std::move(path)),
      query_(std::move(query)),
      headers_(std::move(headers)),
      body_(std::move(body)),
      context_(std::move(context)) {}

std::optional<std::string> Request::query(std::string_view name) const {
  auto it = query_.find(name);
  if (it == query_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> Request::header(std::string_view name) const {
  auto it = headers_.find(name);
  if (it == headers_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<nlohmann::json> Request::json() const {
  // nlohmann's lexer takes a NUL byte for the end of the input (the end of
  // a C string) and ignores whatever follows it, so `{"a":1}\0junk` would
  // parse. JSON text never holds a NUL (RFC 8259): refuse it here.
  if (size_t nul = body_.find('\0'); nul != std::string::npos) {
    return absl::InvalidArgumentError(
        invalidJsonMessage(strCat("a NUL byte at byte ", nul + 1, "; JSON text cannot contain one")));
  }
  try {
    return nlohmann::json::parse(body_);
  } catch (const nlohmann::json::exception& e) {
    // Bad syntax (parse_error), and valid syntax the parser still refuses:
    // a number beyond a double's range (out_of_range.406, "number overflow
    // parsing '1e400'").
    return absl::InvalidArgumentError(invalidJsonMessage(e.what()));
  }
}

}  // namespace tandem::http
