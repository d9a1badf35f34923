#pragma once
// A KvTransport that injects faults in front of a real one (tests only; the
// production agent never links this). Each fault acts on the real path
// through the transport seam, not on a mock:
//
//   layer_delay         P: each LayerReady the service sends leaves this much later
//                       (the KV is ready; D just learns late)
//   get_delay           D: each get is issued this much later (a slow reader); it
//                       counts as outstanding meanwhile and can be cancelled
//   get_complete_delay  D: each get's completion is handed to the service this much
//                       later, so the get stays outstanding (its blocks must not be
//                       freed meanwhile); logs "held a get completion" once per get
//   fail_first_transfers  P: the first N PrefillRequests are answered with an Abort
//                       (transfer_failed) instead of reaching the service
//   stall_first_transfers  P: the first N transfers it accepts never deliver: their
//                       LayerReady and PrefillDone are dropped (P still answers
//                       heartbeats and frees the KV on D's Abort or its lease)
//
// Delays run on the injected clock (tests in one process use a FakeClock;
// tandem-agent-faults, the agent's test build, the system clock). Callbacks
// never run inline in a command, as the KvTransport contract requires.
// Thread-safe.

#include <memory>

#include "agent/transport/kv_transport.h"
#include "src/common/clock.h"

namespace tandem::agent::testing {

struct FaultOptions {
  Duration layer_delay{0};
  Duration get_delay{0};
  Duration get_complete_delay{0};
  int fail_first_transfers = 0;
  int stall_first_transfers = 0;

  bool any() const {
    return layer_delay.count() > 0 || get_delay.count() > 0 || get_complete_delay.count() > 0 ||
           fail_first_transfers > 0 || stall_first_transfers > 0;
  }
};

// Starts transports with `inner` and puts the faults in front of them.
// `clock` is not owned and must outlive every transport started.
transport::KvTransportFactory faultInjectingTransport(FaultOptions options, const Clock& clock,
                                                      transport::KvTransportFactory inner);

}  // namespace tandem::agent::testing
