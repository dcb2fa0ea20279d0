// Helpers of the GPU attention tests: skipping without a GPU, filling the device pool with NaN
// (so that an element a kernel forgets to write fails), and running one implementation on the
// GPU with the results copied back.
#pragma once

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

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

// The default, every compiled forward tile (and tma plan) with the default backward, and every
// compiled backward tile and path with the default forward; those can_implement accepts for `p`
// in direction `which` (forward only: head dims without a backward kernel).
inline std::vector<KernelConfig> configs_under_test(const Problem& p,
                                                    KernelDirection which = KernelDirection::both) {
  const DeviceLimits& device = DeviceLimits::current();
  const KernelConfig base = default_config(device, p.head_dim);
  std::vector<KernelConfig> out;
  auto add = [&](const KernelConfig& c) {
    for (const KernelConfig& seen : out) {
      if (seen == c) return;
    }
    if (can_implement(c, p, device, which).empty()) out.push_back(c);
  };
  add(base);
  for (const TmaForwardPlan& plan : compiled_kernels().tma_forward) {
    if (plan.head_dim == p.head_dim) add(with_tma_forward(base, plan));
  }
  for (ForwardPath path : {ForwardPath::mma, ForwardPath::wgmma}) {
    for (const TileConfig& tile : compiled_kernels().forward_tiles(path)) {
      KernelConfig c = base;
      c.forward = tile;
      c.forward_path = path;
      add(c);
    }
  }
  if (which == KernelDirection::forward) return out;
  for (BackwardPath path : all_backward_paths()) {
    if (path == BackwardPath::tma) continue;  // its plans, below (a tile may have several depths)
    for (const TileConfig& tile : compiled_kernels().backward_tiles(path)) {
      KernelConfig c = base;
      c.backward = tile;
      c.backward_path = path;
      c.backward_stages = 0;
      add(c);
    }
  }
  for (const TmaBackwardPlan& plan : compiled_kernels().tma_backward_plans) {
    if (plan.head_dim == p.head_dim) add(with_tma_backward(base, plan));
  }
  return out;
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

// The grid of the GPU accuracy tests (naive and flash): every S in {1, 7, 64, 100, 384, 513,
// 1000, 4096}, Hq/Hkv in {1, 2, 4, 8}, head dims 32..256 (96 too: the bf16 flash kernels refuse it,
// which the flash test checks) and each mask alone and combined. {name, {B, S, Hq, Hkv, D},
// causal, window, segments, scattered, segments_on_gpu}
inline const std::vector<Case>& gpu_accuracy_cases() {
  static const std::vector<Case> cases = {
      {"s1_h1_d32_none", {1, 1, 1, 1, 32}},
      {"s1_h8g8_d64_causal_segments", {2, 1, 8, 1, 64}, true, 0, true, false, true},
      {"s7_h2g2_d64_causal", {2, 7, 2, 1, 64}, true},
      {"s7_h8g2_d32_window3_segments", {2, 7, 8, 4, 32}, false, 3, true},
      {"s7_h4g4_d128_window2", {3, 7, 4, 1, 128}, false, 2},
      {"s7_h4g4_d256_window2", {3, 7, 4, 1, 256}, false, 2},
      {"s64_h4g2_d128_window16", {1, 64, 4, 2, 128}, false, 16},
      {"s64_h8g1_d32_segments", {2, 64, 8, 8, 32}, false, 0, true, false, true},
      {"s64_h1_d256_causal_window1", {1, 64, 1, 1, 256}, true, 1},
      {"s64_h2g1_d64_scattered_segments", {2, 64, 2, 2, 64}, false, 0, true, true},
      {"s64_h8g8_d128_causal_window8_scattered", {2, 64, 8, 1, 128}, true, 8, true, true, true},
      {"s100_h4g2_d96_causal", {1, 100, 4, 2, 96}, true},
      // 144 work tiles of 128 rows (the head-dim-256 plans: one Q slot) or 64 rows of two heads
      // (head dim 128: the next tile staged early) on 132 persistent blocks: some claim a second
      // tile (scripts/gpu_attention.sh runs these under compute-sanitizer).
      {"s384_h16g4_d128_causal_segments", {3, 384, 16, 4, 128}, true, 0, true, false, true},
      {"s384_h16g4_d256_causal_segments", {3, 384, 16, 4, 256}, true, 0, true, false, true},
      {"s513_h4g4_d64_causal_window100", {1, 513, 4, 1, 64}, true, 100},
      {"s513_h2g1_d128_causal_segments", {1, 513, 2, 2, 128}, true, 0, true, false, true},
      {"s513_h2g1_d256_causal_segments", {1, 513, 2, 2, 256}, true, 0, true, false, true},
      {"s513_h8g8_d128_window64", {1, 513, 8, 1, 128}, false, 64},
      {"s513_h4g1_d32_causal_scattered", {2, 513, 4, 4, 32}, true, 0, true, true},
      {"s513_h8g2_d64_none", {2, 513, 8, 4, 64}},
      {"s1000_h4g2_d64_causal_window_segments", {2, 1000, 4, 2, 64}, true, 200, true, false, true},
      {"s1000_h1_d256_none", {1, 1000, 1, 1, 256}},
      {"s1000_h2g2_d32_causal", {1, 1000, 2, 1, 32}, true},
      {"s1000_h8g4_d128_segments", {1, 1000, 8, 2, 128}, false, 0, true},
      {"s1000_h8g8_d32_window300_segments", {1, 1000, 8, 1, 32}, false, 300, true, true, true},
      {"s1000_h8g8_d64_window300_scattered", {1, 1000, 8, 1, 64}, false, 300, true, true, true},
      {"s4096_h2g2_d128_causal", {1, 4096, 2, 1, 128}, true},
      {"s4096_h2g2_d64_causal_window512_segments",
       {1, 4096, 2, 1, 64},
       true,
       512,
       true,
       false,
       true},
      {"s4096_h1_d256_causal", {1, 4096, 1, 1, 256}, true},
  };
  return cases;
}

}  // namespace ft::attention::testing
