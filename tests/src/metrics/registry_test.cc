#include "src/metrics/registry.h"

#include "gtest/gtest.h"
#include "src/metrics/builder.h"
#include "src/metrics/counter.h"
#include "src/metrics/gauge.h"
#include "src/metrics/histogram.h"
#include "src/metrics/text_serializer.h"

namespace tandem::metrics {
namespace {

TEST(RegistryTest, SameNameAndTypeReturnsExistingFamily) {
  Registry registry;
  Family<Counter>& a = buildCounter().name("x_total").help("first").registerOn(registry);
  Family<Counter>& b = buildCounter().name("x_total").help("second").registerOn(registry);
  EXPECT_EQ(&a, &b);
  a.add({}).increment();
  std::vector<MetricFamily> families = registry.collect();
  ASSERT_EQ(families.size(), 1u);
  EXPECT_EQ(families[0].help, "first");
}

TEST(RegistryTest, HistogramLookupWithoutBucketsAcceptsExisting) {
  Registry registry;
  Family<Histogram>& a = buildHistogram().name("lat_seconds").buckets({1, 2}).registerOn(registry);
  Family<Histogram>& b = buildHistogram().name("lat_seconds").registerOn(registry);
  EXPECT_EQ(&a, &b);
}

TEST(RegistryTest, DifferentConstLabelsMakeSiblingsMergedAtCollect) {
  Registry registry;
  Family<Gauge>& p2 = buildGauge().name("free_blocks").help("h").labels({{"pool", "p2"}}).registerOn(registry);
  Family<Gauge>& p1 = buildGauge().name("free_blocks").help("h").labels({{"pool", "p1"}}).registerOn(registry);
  EXPECT_NE(&p1, &p2);
  p2.add({}).set(2);
  p1.add({}).set(1);
  std::vector<MetricFamily> families = registry.collect();
  ASSERT_EQ(families.size(), 1u);
  ASSERT_EQ(families[0].metrics.size(), 2u);
  EXPECT_EQ(families[0].metrics[0].labels, (Labels{{"pool", "p1"}}));
  EXPECT_EQ(families[0].metrics[0].value, 1);
  EXPECT_EQ(families[0].metrics[1].labels, (Labels{{"pool", "p2"}}));
}

TEST(RegistryTest, CollectSortsByNameAndSkipsEmptyFamilies) {
  Registry registry;
  buildGauge().name("zeta").registerOn(registry).add({}).set(1);
  buildCounter().name("alpha_total").registerOn(registry).add({}).increment();
  buildGauge().name("empty").registerOn(registry);
  buildGauge().name("mid").registerOn(registry).add({}).set(2);
  std::vector<MetricFamily> families = registry.collect();
  ASSERT_EQ(families.size(), 3u);
  EXPECT_EQ(families[0].name, "alpha_total");
  EXPECT_EQ(families[0].type, MetricType::kCounter);
  EXPECT_EQ(families[1].name, "mid");
  EXPECT_EQ(families[2].name, "zeta");
}

TEST(RegistryTest, CollectHooksRunBeforeSnapshot) {
  Registry registry;
  Gauge& free = buildGauge().name("tandem_kv_blocks_free").help("h").registerOn(registry).add({});
  int engineFreeBlocks = 10;
  int numHookCalls = 0;
  registry.addCollectHook([&] {
    ++numHookCalls;
    free.set(engineFreeBlocks);
  });
  EXPECT_EQ(serializeText(registry),
            "# HELP tandem_kv_blocks_free h\n# TYPE tandem_kv_blocks_free gauge\n"
            "tandem_kv_blocks_free 10\n");
  engineFreeBlocks = 4;
  EXPECT_EQ(registry.collect()[0].metrics[0].value, 4);
  EXPECT_EQ(numHookCalls, 2);
}

TEST(RegistryTest, HookMayRegisterFamilies) {
  Registry registry;
  registry.addCollectHook([&registry] { buildGauge().name("late").registerOn(registry).add({}).set(1); });
  std::vector<MetricFamily> families = registry.collect();
  ASSERT_EQ(families.size(), 1u);
  EXPECT_EQ(families[0].name, "late");
}

using RegistryDeathTest = ::testing::Test;

TEST(RegistryDeathTest, ProgrammingErrorsAbortNamingTheName) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Registry registry;
  buildCounter().name("x_total").registerOn(registry);
  EXPECT_DEATH(buildGauge().name("x_total").registerOn(registry), "x_total registered as a gauge but already.*counter");
  EXPECT_DEATH(buildCounter().name("bad-name_total").registerOn(registry), "\"bad-name_total\"");
  EXPECT_DEATH(buildCounter().name("").registerOn(registry), "metric name is empty");
  EXPECT_DEATH(buildCounter().name("y_total").labels({{"bad.label", "v"}}).registerOn(registry), "\"bad.label\"");
  EXPECT_DEATH(buildHistogram().name("h_seconds").labels({{"le", "1"}}).registerOn(registry), "\"le\"");
  EXPECT_DEATH(buildHistogram().name("h_seconds").buckets({1, 1}).registerOn(registry), "h_seconds.*strictly");
  buildHistogram().name("lat_seconds").buckets({1, 2}).registerOn(registry);
  EXPECT_DEATH(buildHistogram().name("lat_seconds").buckets({1, 3}).registerOn(registry), "different buckets");
}

}  // namespace
}  // namespace tandem::metrics
