// The OpenMP paths: the small gradient-check shapes stay below the parallel threshold, so here
// every layer runs on shapes above it with 1 and with 2 threads. Results must be bit-identical
// (no atomics, fixed summation orders), except the BLAS GEMMs: OpenBLAS splits their sums by
// thread count and processor, so they must agree within what any summation order guarantees
// (gemm_bound.h).
#include <gtest/gtest.h>

#include <functional>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "gemm_bound.h"
#include "grad_check.h"
#include "nn/adamw.h"
#include "nn/layers.h"

namespace ft::nn {
namespace {

using namespace ft::nn::testing;

constexpr int64_t kB = 4, kT = 64, kC = 256, kV = 300;

// Runs `compute` (which returns its outputs) with 1 and 2 threads; returns both sets.
struct ThreadRuns {
  std::vector<Tensor> one, two;
};
ThreadRuns run_with_one_and_two_threads(const std::function<std::vector<Tensor>()>& compute) {
  ThreadRuns r;
#ifdef _OPENMP
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  r.one = compute();
  omp_set_num_threads(2);
  r.two = compute();
  omp_set_num_threads(saved);
#else
  (void)compute;
#endif
  return r;
}

// Runs `compute` with 1 and 2 threads and expects bit-identical outputs.
void expect_thread_count_independent(const std::function<std::vector<Tensor>()>& compute) {
#ifdef _OPENMP
  const ThreadRuns r = run_with_one_and_two_threads(compute);
  ASSERT_EQ(r.one.size(), r.two.size());
  for (size_t i = 0; i < r.one.size(); ++i) {
    EXPECT_TRUE(all_finite(r.two[i])) << "output " << i;
    EXPECT_EQ(max_abs_diff(r.one[i], r.two[i]), 0.0) << "output " << i;
  }
#else
  (void)compute;
  GTEST_SKIP() << "built without OpenMP";
#endif
}

Tensor random_tokens(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  Tensor t = Tensor::empty({B, T}, DType::i32);
  Rng rng(seed);
  for (int64_t i = 0; i < B * T; ++i)
    t.data<int32_t>()[i] = static_cast<int32_t>(rng.next_u64() % V);
  return t;
}

TEST(Threads, Embedding) {
  const Tensor tokens = random_tokens(kB, kT, kV, 1);
  const Tensor wte = randn({kV, kC}, 2, DType::f32), wpe = randn({kT, kC}, 3, DType::f32);
  const Tensor dout = randn({kB, kT, kC}, 4, DType::f32);
  expect_thread_count_independent([&] {
    Tensor out = poisoned({kB, kT, kC}, DType::f32);
    embedding_forward(out, tokens, wte, wpe);
    Tensor dwte = Tensor::zeros(wte.shape(), DType::f32),
           dwpe = Tensor::zeros(wpe.shape(), DType::f32);
    embedding_backward(dwte, dwpe, dout, tokens);
    return std::vector<Tensor>{out, dwte, dwpe};
  });
}

TEST(Threads, Linear) {
#ifndef _OPENMP
  GTEST_SKIP() << "built without OpenMP";
#endif
  constexpr int64_t kOC = 160, kN = kB * kT;
  const Tensor x = randn({kB, kT, kC}, 5, DType::bf16), w = randn({kOC, kC}, 6, DType::bf16);
  const Tensor b = randn({kOC}, 7, DType::bf16), dout = randn({kB, kT, kOC}, 8, DType::bf16);
  const ThreadRuns r = run_with_one_and_two_threads([&] {
    Tensor out = poisoned({kB, kT, kOC}, DType::bf16), dx = poisoned(x.shape(), DType::bf16);
    linear_forward(out, x, w, b);
    Tensor dw = Tensor::zeros(w.shape(), DType::f32), db = Tensor::zeros({kOC}, DType::f32);
    linear_backward(dx, dw, db, dout, x, w);
    return std::vector<Tensor>{out, dx, dw, db};
  });
  ASSERT_EQ(r.one.size(), 4u);
  ASSERT_EQ(r.two.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(all_finite(r.two[i])) << "output " << i;
  // The GEMMs: out = x w^T + b (IC products and the bias per element), dx = dout w (OC
  // products), dw = dout^T x (N products, into zeros), each bound by its sums of |terms|.
  const Tensor x2 = x.view({kN, kC}), d2 = dout.view({kN, kOC});
  Tensor out_abs = abs_product(x2, false, w, true);
  const Tensor b64 = b.to(DType::f64);
  for (int64_t n = 0; n < kN; ++n)
    for (int64_t o = 0; o < kOC; ++o)
      out_abs.data<double>()[n * kOC + o] += std::fabs(b64.data<double>()[o]);
  expect_same_gemm_result(r.one[0], r.two[0], out_abs, kC + 1, "out");
  expect_same_gemm_result(r.one[1], r.two[1], abs_product(d2, false, w, false), kOC, "dx");
  expect_same_gemm_result(r.one[2], r.two[2], abs_product(d2, true, x2, false), kN, "dw");
  // db is our own column sum in a fixed order: bit-identical.
  EXPECT_EQ(max_abs_diff(r.one[3], r.two[3]), 0.0) << "db";
}

TEST(Threads, Norms) {
  const Tensor x = randn({kB, kT, kC}, 9, DType::f32), w = randn({kC}, 10, DType::f32);
  const Tensor b = randn({kC}, 11, DType::f32), dout = randn({kB, kT, kC}, 12, DType::f32);
  expect_thread_count_independent([&] {
    const Shape rows{kB * kT};
    Tensor out = poisoned(x.shape(), DType::f32), mean = poisoned(rows, DType::f32);
    Tensor rstd = poisoned(rows, DType::f32), dx = poisoned(x.shape(), DType::f32);
    Tensor dw = Tensor::zeros({kC}, DType::f32), db = Tensor::zeros({kC}, DType::f32);
    layernorm_forward(out, mean, rstd, x, w, b, 1e-5);
    layernorm_backward(dx, dw, db, dout, x, w, mean, rstd);
    Tensor rout = poisoned(x.shape(), DType::f32), rrstd = poisoned(rows, DType::f32);
    Tensor rdx = poisoned(x.shape(), DType::f32), rdw = Tensor::zeros({kC}, DType::f32);
    rmsnorm_forward(rout, rrstd, x, w, 1e-5);
    rmsnorm_backward(rdx, rdw, dout, x, w, rrstd);
    return std::vector<Tensor>{out, mean, rstd, dx, dw, db, rout, rrstd, rdx, rdw};
  });
}

TEST(Threads, ElementwiseRopeAndQkv) {
  const Tensor a = randn({kB, kT, kC}, 13, DType::bf16), c = randn({kB, kT, kC}, 14, DType::bf16);
  const RopeTable table = make_rope_table(kT, 32, 500000.0, true);
  expect_thread_count_independent([&] {
    Tensor g = poisoned(a.shape(), DType::bf16), dg = poisoned(a.shape(), DType::bf16);
    gelu_forward(g, a);
    gelu_backward(dg, c, a);
    Tensor s = poisoned(a.shape(), DType::bf16), sg = poisoned(a.shape(), DType::bf16);
    Tensor su = poisoned(a.shape(), DType::bf16), sum = poisoned(a.shape(), DType::bf16);
    swiglu_forward(s, a, c);
    swiglu_backward(sg, su, c, a, c);
    add(sum, a, c);
    const Tensor heads = a.view({kB, kT, 8, 32});
    Tensor r = poisoned(heads.shape(), DType::bf16), dr = poisoned(heads.shape(), DType::bf16);
    rope_forward(r, heads, table);
    rope_backward(dr, heads, table);
    // 256 = (6 + 2 * 1) * 32: q with 6 heads, k and v with 1.
    Tensor q = poisoned({kB, kT, 6, 32}, DType::bf16), k = poisoned({kB, kT, 1, 32}, DType::bf16);
    Tensor v = poisoned({kB, kT, 1, 32}, DType::bf16), merged = poisoned(a.shape(), DType::bf16);
    split_qkv(q, k, v, a);
    merge_qkv(merged, q, k, v);
    return std::vector<Tensor>{g, dg, s, sg, su, sum, r, dr, merged};
  });
}

TEST(Threads, CrossEntropyAndAdamW) {
  const int64_t N = kB * kT, Vp = 320;
  const Tensor logits = randn({N, Vp}, 15, DType::f32, 3.0);
  const Tensor targets = random_tokens(N, 1, kV, 16).view({N});
  const Tensor p0 = randn({N * Vp}, 17, DType::f32), g = randn({N * Vp}, 18, DType::f32);
  expect_thread_count_independent([&] {
    Tensor losses = poisoned({N}, DType::f32), dlogits = poisoned({N, Vp}, DType::f32);
    softmax_cross_entropy(losses, dlogits, logits, targets, kV, 1.0 / N);
    Tensor p = p0.clone(), m = Tensor::zeros(p.shape(), DType::f32), v = m.clone();
    adamw_update(p, g, m, v, 1e-3, AdamWConfig{}, 1, 0.5, true);
    return std::vector<Tensor>{losses, dlogits, p, m, v};
  });
}

}  // namespace
}  // namespace ft::nn
