#include "engine/kv/kv_storage.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "src/common/strings.h"

namespace tandem::engine {

KvStorage::KvStorage(const KvLayout& layout) : layout_(layout) {
  size_t bytes = layout.totalFloats() * sizeof(float);
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (p == nullptr) throw std::bad_alloc();  // start-up only: the pool is sized once
  std::memset(p, 0, rounded == 0 ? 64 : rounded);
  owner_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  data_ = static_cast<float*>(p);
}

KvStorage::KvStorage(const KvLayout& layout, KvMemory memory)
    : layout_(layout),
      owner_(std::move(memory.keep_alive)),
      data_(reinterpret_cast<float*>(memory.bytes.data())),
      device_(memory.device) {
  if (!device_) std::memset(data_, 0, layout.totalFloats() * sizeof(float));
}

absl::Status KvStorage::checkMemory(const KvLayout& layout, const KvMemory& memory) {
  const size_t need = layout.totalFloats() * sizeof(float);
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
    std::memcpy(layerBlock(l, dst), layerBlock(l, src), layout_.bytesPerLayerBlock());
  }
}

}  // namespace tandem::engine
