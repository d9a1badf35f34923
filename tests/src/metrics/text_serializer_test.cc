#include "src/metrics/text_serializer.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "src/metrics/builder.h"
#include "src/metrics/counter.h"
#include "src/metrics/gauge.h"
#include "src/metrics/histogram.h"
#include "src/metrics/registry.h"

namespace tandem::metrics {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(TextSerializerTest, ContentType) { EXPECT_EQ(kContentType, "text/plain; version=0.0.4; charset=utf-8"); }

TEST(TextSerializerTest, FormatsSpecialValues) {
  EXPECT_EQ(formatValue(kInf), "+Inf");
  EXPECT_EQ(formatValue(-kInf), "-Inf");
  EXPECT_EQ(formatValue(std::nan("")), "NaN");
}

TEST(TextSerializerTest, FormatsIntegersWithoutExponent) {
  EXPECT_EQ(formatValue(0), "0");
  EXPECT_EQ(formatValue(-0.0), "0");
  EXPECT_EQ(formatValue(1), "1");
  EXPECT_EQ(formatValue(-42), "-42");
  EXPECT_EQ(formatValue(1e6), "1000000");
  EXPECT_EQ(formatValue(123456789012345.0), "123456789012345");
  EXPECT_EQ(formatValue(1e18), "1000000000000000000");
}

TEST(TextSerializerTest, FormatsFractionsInShortestRoundTripForm) {
  EXPECT_EQ(formatValue(0.1), "0.1");
  EXPECT_EQ(formatValue(2.5), "2.5");
  EXPECT_EQ(formatValue(0.005), "0.005");
  EXPECT_EQ(formatValue(-1.25), "-1.25");
  EXPECT_EQ(formatValue(1e-9), "1e-09");
  EXPECT_EQ(formatValue(1e300), "1e+300");
  for (double v : {0.1 + 0.2, 1.0 / 3, 6.02214076e23, 5e-324}) {
    std::string s = formatValue(v);
    double back = 0;
    std::from_chars(s.data(), s.data() + s.size(), back);
    EXPECT_EQ(back, v) << s;
  }
}

TEST(TextSerializerTest, Escaping) {
  EXPECT_EQ(escapeHelp("a\\b\nc\"d"), "a\\\\b\\nc\"d");
  EXPECT_EQ(escapeLabelValue("a\\b\nc\"d"), "a\\\\b\\nc\\\"d");
  EXPECT_EQ(escapeLabelValue("plain"), "plain");
}

TEST(TextSerializerTest, SmallRegistryExactText) {
  Registry registry;
  Family<Counter>& requests = buildCounter()
                                  .name("tandem_requests_total")
                                  .help("Requests served.\nBy pool \\ reason.")
                                  .labels({{"pool", "p1"}})
                                  .registerOn(registry);
  requests.add({{"finish_reason", "eos"}}).increment(3);
  requests.add({{"finish_reason", "say \"hi\"\\\n"}}).increment();
  buildGauge().name("tandem_queue_depth").help("Waiting requests.").registerOn(registry).add({}).set(-2.5);
  Histogram& latency = buildHistogram()
                           .name("tandem_latency_seconds")
                           .help("Latency.")
                           .buckets({0.1, 1})
                           .registerOn(registry)
                           .add({{"role", "decode"}});
  latency.observe(0.05);
  latency.observe(0.5);
  latency.observe(4);

  EXPECT_EQ(serializeText(registry),
            "# HELP tandem_latency_seconds Latency.\n"
            "# TYPE tandem_latency_seconds histogram\n"
            "tandem_latency_seconds_bucket{role=\"decode\",le=\"0.1\"} 1\n"
            "tandem_latency_seconds_bucket{role=\"decode\",le=\"1\"} 2\n"
            "tandem_latency_seconds_bucket{role=\"decode\",le=\"+Inf\"} 3\n"
            "tandem_latency_seconds_sum{role=\"decode\"} 4.55\n"
            "tandem_latency_seconds_count{role=\"decode\"} 3\n"
            "# HELP tandem_queue_depth Waiting requests.\n"
            "# TYPE tandem_queue_depth gauge\n"
            "tandem_queue_depth -2.5\n"
            "# HELP tandem_requests_total Requests served.\\nBy pool \\\\ reason.\n"
            "# TYPE tandem_requests_total counter\n"
            "tandem_requests_total{finish_reason=\"eos\",pool=\"p1\"} 3\n"
            "tandem_requests_total{finish_reason=\"say \\\"hi\\\"\\\\\\n\",pool=\"p1\"} 1\n");
}

TEST(TextSerializerTest, HistogramWithoutLabelsAndEmptyHelp) {
  std::vector<MetricFamily> families(1);
  families[0].name = "h";
  families[0].type = MetricType::kHistogram;
  ClientMetric m;
  m.buckets = {{1, 0}, {kInf, 0}};
  m.sampleSum = std::nan("");
  families[0].metrics.push_back(m);
  EXPECT_EQ(serializeText(families),
            "# TYPE h histogram\n"
            "h_bucket{le=\"1\"} 0\n"
            "h_bucket{le=\"+Inf\"} 0\n"
            "h_sum NaN\n"
            "h_count 0\n");
}

// A deliberately small parser for the subset of the format we write:
// returns "name{k=v,...}" (unescaped values) -> value.
std::map<std::string, double> parseSamples(const std::string& text) {
  std::map<std::string, double> samples;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    size_t i = 0;
    std::string key;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') key += line[i++];
    if (line[i] == '{') {
      key += '{';
      ++i;
      while (line[i] != '}') {
        while (line[i] != '=') key += line[i++];
        key += '=';
        i += 2;  // ="
        while (line[i] != '"') {
          if (line[i] == '\\') {
            ++i;
            key += line[i] == 'n' ? '\n' : line[i];
          } else {
            key += line[i];
          }
          ++i;
        }
        ++i;  // closing quote
        if (line[i] == ',') key += line[i++];
      }
      key += '}';
      ++i;
    }
    std::string value = line.substr(i + 1);
    samples[key] = value == "+Inf" ? kInf : value == "-Inf" ? -kInf : value == "NaN" ? std::nan("") : std::stod(value);
  }
  return samples;
}

TEST(TextSerializerTest, ParsesBack) {
  Registry registry;
  Family<Gauge>& g = buildGauge().name("g").help("x").labels({{"pool", "a\"b\\c\nd"}}).registerOn(registry);
  g.add({{"role", "r"}}).set(0.1);
  g.add({{"role", "s"}}).set(-kInf);
  buildCounter().name("c_total").registerOn(registry).add({}).increment(1e6);
  std::map<std::string, double> samples = parseSamples(serializeText(registry));
  ASSERT_EQ(samples.size(), 3u);
  EXPECT_EQ(samples.at("g{pool=a\"b\\c\nd,role=r}"), 0.1);
  EXPECT_EQ(samples.at("g{pool=a\"b\\c\nd,role=s}"), -kInf);
  EXPECT_EQ(samples.at("c_total"), 1e6);
}

}  // namespace
}  // namespace tandem::metrics
