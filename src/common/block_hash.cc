#include "src/common/block_hash.h"

#include <bit>
#include <cstdint>
#include <cstring>

// The state struct is only declared in full under XXH_STATIC_LINKING_ONLY;
// keeping it on the stack avoids a heap allocation per block.
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "src/common/check.h"

namespace tandem {
namespace {

static_assert(std::endian::native == std::endian::little,
              "block hashes are defined over little-endian bytes; add byte swapping for big-endian hosts");

}  // namespace

BlockHash blockHashRoot(uint64_t model_fingerprint, std::string_view salt) {
  constexpr uint64_t kRootSeed = 0x74616e64656d2e32ULL;  // "tandem.2"
  XXH64_state_t state;
  XXH64_reset(&state, kRootSeed);
  XXH64_update(&state, &model_fingerprint, sizeof(model_fingerprint));
  XXH64_update(&state, salt.data(), salt.size());
  const uint64_t h = XXH64_digest(&state);
  return BlockHash(h == 0 ? 1 : h);
}

BlockHash chainBlockHash(BlockHash parent, std::span<const TokenId> tokens) {
  // Hash parent and tokens as one contiguous buffer without copying:
  // the streaming API gives the same result as the one-shot call.
  XXH64_state_t state;
  XXH64_reset(&state, 0);
  uint64_t p = parent.value();
  XXH64_update(&state, &p, sizeof(p));
  XXH64_update(&state, tokens.data(), tokens.size_bytes());
  uint64_t h = XXH64_digest(&state);
  return BlockHash(h == 0 ? 1 : h);
}

std::vector<BlockHash> computeBlockHashes(std::span<const TokenId> tokens, int block_size, BlockHash parent) {
  TANDEM_CHECK(block_size > 0, "block hashes of blocks of no tokens");
  std::vector<BlockHash> out;
  const size_t b = static_cast<size_t>(block_size);
  out.reserve(tokens.size() / b);
  for (size_t start = 0; start + b <= tokens.size(); start += b) {
    parent = chainBlockHash(parent, tokens.subspan(start, b));
    out.push_back(parent);
  }
  return out;
}

BlockHashChain::BlockHashChain(int block_size, BlockHash root) : block_size_(block_size), root_(root) {
  TANDEM_CHECK(block_size > 0, "a block-hash chain of blocks of no tokens");
  pending_.reserve(static_cast<size_t>(block_size));
}

void BlockHashChain::append(std::span<const TokenId> tokens) {
  const size_t b = static_cast<size_t>(block_size_);
  for (TokenId t : tokens) {
    pending_.push_back(t);
    if (pending_.size() == b) {
      BlockHash parent = hashes_.empty() ? root_ : hashes_.back();
      hashes_.push_back(chainBlockHash(parent, pending_));
      pending_.clear();
    }
  }
}

uint64_t layerBlockChecksum(std::span<const std::byte> bytes) { return XXH64(bytes.data(), bytes.size(), 0); }

}  // namespace tandem
