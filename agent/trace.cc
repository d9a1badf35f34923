#include "agent/trace.h"

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "agent/pd_timings.h"
#include "src/common/strings.h"

namespace tandem::agent {
namespace {

double ms(Duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

}  // namespace

nlohmann::json traceRecord(const TraceContext& ctx, const engine::RequestUpdate& u, const std::string& session) {
  using nlohmann::json;
  auto span = [](const std::optional<MonoTime>& a, const std::optional<MonoTime>& b) -> json {
    if (!a || !b) return nullptr;
    return ms(*b - *a);
  };
  json tpot = nullptr;
  if (u.first_token && u.finished_at && u.num_output_tokens > 1) {
    tpot = ms(*u.finished_at - *u.first_token) / (u.num_output_tokens - 1);
  }
  return json{{"request_id", ctx.request_id},
              {"session", session.empty() ? json(nullptr) : json(session)},
              {"model", ctx.model},
              {"prompt_tokens", u.num_prompt_tokens},
              {"cached_tokens", u.num_cached_tokens},
              {"output_tokens", u.num_output_tokens},
              {"reserved_kv_tokens", u.num_reserved_tokens},
              {"queue_ms", span(u.arrival, u.first_scheduled)},
              {"prefill_ms", span(u.first_scheduled, u.first_token)},
              {"decode_ms", span(u.first_token, u.finished_at)},
              {"ttft_ms", span(u.arrival, u.first_token)},
              {"tpot_ms", tpot},
              {"e2e_ms", span(u.arrival, u.finished_at)},
              {"finish_reason", std::string(engine::finishReasonName(u.finish_reason))},
              {"reject_reason", u.reject_reason == engine::RejectReason::kNone
                                    ? json(nullptr)
                                    : json(std::string(engine::rejectReasonName(u.reject_reason)))},
              {"role", ctx.role},
              {"worker", ctx.worker},
              {"path", ctx.path},
              {"kv_blocks_peak", u.kv_blocks_peak},
              {"preemptions", u.num_preemptions},
              {"kv_prefill_ms", ctx.kv ? json(ctx.kv->prefill_ms) : json(nullptr)},
              {"kv_transfer_ms", ctx.kv ? json(ctx.kv->transfer_ms) : json(nullptr)},
              {"kv_transfer_hidden_ms", ctx.kv ? json(ctx.kv->transfer_hidden_ms) : json(nullptr)},
              {"kv_first_step_ms", ctx.kv ? json(ctx.kv->first_step_ms) : json(nullptr)},
              {"prefill_peer", ctx.prefill_peer.empty() ? json(nullptr) : json(ctx.prefill_peer)},
              {"moved_from_peer", ctx.moved_from_peer.empty() ? json(nullptr) : json(ctx.moved_from_peer)}};
}

absl::StatusOr<std::unique_ptr<TraceWriter>> TraceWriter::open(const std::string& target) {
  if (target == "-") return std::unique_ptr<TraceWriter>(new TraceWriter(stdout, false));
  std::FILE* f = std::fopen(target.c_str(), "a");
  if (f == nullptr) return absl::InvalidArgumentError(strCat("trace file ", target, ": ", std::strerror(errno)));
  return std::unique_ptr<TraceWriter>(new TraceWriter(f, true));
}

TraceWriter::~TraceWriter() {
  if (owned_) std::fclose(file_);
  else std::fflush(file_);
}

void TraceWriter::write(const nlohmann::json& record) {
  std::string line = record.dump();
  line.push_back('\n');
  std::lock_guard lock(mu_);
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);
}

}  // namespace tandem::agent
