#include "engine/engine.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <utility>

#include "engine/backend/backend.h"
#include "engine/kv/kv_import.h"
#include "engine/model/llama.h"
#include "engine/model/rank_group.h"
#include "engine/model/tokenizer.h"
#include "engine/model/weights.h"
#include "src/common/check.h"
#include "src/common/strings.h"

namespace tandem::engine {
namespace {

int ceilDiv(int a, int b) { return (a + b - 1) / b; }

// Length of the longest suffix of `text` that is a proper prefix of some stop
// string: that much text must be held back, it may become a stop match.
size_t heldBackForStops(std::string_view text, const std::vector<std::string>& stops) {
  size_t held = 0;
  for (const auto& s : stops) {
    for (size_t len = std::min(s.size() - 1, text.size()); len > held; --len) {
      if (text.substr(text.size() - len) == std::string_view(s).substr(0, len)) {
        held = len;
        break;
      }
    }
  }
  return held;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::create(const EngineOptions& options,
                                                       std::shared_ptr<const ModelWeights> weights,
                                                       std::unique_ptr<Backend> backend,
                                                       std::shared_ptr<const Tokenizer> tokenizer, const Clock& clock) {
  if (!weights) return absl::InvalidArgumentError("engine: no model weights");
  if (!backend) return absl::InvalidArgumentError("engine: no backend");
  const ModelConfig& mc = weights->config;
  EngineOptions o = options;
  if (o.max_model_len == 0) o.max_model_len = mc.max_position_embeddings;
  auto bad = [](std::string_view field, std::string_view why) {
    return absl::InvalidArgumentError(strCat("engine options: ", field, ": ", why));
  };
  if (o.num_blocks < 1) return bad("num_blocks", "must be at least 1");
  if (o.block_size < 1 || o.block_size > 1024) return bad("block_size", "must be between 1 and 1024");
  if (o.max_num_seqs < 1) return bad("max_num_seqs", "must be at least 1");
  if (o.max_num_batched_tokens < o.max_num_seqs) {
    return bad("max_num_batched_tokens", strCat("must be at least max_num_seqs (", o.max_num_seqs,
                                                "): every running sequence decodes one token per step"));
  }
  if (o.max_waiting < 0) return bad("max_waiting", "must not be negative");
  if (o.max_model_len < 2 || o.max_model_len > mc.max_position_embeddings) {
    return bad("max_model_len", strCat("must be between 2 and the model's max_position_embeddings (",
                                       mc.max_position_embeddings, "), got ", o.max_model_len));
  }
  if (o.expected_output_tokens < 0) return bad("expected_output_tokens", "must not be negative");
  if (o.max_preemptions < 0) return bad("max_preemptions", "must not be negative");
  if (tokenizer && tokenizer->vocabSize() > mc.vocab_size) {
    return absl::InvalidArgumentError(strCat("engine: tokenizer vocabulary (", tokenizer->vocabSize(),
                                             ") is larger than the model's vocab_size (", mc.vocab_size, ")"));
  }
  const KvLayout layout = kvLayoutFor(mc, o.num_blocks, o.block_size, o.kv_dtype);
  // The transport's copy (kv_staging): the pool's layout, or with tensor
  // parallelism every rank's KV heads (the whole model's layout).
  KvLayout staging_layout = layout;
  if (o.tensor_parallel) {
    if (absl::Status s = o.tensor_parallel->checkLayout(layout); !s.ok()) {
      return bad("tensor_parallel", std::string(toStd(s.message())));
    }
    staging_layout.num_kv_heads *= o.tensor_parallel->world();
  }
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model,
                          LlamaModel::create(weights, *backend,
                                             o.tensor_parallel ? o.tensor_parallel->allReduce() : nullptr));
  std::unique_ptr<KvStorage> kv;
  if (o.kv_memory) {
    TANDEM_ASSIGN_OR_RETURN(KvMemory memory, o.kv_memory(layout.totalBytes()));
    TANDEM_RETURN_IF_ERROR(KvStorage::checkMemory(layout, memory));
    kv = std::make_unique<KvStorage>(layout, std::move(memory));
  } else {
    kv = std::make_unique<KvStorage>(layout);
  }
  if (o.kv_direct) {
    if (o.kv_staging)
      return bad("kv_direct", "and kv_staging exclude each other (the transport reads the pool or a copy)");
    if (o.tensor_parallel) {
      return bad(
          "kv_direct",
          "is not for a tensor-parallel group (peers read every rank's KV heads, which only a staging copy holds)");
    }
    if (!kv->onDevice()) return bad("kv_direct", "is for a KV pool in device memory (kv_memory returned host memory)");
  }
  KvMemory staging;
  if (o.kv_staging) {
    if (!kv->onDevice() && !o.tensor_parallel) {
      return bad("kv_staging", "is for a KV pool in device memory (kv_memory returned host memory) or a tensor-parallel group");
    }
    TANDEM_ASSIGN_OR_RETURN(staging, o.kv_staging(staging_layout.totalBytes()));
    if (staging.device) return bad("kv_staging", "must be host memory (the transport reads and writes it)");
    if (absl::Status st = KvStorage::checkMemory(staging_layout, staging); !st.ok()) {
      return bad("kv_staging", std::string(toStd(st.message())));
    }
  }
  return std::unique_ptr<Engine>(new Engine(o, std::move(weights), std::move(backend), std::move(model),
                                            std::move(tokenizer), clock, std::move(kv), std::move(staging),
                                            staging_layout));
}

Engine::Engine(const EngineOptions& options, std::shared_ptr<const ModelWeights> weights,
               std::unique_ptr<Backend> backend, std::unique_ptr<LlamaModel> model,
               std::shared_ptr<const Tokenizer> tokenizer, const Clock& clock, std::unique_ptr<KvStorage> kv,
               KvMemory staging, const KvLayout& staging_layout)
    : options_(options),
      weights_(std::move(weights)),
      backend_(std::move(backend)),
      model_(std::move(model)),
      tokenizer_(std::move(tokenizer)),
      clock_(clock),
      kv_(std::move(kv)),
      staging_(std::move(staging)),
      staging_layout_(staging_layout),
      blocks_(options.num_blocks),
      sessions_(blocks_),
      leases_(blocks_),
      announcer_(options.block_size),
      scheduler_(SchedulerOptions{.block_size = options.block_size,
                                  .max_num_batched_tokens = options.max_num_batched_tokens,
                                  .max_num_seqs = options.max_num_seqs,
                                  .max_model_len = options.max_model_len,
                                  .enable_prefix_cache = options.enable_prefix_cache,
                                  .session_low_watermark_blocks = options.session_low_watermark_blocks,
                                  .max_session_evictions_per_step = options.max_session_evictions_per_step},
                 blocks_, sessions_),
      seed_rng_(options.seed != 0 ? options.seed
                                  : (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}()) {
  // A group's staging copy is filled on the host (spliced), not by the
  // device's copies: nothing to pin.
  if (kvStaged() && !options_.tensor_parallel) staging_pinned_ = backend_->pinKvHost(staging_.bytes);
}

Engine::~Engine() {
  backend_->finishKvCopies();  // none may still use staging_ or the pool once they go
  if (kvStaged() && !options_.tensor_parallel && staging_pinned_.ok()) backend_->unpinKvHost(staging_.bytes);
  // Resident sessions release into blocks_, which outlives sessions_ by declaration order.
  sessions_.clear();
  leases_.clear();
}

absl::Status Engine::backendStatus() const {
  TANDEM_RETURN_IF_ERROR(backend_->status());
  return options_.tensor_parallel ? options_.tensor_parallel->status() : absl::OkStatus();
}

RejectReason Engine::validate(const RequestSpec& spec, std::string* message) const {
  const SamplingParams& p = spec.sampling;
  const int vocab = weights_->config.vocab_size;
  if (spec.prompt.empty()) {
    *message = "prompt is empty: at least one token is needed";
    return RejectReason::kInvalid;
  }
  for (size_t i = 0; i < spec.prompt.size(); ++i) {
    if (spec.prompt[i] < 0 || spec.prompt[i] >= vocab) {
      *message = strCat("prompt token ", i, " is ", spec.prompt[i], ", outside the vocabulary [0, ", vocab, ")");
      return RejectReason::kInvalid;
    }
  }
  if (p.max_tokens < 1) {
    *message = strCat("max_tokens must be at least 1, got ", p.max_tokens);
    return RejectReason::kInvalid;
  }
  if (!(p.temperature >= 0.0f) || p.temperature > 100.0f) {
    *message = strCat("temperature must be between 0 and 100, got ", p.temperature);
    return RejectReason::kInvalid;
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    *message = strCat("top_p must be in (0, 1], got ", p.top_p);
    return RejectReason::kInvalid;
  }
  if (p.top_k < 0) {
    *message = strCat("top_k must not be negative, got ", p.top_k);
    return RejectReason::kInvalid;
  }
  for (const auto& s : p.stop) {
    if (s.empty()) {
      *message = "stop strings must not be empty";
      return RejectReason::kInvalid;
    }
  }
  if (!p.stop.empty() && !tokenizer_) {
    *message = "stop strings need a tokenizer, and this engine has none";
    return RejectReason::kInvalid;
  }
  if (spec.lease && spec.import_kv) {
    *message = "a request cannot both lease its KV (prefill role) and import it (decode role)";
    return RejectReason::kInvalid;
  }
  if (spec.lease && leases_.contains(spec.lease->id)) {
    *message = strCat("lease ", spec.lease->id, " is already held");
    return RejectReason::kInvalid;
  }
  if (spec.lease) {
    // Another live request's lease id: when both finished, one lease would
    // replace the other and leak its blocks.
    for (const auto& [id, other] : live_) {
      if (&other->spec != &spec && other->state != SeqState::kFinished && other->spec.lease &&
          other->spec.lease->id == spec.lease->id) {
        *message = strCat("lease ", spec.lease->id, " is already used by request ", id.value());
        return RejectReason::kInvalid;
      }
    }
  }
  const int prompt = static_cast<int>(spec.prompt.size());
  if (prompt + 1 > options_.max_model_len) {
    *message = strCat("prompt has ", prompt, " tokens; this model's context is ", options_.max_model_len,
                      " tokens including at least one generated token");
    return RejectReason::kPromptTooLong;
  }
  if (scheduler_.waiting().size() >= static_cast<size_t>(options_.max_waiting)) {
    *message = strCat("waiting queue is full (", options_.max_waiting, " requests)");
    return RejectReason::kQueueFull;
  }
  return RejectReason::kNone;
}

int reservedTokens(const EngineOptions& options, int num_prompt_tokens, const RequestSpec& spec) {
  const SamplingParams& p = spec.sampling;
  // A leased prefill is pinned once its blocks are reported (a peer may be
  // reading them) and is never preempted, so it reserves all it may need.
  const bool estimate = options.expected_output_tokens > 0 && !spec.lease;
  const int expected_output = estimate ? std::min(p.max_tokens, options.expected_output_tokens) : p.max_tokens;
  return std::min(options.max_model_len, num_prompt_tokens + std::max(1, expected_output));
}

std::optional<std::string> capacityRejection(const EngineOptions& options, int num_prompt_tokens,
                                             const RequestSpec& spec) {
  const int reserved = reservedTokens(options, num_prompt_tokens, spec);
  const int blocks = ceilDiv(reserved, options.block_size);
  if (blocks <= options.num_blocks) return std::nullopt;
  return strCat("request needs ", blocks, " KV blocks (prompt ", num_prompt_tokens, " + expected output ",
                reserved - num_prompt_tokens, " tokens) but the pool has only ", options.num_blocks);
}

RequestId Engine::addRequest(RequestSpec spec, UpdateCallback on_update) {
  RequestId id(next_id_++);
  auto owned = std::make_unique<Sequence>(id, std::move(spec), options_.block_size, options_.block_hash_root);
  Sequence* seq = owned.get();
  seq->on_update = std::move(on_update);
  seq->arrival = clock_.now();
  seq->num_prompt_tokens = static_cast<int>(seq->spec.prompt.size());
  live_.emplace(id, std::move(owned));

  std::string message;
  RejectReason reject = validate(seq->spec, &message);
  seq->tokens = std::move(seq->spec.prompt);
  seq->spec.prompt.clear();
  const SamplingParams& p = seq->spec.sampling;
  seq->reserved_tokens = reservedTokens(options_, seq->num_prompt_tokens, seq->spec);
  if (reject == RejectReason::kNone) {
    if (auto why = capacityRejection(options_, seq->num_prompt_tokens, seq->spec)) {
      reject = RejectReason::kCapacity;
      message = std::move(*why);
    }
  }
  if (reject != RejectReason::kNone) {
    finish(seq, FinishReason::kRejected, reject, std::move(message));
    return id;
  }
  seq->rng = SamplerRng(p.seed ? *p.seed : seed_rng_.next());
  seq->chain.append(seq->tokens);
  for (const auto& s : p.stop) max_stop_len_ = std::max(max_stop_len_, s.size());
  scheduler_.addWaiting(seq);
  return id;
}

bool Engine::cancel(RequestId id, FinishReason reason, std::string message) {
  auto it = live_.find(id);
  if (it == live_.end()) return false;
  if (it->second->importing()) {
    if (it->second->on_update) it->second->on_update(abortRequested(*it->second, reason, std::move(message)));
    return true;
  }
  finish(it->second.get(), reason, RejectReason::kNone, std::move(message));
  return true;
}

StepStats Engine::step() {
  StepStats st;
  const MonoTime t0 = clock_.now();
  const uint64_t finished_before = num_finished_;
  const bool expired = finishExpired(t0);
  ScheduleResult plan = schedule();
  const MonoTime t1 = clock_.now();
  std::vector<SequenceChunk> batch = buildBatch(plan.chunks, t1, &st);
  const std::vector<LayerReady> during_run = reportLeasedPrefills(plan.chunks);
  // With tensor parallelism the other ranks get the step's copies and batch
  // first, and answer once they have run it too.
  RankGroupLeader* group = options_.tensor_parallel.get();
  const bool mirrored = group != nullptr && (!batch.empty() || !plan.block_copies.empty());
  absl::Status status = mirrored ? group->beginStep(plan.block_copies, batch) : absl::OkStatus();
  if (status.ok()) status = runModel(plan.chunks, batch, during_run);
  if (mirrored) {
    if (absl::Status ranks = group->endStep(status); status.ok()) status = std::move(ranks);
  }
  if (status.ok() && group != nullptr && layer_observer_ && !during_run.empty()) {
    // The other ranks' layers are done only once the step is: every layer
    // of the prefills that finished their prompt is announced now.
    for (int layer = 0; layer < weights_->config.num_layers && status.ok(); ++layer) {
      if (!announce(layer, during_run)) {
        status = absl::Status(backendStatus().code(),
                              strCat("preparing the KV for the transport: ", toStd(backendStatus().message())));
      }
    }
  }
  const MonoTime t2 = clock_.now();
  if (status.ok()) {
    postprocess(plan.chunks, batch);
  } else {
    // A failed step fails the requests in it; the engine stays usable for others.
    for (const ScheduledChunk& c : plan.chunks) {
      finish(c.seq, FinishReason::kError, RejectReason::kNone, strCat("model step failed: ", toStd(status.message())));
    }
  }
  const MonoTime t3 = clock_.now();

  fillGauges(&st);
  st.prefix_hit_tokens = plan.num_prefix_hit_tokens;
  st.prefix_query_tokens = plan.num_prefix_query_tokens;
  st.num_preemptions = static_cast<int>(plan.preempted.size());
  st.num_session_evictions = plan.num_session_evictions;
  st.num_finished = static_cast<int>(num_finished_ - finished_before);
  st.progressed = expired || st.num_scheduled_tokens > 0 || !plan.admitted.empty() || !plan.preempted.empty() ||
                  plan.num_session_evictions > 0 || st.num_finished > 0;
  st.schedule_time = t1 - t0;
  st.model_time = t2 - t1;
  st.postprocess_time = t3 - t2;
  st.kv_staged_to_host_bytes = std::exchange(staged_to_host_bytes_, 0);
  st.kv_staged_to_device_bytes = std::exchange(staged_to_device_bytes_, 0);
  st.kv_staging_time = std::exchange(staging_time_, Duration{0});
  if (group != nullptr) st.tensor_parallel_wait_time = std::chrono::duration_cast<Duration>(group->takeWaitTime());
  const BackendStats backend = backend_->stats();
  st.graph_steps_captured = static_cast<int>(backend.graph_steps_captured - std::exchange(graph_captured_seen_, backend.graph_steps_captured));
  st.graph_steps_replayed = static_cast<int>(backend.graph_steps_replayed - std::exchange(graph_replayed_seen_, backend.graph_steps_replayed));
  st.graph_steps_left = static_cast<int>(backend.graph_steps_left - std::exchange(graph_left_seen_, backend.graph_steps_left));
  return st;
}

bool Engine::finishExpired(MonoTime now) {
  // Deadlines first, so expired work does not take a slot this step.
  // (An importing request is someone else's to end: its blocks are being written.)
  std::vector<Sequence*> expired;
  for (auto& [id, seq] : live_) {
    if (seq->spec.deadline && *seq->spec.deadline <= now && !seq->importing()) expired.push_back(seq.get());
  }
  for (Sequence* s : expired) finish(s, FinishReason::kTimeout);
  return leases_.expire(now) > 0 || !expired.empty();
}

std::optional<MonoTime> Engine::nextDeadline() const {
  std::optional<MonoTime> next = leases_.nextExpiry();
  for (const auto& [id, seq] : live_) {
    if (seq->spec.deadline && !seq->importing() && (!next || *seq->spec.deadline < *next)) next = seq->spec.deadline;
  }
  return next;
}

ScheduleResult Engine::schedule() {
  ScheduleResult plan = scheduler_.schedule();
  for (Sequence* s : plan.preempted) {
    if (s->num_preemptions > options_.max_preemptions) {
      finish(s, FinishReason::kPreempted, RejectReason::kNone,
             strCat("preempted ", s->num_preemptions, " times (limit ", options_.max_preemptions, ")"));
    } else if (const int need = scheduler_.admissionBlocks(*s); need > options_.num_blocks) {
      // It outgrew its reservation (expected_output_tokens below max_tokens)
      // and the whole pool: waiting would never admit it again.
      finish(s, FinishReason::kPreempted, RejectReason::kNone,
             strCat("preempted: its ", s->tokens.size(), " tokens need ", need, " KV blocks but the pool has only ",
                    options_.num_blocks));
    }
  }
  std::erase_if(plan.chunks, [](const ScheduledChunk& c) { return c.seq->state != SeqState::kRunning; });
  for (auto [src, dst] : plan.block_copies) backend_->copyKvBlock(*kv_, src, dst);
  // Imports admitted now: the importer learns where to write.
  for (Sequence* s : plan.imports) {
    if (s->state == SeqState::kRunning) reportKvBlocks(s, s->blocks.size());
  }
  return plan;
}

std::vector<SequenceChunk> Engine::buildBatch(std::span<const ScheduledChunk> chunks, MonoTime now, StepStats* st) {
  std::vector<SequenceChunk> batch;
  batch.reserve(chunks.size());
  for (const ScheduledChunk& c : chunks) {
    Sequence* s = c.seq;
    if (!s->first_scheduled) s->first_scheduled = now;
    const bool last = s->num_computed + c.num_tokens == static_cast<int>(s->tokens.size());
    batch.push_back({.tokens = std::span<const TokenId>(s->tokens).subspan(static_cast<size_t>(s->num_computed),
                                                                           static_cast<size_t>(c.num_tokens)),
                     .start_pos = s->num_computed,
                     .block_table = s->blocks,
                     .want_logits = last});
    if (c.num_tokens == 1 && s->num_computed >= s->num_prompt_tokens) {
      st->num_decode_tokens += 1;
    } else {
      st->num_prefill_tokens += c.num_tokens;
    }
  }
  st->num_scheduled_tokens = st->num_prefill_tokens + st->num_decode_tokens;
  return batch;
}

std::vector<LayerReady> Engine::reportLeasedPrefills(std::span<const ScheduledChunk> chunks) {
  // Leased prefills' prompt blocks are reported before the model first
  // writes them; those whose last prompt chunk runs now announce their
  // remaining blocks layer by layer during the run.
  std::vector<LayerReady> during_run;
  for (const ScheduledChunk& c : chunks) {
    if (!LayerAnnouncer::announces(*c.seq)) continue;
    reportKvBlocks(c.seq, announcer_.numPromptBlocks(*c.seq));
    if (auto ready = announcer_.duringRun(c)) during_run.push_back(*ready);
  }
  return during_run;
}

bool Engine::samplingOnDevice() const {
  return options_.sample_on_device && options_.scripted_replies.empty() && backend_->samplesLogits();
}

absl::Status Engine::runModel(std::span<const ScheduledChunk> chunks, const std::vector<SequenceChunk>& batch,
                              std::span<const LayerReady> during_run) {
  if (batch.empty()) return absl::OkStatus();
  LayerObserver on_layer = [&](int layer) { announce(layer, during_run); };
  // (With tensor parallelism step() announces after the step: the other
  // ranks' layers are not known to be done during it.)
  const bool observe = layer_observer_ && !during_run.empty() && !options_.tensor_parallel;
  if (!samplingOnDevice()) return model_->forward(batch, *kv_, &logits_, observe ? &on_layer : nullptr);
  sample_params_.clear();
  sample_draws_.clear();
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!batch[i].want_logits) continue;
    Sequence* s = chunks[i].seq;
    sample_params_.push_back(s->spec.sampling);
    // sampleToken's one draw, taken now: greedy draws nothing.
    sample_draws_.push_back(s->spec.sampling.temperature <= 0.0f ? 0.0 : s->rng.uniform());
  }
  sampled_.assign(sample_params_.size(), 0);
  const LlamaModel::Sampling sampling{sample_params_, sample_draws_, sampled_};
  return model_->forward(batch, *kv_, &logits_, observe ? &on_layer : nullptr, &sampling);
}

void Engine::postprocess(std::span<const ScheduledChunk> chunks, const std::vector<SequenceChunk>& batch) {
  const size_t vocab = static_cast<size_t>(weights_->config.vocab_size);
  size_t row = 0;
  // Leased prefills' blocks an earlier chunk finished. Only sequences without
  // logits are here: none of them finishes below, so their spans stay valid.
  std::vector<LayerReady> completed;
  for (size_t i = 0; i < chunks.size(); ++i) {
    Sequence* s = chunks[i].seq;
    s->num_computed += chunks[i].num_tokens;
    scheduler_.commitComputedBlocks(s);
    if (auto ready = announcer_.afterRun(*s)) completed.push_back(*ready);
    if (batch[i].want_logits) {
      if (samplingOnDevice()) {
        acceptToken(s, sampled_[row]);
      } else {
        sample(s, std::span<const float>(logits_).subspan(row * vocab, vocab));
      }
      ++row;
    }
  }
  if (layer_observer_ && !completed.empty()) {
    for (int layer = 0; layer < weights_->config.num_layers; ++layer) {
      if (announce(layer, completed)) continue;
      // Staging or the checksums failed: these prefills' KV cannot reach their decode peers.
      std::vector<RequestId> failed;
      for (const LayerReady& r : completed) failed.push_back(r.id);
      for (RequestId id : failed) {
        if (auto it = live_.find(id); it != live_.end()) {
          finish(it->second.get(), FinishReason::kError, RejectReason::kNone,
                 strCat("preparing the KV for the transport: ", toStd(backendStatus().message())));
        }
      }
      break;
    }
  }
}

void Engine::copyStaged(int layer, std::span<const BlockId> blocks, bool to_host) {
  const size_t block_bytes = kv_->layout().bytesPerLayerBlock();
  // One copy per run of consecutive block ids (a layer's blocks with
  // consecutive ids are consecutive in the pool).
  for (size_t i = 0, n = 1; i < blocks.size(); i += n, n = 1) {
    while (i + n < blocks.size() && blocks[i + n].value() == blocks[i].value() + static_cast<int64_t>(n)) ++n;
    const size_t offset = kv_->layerBlockByteOffset(layer, blocks[i]);
    const std::span<std::byte> staged = staging_.bytes.subspan(offset, n * block_bytes);
    if (to_host) {
      backend_->downloadKv(*kv_, offset, staged);
      staged_to_host_bytes_ += static_cast<int64_t>(staged.size());
    } else {
      backend_->uploadKv(*kv_, offset, staged);
      staged_to_device_bytes_ += static_cast<int64_t>(staged.size());
    }
  }
}

bool Engine::announce(int layer, std::span<const LayerReady> ready) {
  if (kvStaged()) {
    const MonoTime start = clock_.now();
    if (options_.tensor_parallel) {
      std::vector<BlockId> blocks;
      for (const LayerReady& r : ready) blocks.insert(blocks.end(), r.blocks.begin(), r.blocks.end());
      const int32_t layers[] = {layer};
      const bool staged = stageGroup(layers, blocks, /*to_host=*/true);
      staging_time_ += clock_.now() - start;
      if (!staged) return false;
    } else {
      for (const LayerReady& r : ready) copyStaged(layer, r.blocks, /*to_host=*/true);
      backend_->finishKvCopies();  // one wait for the layer's copies, before the transport reads them
      staging_time_ += clock_.now() - start;
      if (!backend_->status().ok()) return false;
    }
  }
  // The checksums of what peers will read, every ready prefill's in one call.
  announce_blocks_.clear();
  for (const LayerReady& r : ready) {
    for (BlockId b : r.blocks) announce_blocks_.push_back({.layer = layer, .block = b});
  }
  announce_sums_.resize(announce_blocks_.size());
  if (!kvRegionChecksums(announce_blocks_, announce_sums_).ok()) return false;
  announced_.assign(ready.begin(), ready.end());
  size_t at = 0;
  for (LayerReady& r : announced_) {
    r.checksums = std::span<const uint64_t>(announce_sums_).subspan(at, r.blocks.size());
    at += r.blocks.size();
  }
  layer_observer_(layer, announced_);
  return true;
}

absl::Status Engine::kvRegionChecksums(std::span<const KvLayerBlock> items, std::span<uint64_t> out) {
  TANDEM_CHECK(out.size() == items.size(), "kvRegionChecksums: one checksum per layer block");
  if (kvRegionOnDevice()) {
    backend_->checksumKv(*kv_, items, out);
    return backendStatus();
  }
  const std::span<const std::byte> region = kvRegion();
  TANDEM_CHECK(!region.empty(),
               "kvRegionChecksums: no region for a transport (a device pool, neither staged nor direct)");
  const KvLayout& layout = kvRegionLayout();
  const size_t block_bytes = layout.bytesPerLayerBlock();
  for (size_t i = 0; i < items.size(); ++i) {
    const size_t at = (static_cast<size_t>(items[i].layer) * static_cast<size_t>(layout.num_blocks) +
                       static_cast<size_t>(items[i].block.value())) *
                      block_bytes;
    out[i] = layerBlockChecksum(region.subspan(at, block_bytes));
  }
  return absl::OkStatus();
}

bool Engine::stageIn(std::span<const BlockId> blocks) {
  if (!kvStaged()) return true;
  const MonoTime start = clock_.now();
  if (options_.tensor_parallel) {
    // A layer at a time: each follower's share of a long prompt's KV in
    // bounded frames and buffers.
    bool staged = true;
    for (int32_t layer = 0; layer < kv_->layout().num_layers && staged; ++layer) {
      const int32_t layers[] = {layer};
      staged = stageGroup(layers, blocks, /*to_host=*/false);
    }
    staging_time_ += clock_.now() - start;
    return staged;
  }
  for (int layer = 0; layer < kv_->layout().num_layers; ++layer) copyStaged(layer, blocks, /*to_host=*/false);
  backend_->finishKvCopies();  // one wait for every layer's copies
  staging_time_ += clock_.now() - start;
  return backend_->status().ok();
}

void Engine::spliceHeads(int rank, std::span<std::byte> rank_bytes, std::span<const int32_t> layers,
                         std::span<const BlockId> blocks, bool to_staging) {
  // A layer block is [2 (K, V)][block_size][heads][head_dim]: 2·block_size
  // rows, each the rank's heads of one token in the pool and its slice of
  // the whole model's heads in the staging copy.
  const KvLayout& mine = kv_->layout();
  const size_t row = mine.bytesPerToken();
  const size_t staging_row = staging_layout_.bytesPerToken();
  const size_t rows = 2 * static_cast<size_t>(mine.block_size);
  const size_t staging_block = staging_layout_.bytesPerLayerBlock();
  std::byte* r = rank_bytes.data();
  for (int32_t layer : layers) {
    for (BlockId block : blocks) {
      std::byte* g = staging_.bytes.data() +
                     (static_cast<size_t>(layer) * static_cast<size_t>(mine.num_blocks) +
                      static_cast<size_t>(block.value())) * staging_block +
                     static_cast<size_t>(rank) * row;
      for (size_t i = 0; i < rows; ++i, r += row, g += staging_row) {
        if (to_staging) {
          std::memcpy(g, r, row);
        } else {
          std::memcpy(r, g, row);
        }
      }
    }
  }
}

bool Engine::stageGroup(std::span<const int32_t> layers, std::span<const BlockId> blocks, bool to_host) {
  if (blocks.empty()) return true;
  RankGroupLeader& group = *options_.tensor_parallel;
  const size_t block_bytes = kv_->layout().bytesPerLayerBlock();
  const size_t bytes = layers.size() * blocks.size() * block_bytes;
  group_stage_.resize(bytes);
  const std::span<std::byte> mine(group_stage_);
  if (to_host) {
    // Rank 0's layer blocks (a device pool's downloaded, one wait), then
    // every other rank's, each spliced into its heads of the staging copy.
    size_t at = 0;
    for (int32_t layer : layers) {
      for (BlockId block : blocks) {
        backend_->downloadKv(*kv_, kv_->layerBlockByteOffset(layer, block), mine.subspan(at, block_bytes));
        at += block_bytes;
      }
    }
    backend_->finishKvCopies();
    if (!backend_->status().ok()) return false;
    spliceHeads(0, mine, layers, blocks, /*to_staging=*/true);
    const absl::Status ranks = group.stageOut(layers, blocks, [&](int rank, std::span<const std::byte> theirs) {
      // The splice reads theirs only.
      spliceHeads(rank, std::span<std::byte>(const_cast<std::byte*>(theirs.data()), theirs.size()), layers, blocks,
                  /*to_staging=*/true);
    });
    if (ranks.ok()) staged_to_host_bytes_ += static_cast<int64_t>(bytes) * group.world();
    return ranks.ok();
  }
  spliceHeads(0, mine, layers, blocks, /*to_staging=*/false);
  size_t at = 0;
  for (int32_t layer : layers) {
    for (BlockId block : blocks) {
      backend_->uploadKv(*kv_, kv_->layerBlockByteOffset(layer, block), mine.subspan(at, block_bytes));
      at += block_bytes;
    }
  }
  backend_->finishKvCopies();  // before group_stage_ is reused
  if (!backend_->status().ok()) return false;
  const absl::Status ranks = group.stageIn(layers, blocks, [&](int rank, std::vector<std::byte>* theirs) {
    theirs->resize(bytes);
    spliceHeads(rank, *theirs, layers, blocks, /*to_staging=*/false);
  });
  if (ranks.ok()) staged_to_device_bytes_ += static_cast<int64_t>(bytes) * group.world();
  return ranks.ok();
}

void Engine::fillGauges(StepStats* st) const {
  st->num_running = static_cast<int>(scheduler_.running().size());
  st->num_waiting = static_cast<int>(scheduler_.waiting().size());
  st->queue_tokens = 0;
  for (const Sequence* s : scheduler_.waiting()) st->queue_tokens += s->numUncomputed();
  for (const Sequence* s : scheduler_.running()) {
    if (s->numUncomputed() > 1) st->queue_tokens += s->numUncomputed();
  }
  st->num_free_blocks = blocks_.numAvailable();
  st->num_total_blocks = blocks_.numTotal();
  st->num_sessions_resident = sessions_.numResident();
  st->num_session_blocks = sessions_.numBlocksOnlySessionsHold();
}

StepStats Engine::currentStats() const {
  StepStats st;
  fillGauges(&st);
  return st;
}

void Engine::sample(Sequence* seq, std::span<const float> logits) {
  if (!options_.scripted_replies.empty()) {
    const auto& reply = options_.scripted_replies[(seq->id.value() - 1) % options_.scripted_replies.size()];
    const auto n = static_cast<size_t>(seq->numOutputTokens());
    acceptToken(seq, n < reply.size() ? reply[n] : weights_->config.eos_token_ids.front());
    return;
  }
  acceptToken(seq, sampleToken(logits, seq->spec.sampling, seq->rng, &sample_scratch_));
}

void Engine::reportKvBlocks(Sequence* seq, size_t num_blocks) {
  if (seq->kv_blocks_reported) return;
  seq->kv_blocks_reported = true;
  RequestUpdate u;
  u.id = seq->id;
  u.kv_blocks.assign(seq->blocks.begin(), seq->blocks.begin() + static_cast<ptrdiff_t>(num_blocks));
  if (seq->on_update) seq->on_update(u);
}

bool Engine::completeImport(RequestId id, TokenId first_token) {
  auto it = live_.find(id);
  if (it == live_.end() || !it->second->importing()) return false;
  Sequence* seq = it->second.get();
  // A staged pool: the importer wrote the staging copy of the blocks it was given.
  if (!stageIn(seq->blocks)) {
    finish(seq, FinishReason::kError, RejectReason::kNone,
           strCat("loading the imported KV into the KV pool: ", toStd(backendStatus().message())));
    return true;
  }
  if (absl::Status st = engine::completeImport(*seq, first_token, weights_->config.vocab_size, clock_.now());
      !st.ok()) {
    finish(seq, FinishReason::kError, RejectReason::kNone, std::string(toStd(st.message())));
    return true;
  }
  scheduler_.commitComputedBlocks(seq);
  acceptToken(seq, first_token);
  return true;
}

bool Engine::abortImport(RequestId id, FinishReason reason, std::string message) {
  auto it = live_.find(id);
  if (it == live_.end() || !it->second->importing()) return false;
  finish(it->second.get(), reason, RejectReason::kNone, std::move(message));  // the importer's writes are over
  return true;
}

bool Engine::computeImportLocally(RequestId id) {
  auto it = live_.find(id);
  if (it == live_.end() || !it->second->importing()) return false;
  engine::computeImportLocally(*it->second);
  return true;
}

bool Engine::releaseLease(uint64_t lease_id) { return leases_.release(lease_id); }

int Engine::expireLeases() { return leases_.expire(clock_.now()); }

void Engine::acceptToken(Sequence* seq, TokenId tok) {
  const SamplingParams& p = seq->spec.sampling;
  if (!seq->first_token) seq->first_token = clock_.now();
  seq->tokens.push_back(tok);
  seq->chain.append(std::span<const TokenId>(&seq->tokens.back(), 1));
  seq->pending_tokens.push_back(tok);

  const bool eos = !p.ignore_eos && weights_->config.isEos(tok);
  if (!eos && appendText(seq)) return;  // a stop string matched: seq is gone
  if (eos) {
    finish(seq, FinishReason::kEos);
  } else if (seq->numOutputTokens() >= p.max_tokens || static_cast<int>(seq->tokens.size()) >= options_.max_model_len) {
    finish(seq, FinishReason::kLength);
  } else {
    flushUpdate(seq);
  }
}

bool Engine::appendText(Sequence* seq) {
  if (!tokenizer_) return false;
  if (!seq->decoder) {
    // A few prompt tokens of context so the first output token decodes with
    // the leading space it has after the prompt.
    const size_t ctx = std::min<size_t>(6, static_cast<size_t>(seq->num_prompt_tokens));
    seq->decoder = std::make_unique<IncrementalDecoder>(
        *tokenizer_,
        std::span<const TokenId>(seq->tokens).subspan(static_cast<size_t>(seq->num_prompt_tokens) - ctx, ctx));
  }
  const size_t old_size = seq->text.size();
  seq->text += seq->decoder->push(seq->tokens.back());
  if (seq->text.size() == old_size) return false;
  size_t first = std::string::npos;
  for (const auto& stop : seq->spec.sampling.stop) {
    // Only a match that includes new text can be new.
    size_t from = old_size >= stop.size() ? old_size - stop.size() + 1 : 0;
    first = std::min(first, seq->text.find(stop, from));
  }
  if (first == std::string::npos) return false;
  seq->text.resize(first);
  finish(seq, FinishReason::kStop);
  return true;
}

void Engine::flushUpdate(Sequence* seq) {
  RequestUpdate u;
  u.id = seq->id;
  u.new_tokens.swap(seq->pending_tokens);
  // Emit text that can no longer change: hold back what may be the start of
  // a stop string (the decoder already holds back incomplete UTF-8).
  std::string_view text = seq->text;
  const size_t end = text.size() - heldBackForStops(text, seq->spec.sampling.stop);
  if (end > seq->text_emitted) {
    u.text_delta.assign(text.substr(seq->text_emitted, end - seq->text_emitted));
    seq->text_emitted = end;
  }
  if (u.new_tokens.empty() && u.text_delta.empty()) return;
  if (seq->on_update) seq->on_update(u);
}

void Engine::finish(Sequence* seq, FinishReason reason, RejectReason reject, std::string message) {
  if (seq->state == SeqState::kFinished) return;
  ++num_finished_;
  const bool normal = reason == FinishReason::kEos || reason == FinishReason::kLength || reason == FinishReason::kStop;
  if (normal && seq->spec.lease && seq->kv_blocks_reported) {
    // Pin the prompt's KV for the decode agent; the rest is released.
    std::vector<BlockId> blocks = scheduler_.detachBlocks(seq);
    const size_t keep =
        std::min(blocks.size(), static_cast<size_t>(ceilDiv(seq->num_prompt_tokens, options_.block_size)));
    blocks_.releaseAll(std::span<const BlockId>(blocks).subspan(keep));
    blocks.resize(keep);
    leases_.hold(seq->spec.lease->id, std::move(blocks), seq->spec.lease->expires);
  } else if (normal && seq->spec.session && seq->num_computed > 0) {
    // Keep the computed KV resident for the next turn.
    std::vector<BlockId> blocks = scheduler_.detachBlocks(seq);
    const size_t keep = static_cast<size_t>(ceilDiv(seq->num_computed, options_.block_size));
    blocks_.releaseAll(std::span<const BlockId>(blocks).subspan(std::min(keep, blocks.size())));
    blocks.resize(std::min(keep, blocks.size()));
    ResidentSession state;
    state.tokens.assign(seq->tokens.begin(), seq->tokens.begin() + seq->num_computed);
    state.blocks = std::move(blocks);
    state.priority = seq->spec.session_priority;
    sessions_.put(*seq->spec.session, std::move(state));
  } else {
    scheduler_.remove(seq);
  }
  seq->state = SeqState::kFinished;

  RequestUpdate u;
  u.id = seq->id;
  u.new_tokens.swap(seq->pending_tokens);
  if (seq->decoder && reason != FinishReason::kStop) seq->text += seq->decoder->finish();
  if (seq->text.size() > seq->text_emitted) u.text_delta = seq->text.substr(seq->text_emitted);
  u.finished = true;
  u.finish_reason = reason;
  u.reject_reason = reject;
  u.message = std::move(message);
  u.num_prompt_tokens = seq->num_prompt_tokens;
  u.num_cached_tokens = seq->num_cached_tokens;
  u.num_output_tokens = std::max(0, seq->numOutputTokens());
  u.num_reserved_tokens = seq->reserved_tokens;
  u.kv_blocks_peak = seq->kv_blocks_peak;
  u.num_preemptions = seq->num_preemptions;
  u.kv_imported = kvImported(*seq);
  u.arrival = seq->arrival;
  u.first_scheduled = seq->first_scheduled;
  u.first_token = seq->first_token;
  u.finished_at = clock_.now();
  UpdateCallback cb = std::move(seq->on_update);
  live_.erase(seq->id);  // seq is gone from here on
  if (cb) cb(u);
}

absl::Status Engine::checkInvariants() const {
  TANDEM_RETURN_IF_ERROR(blocks_.checkInvariants());
  std::vector<int> refs(static_cast<size_t>(blocks_.numTotal()), 0);
  for (const auto& [id, seq] : live_) {
    for (BlockId b : seq->blocks) ++refs[static_cast<size_t>(b.value())];
  }
  sessions_.forEachBlock([&](BlockId b) { ++refs[static_cast<size_t>(b.value())]; });
  leases_.forEachBlock([&](BlockId b) { ++refs[static_cast<size_t>(b.value())]; });
  for (int i = 0; i < blocks_.numTotal(); ++i) {
    if (refs[static_cast<size_t>(i)] != blocks_.refCount(BlockId(i))) {
      return absl::InternalError(strCat("block ", i, " has ref count ", blocks_.refCount(BlockId(i)), " but ",
                                        refs[static_cast<size_t>(i)], " holders (sequences + sessions + leases)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::engine
