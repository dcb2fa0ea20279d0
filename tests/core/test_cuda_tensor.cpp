// Device tensors: CPU <-> CUDA round trips for every dtype, dtype conversion on the GPU against
// the CPU's (bit for bit, over every bf16 pattern and random fp32/fp64 bit patterns), fill and
// zero on the GPU, copies into slices, the comparison helpers on CUDA tensors, bad input.
// Skips itself without a GPU or in a build without CUDA.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/device.h"
#include "core/memory.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "gpu_skip.h"
#include "tensor_test_util.h"

namespace ft {
namespace {

using test::same_bits;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Random contents: normals for float dtypes, arbitrary ints for int32.
Tensor random_cpu(const Shape& shape, DType dtype, uint64_t seed) {
  Tensor t = Tensor::empty(shape, dtype);
  Rng rng(seed);
  if (dtype == DType::i32) {
    for (int64_t i = 0; i < t.numel(); ++i) {
      t.data<int32_t>()[i] = static_cast<int32_t>(rng.next_u64());
    }
  } else {
    fill_normal(t, rng, 0.0, 3.0);
  }
  return t;
}

double element(const Tensor& cpu, int64_t i) {
  const Tensor one = cpu.view({cpu.numel()}).slice(i, i + 1).to(DType::f64);
  return one.data<double>()[0];
}

// Equal bits, or both NaN (a NaN's payload may differ after fp64 <-> fp32 conversions, which
// the GPU canonicalises and x86 does not). Returns the index of the first mismatch or -1.
int64_t first_mismatch(const Tensor& got, const Tensor& want) {
  EXPECT_EQ(got.dtype(), want.dtype());
  EXPECT_EQ(got.numel(), want.numel());
  const size_t size = dtype_size(want.dtype());
  const auto* g = static_cast<const unsigned char*>(got.raw());
  const auto* w = static_cast<const unsigned char*>(want.raw());
  for (int64_t i = 0; i < want.numel(); ++i) {
    if (std::memcmp(g + i * size, w + i * size, size) == 0) continue;
    if (std::isnan(element(got, i)) && std::isnan(element(want, i))) continue;
    return i;
  }
  return -1;
}

TEST(CudaTensor, RoundTripEveryDtypeIsExact) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::f32, DType::bf16, DType::f64, DType::i32}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor cpu = random_cpu({3, 37, 5}, dtype, 1 + static_cast<uint64_t>(dtype));
    const Tensor gpu = cpu.to(Device::cuda);
    EXPECT_EQ(gpu.device(), Device::cuda);
    EXPECT_EQ(gpu.shape(), cpu.shape());
    EXPECT_EQ(gpu.dtype(), dtype);
    EXPECT_NE(gpu.raw(), cpu.raw());
    EXPECT_EQ(gpu.to(Device::cpu).device(), Device::cpu);
    EXPECT_TRUE(same_bits(gpu.to(Device::cpu), cpu));
    EXPECT_TRUE(same_bits(gpu.clone().to(Device::cpu), cpu));                  // device -> device
    EXPECT_TRUE(same_bits(gpu.to(Device::cuda).to(Device::cpu), cpu));         // a copy, not *this
    EXPECT_TRUE(same_bits(gpu.slice(1, 3).to(Device::cpu), cpu.slice(1, 3)));  // offsets
    EXPECT_TRUE(same_bits(cpu.to(Device::cpu), cpu));
  }
}

TEST(CudaTensor, EmptyTensorsRoundTrip) {
  SKIP_WITHOUT_GPU();
  const Tensor cpu = Tensor::empty({0, 4}, DType::f32);
  const Tensor back = cpu.to(Device::cuda).to(DType::bf16).to(Device::cpu);
  EXPECT_EQ(back.shape(), (Shape{0, 4}));
  EXPECT_EQ(back.dtype(), DType::bf16);
}

TEST(CudaTensor, EmptyOnCudaInitialisesTheDevice) {
  SKIP_WITHOUT_GPU();
  const Tensor t = Tensor::empty({16}, DType::f32, Device::cuda);
  EXPECT_TRUE(has_device_allocator(Device::cuda));
  EXPECT_EQ(t.device(), Device::cuda);
}

TEST(CudaTensor, CopyIntoSliceTouchesOnlyTheSlice) {
  SKIP_WITHOUT_GPU();
  Tensor dst = Tensor::empty({4, 6}, DType::f32, Device::cuda);
  dst.fill(kNaN);
  const Tensor src = random_cpu({2, 6}, DType::f32, 7);
  Tensor middle = dst.slice(1, 3);
  middle.copy_from(src);  // CPU -> CUDA into an offset view
  const Tensor back = dst.to(Device::cpu);
  EXPECT_TRUE(same_bits(back.slice(1, 3), src));
  for (int64_t row : {0, 3}) {
    for (int64_t c = 0; c < 6; ++c) EXPECT_TRUE(std::isnan(back.data<float>()[row * 6 + c]));
  }
  // CUDA -> CPU into an offset view.
  Tensor host = Tensor::zeros({4, 6}, DType::f32);
  Tensor host_rows = host.slice(2, 4);
  host_rows.copy_from(dst.slice(1, 3));
  EXPECT_TRUE(same_bits(host.slice(2, 4), src));
  EXPECT_EQ(host.data<float>()[0], 0.0f);
}

// Sources whose conversions exercise every rounding path: all 65536 bf16 patterns, random
// fp32/fp64 bit patterns (NaNs, infinities, subnormals, huge values), normals, and hand-picked
// ties and double-rounding cases.
Tensor conversion_source(DType dtype) {
  Rng rng(42 + static_cast<uint64_t>(dtype));
  if (dtype == DType::bf16) {
    Tensor t = Tensor::empty({65536}, DType::bf16);
    for (int64_t i = 0; i < 65536; ++i)
      t.data<bf16>()[i] = bf16::from_bits(static_cast<uint16_t>(i));
    return t;
  }
  const int64_t n_random_bits = 60000, n_normal = 20000;
  std::vector<double> special = {
      0.0,
      -0.0,
      1.0,
      -1.0,
      1.0 / 3.0,
      65504.0,
      1e-40,
      -1e-45,
      1e-310,
      3.4e38,
      1e39,
      -1e300,
      kNaN,
      -kNaN,
      INFINITY,
      -INFINITY,
      1.0 + std::ldexp(1.0, -8),                          // bf16 tie
      1.0 + std::ldexp(3.0, -8),                          // tie, odd
      1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30)};  // f64->f32 first
  Tensor t =
      Tensor::empty({n_random_bits + n_normal + static_cast<int64_t>(special.size())}, dtype);
  for (int64_t i = 0; i < n_random_bits; ++i) {
    const uint64_t bits = rng.next_u64();
    if (dtype == DType::f32) {
      const auto b32 = static_cast<uint32_t>(bits);
      std::memcpy(&t.data<float>()[i], &b32, 4);
    } else {
      // Exponents near fp32's range, so fp64 -> fp32/bf16 rounding is exercised, not just inf.
      const uint64_t exponent = 1023 - 140 + (bits >> 52) % 280;
      const uint64_t b64 = (bits & 0x800fffffffffffffull) | (exponent << 52);
      std::memcpy(&t.data<double>()[i], &b64, 8);
    }
  }
  for (int64_t i = 0; i < n_normal; ++i) {
    const double v = rng.normal() * std::pow(10.0, static_cast<double>(i % 9) - 4);
    Tensor one = t.slice(n_random_bits + i, n_random_bits + i + 1);
    one.fill(v);
  }
  for (size_t i = 0; i < special.size(); ++i) {
    const int64_t at = n_random_bits + n_normal + static_cast<int64_t>(i);
    Tensor one = t.slice(at, at + 1);
    one.fill(special[i]);
  }
  return t;
}

TEST(CudaTensor, ConversionOnDeviceMatchesCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  for (DType src_dtype : {DType::f32, DType::bf16, DType::f64}) {
    const Tensor src = conversion_source(src_dtype);
    const Tensor src_gpu = src.to(Device::cuda);
    for (DType dst_dtype : {DType::f32, DType::bf16, DType::f64}) {
      SCOPED_TRACE(str(dtype_name(src_dtype), " -> ", dtype_name(dst_dtype)));
      const Tensor want = src.to(dst_dtype);  // the CPU conversion
      // On the GPU, into a poisoned destination.
      Tensor dst_gpu = Tensor::empty(src.shape(), dst_dtype, Device::cuda);
      dst_gpu.fill(kNaN);
      dst_gpu.copy_from(src_gpu);
      int64_t bad = first_mismatch(dst_gpu.to(Device::cpu), want);
      EXPECT_EQ(bad, -1) << "element " << bad << " = " << (bad >= 0 ? element(src, bad) : 0.0);
      // to(DType) on a GPU tensor stays on the GPU.
      const Tensor converted = src_gpu.to(dst_dtype);
      EXPECT_EQ(converted.device(), Device::cuda);
      EXPECT_EQ(first_mismatch(converted.to(Device::cpu), want), -1);
      // Across devices with a dtype change, both ways.
      Tensor host_dst = Tensor::empty(src.shape(), dst_dtype);
      host_dst.copy_from(src_gpu);
      EXPECT_EQ(first_mismatch(host_dst, want), -1);
      Tensor gpu_dst = Tensor::empty(src.shape(), dst_dtype, Device::cuda);
      gpu_dst.copy_from(src);
      EXPECT_EQ(first_mismatch(gpu_dst.to(Device::cpu), want), -1);
    }
  }
}

TEST(CudaTensor, FillAndZeroMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::f32, DType::bf16, DType::f64, DType::i32}) {
    for (double value : {1.5, -3.25, 1.0 / 3.0, 1e-40, 7.0, 1e30, kNaN}) {
      if (dtype == DType::i32 && (std::isnan(value) || value > 1e9)) continue;
      SCOPED_TRACE(str(dtype_name(dtype), " fill ", value));
      Tensor gpu = Tensor::empty({1027}, dtype, Device::cuda);  // not a multiple of the block
      gpu.fill(value);
      Tensor cpu = Tensor::empty({1027}, dtype);
      cpu.fill(value);
      EXPECT_TRUE(same_bits(gpu.to(Device::cpu), cpu));
      gpu.zero();
      EXPECT_TRUE(same_bits(gpu.to(Device::cpu), Tensor::zeros({1027}, dtype)));
    }
  }
  // fill and zero of a slice leave the rest alone.
  Tensor gpu = Tensor::empty({5, 3}, DType::f32, Device::cuda);
  gpu.fill(2.0);
  Tensor rows = gpu.slice(1, 3);
  rows.zero();
  Tensor last = gpu.slice(4, 5);
  last.fill(-1.0);
  const Tensor back = gpu.to(Device::cpu);
  const std::vector<float> want = {2, 2, 2, 0, 0, 0, 0, 0, 0, 2, 2, 2, -1, -1, -1};
  EXPECT_EQ(std::vector<float>(back.data<float>(), back.data<float>() + 15), want);
  // zeros() on the GPU.
  const Tensor z = Tensor::zeros({33}, DType::bf16, Device::cuda);
  EXPECT_TRUE(same_bits(z.to(Device::cpu), Tensor::zeros({33}, DType::bf16)));
}

TEST(CudaTensor, ComparisonHelpersAcceptCudaTensors) {
  SKIP_WITHOUT_GPU();
  const Tensor cpu = random_cpu({64}, DType::f32, 11);
  const Tensor gpu = cpu.to(Device::cuda);
  EXPECT_EQ(max_abs_diff(gpu, cpu), 0.0);
  EXPECT_EQ(relative_error(cpu, gpu), 0.0);
  EXPECT_TRUE(all_finite(gpu));
  Tensor poisoned = Tensor::empty({64}, DType::bf16, Device::cuda);
  poisoned.fill(kNaN);
  EXPECT_FALSE(all_finite(poisoned));
  EXPECT_TRUE(std::isnan(max_abs_diff(poisoned, gpu)));
}

TEST(CudaTensor, TransfersDoNotLeakDeviceMemory) {
  SKIP_WITHOUT_GPU();
  const Tensor cpu = random_cpu({1000}, DType::f32, 12);
  { const Tensor warm = cpu.to(Device::cuda); }
  const int64_t before = memory_stats(Device::cuda).used_bytes;
  for (int i = 0; i < 3; ++i) {
    const Tensor back = cpu.to(Device::cuda).to(DType::bf16).to(Device::cpu);
    EXPECT_EQ(back.numel(), 1000);
  }
  EXPECT_EQ(memory_stats(Device::cuda).used_bytes, before);
}

TEST(CudaTensor, BadCopiesAreClearErrors) {
  SKIP_WITHOUT_GPU();
  Tensor gpu = Tensor::empty({4, 4}, DType::f32, Device::cuda);
  const Tensor wrong = Tensor::zeros({3, 4}, DType::f32);
  EXPECT_THROW(gpu.copy_from(wrong), Error);
  EXPECT_THROW(gpu.copy_from(wrong.to(Device::cuda)), Error);
  const Tensor ints = Tensor::zeros({4, 4}, DType::i32, Device::cuda);
  try {
    gpu.copy_from(ints);
    FAIL() << "int32 -> fp32 conversion on the GPU did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot convert"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ints.to(DType::f32), Error);
}

}  // namespace
}  // namespace ft
