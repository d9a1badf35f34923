#include "src/common/strings.h"

#include <gtest/gtest.h>

namespace tandem {
namespace {

TEST(StrCatTest, MixesTypes) {
  std::string_view sv = "view";
  EXPECT_EQ(strCat("a", sv, std::string("s"), 'c', 42, -7L, true, 0.5), "aviewsc42-7true0.5");
  EXPECT_EQ(strCat(absl::string_view("absl")), "absl");
  EXPECT_EQ(strCat(uint64_t{18446744073709551615ULL}), "18446744073709551615");
}

TEST(Utf8Test, AcceptsValid) {
  EXPECT_TRUE(isValidUtf8(""));
  EXPECT_TRUE(isValidUtf8("plain ascii"));
  EXPECT_TRUE(isValidUtf8("h\xC3\xA9llo"));          // é
  EXPECT_TRUE(isValidUtf8("\xE2\x82\xAC"));          // €
  EXPECT_TRUE(isValidUtf8("\xF0\x9F\x98\x80"));      // emoji
  EXPECT_TRUE(isValidUtf8(std::string_view("a\0b", 3)));
}

TEST(Utf8Test, RejectsInvalid) {
  EXPECT_FALSE(isValidUtf8("\xFF"));
  EXPECT_FALSE(isValidUtf8("\x80"));                  // lone continuation
  EXPECT_FALSE(isValidUtf8("\xC3"));                  // truncated
  EXPECT_FALSE(isValidUtf8("\xC0\xAF"));              // overlong '/'
  EXPECT_FALSE(isValidUtf8("\xE0\x80\xAF"));          // overlong
  EXPECT_FALSE(isValidUtf8("\xED\xA0\x80"));          // surrogate U+D800
  EXPECT_FALSE(isValidUtf8("\xF4\x90\x80\x80"));      // > U+10FFFF
  EXPECT_FALSE(isValidUtf8("ok\xE2\x82"));            // truncated at end
}

TEST(ByteSizeTest, ReadsBinaryAndDecimalUnits) {
  EXPECT_EQ(parseByteSize("0"), 0);
  EXPECT_EQ(parseByteSize("1048576"), 1048576);
  EXPECT_EQ(parseByteSize("512B"), 512);
  EXPECT_EQ(parseByteSize("4Ki"), 4096);
  EXPECT_EQ(parseByteSize("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(parseByteSize("40Gi"), int64_t{40} << 30);
  EXPECT_EQ(parseByteSize("2TiB"), int64_t{2} << 40);
  EXPECT_EQ(parseByteSize("2G"), 2000000000);
  EXPECT_EQ(parseByteSize("3MB"), 3000000);
  EXPECT_EQ(parseByteSize("8388607Ti"), int64_t{8388607} << 40);
}

TEST(ByteSizeTest, RejectsAnythingElse) {
  for (const char* bad : {"", "Gi", "-1", "+1", "1.5Gi", "40 Gi", "40gi", "40GB ", "40Gib", "9223372036854775808",
                          "8388608Ti", "0x10", "1e9"}) {
    EXPECT_EQ(parseByteSize(bad), std::nullopt) << bad;
  }
}

}  // namespace
}  // namespace tandem
