#pragma once
// The KV cache memory of one engine: one allocation, layer-major.
//
//   [num_layers][num_blocks][2 (K, V)][block_size][num_kv_heads][head_dim]
//
// of fp32, or of bf16 (KvDtype::kBfloat16: half the memory; K and V are
// rounded to bf16, to nearest even, as they are written, and widened back
// to fp32 exactly as attention reads them; docs/cuda.md, "bf16 KV cache").
//
// so one *layer block* (K and V of block_size tokens of one layer, DualPath's
// term) is contiguous: the transport pulls it with one get, layer by layer as
// prefill finishes each layer. A *full block* is the num_layers layer blocks
// of one block id. The whole region is one span so it can be registered with
// UCX once at start.
//
// Holds bytes only; which block belongs to whom is the BlockManager's business.
// Not thread-safe: the engine thread owns it (the transport reads through
// registered memory, coordinated by the engine).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "src/common/check.h"
#include "src/common/ids.h"
#include "src/common/status.h"

namespace tandem::engine {

// KV pool memory that someone else allocated: the agent passes memory UCX
// allocated, which shared-memory transports can map into a peer process.
// `keep_alive` owns the bytes; the storage holds it for its own lifetime.
struct KvMemory {
  std::span<std::byte> bytes;
  std::shared_ptr<void> keep_alive;
  // Device memory (a GPU backend's, KernelBackend::kvMemory): already zeroed,
  // and never read or written on the host (copy-on-write goes through
  // Backend::copyKvBlock; a transport must stage it).
  bool device = false;
};

// What the pool stores K and V as.
enum class KvDtype : uint8_t { kFloat32, kBfloat16 };
// "float32", "bfloat16" (the agent's --kv-dtype values).
const char* kvDtypeName(KvDtype dtype);

// One layer's part of one block (a layer block): what a P/D transfer moves
// and checksums at a time.
struct KvLayerBlock {
  int32_t layer = 0;
  BlockId block;
};

struct KvLayout {
  int num_layers = 0;
  int num_blocks = 0;
  int block_size = 0;  // tokens per block
  int num_kv_heads = 0;
  int head_dim = 0;
  KvDtype dtype = KvDtype::kFloat32;

  // Bytes of one element: 4 (fp32) or 2 (bf16).
  size_t elementBytes() const { return dtype == KvDtype::kBfloat16 ? 2 : 4; }
  // Elements in one layer block: K and V for block_size tokens.
  size_t elementsPerLayerBlock() const {
    return 2 * static_cast<size_t>(block_size) * static_cast<size_t>(num_kv_heads) * static_cast<size_t>(head_dim);
  }
  size_t bytesPerLayerBlock() const { return elementsPerLayerBlock() * elementBytes(); }
  // Elements of one token's K (or V) in one layer: [num_kv_heads][head_dim].
  size_t elementsPerToken() const { return static_cast<size_t>(num_kv_heads) * static_cast<size_t>(head_dim); }
  size_t bytesPerToken() const { return elementsPerToken() * elementBytes(); }
  size_t totalElements() const {
    return elementsPerLayerBlock() * static_cast<size_t>(num_blocks) * static_cast<size_t>(num_layers);
  }
  size_t totalBytes() const { return totalElements() * elementBytes(); }
};

class KvStorage {
 public:
  // Allocates and zero-fills the whole region (64-byte aligned).
  explicit KvStorage(const KvLayout& layout);
  // Uses `memory`, which checkMemory() accepted, and zero-fills it (device
  // memory comes zeroed).
  KvStorage(const KvLayout& layout, KvMemory memory);
  // Whether `memory` can hold a pool of `layout`; the error says why not.
  static absl::Status checkMemory(const KvLayout& layout, const KvMemory& memory);

  const KvLayout& layout() const { return layout_; }

  // [2][block_size][num_kv_heads][head_dim] of the pool's dtype. Host pools
  // only: the host never touches a device pool (checked, also in Release: a
  // host read there would be a bug no test on the CPU executor could see
  // otherwise).
  std::byte* layerBlockBytes(int layer, BlockId block) { return hostData() + layerBlockByteOffset(layer, block); }
  const std::byte* layerBlockBytes(int layer, BlockId block) const {
    return hostData() + layerBlockByteOffset(layer, block);
  }
  // [num_kv_heads][head_dim] of token `slot` (0 <= slot < block_size) in the block.
  std::byte* keyBytes(int layer, BlockId block, int slot) {
    return layerBlockBytes(layer, block) + slotOffset(slot) * layout_.elementBytes();
  }
  std::byte* valueBytes(int layer, BlockId block, int slot) {
    return layerBlockBytes(layer, block) + (valueOffset() + slotOffset(slot)) * layout_.elementBytes();
  }
  const std::byte* keyBytes(int layer, BlockId block, int slot) const {
    return layerBlockBytes(layer, block) + slotOffset(slot) * layout_.elementBytes();
  }
  const std::byte* valueBytes(int layer, BlockId block, int slot) const {
    return layerBlockBytes(layer, block) + (valueOffset() + slotOffset(slot)) * layout_.elementBytes();
  }
  // The same as fp32, for an fp32 pool only (checked).
  float* layerBlock(int layer, BlockId block) { return asFloats(layerBlockBytes(layer, block)); }
  const float* layerBlock(int layer, BlockId block) const { return asFloats(layerBlockBytes(layer, block)); }
  float* key(int layer, BlockId block, int slot) { return asFloats(keyBytes(layer, block, slot)); }
  float* value(int layer, BlockId block, int slot) { return asFloats(valueBytes(layer, block, slot)); }
  const float* key(int layer, BlockId block, int slot) const { return asFloats(keyBytes(layer, block, slot)); }
  const float* value(int layer, BlockId block, int slot) const { return asFloats(valueBytes(layer, block, slot)); }
  // Element i of K (or V) of token `slot` as fp32, whatever the dtype (tests, checks).
  float keyAt(int layer, BlockId block, int slot, size_t i) const;
  float valueAt(int layer, BlockId block, int slot, size_t i) const;

  // Copies every layer of `src` into `dst` (copy-on-write of a shared
  // partial block). Host memory only (a device pool copies through
  // Backend::copyKvBlock).
  void copyBlock(BlockId src, BlockId dst);
  // The pool is device memory (KvMemory::device): the host never touches it.
  bool onDevice() const { return device_; }

  // The start of the pool, device or host memory (for a backend's launches).
  std::byte* data() const { return data_; }

  // The whole region, for memory registration.
  std::span<std::byte> bytes() { return {data_, layout_.totalBytes()}; }
  std::span<const std::byte> bytes() const { return {data_, layout_.totalBytes()}; }
  // Where layer block (layer, block) starts in bytes(); consecutive block
  // ids of one layer are consecutive in memory.
  size_t layerBlockByteOffset(int layer, BlockId block) const {
    return layerBlockOffset(layer, block) * layout_.elementBytes();
  }

 private:
  std::byte* hostData() const {
    TANDEM_CHECK(!device_, "the host read or wrote a KV pool in device memory");
    return data_;
  }
  float* asFloats(std::byte* p) const {
    TANDEM_CHECK(layout_.dtype == KvDtype::kFloat32, "fp32 access to a KV pool of another dtype");
    return reinterpret_cast<float*>(p);
  }
  const float* asFloats(const std::byte* p) const {
    TANDEM_CHECK(layout_.dtype == KvDtype::kFloat32, "fp32 access to a KV pool of another dtype");
    return reinterpret_cast<const float*>(p);
  }
  size_t layerBlockOffset(int layer, BlockId block) const {
    return (static_cast<size_t>(layer) * static_cast<size_t>(layout_.num_blocks) + static_cast<size_t>(block.value())) *
           layout_.elementsPerLayerBlock();
  }
  // In elements.
  size_t valueOffset() const { return static_cast<size_t>(layout_.block_size) * layout_.elementsPerToken(); }
  size_t slotOffset(int slot) const { return static_cast<size_t>(slot) * layout_.elementsPerToken(); }

  KvLayout layout_;
  std::shared_ptr<void> owner_;  // keeps data_ alive
  std::byte* data_ = nullptr;
  bool device_ = false;
};

}  // namespace tandem::engine
