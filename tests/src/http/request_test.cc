// Request (server.h): what a handler reads of one call. Found by
// openai_request_fuzz: nlohmann's parser stops at a NUL byte, so a body
// with one parsed as the JSON before it and the rest was ignored.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "src/common/strings.h"
#include "src/http/server.h"

namespace tandem::http {
namespace {

Request withBody(std::string body) {
  return Request("POST", "/v1/completions", {}, {{"X-Session-Id", "s1"}}, std::move(body),
                 std::make_shared<CallContext>(MonoTime{}));
}

TEST(RequestTest, JsonParsesTheBody) {
  auto j = withBody(R"({"model":"tiny","n":1})").json();
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ((*j)["n"], 1);
}

TEST(RequestTest, BodyWithANulByteIsNotJson) {
  for (std::string body :
       {std::string("{\"a\":1}\0{\"junk\"", 15), std::string("\0", 1), std::string("{\"a\":\"x\0y\"}", 11)}) {
    auto j = withBody(body).json();
    ASSERT_FALSE(j.ok()) << "parsed as " << j->dump();
    EXPECT_EQ(j.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(toStd(j.status().message()).starts_with("request body is not valid JSON: a NUL byte at byte "))
        << j.status();
  }
}

TEST(RequestTest, BadJsonSaysWhatAndWhere) {
  auto j = withBody("{\"a\":").json();
  ASSERT_FALSE(j.ok());
  EXPECT_TRUE(
      toStd(j.status().message()).starts_with("request body is not valid JSON: parse error at line 1, column 6"))
      << j.status();
}

TEST(RequestTest, HeadersAreCaseInsensitive) {
  Request r = withBody("{}");
  EXPECT_EQ(r.header("x-session-id"), "s1");
  EXPECT_EQ(r.header("x-tandem-route-path"), std::nullopt);
}

}  // namespace
}  // namespace tandem::http
