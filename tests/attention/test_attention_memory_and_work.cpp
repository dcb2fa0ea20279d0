// flash never allocates anything of size S x S (peak memory at S = 8192 stays a small multiple
// of q + k + v + o), and its work follows the mask (window 512 is much cheaper than causal).
#include <gtest/gtest.h>

#include <chrono>

#include "attention_test_util.h"
#include "core/memory.h"

namespace ft::attention::testing {
namespace {

constexpr int64_t kLongSeq = 8192;

TEST(AttentionFlash, NoSquareBufferAtS8192) {
  Mask causal;
  causal.causal = true;
  const Inputs in = make_inputs({1, kLongSeq, 1, 1, 64}, causal, DType::f32, 21);
  const int64_t qkvo_bytes = 4 * static_cast<int64_t>(in.q.nbytes());
  reset_peak_memory(Device::cpu);
  const int64_t before = memory_stats(Device::cpu).used_bytes;
  {
    const ForwardOutput f = forward(Impl::flash, in.problem, in.q, in.k, in.v);
    const Gradients g = backward(Impl::flash, in.problem, in.q, in.k, in.v, f, in.dout);
    EXPECT_TRUE(all_finite(g.dq));
  }
  const int64_t grown = memory_stats(Device::cpu).peak_used_bytes - before;
  // One S x S fp32 buffer alone would be 256 MiB, i.e. 32x q + k + v + o (8 MiB).
  EXPECT_LE(grown, 8 * qkvo_bytes) << "flash peak grew by " << grown << " bytes";
  EXPECT_LT(grown, kLongSeq * kLongSeq * 4);
}

double best_forward_seconds(const Inputs& in, int repeats) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    const ForwardOutput f = forward(Impl::flash, in.problem, in.q, in.k, in.v);
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

// A loose version of bench_attention_cpu's >= 5x claim; timing in a test stays loose.
TEST(AttentionFlash, WorkFollowsTheMask) {
  Mask causal;
  causal.causal = true;
  Mask windowed = causal;
  windowed.window = 512;
  const Inputs full = make_inputs({1, kLongSeq, 1, 1, 64}, causal, DType::f32, 22);
  const Inputs local = make_inputs({1, kLongSeq, 1, 1, 64}, windowed, DType::f32, 22);
  const double ratio = best_forward_seconds(full, 2) / best_forward_seconds(local, 3);
  EXPECT_GE(ratio, 2.0) << "causal / window-512 forward time";
  EXPECT_GE(full.problem.attended_pairs(), 7 * local.problem.attended_pairs());
}

}  // namespace
}  // namespace ft::attention::testing
