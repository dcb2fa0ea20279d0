// CUDA graphs (core/cuda/graph.h): what a capture records and what a replay sees. Skips without
// a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/graph.h"
#include "core/memory.h"
#include "core/tensor.h"
#include "gpu_skip.h"

#ifdef FLASHTRAIN_WITH_CUDA
#include "core/cuda/graph.h"
#include "core/cuda/runtime.h"
#endif

namespace ft {
namespace {

std::vector<float> host_values(const Tensor& t) {
  const Tensor h = t.to(Device::cpu);
  return std::vector<float>(h.data<float>(), h.data<float>() + h.numel());
}

void fill_host(Tensor& t, float first) {
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = first + static_cast<float>(i);
}

template <class F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    FAIL() << "no error; expected one containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// A copy from page-locked memory reads it when the replay runs: the graph's input. The pinned
// tensor is made first, before any CUDA tensor: it must still be page-locked (run alone, under
// compute-sanitizer, it was not, before empty_pinned set up the GPU itself).
TEST(CudaGraph, ReplaysReadPageLockedInputsAsTheyAreThen) {
  SKIP_WITHOUT_GPU();
  Tensor input = Tensor::empty_pinned({1000}, DType::f32);
  fill_host(input, 1.0f);
  Tensor out = Tensor::zeros({1000}, DType::f32, Device::cuda);  // from before the capture
  Tensor kept;  // created by the captured work and kept
  const DeviceGraph g = DeviceGraph::capture(Device::cuda, [&] {
    kept = input.to(Device::cuda);
    out.copy_from(kept);
  });
  ASSERT_TRUE(g.captured());
  EXPECT_GE(g.node_count(), 2u);
  EXPECT_EQ(host_values(out), std::vector<float>(1000, 0.0f));  // nothing ran at capture
  for (float first : {5.0f, -3.0f, 100.0f}) {
    fill_host(input, first);
    g.replay();
    synchronize(Device::cuda);
    std::vector<float> want(1000);
    for (size_t i = 0; i < want.size(); ++i) want[i] = first + static_cast<float>(i);
    EXPECT_EQ(host_values(out), want) << first;
    EXPECT_EQ(host_values(kept), want) << first;  // what the last replay wrote
  }
}

// Pageable memory would be gone by the replay; reading the device has nothing to read yet.
TEST(CudaGraph, PageableCopiesAndHostReadsAreRefused) {
  SKIP_WITHOUT_GPU();
  const Tensor pageable = Tensor::zeros({16}, DType::f32);
  expect_error([&] { DeviceGraph::capture(Device::cuda, [&] { pageable.to(Device::cuda); }); },
               "pageable host memory");
  const Tensor on_gpu = Tensor::zeros({16}, DType::f32, Device::cuda);
  expect_error([&] { DeviceGraph::capture(Device::cuda, [&] { on_gpu.to(Device::cpu); }); },
               "copy to host memory");
  // The thread is no longer capturing: ordinary work runs again.
  EXPECT_EQ(host_values(pageable.to(Device::cuda)), std::vector<float>(16, 0.0f));
}

#ifdef FLASHTRAIN_WITH_CUDA
// A constant table keeps its bytes in the graph after the host buffer is gone.
TEST(CudaGraph, ConstantUploadsKeepTheirBytes) {
  SKIP_WITHOUT_GPU();
  Tensor out = Tensor::zeros({64}, DType::f32, Device::cuda);
  DeviceGraph g;
  {
    std::vector<float> table(64);
    for (size_t i = 0; i < table.size(); ++i) table[i] = 0.5f * static_cast<float>(i);
    g = DeviceGraph::capture(Device::cuda, [&] {
      cuda::upload_constant(out.raw(), table.data(), table.size() * sizeof(float));
    });
    std::fill(table.begin(), table.end(), -1.0f);
  }
  g.replay();
  synchronize(Device::cuda);
  std::vector<float> want(64);
  for (size_t i = 0; i < want.size(); ++i) want[i] = 0.5f * static_cast<float>(i);
  EXPECT_EQ(host_values(out), want);
}
#endif

// Memory from before the capture that the work releases is freed when the capture ends; what
// the work allocates and frees lives inside the graph.
TEST(CudaGraph, MemoryFromBeforeTheCaptureIsFreedAfterIt) {
  SKIP_WITHOUT_GPU();
  synchronize(Device::cuda);
  const int64_t before = memory_stats(Device::cuda).used_bytes;
  Tensor old = Tensor::zeros({1 << 20}, DType::f32, Device::cuda);
  Tensor input = Tensor::empty_pinned({256}, DType::f32);
  fill_host(input, 2.0f);
  Tensor result;
  const DeviceGraph g = DeviceGraph::capture(Device::cuda, [&] {
    old = Tensor();  // released inside the capture
    const Tensor scratch = input.to(Device::cuda);
    result = scratch.clone();
  });
  g.replay();
  synchronize(Device::cuda);
  EXPECT_EQ(host_values(result)[255], 257.0f);
  result = Tensor();
  synchronize(Device::cuda);
  EXPECT_EQ(memory_stats(Device::cuda).used_bytes, before);
}
}  // namespace
}  // namespace ft
