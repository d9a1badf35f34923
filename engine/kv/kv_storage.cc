#include "engine/kv/kv_storage.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace tandem::engine {

void KvStorage::FreeDeleter::operator()(float* p) const { std::free(p); }

KvStorage::KvStorage(const KvLayout& layout) : layout_(layout) {
  size_t bytes = layout.totalFloats() * sizeof(float);
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (p == nullptr) throw std::bad_alloc();  // start-up only: the pool is sized once
  std::memset(p, 0, rounded == 0 ? 64 : rounded);
  data_.reset(static_cast<float*>(p));
}

void KvStorage::copyBlock(BlockId src, BlockId dst) {
  for (int l = 0; l < layout_.num_layers; ++l) {
    std::memcpy(layerBlock(l, dst), layerBlock(l, src), layout_.bytesPerLayerBlock());
  }
}

}  // namespace tandem::engine
