// ft::cuda::gemm (cuBLASLt) against an fp64 CPU product of the same (rounded) inputs: every
// transpose combination, shapes that are not multiples of 8, padded leading dimensions (the
// padding must stay untouched), alpha/beta, strided batches with gaps, the bias and bias+GELU
// epilogues and the GELU-gradient one, fp32 with TF32 off, bf16 -> bf16 and bf16 -> fp32. Outputs
// are poisoned with NaN when beta = 0 (cuBLAS must not read them). Bad arguments are clear errors.
#include <gtest/gtest.h>

#include "core/device.h"
#include "core/tensor.h"
#include "gpu_skip.h"

#ifdef FLASHTRAIN_WITH_CUDA

#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>

#include "core/blas.h"
#include "core/cuda/gemm.h"
#include "core/cuda/runtime.h"
#include "core/rng.h"

namespace ft {
namespace {

using cuda::Epilogue;
using cuda::GemmArgs;

struct GemmCase {
  bool trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0, batch = 1, pad = 0;  // pad: extra columns in every ld, and gaps
  DType ab = DType::f32, c = DType::f32;
  float alpha = 1.0f, beta = 0.0f;
  Epilogue epilogue = Epilogue::none;
};

std::string name_of(const GemmCase& g) {
  return str("M=", g.M, " N=", g.N, " K=", g.K, " ta=", g.trans_a, " tb=", g.trans_b,
             " batch=", g.batch, " pad=", g.pad, " ", dtype_name(g.ab), "->", dtype_name(g.c),
             " alpha=", g.alpha, " beta=", g.beta, " epilogue=", static_cast<int>(g.epilogue));
}

Tensor random_f64(int64_t n, uint64_t seed) {
  Tensor t = Tensor::empty({n}, DType::f64);
  Rng rng(seed);
  fill_normal(t, rng);
  return t;
}

double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
double gelu_erf(double x) {
  return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
}

// Runs one case on the GPU and checks it against fp64 on the CPU.
void check_gemm(const GemmCase& g, uint64_t seed) {
  SCOPED_TRACE(name_of(g));
  const int64_t a_rows = g.trans_a ? g.K : g.M, a_cols = g.trans_a ? g.M : g.K;
  const int64_t b_rows = g.trans_b ? g.N : g.K, b_cols = g.trans_b ? g.K : g.N;
  const int64_t lda = a_cols + g.pad, ldb = b_cols + g.pad, ldc = g.N + g.pad;
  const int64_t stride_a = a_rows * lda + 3 * g.pad, stride_b = b_rows * ldb + 5 * g.pad;
  const int64_t stride_c = g.M * ldc + 8 * g.pad;  // multiple of 8 when ldc is

  // Inputs rounded to their dtypes once; the reference uses exactly those values.
  const Tensor A = random_f64(g.batch * stride_a, seed).to(g.ab);
  const Tensor B = random_f64(g.batch * stride_b, seed + 1).to(g.ab);
  const Tensor bias = random_f64(g.N, seed + 2).to(g.c);
  Tensor C0 = random_f64(g.batch * stride_c, seed + 3).to(g.c);
  if (g.beta == 0.0f) C0.fill(std::numeric_limits<double>::quiet_NaN());

  Tensor dA = A.to(Device::cuda), dB = B.to(Device::cuda), dbias = bias.to(Device::cuda);
  Tensor dC = C0.to(Device::cuda);
  Tensor dpre = Tensor::empty(C0.shape(), g.c, Device::cuda);
  dpre.fill(std::numeric_limits<double>::quiet_NaN());

  GemmArgs args;
  args.trans_a = g.trans_a;
  args.trans_b = g.trans_b;
  args.M = g.M;
  args.N = g.N;
  args.K = g.K;
  args.A = dA.raw();
  args.lda = lda;
  args.B = dB.raw();
  args.ldb = ldb;
  args.C = dC.raw();
  args.ldc = ldc;
  args.ab_dtype = g.ab;
  args.c_dtype = g.c;
  args.alpha = g.alpha;
  args.beta = g.beta;
  args.epilogue = g.epilogue;
  if (g.epilogue != Epilogue::none) args.bias = dbias.raw();
  if (g.epilogue == Epilogue::bias_gelu) args.pre_gelu = dpre.raw();
  args.batch_count = g.batch;
  args.stride_a = stride_a;
  args.stride_b = stride_b;
  args.stride_c = stride_c;
  cuda::gemm(args);
  const Tensor got = dC.to(Device::cpu);
  const Tensor got_pre = dpre.to(Device::cpu).to(DType::f64);

  // fp64 reference of the pre-activation, batch by batch.
  const Tensor A64 = A.to(DType::f64), B64 = B.to(DType::f64), bias64 = bias.to(DType::f64);
  Tensor ref = C0.to(DType::f64);
  if (g.beta == 0.0f) ref.zero();
  for (int64_t b = 0; b < g.batch; ++b) {
    cpu::gemm(g.trans_a, g.trans_b, g.M, g.N, g.K, static_cast<double>(g.alpha),
              A64.data<double>() + b * stride_a, lda, B64.data<double>() + b * stride_b, ldb,
              static_cast<double>(g.beta), ref.data<double>() + b * stride_c, ldc);
  }
  // Compact [batch*M, N] copies of the written elements; padding checked to be untouched.
  const int64_t rows = g.batch * g.M;
  Tensor want = Tensor::empty({rows, g.N}, DType::f64),
         have = Tensor::empty({rows, g.N}, DType::f64);
  Tensor want_pre = Tensor::empty({rows, g.N}, DType::f64);
  Tensor have_pre = Tensor::empty({rows, g.N}, DType::f64);
  Tensor want_erf = Tensor::empty({rows, g.N}, DType::f64);
  const Tensor got64 = got.to(DType::f64), C064 = C0.to(DType::f64);
  std::vector<bool> written(static_cast<size_t>(got.numel()), false);
  for (int64_t b = 0; b < g.batch; ++b) {
    for (int64_t i = 0; i < g.M; ++i) {
      for (int64_t j = 0; j < g.N; ++j) {
        const int64_t at = b * stride_c + i * ldc + j, r = b * g.M + i;
        double pre = ref.data<double>()[at];
        if (g.epilogue != Epilogue::none) pre += bias64.data<double>()[j];
        want_pre.data<double>()[r * g.N + j] = pre;
        have_pre.data<double>()[r * g.N + j] = got_pre.data<double>()[at];
        want_erf.data<double>()[r * g.N + j] = gelu_erf(pre);
        want.data<double>()[r * g.N + j] = g.epilogue == Epilogue::bias_gelu ? gelu_tanh(pre) : pre;
        have.data<double>()[r * g.N + j] = got64.data<double>()[at];
        written[static_cast<size_t>(at)] = true;
      }
    }
  }
  const size_t esize = dtype_size(g.c);
  int64_t touched_padding = 0;
  for (int64_t at = 0; at < got.numel(); ++at) {
    if (written[static_cast<size_t>(at)]) continue;
    const auto* p = static_cast<const char*>(got.raw()) + at * esize;
    const auto* q = static_cast<const char*>(C0.raw()) + at * esize;
    touched_padding += std::memcmp(p, q, esize) != 0;
  }
  EXPECT_EQ(touched_padding, 0) << "elements outside the M x N blocks were written";

  EXPECT_TRUE(all_finite(have)) << "NaN/Inf in C (unwritten element, or beta = 0 read C)";
  // fp32 C: fp32 accumulation only (true fp32, bf16 products are exact in fp32). bf16 C: one
  // rounding to bf16 (2^-9 relative at most per element) plus the fp32 accumulation.
  const double tol = g.c == DType::f32 ? 1e-5 : 5e-3;
  if (g.epilogue == Epilogue::bias_gelu) {
    EXPECT_TRUE(all_finite(have_pre));
    EXPECT_LT(relative_error(have_pre, want_pre), tol) << "pre_gelu";
    // cuBLASLt's GELU is the tanh form; its fast tanh gets a looser bound.
    const double err = relative_error(have, want);
    // Which GELU cuBLASLt applies (GPT-2 needs the tanh form): printed for the record.
    std::cout << "[   info   ] " << dtype_name(g.c) << " GELU epilogue vs tanh GELU " << err
              << ", vs erf GELU " << relative_error(have, want_erf) << "\n";
    EXPECT_LT(err, std::max(tol, 2e-3))
        << "GELU output vs tanh GELU; vs erf GELU: " << relative_error(have, want_erf);
  } else {
    EXPECT_LT(relative_error(have, want), tol);
  }
}

class CudaGemm : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << cuda_unavailable_reason();
    cuda::allow_tf32(false);
  }
};

TEST_F(CudaGemm, EveryTransposeOddShapesFp32AndBf16) {
  uint64_t seed = 100;
  for (auto [ab, c] : {std::pair{DType::f32, DType::f32}, std::pair{DType::bf16, DType::bf16},
                       std::pair{DType::bf16, DType::f32}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        GemmCase g;
        g.trans_a = ta;
        g.trans_b = tb;
        g.ab = ab;
        g.c = c;
        g.M = 37;
        g.N = 19;
        g.K = 23;
        check_gemm(g, seed += 10);
        g.M = 64;  // multiples of 8 with padded leading dimensions
        g.N = 48;
        g.K = 80;
        g.pad = 8;
        check_gemm(g, seed += 10);
      }
    }
  }
}

TEST_F(CudaGemm, AlphaBetaAccumulateIntoC) {
  for (auto [ab, c] : {std::pair{DType::f32, DType::f32}, std::pair{DType::bf16, DType::f32},
                       std::pair{DType::bf16, DType::bf16}}) {
    GemmCase g;
    g.ab = ab;
    g.c = c;
    g.M = 33;
    g.N = 40;
    g.K = 17;
    g.alpha = 0.5f;
    g.beta = 0.75f;
    g.pad = 3;
    check_gemm(g, 300 + static_cast<uint64_t>(ab) * 7 + static_cast<uint64_t>(c));
    g.beta = 1.0f;  // the weight-gradient case
    g.trans_a = true;
    check_gemm(g, 400 + static_cast<uint64_t>(ab) * 7 + static_cast<uint64_t>(c));
  }
}

TEST_F(CudaGemm, StridedBatchesWithGaps) {
  for (DType ab : {DType::f32, DType::bf16}) {
    GemmCase g;
    g.ab = g.c = ab;
    g.batch = 5;
    g.M = 24;
    g.N = 40;
    g.K = 16;
    g.pad = 8;
    g.trans_b = true;  // the attention Q K^T form
    check_gemm(g, 500 + static_cast<uint64_t>(ab));
    g.trans_b = false;  // the P V form
    g.M = 13;
    g.N = 7;
    g.K = 29;
    g.pad = 1;
    check_gemm(g, 600 + static_cast<uint64_t>(ab));
  }
}

TEST_F(CudaGemm, BiasEpilogue) {
  for (auto [ab, c] : {std::pair{DType::f32, DType::f32}, std::pair{DType::bf16, DType::bf16},
                       std::pair{DType::bf16, DType::f32}}) {
    GemmCase g;
    g.ab = ab;
    g.c = c;
    g.trans_b = true;
    g.epilogue = Epilogue::bias;
    g.M = 64;
    g.N = 96;
    g.K = 32;
    check_gemm(g, 700);
    g.M = 31;  // odd shapes: fused or through the fallback, the result is the same
    g.N = 11;
    g.K = 5;
    check_gemm(g, 710);
    g.beta = 0.5f;
    g.batch = 3;
    g.pad = 2;
    check_gemm(g, 720);
  }
}

TEST_F(CudaGemm, BiasGeluEpilogue) {
  for (auto [ab, c] : {std::pair{DType::f32, DType::f32}, std::pair{DType::bf16, DType::bf16}}) {
    GemmCase g;
    g.ab = ab;
    g.c = c;
    g.trans_b = true;
    g.epilogue = Epilogue::bias_gelu;
    g.M = 40;
    g.N = 64;
    g.K = 48;
    check_gemm(g, 800);
  }
}

double gelu_tanh_grad(double x) {
  const double k = 0.7978845608028654, c = 0.044715;
  const double th = std::tanh(k * (x + c * x * x * x));
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * k * (1.0 + 3.0 * c * x * x);
}

// The GELU-gradient epilogue (try_gemm: skipped, with the reason printed, where cuBLASLt has no
// algorithm for it): C = A B * gelu'(pre), against an fp64 product of the same rounded inputs
// times the tanh GELU's derivative; C starts as NaN (beta = 0 must not read it).
void check_gelu_grad(int64_t M, int64_t N, int64_t K, DType dt, uint64_t seed) {
  SCOPED_TRACE(str("gelu_grad M=", M, " N=", N, " K=", K, " ", dtype_name(dt)));
  const Tensor A = random_f64(M * K, seed).to(dt), B = random_f64(K * N, seed + 1).to(dt);
  const Tensor pre = random_f64(M * N, seed + 2).to(dt);
  Tensor dA = A.to(Device::cuda), dB = B.to(Device::cuda), dpre = pre.to(Device::cuda);
  Tensor dC = Tensor::empty({M * N}, dt, Device::cuda);
  dC.fill(std::numeric_limits<double>::quiet_NaN());
  GemmArgs args;
  args.M = M;
  args.N = N;
  args.K = K;
  args.A = dA.raw();
  args.lda = K;
  args.B = dB.raw();
  args.ldb = N;
  args.C = dC.raw();
  args.ldc = N;
  args.ab_dtype = args.c_dtype = dt;
  args.epilogue = Epilogue::gelu_grad;
  args.pre_gelu = dpre.raw();
  if (!cuda::try_gemm(args)) {
    GTEST_SKIP() << "cuBLASLt has no algorithm for this epilogue here (the layers fall back)";
  }
  const Tensor A64 = A.to(DType::f64), B64 = B.to(DType::f64), pre64 = pre.to(DType::f64);
  Tensor want = Tensor::zeros({M * N}, DType::f64);
  cpu::gemm(false, false, M, N, K, 1.0, A64.data<double>(), K, B64.data<double>(), N, 0.0,
            want.data<double>(), N);
  for (int64_t i = 0; i < M * N; ++i) {
    want.data<double>()[i] *= gelu_tanh_grad(pre64.data<double>()[i]);
  }
  const Tensor have = dC.to(Device::cpu).to(DType::f64);
  EXPECT_TRUE(all_finite(have)) << "NaN/Inf in C";
  // cuBLASLt's GELU derivative uses a fast tanh (as its forward: 2e-3 there); bf16 C is rounded
  // once on top.
  EXPECT_LT(relative_error(have, want), dt == DType::f32 ? 2e-3 : 5e-3);
}

TEST_F(CudaGemm, GeluGradEpilogue) {
  for (const DType dt : {DType::bf16, DType::f32}) {
    check_gelu_grad(300, 96, 64, dt, 1200);
    check_gelu_grad(1024, 3072, 768, dt, 1220);  // GPT-2's MLP
  }
}

TEST_F(CudaGemm, RealisticShape) {
  GemmCase g;  // GPT-2 small QKV projection of 512 tokens
  g.trans_b = true;
  g.M = 512;
  g.N = 2304;
  g.K = 768;
  g.ab = g.c = DType::bf16;
  g.epilogue = Epilogue::bias;
  check_gemm(g, 900);
  g.ab = g.c = DType::f32;
  check_gemm(g, 901);
}

TEST_F(CudaGemm, EmptyKScalesCAndAddsBias) {
  GemmCase g;
  g.M = 5;
  g.N = 6;
  g.K = 0;
  g.pad = 1;  // leading dimensions of at least 1
  g.beta = 0.5f;
  g.epilogue = Epilogue::bias;
  check_gemm(g, 1000);
}

TEST_F(CudaGemm, Tf32IsOffByDefaultAndCanBeTurnedOn) {
  EXPECT_FALSE(cuda::tf32_allowed());
  cuda::allow_tf32(true);
  EXPECT_TRUE(cuda::tf32_allowed());
  // With TF32 the product is still close (10 mantissa bits in the inputs).
  GemmCase g;
  g.M = 128;
  g.N = 128;
  g.K = 256;
  const int64_t n = g.M * g.K;
  Tensor A = random_f64(n, 1).to(DType::f32), B = random_f64(g.K * g.N, 2).to(DType::f32);
  Tensor dA = A.to(Device::cuda), dB = B.to(Device::cuda);
  Tensor dC = Tensor::empty({g.M, g.N}, DType::f32, Device::cuda);
  GemmArgs args;
  args.M = g.M;
  args.N = g.N;
  args.K = g.K;
  args.A = dA.raw();
  args.lda = g.K;
  args.B = dB.raw();
  args.ldb = g.N;
  args.C = dC.raw();
  args.ldc = g.N;
  cuda::gemm(args);
  Tensor ref = Tensor::empty({g.M, g.N}, DType::f32);
  cpu::gemm(false, false, g.M, g.N, g.K, 1.0f, A.data<float>(), g.K, B.data<float>(), g.N, 0.0f,
            ref.data<float>(), g.N);
  EXPECT_LT(relative_error(dC, ref), 5e-3);
  cuda::allow_tf32(false);
}

// With tuning on, the first call of a problem times several algorithms before the product is
// written: the results must be those of one product (beta = 1 adds it once: the timing runs go
// to scratch; beta = 0 may rewrite C; bias + GELU rewrites its pre-GELU output), padding and
// all, and later calls reuse the choice. Shapes no other test uses, so that none is cached yet.
TEST_F(CudaGemm, TunedAlgorithmsGiveTheSameProducts) {
  struct Untune {
    ~Untune() { cuda::set_gemm_tuning(false); }
  } untune;
  cuda::set_gemm_tuning(true);
  EXPECT_TRUE(cuda::gemm_tuning());
  const int64_t before = cuda::gemm_tuned_problems();
  uint64_t seed = 1500;
  for (auto [ab, c] : {std::pair{DType::bf16, DType::bf16}, std::pair{DType::bf16, DType::f32},
                       std::pair{DType::f32, DType::f32}}) {
    GemmCase g;
    g.ab = ab;
    g.c = c;
    g.M = 520;
    g.N = 776;
    g.K = 648;
    g.pad = 8;
    check_gemm(g, seed += 10);
    check_gemm(g, seed += 10);  // the cached choice
    g.beta = 1.0f;              // the weight-gradient case
    g.trans_a = true;
    check_gemm(g, seed += 10);
    g.trans_a = false;
    g.beta = 0.0f;
    g.trans_b = true;
    g.epilogue = Epilogue::bias_gelu;
    check_gemm(g, seed += 10);
  }
  check_gelu_grad(1040, 1544, 264, DType::bf16, seed += 10);
  EXPECT_GT(cuda::gemm_tuned_problems(), before) << "no problem had two candidates to time";
}

TEST_F(CudaGemm, BadArgumentsAreClearErrors) {
  Tensor a = Tensor::zeros({64}, DType::f32, Device::cuda);
  GemmArgs ok;
  ok.M = ok.N = ok.K = 4;
  ok.A = ok.B = a.raw();
  ok.C = a.raw();
  ok.lda = ok.ldb = ok.ldc = 4;
  EXPECT_NO_THROW(cuda::gemm(ok));
  auto expect_error = [&](GemmArgs bad, const char* needle) {
    try {
      cuda::gemm(bad);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("M=4"), std::string::npos) << e.what();
    }
  };
  GemmArgs bad = ok;
  bad.lda = 3;
  expect_error(bad, "lda");
  bad = ok;
  bad.ldc = 2;
  expect_error(bad, "ldc");
  bad = ok;
  bad.ab_dtype = bad.c_dtype = DType::f64;
  expect_error(bad, "fp64");
  bad = ok;
  bad.c_dtype = DType::bf16;  // fp32 inputs, bf16 output
  expect_error(bad, "C must be");
  bad = ok;
  bad.epilogue = Epilogue::bias;
  expect_error(bad, "bias");
  bad = ok;
  bad.epilogue = Epilogue::bias_gelu;
  bad.bias = a.raw();
  expect_error(bad, "pre_gelu");
  bad.pre_gelu = a.raw();
  bad.ldc = 5;
  expect_error(bad, "divisible by 8");
  bad = ok;
  bad.epilogue = Epilogue::gelu_grad;
  expect_error(bad, "pre_gelu");
  bad.pre_gelu = a.raw();
  bad.batch_count = 2;
  bad.stride_a = bad.stride_b = 16;
  bad.stride_c = 16;
  expect_error(bad, "batch_count 1");
  bad = ok;
  bad.A = nullptr;
  expect_error(bad, "null");
  bad = ok;
  bad.batch_count = 2;
  bad.stride_c = 3;
  expect_error(bad, "stride");
}

}  // namespace
}  // namespace ft

#else

TEST(CudaGemm, SkippedWithoutCuda) {
  GTEST_SKIP() << "built without CUDA";
}

#endif
