// The CPU attention's OpenMP paths. The suite runs one thread a test (scripts/test.sh), so here
// flash and naive run forward and backward with 1 and with 2 threads on shapes with several
// tasks per thread (batch x heads x blocks), every mask and GQA. flash gives every task its own
// rows and fixed summation orders: bit-identical. naive's products are OpenBLAS GEMMs, whose
// sums split by thread count: within rounding of the one-thread result (fp32's, or a bf16 step
// where an output rounds the other way; a race or a row written twice would be off by the
// values' size).
#include <gtest/gtest.h>

#include <omp.h>

#include <string>
#include <vector>

#include "attention/attention.h"
#include "attention_test_util.h"
#include "tensor_test_util.h"

namespace ft::attention {
namespace {

using test::same_bits;
using testing::Case;
using testing::Inputs;

struct Results {
  std::vector<Tensor> tensors;  // o, lse, dq, dk, dv
};

Results run(Impl impl, const Inputs& in, int threads) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  const ForwardOutput fwd = forward(impl, in.problem, in.q, in.k, in.v, in.segment_ids);
  const Gradients g = backward(impl, in.problem, in.q, in.k, in.v, fwd, in.dout, in.segment_ids);
  omp_set_num_threads(saved);
  return {{fwd.o, fwd.lse, g.dq, g.dk, g.dv}};
}

// The threads a parallel region gets when asked for `threads` (fewer under OMP_THREAD_LIMIT or
// OMP_DYNAMIC, where the comparison below would prove nothing).
int team_size(int threads) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  int size = 0;
#pragma omp parallel
  {
#pragma omp single
    size = omp_get_num_threads();
  }
  omp_set_num_threads(saved);
  return size;
}

class AttentionThreads : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionThreads, TwoThreadsGiveTheResultsOfOne) {
  if (team_size(2) != 2) GTEST_SKIP() << "OpenMP gives no team of 2 threads here";
  const Case& c = GetParam();
  const char* names[] = {"o", "lse", "dq", "dk", "dv"};
  for (const DType dtype : {DType::f32, DType::bf16}) {
    const Inputs in = testing::make_inputs(c.shapes, c.mask(), dtype, 41, c.scattered);
    for (const Impl impl : {Impl::flash, Impl::naive}) {
      const Results one = run(impl, in, 1);
      const Results two = run(impl, in, 2);
      for (size_t i = 0; i < one.tensors.size(); ++i) {
        const std::string what =
            std::string(impl_name(impl)) + " " + dtype_name(dtype) + " " + names[i];
        if (impl == Impl::flash) {
          EXPECT_TRUE(same_bits(one.tensors[i], two.tensors[i])) << what;
        } else if (i == 1) {
          const testing::LseError e = testing::lse_error(two.tensors[i], one.tensors[i]);
          EXPECT_EQ(e.mismatched, 0) << what;
          EXPECT_LT(e.relative, 1e-5) << what;
        } else {
          // bf16 outputs: a sum that lands on the other side of a rounding boundary moves its
          // element by one bf16 step (2^-8 relative).
          EXPECT_LT(testing::error_vs(two.tensors[i], one.tensors[i]),
                    dtype == DType::bf16 ? 1e-3 : 1e-5)
              << what;
        }
      }
    }
  }
}

// Sizes with uneven tasks per thread: odd lengths, partial blocks, GQA groups of 1, 2 and 3.
INSTANTIATE_TEST_SUITE_P(
    Cpu, AttentionThreads,
    ::testing::Values(Case{"none_gqa2", {2, 97, 4, 2, 32}},
                      Case{"causal_mha", {3, 130, 3, 3, 16}, true},
                      Case{"causal_window_gqa3", {2, 150, 6, 2, 32}, true, 17},
                      Case{"segments_gqa4", {2, 120, 4, 1, 64}, false, 0, true},
                      Case{"causal_scattered_segments", {2, 77, 2, 1, 16}, true, 0, true, true}),
    [](const auto& param_info) { return std::string(param_info.param.name); });

}  // namespace
}  // namespace ft::attention
