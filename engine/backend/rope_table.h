#pragma once
// RoPE's cos and sin per (position, frequency), kmath::ropeCosSinFreq's bits,
// for positions [0, positions()) of one set of inverse frequencies: what the
// CPU backend's rope rows read, and what the GPU rope kernel reads once
// uploaded (pow, cos and sin per row were most of rope's time). Grown on
// demand; another set of frequencies starts it over. Not thread-safe: one
// backend owns it.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/backend/kernel_math.h"

namespace tandem::engine {

class RopeTable {
 public:
  // Makes the table cover positions [0, positions) for inv_freq ([head_dim / 2]).
  void grow(int32_t positions, std::span<const float> inv_freq) {
    const size_t half = inv_freq.size();
    if (!std::equal(inv_freq.begin(), inv_freq.end(), inv_freq_.begin(), inv_freq_.end())) {
      inv_freq_.assign(inv_freq.begin(), inv_freq.end());
      cos_.clear();
      sin_.clear();
    }
    const size_t cached = cos_.size() / half;
    if (static_cast<size_t>(positions) <= cached) return;
    cos_.resize(static_cast<size_t>(positions) * half);
    sin_.resize(cos_.size());
    for (size_t p = cached; p < static_cast<size_t>(positions); ++p) {
      for (size_t i = 0; i < half; ++i) {
        kmath::ropeCosSinFreq(static_cast<int32_t>(p), inv_freq[i], &cos_[p * half + i], &sin_[p * half + i]);
      }
    }
  }
  const float* cos() const { return cos_.data(); }  // [position][head_dim / 2]
  size_t floats() const { return cos_.size(); }      // of cos() and of sin()
  std::span<const float> frequencies() const { return inv_freq_; }
  const float* sin() const { return sin_.data(); }  // [position][head_dim / 2]

 private:
  std::vector<float> inv_freq_;  // [head_dim / 2] the table's frequencies
  std::vector<float> cos_, sin_;
};

}  // namespace tandem::engine
