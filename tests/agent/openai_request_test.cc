// parseRequest's session id (openai_request.h): the router forwards it to D
// as the x-session-id header, so it must be a header value. Found by
// openai_request_fuzz: a `user` with CR LF became a session id, and the
// router wrote it into its request to D, where it started new headers (or
// a second request on the kept-alive connection).
// The other request fields are tested in openai_api_test.cc.

#include "agent/openai_request.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace tandem::agent {
namespace {

using nlohmann::json;

class OpenAiRequestSessionTest : public ::testing::Test {
 protected:
  std::variant<ParsedRequest, ApiError> parse(const json& body, std::optional<std::string> header = {}) {
    return parseRequest(Endpoint::kCompletions, body, tok_, limits_, std::move(header));
  }
  static json withUser(std::string user) { return {{"model", "tiny"}, {"prompt", "hi"}, {"user", std::move(user)}}; }
  static json plain() { return {{"model", "tiny"}, {"prompt", "hi"}}; }

  ApiLimits limits_{.model_name = "tiny", .max_model_len = 64};
  engine::ByteTokenizer tok_;
};

TEST_F(OpenAiRequestSessionTest, UserWithCrLfIsRefusedNotForwardedAsAHeader) {
  auto r = parse(withUser("s1\r\nx-tandem-route-path: direct"));
  ASSERT_TRUE(std::holds_alternative<ApiError>(r));
  const ApiError& e = std::get<ApiError>(r);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "user");
  EXPECT_NE(e.message.find("control character 13"), std::string::npos) << e.message;
}

TEST_F(OpenAiRequestSessionTest, EveryControlCharacterIsRefused) {
  for (char c : {'\0', '\t', '\n', '\x1f', '\x7f'}) {
    auto r = parse(withUser(std::string("a") + c + "b"));
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << static_cast<int>(c);
    EXPECT_EQ(std::get<ApiError>(r).param, "user");
  }
  // The header too (a server hands over what its HTTP parser let through).
  auto r = parse(plain(), std::string("a\x01") + "b");
  ASSERT_TRUE(std::holds_alternative<ApiError>(r));
  EXPECT_EQ(std::get<ApiError>(r).param, "x-session-id");
}

TEST_F(OpenAiRequestSessionTest, LengthIsCapped) {
  auto r = parse(plain(), std::string(kMaxSessionIdBytes, 'h'));
  ASSERT_TRUE(std::holds_alternative<ParsedRequest>(r));
  EXPECT_EQ(std::get<ParsedRequest>(r).spec.session, SessionId(std::string(kMaxSessionIdBytes, 'h')));
  r = parse(withUser(std::string(kMaxSessionIdBytes + 1, 'u')));
  ASSERT_TRUE(std::holds_alternative<ApiError>(r));
  EXPECT_EQ(std::get<ApiError>(r).param, "user");
  EXPECT_NE(std::get<ApiError>(r).message.find("1025 bytes long"), std::string::npos) << std::get<ApiError>(r).message;
}

TEST_F(OpenAiRequestSessionTest, PrintableAndNonAsciiIdsAreKept) {
  auto r = parse(withUser("alice@example.com / team \xC3\xA9"));
  ASSERT_TRUE(std::holds_alternative<ParsedRequest>(r));
  EXPECT_EQ(std::get<ParsedRequest>(r).spec.session, SessionId("alice@example.com / team \xC3\xA9"));
}

TEST_F(OpenAiRequestSessionTest, UserBesideASessionHeaderIsNotTheSessionAndNotChecked) {
  auto r = parse(withUser("free\nform"), "sess-9");
  ASSERT_TRUE(std::holds_alternative<ParsedRequest>(r));
  EXPECT_EQ(std::get<ParsedRequest>(r).spec.session, SessionId("sess-9"));
}

}  // namespace
}  // namespace tandem::agent
