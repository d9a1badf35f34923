// ./tandem bench router: the routing policy's decision latency and the
// worker-state ingestion rate of ClusterState (issue 14: decision p50 <= 10 us
// and p99 <= 50 us at 64 workers / 100K cached blocks; ingestion >= 1M block
// events/s on one core).
//
// Workload (synthetic, shaped like coding-agent sessions): every worker holds
// a shared system prompt of 256 blocks; sessions of L blocks each are
// resident on the decode workers (L chosen so that the distinct hashes reach
// the target count); requests are half turns of a resident session (its chain
// + 4 new blocks) and half new sessions (system prompt + 16 new blocks).
// Prefill workers: one per 8 decode workers.
//
// Latency percentiles are per-call steady-clock times; rates (decisions/s,
// block events/s) are per second of this thread's CPU time (see
// threadCpuSeconds), so that other work on a shared machine does not count.
//
// Yardsticks, measured in the same run: for decisions, a least-load decision
// (scan the same ClusterState for the decode worker with the fewest running
// + waiting requests: no cache lookups); for ingestion, the same hashes
// inserted into and erased from one bare absl::flat_hash_map.

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "bench/bench_report.h"
#include "src/routing/cluster_state.h"
#include "src/routing/in_flight.h"
#include "src/routing/tandem_policy.h"

namespace tandem::routing {
namespace {

constexpr int kBlockSize = 16;
constexpr int kSystemBlocks = 256;
constexpr uint64_t kSystemBase = 1ull << 40;

struct Setup {
  ClusterState cluster;
  std::vector<RouteRequest> requests;
};

std::vector<BlockHash> chain(uint64_t first, int n) {
  std::vector<BlockHash> out(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) out[static_cast<size_t>(i)] = BlockHash(first + static_cast<uint64_t>(i));
  return out;
}

WorkerSnapshot worker(const std::string& name, WorkerRole role, std::mt19937_64& rng) {
  WorkerSnapshot s;
  s.worker = name;
  s.role = role;
  s.epoch = 1;
  s.block_size = kBlockSize;
  s.load = {.free_blocks = 50000,
            .total_blocks = 100000,
            .running = static_cast<int64_t>(rng() % 8),
            .waiting = static_cast<int64_t>(rng() % 3),
            .waiting_prompt_tokens = static_cast<int64_t>(rng() % 8192)};
  s.cached = chain(kSystemBase, kSystemBlocks);
  return s;
}

void build(Setup& setup, int num_workers, int target_hashes, int num_requests) {
  std::mt19937_64 rng(42);
  const int session_blocks = std::clamp((target_hashes - kSystemBlocks) / (2 * num_workers), 8, 512);
  const int num_sessions = (target_hashes - kSystemBlocks) / session_blocks;
  std::vector<WorkerSnapshot> decode;
  for (int w = 0; w < num_workers; ++w) decode.push_back(worker("d" + std::to_string(w), WorkerRole::kDecode, rng));
  for (int k = 0; k < num_sessions; ++k) {
    auto hashes = chain(static_cast<uint64_t>(k) << 20, session_blocks);
    decode[static_cast<size_t>(k % num_workers)].sessions.push_back(
        {.session = SessionId("s" + std::to_string(k)), .hashes = hashes, .num_tokens = session_blocks * kBlockSize});
  }
  for (auto& s : decode) (void)setup.cluster.applySnapshot(s);
  for (int p = 0; p < std::max(1, num_workers / 8); ++p) {
    (void)setup.cluster.applySnapshot(worker("p" + std::to_string(p), WorkerRole::kPrefill, rng));
  }
  uint64_t fresh = 1ull << 50;
  for (int i = 0; i < num_requests; ++i) {
    RouteRequest r;
    if (i % 2 == 0) {
      int k = static_cast<int>(rng() % static_cast<uint64_t>(num_sessions));
      r.session = SessionId("s" + std::to_string(k));
      r.prompt_hashes = chain(static_cast<uint64_t>(k) << 20, session_blocks + 4);
    } else {
      r.session = SessionId("new" + std::to_string(i));
      r.prompt_hashes = chain(kSystemBase, kSystemBlocks);
      auto tail = chain(fresh, 16);
      fresh += 16;
      r.prompt_hashes.insert(r.prompt_hashes.end(), tail.begin(), tail.end());
    }
    r.prompt_tokens = static_cast<int64_t>(r.prompt_hashes.size()) * kBlockSize + 7;
    r.expected_output_tokens = 256;
    setup.requests.push_back(std::move(r));
  }
}

struct Latency {
  double p50_us = 0, p99_us = 0;  // over requests, each its fastest of kRepeats decisions
  double raw_p99_us = 0;          // over every single decision
  double per_s = 0;
};

// Every request is decided once per pass, kRepeats passes in a row (a
// decision does not change state, so each pass takes the same paths, and
// between two decisions of one request all the others run, so its data is
// as cold each time). A request's cost is its fastest pass: the shared VM's
// interrupts and steal add ~25 us to a random ~1 % of multi-microsecond
// calls, which the raw p99 (over every decision) shows and the fastest pass
// removes, leaving what the data makes slow (a long chain, many holders).
constexpr int kRepeats = 3;

// This thread's CPU time, for throughput: on the shared 2-core machine other
// processes take the core for milliseconds at a time, and wall time over a
// long loop would measure them. (Per call it is no use: reading it costs
// about 2 us on these VMs, so percentiles use the steady clock, whose tail
// does include preemption on a loaded machine.)
double threadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Percentiles from per-call steady-clock time (each includes two clock
// reads, the same for the yardstick); throughput from one untimed pass over
// all requests, in CPU time.
template <typename Fn>
Latency measure(const std::vector<RouteRequest>& requests, Fn&& decide) {
  using Clock = std::chrono::steady_clock;
  for (size_t i = 0; i < std::min<size_t>(1000, requests.size()); ++i) decide(requests[i]);  // warm-up
  std::vector<double> fastest(requests.size(), 1e300), all;
  all.reserve(requests.size() * kRepeats);
  for (int pass = 0; pass < kRepeats; ++pass) {
    for (size_t i = 0; i < requests.size(); ++i) {
      auto t0 = Clock::now();
      decide(requests[i]);
      double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      all.push_back(us);
      fastest[i] = std::min(fastest[i], us);
    }
  }
  double start = threadCpuSeconds();
  for (const auto& r : requests) decide(r);
  double total_s = threadCpuSeconds() - start;
  std::sort(fastest.begin(), fastest.end());
  std::sort(all.begin(), all.end());
  return {.p50_us = fastest[fastest.size() / 2],
          .p99_us = fastest[fastest.size() * 99 / 100],
          .raw_p99_us = all[all.size() * 99 / 100],
          .per_s = static_cast<double>(requests.size()) / total_s};
}

// The yardstick decision: fewest running + waiting among decode workers.
const WorkerView* leastLoad(const ClusterState& c) {
  const WorkerView* best = nullptr;
  for (uint32_t s = 0; s < c.slotEnd(); ++s) {
    const WorkerView* w = c.worker(WorkerSlot(s));
    if (w == nullptr || !w->canDecode()) continue;
    if (best == nullptr || w->load.running + w->load.waiting < best->load.running + best->load.waiting) best = w;
  }
  return best;
}

void decisionResults(std::vector<bench::Result>& out) {
  for (int workers : {8, 64, 512}) {
    for (int hashes : {10'000, 100'000, 1'000'000}) {
      Setup setup;
      build(setup, workers, hashes, 20000);
      TandemPolicy policy;
      InFlight in_flight;
      volatile size_t sink = 0;
      Latency ours = measure(setup.requests, [&](const RouteRequest& r) {
        sink = sink + policy.route(r, setup.cluster, in_flight).index();
      });
      Latency base = measure(setup.requests, [&](const RouteRequest& r) {
        sink = sink + reinterpret_cast<uintptr_t>(leastLoad(setup.cluster));
      });
      std::string tag = "_w" + std::to_string(workers) + "_h" + std::to_string(hashes / 1000) + "k";
      std::printf("w=%d hashes=%zu (target %d)\n", workers, setup.cluster.numIndexedBlocks(), hashes);
      auto row = [&](std::string name, double value, const char* unit, double reference, const char* yardstick) {
        out.push_back(
            {.name = name + tag, .value = value, .unit = unit, .reference = reference, .reference_name = yardstick});
      };
      row("decision_p50", ours.p50_us, "us", base.p50_us, "least_load p50");
      row("decision_p99", ours.p99_us, "us", base.p99_us, "least_load p99");
      row("decision_raw_p99", ours.raw_p99_us, "us", base.raw_p99_us, "least_load raw p99");
      row("decisions_per_s", ours.per_s, "1/s", base.per_s, "least_load");
    }
  }
}

// Block events/s: 64 workers, each delta stores 64 new hashes; once 100K
// are live, each store is paired with the removal of an old batch.
void ingestionResult(std::vector<bench::Result>& out) {
  constexpr int kWorkers = 64, kBatch = 64, kBatches = 40000, kLive = 100'000 / kBatch;
  ClusterState cluster;
  std::mt19937_64 rng(7);
  for (int w = 0; w < kWorkers; ++w) {
    WorkerSnapshot s = worker("d" + std::to_string(w), WorkerRole::kDecode, rng);
    s.cached.clear();
    (void)cluster.applySnapshot(s);
  }
  std::vector<std::string> names;
  for (int w = 0; w < kWorkers; ++w) names.push_back("d" + std::to_string(w));
  std::vector<std::pair<int, WorkerDelta>> deltas;
  std::vector<uint64_t> seq(kWorkers, 0);
  int64_t events = 0;
  for (int b = 0; b < kBatches; ++b) {
    int w = b % kWorkers;
    deltas.push_back({w, {.epoch = 1, .seq = ++seq[w], .body = BlocksStored{chain(uint64_t(b) * kBatch, kBatch)}}});
    events += kBatch;
    if (b >= kLive) {
      int old = b - kLive, ow = old % kWorkers;
      deltas.push_back(
          {ow, {.epoch = 1, .seq = ++seq[ow], .body = BlocksRemoved{chain(uint64_t(old) * kBatch, kBatch)}}});
      events += kBatch;
    }
  }
  double t0 = threadCpuSeconds();
  for (const auto& [w, d] : deltas) (void)cluster.applyDelta(names[static_cast<size_t>(w)], d);
  double ours_s = threadCpuSeconds() - t0;

  absl::flat_hash_map<BlockHash, uint32_t> bare;
  t0 = threadCpuSeconds();
  for (const auto& [w, d] : deltas) {
    if (const auto* s = std::get_if<BlocksStored>(&d.body)) {
      for (BlockHash h : s->hashes) bare[h] = static_cast<uint32_t>(w);
    } else if (const auto* r = std::get_if<BlocksRemoved>(&d.body)) {
      for (BlockHash h : r->hashes) bare.erase(h);
    }
  }
  double bare_s = threadCpuSeconds() - t0;
  out.push_back({.name = "ingest_block_events_per_s",
                 .value = static_cast<double>(events) / ours_s,
                 .unit = "1/s",
                 .reference = static_cast<double>(events) / bare_s,
                 .reference_name = "bare flat_hash_map"});
}

}  // namespace
}  // namespace tandem::routing

int main(int argc, char** argv) {
  std::vector<tandem::bench::Result> results;
  tandem::routing::ingestionResult(results);
  tandem::routing::decisionResults(results);
  return tandem::bench::writeReport("router", results, argc, argv);
}
