// tandem-replay's command line: parsing (each bad case says what is wrong),
// and the commands end to end on a small trace file.

#include "e2e/replay/cli.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "e2e/replay/commands.h"
#include "nlohmann/json.hpp"
#include "src/common/strings.h"

namespace tandem::replay {
namespace {

absl::StatusOr<Command> parse(std::vector<std::string> args) { return parseCommandLine(args); }

std::string errorOf(std::vector<std::string> args) {
  absl::StatusOr<Command> c = parse(std::move(args));
  EXPECT_FALSE(c.ok());
  return std::string(toStd(c.status().message()));
}

TEST(CliTest, ParsesTheReplayCommand) {
  absl::StatusOr<Command> c = parse({"--trace", "t.jsonl", "--workers", "8", "--cache-fraction=0.5", "--policy",
                                     "tandem,least_load", "--json", "--prefill-tokens-per-s", "20000"});
  ASSERT_TRUE(c.ok()) << c.status();
  const ReplayCommand& r = std::get<ReplayCommand>(*c);
  EXPECT_EQ(r.trace_path, "t.jsonl");
  EXPECT_EQ(r.num_workers, 8);
  EXPECT_EQ(r.cache_fraction, std::optional<double>(0.5));
  EXPECT_FALSE(r.cache_blocks.has_value());
  EXPECT_EQ(r.policies, (std::vector<std::string>{"tandem", "least_load"}));
  EXPECT_TRUE(r.json);
  EXPECT_EQ(r.model.prefill_tokens_per_s, 20000);
  EXPECT_EQ(r.model.decode_tokens_per_s, WorkerModel{}.decode_tokens_per_s);  // the documented default
}

TEST(CliTest, ReplayErrorsSayWhatIsWrong) {
  const std::vector<std::string> ok = {"--trace", "t", "--workers", "2", "--cache-blocks", "10", "--policy", "tandem"};
  auto without = [&](const std::string& flag) {
    std::vector<std::string> out;
    for (size_t i = 0; i < ok.size(); i += 2) {
      if (ok[i] != flag) out.insert(out.end(), {ok[i], ok[i + 1]});
    }
    return out;
  };
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> out = ok;
    out.insert(out.end(), extra.begin(), extra.end());
    return out;
  };
  EXPECT_EQ(errorOf(without("--trace")), "--trace FILE is required");
  EXPECT_EQ(errorOf(without("--workers")), "--workers N is required");
  EXPECT_EQ(errorOf(without("--policy")), "--policy NAME[,NAME...] is required");
  EXPECT_EQ(errorOf(without("--cache-blocks")), "give exactly one of --cache-blocks B and --cache-fraction F");
  EXPECT_EQ(errorOf(with({"--cache-fraction", "0.5"})), "give exactly one of --cache-blocks B and --cache-fraction F");
  EXPECT_EQ(errorOf(with({"--workers", "3"})), "--workers given twice");
  EXPECT_EQ(errorOf(with({"--frobnicate", "1"})), "unknown flag --frobnicate");
  EXPECT_EQ(errorOf(with({"stray"})), "unexpected argument 'stray'");
  EXPECT_EQ(errorOf(with({"--max-waiting"})), "--max-waiting needs a value");
  EXPECT_EQ(errorOf(with({"--json=yes"})), "--json takes no value");
  EXPECT_EQ(errorOf({"--workers", "two"}), "--workers: 'two' is not a number");
  EXPECT_EQ(errorOf({"--workers", "0"}), "--workers must be >= 1, got 0");
  EXPECT_EQ(errorOf({"--cache-fraction", "0"}), "--cache-fraction must be > 0");
  EXPECT_EQ(errorOf({"--cache-fraction", "nan"}), "--cache-fraction: 'nan' is not finite");
  EXPECT_EQ(errorOf({"--policy", "tandem,random"}),
            "unknown policy 'random' (known: round_robin, least_load, cache_aware, tandem)");
  EXPECT_EQ(errorOf({"--policy", "tandem,tandem"}), "--policy names tandem twice");
  EXPECT_EQ(errorOf({"--policy", "tandem,"}),
            "unknown policy '' (known: round_robin, least_load, cache_aware, tandem)");
}

TEST(CliTest, ParsesGenerateAndHelp) {
  absl::StatusOr<Command> c = parse({"generate", "--sessions", "52", "--shape", "48K", "--seed", "9", "--out", "x"});
  ASSERT_TRUE(c.ok()) << c.status();
  const GenerateCommand& g = std::get<GenerateCommand>(*c);
  EXPECT_EQ(g.options.num_sessions, 52);
  EXPECT_EQ(g.options.shape.name, "48K");
  EXPECT_EQ(g.options.seed, 9u);
  EXPECT_EQ(g.out_path, "x");
  EXPECT_EQ(errorOf({"generate", "--shape", "16K"}), "--shape must be 32K, 48K or 64K, got '16K'");
  EXPECT_EQ(errorOf({"generate", "--trace", "t"}), "unknown flag for generate: --trace");
  EXPECT_TRUE(std::holds_alternative<HelpCommand>(*parse({"--help"})));
  EXPECT_TRUE(std::holds_alternative<HelpCommand>(*parse({"generate", "--help"})));
}

TEST(CliTest, CacheFractionSplitsTheUniqueBlocksEvenly) {
  ReplayCommand c{.num_workers = 8, .cache_fraction = 0.5};
  EXPECT_EQ(cacheBlocksPerWorker(c, 43924), 2745);  // 0.5 * 43924 / 8, rounded down
  EXPECT_EQ(cacheBlocksPerWorker(c, 3), 1);         // at least one block
  c.cache_fraction.reset();
  c.cache_blocks = 77;
  EXPECT_EQ(cacheBlocksPerWorker(c, 43924), 77);
}

class TempFile {
 public:
  explicit TempFile(const std::string& content) {
    char name[] = "/tmp/tandem-replay-cli-XXXXXX";
    const int fd = mkstemp(name);
    EXPECT_GE(fd, 0);
    close(fd);
    path_ = name;
    std::ofstream(path_) << content;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(CliTest, GeneratedTraceReplaysAsJsonLines) {
  TempFile trace("");
  std::ostringstream ignored;
  absl::StatusOr<Command> gen = parse({"generate", "--sessions", "4", "--seed", "2", "--out", trace.path()});
  ASSERT_TRUE(gen.ok()) << gen.status();
  ASSERT_TRUE(runGenerateCommand(std::get<GenerateCommand>(*gen), ignored).ok());

  absl::StatusOr<Command> c = parse(
      {"--trace", trace.path(), "--workers", "2", "--cache-fraction", "1", "--policy", "round_robin,tandem", "--json"});
  ASSERT_TRUE(c.ok()) << c.status();
  std::ostringstream out;
  absl::Status s = runReplayCommand(std::get<ReplayCommand>(*c), out);
  ASSERT_TRUE(s.ok()) << s;
  std::istringstream lines(out.str());
  std::string line;
  std::vector<std::string> policies;
  while (std::getline(lines, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    policies.push_back(j.at("policy"));
    for (const char* field : {"hit_ratio", "hit_bound", "imbalance", "p50_wait_s", "p99_wait_s", "direct_share",
                              "min_session_direct_share", "cold_workers", "rejections", "migrations"}) {
      EXPECT_TRUE(j.contains(field)) << field;
    }
    EXPECT_TRUE(j.at("direct_share").is_number());  // a session trace has turns >= 1
  }
  EXPECT_EQ(policies, (std::vector<std::string>{"round_robin", "tandem"}));
}

TEST(CliTest, TableAndTraceErrors) {
  TempFile bad(
      "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [0]}\n{\"timestamp\": 1}\n");
  ReplayCommand c{.trace_path = bad.path(), .num_workers = 1, .cache_blocks = 10, .policies = {"tandem"}};
  std::ostringstream out;
  absl::Status s = runReplayCommand(c, out);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(toStd(s.message()), bad.path() + ":2: field `input_length`: missing");

  TempFile good("{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [0]}\n");
  c.trace_path = good.path();
  c.policies = {"least_load", "cache_aware"};
  ASSERT_TRUE(runReplayCommand(c, out).ok());
  EXPECT_NE(out.str().find("policy"), std::string::npos);
  EXPECT_NE(out.str().find("\nleast_load "), std::string::npos);
  EXPECT_NE(out.str().find("\ncache_aware "), std::string::npos);
}

}  // namespace
}  // namespace tandem::replay
