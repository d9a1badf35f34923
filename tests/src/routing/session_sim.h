#pragma once
// A small decode-cluster model for the routing scenario tests: each decode
// worker has a KV pool of a fixed number of blocks and keeps sessions
// resident after their turn, evicting whole sessions least-recently-used
// first when a new one does not fit. Every change is published to a
// ClusterState as the worker-state stream would (snapshot, then deltas), so
// policies read exactly what a router reads.
//
// Turns are synchronous: serve() runs a turn to completion. Load (running
// requests) is set by the test where a scenario needs it.

#include <gtest/gtest.h>

#include <algorithm>
#include <list>
#include <map>
#include <string>
#include <vector>

#include "src/routing/cluster_state.h"
#include "src/routing/route_request.h"
#include "tests/src/routing/routing_test_util.h"

namespace tandem::routing::test_util {

class SessionSim {
 public:
  struct Options {
    int num_decode = 4;
    int64_t blocks_per_decode = 1000;
    int num_prefill = 1;
  };

  explicit SessionSim(Options o) {
    for (int p = 0; p < o.num_prefill; ++p)
      addWorker(cluster_, {.name = "p" + std::to_string(p), .role = WorkerRole::kPrefill});
    for (int d = 0; d < o.num_decode; ++d) {
      Decode w{.name = "d" + std::to_string(d), .capacity = o.blocks_per_decode};
      addWorker(cluster_, {.name = w.name, .total_blocks = w.capacity});
      decode_.push_back(std::move(w));
    }
  }

  ClusterState& cluster() { return cluster_; }
  std::vector<std::string> decodeNames() const {
    std::vector<std::string> out;
    for (const auto& d : decode_) out.push_back(d.name);
    return out;
  }

  bool isResident(const std::string& decode, const SessionId& session) const {
    const Decode& d = find(decode);
    return std::find(d.lru.begin(), d.lru.end(), session) != d.lru.end();
  }
  // Resident there with its latest turn (an older copy elsewhere does not count).
  bool holdsLatest(const std::string& decode, const SessionId& session) const {
    auto it = last_served_on_.find(session);
    return isResident(decode, session) && it != last_served_on_.end() && it->second == decode;
  }

  // Runs the request's turn on `decode` to completion. The session's KV (its
  // prompt blocks) stays resident unless keep_resident is false. Returns
  // whether the session's latest turn was resident there before this turn
  // (the direct path).
  bool serve(const std::string& decode, const RouteRequest& r, bool keep_resident = true) {
    Decode& d = find(decode);
    ++d.num_served;
    if (!r.session) return false;
    const SessionId& s = *r.session;
    const bool was_resident = holdsLatest(decode, s);
    if (isResident(decode, s)) drop(d, s);
    last_served_on_[s] = decode;
    if (keep_resident) {
      const auto need = static_cast<int64_t>(r.prompt_hashes.size());
      while (d.used + need > d.capacity && !d.lru.empty()) drop(d, d.lru.front());  // evict LRU sessions
      if (d.used + need <= d.capacity) {
        d.lru.push_back(s);
        d.blocks[s] = r.prompt_hashes;
        d.used += need;
        publish(d, SessionStored{resident(s.value(), r.prompt_hashes)});
      }
    }
    publishLoad(d);
    return was_resident;
  }

  // The reported number of running requests (a scenario's background load).
  void setRunning(const std::string& decode, int64_t running) {
    Decode& d = find(decode);
    d.running = running;
    publishLoad(d);
  }

  int numServed(const std::string& decode) const { return find(decode).num_served; }
  int64_t numResident(const std::string& decode) const { return static_cast<int64_t>(find(decode).lru.size()); }

 private:
  struct Decode {
    std::string name;
    int64_t capacity = 0;
    int64_t used = 0;
    int64_t running = 0;
    uint64_t seq = 0;
    int num_served = 0;
    std::list<SessionId> lru;  // least recently used first
    std::map<SessionId, std::vector<BlockHash>> blocks;
  };

  Decode& find(const std::string& name) {
    return *std::find_if(decode_.begin(), decode_.end(), [&](const Decode& d) { return d.name == name; });
  }
  const Decode& find(const std::string& name) const {
    return *std::find_if(decode_.begin(), decode_.end(), [&](const Decode& d) { return d.name == name; });
  }

  // `s` by value: callers pass d.lru.front(), which remove() frees.
  void drop(Decode& d, SessionId s) {
    d.lru.remove(s);
    d.used -= static_cast<int64_t>(d.blocks[s].size());
    d.blocks.erase(s);
    publish(d, SessionRemoved{s});
  }

  void publishLoad(Decode& d) {
    publish(d, WorkerLoad{.free_blocks = d.capacity - d.used, .total_blocks = d.capacity, .running = d.running});
  }

  void publish(Decode& d, WorkerDeltaBody body) {
    ASSERT_TRUE(cluster_.applyDelta(d.name, {.epoch = 1, .seq = ++d.seq, .body = std::move(body)}).ok());
  }

  ClusterState cluster_;
  std::vector<Decode> decode_;
  std::map<SessionId, std::string> last_served_on_;
};

// Agentic session traffic: turn t of session k has the prompt
// system(system_blocks) ++ session k's own chain of (t + 1) * append_blocks.
struct SessionTraffic {
  int system_blocks = 64;
  int append_blocks = 8;
  int output_tokens = 128;

  std::vector<BlockHash> system() const { return chain(1'000'000, system_blocks); }
  RouteRequest turn(int session, int t) const {
    auto hashes = concat(system(), chain(10'000'000 * static_cast<uint64_t>(session + 1), (t + 1) * append_blocks));
    return request("s" + std::to_string(session), std::move(hashes), 5, output_tokens);
  }
};

// Per-session share of turns >= 1 that landed where the session was resident.
class DirectShare {
 public:
  void record(const RouteRequest& r, int turn, bool was_resident) {
    if (turn == 0) return;
    auto& [hits, total] = per_session_[r.session->value()];
    hits += was_resident ? 1 : 0;
    ++total;
  }
  double overall() const {
    int hits = 0, total = 0;
    for (const auto& [s, ht] : per_session_) hits += ht.first, total += ht.second;
    return total == 0 ? 0 : static_cast<double>(hits) / total;
  }
  double minPerSession() const {
    double m = 1;
    for (const auto& [s, ht] : per_session_) m = std::min(m, static_cast<double>(ht.first) / ht.second);
    return m;
  }
  int sessionsAtZero() const {
    int n = 0;
    for (const auto& [s, ht] : per_session_) n += ht.first == 0 ? 1 : 0;
    return n;
  }

 private:
  std::map<std::string, std::pair<int, int>> per_session_;
};

// Routes `r` with `policy` as a router does (in-flight while it runs) and
// serves it in `sim`. Returns the decision; `was_resident` says whether the
// session was resident on the chosen D before the turn.
inline Decision routeAndServe(Policy& policy, SessionSim& sim, InFlight& in_flight, const RouteRequest& r,
                              bool& was_resident) {
  Decision d = mustRoute(policy, r, sim.cluster(), in_flight);
  in_flight.add(d);
  policy.onAssigned(r, d);
  was_resident = sim.serve(d.decode, r);
  in_flight.remove(d);
  policy.onFinished(r, d);
  return d;
}

}  // namespace tandem::routing::test_util
