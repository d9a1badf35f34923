#pragma once
// Per-request trace: one JSON line per finished request, the schema in
// docs/trace-schema.md. Written to a file (appended) or stdout.
// Thread-safe: lines from concurrent requests never interleave.

#include <cstdio>
#include <memory>
#include <mutex>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "engine/sched/request.h"
#include "src/common/status.h"

namespace tandem::agent {

struct PdTimings;  // pd_timings.h

struct TraceContext {
  std::string request_id;  // the API id (cmpl-…, chatcmpl-…)
  std::string model;
  std::string role;
  std::string worker;
  std::string path = "direct";
  const PdTimings* kv = nullptr;  // phases of a disaggregated request (D side)
  std::string prefill_peer;       // D: the prefill agent that served it ("HOST:PORT"; empty: none)
  std::string moved_from_peer;    // D: the prefill agent it was moved off before it accepted (empty: none)
};

// The trace record of one finished request.
nlohmann::json traceRecord(const TraceContext& ctx, const engine::RequestUpdate& u, const std::string& session);

class TraceWriter {
 public:
  // "-" is stdout; anything else a file opened for appending.
  static absl::StatusOr<std::unique_ptr<TraceWriter>> open(const std::string& target);
  ~TraceWriter();
  void write(const nlohmann::json& record);

 private:
  TraceWriter(std::FILE* f, bool owned) : file_(f), owned_(owned) {}
  std::mutex mu_;
  std::FILE* file_;
  bool owned_;
};

}  // namespace tandem::agent
