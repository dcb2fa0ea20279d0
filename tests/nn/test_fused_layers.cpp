// The fused layers on the CPU against their unfused twins, which the other tests check by
// finite differences: add + norm forward (add_layernorm_forward, add_rmsnorm_forward), norm
// backward accumulating into the residual gradient (*norm_backward_add), linear + GELU
// (linear_gelu_forward, and linear_gelu_backward through it) and the multi-tensor AdamW
// (adamw_update_all; on split masters against whole ones with compute copies of their own, the
// rounding of those copies included). Each fused function does the same operations in the same
// order as its twin,
// so the results must be bit-identical in fp64, fp32 and bf16 (compared byte for byte). Outputs
// start as NaN, so an element the fused kernel forgets to write fails (a NaN never equals the
// twin's finite result). Also: aliasing that the API allows, and bad input.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/f32_halves.h"
#include "grad_check.h"
#include "nn/adamw.h"
#include "nn/layers.h"

namespace ft::nn {
namespace {

using namespace ft::nn::testing;

Tensor rnd(const Shape& shape, uint64_t seed, DType dtype, double std = 1.0) {
  return randn(shape, seed, DType::f64, std).to(dtype);
}

struct Case {
  DType dtype;
  int64_t C;
};

class FusedNorms : public ::testing::TestWithParam<Case> {
 protected:
  DType dt() const { return GetParam().dtype; }
  DType acc() const { return acc_dtype(dt()); }
  int64_t C() const { return GetParam().C; }
  Shape shape() const { return {kB, kT, C()}; }
  static constexpr int64_t kB = 2, kT = 37, kRows = kB * kT;
};

TEST_P(FusedNorms, AddLayerNormEqualsAddThenLayerNorm) {
  Tensor a = randn(shape(), 1, DType::f64, 2.0);
  for (int64_t i = 0; i < a.numel(); ++i) a.data<double>()[i] += 3.0;  // offset mean
  a = a.to(dt());
  const Tensor b = rnd(shape(), 2, dt()), w = rnd({C()}, 3, dt()), bias = rnd({C()}, 4, dt());

  Tensor x = poisoned(shape(), dt()), h = poisoned(shape(), dt());
  Tensor mean = poisoned({kRows}, acc()), rstd = poisoned({kRows}, acc());
  add(x, a, b);
  layernorm_forward(h, mean, rstd, x, w, bias, 1e-5);

  Tensor fx = poisoned(shape(), dt()), fh = poisoned(shape(), dt());
  Tensor fmean = poisoned({kRows}, acc()), frstd = poisoned({kRows}, acc());
  add_layernorm_forward(fx, fh, fmean, frstd, a, b, w, bias, 1e-5);
  expect_same_bits(fx, x, "x_out");
  expect_same_bits(fh, h, "h");
  expect_same_bits(fmean, mean, "mean");
  expect_same_bits(frstd, rstd, "rstd");

  // x_out may alias a (the residual stream updated in place); no bias is allowed.
  Tensor inplace = a.to(dt()), nh = poisoned(shape(), dt()), no_bias;
  Tensor h_nobias = poisoned(shape(), dt());
  layernorm_forward(h_nobias, mean, rstd, x, w, no_bias, 1e-5);
  add_layernorm_forward(inplace, nh, fmean, frstd, inplace, b, w, no_bias, 1e-5);
  expect_same_bits(inplace, x, "x_out written over a");
  expect_same_bits(nh, h_nobias, "h without bias");
}

TEST_P(FusedNorms, AddRmsNormEqualsAddThenRmsNorm) {
  const Tensor a = rnd(shape(), 5, dt(), 2.0), b = rnd(shape(), 6, dt()), w = rnd({C()}, 7, dt());
  Tensor x = poisoned(shape(), dt()), h = poisoned(shape(), dt()), rstd = poisoned({kRows}, acc());
  add(x, a, b);
  rmsnorm_forward(h, rstd, x, w, 1e-6);
  Tensor fx = poisoned(shape(), dt()), fh = poisoned(shape(), dt());
  Tensor frstd = poisoned({kRows}, acc());
  add_rmsnorm_forward(fx, fh, frstd, a, b, w, 1e-6);
  expect_same_bits(fx, x, "x_out");
  expect_same_bits(fh, h, "h");
  expect_same_bits(frstd, rstd, "rstd");

  Tensor inplace = b.to(dt());  // x_out aliasing b
  add_rmsnorm_forward(inplace, fh, frstd, a, inplace, w, 1e-6);
  expect_same_bits(inplace, x, "x_out written over b");
  expect_same_bits(fh, h, "h (x_out aliasing b)");
}

TEST_P(FusedNorms, LayerNormBackwardAddEqualsBackwardThenAdd) {
  const Tensor x = rnd(shape(), 8, dt(), 2.0), w = rnd({C()}, 9, dt()), bias = rnd({C()}, 10, dt());
  const Tensor dout = rnd(shape(), 11, dt()), dres0 = rnd(shape(), 12, dt());
  Tensor h = poisoned(shape(), dt()), mean = poisoned({kRows}, acc()),
         rstd = poisoned({kRows}, acc());
  layernorm_forward(h, mean, rstd, x, w, bias, 1e-5);

  // Parameter gradients start non-zero: both paths must accumulate onto them.
  Tensor dx = poisoned(shape(), dt()), dw = rnd({C()}, 13, acc()), db = rnd({C()}, 14, acc());
  Tensor want = poisoned(shape(), dt());
  layernorm_backward(dx, dw, db, dout, x, w, mean, rstd);
  add(want, dx, dres0);

  Tensor dres = dres0.to(dt()), fdw = rnd({C()}, 13, acc()), fdb = rnd({C()}, 14, acc());
  layernorm_backward_add(dres, fdw, fdb, dout, x, w, mean, rstd);
  expect_same_bits(dres, want, "dresidual");
  expect_same_bits(fdw, dw, "dw");
  expect_same_bits(fdb, db, "db");

  // Undefined parameter gradients are skipped.
  Tensor again = dres0.to(dt()), no_dw, no_db;
  layernorm_backward_add(again, no_dw, no_db, dout, x, w, mean, rstd);
  expect_same_bits(again, want, "dresidual without dw/db");
}

TEST_P(FusedNorms, RmsNormBackwardAddEqualsBackwardThenAdd) {
  const Tensor x = rnd(shape(), 15, dt(), 2.0), w = rnd({C()}, 16, dt());
  const Tensor dout = rnd(shape(), 17, dt()), dres0 = rnd(shape(), 18, dt());
  Tensor h = poisoned(shape(), dt()), rstd = poisoned({kRows}, acc());
  rmsnorm_forward(h, rstd, x, w, 1e-6);

  Tensor dx = poisoned(shape(), dt()), dw = rnd({C()}, 19, acc()), want = poisoned(shape(), dt());
  rmsnorm_backward(dx, dw, dout, x, w, rstd);
  add(want, dres0, dx);

  Tensor dres = dres0.to(dt()), fdw = rnd({C()}, 19, acc());
  rmsnorm_backward_add(dres, fdw, dout, x, w, rstd);
  expect_same_bits(dres, want, "dresidual");
  expect_same_bits(fdw, dw, "dw");
}

// C = 96: a multiple of every pack width; C = 50: not (the element-wise paths on the GPU).
INSTANTIATE_TEST_SUITE_P(Dtypes, FusedNorms,
                         ::testing::Values(Case{DType::f64, 96}, Case{DType::f32, 96},
                                           Case{DType::bf16, 96}, Case{DType::f32, 50},
                                           Case{DType::bf16, 50}),
                         [](const ::testing::TestParamInfo<Case>& p) {
                           return std::string(dtype_name(p.param.dtype)) + "_C" +
                                  std::to_string(p.param.C);
                         });

TEST(FusedLinearGelu, EqualsLinearThenGelu) {
  for (const DType dt : {DType::f64, DType::f32, DType::bf16}) {
    for (const bool with_bias : {true, false}) {
      SCOPED_TRACE(str(dtype_name(dt), with_bias ? " with bias" : " without bias"));
      const int64_t N = 19, IC = 24, OC = 40;
      const Tensor inp = rnd({N, IC}, 20, dt), w = rnd({OC, IC}, 21, dt, 0.3);
      const Tensor b = with_bias ? rnd({OC}, 22, dt) : Tensor();
      Tensor pre = poisoned({N, OC}, dt), out = poisoned({N, OC}, dt);
      linear_forward(pre, inp, w, b);
      gelu_forward(out, pre);
      Tensor fpre = poisoned({N, OC}, dt), fout = poisoned({N, OC}, dt);
      linear_gelu_forward(fpre, fout, inp, w, b);
      expect_same_bits(fpre, pre, "pre");
      expect_same_bits(fout, out, "out");
    }
  }
}

TEST(FusedLinearGelu, BackwardEqualsLinearBackwardThenGeluBackward) {
  for (const DType dt : {DType::f64, DType::f32, DType::bf16}) {
    for (const bool with_db : {true, false}) {
      SCOPED_TRACE(str(dtype_name(dt), with_db ? " with db" : " without db"));
      const DType acc = acc_dtype(dt);
      const int64_t N = 19, IC = 40, OC = 24;  // act [N, IC] = gelu(pre) -> out [N, OC]
      const Tensor pre = rnd({N, IC}, 30, dt, 1.5), w = rnd({OC, IC}, 31, dt, 0.3);
      Tensor act = poisoned({N, IC}, dt);
      gelu_forward(act, pre);
      const Tensor dout = rnd({N, OC}, 32, dt);
      const Tensor dw0 = rnd({OC, IC}, 33, acc), db0 = rnd({OC}, 34, acc);
      Tensor dact = poisoned({N, IC}, dt), dpre = poisoned({N, IC}, dt);
      Tensor dw = dw0.clone(), db = with_db ? db0.clone() : Tensor();
      linear_backward(dact, dw, db, dout, act, w);
      gelu_backward(dpre, dact, pre);

      Tensor fdpre = poisoned({N, IC}, dt), fdw = dw0.clone();
      Tensor fdb = with_db ? db0.clone() : Tensor();
      linear_gelu_backward(fdpre, fdw, fdb, dout, act, w, pre);
      expect_same_bits(fdpre, dpre, "dpre");
      expect_same_bits(fdw, dw, "dw");
      if (with_db) expect_same_bits(fdb, db, "db");
    }
  }
}

// Tensors of several sizes, with and without decay, with a bf16 or fp32 compute copy, one that
// is master itself, and none.
struct AdamCase {
  int64_t n;
  bool decay;
  int copy;  // 0 none, 1 bf16, 2 fp32, 3 aliases master
};

std::vector<AdamWTensor> adam_tensors(const std::vector<AdamCase>& cases, DType master,
                                      Device device, uint64_t seed) {
  std::vector<AdamWTensor> out;
  for (size_t i = 0; i < cases.size(); ++i) {
    const AdamCase& c = cases[i];
    AdamWTensor t;
    const uint64_t s = seed + 10 * i;
    t.master = randn({c.n}, s, DType::f64, 0.5).to(master).to(device);
    t.grad = randn({c.n}, s + 1, DType::f64, 0.1).to(master).to(device);
    t.m = randn({c.n}, s + 2, DType::f64, 0.01).to(master).to(device);
    Tensor v = randn({c.n}, s + 3, DType::f64, 0.1);  // second moments are non-negative
    for (int64_t j = 0; j < v.numel(); ++j) v.data<double>()[j] *= v.data<double>()[j];
    t.v = v.to(master).to(device);
    t.decay = c.decay;
    if (c.copy == 1) t.compute = poisoned({c.n}, DType::bf16).to(device);
    if (c.copy == 2) t.compute = poisoned({c.n}, DType::f32).to(device);
    if (c.copy == 3) t.compute = t.master;
    out.push_back(t);
  }
  return out;
}

const std::vector<AdamCase> kAdamCases = {{1000, true, 1}, {37, false, 1}, {70001, true, 2},
                                          {4, false, 0},   {96, true, 3},  {0, true, 1}};

TEST(FusedAdamW, UpdateAllEqualsPerTensorUpdates) {
  const AdamWConfig cfg{0.9, 0.95, 1e-8, 0.1};
  for (const DType master : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(master));
    std::vector<AdamWTensor> all = adam_tensors(kAdamCases, master, Device::cpu, 100);
    std::vector<AdamWTensor> one = adam_tensors(kAdamCases, master, Device::cpu, 100);
    for (int64_t step = 1; step <= 3; ++step) {
      const double lr = 1e-3 * static_cast<double>(step), scale = 0.5 + 0.25 * step;
      adamw_update_all(all, lr, cfg, step, scale);
      for (AdamWTensor& t : one) {
        adamw_update(t.master, t.grad, t.m, t.v, lr, cfg, step, scale, t.decay);
        if (t.compute.defined() && t.compute.raw() != t.master.raw()) {
          write_compute_copy(t.compute, t.master);
        }
      }
    }
    for (size_t i = 0; i < all.size(); ++i) {
      if (all[i].master.numel() == 0) continue;
      const std::string at = str("tensor ", i, " ");
      expect_same_bits(all[i].master, one[i].master, at + "master");
      expect_same_bits(all[i].m, one[i].m, at + "m");
      expect_same_bits(all[i].v, one[i].v, at + "v");
      if (all[i].compute.defined())
        expect_same_bits(all[i].compute, one[i].compute, at + "compute");
    }
  }
}

// The split form of a whole fp32 master with a bf16 compute copy: the master's halves in new
// buffers (compute, master_lo), the rest of the state copied.
AdamWTensor split_twin(const AdamWTensor& whole) {
  AdamWTensor t;
  t.grad = whole.grad.clone();
  t.m = whole.m.clone();
  t.v = whole.v.clone();
  t.decay = whole.decay;
  t.compute = Tensor::empty(whole.master.shape(), DType::bf16);
  t.master_lo = Tensor::empty(whole.master.shape(), DType::i16);
  split_f32(t.compute, t.master_lo, whole.master);
  return t;
}

Tensor joined(const AdamWTensor& split) {
  Tensor out = Tensor::empty(split.compute.shape(), DType::f32);
  join_f32(out, split.compute, split.master_lo);
  return out;
}

// Every 5th master's low 16 bits made a tie (0x8000): where a bf16 copy rounded to nearest even
// and one rounded away from zero differ (when the high half is even).
void put_ties(Tensor& master) {
  auto* bits = static_cast<uint32_t*>(master.raw());
  for (int64_t i = 0; i < master.numel(); i += 5) bits[i] = (bits[i] & 0xffff0000u) | 0x8000u;
}

// The compute copies of those ties rounded away from zero; returns how many of them nearest even
// would have rounded the other way.
int64_t expect_ties_rounded_away(const std::vector<AdamWTensor>& tensors) {
  int64_t differ = 0;
  for (const AdamWTensor& t : tensors) {
    const Tensor master = t.master.to(Device::cpu), copy = t.compute.to(Device::cpu);
    const auto* bits = static_cast<const uint32_t*>(master.raw());
    for (int64_t i = 0; i < master.numel(); i += 5) {
      EXPECT_EQ(copy.data<bf16>()[i].bits, (bits[i] + 0x8000u) >> 16) << i;
      differ += copy.data<bf16>()[i].bits != bf16(master.data<float>()[i]).bits ? 1 : 0;
    }
  }
  return differ;
}

// adamw_update_all on split masters (a bf16 model's) against whole masters with bf16 copies of
// their own (the slow twin): the same masters, moments and compute copies bit for bit over
// several steps. The first step, at lr 0, leaves every master as it was, so that the copies of
// the ties show their rounding.
TEST(FusedAdamW, SplitMastersEqualWholeMastersWithTheirCopies) {
  const AdamWConfig cfg{0.9, 0.95, 1e-8, 0.1};
  const std::vector<AdamCase> cases = {
      {1000, true, 1}, {37, false, 1}, {70001, true, 1}, {0, true, 1}, {4, false, 1}};
  std::vector<AdamWTensor> whole = adam_tensors(cases, DType::f32, Device::cpu, 400);
  std::vector<AdamWTensor> split;
  for (AdamWTensor& t : whole) {
    put_ties(t.master);
    split.push_back(split_twin(t));
  }
  for (int64_t step = 1; step <= 4; ++step) {
    SCOPED_TRACE(str("step ", step));
    const double lr = step == 1 ? 0.0 : 2e-3 * static_cast<double>(step), scale = 0.6 + 0.1 * step;
    adamw_update_all(whole, lr, cfg, step, scale);
    adamw_update_all(split, lr, cfg, step, scale);
    if (step == 1) {
      EXPECT_GT(expect_ties_rounded_away(whole), 100);
    }
    for (size_t i = 0; i < whole.size(); ++i) {
      if (whole[i].master.numel() == 0) continue;
      const std::string at = str("tensor ", i, " ");
      expect_same_bits(joined(split[i]), whole[i].master, at + "master");
      expect_same_bits(split[i].m, whole[i].m, at + "m");
      expect_same_bits(split[i].v, whole[i].v, at + "v");
      expect_same_bits(split[i].compute, whole[i].compute, at + "compute");
    }
  }
}

// Infinite masters stay infinite and NaN masters NaN through a split update, as through a whole
// one (a NaN's payload may differ).
TEST(FusedAdamW, SplitMastersKeepInfinitiesAndNaNs) {
  std::vector<AdamWTensor> whole = adam_tensors({{8, true, 1}}, DType::f32, Device::cpu, 500);
  float* p = whole[0].master.data<float>();
  p[0] = std::numeric_limits<float>::infinity();
  p[1] = -std::numeric_limits<float>::infinity();
  p[2] = std::bit_cast<float>(0x7f800001u);  // a NaN whose payload is all in the low half
  p[3] = std::bit_cast<float>(0xffffffffu);
  std::vector<AdamWTensor> split = {split_twin(whole[0])};
  adamw_update_all(whole, 1e-3, AdamWConfig{}, 1, 1.0);
  adamw_update_all(split, 1e-3, AdamWConfig{}, 1, 1.0);
  const Tensor got = joined(split[0]);
  EXPECT_EQ(got.data<float>()[0], std::numeric_limits<float>::infinity());
  EXPECT_EQ(got.data<float>()[1], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(got.data<float>()[2]));
  EXPECT_TRUE(std::isnan(got.data<float>()[3]));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(std::isnan(split[0].compute.data<bf16>()[i].to_float()),
              std::isnan(whole[0].compute.data<bf16>()[i].to_float()))
        << i;
  }
  for (int64_t i = 4; i < 8; ++i) EXPECT_EQ(got.data<float>()[i], whole[0].master.data<float>()[i]);
}

// The clipping scale formed from a norm tensor (what the GPU forms on the device) is the host's
// clip_scale: the same bits as adamw_update_all given that scale.
TEST(FusedAdamW, ClipFromANormTensorEqualsTheHostScale) {
  EXPECT_EQ(clip_scale(2.0, 0.5), 0.25);
  EXPECT_EQ(clip_scale(0.4, 0.5), 1.0);
  EXPECT_EQ(clip_scale(2.0, 0.0), 1.0);  // off
  EXPECT_EQ(clip_scale(std::nan(""), 0.5), 1.0);
  std::vector<Tensor> grads;
  std::vector<AdamWTensor> all = adam_tensors(kAdamCases, DType::f32, Device::cpu, 200);
  std::vector<AdamWTensor> ref = adam_tensors(kAdamCases, DType::f32, Device::cpu, 200);
  for (const AdamWTensor& t : all) grads.push_back(t.grad);
  const Tensor norm = global_grad_norm_tensor(grads);
  ASSERT_EQ(norm.numel(), 1);
  EXPECT_EQ(norm.data<double>()[0], global_grad_norm(grads));
  const double max_norm = 0.5 * norm.data<double>()[0];
  adamw_update_all(all, 1e-3, AdamWConfig{}, 1, norm, max_norm);
  adamw_update_all(ref, 1e-3, AdamWConfig{}, 1, clip_scale(norm.data<double>()[0], max_norm));
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i].master.numel() == 0) continue;
    expect_same_bits(all[i].master, ref[i].master, str("tensor ", i, " master"));
  }
  const Tensor wide = Tensor::zeros({2}, DType::f64);
  expect_error([&] { adamw_update_all(all, 1e-3, AdamWConfig{}, 1, wide, 1.0); },
               "must be one fp64 value");
}

// lr and step given as write_adamw_step_values' tensor (the form a captured GPU step reads)
// take the path of lr and step given directly: the same bits, at a step whose bias corrections
// and a rate whose decay factor are not round numbers.
TEST(FusedAdamW, StepValuesEqualLrAndStepGivenDirectly) {
  std::vector<AdamWTensor> all = adam_tensors(kAdamCases, DType::f32, Device::cpu, 300);
  std::vector<AdamWTensor> ref = adam_tensors(kAdamCases, DType::f32, Device::cpu, 300);
  std::vector<Tensor> grads;
  for (const AdamWTensor& t : all) grads.push_back(t.grad);
  const Tensor norm = global_grad_norm_tensor(grads);
  Tensor values = Tensor::zeros({kAdamWStepValues}, DType::f64);
  write_adamw_step_values(values, 7.3e-4, AdamWConfig{}, 13);
  EXPECT_EQ(values.data<double>()[0], 7.3e-4);
  EXPECT_EQ(values.data<double>()[1], 13.0);
  adamw_update_all(all, values, AdamWConfig{}, norm, 0.7);
  adamw_update_all(ref, 7.3e-4, AdamWConfig{}, 13, norm, 0.7);
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i].master.numel() == 0) continue;
    expect_same_bits(all[i].master, ref[i].master, str("tensor ", i, " master"));
    expect_same_bits(all[i].m, ref[i].m, str("tensor ", i, " m"));
  }
  expect_error([&] { write_adamw_step_values(values, 1e-3, AdamWConfig{}, 0); }, "step 0");
  const Tensor short_values = Tensor::zeros({2}, DType::f64);
  expect_error([&] { adamw_update_all(all, short_values, AdamWConfig{}, norm, 0.7); },
               "step values");
}

TEST(FusedErrors, BadInputIsAClearError) {
  const Shape s{4, 8};
  const Tensor a = rnd(s, 1, DType::f32), b = rnd(s, 2, DType::f32), w = rnd({8}, 3, DType::f32);
  Tensor x = poisoned(s, DType::f32), h = poisoned(s, DType::f32), mean = poisoned({4}, DType::f32),
         rstd = poisoned({4}, DType::f32), none;
  const Tensor b_short = rnd({4, 7}, 4, DType::f32), b_bf16 = rnd(s, 5, DType::bf16);
  expect_error([&] { add_layernorm_forward(x, h, mean, rstd, a, b_short, w, none, 1e-5); },
               "does not match a");
  expect_error([&] { add_rmsnorm_forward(x, h, rstd, a, b_bf16, w, 1e-5); }, "b is bf16");
  Tensor x_bf16 = poisoned(s, DType::bf16);
  expect_error([&] { add_rmsnorm_forward(x_bf16, h, rstd, a, b, w, 1e-5); }, "x_out is bf16");
  expect_error([&] { add_layernorm_forward(x, x, mean, rstd, a, b, w, none, 1e-5); },
               "h must not alias");
  expect_error([&] { add_layernorm_forward(x, h, none, rstd, a, b, w, none, 1e-5); },
               "mean is undefined");
  Tensor rstd_short = poisoned({3}, DType::f32);
  expect_error([&] { add_rmsnorm_forward(x, h, rstd_short, a, b, w, 1e-5); }, "one value per row");
  expect_error([&] { add_rmsnorm_forward(x, h, rstd, a, b, w, -1.0); }, "eps -1");

  layernorm_forward(h, mean, rstd, a, w, none, 1e-5);
  Tensor dout = rnd(s, 6, DType::f32), dw = Tensor::zeros({8}, DType::f32);
  expect_error([&] { layernorm_backward_add(none, dw, none, dout, a, w, mean, rstd); },
               "dresidual is undefined");
  expect_error([&] { layernorm_backward_add(dout, dw, none, dout, a, w, mean, rstd); },
               "must not alias dout");
  Tensor dres_wide = rnd({4, 9}, 7, DType::f32);
  expect_error([&] { rmsnorm_backward_add(dres_wide, dw, dout, a, w, rstd); },
               "dresidual [4, 9] does not match x [4, 8]");

  const Tensor fc_w = rnd({16, 8}, 8, DType::f32), fc_b = rnd({16}, 9, DType::f32);
  Tensor pre = poisoned({4, 16}, DType::f32), out = poisoned({4, 16}, DType::f32);
  Tensor out_narrow = poisoned({4, 15}, DType::f32);
  expect_error([&] { linear_gelu_forward(pre, pre, a, fc_w, fc_b); }, "must not alias pre");
  expect_error([&] { linear_gelu_forward(pre, out_narrow, a, fc_w, fc_b); },
               "out [4, 15] does not match pre [4, 16]");
  expect_error([&] { linear_gelu_forward(out_narrow, out, a, fc_w, fc_b); }, "pre [4, 15]");
  // linear_gelu_backward: act [4, 16] -> out [4, 8].
  const Tensor down_w = rnd({8, 16}, 10, DType::f32), dy = rnd({4, 8}, 11, DType::f32);
  Tensor dpre = poisoned({4, 16}, DType::f32), ddw = Tensor::zeros({8, 16}, DType::f32);
  Tensor ddb_short = Tensor::zeros({7}, DType::f32);
  expect_error([&] { linear_gelu_backward(none, ddw, none, dy, out, down_w, pre); },
               "dpre is undefined");
  expect_error([&] { linear_gelu_backward(pre, ddw, none, dy, out, down_w, pre); },
               "must not alias");
  expect_error([&] { linear_gelu_backward(dpre, ddw, none, dy, out, down_w, out_narrow); },
               "pre [4, 15]");
  expect_error([&] { linear_gelu_backward(dpre, ddw, ddb_short, dy, out, down_w, pre); },
               "db has shape [7], expected [8]");

  std::vector<AdamWTensor> ts =
      adam_tensors({{8, true, 1}, {8, false, 0}}, DType::f32, Device::cpu, 1);
  ts[1].grad = Tensor::zeros({9}, DType::f32);
  expect_error([&] { adamw_update_all(ts, 1e-3, AdamWConfig{}, 1, 1.0); }, "grad [9]");
  ts = adam_tensors({{8, true, 1}}, DType::f32, Device::cpu, 1);
  expect_error([&] { adamw_update_all(ts, 1e-3, AdamWConfig{}, 0, 1.0); }, "step 0");
  ts[0].compute = Tensor::zeros({7}, DType::bf16);
  expect_error([&] { adamw_update_all(ts, 1e-3, AdamWConfig{}, 1, 1.0); },
               "tensor 0 compute [7] does not match master [8]");
  ts = {split_twin(adam_tensors({{8, true, 1}}, DType::f32, Device::cpu, 1)[0])};
  ts[0].master = Tensor::zeros({8}, DType::f32);
  expect_error([&] { adamw_update_all(ts, 1e-3, AdamWConfig{}, 1, 1.0); },
               "has a master and a low half");
  ts[0].master = Tensor();
  ts[0].master_lo = Tensor::zeros({8}, DType::i32);
  expect_error([&] { adamw_update_all(ts, 1e-3, AdamWConfig{}, 1, 1.0); },
               "bf16 (compute) and int16 (master_lo)");
  ts[0].master_lo = Tensor::zeros({7}, DType::i16);
  expect_error([&] { adamw_update_all(ts, 1e-3, AdamWConfig{}, 1, 1.0); },
               "compute [8] does not match master_lo [7]");
}

}  // namespace
}  // namespace ft::nn
