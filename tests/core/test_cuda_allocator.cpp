// The stream-ordered device allocator: accounting and reuse. Skips without a GPU.
#include <gtest/gtest.h>

#include <vector>

#include "core/device.h"
#include "core/memory.h"
#include "core/tensor.h"

#ifdef FLASHTRAIN_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda/runtime.h"
#endif

namespace ft {
namespace {

TEST(CudaAllocator, AccountsAndKeepsMemoryReserved) {
#ifndef FLASHTRAIN_WITH_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  if (cuda_device_count() == 0) GTEST_SKIP() << cuda_unavailable_reason();
  cuda::init_device(0);
  const int64_t mb64 = 64ll << 20;
  reset_peak_memory(Device::cuda);
  const int64_t before = memory_stats(Device::cuda).used_bytes;
  {
    Tensor t = Tensor::empty({mb64 / 4}, DType::f32, Device::cuda);
    // Write and read back through the device, so the memory is real.
    std::vector<float> host(static_cast<size_t>(t.numel()), 1.5f), back(host.size(), 0.0f);
    ASSERT_EQ(cudaMemcpy(t.raw(), host.data(), t.nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(back.data(), t.raw(), t.nbytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(back, host);
    const MemoryStats s = memory_stats(Device::cuda);
    EXPECT_EQ(s.used_bytes - before, mb64);
    EXPECT_GE(s.peak_used_bytes - before, mb64);
    EXPECT_GE(s.peak_reserved_bytes, mb64);
  }
  cuda::synchronize();
  EXPECT_EQ(memory_stats(Device::cuda).used_bytes, before);
  // Freed blocks stay in the pool: the reserved high-water mark survives a reset.
  reset_peak_memory(Device::cuda);
  EXPECT_GE(memory_stats(Device::cuda).peak_reserved_bytes, mb64);
#endif
}

TEST(CudaAllocator, OutOfMemoryIsAClearError) {
#ifndef FLASHTRAIN_WITH_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  if (cuda_device_count() == 0) GTEST_SKIP() << cuda_unavailable_reason();
  cuda::init_device(0);
  try {
    Tensor t = Tensor::empty({int64_t{1} << 45}, DType::f32, Device::cuda);  // 128 TB
    FAIL() << "allocated 128 TB";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of GPU memory"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("smaller --batch-size"), std::string::npos);
  }
#endif
}

}  // namespace
}  // namespace ft
