// Deterministic random numbers whose whole state is one 64-bit word, so that a resumed run
// continues the same stream (splitmix64 steps; Box-Muller for normals).
#pragma once

#include <cmath>
#include <cstdint>

#include "core/tensor.h"

namespace ft {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) : state_(seed) {}

  uint64_t next_u64() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  double normal() {
    double u1 = uniform();
    while (u1 <= 0.0) u1 = uniform();
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

  uint64_t state() const { return state_; }
  void set_state(uint64_t s) { state_ = s; }

 private:
  uint64_t state_;
};

// Fill a CPU float tensor (any float dtype) with N(mean, std^2) or U[lo, hi) samples.
void fill_normal(Tensor& t, Rng& rng, double mean = 0.0, double std = 1.0);
void fill_uniform(Tensor& t, Rng& rng, double lo, double hi);

}  // namespace ft
