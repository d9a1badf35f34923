#pragma once
// Prometheus text exposition format, version 0.0.4:
//
//   # HELP <name> <help, with \ as \\ and newline as \n>
//   # TYPE <name> counter|gauge|histogram
//   <name>{<label>="<value>",...} <number>
//   <name>_bucket{<label>="<value>",...,le="<bound>"} <cumulative count>   (histograms;
//   <name>_sum{...} <number>                                               last le="+Inf")
//   <name>_count{...} <count>
//
// The HELP line is left out when the help text is empty. Label values escape
// \ as \\, " as \" and newline as \n. Samples with no labels omit the braces.
// No timestamps. Families are written in the order given (Registry::collect()
// sorts them by name), children in the order given, each family's HELP and
// TYPE once. Numbers: integral values without exponent ("1000000"), others in
// shortest round-trip form, and +Inf, -Inf, NaN as Prometheus spells them.
//
// All functions are pure and thread-safe.

#include <string>
#include <string_view>
#include <vector>

#include "src/metrics/metric_family.h"

namespace tandem::metrics {

class Registry;

// The Content-Type of a serializeText() body.
inline constexpr std::string_view kContentType = "text/plain; version=0.0.4; charset=utf-8";

std::string serializeText(const std::vector<MetricFamily>& families);

// serializeText(registry.collect()): runs the registry's collect hooks.
std::string serializeText(const Registry& registry);

// Pieces of the format, public for tests and hand-written expositions.
std::string formatValue(double value);
std::string escapeHelp(std::string_view help);
std::string escapeLabelValue(std::string_view value);

}  // namespace tandem::metrics
