// Every CUDA layer against the CPU layer on the same fresh random inputs, forward and backward,
// fp32 (1e-5 relative: the kernels are true fp32) and bf16 (one bf16 rounding of the output:
// kBf16Tol). GPU outputs are poisoned with NaN before each kernel, so an unwritten element
// fails; parameter gradients are accumulated twice (2x); both 16-byte-pack and element-wise
// paths run (row lengths that are and are not a multiple of the pack). Also: in-place aliasing,
// token/target ids on either device, determinism, dwte bit-identical to the CPU's, and bad input.
// Skips without CUDA or a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "cuda_test_util.h"
#include "grad_check.h"
#include "nn/adamw.h"
#include "nn/layers.h"

namespace ft::nn {
namespace {

using namespace ft::nn::testing;

Tensor gpu_zeros(const Shape& shape, DType dtype) {
  return gpu(Tensor::zeros(shape, dtype));
}
Tensor random_ids(const Shape& shape, int32_t vocab, uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::i32);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    t.data<int32_t>()[i] = static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(vocab));
  }
  return t;
}

// One test body per compute dtype and row length: C = 96 takes the 16-byte-pack paths (fp32
// and bf16), C = 50 the element-wise ones.
struct Case {
  DType dtype;
  int64_t C;
};

// Test names such as fp32_C96.
auto name_with(const char* dim) {
  return [dim](const ::testing::TestParamInfo<Case>& param) {
    return std::string(dtype_name(param.param.dtype)) + dim + std::to_string(param.param.C);
  };
}

class CudaLayers : public ::testing::TestWithParam<Case> {
 protected:
  DType dt() const { return GetParam().dtype; }
  int64_t C() const { return GetParam().C; }
  double tol() const { return dt() == DType::f32 ? kFp32Tol : kBf16Tol; }
  static constexpr int64_t kB = 3, kT = 150;  // 450 rows: several row chunks in the norms
};

TEST_P(CudaLayers, Embedding) {
  SKIP_WITHOUT_GPU();
  const int32_t V = 97;  // few ids, so most ids repeat many times
  const int64_t maxT = kT + 5;
  const Tensor wte = rnd({V, C()}, 1, dt()), wpe = rnd({maxT, C()}, 2, dt());
  const Tensor tokens = random_ids({kB, kT}, V, 3);
  for (const bool tokens_on_gpu : {false, true}) {
    SCOPED_TRACE(tokens_on_gpu ? "tokens on the GPU" : "tokens on the CPU");
    const Tensor tok = tokens_on_gpu ? gpu(tokens) : tokens;
    for (const bool with_wpe : {true, false}) {
      SCOPED_TRACE(with_wpe ? "with wpe" : "without wpe");
      Tensor want = poisoned({kB, kT, C()}, dt());
      embedding_forward(want, tokens, wte, with_wpe ? wpe : Tensor());
      Tensor got = gpu_poisoned({kB, kT, C()}, dt());
      embedding_forward(got, tok, gpu(wte), with_wpe ? gpu(wpe) : Tensor());
      expect_match(got, want, tol(), "out");
    }
    const Tensor dout = rnd({kB, kT, C()}, 4, dt());
    Tensor dwte = Tensor::zeros({V, C()}, DType::f32),
           dwpe = Tensor::zeros({maxT, C()}, DType::f32);
    embedding_backward(dwte, dwpe, dout, tokens);
    Tensor g_dwte = gpu_zeros({V, C()}, DType::f32), g_dwpe = gpu_zeros({maxT, C()}, DType::f32);
    const Tensor g_dout = gpu(dout);
    embedding_backward(g_dwte, g_dwpe, g_dout, tok);
    embedding_backward(g_dwte, g_dwpe, g_dout, tok);
    // fp32 sums in the CPU's order: equal to 1e-5 in every dtype.
    expect_match(g_dwte, scaled(dwte, 2.0).to(DType::f32), kFp32Tol, "dwte (x2)");
    expect_match(g_dwpe, scaled(dwpe, 2.0).to(DType::f32), kFp32Tol, "dwpe (x2)");
    // Deterministic: a second run gives the same bits.
    Tensor again = gpu_zeros({V, C()}, DType::f32), none;
    embedding_backward(again, none, g_dout, tok);
    embedding_backward(again, none, g_dout, tok);
    EXPECT_EQ(max_abs_diff(host(again), host(g_dwte)), 0.0);
  }
}

// dwte adds each id's dout rows in token order on both devices, so the sums are the same bits:
// ids that repeat many times, a single id for every token (one run of B*T), and GPT-2's
// vocabulary with ids near its top and on either side of 2^15 (the sort must compare 16 bits).
TEST_P(CudaLayers, EmbeddingWteGradientMatchesCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  const int64_t B = 3, T = 37;
  const int32_t kGpt2Vocab = 50257;
  Tensor one_id = Tensor::empty({B, T}, DType::i32);
  for (int64_t i = 0; i < one_id.numel(); ++i) one_id.data<int32_t>()[i] = 49;
  Tensor top_ids = random_ids({B, T}, 4, 30);
  int32_t* top = top_ids.data<int32_t>();
  for (int64_t i = 0; i < top_ids.numel(); ++i) top[i] = kGpt2Vocab - 1 - top[i];
  const int32_t low_ids[] = {0, 1 << 15, (1 << 15) - 1, 1 << 15};
  std::copy(std::begin(low_ids), std::end(low_ids), top);
  struct IdCase {
    const char* what;
    int32_t V;
    Tensor tokens;
  };
  const IdCase cases[] = {{"ids repeat", 50, random_ids({B, T}, 50, 31)},
                          {"one id", 50, one_id},
                          {"ids past 2^15", kGpt2Vocab, top_ids}};
  const Tensor dout = rnd({B, T, C()}, 32, dt()), g_dout = gpu(dout);
  for (const IdCase& c : cases) {
    SCOPED_TRACE(c.what);
    // A non-zero start: the gradient is added onto what the row holds.
    Tensor want = rnd({c.V, C()}, 33, DType::f32), got = gpu(want), no_dwpe;
    embedding_backward(want, no_dwpe, dout, c.tokens);
    embedding_backward(got, no_dwpe, g_dout, gpu(c.tokens));
    EXPECT_EQ(max_abs_diff(host(got), want), 0.0);
  }
}

TEST_P(CudaLayers, LayerNorm) {
  SKIP_WITHOUT_GPU();
  const Shape shape{kB, kT, C()};
  const int64_t rows = kB * kT;
  // An offset mean (3) checks the two-pass variance.
  Tensor x = randn(shape, 5, DType::f64, 2.0);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<double>()[i] += 3.0;
  x = x.to(dt());
  const Tensor w = rnd({C()}, 6, dt()), b = rnd({C()}, 7, dt()), dout = rnd(shape, 8, dt());
  Tensor out = poisoned(shape, dt()), mean = poisoned({rows}, DType::f32),
         rstd = poisoned({rows}, DType::f32);
  layernorm_forward(out, mean, rstd, x, w, b, 1e-5);
  Tensor g_out = gpu_poisoned(shape, dt()), g_mean = gpu_poisoned({rows}, DType::f32),
         g_rstd = gpu_poisoned({rows}, DType::f32);
  const Tensor gx = gpu(x), gw = gpu(w), gb = gpu(b), gdout = gpu(dout);
  layernorm_forward(g_out, g_mean, g_rstd, gx, gw, gb, 1e-5);
  expect_match(g_out, out, tol(), "out");
  expect_match(g_mean, mean, kFp32Tol, "mean");
  expect_match(g_rstd, rstd, kFp32Tol, "rstd");

  Tensor dx = poisoned(shape, dt()), dw = Tensor::zeros({C()}, DType::f32),
         db = Tensor::zeros({C()}, DType::f32);
  layernorm_backward(dx, dw, db, dout, x, w, mean, rstd);
  Tensor g_dx = gpu_poisoned(shape, dt()), g_dw = gpu_zeros({C()}, DType::f32),
         g_db = gpu_zeros({C()}, DType::f32);
  layernorm_backward(g_dx, g_dw, g_db, gdout, gx, gw, g_mean, g_rstd);
  layernorm_backward(g_dx, g_dw, g_db, gdout, gx, gw, g_mean, g_rstd);
  expect_match(g_dx, dx, tol(), "dx");
  expect_match(g_dw, scaled(dw, 2.0).to(DType::f32), kFp32Tol, "dw (x2)");
  expect_match(g_db, scaled(db, 2.0).to(DType::f32), kFp32Tol, "db (x2)");

  // dx may alias dout; undefined parameter gradients are skipped.
  Tensor inplace = gpu(dout), no_dw, no_db;
  layernorm_backward(inplace, no_dw, no_db, inplace, gx, gw, g_mean, g_rstd);
  expect_match(inplace, dx, tol(), "dx written over dout");
}

TEST_P(CudaLayers, RmsNorm) {
  SKIP_WITHOUT_GPU();
  const Shape shape{kB, kT, C()};
  const int64_t rows = kB * kT;
  const Tensor x = rnd(shape, 9, dt(), 2.0), w = rnd({C()}, 10, dt()), dout = rnd(shape, 11, dt());
  Tensor out = poisoned(shape, dt()), rstd = poisoned({rows}, DType::f32);
  rmsnorm_forward(out, rstd, x, w, 1e-5);
  Tensor g_out = gpu_poisoned(shape, dt()), g_rstd = gpu_poisoned({rows}, DType::f32);
  const Tensor gx = gpu(x), gw = gpu(w), gdout = gpu(dout);
  rmsnorm_forward(g_out, g_rstd, gx, gw, 1e-5);
  expect_match(g_out, out, tol(), "out");
  expect_match(g_rstd, rstd, kFp32Tol, "rstd");

  Tensor dx = poisoned(shape, dt()), dw = Tensor::zeros({C()}, DType::f32);
  rmsnorm_backward(dx, dw, dout, x, w, rstd);
  Tensor g_dx = gpu_poisoned(shape, dt()), g_dw = gpu_zeros({C()}, DType::f32);
  rmsnorm_backward(g_dx, g_dw, gdout, gx, gw, g_rstd);
  rmsnorm_backward(g_dx, g_dw, gdout, gx, gw, g_rstd);
  expect_match(g_dx, dx, tol(), "dx");
  expect_match(g_dw, scaled(dw, 2.0).to(DType::f32), kFp32Tol, "dw (x2)");
}

TEST_P(CudaLayers, Gelu) {
  SKIP_WITHOUT_GPU();
  const Shape shape{kB, kT, C()};
  const Tensor x = rnd(shape, 12, dt(), 2.0), dout = rnd(shape, 13, dt());
  Tensor out = poisoned(shape, dt()), dx = poisoned(shape, dt());
  gelu_forward(out, x);
  gelu_backward(dx, dout, x);
  Tensor g_out = gpu_poisoned(shape, dt()), g_dx = gpu_poisoned(shape, dt());
  const Tensor gx = gpu(x);
  gelu_forward(g_out, gx);
  gelu_backward(g_dx, gpu(dout), gx);
  expect_match(g_out, out, tol(), "out");
  expect_match(g_dx, dx, tol(), "dx");
  Tensor inplace = gpu(x);
  gelu_forward(inplace, inplace);
  expect_match(inplace, out, tol(), "out written over x");
}

TEST_P(CudaLayers, Swiglu) {
  SKIP_WITHOUT_GPU();
  const Shape shape{kB, kT, C()};
  const Tensor gate = rnd(shape, 14, dt(), 2.0), up = rnd(shape, 15, dt()),
               dout = rnd(shape, 16, dt());
  Tensor out = poisoned(shape, dt()), dgate = poisoned(shape, dt()), dup = poisoned(shape, dt());
  swiglu_forward(out, gate, up);
  swiglu_backward(dgate, dup, dout, gate, up);
  const Tensor g_gate = gpu(gate), g_up = gpu(up), g_dout = gpu(dout);
  Tensor g_out = gpu_poisoned(shape, dt());
  swiglu_forward(g_out, g_gate, g_up);
  expect_match(g_out, out, tol(), "out");
  Tensor g_dgate = gpu_poisoned(shape, dt()), g_dup = gpu_poisoned(shape, dt()), none;
  swiglu_backward(g_dgate, g_dup, g_dout, g_gate, g_up);
  expect_match(g_dgate, dgate, tol(), "dgate");
  expect_match(g_dup, dup, tol(), "dup");
  // Either gradient alone.
  Tensor only_dgate = gpu_poisoned(shape, dt()), only_dup = gpu_poisoned(shape, dt());
  swiglu_backward(only_dgate, none, g_dout, g_gate, g_up);
  swiglu_backward(none, only_dup, g_dout, g_gate, g_up);
  expect_match(only_dgate, dgate, tol(), "dgate alone");
  expect_match(only_dup, dup, tol(), "dup alone");
}

TEST_P(CudaLayers, Add) {
  SKIP_WITHOUT_GPU();
  const Shape shape{kB, kT, C()};
  const Tensor a = rnd(shape, 17, dt()), b = rnd(shape, 18, dt());
  Tensor out = poisoned(shape, dt());
  add(out, a, b);
  Tensor g_out = gpu_poisoned(shape, dt());
  const Tensor gb = gpu(b);
  add(g_out, gpu(a), gb);
  expect_match(g_out, out, tol(), "out");
  Tensor inplace = gpu(a);
  add(inplace, inplace, gb);
  expect_match(inplace, out, tol(), "out written over a");
}

// Head dims 64 (packs of whole heads) and 10 (odd pair count); GQA 6 query heads on 2 kv heads.
TEST_P(CudaLayers, RopeAndQkv) {
  SKIP_WITHOUT_GPU();
  const int64_t D = C() == 96 ? 64 : 10, Hq = 6, Hkv = 2, maxT = kT + 7;
  for (const bool llama31 : {false, true}) {
    SCOPED_TRACE(llama31 ? "llama 3.1 scaling" : "plain");
    const RopeTable cpu_table = make_rope_table(maxT, D, 500000.0, llama31);
    const RopeTable table = make_rope_table(maxT, D, 500000.0, llama31, Device::cuda);
    const Tensor x = rnd({kB, kT, Hq, D}, 19, dt()), dout = rnd({kB, kT, Hq, D}, 20, dt());
    Tensor out = poisoned(x.shape(), dt()), dx = poisoned(x.shape(), dt());
    rope_forward(out, x, cpu_table);
    rope_backward(dx, dout, cpu_table);
    Tensor g_out = gpu_poisoned(x.shape(), dt()), g_dx = gpu_poisoned(x.shape(), dt());
    rope_forward(g_out, gpu(x), table);
    rope_backward(g_dx, gpu(dout), table);
    expect_match(g_out, out, tol(), "rope out");
    expect_match(g_dx, dx, tol(), "rope dx");
    Tensor inplace = gpu(x);  // the models rotate q and k in place
    rope_forward(inplace, inplace, table);
    expect_match(inplace, out, tol(), "rope in place");
    // Only the first heads (the fused QKV buffer's q and k), in place.
    Tensor g_heads = gpu(x), c_heads = x.clone();
    rope_forward_heads(g_heads, table, Hq - 2);
    rope_forward_heads(c_heads, cpu_table, Hq - 2);
    expect_match(g_heads, c_heads, tol(), "rope of the first heads");
    rope_backward_heads(g_heads, table, Hq - 2);
    rope_backward_heads(c_heads, cpu_table, Hq - 2);
    expect_match(g_heads, c_heads, tol(), "rope back of the first heads");
    // The CPU path still works with a table that also holds the GPU copy.
    Tensor cpu_out = poisoned(x.shape(), dt());
    rope_forward(cpu_out, x, table);
    EXPECT_EQ(max_abs_diff(cpu_out, out), 0.0);
  }

  // More packs a position than a block's threads take in one round of loads (kernel: 128
  // threads, four packs each): head dim 128 and 36 heads (bf16 576 packs, fp32 1152), so that
  // rounds after the first and a partial last round run, the first 35 heads alone too.
  {
    const int64_t Dl = 128, Hl = 36;
    const RopeTable cpu_table = make_rope_table(kT, Dl, 500000.0, true);
    const RopeTable table = make_rope_table(kT, Dl, 500000.0, true, Device::cuda);
    const Tensor xl = rnd({2, 5, Hl, Dl}, 22, dt());
    Tensor want = poisoned(xl.shape(), dt());
    rope_forward(want, xl, cpu_table);
    Tensor got = gpu(xl);
    rope_forward(got, got, table);
    expect_match(got, want, tol(), "rope of 36 heads of 128, in place");
    Tensor g_heads = gpu(xl), c_heads = xl.clone();
    rope_backward_heads(g_heads, table, Hl - 1);
    rope_backward_heads(c_heads, cpu_table, Hl - 1);
    expect_match(g_heads, c_heads, tol(), "rope back of the first 35 heads of 128");
  }

  const Tensor qkv = rnd({kB, kT, (Hq + 2 * Hkv) * D}, 21, dt());
  Tensor q = poisoned({kB, kT, Hq, D}, dt()), k = poisoned({kB, kT, Hkv, D}, dt()),
         v = poisoned({kB, kT, Hkv, D}, dt());
  split_qkv(q, k, v, qkv);
  Tensor gq = gpu_poisoned(q.shape(), dt()), gk = gpu_poisoned(k.shape(), dt()),
         gv = gpu_poisoned(v.shape(), dt());
  split_qkv(gq, gk, gv, gpu(qkv));
  // Copies: exact.
  EXPECT_EQ(max_abs_diff(host(gq), q), 0.0);
  EXPECT_EQ(max_abs_diff(host(gk), k), 0.0);
  EXPECT_EQ(max_abs_diff(host(gv), v), 0.0);
  Tensor merged = gpu_poisoned(qkv.shape(), dt());
  merge_qkv(merged, gq, gk, gv);
  EXPECT_EQ(max_abs_diff(host(merged), qkv), 0.0);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaLayers,
                         ::testing::Values(Case{DType::f32, 96}, Case{DType::f32, 50},
                                           Case{DType::bf16, 96}, Case{DType::bf16, 50}),
                         name_with("_C"));

// Vp = 1024, GPT-2's 50304 and longer rows (bf16 60000, fp32 30000) take the pack path, Vp =
// 1003 the element-wise one; V < Vp leaves padding.
class CudaClassifier : public ::testing::TestWithParam<Case> {};

TEST_P(CudaClassifier, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const DType dt = GetParam().dtype;
  const int64_t Vp = GetParam().C, V = Vp - 21, N = 67;
  const double tol = dt == DType::f32 ? kFp32Tol : kBf16Tol, dloss = 1.0 / N;
  const Tensor logits = rnd({N, Vp}, 22, dt, 3.0);
  const Tensor targets = random_ids({N}, static_cast<int32_t>(V), 23);
  Tensor losses = poisoned({N}, DType::f32), dlogits = poisoned({N, Vp}, dt);
  softmax_cross_entropy(losses, dlogits, logits, targets, V, dloss);
  for (const bool targets_on_gpu : {false, true}) {
    SCOPED_TRACE(targets_on_gpu ? "targets on the GPU" : "targets on the CPU");
    const Tensor tg = targets_on_gpu ? gpu(targets) : targets;
    const Tensor g_logits = gpu(logits);
    Tensor g_losses = gpu_poisoned({N}, DType::f32), g_dlogits = gpu_poisoned({N, Vp}, dt);
    softmax_cross_entropy(g_losses, g_dlogits, g_logits, tg, V, dloss);
    expect_match(g_losses, losses, kFp32Tol, "losses");
    expect_match(g_dlogits, dlogits, tol, "dlogits");
    // Padding columns get exactly 0.
    const Tensor d = host(g_dlogits).to(DType::f64);
    for (int64_t r = 0; r < N; ++r) {
      for (int64_t j = V; j < Vp; ++j)
        ASSERT_EQ(d.data<double>()[r * Vp + j], 0.0) << r << "," << j;
    }
    // Gradient written over the logits (the models' way), and losses alone.
    Tensor inplace = gpu(logits), no_grad;
    Tensor l2 = gpu_poisoned({N}, DType::f32), l3 = gpu_poisoned({N}, DType::f32);
    softmax_cross_entropy(l2, inplace, inplace, tg, V, dloss);
    expect_match(inplace, dlogits, tol, "dlogits written over logits");
    expect_match(l2, losses, kFp32Tol, "losses (in place)");
    softmax_cross_entropy(l3, no_grad, g_logits, tg, V, dloss);
    expect_match(l3, losses, kFp32Tol, "losses without dlogits");
  }
  std::vector<float> want, got;
  softmax_row(want, logits, 5, V, 0.8);
  softmax_row(got, gpu(logits), 5, V, 0.8);
  EXPECT_EQ(got, want);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaClassifier,
                         ::testing::Values(Case{DType::f32, 1024}, Case{DType::f32, 1003},
                                           Case{DType::f32, 30000}, Case{DType::bf16, 1024},
                                           Case{DType::bf16, 1003}, Case{DType::bf16, 50304},
                                           Case{DType::bf16, 60000}),
                         name_with("_Vp"));

// The CUDA update runs the CPU's fp32 operations in the CPU's order with the CPU's scalars and
// no FMA contraction, so it is bit-identical; sizes 1000 (packs) and 1001 (element-wise).
TEST(CudaAdamW, MatchesCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  for (const int64_t n : {1000, 1001}) {
    SCOPED_TRACE(n);
    Tensor p = rnd({n}, 24, DType::f32), m = rnd({n}, 25, DType::f32, 0.1);
    Tensor v = rnd({n}, 26, DType::f32, 0.1);
    for (int64_t i = 0; i < n; ++i) v.data<float>()[i] *= v.data<float>()[i];  // v >= 0
    Tensor gp = gpu(p), gm = gpu(m), gv = gpu(v);
    const AdamWConfig cfg;
    for (int64_t step = 1; step <= 3; ++step) {
      const Tensor grad = rnd({n}, 27 + static_cast<uint64_t>(step), DType::f32);
      const bool decay = step != 2;
      adamw_update(p, grad, m, v, 3e-4, cfg, step, 0.7, decay);
      adamw_update(gp, gpu(grad), gm, gv, 3e-4, cfg, step, 0.7, decay);
    }
    EXPECT_TRUE(all_finite(p));
    EXPECT_EQ(max_abs_diff(host(gp), p), 0.0);
    EXPECT_EQ(max_abs_diff(host(gm), m), 0.0);
    EXPECT_EQ(max_abs_diff(host(gv), v), 0.0);
  }
}

TEST(CudaAdamW, GlobalGradNormMatchesCpuAndIsDeterministic) {
  SKIP_WITHOUT_GPU();
  const std::vector<Tensor> grads = {rnd({1}, 30, DType::f32), rnd({777, 3}, 31, DType::f32),
                                     rnd({100000}, 32, DType::f32, 0.01),
                                     rnd({4097}, 33, DType::bf16), rnd({200000}, 34, DType::bf16)};
  std::vector<Tensor> on_gpu;
  for (const Tensor& g : grads) on_gpu.push_back(gpu(g));
  const double want = global_grad_norm(grads), got = global_grad_norm(on_gpu);
  EXPECT_NEAR(got, want, 1e-12 * want);
  EXPECT_EQ(global_grad_norm(on_gpu), got);
  expect_error([&] { global_grad_norm({on_gpu[0], grads[1]}); }, "one device");
  // The norm left on the device holds the same value.
  const Tensor norm = global_grad_norm_tensor(on_gpu);
  EXPECT_EQ(norm.device(), Device::cuda);
  EXPECT_EQ(host(norm).data<double>()[0], got);
}

// Clipping formed on the device from the device norm (no host wait) against the host forming
// the scale from the same norm: the same bits, clipped (max_norm under the norm), not clipped
// (over it) and with clipping off (0). A kernel that ignored the norm would use scale 1 and
// fail the clipped case.
TEST(CudaAdamW, ClipFromTheDeviceNormMatchesTheHostScaleBitForBit) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 5003;
  const std::vector<Tensor> grads = {rnd({n}, 40, DType::f32), rnd({64}, 41, DType::f32)};
  std::vector<Tensor> dev_grads;
  for (const Tensor& g : grads) dev_grads.push_back(gpu(g));
  const double norm = global_grad_norm(dev_grads);
  for (const double max_norm : {0.3 * norm, 3.0 * norm, 0.0}) {
    SCOPED_TRACE(str("max_norm ", max_norm, " for norm ", norm));
    std::vector<AdamWTensor> a, b;
    for (size_t i = 0; i < grads.size(); ++i) {
      const int64_t len = grads[i].numel();
      const uint64_t s = 50 + 10 * i;
      Tensor v = rnd({len}, s + 2, DType::f32, 0.1);
      for (int64_t j = 0; j < len; ++j) v.data<float>()[j] *= v.data<float>()[j];
      for (std::vector<AdamWTensor>* set : {&a, &b}) {
        set->push_back({gpu(rnd({len}, s, DType::f32)), dev_grads[i],
                        gpu(rnd({len}, s + 1, DType::f32, 0.1)), gpu(v), i == 0,
                        gpu(Tensor::zeros({len}, DType::bf16))});
      }
    }
    adamw_update_all(a, 1e-3, AdamWConfig{}, 2, global_grad_norm_tensor(dev_grads), max_norm);
    adamw_update_all(b, 1e-3, AdamWConfig{}, 2, clip_scale(norm, max_norm));
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(max_abs_diff(host(a[i].master), host(b[i].master)), 0.0) << "master " << i;
      EXPECT_EQ(max_abs_diff(host(a[i].m), host(b[i].m)), 0.0) << "m " << i;
      EXPECT_EQ(max_abs_diff(host(a[i].v), host(b[i].v)), 0.0) << "v " << i;
      EXPECT_EQ(max_abs_diff(host(a[i].compute), host(b[i].compute)), 0.0) << "compute " << i;
    }
  }
  const Tensor cpu_norm = Tensor::zeros({1}, DType::f64);
  std::vector<AdamWTensor> one = {{gpu(rnd({8}, 60, DType::f32)), dev_grads[1].slice(0, 8),
                                   gpu(Tensor::zeros({8}, DType::f32)),
                                   gpu(Tensor::zeros({8}, DType::f32)), true, Tensor()}};
  expect_error([&] { adamw_update_all(one, 1e-3, AdamWConfig{}, 1, cpu_norm, 1.0); },
               "norm is on cpu");
}

// lr and step read by the kernel from memory (the form a captured CUDA graph replays) against
// the host's scalars: the same bits, for tensors with and without decay, at several steps and
// rates (the bias corrections and the decay factor change). A kernel that kept the arguments'
// step-dependent values would fail at every step but the one they came from.
TEST(CudaAdamW, StepValuesFromMemoryMatchTheHostScalarsBitForBit) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 4099;
  const std::vector<Tensor> grads = {rnd({n}, 70, DType::f32), rnd({96}, 71, DType::f32)};
  std::vector<Tensor> dev_grads;
  for (const Tensor& g : grads) dev_grads.push_back(gpu(g));
  std::vector<AdamWTensor> a, b;
  for (size_t i = 0; i < grads.size(); ++i) {
    const int64_t len = grads[i].numel();
    for (std::vector<AdamWTensor>* set : {&a, &b}) {
      set->push_back({gpu(rnd({len}, 80 + i, DType::f32)), dev_grads[i],
                      gpu(Tensor::zeros({len}, DType::f32)), gpu(Tensor::zeros({len}, DType::f32)),
                      i == 0, gpu(Tensor::zeros({len}, DType::bf16))});
    }
  }
  const AdamWConfig cfg;
  const Tensor norm = global_grad_norm_tensor(dev_grads);
  const double max_norm = 0.5 * global_grad_norm(dev_grads);
  Tensor values = Tensor::empty_pinned({kAdamWStepValues}, DType::f64);
  for (const auto& [step, lr] :
       std::vector<std::pair<int64_t, double>>{{1, 3e-4}, {2, 1e-3}, {7, 6e-4}, {100, 1e-5}}) {
    SCOPED_TRACE(str("step ", step, " lr ", lr));
    write_adamw_step_values(values, lr, cfg, step);
    adamw_update_all(a, values, cfg, norm, max_norm);
    adamw_update_all(b, lr, cfg, step, norm, max_norm);
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(max_abs_diff(host(a[i].master), host(b[i].master)), 0.0) << "master " << i;
      EXPECT_EQ(max_abs_diff(host(a[i].v), host(b[i].v)), 0.0) << "v " << i;
      EXPECT_EQ(max_abs_diff(host(a[i].compute), host(b[i].compute)), 0.0) << "compute " << i;
    }
  }
  Tensor wrong = Tensor::zeros({3}, DType::f64);
  expect_error([&] { write_adamw_step_values(wrong, 1e-3, cfg, 1); }, "fp64 tensor of 5");
}

TEST(CudaLayersErrors, BadInputIsAClearError) {
  SKIP_WITHOUT_GPU();
  const Tensor x = gpu(rnd({4, 8}, 40, DType::f32)), w = gpu(rnd({8}, 41, DType::f32));
  Tensor out = gpu_poisoned({4, 8}, DType::f32), rstd = gpu_poisoned({4}, DType::f32);
  // fp64 is CPU-only.
  const Tensor x64 = gpu(rnd({4, 8}, 42, DType::f64));
  Tensor out64 = gpu_poisoned({4, 8}, DType::f64);
  expect_error([&] { gelu_forward(out64, x64); }, "not supported on CUDA");
  // Mixed devices.
  expect_error([&] { rmsnorm_forward(out, rstd, x, host(w), 1e-5); }, "one device");
  Tensor cpu_out = poisoned({4, 8}, DType::f32);
  expect_error([&] { gelu_forward(cpu_out, x); }, "one device");
  // Shapes are checked as on the CPU.
  Tensor short_rstd = gpu_poisoned({3}, DType::f32);
  expect_error([&] { rmsnorm_forward(out, short_rstd, x, w, 1e-5); }, "one value per row");
  // Ids out of range, on either device.
  const Tensor wte = gpu(rnd({10, 8}, 43, DType::f32));
  Tensor emb_out = gpu_poisoned({1, 4, 8}, DType::f32);
  const Tensor bad_tokens = tokens_of({1, 4}, {1, 2, 10, 3});
  expect_error([&] { embedding_forward(emb_out, gpu(bad_tokens), wte, Tensor()); }, "token id 10");
  expect_error([&] { embedding_forward(emb_out, bad_tokens, wte, Tensor()); }, "token id 10");
  Tensor losses = gpu_poisoned({4}, DType::f32), dlogits;
  const Tensor bad_targets = tokens_of({4}, {0, 8, 1, 2});
  expect_error([&] { softmax_cross_entropy(losses, dlogits, x, gpu(bad_targets), 8, 1.0); },
               "outside [0, 8)");
  // A RoPE table without its GPU copy.
  const RopeTable cpu_table = make_rope_table(4, 8, 10000.0, false);
  Tensor q = gpu(rnd({1, 4, 1, 8}, 44, DType::f32));
  expect_error([&] { rope_forward(q, q, cpu_table); }, "Device::cuda");
  // AdamW state on the CPU with a GPU master.
  Tensor master = gpu(rnd({8}, 45, DType::f32)), m = Tensor::zeros({8}, DType::f32);
  Tensor v = gpu_zeros({8}, DType::f32);
  expect_error(
      [&] { adamw_update(master, gpu(rnd({8}, 46, DType::f32)), m, v, 1e-3, {}, 1, 1.0, true); },
      "one device");
}

}  // namespace
}  // namespace ft::nn
