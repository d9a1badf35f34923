#include "src/metrics/text_serializer.h"

#include <charconv>
#include <cmath>
#include <cstdint>

#include "src/metrics/registry.h"

namespace tandem::metrics {
namespace {

void appendValue(std::string& out, double value) {
  if (std::isnan(value)) {
    out += "NaN";
    return;
  }
  if (std::isinf(value)) {
    out += value > 0 ? "+Inf" : "-Inf";
    return;
  }
  char buf[32];
  std::to_chars_result res;
  // Integral values below 2^63 convert to int64 exactly; printing them as
  // integers avoids "1e+06", which parses but reads badly and diffs noisily.
  if (value == std::trunc(value) && std::fabs(value) < 9.2233720368547758e18) {
    res = std::to_chars(buf, buf + sizeof(buf), static_cast<int64_t>(value));
  } else {
    res = std::to_chars(buf, buf + sizeof(buf), value);  // shortest round-trip
  }
  out.append(buf, res.ptr);
}

void appendCount(std::string& out, uint64_t count) {
  char buf[24];
  auto res = std::to_chars(buf, buf + sizeof(buf), count);
  out.append(buf, res.ptr);
}

void appendEscapedLabelValue(std::string& out, std::string_view value) {
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
}

// `name{labels[,le="bound"]} `: the sample up to its value.
void appendSampleStart(std::string& out, std::string_view name, std::string_view suffix, const Labels& labels,
                       const double* le) {
  out.append(name);
  out.append(suffix);
  if (!labels.empty() || le != nullptr) {
    out += '{';
    bool first = true;
    for (const auto& [labelName, labelValue] : labels) {
      if (!first) out += ',';
      first = false;
      out += labelName;
      out += "=\"";
      appendEscapedLabelValue(out, labelValue);
      out += '"';
    }
    if (le != nullptr) {
      if (!first) out += ',';
      out += "le=\"";
      appendValue(out, *le);
      out += '"';
    }
    out += '}';
  }
  out += ' ';
}

void appendFamily(std::string& out, const MetricFamily& family) {
  // As in the Go client, an empty help text means no HELP line at all.
  if (!family.help.empty()) {
    out += "# HELP ";
    out += family.name;
    out += ' ';
    out += escapeHelp(family.help);
    out += '\n';
  }
  out += "# TYPE ";
  out += family.name;
  out += ' ';
  out += metricTypeName(family.type);
  out += '\n';
  for (const ClientMetric& metric : family.metrics) {
    if (family.type != MetricType::kHistogram) {
      appendSampleStart(out, family.name, "", metric.labels, nullptr);
      appendValue(out, metric.value);
      out += '\n';
      continue;
    }
    for (const HistogramBucket& bucket : metric.buckets) {
      appendSampleStart(out, family.name, "_bucket", metric.labels, &bucket.upperBound);
      appendCount(out, bucket.cumulativeCount);
      out += '\n';
    }
    appendSampleStart(out, family.name, "_sum", metric.labels, nullptr);
    appendValue(out, metric.sampleSum);
    out += '\n';
    appendSampleStart(out, family.name, "_count", metric.labels, nullptr);
    appendCount(out, metric.sampleCount);
    out += '\n';
  }
}

}  // namespace

std::string serializeText(const std::vector<MetricFamily>& families) {
  std::string out;
  for (const MetricFamily& family : families) appendFamily(out, family);
  return out;
}

std::string serializeText(const Registry& registry) { return serializeText(registry.collect()); }

std::string formatValue(double value) {
  std::string out;
  appendValue(out, value);
  return out;
}

std::string escapeHelp(std::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string escapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  appendEscapedLabelValue(out, value);
  return out;
}

}  // namespace tandem::metrics
