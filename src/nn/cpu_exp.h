// exp on the CPU in a form the compiler vectorises (no branches, no calls): Cody-Waite range
// reduction x = n ln2 + r with |r| <= ln2 / 2, a degree-7 polynomial for e^r (Cephes' expf
// coefficients), and 2^n put into the exponent bits. Relative error under 1.5 ulp of fp32 for
// x in [-87, 88] (tests/nn/test_cpu_exp.cpp, against fp64 std::exp); below -87 it returns 0,
// so exp(-inf) = 0. The fused cross-entropy (classifier.cpp) uses it for fp32 and bf16 logits:
// it runs once per logit per step, and std::exp, a call per element, was most of the kernel.
// The loops that call it vectorise only without -ftrapping-math (the comparisons may not
// trap): classifier.cpp is built with -fno-trapping-math (CMakeLists.txt).
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

namespace ft::nn::cpu {

inline float exp_vectorizable(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;  // ln 2 = hi + lo
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds
  constexpr float kLowest = -87.0f;      // e^-87 is still a normal fp32
  const float xc = std::max(x, kLowest);
  const float n = (xc * kLog2e + kRound) - kRound;
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float scaled =
      std::bit_cast<float>(std::bit_cast<int32_t>(p) + (static_cast<int32_t>(n) << 23));
  return x < kLowest ? 0.0f : scaled;
}

}  // namespace ft::nn::cpu
