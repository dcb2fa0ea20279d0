// Tensor::wrap (memory another framework owns) and cuda::StreamScope (another framework's
// stream): a wrapped tensor reads and writes the caller's memory in place, is never counted or
// freed, and its views share it; a scope swaps this thread's stream and restores it.
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

TEST(TensorWrap, ReadsAndWritesTheCallersMemoryInPlace) {
  std::vector<float> memory(24);
  for (size_t i = 0; i < memory.size(); ++i) memory[i] = static_cast<float>(i) + 0.5f;
  const int64_t used_before = memory_stats(Device::cpu).used_bytes;
  {
    Tensor t = Tensor::wrap(memory.data(), {2, 3, 4}, DType::f32);
    EXPECT_EQ(memory_stats(Device::cpu).used_bytes, used_before);
    EXPECT_EQ(t.raw(), memory.data());
    EXPECT_EQ(t.data<float>()[7], 7.5f);
    t.data<float>()[5] = -1.0f;
    EXPECT_EQ(memory[5], -1.0f);
    // Views and slices share the borrowed memory.
    Tensor second = t.slice(1, 2).view({12});
    EXPECT_EQ(second.data<float>(), memory.data() + 12);
    second.fill(3.0);
    EXPECT_EQ(memory[12], 3.0f);
    EXPECT_EQ(memory[23], 3.0f);
    EXPECT_EQ(memory[11], 11.5f);
    // A copy is the library's own memory, counted while it lives.
    Tensor copy = t.clone();
    EXPECT_NE(copy.raw(), memory.data());
    EXPECT_GT(memory_stats(Device::cpu).used_bytes, used_before);
  }
  // Nothing was freed into the caller's vector: it is intact and still ours.
  EXPECT_EQ(memory_stats(Device::cpu).used_bytes, used_before);
  EXPECT_EQ(memory[0], 0.5f);
  EXPECT_EQ(memory[12], 3.0f);
}

TEST(TensorWrap, RejectsNullDataAndNegativeShapes) {
  float x = 0.0f;
  EXPECT_THROW(Tensor::wrap(nullptr, {2}, DType::f32), Error);
  EXPECT_THROW(Tensor::wrap(&x, {-1}, DType::f32), Error);
  // An empty tensor needs no memory.
  const Tensor empty = Tensor::wrap(nullptr, {0, 4}, DType::bf16);
  EXPECT_TRUE(empty.defined());
  EXPECT_EQ(empty.numel(), 0);
}

#ifdef FLASHTRAIN_WITH_CUDA
TEST(StreamScope, SwapsThisThreadsStreamAndRestoresIt) {
  // No GPU is needed to swap the handle; a GPU is needed to launch on it (below).
  const cudaStream_t fake_a = reinterpret_cast<cudaStream_t>(0x1234);
  const cudaStream_t fake_b = reinterpret_cast<cudaStream_t>(0x5678);
  EXPECT_EQ(cuda::current_stream(), cudaStreamPerThread);
  {
    cuda::StreamScope a(fake_a);
    EXPECT_EQ(cuda::current_stream(), fake_a);
    {
      cuda::StreamScope b(fake_b);
      EXPECT_EQ(cuda::current_stream(), fake_b);
    }
    EXPECT_EQ(cuda::current_stream(), fake_a);
  }
  EXPECT_EQ(cuda::current_stream(), cudaStreamPerThread);
}

TEST(StreamScope, WorkAndMemoryFollowTheCallersStream) {
  if (cuda_device_count() == 0) GTEST_SKIP() << cuda_unavailable_reason();
  cuda::init_device(0);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  std::vector<float> host(1 << 20, 2.5f);
  {
    cuda::StreamScope scope(stream);
    // Allocation, copies and the fill are queued on `stream`, and freed there.
    Tensor a = Tensor::empty({static_cast<int64_t>(host.size())}, DType::f32, Device::cuda);
    a.fill(1.0);
    Tensor from_host = Tensor::wrap(host.data(), a.shape(), DType::f32);
    a.copy_from(from_host);
    const Tensor back = a.to(Device::cpu);  // synchronises `stream` only
    EXPECT_EQ(back.data<float>()[0], 2.5f);
    EXPECT_EQ(back.data<float>()[host.size() - 1], 2.5f);
  }
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}
#endif

}  // namespace
}  // namespace ft
