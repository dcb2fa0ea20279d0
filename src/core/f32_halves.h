// fp32 values kept as two 16-bit halves whose high half is their bf16 rounding, so that a bf16
// copy of fp32 values is part of their storage instead of a third buffer. A bf16 model keeps
// its fp32 master weights this way (models::Parameter): the bf16 weights the layers read are
// the high halves, the low halves (int16) hold what the rounding left out, and the two give the
// fp32 value back exactly. An fp32 value with its bf16 copy then takes 4 bytes instead of 4 + 2,
// and AdamW reads and writes 2 + 2 bytes where it read and wrote 4 and then wrote the copy's 2.
//
// On the fp32 bit pattern (unsigned 32-bit arithmetic):
//   hi = (bits + 0x8000) >> 16     round to nearest, ties away from zero (the sign is a bit of
//                                  its own, so this rounds the magnitude)
//   lo = bits - (hi << 16)         always in [-32768, 32767]: the low 16 bits of bits read as
//                                  int16 (bit 15 set is exactly when hi was rounded up)
//   bits = (hi << 16) + lo         exact, for every value that is not a NaN
// Round to nearest even cannot be made lossless in 16 bits: a tie (low bits 0x8000) rounds
// down when the high half is even, leaving lo = +32768, and up when it is odd, leaving -32768,
// so lo would need 17 bits. That is why the high half rounds ties away, and why it differs from
// bf16's round-to-nearest-even conversion (core/bf16.h, Tensor::to) where the low 16 bits are
// exactly 0x8000 and the high 16 are even.
// Infinities split into hi = inf, lo = 0; finite values past the largest bf16 get hi = inf too
// (as round to nearest even gives them) and a negative lo that brings them back. A NaN gets the
// quiet NaN bf16's conversion gives (sign and high payload kept) and lo = 0: the carry of
// bits + 0x8000 would turn a NaN whose payload lies in the low 16 bits into infinity
// (0x7f800001..0x7f807fff) and carry the largest payloads into the sign bit. A NaN stays a NaN,
// with another payload perhaps.
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "core/tensor.h"

namespace ft {

struct F32Halves {
  uint16_t hi;  // bf16 bits
  int16_t lo;
};

FT_HOST_DEVICE inline F32Halves split_f32_bits(uint32_t bits) {
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return {static_cast<uint16_t>((bits >> 16) | 0x0040u), 0};  // NaN: a quiet NaN
  }
  const uint32_t hi = (bits + 0x8000u) >> 16;
  return {static_cast<uint16_t>(hi), static_cast<int16_t>(static_cast<int32_t>(bits - (hi << 16)))};
}

FT_HOST_DEVICE inline uint32_t join_f32_bits(uint16_t hi, int16_t lo) {
  return (static_cast<uint32_t>(hi) << 16) + static_cast<uint32_t>(static_cast<int32_t>(lo));
}

// hi (bf16) and lo (int16) of every element of values (fp32), all of one shape size and on one
// device. An undefined lo writes hi alone: the bf16 copy of fp32 values kept whole, rounded as
// the high half of split ones (the slow twin that split values are tested against).
void split_f32(Tensor& hi, Tensor& lo, const Tensor& values);
// values (fp32) = the fp32 values whose halves are hi (bf16) and lo (int16), exactly.
void join_f32(Tensor& values, const Tensor& hi, const Tensor& lo);

}  // namespace ft
