#include "src/http/target.h"

#include <gtest/gtest.h>

namespace tandem::http {
namespace {

TEST(TargetTest, DecodesPathAndQueryLikeCpprestsdk) {
  std::string path;
  QueryParams query;
  ASSERT_TRUE(decodeTarget("/files/a%2Fb.txt?model=llama%202&n=3&flag&n=4&x=a+b", path, query).ok());
  EXPECT_EQ(path, "/files/a/b.txt");
  EXPECT_EQ(query, (QueryParams{{"model", "llama 2"}, {"n", "4"}, {"x", "a+b"}}));  // no '=': dropped; later wins
}

TEST(TargetTest, AbsoluteFormKeepsOnlyThePath) {
  std::string path;
  QueryParams query;
  ASSERT_TRUE(decodeTarget("http://example.com:8100/v1/models?x=1", path, query).ok());
  EXPECT_EQ(path, "/v1/models");
  EXPECT_EQ(query.at("x"), "1");
}

TEST(TargetTest, BadEscapeIsAnError) {
  std::string path;
  QueryParams query;
  absl::Status s = decodeTarget("/a%zz", path, query);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("invalid request URI"), absl::string_view::npos);
  EXPECT_FALSE(decodeTarget("/a?x=%4", path, query).ok());
}

}  // namespace
}  // namespace tandem::http
