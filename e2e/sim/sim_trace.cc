#include "e2e/sim/sim_trace.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <istream>

#include "src/common/status.h"
#include "src/common/strings.h"

namespace tandem::sim {
namespace {

// Days since 1970-01-01 of a civil date (proleptic Gregorian).
int64_t daysFromCivil(int64_t y, int64_t m, int64_t d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

template <typename T>
bool number(std::string_view s, T& out) {
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && ptr == s.data() + s.size() && !s.empty();
}

// "YYYY-MM-DD HH:MM:SS[.fffffff]" as whole seconds since the epoch and
// the fraction (kept apart: a double of epoch seconds loses microseconds).
struct Timestamp {
  int64_t seconds = 0;
  double fraction = 0;
  double since(const Timestamp& o) const { return static_cast<double>(seconds - o.seconds) + (fraction - o.fraction); }
};
std::optional<Timestamp> parseTimestamp(std::string_view s) {
  if (s.size() < 19 || s[4] != '-' || s[7] != '-' || s[10] != ' ' || s[13] != ':' || s[16] != ':') return std::nullopt;
  int64_t y, mo, d, h, mi, sec;
  if (!number(s.substr(0, 4), y) || !number(s.substr(5, 2), mo) || !number(s.substr(8, 2), d) ||
      !number(s.substr(11, 2), h) || !number(s.substr(14, 2), mi) || !number(s.substr(17, 2), sec)) {
    return std::nullopt;
  }
  if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60) return std::nullopt;
  double frac = 0;
  if (s.size() > 19) {
    if (s[19] != '.' || s.size() == 20) return std::nullopt;
    double scale = 0.1;
    for (char c : s.substr(20)) {
      if (c < '0' || c > '9') return std::nullopt;
      frac += (c - '0') * scale;
      scale /= 10;
    }
  }
  return Timestamp{daysFromCivil(y, mo, d) * 86400 + h * 3600 + mi * 60 + sec, frac};
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.back() == '\r' || s.back() == ' ')) s.remove_suffix(1);
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  return s;
}

}  // namespace

absl::StatusOr<replay::Trace> parseAzureTrace(std::istream& in, std::string_view source) {
  replay::Trace trace;
  std::string line;
  int64_t n = 0;
  std::optional<Timestamp> first;
  uint64_t next_id = 0;
  auto error = [&](std::string_view column, std::string_view what) {
    return absl::InvalidArgumentError(strCat(source, ":", n, ": ", column, ": ", what));
  };
  while (std::getline(in, line)) {
    ++n;
    const std::string_view l = trim(line);
    if (n == 1) {
      if (l != "TIMESTAMP,ContextTokens,GeneratedTokens") {
        return error("header", strCat("expected 'TIMESTAMP,ContextTokens,GeneratedTokens', got '", l, "'"));
      }
      continue;
    }
    if (l.empty()) continue;
    const size_t c1 = l.find(','), c2 = c1 == std::string_view::npos ? c1 : l.find(',', c1 + 1);
    if (c2 == std::string_view::npos || l.find(',', c2 + 1) != std::string_view::npos) {
      return error("row", strCat("expected 3 comma-separated columns, got '", l, "'"));
    }
    const std::optional<Timestamp> t = parseTimestamp(trim(l.substr(0, c1)));
    if (!t) return error("TIMESTAMP", strCat("not 'YYYY-MM-DD HH:MM:SS[.fraction]': '", l.substr(0, c1), "'"));
    int64_t context = 0, generated = 0;
    if (!number(trim(l.substr(c1 + 1, c2 - c1 - 1)), context) || context < 1 || context > (int64_t{1} << 31) - 1) {
      return error("ContextTokens", strCat("must be an integer between 1 and 2^31-1, got '",
                                           l.substr(c1 + 1, c2 - c1 - 1), "'"));
    }
    if (!number(trim(l.substr(c2 + 1)), generated) || generated < 0 || generated > (int64_t{1} << 31) - 1) {
      return error("GeneratedTokens", strCat("must be an integer between 0 and 2^31-1, got '", l.substr(c2 + 1), "'"));
    }
    if (!first) first = *t;
    replay::TraceRequest r;
    r.timestamp_ms = std::max(0.0, t->since(*first) * 1000);
    r.input_length = context;
    r.output_length = std::max<int64_t>(1, generated);
    const int64_t blocks = (context + replay::kTraceBlockTokens - 1) / replay::kTraceBlockTokens;
    for (int64_t b = 0; b < blocks; ++b) r.hash_ids.push_back(next_id++);
    trace.requests.push_back(std::move(r));
  }
  if (in.bad()) return absl::DataLossError(strCat(source, ": read failed"));
  if (n == 0) return error("header", "the file is empty");
  std::stable_sort(trace.requests.begin(), trace.requests.end(),
                   [](const auto& a, const auto& b) { return a.timestamp_ms < b.timestamp_ms; });
  return trace;
}

absl::StatusOr<replay::Trace> readAzureTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(strCat(path, ": cannot open"));
  return parseAzureTrace(in, path);
}

replay::Trace scaleLoad(const replay::Trace& trace, int k, double stagger_ms) {
  if (k <= 1) return trace;
  uint64_t max_id = 0;
  for (const replay::TraceRequest& r : trace.requests) {
    for (uint64_t id : r.hash_ids) max_id = std::max(max_id, id);
  }
  replay::Trace out;
  out.requests.reserve(trace.requests.size() * static_cast<size_t>(k));
  for (const replay::TraceRequest& r : trace.requests) {
    for (int i = 0; i < k; ++i) {
      replay::TraceRequest c = r;
      c.timestamp_ms += i * stagger_ms;
      for (uint64_t& id : c.hash_ids) id += static_cast<uint64_t>(i) * (max_id + 1);
      if (c.session && i > 0) c.session = SessionId(strCat(c.session->value(), "#", i));
      out.requests.push_back(std::move(c));
    }
  }
  std::stable_sort(out.requests.begin(), out.requests.end(),
                   [](const auto& a, const auto& b) { return a.timestamp_ms < b.timestamp_ms; });
  return out;
}

}  // namespace tandem::sim
