#include "engine/kv/kv_storage.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "engine/backend/kernel_math.h"
#include "src/common/strings.h"

namespace tandem::engine {

const char* kvDtypeName(KvDtype dtype) { return dtype == KvDtype::kBfloat16 ? "bfloat16" : "float32"; }

KvStorage::KvStorage(const KvLayout& layout) : layout_(layout) {
  size_t bytes = layout.totalBytes();
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (p == nullptr) throw std::bad_alloc();  // start-up only: the pool is sized once
  std::memset(p, 0, rounded == 0 ? 64 : rounded);
  owner_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  data_ = static_cast<std::byte*>(p);
}

KvStorage::KvStorage(const KvLayout& layout, KvMemory memory)
    : layout_(layout), owner_(std::move(memory.keep_alive)), data_(memory.bytes.data()), device_(memory.device) {
  if (!device_) std::memset(data_, 0, layout.totalBytes());
}

absl::Status KvStorage::checkMemory(const KvLayout& layout, const KvMemory& memory) {
  const size_t need = layout.totalBytes();
  if (memory.bytes.size() < need) {
    return absl::InvalidArgumentError(strCat("KV pool memory: ", memory.bytes.size(), " bytes given, the pool needs ", need));
  }
  if (reinterpret_cast<uintptr_t>(memory.bytes.data()) % 64 != 0) {
    return absl::InvalidArgumentError("KV pool memory: not 64-byte aligned");
  }
  return absl::OkStatus();
}

void KvStorage::copyBlock(BlockId src, BlockId dst) {
  TANDEM_CHECK(!device_, "a device pool copies through Backend::copyKvBlock");
  for (int l = 0; l < layout_.num_layers; ++l) {
    std::memcpy(layerBlockBytes(l, dst), layerBlockBytes(l, src), layout_.bytesPerLayerBlock());
  }
}

namespace {
float elementAt(const std::byte* p, KvDtype dtype, size_t i) {
  if (dtype == KvDtype::kBfloat16) {
    uint16_t h;
    std::memcpy(&h, p + i * 2, 2);
    return kmath::bf16Value(h);
  }
  float f;
  std::memcpy(&f, p + i * 4, 4);
  return f;
}
}  // namespace

float KvStorage::keyAt(int layer, BlockId block, int slot, size_t i) const {
  return elementAt(keyBytes(layer, block, slot), layout_.dtype, i);
}
float KvStorage::valueAt(int layer, BlockId block, int slot, size_t i) const {
  return elementAt(valueBytes(layer, block, slot), layout_.dtype, i);
}

}  // namespace tandem::engine
