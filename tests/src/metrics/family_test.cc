#include "src/metrics/family.h"

#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "src/metrics/builder.h"
#include "src/metrics/counter.h"
#include "src/metrics/gauge.h"
#include "src/metrics/histogram.h"
#include "src/metrics/registry.h"

namespace tandem::metrics {
namespace {

using ::testing::ElementsAre;

std::vector<ClientMetric> collectFamily(const FamilyBase& family) {
  std::vector<ClientMetric> out;
  family.collect(out);
  return out;
}

TEST(FamilyTest, SameLabelSetReturnsSameChild) {
  Registry registry;
  Family<Counter>& f = buildCounter().name("tandem_requests_total").help("h").registerOn(registry);
  Counter& eos = f.add({{"finish_reason", "eos"}});
  Counter& eosAgain = f.add({{"finish_reason", "eos"}});
  Counter& length = f.add({{"finish_reason", "length"}});
  EXPECT_EQ(&eos, &eosAgain);
  EXPECT_NE(&eos, &length);
  eos.increment();
  eosAgain.increment();
  EXPECT_EQ(eos.value(), 2);
  EXPECT_EQ(length.value(), 0);
  EXPECT_EQ(collectFamily(f).size(), 2u);
}

TEST(FamilyTest, ConstLabelsAreMergedIntoChildren) {
  Registry registry;
  Family<Gauge>& f = buildGauge().name("tandem_kv_blocks_free").help("h").labels({{"pool", "p1"}}).registerOn(registry);
  f.add({{"role", "decode"}}).set(7);
  f.add({}).set(3);
  EXPECT_TRUE(f.has({{"role", "decode"}}));
  EXPECT_FALSE(f.has({{"role", "prefill"}}));

  std::vector<ClientMetric> metrics = collectFamily(f);
  ASSERT_EQ(metrics.size(), 2u);
  // Sorted by full label set: {pool} < {pool, role}.
  EXPECT_EQ(metrics[0].labels, (Labels{{"pool", "p1"}}));
  EXPECT_EQ(metrics[0].value, 3);
  EXPECT_EQ(metrics[1].labels, (Labels{{"pool", "p1"}, {"role", "decode"}}));
  EXPECT_EQ(metrics[1].value, 7);
}

TEST(FamilyTest, RemoveDropsChild) {
  Registry registry;
  Family<Counter>& f = buildCounter().name("x_total").registerOn(registry);
  Counter& a = f.add({{"k", "a"}});
  f.add({{"k", "b"}});
  f.remove(&a);
  EXPECT_FALSE(f.has({{"k", "a"}}));
  EXPECT_TRUE(f.has({{"k", "b"}}));
  f.remove(nullptr);  // not a child: no-op
  EXPECT_EQ(collectFamily(f).size(), 1u);
  // Adding again creates a fresh child.
  EXPECT_EQ(f.add({{"k", "a"}}).value(), 0);
}

TEST(FamilyTest, RemoveMatchingDropsEveryChildWithTheLabels) {
  Registry registry;
  Family<Gauge>& f = buildGauge().name("tandem_pool_replicas").help("h").registerOn(registry);
  f.add({{"namespace", "a"}, {"pool", "p"}, {"role", "decode"}}).set(2);
  f.add({{"namespace", "a"}, {"pool", "p"}, {"role", "prefill"}}).set(1);
  f.add({{"namespace", "b"}, {"pool", "p"}, {"role", "decode"}}).set(3);
  f.add({{"namespace", "a"}, {"pool", "q"}, {"role", "decode"}}).set(4);
  EXPECT_EQ(f.removeMatching({{"namespace", "a"}, {"pool", "p"}}), 2u);
  EXPECT_FALSE(f.has({{"namespace", "a"}, {"pool", "p"}, {"role", "decode"}}));
  EXPECT_TRUE(f.has({{"namespace", "b"}, {"pool", "p"}, {"role", "decode"}}));
  EXPECT_TRUE(f.has({{"namespace", "a"}, {"pool", "q"}, {"role", "decode"}}));
  EXPECT_EQ(f.removeMatching({{"namespace", "a"}, {"pool", "missing"}}), 0u);
  EXPECT_EQ(f.removeMatching({}), 2u);  // every child
  EXPECT_TRUE(collectFamily(f).empty());
}

TEST(FamilyTest, HistogramChildrenUseBuilderBuckets) {
  Registry registry;
  Family<Histogram>& f = buildHistogram().name("lat_seconds").buckets({1, 2}).registerOn(registry);
  Histogram& h = f.add({{"role", "prefill"}});
  EXPECT_THAT(h.bucketBoundaries(), ElementsAre(1, 2));
  h.observe(1.5);
  std::vector<ClientMetric> metrics = collectFamily(f);
  ASSERT_EQ(metrics.size(), 1u);
  EXPECT_EQ(metrics[0].labels, (Labels{{"role", "prefill"}}));
  EXPECT_EQ(metrics[0].sampleCount, 1u);
  EXPECT_EQ(metrics[0].buckets[1].cumulativeCount, 1u);
}

TEST(FamilyTest, HistogramDefaultsToLatencyBuckets) {
  Registry registry;
  Family<Histogram>& f = buildHistogram().name("lat_seconds").registerOn(registry);
  EXPECT_EQ(f.add({}).bucketBoundaries(), defaultLatencyBuckets());
}

TEST(FamilyTest, HistogramPerChildBuckets) {
  Registry registry;
  Family<Histogram>& f = buildHistogram().name("lat_seconds").buckets({1, 2}).registerOn(registry);
  Histogram& h = f.add({{"k", "v"}}, {5, 10, 20});
  EXPECT_THAT(h.bucketBoundaries(), ElementsAre(5, 10, 20));
  EXPECT_EQ(&f.add({{"k", "v"}}, {5, 10, 20}), &h);
  EXPECT_EQ(&f.add({{"k", "v"}}), &h);
}

TEST(FamilyTest, ConcurrentAddsOfOneLabelSetShareOneChild) {
  constexpr int kNumThreads = 8;
  constexpr int kNumIncrements = 10000;
  Registry registry;
  Family<Counter>& f = buildCounter().name("x_total").registerOn(registry);
  std::vector<std::thread> threads;
  for (int t = 0; t < kNumThreads; ++t) {
    threads.emplace_back([&f] {
      for (int i = 0; i < kNumIncrements; ++i) f.add({{"k", "v"}}).increment();
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(f.add({{"k", "v"}}).value(), kNumThreads * kNumIncrements);
  EXPECT_EQ(collectFamily(f).size(), 1u);
}

using FamilyDeathTest = ::testing::Test;

TEST(FamilyDeathTest, InvalidChildLabelsAbortNamingTheLabel) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Registry registry;
  Family<Counter>& c = buildCounter().name("x_total").labels({{"pool", "p1"}}).registerOn(registry);
  EXPECT_DEATH(c.add({{"bad-label", "v"}}), "x_total.*\"bad-label\"");
  EXPECT_DEATH(c.add({{"__name__", "v"}}), "\"__name__\"");
  EXPECT_DEATH(c.add({{"pool", "p2"}}), "\"pool\" is already a constant label");
  Family<Histogram>& h = buildHistogram().name("lat_seconds").registerOn(registry);
  EXPECT_DEATH(h.add({{"le", "1"}}), "\"le\"");
  EXPECT_DEATH(h.add({}, {3, 2}), "strictly increasing");
  h.add({{"k", "v"}}, {1, 2});
  EXPECT_DEATH(h.add({{"k", "v"}}, {1, 3}), "different buckets");
}

}  // namespace
}  // namespace tandem::metrics
