#pragma once
// Where a disaggregated request's time to first token went, on D's clock
// (the decode side's TTFT phases: metrics and the trace line).

namespace tandem::agent {

struct PdTimings {
  double prefill_ms = 0;          // D asked P → P's last layer announcement arrived (P queue + compute)
  double transfer_ms = 0;         // time with at least one layer being pulled
  double transfer_hidden_ms = 0;  // of that, before P's last announcement: overlapped with P's compute
  double first_step_ms = 0;       // all KV in D → D emitted the first token
};

}  // namespace tandem::agent
