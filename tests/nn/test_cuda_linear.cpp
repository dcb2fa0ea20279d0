// The CUDA linear layer against the CPU layer on the same fresh random inputs: forward with and
// without bias, backward (dinp written, dw and db accumulated: two calls give twice the
// gradient on top of what was there), undefined gradients skipped, odd shapes, 3-d inputs and
// a GPT-2-sized 512 x 768 -> 2304 product; fp32 with TF32 off at 1e-5 relative, bf16 within
// bf16 rounding of the CPU bf16 path. The backward through a GELU (linear_gelu_backward) and
// the determinism of the bias gradients taken in GEMM epilogues. Outputs are poisoned with NaN
// first. Mixed devices and fp64 on the GPU are clear errors. Skips itself without a GPU or without
// CUDA.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/device.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "nn/layers.h"

#ifdef FLASHTRAIN_WITH_CUDA
#include "core/cuda/gemm.h"
#endif

namespace ft::nn {
namespace {

#ifdef FLASHTRAIN_WITH_CUDA
#define FT_REQUIRE_GPU()                                                   \
  if (cuda_device_count() == 0) GTEST_SKIP() << cuda_unavailable_reason(); \
  ::ft::cuda::allow_tf32(false)
#else
#define FT_REQUIRE_GPU() GTEST_SKIP() << "built without CUDA"
#endif

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Tensor randn(const Shape& shape, DType dtype, uint64_t seed, double std = 1.0) {
  Tensor t = Tensor::empty(shape, dtype);
  Rng rng(seed);
  fill_normal(t, rng, 0.0, std);
  return t;
}

Tensor poisoned(const Shape& shape, DType dtype, Device device) {
  Tensor t = Tensor::empty(shape, dtype, device);
  t.fill(kNaN);
  return t;
}

void expect_close(const Tensor& got, const Tensor& want, double tol, const char* what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  EXPECT_EQ(got.device(), Device::cuda) << what;
  EXPECT_TRUE(all_finite(got)) << what << " has NaN/Inf (an unwritten element?)";
  const double err = relative_error(got, want);
  EXPECT_LT(err, tol) << what << ": relative error " << err << " vs the CPU layer";
}

// fp32: both devices are within fp32 rounding of the exact product (1e-6 scale). bf16: each
// output is rounded to bf16 once on either device (2^-9 relative at most), so the two differ
// by about one bf16 ulp in a fraction of elements: ~3e-3 in norm at most.
double tol_for(DType dtype) {
  return dtype == DType::f32 ? 1e-5 : 1e-2;
}

struct LinearCase {
  Shape inp_shape;  // [..., IC]
  int64_t out_features;
  DType dtype;
  bool bias;
};

void check_linear(const LinearCase& lc, uint64_t seed) {
  SCOPED_TRACE(str("inp ", shape_str(lc.inp_shape), " OC=", lc.out_features, " ",
                   dtype_name(lc.dtype), lc.bias ? " bias" : " no bias"));
  const int64_t IC = lc.inp_shape.back(), OC = lc.out_features;
  const DType acc = DType::f32;
  Shape out_shape = lc.inp_shape;
  out_shape.back() = OC;
  // Scaled like a trained layer (w ~ 1/sqrt(IC)) so outputs are O(1).
  const Tensor inp = randn(lc.inp_shape, lc.dtype, seed);
  const Tensor w = randn({OC, IC}, lc.dtype, seed + 1, 1.0 / std::sqrt(static_cast<double>(IC)));
  const Tensor b = lc.bias ? randn({OC}, lc.dtype, seed + 2) : Tensor();
  const Tensor dout = randn(out_shape, lc.dtype, seed + 3);
  const Tensor dw0 = randn({OC, IC}, acc, seed + 4), db0 = randn({OC}, acc, seed + 5);

  // CPU layer.
  Tensor out_cpu = Tensor::empty(out_shape, lc.dtype);
  linear_forward(out_cpu, inp, w, b);
  Tensor dinp_cpu = Tensor::empty(lc.inp_shape, lc.dtype);
  Tensor dw_cpu = dw0.clone(), db_cpu = lc.bias ? db0.clone() : Tensor();
  linear_backward(dinp_cpu, dw_cpu, db_cpu, dout, inp, w);
  linear_backward(dinp_cpu, dw_cpu, db_cpu, dout, inp, w);

  // GPU layer, outputs poisoned, parameter gradients starting from the same non-zero values.
  const Tensor inp_g = inp.to(Device::cuda), w_g = w.to(Device::cuda),
               dout_g = dout.to(Device::cuda);
  const Tensor b_g = lc.bias ? b.to(Device::cuda) : Tensor();
  Tensor out_g = poisoned(out_shape, lc.dtype, Device::cuda);
  linear_forward(out_g, inp_g, w_g, b_g);
  expect_close(out_g, out_cpu, tol_for(lc.dtype), "out");

  Tensor dinp_g = poisoned(lc.inp_shape, lc.dtype, Device::cuda);
  Tensor dw_g = dw0.to(Device::cuda), db_g = lc.bias ? db0.to(Device::cuda) : Tensor();
  linear_backward(dinp_g, dw_g, db_g, dout_g, inp_g, w_g);
  linear_backward(dinp_g, dw_g, db_g, dout_g, inp_g, w_g);  // dw, db accumulate; dinp rewritten
  expect_close(dinp_g, dinp_cpu, tol_for(lc.dtype), "dinp");
  // dw and db are fp32 sums of exact bf16 products on both devices: fp32 tolerance throughout.
  expect_close(dw_g, dw_cpu, 1e-5, "dw (initial + 2 x gradient)");
  if (lc.bias) expect_close(db_g, db_cpu, 1e-5, "db (initial + 2 x gradient)");

  // Only what is asked for: an undefined dinp and db skip, dw still accumulates.
  Tensor none_inp, none_b;
  Tensor dw_only = Tensor::zeros({OC, IC}, acc, Device::cuda);
  linear_backward(none_inp, dw_only, none_b, dout_g, inp_g, w_g);
  Tensor dw_once = Tensor::zeros({OC, IC}, acc);
  linear_backward(none_inp, dw_once, none_b, dout, inp, w);
  expect_close(dw_only, dw_once, 1e-5, "dw alone");
}

TEST(CudaLinear, MatchesCpuFp32) {
  FT_REQUIRE_GPU();
  uint64_t seed = 1;
  for (bool bias : {true, false}) {
    check_linear({{6, 5}, 7, DType::f32, bias}, seed += 10);        // nothing a multiple of 8
    check_linear({{2, 19, 37}, 13, DType::f32, bias}, seed += 10);  // 3-d input, odd sizes
    check_linear({{4, 16, 64}, 96, DType::f32, bias}, seed += 10);  // aligned
  }
}

TEST(CudaLinear, MatchesCpuBf16) {
  FT_REQUIRE_GPU();
  uint64_t seed = 100;
  for (bool bias : {true, false}) {
    check_linear({{6, 5}, 7, DType::bf16, bias}, seed += 10);
    check_linear({{2, 19, 37}, 13, DType::bf16, bias}, seed += 10);
    check_linear({{4, 16, 64}, 96, DType::bf16, bias}, seed += 10);
  }
}

TEST(CudaLinear, RealisticGpt2Shape) {
  FT_REQUIRE_GPU();
  check_linear({{512, 768}, 2304, DType::bf16, true}, 200);
  check_linear({{512, 768}, 2304, DType::f32, true}, 210);
}

// Many rows: the bias gradient reduction splits rows into several chunks (a partial last one),
// one column per thread (45 columns) or a 16-byte pack per thread (1000: a partial last tile).
TEST(CudaLinear, BiasGradientOverManyRowsIsDeterministic) {
  FT_REQUIRE_GPU();
  for (const int64_t OC : {45, 1000}) {
    SCOPED_TRACE(str("OC=", OC));
    const int64_t N = 3000, IC = 8;
    const Tensor inp = randn({N, IC}, DType::bf16, 300).to(Device::cuda);
    const Tensor w = randn({OC, IC}, DType::bf16, 301).to(Device::cuda);
    const Tensor dout_cpu = randn({N, OC}, DType::bf16, 302);
    const Tensor dout = dout_cpu.to(Device::cuda);
    Tensor none_inp, none_w;
    Tensor db1 = Tensor::zeros({OC}, DType::f32, Device::cuda);
    Tensor db2 = Tensor::zeros({OC}, DType::f32, Device::cuda);
    linear_backward(none_inp, none_w, db1, dout, inp, w);
    linear_backward(none_inp, none_w, db2, dout, inp, w);
    EXPECT_EQ(max_abs_diff(db1, db2), 0.0) << "same inputs, different bias gradients";
    // Against an fp64 column sum of the same bf16 values.
    const Tensor d64 = dout_cpu.to(DType::f64);
    Tensor want = Tensor::zeros({OC}, DType::f64);
    for (int64_t r = 0; r < N; ++r) {
      for (int64_t o = 0; o < OC; ++o) want.data<double>()[o] += d64.data<double>()[r * OC + o];
    }
    EXPECT_LT(relative_error(db1, want), 1e-5);
  }
}

// linear_gelu_backward on the GPU (the GELU backward in the GEMM's epilogue where cuBLASLt has
// it: IC % 8 == 0; else the GEMM and the GELU kernel) against the CPU's unfused calls. dpre goes
// through cuBLASLt's GELU derivative (a fast tanh, as its forward's: 2e-3 in fp32) and, in
// bf16, is rounded once (the CPU rounds d act first).
void check_linear_gelu_backward(int64_t N, int64_t IC, int64_t OC, DType dt, bool biases,
                                uint64_t seed) {
  SCOPED_TRACE(str("N=", N, " IC=", IC, " OC=", OC, " ", dtype_name(dt),
                   biases ? " with db" : " without db"));
  const Tensor pre = randn({N, IC}, dt, seed, 1.5);
  Tensor act = Tensor::empty({N, IC}, dt);
  gelu_forward(act, pre);
  const Tensor w = randn({OC, IC}, dt, seed + 1, 1.0 / std::sqrt(static_cast<double>(IC)));
  const Tensor dout = randn({N, OC}, dt, seed + 2);
  const Tensor dw0 = randn({OC, IC}, DType::f32, seed + 3), db0 = randn({OC}, DType::f32, seed + 4);

  Tensor dpre = Tensor::empty({N, IC}, dt), dw = dw0.clone();
  Tensor db = biases ? db0.clone() : Tensor();
  linear_gelu_backward(dpre, dw, db, dout, act, w, pre);

  const Tensor pre_g = pre.to(Device::cuda), act_g = act.to(Device::cuda), w_g = w.to(Device::cuda),
               dout_g = dout.to(Device::cuda);
  Tensor dpre_g = poisoned({N, IC}, dt, Device::cuda), dw_g = dw0.to(Device::cuda);
  Tensor db_g = biases ? db0.to(Device::cuda) : Tensor();
  linear_gelu_backward(dpre_g, dw_g, db_g, dout_g, act_g, w_g, pre_g);
  expect_close(dpre_g, dpre, dt == DType::f32 ? 2e-3 : 1e-2, "dpre");
  expect_close(dw_g, dw, 1e-5, "dw");
  if (biases) expect_close(db_g, db, 1e-5, "db");
}

TEST(CudaLinear, GeluBackwardMatchesCpu) {
  FT_REQUIRE_GPU();
  uint64_t seed = 500;
  for (const DType dt : {DType::f32, DType::bf16}) {
    for (const bool biases : {true, false}) {
      check_linear_gelu_backward(74, 96, 40, dt, biases, seed += 10);  // fused where cuBLASLt can
      check_linear_gelu_backward(74, 50, 13, dt, biases, seed += 10);  // IC % 8 != 0: unfused
    }
  }
  check_linear_gelu_backward(512, 3072, 768, DType::bf16, true, seed += 10);  // GPT-2's MLP
}

// dpre (through the GELU-gradient epilogue) and the bias gradient are bitwise the same on every
// run.
TEST(CudaLinear, EpilogueResultsAreDeterministic) {
  FT_REQUIRE_GPU();
  const int64_t N = 4096, IC = 3072, OC = 768;
  const Tensor pre = randn({N, IC}, DType::bf16, 600).to(Device::cuda);
  const Tensor act = randn({N, IC}, DType::bf16, 601).to(Device::cuda);
  const Tensor w = randn({OC, IC}, DType::bf16, 602, 0.02).to(Device::cuda);
  const Tensor dout = randn({N, OC}, DType::bf16, 603).to(Device::cuda);
  std::vector<Tensor> dbs, dpres;
  for (int run = 0; run < 3; ++run) {
    Tensor dpre = Tensor::empty({N, IC}, DType::bf16, Device::cuda);
    Tensor dw = Tensor::zeros({OC, IC}, DType::f32, Device::cuda);
    Tensor db = Tensor::zeros({OC}, DType::f32, Device::cuda);
    linear_gelu_backward(dpre, dw, db, dout, act, w, pre);
    dbs.push_back(db);
    dpres.push_back(dpre);
  }
  for (int run = 1; run < 3; ++run) {
    EXPECT_EQ(max_abs_diff(dbs[run], dbs[0]), 0.0) << "db differs between runs";
    EXPECT_EQ(max_abs_diff(dpres[run], dpres[0]), 0.0) << "dpre differs between runs";
  }
}

TEST(CudaLinear, MixedDevicesAndFp64AreClearErrors) {
  FT_REQUIRE_GPU();
  const Tensor inp = randn({4, 8}, DType::f32, 400).to(Device::cuda);
  const Tensor w_cpu = randn({3, 8}, DType::f32, 401);
  Tensor out = Tensor::empty({4, 3}, DType::f32, Device::cuda);
  Tensor none;
  try {
    linear_forward(out, inp, w_cpu, none);
    FAIL() << "a CPU weight with a CUDA input did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("w is on cpu"), std::string::npos) << e.what();
  }
  Tensor out_cpu = Tensor::empty({4, 3}, DType::f32);
  EXPECT_THROW(linear_forward(out_cpu, inp, w_cpu.to(Device::cuda), none), Error);
  const Tensor w = w_cpu.to(Device::cuda);
  Tensor db_cpu = Tensor::zeros({3}, DType::f32),
         dw = Tensor::zeros({3, 8}, DType::f32, Device::cuda);
  EXPECT_THROW(linear_backward(none, dw, db_cpu, out, inp, w), Error);
  Tensor out64 = Tensor::empty({4, 3}, DType::f64, Device::cuda);
  try {
    linear_forward(out64, inp.to(DType::f64), w.to(DType::f64), none);
    FAIL() << "fp64 on the GPU did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp64"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ft::nn
