// The CUDA decode attention against its CPU twin (fp32 and bf16; GQA, windows and documents as
// key ranges, cache lengths from 1 to past one block of threads, head dims 32 to 128), and RoPE
// with a position offset on the GPU against the CPU. Skips without a GPU.
#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "nn/layers.h"

namespace ft::nn {
namespace {

using namespace ft::nn::testing;

struct Case {
  int64_t capacity, Hq, Hkv, D, first, last;
};

TEST(CudaDecodeAttention, MatchesTheCpuTwin) {
  SKIP_WITHOUT_GPU();
  const Case cases[] = {{1, 2, 2, 32, 0, 0},         {40, 4, 4, 64, 0, 39},
                        {300, 8, 2, 64, 17, 299},    {1030, 12, 12, 64, 0, 1029},
                        {520, 32, 8, 128, 100, 400}, {64, 4, 1, 128, 63, 63}};
  for (const Case& c : cases) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(::testing::Message()
                   << "capacity " << c.capacity << " Hq " << c.Hq << " Hkv " << c.Hkv << " D "
                   << c.D << " keys [" << c.first << ", " << c.last << "] " << dtype_name(dtype));
      const Tensor q = rnd({c.Hq, c.D}, 1, dtype);
      const Tensor k = rnd({c.capacity, c.Hkv, c.D}, 2, dtype);
      const Tensor v = rnd({c.capacity, c.Hkv, c.D}, 3, dtype);
      const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
      Tensor want = poisoned({c.Hq, c.D}, dtype);
      decode_attention(want, q, k, v, c.first, c.last, scale);
      Tensor got = gpu_poisoned({c.Hq, c.D}, dtype);
      decode_attention(got, gpu(q), gpu(k), gpu(v), c.first, c.last, scale);
      expect_match(got, want, dtype == DType::f32 ? 1e-5 : 1e-2, "decode_attention");
    }
  }
}

TEST(CudaDecodeAttention, RopeWithAnOffsetMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  const int64_t T = 5, H = 4, D = 64, offset = 100;
  const RopeTable cpu_table = make_rope_table(256, D, 500000.0, true);
  const RopeTable gpu_table = make_rope_table(256, D, 500000.0, true, Device::cuda);
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Tensor x = rnd({1, T, H, D}, 4, dtype);
    Tensor want = poisoned(x.shape(), dtype);
    rope_forward(want, x, cpu_table, offset);
    Tensor got = gpu_poisoned(x.shape(), dtype);
    rope_forward(got, gpu(x), gpu_table, offset);
    expect_match(got, want, dtype == DType::f32 ? 1e-6 : 1e-2, "rope with offset");
  }
}

}  // namespace
}  // namespace ft::nn
