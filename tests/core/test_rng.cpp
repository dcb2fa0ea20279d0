// Rng fills: the parallel chunked fill (large tensors) gives exactly the serial stream's values
// and leaves the generator where the serial loop would, for every dtype and thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <vector>

#include "core/rng.h"
#include "core/tensor.h"

namespace ft {
namespace {

// The serial reference: one draw sequence, element after element.
std::vector<double> serial(int64_t n, uint64_t seed, bool normal, uint64_t* end_state) {
  Rng rng(seed);
  std::vector<double> out(static_cast<size_t>(n));
  for (auto& x : out) x = normal ? 0.5 + 2.0 * rng.normal() : -1.0 + 3.0 * rng.uniform();
  *end_state = rng.state();
  return out;
}

class RngFill : public ::testing::TestWithParam<int> {};  // OpenMP threads

TEST_P(RngFill, ParallelFillIsTheSerialStream) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(GetParam());
  for (const int64_t n : {int64_t{100}, (int64_t{1} << 16) + 7, int64_t{300001}}) {
    for (const bool normal : {true, false}) {
      uint64_t want_state = 0;
      const std::vector<double> want = serial(n, 1234, normal, &want_state);
      for (const DType dtype : {DType::f32, DType::f64}) {
        Tensor t = Tensor::empty({n}, dtype, Device::cpu);
        Rng rng(1234);
        if (normal) {
          fill_normal(t, rng, 0.5, 2.0);
        } else {
          fill_uniform(t, rng, -1.0, 2.0);
        }
        SCOPED_TRACE(testing::Message() << "n " << n << (normal ? " normal " : " uniform ")
                                        << dtype_name(dtype) << " threads " << GetParam());
        EXPECT_EQ(rng.state(), want_state) << "the generator continues where the serial loop";
        int64_t mismatches = 0;
        for (int64_t i = 0; i < n; ++i) {
          const double got =
              dtype == DType::f32 ? static_cast<double>(t.data<float>()[i]) : t.data<double>()[i];
          const double ref =
              dtype == DType::f32 ? static_cast<double>(static_cast<float>(want[i])) : want[i];
          mismatches += got != ref;
        }
        EXPECT_EQ(mismatches, 0);
      }
    }
  }
  omp_set_num_threads(saved);
}

INSTANTIATE_TEST_SUITE_P(Threads, RngFill, ::testing::Values(1, 2, 3));

}  // namespace
}  // namespace ft
