#pragma once
// A small deterministic random source for the trace generator: the same seed
// gives the same numbers on every platform and standard library (the
// std:: distributions are implementation-defined, so they are not used).
// SplitMix64 (Steele, Lea, Flood 2014) for the bits; inverse-CDF transforms
// for the distributions. Not thread-safe; one owner.

#include <cmath>
#include <cstdint>
#include <numbers>

namespace tandem::replay {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}

  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Uniform in [lo, hi].
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // Exponential with the given mean.
  double exponential(double mean) { return -mean * std::log1p(-uniform()); }
  // Log-normal with the given mean and shape sigma (the log's standard
  // deviation): heavy enough a tail for prompt appends, never negative.
  double lognormal(double mean, double sigma) {
    // Box-Muller; u1 in (0, 1] so the log is finite.
    const double u1 = 1.0 - uniform();
    const double u2 = uniform();
    const double normal = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
    const double mu = std::log(mean) - sigma * sigma / 2;  // E[X] = exp(mu + sigma^2/2) = mean
    return std::exp(mu + sigma * normal);
  }

 private:
  uint64_t state_;
};

}  // namespace tandem::replay
