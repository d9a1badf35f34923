#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "src/common/strings.h"
#include "src/k8s/errors.h"

namespace tandem::k8s {
namespace {

using ::testing::HasSubstr;

TEST(K8sErrorsTest, ParsesInvalidWithCauses) {
  std::string body = R"({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
    "message":"InferencePool.serving.tandem.dev \"p\" is invalid: spec.replicas: Invalid value: -1",
    "reason":"Invalid","details":{"name":"p","group":"serving.tandem.dev","kind":"InferencePool",
    "causes":[{"reason":"FieldValueInvalid","message":"Invalid value: -1","field":"spec.replicas"}]},"code":422})";
  absl::Status s = statusFromResponse(422, body, "POST /apis/x");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(isInvalid(s));
  EXPECT_THAT(std::string(toStd(s.message())), HasSubstr("POST /apis/x: HTTP 422 Invalid: InferencePool"));
  auto e = k8sError(s);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code, 422);
  EXPECT_EQ(e->name, "p");
  EXPECT_EQ(e->group, "serving.tandem.dev");
  EXPECT_EQ(e->kind, "InferencePool");
  ASSERT_EQ(e->causes.size(), 1u);
  EXPECT_EQ(e->causes[0].field, "spec.replicas");
  EXPECT_EQ(e->causes[0].reason, "FieldValueInvalid");
}

TEST(K8sErrorsTest, ReasonsMapToCanonicalCodes) {
  struct Case {
    int http;
    const char* reason;
    K8sErrorReason expected;
    absl::StatusCode code;
  };
  std::vector<Case> cases = {
      {404, "NotFound", K8sErrorReason::kNotFound, absl::StatusCode::kNotFound},
      {409, "AlreadyExists", K8sErrorReason::kAlreadyExists, absl::StatusCode::kAlreadyExists},
      {409, "Conflict", K8sErrorReason::kConflict, absl::StatusCode::kAborted},
      {410, "Expired", K8sErrorReason::kExpired, absl::StatusCode::kOutOfRange},
      {410, "Gone", K8sErrorReason::kGone, absl::StatusCode::kOutOfRange},
      {403, "Forbidden", K8sErrorReason::kForbidden, absl::StatusCode::kPermissionDenied},
      {401, "Unauthorized", K8sErrorReason::kUnauthorized, absl::StatusCode::kUnauthenticated},
      {429, "TooManyRequests", K8sErrorReason::kTooManyRequests, absl::StatusCode::kResourceExhausted},
      {504, "ServerTimeout", K8sErrorReason::kServerTimeout, absl::StatusCode::kDeadlineExceeded},
      {500, "InternalError", K8sErrorReason::kInternalError, absl::StatusCode::kInternal},
      {415, "UnsupportedMediaType", K8sErrorReason::kUnsupportedMediaType, absl::StatusCode::kInvalidArgument},
      {405, "MethodNotAllowed", K8sErrorReason::kMethodNotAllowed, absl::StatusCode::kUnimplemented},
      {400, "BadRequest", K8sErrorReason::kBadRequest, absl::StatusCode::kInvalidArgument},
      {503, "ServiceUnavailable", K8sErrorReason::kServiceUnavailable, absl::StatusCode::kUnavailable},
  };
  for (const Case& c : cases) {
    nlohmann::json body = {
        {"kind", "Status"}, {"status", "Failure"}, {"reason", c.reason}, {"code", c.http}, {"message", "m"}};
    absl::Status s = statusFromResponse(c.http, body.dump(), "");
    EXPECT_EQ(k8sReason(s), c.expected) << c.reason;
    EXPECT_EQ(s.code(), c.code) << c.reason;
    EXPECT_EQ(k8sErrorReasonName(c.expected), c.reason);
  }
  EXPECT_TRUE(isResourceExpired(statusFromResponse(410, R"({"kind":"Status","reason":"Expired","code":410})", "")));
  EXPECT_TRUE(isConflict(statusFromResponse(409, R"({"kind":"Status","reason":"Conflict","code":409})", "")));
}

TEST(K8sErrorsTest, MissingReasonDerivedFromCode) {
  absl::Status s = statusFromResponse(409, R"({"kind":"Status","code":409,"message":"x"})", "");
  EXPECT_TRUE(isConflict(s));
  s = statusFromResponse(404, R"({"kind":"Status","reason":"SomethingNew","code":404})", "");
  EXPECT_TRUE(isNotFound(s));
}

TEST(K8sErrorsTest, NonStatusBodyKeepsTextAndCode) {
  absl::Status s = statusFromResponse(502, "<html>bad gateway</html>", "GET /api");
  EXPECT_EQ(k8sReason(s), K8sErrorReason::kUnknown);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(toStd(s.message())), HasSubstr("bad gateway"));
  ASSERT_TRUE(k8sError(s).has_value());
  EXPECT_EQ(k8sError(s)->code, 502);

  s = statusFromResponse(404, "", "GET /x");
  EXPECT_TRUE(isNotFound(s));
  s = statusFromResponse(429, "{not json", "");
  EXPECT_EQ(k8sReason(s), K8sErrorReason::kTooManyRequests);
}

TEST(K8sErrorsTest, ForeignStatusesHaveNoReason) {
  EXPECT_EQ(k8sReason(absl::OkStatus()), K8sErrorReason::kUnknown);
  EXPECT_EQ(k8sReason(absl::NotFoundError("file missing")), K8sErrorReason::kUnknown);
  EXPECT_FALSE(isNotFound(absl::NotFoundError("NotFound")));  // never by text
}

TEST(K8sErrorsTest, WatchErrorEventObject) {
  nlohmann::json status = {{"kind", "Status"},    {"apiVersion", "v1"},
                           {"status", "Failure"}, {"message", "too old resource version: 5 (90)"},
                           {"reason", "Expired"}, {"code", 410}};
  K8sError e = parseStatusObject(status);
  EXPECT_EQ(e.reason, K8sErrorReason::kExpired);
  EXPECT_EQ(e.code, 410);
  K8sError roundTrip = parseStatusObject(e.toJson());
  EXPECT_EQ(roundTrip.reason, K8sErrorReason::kExpired);
  EXPECT_EQ(roundTrip.message, e.message);
}

}  // namespace
}  // namespace tandem::k8s
