#pragma once
// Including this header makes a test binary log warnings and errors only, to
// keep test output readable. Logging is configured when the tests start, not
// at static initialization (whose order across files is unspecified); the
// inline variable registers the environment once per binary, and gtest owns it.

#include <gtest/gtest.h>

#include "src/common/log.h"

namespace tandem::testutil {

class QuietLogs : public ::testing::Environment {
  void SetUp() override { ASSERT_TRUE(configureLogging({.spec = "warn"}).ok()); }
};
inline ::testing::Environment* const kQuietLogs = ::testing::AddGlobalTestEnvironment(new QuietLogs);

}  // namespace tandem::testutil
