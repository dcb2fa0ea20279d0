// Helpers of the GPU attention tests: skipping without a GPU, filling the device pool with NaN
// (so that an element a kernel forgets to write fails), and running one implementation on the
// GPU with the results copied back.
#pragma once

#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "attention/kernel_config.h"
#include "attention_test_util.h"
#include "core/device.h"

#ifdef FLASHTRAIN_WITH_CUDA
#include "core/cuda/gemm.h"
#include "core/cuda/runtime.h"
#endif

namespace ft::attention::testing {

// "" when the GPU is usable (and set up: GPU 0, TF32 off); otherwise why not.
inline std::string gpu_unavailable() {
#ifndef FLASHTRAIN_WITH_CUDA
  return "built without CUDA";
#else
  if (cuda_device_count() == 0) return cuda_unavailable_reason();
  cuda::init_device(0);
  cuda::allow_tf32(false);
  return "";
#endif
}

// Allocates `bytes` on the GPU, fills them with NaN and frees them: the stream-ordered pool
// hands the same memory to the next allocations, so unwritten elements read as NaN.
inline void poison_device_pool(int64_t bytes) {
  Tensor junk = Tensor::empty({bytes / 4 + 1}, DType::f32, Device::cuda);
  junk.fill(std::numeric_limits<double>::quiet_NaN());
}

struct GpuResult {  // copied back to the CPU
  ForwardOutput fwd;
  Gradients grads;
};

// Runs forward and backward of `impl` on the GPU after poisoning `poison_bytes` of the pool.
inline GpuResult run_on_gpu(Impl impl, const Inputs& in, bool segments_on_gpu, int64_t poison_bytes,
                            const KernelConfig* config = nullptr) {
  poison_device_pool(poison_bytes);
  const Tensor q = in.q.to(Device::cuda), k = in.k.to(Device::cuda), v = in.v.to(Device::cuda);
  const Tensor dout = in.dout.to(Device::cuda);
  const Tensor seg = in.segment_ids.defined() && segments_on_gpu ? in.segment_ids.to(Device::cuda)
                                                                 : in.segment_ids;
  const ForwardOutput f = forward(impl, in.problem, q, k, v, seg, config);
  const Gradients g = backward(impl, in.problem, q, k, v, f, dout, seg, config);
  const Problem& p = in.problem;
  for (const Tensor* t : {&f.o, &f.lse, &g.dq, &g.dk, &g.dv}) {
    EXPECT_EQ(t->device(), Device::cuda);
  }
  EXPECT_EQ(f.o.shape(), in.q.shape());
  EXPECT_EQ(f.o.dtype(), p.dtype);
  EXPECT_EQ(f.lse.shape(), (Shape{p.batch, p.q_heads, p.seq_len}));
  EXPECT_EQ(f.lse.dtype(), DType::f32);
  EXPECT_EQ(g.dq.shape(), in.q.shape());
  EXPECT_EQ(g.dk.shape(), in.k.shape());
  EXPECT_EQ(g.dv.shape(), in.v.shape());
  return {{f.o.to(Device::cpu), f.lse.to(Device::cpu),
           f.saved.defined() ? f.saved.to(Device::cpu) : Tensor{}},
          {g.dq.to(Device::cpu), g.dk.to(Device::cpu), g.dv.to(Device::cpu)}};
}

// A grid point of the GPU accuracy tests.
struct Case {
  const char* name;
  Shapes shapes;
  bool causal = false;
  int64_t window = 0;
  bool segments = false;
  bool scattered = false;        // interleaved segment ids instead of packed runs
  bool segments_on_gpu = false;  // pass the ids as a GPU tensor (else the CPU one)

  Mask mask() const {
    Mask m;
    m.causal = causal;
    m.window = window;
    m.has_segments = segments;
    return m;
  }
};

inline void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

}  // namespace ft::attention::testing
