#include "src/http/error.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace tandem::http {
namespace {

TEST(ErrorBodyTest, HasOpenAiShape) {
  auto body = nlohmann::json::parse(errorBody(400, kInvalidRequestError, "bad \"thing\""));
  EXPECT_EQ(body["error"]["message"], "bad \"thing\"");
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_EQ(body["error"]["code"], 400);
  EXPECT_EQ(body.size(), 1u);
}

TEST(ErrorBodyTest, InvalidUtf8InMessageIsReplacedNotThrown) {
  std::string body;
  ASSERT_NO_THROW(body = errorBody(400, kInvalidRequestError, "last read: '\xff\xfe'"));
  auto parsed = nlohmann::json::parse(body);
  EXPECT_NE(parsed["error"]["message"].get<std::string>().find("\xEF\xBF\xBD"), std::string::npos);
}

TEST(ErrorTypeTest, FollowsStatus) {
  EXPECT_EQ(errorTypeForStatus(400), kInvalidRequestError);
  EXPECT_EQ(errorTypeForStatus(404), kInvalidRequestError);
  EXPECT_EQ(errorTypeForStatus(413), kInvalidRequestError);
  EXPECT_EQ(errorTypeForStatus(429), kRateLimitError);
  EXPECT_EQ(errorTypeForStatus(500), kServerError);
  EXPECT_EQ(errorTypeForStatus(503), kUnavailableError);
  EXPECT_EQ(errorTypeForStatus(504), kTimeoutError);
}

TEST(StatusMappingTest, StatusToHttp) {
  EXPECT_EQ(httpStatusForStatus(absl::OkStatus()), 200);
  EXPECT_EQ(httpStatusForStatus(absl::InvalidArgumentError("x")), 400);
  EXPECT_EQ(httpStatusForStatus(absl::NotFoundError("x")), 404);
  EXPECT_EQ(httpStatusForStatus(absl::ResourceExhaustedError("x")), 429);
  EXPECT_EQ(httpStatusForStatus(absl::UnavailableError("x")), 503);
  EXPECT_EQ(httpStatusForStatus(absl::DeadlineExceededError("x")), 504);
  EXPECT_EQ(httpStatusForStatus(absl::InternalError("x")), 500);
  EXPECT_EQ(httpStatusForStatus(absl::UnknownError("x")), 500);
}

TEST(StatusMappingTest, HttpToStatusRoundTripsTheCommonCodes) {
  for (auto code :
       {absl::StatusCode::kInvalidArgument, absl::StatusCode::kNotFound, absl::StatusCode::kResourceExhausted,
        absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded, absl::StatusCode::kCancelled}) {
    EXPECT_EQ(statusCodeForHttpStatus(httpStatusForStatus(absl::Status(code, "x"))), code)
        << absl::StatusCodeToString(code);
  }
  EXPECT_EQ(statusCodeForHttpStatus(204), absl::StatusCode::kOk);
  EXPECT_EQ(statusCodeForHttpStatus(500), absl::StatusCode::kInternal);
  EXPECT_EQ(statusCodeForHttpStatus(418), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace tandem::http
