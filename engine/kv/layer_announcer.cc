#include "engine/kv/layer_announcer.h"

#include <algorithm>

namespace tandem::engine {

size_t LayerAnnouncer::numPromptBlocks(const Sequence& seq) const {
  return static_cast<size_t>((seq.num_prompt_tokens + block_size_ - 1) / block_size_);
}

std::optional<LayerReady> LayerAnnouncer::duringRun(const ScheduledChunk& chunk) const {
  const Sequence& s = *chunk.seq;
  if (!announces(s) || s.num_computed + chunk.num_tokens != s.num_prompt_tokens) return std::nullopt;
  const size_t n = numPromptBlocks(s);
  const auto first = static_cast<size_t>(s.blocks_announced);
  return LayerReady{s.id, first, std::span<const BlockId>(s.blocks).subspan(first, n - first)};
}

std::optional<LayerReady> LayerAnnouncer::afterRun(Sequence& seq) const {
  if (!announces(seq) || !seq.kv_blocks_reported) return std::nullopt;
  if (seq.num_computed == seq.num_prompt_tokens) {
    // The prompt's last chunk: duringRun announced the rest, layer by layer.
    seq.blocks_announced = static_cast<int>(numPromptBlocks(seq));
    return std::nullopt;
  }
  const int done = seq.num_computed / block_size_;
  if (done <= seq.blocks_announced) return std::nullopt;
  const auto first = static_cast<size_t>(seq.blocks_announced);
  seq.blocks_announced = done;
  return LayerReady{seq.id, first,
                    std::span<const BlockId>(seq.blocks).subspan(first, static_cast<size_t>(done) - first)};
}

}  // namespace tandem::engine
