#pragma once
// The prefill role's P/D service (DESIGN.md §2-§3, docs/pd.md).
//
// Listens on the KV port. For each PrefillRequest it runs a leased prefill
// in its engine, answers PrefillAccepted with the blocks that will hold the
// prompt's KV, sends LayerReady (with a checksum per block) as each layer is
// written, then PrefillDone with the first token. The KV stays pinned until
// D's Release, D's Abort, D's disconnect, or lease expiry: a dead D cannot
// leak P memory.
//
// Thread-safety: public methods may be called from any thread; transport
// callbacks run on the transport's thread, engine callbacks on the loop's.

#include <functional>
#include <memory>

#include "agent/pd_transport.h"
#include "engine/engine_loop.h"

namespace tandem::agent {

class PrefillService {
 public:
  // `on_finished` (optional) sees the final update of every prefill, on the
  // engine thread, for the agent's request metrics and traces.
  static absl::StatusOr<std::unique_ptr<PrefillService>> start(
      const PdEnv& env, const PdOptions& options,
      std::function<void(const engine::RequestUpdate&)> on_finished = nullptr);
  // Stops sending and shuts the transport down (no callback after it).
  ~PrefillService();
  int port() const;

  struct Impl;

 private:
  explicit PrefillService(std::shared_ptr<Impl> impl);
  // Shared with the engine requests' callbacks, which may run after this
  // service is gone (the engine loop ends its requests when it stops).
  std::shared_ptr<Impl> impl_;
};

}  // namespace tandem::agent
