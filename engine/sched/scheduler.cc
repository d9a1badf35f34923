#include "engine/sched/scheduler.h"

#include <algorithm>

#include "src/common/check.h"

namespace tandem::engine {
namespace {

int ceilDiv(int a, int b) { return (a + b - 1) / b; }

}  // namespace

Scheduler::Scheduler(const SchedulerOptions& options, BlockManager& blocks, SessionStore& sessions)
    : options_(options), blocks_(blocks), sessions_(sessions) {}

int Scheduler::reservationBlocks(int reserved_tokens) const {
  return ceilDiv(std::min(reserved_tokens, options_.max_model_len), options_.block_size);
}

int Scheduler::admissionBlocks(const Sequence& seq) const {
  return std::max(reservationBlocks(seq.reserved_tokens),
                  ceilDiv(static_cast<int>(seq.tokens.size()), options_.block_size));
}

int Scheduler::outstandingReservation() const {
  int n = 0;
  for (const Sequence* s : running_) n += std::max(0, s->reserved_blocks - static_cast<int>(s->blocks.size()));
  return n;
}

void Scheduler::remove(Sequence* seq) { blocks_.releaseAll(detachBlocks(seq)); }

std::vector<BlockId> Scheduler::detachBlocks(Sequence* seq) {
  if (auto it = std::find(running_.begin(), running_.end(), seq); it != running_.end()) running_.erase(it);
  if (auto it = std::find(waiting_.begin(), waiting_.end(), seq); it != waiting_.end()) waiting_.erase(it);
  std::vector<BlockId> out;
  out.swap(seq->blocks);
  return out;
}

Scheduler::ReusePlan Scheduler::planReuse(const Sequence& seq, bool imports) const {
  const int bs = options_.block_size;
  const int n = static_cast<int>(seq.tokens.size());
  // At least one token must be computed to produce logits.
  const int cap = n - 1;
  ReusePlan plan;
  // The whole prompt arrives from the prefill agent. (Once it arrived the
  // request is an ordinary decode: a recompute after preemption reuses what
  // the import committed to the prefix cache.)
  if (imports && seq.numOutputTokens() == 0) return plan;
  if (seq.spec.session) {
    if (const ResidentSession* s = sessions_.find(*seq.spec.session)) {
      const int limit = std::min({static_cast<int>(s->tokens.size()), cap});
      int common = 0;
      while (common < limit && s->tokens[static_cast<size_t>(common)] == seq.tokens[static_cast<size_t>(common)])
        ++common;
      plan.common_tokens = common;
      plan.from_session = true;
      plan.reuse_blocks = ceilDiv(common, bs);
      if (common % bs != 0) {
        BlockId last = s->blocks[static_cast<size_t>(plan.reuse_blocks - 1)];
        plan.needs_copy = !blocks_.isWritable(last);
        // Not writable and held by the session alone: hashed, so the copy
        // hands it to the prefix cache's LRU.
        if (plan.needs_copy && blocks_.refCount(last) == 1) ++plan.blocks_returned;
      }
      for (size_t i = static_cast<size_t>(plan.reuse_blocks); i < s->blocks.size(); ++i) {
        if (blocks_.refCount(s->blocks[i]) == 1) ++plan.blocks_returned;  // released at commit
      }
    }
  }
  if (options_.enable_prefix_cache) {
    const auto& hashes = seq.chain.hashes();
    int matched = blocks_.matchPrefix(hashes);
    int common = std::min(matched * bs, cap);
    if (common > plan.common_tokens) {
      plan = ReusePlan{};
      plan.common_tokens = common;
      plan.reuse_blocks = ceilDiv(common, bs);
      for (int i = 0; i < plan.reuse_blocks; ++i) {
        if (blocks_.isCachedUnreferenced(hashes[static_cast<size_t>(i)])) ++plan.blocks_from_lru;
      }
      // A cached block is immutable; writing its tail needs a private copy.
      // If nobody else holds it, the copy returns it to the LRU.
      plan.needs_copy = common % bs != 0;
      if (plan.needs_copy && blocks_.isCachedUnreferenced(hashes[static_cast<size_t>(plan.reuse_blocks - 1)])) {
        ++plan.blocks_returned;
      }
    }
  }
  return plan;
}

bool Scheduler::directToD(const Sequence& seq) const {
  if (seq.prompt_kv != PromptKv::kImport || seq.spec.direct_max_suffix_tokens <= 0 || !seq.spec.session) {
    return false;
  }
  const ResidentSession* s = sessions_.find(*seq.spec.session);
  if (s == nullptr) return false;
  const size_t limit = std::min(s->tokens.size(), seq.tokens.size() - 1);
  size_t common = 0;
  while (common < limit && s->tokens[common] == seq.tokens[common]) ++common;
  return static_cast<int>(seq.tokens.size() - common) <= seq.spec.direct_max_suffix_tokens;
}

void Scheduler::admit(Sequence* seq, const ReusePlan& plan, int reserved_blocks, ScheduleResult* result) {
  const int bs = options_.block_size;
  std::vector<BlockId> reused;
  if (plan.from_session) {
    ResidentSession s = *sessions_.take(*seq->spec.session);
    reused.assign(s.blocks.begin(), s.blocks.begin() + plan.reuse_blocks);
    blocks_.releaseAll(std::span<const BlockId>(s.blocks).subspan(static_cast<size_t>(plan.reuse_blocks)));
  } else {
    // Any resident session for this id is stale for this prompt; it stays until evicted.
    const auto& hashes = seq->chain.hashes();
    for (int i = 0; i < plan.reuse_blocks; ++i) reused.push_back(blocks_.acquireCached(hashes[static_cast<size_t>(i)]));
  }
  if (plan.needs_copy) {
    BlockId src = reused.back();
    BlockId dst = blocks_.allocate();
    result->block_copies.emplace_back(src, dst);
    // The copy runs before the model this step; src can only be rewritten
    // by this step's model run, which comes after the copy.
    blocks_.release(src);
    reused.back() = dst;
  }
  seq->blocks = std::move(reused);
  seq->num_computed = plan.common_tokens;
  seq->num_committed_blocks = std::min(plan.common_tokens / bs, static_cast<int>(seq->chain.hashes().size()));
  seq->reserved_blocks = reserved_blocks;
  seq->state = SeqState::kRunning;
  if (!seq->admitted_once) {
    seq->admitted_once = true;
    seq->num_cached_tokens = plan.common_tokens;
    result->num_prefix_hit_tokens += plan.common_tokens;
    result->num_prefix_query_tokens += static_cast<int>(seq->tokens.size());
  }
  seq->kv_blocks_peak = std::max(seq->kv_blocks_peak, static_cast<int>(seq->blocks.size()));
  running_.push_back(seq);
  result->admitted.push_back(seq);
}

bool Scheduler::tryAdmit(Sequence* seq, ScheduleResult* result, int* session_evictions) {
  for (;;) {
    // Direct-to-D: the session's KV is resident here and only a short suffix
    // is new, so computing it locally beats a round trip to a prefill agent.
    // Decided for each plan, and taken only when the plan is committed: the
    // session may be evicted before the request fits.
    const bool direct = directToD(*seq);
    ReusePlan plan = planReuse(*seq, /*imports=*/seq->prompt_kv == PromptKv::kImport && !direct);
    const int need_total = admissionBlocks(*seq);
    const int need_new = need_total - plan.reuse_blocks + (plan.needs_copy ? 1 : 0);
    const int room = blocks_.numAvailable() - plan.blocks_from_lru + plan.blocks_returned - outstandingReservation();
    if (need_new <= room) {
      if (direct) {
        seq->prompt_kv = PromptKv::kDirect;
        result->direct_to_d.push_back(seq);
      }
      admit(seq, plan, need_total, result);
      return true;
    }
    // Make room by evicting resident sessions (never the one this request would reuse).
    if (*session_evictions >= options_.max_session_evictions_per_step || sessions_.numResident() == 0) return false;
    if (seq->spec.session && sessions_.contains(*seq->spec.session) && sessions_.numResident() == 1) {
      // Only this request's own session is left. While others run, their
      // blocks come back: wait. With nothing running, waiting is hopeless:
      // dropping the session releases what the plan could not count (all of
      // it when the plan does not reuse it); its full blocks stay in the
      // prefix cache for the next plan.
      if (!running_.empty()) return false;
      sessions_.drop(*seq->spec.session);
      ++*session_evictions;
      ++result->num_session_evictions;
      continue;
    }
    std::optional<ResidentSession> keep;
    if (seq->spec.session) keep = sessions_.take(*seq->spec.session);
    bool evicted = sessions_.evictOne();
    if (keep) sessions_.put(*seq->spec.session, std::move(*keep));
    if (!evicted) return false;
    ++*session_evictions;
    ++result->num_session_evictions;
  }
}

void Scheduler::preempt(Sequence* victim, ScheduleResult* result) {
  running_.erase(std::find(running_.begin(), running_.end(), victim));
  blocks_.releaseAll(victim->blocks);
  victim->blocks.clear();
  victim->num_computed = 0;
  victim->num_committed_blocks = 0;
  victim->state = SeqState::kWaiting;
  ++victim->num_preemptions;
  waiting_.push_front(victim);
  result->preempted.push_back(victim);
}

bool Scheduler::ensureBlocks(Sequence* seq, int num_tokens, ScheduleResult* result, int* session_evictions) {
  const int need = ceilDiv(num_tokens, options_.block_size);
  while (static_cast<int>(seq->blocks.size()) < need) {
    // Blocks this sequence may take: what is available minus what the others reserved.
    int others = outstandingReservation() - std::max(0, seq->reserved_blocks - static_cast<int>(seq->blocks.size()));
    const int take = std::min(need - static_cast<int>(seq->blocks.size()), blocks_.numAvailable() - others);
    if (take >= 1) {
      blocks_.allocateMany(take, seq->blocks);
      continue;
    }
    if (sessions_.numResident() > 0) {
      // Evicting a session whose blocks others share frees nothing, so this
      // could go through every session: a few per step, never one long pause.
      if (*session_evictions >= options_.max_session_evictions_per_step) return false;
      sessions_.evictOne();
      ++*session_evictions;
      ++result->num_session_evictions;
      continue;
    }
    // The newest running sequence that is not pinned: an importing
    // sequence's blocks are being written by gets, a reported leased
    // prefill's may be being read by a peer, so neither can be freed.
    Sequence* victim = seq;
    for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
      if (!(*it)->pinned()) {
        victim = *it;
        break;
      }
    }
    preempt(victim, result);
    if (victim == seq) return false;
  }
  seq->kv_blocks_peak = std::max(seq->kv_blocks_peak, static_cast<int>(seq->blocks.size()));
  return true;
}

ScheduleResult Scheduler::schedule() {
  ScheduleResult result;
  int budget = options_.max_num_batched_tokens;
  int session_evictions = 0;

  // Keep a low watermark of available blocks, a few sessions per step.
  while (session_evictions < options_.max_session_evictions_per_step &&
         blocks_.numAvailable() - outstandingReservation() < options_.session_low_watermark_blocks &&
         sessions_.evictOne()) {
    ++session_evictions;
    ++result.num_session_evictions;
  }

  // 1. Decodes (one uncomputed token), in admission order. Copy the list:
  // ensureBlocks may preempt from the back of running_.
  std::vector<Sequence*> decoding;
  for (Sequence* s : running_) {
    if (!s->importing() && s->numUncomputed() == 1) decoding.push_back(s);
  }
  for (Sequence* s : decoding) {
    if (budget == 0) break;
    if (s->state != SeqState::kRunning) continue;  // preempted by an earlier iteration
    if (!ensureBlocks(s, s->num_computed + 1, &result, &session_evictions)) continue;
    result.chunks.push_back({s, 1});
    --budget;
  }
  // Drop chunks of sequences preempted after they were scheduled.
  std::erase_if(result.chunks, [](const ScheduledChunk& c) { return c.seq->state != SeqState::kRunning; });

  // 2. Running sequences still in prefill.
  std::vector<Sequence*> prefilling;
  for (Sequence* s : running_) {
    if (!s->importing() && s->numUncomputed() > 1) prefilling.push_back(s);
  }
  for (Sequence* s : prefilling) {
    if (budget == 0) break;
    if (s->state != SeqState::kRunning) continue;
    int n = std::min(s->numUncomputed(), budget);
    if (!ensureBlocks(s, s->num_computed + n, &result, &session_evictions)) continue;
    result.chunks.push_back({s, n});
    budget -= n;
  }

  // 3. Admit waiting sequences in order; the head blocks the rest (no overtaking).
  while (budget > 0 && !waiting_.empty() && static_cast<int>(running_.size()) < options_.max_num_seqs) {
    Sequence* s = waiting_.front();
    if (!tryAdmit(s, &result, &session_evictions)) break;
    waiting_.pop_front();
    if (s->prompt_kv == PromptKv::kImport) {
      // All prompt blocks now (within its reservation); they are filled from outside.
      if (!ensureBlocks(s, static_cast<int>(s->tokens.size()), &result, &session_evictions)) break;
      s->prompt_kv = PromptKv::kImporting;
      result.imports.push_back(s);
      continue;
    }
    int n = std::min(s->numUncomputed(), budget);
    // Within its own reservation, which tryAdmit checked, so this cannot
    // preempt. A leased prefill gets all its prompt blocks now: they are
    // reported to the peer before the first chunk runs.
    const bool leased = s->spec.lease.has_value() && s->numOutputTokens() == 0;
    if (!ensureBlocks(s, leased ? s->num_prompt_tokens : s->num_computed + n, &result, &session_evictions)) break;
    result.chunks.push_back({s, n});
    budget -= n;
  }
  std::erase_if(result.chunks, [](const ScheduledChunk& c) { return c.seq->state != SeqState::kRunning; });
  TANDEM_CHECK(static_cast<int>(running_.size()) <= options_.max_num_seqs, "more sequences running than max_num_seqs");
  TANDEM_CHECK(budget >= 0, "a step scheduled more tokens than its budget");
  return result;
}

void Scheduler::commitComputedBlocks(Sequence* seq) {
  if (!options_.enable_prefix_cache) return;
  const auto& hashes = seq->chain.hashes();
  const int full = std::min(seq->num_computed / options_.block_size, static_cast<int>(hashes.size()));
  for (int i = seq->num_committed_blocks; i < full; ++i) {
    blocks_.commit(seq->blocks[static_cast<size_t>(i)], hashes[static_cast<size_t>(i)]);
  }
  seq->num_committed_blocks = std::max(seq->num_committed_blocks, full);
}

}  // namespace tandem::engine
