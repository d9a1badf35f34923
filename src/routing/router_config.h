#pragma once
// Every weight and threshold of the "tandem" routing policy, with its
// default. docs/routing.md explains each; tests/src/routing/tandem_policy_knobs_test.cc
// shows what each one does.
//
// A decode worker's score (higher wins), among the feasible ones:
//   overlap_weight    * (prompt blocks it holds, as a prefix) / (prompt blocks)
// + sticky_weight     * [the request's session is resident on it]
// + load_floor_weight * clamp((mean - assigned) / mean, 0, 1)   [requests with a session id, unless
//                                                                 load_floor_without_session; never when the
//                                                                 session is resident elsewhere]
// - queue_penalty     * (its waiting requests + the router's own in-flight ones)
// where `assigned` = resident sessions + running + waiting + in-flight requests,
// and `mean` is its average over the feasible decode workers.

#include <cstdint>

#include "absl/status/status.h"

namespace tandem::routing {

struct RouterConfig {
  // --- decode worker score ---
  double overlap_weight = 1.0;     // full prefix held = +1.0
  double sticky_weight = 2.0;      // the session's KV is resident there
  double load_floor_weight = 1.5;  // an idle worker when the mean is > 0: +1.5, graduated to 0 at the mean
  // The bonus spreads sessions (whose KV then stays where they land); a
  // request without a session id gets it only when this is set. Without
  // it such requests follow their prefix, balanced by the queue penalty and
  // the least-loaded miss: on a session-less trace the bonus (up to 1.5)
  // outweighs a whole-prompt overlap (1.0) and halves cache hits.
  bool load_floor_without_session = false;
  double queue_penalty = 0.1;  // per queued request (reported waiting + router in-flight)
  // Scores within this of the best are equally good: the session id's
  // rendezvous hash picks among them, so replicas agree (docs/routing.md).
  double tie_epsilon = 0.05;

  // --- miss ---
  // A request is a miss when no fresh worker holds at least this many of its
  // leading blocks and its session is resident nowhere: it goes to the
  // least-loaded feasible worker (by `assigned`, then free KV).
  int64_t miss_max_blocks = 0;

  // --- path ---
  // Direct-to-D when the session is resident on the chosen D and the prompt
  // tokens D does not hold are at most this many; otherwise a P computes it.
  int64_t direct_max_suffix_tokens = 2048;

  // --- prefill worker ---
  // A P is overloaded when its queued prompt tokens (reported waiting plus
  // the router's in-flight prefill tokens) exceed this; overloaded P are
  // passed over while another is not. Derived from current load every
  // decision, so the mark clears as soon as the queue drains.
  int64_t prefill_overload_tokens = 65536;
  // P whose queued tokens are within this of the least-queued one are equally
  // loaded: among them the one holding the longest prompt prefix wins.
  int64_t prefill_balance_tokens = 2048;

  // --- rejections ---
  // After this many capacity rejections of one session (without a success
  // between), the session migrates: the decode workers that refused it are
  // excluded for its next request and its stickiness there is ignored.
  int capacity_rejections_to_migrate = 2;
};

// InvalidArgument naming the first knob out of range: a negative weight,
// epsilon or threshold, or capacity_rejections_to_migrate < 1.
absl::Status validateRouterConfig(const RouterConfig& config);

}  // namespace tandem::routing
