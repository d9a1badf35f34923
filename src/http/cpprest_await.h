#pragma once
// Internal to code built directly on cpprestsdk (src/http, src/k8s's
// transport): turning pplx tasks and their exceptions into absl::Status, and
// reading a streamed body.
// Include only from .cc files; it pulls in cpprestsdk.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <cpprest/http_client.h>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "src/common/clock.h"
#include "src/common/status.h"
#include "src/common/strings.h"

namespace tandem::http::cpprest {

// After a timeout the request is cancelled and its task chain given this
// long to wind down.
inline constexpr Duration kCancelWait = std::chrono::seconds(5);

// cpprestsdk's timeouts are in microseconds and 0 means "none".
inline std::chrono::microseconds toMicros(Duration d) {
  return std::max(std::chrono::microseconds(1), std::chrono::duration_cast<std::chrono::microseconds>(d));
}

// The Status for an exception from cpprestsdk (or anything else), prefixed with `what`.
inline absl::Status statusFromException(std::exception_ptr error, std::string_view what) {
  try {
    std::rethrow_exception(error);
  } catch (const web::http::http_exception& e) {
    if (e.error_code() == std::errc::timed_out) return absl::DeadlineExceededError(strCat(what, ": timed out"));
    if (e.error_code() == std::errc::operation_canceled) return absl::CancelledError(strCat(what, ": cancelled"));
    return absl::UnavailableError(strCat(what, ": ", e.what()));
  } catch (const pplx::task_canceled&) {
    return absl::CancelledError(strCat(what, ": cancelled"));
  } catch (const web::uri_exception& e) {
    return absl::InvalidArgumentError(strCat(what, ": invalid URL: ", e.what()));
  } catch (const std::exception& e) {
    return absl::UnavailableError(strCat(what, ": ", e.what()));
  } catch (...) {
    return absl::InternalError(strCat(what, ": unknown exception"));
  }
}

// Result of an asynchronous call, handed from a pplx thread to the caller.
template <typename T>
struct Pending {
  absl::Notification done;
  absl::StatusOr<T> value = absl::UnknownError("not finished");
};

// Runs `task` to completion within `timeout`, cancelling through `cts` when
// it takes longer. Never throws.
template <typename T>
absl::StatusOr<T> await(pplx::task<T> task, pplx::cancellation_token_source cts, Duration timeout,
                        std::string_view what) {
  auto pending = std::make_shared<Pending<T>>();
  std::string name(what);
  task.then([pending, name](pplx::task<T> t) {
    try {
      pending->value = t.get();
    } catch (...) {
      pending->value = statusFromException(std::current_exception(), name);
    }
    pending->done.Notify();
  });
  if (pending->done.WaitForNotificationWithTimeout(absl::FromChrono(timeout))) return std::move(pending->value);
  cts.cancel();
  pending->done.WaitForNotificationWithTimeout(absl::FromChrono(kCancelWait));
  return absl::DeadlineExceededError(
      strCat(what, ": no response within ", absl::FormatDuration(absl::FromChrono(timeout))));
}

// Reads the next piece of a streamed response body into `chunk`: what is
// already there (up to chunk.size()), or else waits for one byte. getn(n)
// completes only when n bytes are there or the body ended, and cpprestsdk's
// client does not flush partial data to the reader, so asking for more than
// is there would stall a stream. Returns the bytes read, 0 at the end of the
// body; throws what cpprestsdk throws (callers map it with
// statusFromException).
inline size_t readSome(Concurrency::streams::streambuf<uint8_t>& body, std::vector<uint8_t>& chunk) {
  const size_t available = body.in_avail();
  const size_t want = available > 0 ? std::min(available, chunk.size()) : 1;
  return body.getn(chunk.data(), want).get();
}

}  // namespace tandem::http::cpprest
