#include "src/metrics/validate.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "src/common/strings.h"

namespace tandem::metrics {
namespace {

bool isAsciiLetter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool isAsciiDigit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

absl::Status validateMetricName(std::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError("metric name is empty");
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = isAsciiLetter(c) || c == '_' || c == ':' || (i > 0 && isAsciiDigit(c));
    if (!ok) {
      return absl::InvalidArgumentError(
          strCat("invalid metric name \"", name, "\": must match [a-zA-Z_:][a-zA-Z0-9_:]*"));
    }
  }
  return absl::OkStatus();
}

absl::Status validateLabelName(std::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError("label name is empty");
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = isAsciiLetter(c) || c == '_' || (i > 0 && isAsciiDigit(c));
    if (!ok) {
      return absl::InvalidArgumentError(strCat("invalid label name \"", name, "\": must match [a-zA-Z_][a-zA-Z0-9_]*"));
    }
  }
  if (name.starts_with("__")) {
    return absl::InvalidArgumentError(
        strCat("invalid label name \"", name, "\": names starting with \"__\" are reserved"));
  }
  return absl::OkStatus();
}

absl::Status validateLabelNameFor(MetricType type, std::string_view name) {
  if (absl::Status s = validateLabelName(name); !s.ok()) return s;
  if (type == MetricType::kHistogram && name == "le") {
    return absl::InvalidArgumentError("invalid label name \"le\": reserved for histogram buckets");
  }
  return absl::OkStatus();
}

absl::Status validateBuckets(const BucketBoundaries& bounds) {
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i])) {
      return absl::InvalidArgumentError(strCat("invalid histogram bucket ", i, " (", bounds[i],
                                               "): bounds must be finite; +Inf is added implicitly"));
    }
    if (i > 0 && !(bounds[i] > bounds[i - 1])) {
      return absl::InvalidArgumentError(strCat("invalid histogram bucket ", i, " (", bounds[i],
                                               "): bounds must be strictly increasing, previous is ", bounds[i - 1]));
    }
  }
  return absl::OkStatus();
}

namespace internal {

void fatal(std::string_view message) {
  std::string line = strCat("tandem::metrics: ", message, "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
  std::abort();
}

void checkOk(const absl::Status& status) {
  if (!status.ok()) fatal(toStd(status.message()));
}

}  // namespace internal
}  // namespace tandem::metrics
