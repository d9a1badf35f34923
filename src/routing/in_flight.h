#pragma once
// The router's own assignments that the workers have not yet counted:
// requests it sent to a worker whose load report does not show them yet.
// Feasibility and scoring add these to the reported load at once, so a burst
// of requests spreads before the workers report back (issue 14, mode 5).
//
// The caller owns one InFlight next to its ClusterState: add() when it sends
// a decision, remove() when D has taken the request into its own accounting
// (admitted: its first token arrived) or the request ended or was refused;
// exactly one remove() per add(), with the same Decision.
// Not thread-safe; one owner (like ClusterState).

#include <cstdint>
#include <vector>

#include "src/routing/decision.h"
#include "src/routing/worker_ref.h"

namespace tandem::routing {

struct PendingLoad {
  int64_t requests = 0;
  int64_t blocks = 0;  // reserve_blocks of decisions naming it as D
  int64_t tokens = 0;  // prefill_tokens of decisions naming it as P (or as D on the direct path)
};

class InFlight {
 public:
  void add(const Decision& d);
  void remove(const Decision& d);
  // The pending load on the worker `ref` names; zero when the slot now holds
  // another worker (a newer generation) or nothing was sent to it.
  PendingLoad at(WorkerRef ref) const;

 private:
  struct Entry {
    uint32_t generation = 0;
    PendingLoad load;
  };
  Entry& entry(WorkerRef ref);
  std::vector<Entry> entries_;  // indexed by slot
};

}  // namespace tandem::routing
