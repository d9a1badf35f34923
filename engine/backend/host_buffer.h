#pragma once
// Backend memory of the host backends (backend.h's BackendBuffer): an owned,
// 64-byte aligned allocation, or a view of host weights that someone else owns.

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>
#include <span>

#include "engine/backend/backend.h"

namespace tandem::engine {

class HostBuffer final : public BackendBuffer {
 public:
  // `floats` floats of 64-byte aligned memory, contents undefined.
  static std::unique_ptr<HostBuffer> allocate(size_t floats) {
    const size_t bytes = (std::max<size_t>(floats, 1) * sizeof(float) + 63) / 64 * 64;
    auto* p = static_cast<float*>(std::aligned_alloc(64, bytes));
    if (p == nullptr) throw std::bad_alloc();
    return std::unique_ptr<HostBuffer>(new HostBuffer(p, floats, true));
  }
  // `host` itself, not owned (the caller keeps it alive).
  static std::unique_ptr<HostBuffer> view(std::span<const float> host) {
    return std::unique_ptr<HostBuffer>(new HostBuffer(const_cast<float*>(host.data()), host.size(), false));
  }
  ~HostBuffer() override {
    if (owned_) std::free(data());
  }

 private:
  HostBuffer(float* data, size_t floats, bool owned) : BackendBuffer(data, floats), owned_(owned) {}
  bool owned_;
};

}  // namespace tandem::engine
