// Checks our exposition with the real Prometheus parser and linter:
// `promtool check metrics` (Debian package `prometheus`, installed by
// ./tandem). A missing promtool fails the test rather than skipping it, so a
// CI image without it cannot silently lose this check.

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "src/common/strings.h"
#include "src/metrics/metrics.h"

namespace tandem::metrics {
namespace {

constexpr char kPromtool[] = "/usr/bin/promtool";

struct PromtoolResult {
  int exitCode = -1;
  std::string output;  // stdout and stderr together
};

// Runs `promtool check metrics` with `exposition` on stdin. The text goes
// through a temporary file so a large exposition cannot deadlock against
// promtool's output pipe.
PromtoolResult runPromtool(const std::string& exposition) {
  PromtoolResult result;
  std::string path = strCat(::testing::TempDir(), "/tandem_metrics_promtool_", getpid(), ".txt");
  {
    std::ofstream file(path, std::ios::binary);
    file << exposition;
  }
  std::string command = strCat(kPromtool, " check metrics < '", path, "' 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    result.output = "popen failed";
    return result;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) result.output.append(buf, n);
  int status = pclose(pipe);
  std::remove(path.c_str());
  result.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

void requirePromtool() {
  ASSERT_EQ(access(kPromtool, X_OK), 0) << kPromtool
                                        << " not found: install Debian's `prometheus` package (./tandem does "
                                           "this) so the exposition can be checked";
}

// A registry shaped like an engine's: counters, gauges, labelled
// histograms, escapes in help text and label values, a collect hook.
void populate(Registry& registry) {
  Labels pool = {{"pool", "llama-8b"}, {"role", "decode"}};
  Family<Counter>& requests = buildCounter()
                                  .name("tandem_requests_total")
                                  .help("Finished requests by finish reason.")
                                  .labels(pool)
                                  .registerOn(registry);
  requests.add({{"finish_reason", "eos"}}).increment(1234);
  requests.add({{"finish_reason", "length"}}).increment(56);
  requests.add({{"finish_reason", "odd \"reason\" \\ with\nnewline"}}).increment();
  buildCounter()
      .name("tandem_generated_tokens_total")
      .help("Tokens generated. Path C:\\models\nsecond line.")
      .labels(pool)
      .registerOn(registry)
      .add({})
      .increment(1e6);

  Family<Gauge>& kvFree =
      buildGauge().name("tandem_kv_blocks_free").help("Free KV-cache blocks.").labels(pool).registerOn(registry);
  Gauge& free = kvFree.add({});
  registry.addCollectHook([&free] { free.set(812); });
  buildGauge()
      .name("tandem_kv_cache_usage_ratio")
      .help("Used KV-cache fraction.")
      .registerOn(registry)
      .add(pool)
      .set(0.37);
  buildGauge().name("tandem_queue_depth").help("Waiting requests.").registerOn(registry).add({}).set(0);

  Family<Histogram>& ttft =
      buildHistogram().name("tandem_time_to_first_token_seconds").help("Time to first token.").registerOn(registry);
  Family<Histogram>& e2e = buildHistogram()
                               .name("tandem_request_duration_seconds")
                               .help("End-to-end latency.")
                               .buckets(exponentialBuckets(0.01, 2, 12))
                               .registerOn(registry);
  for (const char* role : {"prefill", "decode"}) {
    Labels labels = {{"pool", "llama-8b"}, {"role", role}};
    Histogram& t = ttft.add(labels);
    Histogram& d = e2e.add(labels);
    for (double v : {0.0004, 0.003, 0.02, 0.2, 1.5, 45.0, 500.0}) {
      t.observe(v);
      d.observe(v * 3);
    }
  }
  buildHistogram()
      .name("tandem_batch_size_tokens")
      .help("Tokens per engine step.")
      .buckets(linearBuckets(64, 64, 8))
      .registerOn(registry)
      .add({})
      .observe(100);
}

TEST(PromtoolTest, RealisticRegistryPassesCheckMetrics) {
  requirePromtool();
  Registry registry;
  populate(registry);
  std::string text = serializeText(registry);
  ASSERT_NE(text.find("tandem_kv_blocks_free{pool=\"llama-8b\",role=\"decode\"} 812\n"), std::string::npos) << text;
  ASSERT_NE(text.find("le=\"+Inf\""), std::string::npos);
  PromtoolResult result = runPromtool(text);
  EXPECT_EQ(result.exitCode, 0) << result.output << "\n--- exposition ---\n" << text;
  EXPECT_EQ(result.output, "") << "\n--- exposition ---\n" << text;
}

// The harness itself must be able to fail: promtool flags a counter
// without `_total` and a malformed line.
TEST(PromtoolTest, HarnessReportsProblems) {
  requirePromtool();
  PromtoolResult lint = runPromtool("# HELP foo x\n# TYPE foo counter\nfoo 1\n");
  EXPECT_NE(lint.exitCode, 0);
  EXPECT_NE(lint.output.find("_total"), std::string::npos) << lint.output;
  PromtoolResult broken = runPromtool("foo{bad 1\n");
  EXPECT_NE(broken.exitCode, 0);
  EXPECT_NE(broken.output, "");
}

}  // namespace
}  // namespace tandem::metrics
