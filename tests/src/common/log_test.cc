#include "src/common/log.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "src/common/clock.h"

namespace tandem {
namespace {

class LogTest : public ::testing::Test {
 protected:
  void configure(std::string spec, LogFormat format) {
    ASSERT_TRUE(configureLogging({.spec = std::move(spec),
                                  .format = format,
                                  .sink = [this](std::string_view line) {
                                    absl::MutexLock lock(&mu_);
                                    lines_.emplace_back(line);
                                  },
                                  .clock = &clock_})
                    .ok());
  }
  void TearDown() override { ASSERT_TRUE(configureLogging({}).ok()); }
  std::vector<std::string> lines() {
    absl::MutexLock lock(&mu_);
    return lines_;
  }

  FakeClock clock_;
  absl::Mutex mu_;
  std::vector<std::string> lines_;
};

TEST_F(LogTest, TextIsKeyValueWithQuotingWhereNeeded) {
  configure("info", LogFormat::kText);
  Logger("engine").info("request finished", {{"request_id", 42}, {"reason", "eos"}, {"note", "a \"b\"\nc"},
                                             {"ok", true}, {"ratio", 0.25}, {"empty", ""}});
  auto l = lines();
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l[0],
            "ts=2026-01-01T00:00:01.000Z level=info component=engine msg=\"request finished\" request_id=42 "
            "reason=eos note=\"a \\\"b\\\"\\nc\" ok=true ratio=0.25 empty=\"\"");
}

TEST_F(LogTest, JsonLinesParseAndKeepTypes) {
  configure("debug", LogFormat::kJson);
  Logger("router").warn("slow \"peer\"", {{"peer", "d-1"}, {"ms", 1500}, {"healthy", false}});
  auto l = lines();
  ASSERT_EQ(l.size(), 1u);
  auto j = nlohmann::json::parse(l[0]);
  EXPECT_EQ(j["level"], "warn");
  EXPECT_EQ(j["component"], "router");
  EXPECT_EQ(j["msg"], "slow \"peer\"");
  EXPECT_EQ(j["peer"], "d-1");
  EXPECT_EQ(j["ms"], 1500);
  EXPECT_EQ(j["healthy"], false);
  EXPECT_EQ(j["ts"], "2026-01-01T00:00:01.000Z");
}

// Control characters other than \n, \r and \t: \xNN in logfmt, \u00NN in
// JSON (which a JSON parser turns back into the byte); backslashes doubled.
TEST_F(LogTest, ControlCharactersAreEscapedForEachFormat) {
  const std::string value = std::string("bell\x07tab\tback\\slash\x1f", 20);
  configure("info", LogFormat::kText);
  Logger("x").info("m", {{"v", value}});
  configure("info", LogFormat::kJson);
  Logger("x").info("m", {{"v", value}});
  auto l = lines();
  ASSERT_EQ(l.size(), 2u);
  EXPECT_NE(l[0].find("v=\"bell\\x07tab\\tback\\\\slash\\x1f\""), std::string::npos) << l[0];
  EXPECT_NE(l[1].find("\"bell\\u0007tab\\tback\\\\slash\\u001f\""), std::string::npos) << l[1];
  EXPECT_EQ(nlohmann::json::parse(l[1])["v"], value);
}

TEST_F(LogTest, LevelThresholdWithPerComponentOverride) {
  configure("warn,engine=debug", LogFormat::kText);
  Logger engine("engine"), http("http");
  engine.debug("e-debug");
  http.info("h-info");
  http.error("h-error");
  EXPECT_TRUE(engine.enabled(LogLevel::kDebug));
  EXPECT_FALSE(http.enabled(LogLevel::kInfo));
  auto l = lines();
  ASSERT_EQ(l.size(), 2u);
  EXPECT_NE(l[0].find("msg=e-debug"), std::string::npos);
  EXPECT_NE(l[1].find("level=error component=http"), std::string::npos);
}

TEST_F(LogTest, BadSpecIsRejectedAndNamesTheLevel) {
  auto s = configureLogging({.spec = "info,engine=verbose"});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(std::string(s.message()).find("unknown log level \"verbose\""), std::string::npos) << s;
  EXPECT_FALSE(parseLogFormat("xml").ok());
  EXPECT_EQ(*parseLogFormat("json"), LogFormat::kJson);
}

TEST_F(LogTest, ConcurrentLinesStayWhole) {
  configure("info", LogFormat::kText);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      Logger log("t" + std::to_string(t));
      for (int i = 0; i < 200; ++i) log.info("line", {{"i", i}});
    });
  }
  for (auto& th : threads) th.join();
  auto l = lines();
  ASSERT_EQ(l.size(), 800u);
  for (const auto& line : l) {
    EXPECT_EQ(line.rfind("ts=", 0), 0u) << line;
    EXPECT_NE(line.find("msg=line i="), std::string::npos) << line;
  }
}

}  // namespace
}  // namespace tandem
