#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "src/http/server.h"

namespace tandem::http {
namespace {

// Each handler answers with a distinct status so a match can be identified.
Handler answering(int status) {
  return [status](Request&) { return Response::text(status, ""); };
}

int statusOf(const Routes::Match& match) {
  if (match.handler == nullptr) return 0;
  Request request("GET", "/", {}, {}, "", std::make_shared<CallContext>(MonoTime()));
  return (*match.handler)(request).status();
}

TEST(RoutesTest, ExactPathAndMethod) {
  Routes routes;
  routes.handle("GET", "/healthz", answering(201)).handle("POST", "/v1/completions", answering(202));
  EXPECT_EQ(statusOf(routes.match("GET", "/healthz")), 201);
  EXPECT_EQ(statusOf(routes.match("POST", "/v1/completions")), 202);
  // Exact means exact: no trailing slash, no prefix, case-sensitive.
  EXPECT_EQ(routes.match("GET", "/healthz/").handler, nullptr);
  EXPECT_EQ(routes.match("GET", "/health").handler, nullptr);
  EXPECT_EQ(routes.match("GET", "/HEALTHZ").handler, nullptr);
}

TEST(RoutesTest, UnknownPathHasNoAllowList) {
  Routes routes;
  routes.handle("GET", "/healthz", answering(200));
  Routes::Match match = routes.match("GET", "/nope");
  EXPECT_EQ(match.handler, nullptr);
  EXPECT_EQ(match.allow, "");
}

TEST(RoutesTest, WrongMethodListsAllowedMethods) {
  Routes routes;
  routes.handle("POST", "/v1/completions", answering(200)).handle("GET", "/v1/completions", answering(200));
  Routes::Match match = routes.match("DELETE", "/v1/completions");
  EXPECT_EQ(match.handler, nullptr);
  EXPECT_EQ(match.allow, "GET, POST");
}

TEST(RoutesTest, ExactBeatsPrefixAndLongestPrefixWins) {
  Routes routes;
  routes.handlePrefix("GET", "/internal/", answering(210))
      .handlePrefix("GET", "/internal/v1/", answering(211))
      .handle("GET", "/internal/v1/status", answering(212));
  EXPECT_EQ(statusOf(routes.match("GET", "/internal/v1/status")), 212);
  EXPECT_EQ(statusOf(routes.match("GET", "/internal/v1/kv/7")), 211);
  EXPECT_EQ(statusOf(routes.match("GET", "/internal/other")), 210);
  EXPECT_EQ(routes.match("GET", "/internal").handler, nullptr);
}

TEST(RoutesTest, MethodFallsThroughToALessSpecificRoute) {
  Routes routes;
  routes.handle("GET", "/v1/models", answering(220)).handlePrefix("POST", "/v1/", answering(221));
  EXPECT_EQ(statusOf(routes.match("POST", "/v1/models")), 221);
  Routes::Match match = routes.match("PUT", "/v1/models");
  EXPECT_EQ(match.allow, "GET, POST");
}

TEST(RoutesTest, LaterRegistrationReplacesEarlier) {
  Routes routes;
  routes.handle("GET", "/x", answering(230)).handle("GET", "/x", answering(231));
  EXPECT_EQ(statusOf(routes.match("GET", "/x")), 231);
}

TEST(ResponseTest, ErrorFromStatusUsesMappedCodeAndMessage) {
  Response r = Response::error(absl::NotFoundError("model 'x' not found"));
  EXPECT_EQ(r.status(), 404);
  EXPECT_EQ(r.headers().at("content-type"), "application/json");
  EXPECT_NE(r.body().find("model 'x' not found"), std::string::npos);
}

TEST(RequestTest, JsonHelperReportsWhereParsingFailed) {
  Request request("POST", "/", {}, {}, "{\"a\": tru}", std::make_shared<CallContext>(MonoTime()));
  auto parsed = request.json();
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("not valid JSON"), absl::string_view::npos);
  EXPECT_NE(parsed.status().message().find("line 1, column"), absl::string_view::npos);
}

TEST(CallContextTest, OnCancelRunsOnceAndImmediatelyWhenAlreadyCancelled) {
  CallContext context(MonoTime{});
  int calls = 0;
  context.onCancel([&] { ++calls; });
  EXPECT_FALSE(context.cancelled());
  EXPECT_TRUE(context.cancel(CancelReason::kClientDisconnected));
  EXPECT_FALSE(context.cancel(CancelReason::kDeadline));  // the first reason sticks
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(context.cancelReason(), CancelReason::kClientDisconnected);
  context.onCancel([&] { ++calls; });
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(context.waitCancelled(std::chrono::milliseconds(0)));
}

}  // namespace
}  // namespace tandem::http
