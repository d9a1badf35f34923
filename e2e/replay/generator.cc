#include "e2e/replay/generator.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <ostream>
#include <vector>

#include "e2e/replay/rng.h"
#include "src/common/status.h"
#include "src/common/strings.h"

namespace tandem::replay {
namespace {

constexpr std::array<SessionShape, 3> kShapes = {{
    {"32K", 32768, 60, 608, 148},
    {"48K", 49152, 106, 474, 172},
    {"64K", 65536, 157, 429, 176},
}};
// Log-normal shapes: appends vary more (a file read vs a one-line reply) than answers.
constexpr double kAppendSigma = 0.8;
constexpr double kGenSigma = 0.5;

// One conversation's token stream and the block ids of its full blocks.
class SessionStream {
 public:
  SessionStream(const std::vector<uint64_t>& shared_ids, int64_t shared_tokens, uint64_t* next_id)
      : next_id_(next_id), length_(shared_tokens) {
    full_ids_.assign(shared_ids.begin(), shared_ids.begin() + shared_tokens / kTraceBlockTokens);
  }
  int64_t length() const { return length_; }
  void extend(int64_t tokens) {
    length_ += tokens;
    while (static_cast<int64_t>(full_ids_.size()) < length_ / kTraceBlockTokens) full_ids_.push_back((*next_id_)++);
  }
  // The ids of the stream as a prompt now: its full blocks, plus a fresh id
  // for a partial last block.
  std::vector<uint64_t> promptIds() {
    std::vector<uint64_t> ids = full_ids_;
    if (length_ % kTraceBlockTokens != 0) ids.push_back((*next_id_)++);
    return ids;
  }

 private:
  uint64_t* next_id_;
  int64_t length_;
  std::vector<uint64_t> full_ids_;
};

int64_t drawTokens(Rng& rng, double mean, double sigma) {
  return std::max<int64_t>(1, std::llround(rng.lognormal(mean, sigma)));
}

// One session's turns, with timestamps relative to the session's start.
std::vector<TraceRequest> generateSession(int index, const GeneratorOptions& o, const std::vector<uint64_t>& shared,
                                          uint64_t* next_id, Rng& rng) {
  const SessionShape& shape = o.shape;
  const int min_turns = std::max(1, static_cast<int>(std::ceil(shape.mean_turns / 2)));
  const int max_turns = std::max(min_turns, static_cast<int>(std::floor(shape.mean_turns * 3 / 2)));
  const int turns = min_turns + static_cast<int>(rng.next() % static_cast<uint64_t>(max_turns - min_turns + 1));
  SessionStream stream(shared, o.system_prompt_tokens, next_id);
  std::vector<TraceRequest> out;
  double t_s = 0;
  for (int k = 0; k < turns; ++k) {
    int64_t append = drawTokens(rng, shape.mean_append_tokens, kAppendSigma);
    int64_t gen = drawTokens(rng, shape.mean_gen_tokens, kGenSigma);
    if (stream.length() + append + gen > shape.max_len_tokens) {
      if (!out.empty()) break;
      // Every session has a first turn: shrink it to fit (room >= 2 tokens, validated).
      const int64_t room = shape.max_len_tokens - stream.length();
      gen = std::min(gen, room / 2);
      append = room - gen;
    }
    stream.extend(append);
    TraceRequest r;
    r.timestamp_ms = t_s * 1000;
    r.input_length = stream.length();
    r.output_length = gen;
    r.hash_ids = stream.promptIds();
    r.session = SessionId(strCat("session-", index));
    out.push_back(std::move(r));
    stream.extend(gen);
    const double tool = o.min_tool_time_s + rng.exponential(o.tool_time_s - o.min_tool_time_s);
    t_s += static_cast<double>(gen) / o.decode_tokens_per_s + tool;
  }
  return out;
}

absl::Status validate(const GeneratorOptions& o) {
  if (o.num_sessions < 1) return absl::InvalidArgumentError("--sessions must be >= 1");
  if (o.system_prompt_tokens < 0 || o.system_prompt_tokens + 2 > o.shape.max_len_tokens) {
    return absl::InvalidArgumentError(strCat("--system-tokens must be between 0 and ", o.shape.max_len_tokens - 2));
  }
  if (!(o.active_sessions > 0)) return absl::InvalidArgumentError("--active must be > 0");
  if (!(o.min_tool_time_s >= 0) || !(o.tool_time_s >= o.min_tool_time_s)) {
    return absl::InvalidArgumentError(strCat("--tool-s must be >= the minimum tool time, ", o.min_tool_time_s, " s"));
  }
  if (!(o.decode_tokens_per_s > 0)) return absl::InvalidArgumentError("decode tokens/s must be > 0");
  return absl::OkStatus();
}

}  // namespace

std::optional<SessionShape> findSessionShape(std::string_view name) {
  for (const SessionShape& s : kShapes) {
    if (s.name == name) return s;
  }
  return std::nullopt;
}

absl::StatusOr<Trace> generateSessions(const GeneratorOptions& o) {
  TANDEM_RETURN_IF_ERROR(validate(o));
  Rng rng(o.seed);
  uint64_t next_id = 0;
  std::vector<uint64_t> shared;
  for (int64_t i = 0; i < o.system_prompt_tokens / kTraceBlockTokens; ++i) shared.push_back(next_id++);

  std::vector<std::vector<TraceRequest>> sessions;
  double total_duration_s = 0;
  for (int i = 0; i < o.num_sessions; ++i) {
    sessions.push_back(generateSession(i, o, shared, &next_id, rng));
    total_duration_s += sessions.back().back().timestamp_ms / 1000;
  }
  // Starts staggered so that about active_sessions overlap: a session lasts
  // the mean duration, and one starts every mean / active seconds.
  const double stagger_s = total_duration_s / o.num_sessions / o.active_sessions;
  Trace trace;
  for (int i = 0; i < o.num_sessions; ++i) {
    const double start_ms = std::round((i + rng.uniform()) * stagger_s * 1000);
    for (TraceRequest& r : sessions[i]) {
      r.timestamp_ms = start_ms + std::round(r.timestamp_ms);
      trace.requests.push_back(std::move(r));
    }
  }
  std::stable_sort(trace.requests.begin(), trace.requests.end(),
                   [](const TraceRequest& a, const TraceRequest& b) { return a.timestamp_ms < b.timestamp_ms; });
  return trace;
}

void writeTrace(const Trace& trace, std::ostream& out) {
  for (const TraceRequest& r : trace.requests) out << formatTraceLine(r) << '\n';
}

}  // namespace tandem::replay
