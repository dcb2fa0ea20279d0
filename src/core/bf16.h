// bfloat16 storage type for the CPU: 8 exponent bits, 7 mantissa bits, round-to-nearest-even.
#pragma once

#include <cstdint>
#include <cstring>

namespace ft {

struct bf16 {
  uint16_t bits = 0;

  bf16() = default;
  explicit bf16(float f) : bits(round_bits(f)) {}
  explicit operator float() const { return to_float(); }

  float to_float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }

  static bf16 from_bits(uint16_t b) {
    bf16 r;
    r.bits = b;
    return r;
  }

  static uint16_t round_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
      return static_cast<uint16_t>((u >> 16) | 0x0040u);  // keep NaN a quiet NaN
    }
    const uint32_t lsb = (u >> 16) & 1u;
    u += 0x7fffu + lsb;
    return static_cast<uint16_t>(u >> 16);
  }
};

// Round a float to the nearest bf16 value and back (what storing in bf16 does to it).
inline float round_to_bf16(float f) {
  return bf16(f).to_float();
}

}  // namespace ft
