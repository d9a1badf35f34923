#pragma once
// The block-hash chain: the identity of a prompt prefix, shared by the engine
// (prefix cache), the router (KV-aware scoring) and the simulator. All three
// must compute bit-identical values, so the definition is fixed here:
//
//   h[-1] = blockHashRoot(F, S) = XXH64(le64(F) || S, seed = 0x74616e64656d2e32 "tandem.2")
//   h[i]  = XXH64(le64(h[i-1]) || le32(t[i*B]) || ... || le32(t[i*B+B-1]), seed = 0)
//
// where B is the block size in tokens, le64/le32 are little-endian encodings,
// t are token ids, F is the model's 64-bit fingerprint (weights, tokenizer,
// chat template and config: engine/model/model_fingerprint.h) and S the
// optional tenant salt's bytes (--cache-salt; empty: none). Rooting the chain
// in both means KV of another checkpoint (a rolling update) or another tenant
// can never be matched or pulled: the same tokens give other hashes.
// kBlockHashRoot (0x74616e64656d2e31, "tandem.1") is the root of a chain
// keyed to no model, for code that has none (tools, benchmarks, unit tests).
//
// Only full blocks get a hash; a trailing partial block has none (it cannot be shared). Two prompts share their first k
// hashes iff they share their first k*B tokens (up to 64-bit collisions). A hash value of 0 is never produced (remapped
// to 1) so 0 can mean "no block" on the wire.

#include <cstddef>
#include <span>
#include <vector>

#include "src/common/ids.h"

namespace tandem {

#include <cstdint>
#include <string_view>

inline constexpr BlockHash kBlockHashRoot{0x74616e64656d2e31ULL};

// The root of the chain of one model (its fingerprint) and tenant salt
// (empty: none). Never 0.
BlockHash blockHashRoot(uint64_t model_fingerprint, std::string_view salt);

// Hash of one full block given its parent's hash. `tokens.size()` is the block size.
BlockHash chainBlockHash(BlockHash parent, std::span<const TokenId> tokens);

// Hashes of every full block of `tokens` (tokens.size() / block_size of them).
// `block_size` must be > 0.
std::vector<BlockHash> computeBlockHashes(std::span<const TokenId> tokens, int block_size,
                                          BlockHash parent = kBlockHashRoot);

// Incremental form for a growing sequence (a request that decodes, a session
// that appends): feed tokens as they arrive, read the hashes of completed
// blocks. Not thread-safe; one owner.
class BlockHashChain {
 public:
  // Hashes chain from `root` (the engine's: blockHashRoot of its model and salt).
  explicit BlockHashChain(int block_size, BlockHash root = kBlockHashRoot);

  // Appends tokens; every block that fills gets its hash appended to hashes().
  void append(std::span<const TokenId> tokens);

  const std::vector<BlockHash>& hashes() const { return hashes_; }
  int blockSize() const { return block_size_; }
  // Tokens received so far that do not yet fill a block.
  size_t numPendingTokens() const { return pending_.size(); }

 private:
  int block_size_;
  BlockHash root_;
  std::vector<BlockHash> hashes_;
  std::vector<TokenId> pending_;
};

// The checksum of one layer block of KV (XXH64, seed 0): what a prefill
// agent announces for each block it computed and a decode agent checks after
// pulling it (kvproto::LayerReady). Computed on the host here; a pool in
// device memory computes the same value there (engine/backend/cuda/kernels.h,
// kvChecksumKernel).
uint64_t layerBlockChecksum(std::span<const std::byte> bytes);

}  // namespace tandem
