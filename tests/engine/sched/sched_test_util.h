#pragma once
// A scheduler on a real BlockManager and SessionStore, with no model: tests
// build Sequences directly, call schedule(), and stand in for the engine's
// run and postprocess with advance() (chunks computed, full blocks
// committed, one token "sampled" where a chunk reached the end).

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "engine/kv/block_manager.h"
#include "engine/kv/session_store.h"
#include "engine/sched/scheduler.h"
#include "engine/sched/sequence.h"

namespace tandem::engine::testing {

class SchedulerHarness {
 public:
  static constexpr int kBlockSize = 4;

  explicit SchedulerHarness(int num_blocks, SchedulerOptions options = {})
      : blocks(num_blocks), sessions(blocks), scheduler(withBlockSize(options), blocks, sessions) {}

  // A waiting sequence of `prompt_len` tokens (distinct from every other
  // sequence's, so nothing is shared by the prefix cache unless `tokens` is
  // given) reserving `reserved_tokens` (prompt + expected output).
  Sequence* add(int prompt_len, int reserved_tokens, RequestSpec spec = {}, std::vector<TokenId> tokens = {}) {
    const int id = static_cast<int>(seqs.size()) + 1;
    auto seq = std::make_unique<Sequence>(RequestId(static_cast<uint64_t>(id)), std::move(spec), kBlockSize);
    if (tokens.empty()) {
      for (int i = 0; i < prompt_len; ++i) tokens.push_back(id * 1000 + i);
    }
    seq->tokens = std::move(tokens);
    seq->num_prompt_tokens = static_cast<int>(seq->tokens.size());
    seq->reserved_tokens = reserved_tokens;
    seq->chain.append(seq->tokens);
    scheduler.addWaiting(seq.get());
    seqs.push_back(std::move(seq));
    return seqs.back().get();
  }

  // schedule() plus the pool's invariants.
  ScheduleResult schedule() {
    ScheduleResult r = scheduler.schedule();
    absl::Status inv = blocks.checkInvariants();
    EXPECT_TRUE(inv.ok()) << inv;
    return r;
  }

  // What the engine does after the model ran the result's chunks.
  void advance(const ScheduleResult& r) {
    for (const ScheduledChunk& c : r.chunks) {
      Sequence* s = c.seq;
      s->num_computed += c.num_tokens;
      scheduler.commitComputedBlocks(s);
      if (s->num_computed == static_cast<int>(s->tokens.size())) {
        s->tokens.push_back(7);
        s->chain.append(std::span<const TokenId>(&s->tokens.back(), 1));
      }
    }
  }

  // One step: schedule, then advance.
  ScheduleResult step() {
    ScheduleResult r = schedule();
    advance(r);
    return r;
  }

  // Makes `tokens` resident under `id`, in newly allocated blocks.
  void putSession(const char* id, std::vector<TokenId> tokens) {
    ResidentSession s;
    const int n = (static_cast<int>(tokens.size()) + kBlockSize - 1) / kBlockSize;
    for (int i = 0; i < n; ++i) s.blocks.push_back(blocks.allocate());
    s.tokens = std::move(tokens);
    sessions.put(SessionId(id), std::move(s));
  }

  static int chunkOf(const ScheduleResult& r, const Sequence* s) {
    for (const ScheduledChunk& c : r.chunks) {
      if (c.seq == s) return c.num_tokens;
    }
    return 0;
  }

  BlockManager blocks;
  SessionStore sessions;
  Scheduler scheduler;
  std::vector<std::unique_ptr<Sequence>> seqs;  // after scheduler: it holds raw pointers

 private:
  static SchedulerOptions withBlockSize(SchedulerOptions o) {
    o.block_size = kBlockSize;
    return o;
  }
};

}  // namespace tandem::engine::testing
