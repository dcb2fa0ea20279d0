// fp32 values in two 16-bit halves (core/f32_halves.h): joining the halves gives every value that
// is not a NaN back bit for bit, the low half always fits int16, the high half is the value
// rounded to bf16 with ties away from zero (round to nearest even's result except at ties with
// an even high half), infinities stay infinite and NaNs NaN; split_f32 and join_f32 on tensors,
// on the CPU and on the GPU (the same bits; skipped without a GPU), and their errors.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/device.h"
#include "core/f32_halves.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "gpu_skip.h"
#include "tensor_test_util.h"

namespace ft {
namespace {

using test::same_bits;

bool is_nan_bits(uint32_t bits) {
  return (bits & 0x7fffffffu) > 0x7f800000u;
}

// Bit patterns that reach every case: every high half with the low halves around the tie
// (0x8000), at both ends and a few others, and random patterns.
std::vector<uint32_t> patterns() {
  std::vector<uint32_t> out;
  for (uint32_t hi = 0; hi < 0x10000u; ++hi) {
    for (uint32_t lo : {0x0000u, 0x0001u, 0x1234u, 0x7fffu, 0x8000u, 0x8001u, 0xabcdu, 0xffffu})
      out.push_back((hi << 16) | lo);
  }
  Rng rng(20261203);
  for (int i = 0; i < 100000; ++i) out.push_back(static_cast<uint32_t>(rng.next_u64()));
  return out;
}

Tensor f32_tensor(const std::vector<uint32_t>& bits) {
  Tensor t = Tensor::empty({static_cast<int64_t>(bits.size())}, DType::f32);
  std::memcpy(t.raw(), bits.data(), t.nbytes());
  return t;
}

TEST(F32Halves, JoinGivesEveryValueBackAndTheHighHalfRoundsTiesAway) {
  int64_t ties_off_even = 0;
  for (const uint32_t bits : patterns()) {
    const F32Halves h = split_f32_bits(bits);
    const float value = std::bit_cast<float>(bits);
    const uint16_t nearest_even = bf16(value).bits;
    if (is_nan_bits(bits)) {
      // A quiet NaN high half (bf16's conversion), nothing in the low half: still a NaN.
      EXPECT_EQ(h.hi, nearest_even) << std::hex << bits;
      EXPECT_EQ(h.lo, 0) << std::hex << bits;
      EXPECT_TRUE(is_nan_bits(join_f32_bits(h.hi, h.lo))) << std::hex << bits;
      continue;
    }
    ASSERT_EQ(join_f32_bits(h.hi, h.lo), bits) << std::hex << bits;
    // Ties away from zero on the magnitude: the sign bit never changes.
    EXPECT_EQ(h.hi, static_cast<uint16_t>((bits + 0x8000u) >> 16)) << std::hex << bits;
    EXPECT_EQ(h.hi & 0x8000u, (bits >> 16) & 0x8000u) << std::hex << bits;
    const bool tie = (bits & 0xffffu) == 0x8000u;
    if (tie && ((bits >> 16) & 1u) == 0) {
      // Nearest even rounds this tie down, away-from-zero up: the one place they differ.
      EXPECT_EQ(h.hi, static_cast<uint16_t>(nearest_even + 1)) << std::hex << bits;
      ++ties_off_even;
    } else {
      EXPECT_EQ(h.hi, nearest_even) << std::hex << bits;
    }
  }
  EXPECT_GT(ties_off_even, 30000);
}

TEST(F32Halves, InfinitiesStayAndFiniteValuesPastTheLargestBf16ComeBack) {
  for (const uint32_t inf : {0x7f800000u, 0xff800000u}) {
    const F32Halves h = split_f32_bits(inf);
    EXPECT_EQ(h.hi, inf >> 16);
    EXPECT_EQ(h.lo, 0);
  }
  // The largest fp32 rounds to an infinite high half, as nearest even rounds it; the low half
  // brings the value back.
  const F32Halves max = split_f32_bits(0x7f7fffffu);
  EXPECT_EQ(max.hi, 0x7f80u);
  EXPECT_EQ(max.lo, -1);
  EXPECT_EQ(join_f32_bits(max.hi, max.lo), 0x7f7fffffu);
  // NaNs whose payload is all in the low bits would carry into infinity; the largest payloads
  // into the sign bit.
  for (const uint32_t nan : {0x7f800001u, 0x7f807fffu, 0x7fffffffu, 0xffffffffu, 0xff800001u}) {
    const F32Halves h = split_f32_bits(nan);
    EXPECT_TRUE(is_nan_bits(join_f32_bits(h.hi, h.lo))) << std::hex << nan;
    EXPECT_EQ(h.hi & 0x8000u, (nan >> 16) & 0x8000u) << std::hex << nan;
  }
}

TEST(F32Halves, TensorsSplitAndJoinOnTheCpu) {
  const std::vector<uint32_t> bits = patterns();
  const Tensor values = f32_tensor(bits);
  const int64_t n = values.numel();
  Tensor hi = Tensor::empty({n}, DType::bf16), lo = Tensor::empty({n}, DType::i16);
  split_f32(hi, lo, values);
  Tensor hi_only = Tensor::empty({n}, DType::bf16), none;
  split_f32(hi_only, none, values);
  EXPECT_TRUE(same_bits(hi_only, hi));
  Tensor joined = Tensor::empty({n}, DType::f32);
  join_f32(joined, hi, lo);
  for (int64_t i = 0; i < n; ++i) {
    const F32Halves h = split_f32_bits(bits[i]);
    ASSERT_EQ(hi.data<bf16>()[i].bits, h.hi) << i;
    ASSERT_EQ(lo.data<int16_t>()[i], h.lo) << i;
    ASSERT_EQ(std::bit_cast<uint32_t>(joined.data<float>()[i]), join_f32_bits(h.hi, h.lo)) << i;
  }
}

TEST(F32Halves, BadTensorsAreClearErrors) {
  const Tensor values = Tensor::zeros({8}, DType::f32);
  Tensor hi = Tensor::zeros({8}, DType::bf16), lo = Tensor::zeros({8}, DType::i16);
  Tensor short_lo = Tensor::zeros({7}, DType::i16), lo32 = Tensor::zeros({8}, DType::i32);
  Tensor hi32 = Tensor::zeros({8}, DType::f32), none;
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] { split_f32(hi, short_lo, values); }).find("lo [7]"), std::string::npos);
  EXPECT_NE(message([&] { split_f32(hi, lo32, values); }).find("lo is int32"), std::string::npos);
  EXPECT_NE(message([&] { split_f32(hi32, lo, values); }).find("hi fp32"), std::string::npos);
  Tensor out = Tensor::zeros({8}, DType::f32);
  EXPECT_NE(message([&] { join_f32(out, hi, none); }).find("lo must be defined"),
            std::string::npos);
  // int16 tensors copy to int16 only.
  EXPECT_NE(message([&] { lo.copy_from(values); }).find("cannot convert fp32 to int16"),
            std::string::npos);
  EXPECT_EQ(dtype_size(DType::i16), 2u);
  EXPECT_EQ(parse_dtype("int16"), DType::i16);
}

TEST(F32Halves, GpuSplitAndJoinGiveTheCpuBits) {
  SKIP_WITHOUT_GPU();
  const std::vector<uint32_t> bits = patterns();
  const Tensor values = f32_tensor(bits);
  const int64_t n = values.numel();
  Tensor hi = Tensor::empty({n}, DType::bf16), lo = Tensor::empty({n}, DType::i16);
  split_f32(hi, lo, values);
  Tensor joined = Tensor::empty({n}, DType::f32);
  join_f32(joined, hi, lo);

  const Tensor dvalues = values.to(Device::cuda);
  Tensor dhi = Tensor::empty({n}, DType::bf16, Device::cuda);
  Tensor dlo = Tensor::empty({n}, DType::i16, Device::cuda), none;
  split_f32(dhi, dlo, dvalues);
  EXPECT_TRUE(same_bits(dhi, hi));
  EXPECT_TRUE(same_bits(dlo, lo));
  Tensor dhi_only = Tensor::empty({n}, DType::bf16, Device::cuda);
  split_f32(dhi_only, none, dvalues);
  EXPECT_TRUE(same_bits(dhi_only, hi));
  Tensor djoined = Tensor::empty({n}, DType::f32, Device::cuda);
  join_f32(djoined, dhi, dlo);
  EXPECT_TRUE(same_bits(djoined, joined));
  // int16 travels both ways unchanged, and fills as the CPU fills.
  EXPECT_TRUE(same_bits(lo.to(Device::cuda).to(Device::cpu), lo));
  Tensor dfill = Tensor::empty({5}, DType::i16, Device::cuda),
         fill = Tensor::empty({5}, DType::i16);
  dfill.fill(-1234.0);
  fill.fill(-1234.0);
  EXPECT_TRUE(same_bits(dfill, fill));
  // Halves on another device than the values are an error.
  EXPECT_THROW(split_f32(hi, lo, dvalues), Error);
}

}  // namespace
}  // namespace ft
