#include "src/common/check.h"

#include <gtest/gtest.h>

namespace tandem {
namespace {

int checkedDivide(int a, int b) {
  TANDEM_CHECK(b != 0, "division by zero");
  return a / b;
}

TEST(CheckTest, PassesWhenTheConditionHolds) { EXPECT_EQ(checkedDivide(6, 3), 2); }

// Stays on in Release (this test binary is built like the rest: -DNDEBUG),
// names the condition, the place and the message, and aborts.
TEST(CheckDeathTest, AbortsWithConditionPlaceAndMessageInRelease) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(checkedDivide(1, 0), "invariant violated: b != 0 \\(.*check_test.cc:[0-9]+\\): division by zero");
}

}  // namespace
}  // namespace tandem
