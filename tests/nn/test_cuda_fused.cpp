// The fused CUDA layers against the CPU (fp32 at 1e-5 relative, bf16 at one bf16 rounding) and
// against the unfused CUDA pair (bit for bit where both do the same fp32 operations):
// add + norm forward, norm backward accumulating into the residual gradient, linear with the
// cuBLASLt GELU epilogue (checked to be the TANH GELU, not erf, on inputs where the two differ
// most) and the one-launch multi-tensor AdamW (bit for bit against the CPU, compute copies
// included; split masters against whole ones with copies of their own, on both devices). GPU
// outputs are poisoned with NaN first. Skips without CUDA or a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/f32_halves.h"
#include "cuda_test_util.h"
#include "grad_check.h"
#include "nn/adamw.h"
#include "nn/layers.h"

namespace ft::nn {
namespace {

using namespace ft::nn::testing;

struct Case {
  DType dtype;
  int64_t C;
};

// 450 rows (several warps' blocks, a partial last block). Rows of 16-byte packs up to 4096 bf16
// or 2048 fp32 columns run the kernels that keep a row in registers (C = 96: one pack per lane;
// bf16 768: three, GPT-2's width; bf16 1024: four; fp32 768 and bf16 2048, llama3-1b's width: four
// warps a row), C = 50 the element-wise ones. test_cuda_norm_rows.cpp covers the rows split over
// warps and the streaming kernels at the same widths.
class CudaFusedNorms : public ::testing::TestWithParam<Case> {
 protected:
  DType dt() const { return GetParam().dtype; }
  int64_t C() const { return GetParam().C; }
  double tol() const { return dt() == DType::f32 ? kFp32Tol : kBf16Tol; }
  Shape shape() const { return {kB, kT, C()}; }
  static constexpr int64_t kB = 3, kT = 150, kRows = kB * kT;
};

TEST_P(CudaFusedNorms, AddNormForward) {
  SKIP_WITHOUT_GPU();
  for (const bool layer : {true, false}) {
    SCOPED_TRACE(layer ? "layernorm" : "rmsnorm");
    Tensor a = randn(shape(), 1, DType::f64, 2.0);
    for (int64_t i = 0; i < a.numel(); ++i) a.data<double>()[i] += 3.0;  // offset mean
    a = a.to(dt());
    const Tensor b = rnd(shape(), 2, dt()), w = rnd({C()}, 3, dt()), bias = rnd({C()}, 4, dt());
    const Tensor ga = gpu(a), gb = gpu(b), gw = gpu(w), gbias = gpu(bias);
    auto run = [&](Tensor& x, Tensor& h, Tensor& mean, Tensor& rstd, const Tensor& ia,
                   const Tensor& ib, const Tensor& iw, const Tensor& ibias) {
      if (layer) {
        add_layernorm_forward(x, h, mean, rstd, ia, ib, iw, ibias, 1e-5);
      } else {
        add_rmsnorm_forward(x, h, rstd, ia, ib, iw, 1e-5);
      }
    };
    Tensor x = poisoned(shape(), dt()), h = poisoned(shape(), dt());
    Tensor mean = poisoned({kRows}, DType::f32), rstd = poisoned({kRows}, DType::f32);
    run(x, h, mean, rstd, a, b, w, bias);

    Tensor gx = gpu_poisoned(shape(), dt()), gh = gpu_poisoned(shape(), dt());
    Tensor gmean = gpu_poisoned({kRows}, DType::f32), grstd = gpu_poisoned({kRows}, DType::f32);
    run(gx, gh, gmean, grstd, ga, gb, gw, gbias);
    expect_same_bits(gx, x, "x_out vs CPU (one exactly rounded add)");
    expect_match(gh, h, tol(), "h");
    if (layer) expect_match(gmean, mean, kFp32Tol, "mean");
    expect_match(grstd, rstd, kFp32Tol, "rstd");

    // The unfused GPU pair does the same fp32 operations: same bits.
    Tensor ux = gpu_poisoned(shape(), dt()), uh = gpu_poisoned(shape(), dt());
    Tensor umean = gpu_poisoned({kRows}, DType::f32), urstd = gpu_poisoned({kRows}, DType::f32);
    add(ux, ga, gb);
    if (layer) {
      layernorm_forward(uh, umean, urstd, ux, gw, gbias, 1e-5);
      expect_same_bits(gmean, umean, "mean vs unfused GPU");
    } else {
      rmsnorm_forward(uh, urstd, ux, gw, 1e-5);
    }
    expect_same_bits(gh, uh, "h vs unfused GPU");
    expect_same_bits(grstd, urstd, "rstd vs unfused GPU");

    // x_out may alias a.
    Tensor inplace = gpu(a), ih = gpu_poisoned(shape(), dt());
    run(inplace, ih, gmean, grstd, inplace, gb, gw, gbias);
    expect_same_bits(inplace, x, "x_out written over a");
    expect_same_bits(ih, gh, "h with x_out aliasing a");
  }
}

TEST_P(CudaFusedNorms, NormBackwardAdd) {
  SKIP_WITHOUT_GPU();
  for (const bool layer : {true, false}) {
    SCOPED_TRACE(layer ? "layernorm" : "rmsnorm");
    const Tensor x = rnd(shape(), 5, dt(), 2.0), w = rnd({C()}, 6, dt()),
                 bias = rnd({C()}, 7, dt());
    const Tensor dout = rnd(shape(), 8, dt()), dres0 = rnd(shape(), 9, dt());
    const Tensor dw0 = rnd({C()}, 10, DType::f32), db0 = rnd({C()}, 11, DType::f32);
    Tensor h = poisoned(shape(), dt()), mean = poisoned({kRows}, DType::f32),
           rstd = poisoned({kRows}, DType::f32);
    if (layer) {
      layernorm_forward(h, mean, rstd, x, w, bias, 1e-5);
    } else {
      rmsnorm_forward(h, rstd, x, w, 1e-5);
    }
    const Tensor gx = gpu(x), gw = gpu(w), gdout = gpu(dout), gmean = gpu(mean), grstd = gpu(rstd);
    auto run = [&](Tensor& dres, Tensor& dw, Tensor& db, const Tensor& d, const Tensor& xx,
                   const Tensor& ww, const Tensor& mu, const Tensor& rs) {
      if (layer) {
        layernorm_backward_add(dres, dw, db, d, xx, ww, mu, rs);
      } else {
        rmsnorm_backward_add(dres, dw, d, xx, ww, rs);
      }
    };
    Tensor dres = dres0.to(dt()), dw = dw0.to(DType::f32), db = db0.to(DType::f32);
    run(dres, dw, db, dout, x, w, mean, rstd);
    Tensor g_dres = gpu(dres0), g_dw = gpu(dw0), g_db = gpu(db0);
    run(g_dres, g_dw, g_db, gdout, gx, gw, gmean, grstd);
    expect_match(g_dres, dres, tol(), "dresidual");
    expect_match(g_dw, dw, kFp32Tol, "dw");
    if (layer) expect_match(g_db, db, kFp32Tol, "db");

    // Against the unfused GPU pair (norm backward into a poisoned dx, then add): same bits.
    Tensor u_dx = gpu_poisoned(shape(), dt()), u_dw = gpu(dw0), u_db = gpu(db0);
    if (layer) {
      layernorm_backward(u_dx, u_dw, u_db, gdout, gx, gw, gmean, grstd);
    } else {
      rmsnorm_backward(u_dx, u_dw, gdout, gx, gw, grstd);
    }
    Tensor u_dres = gpu(dres0);
    add(u_dres, u_dx, u_dres);
    expect_same_bits(g_dres, u_dres, "dresidual vs unfused GPU");
    expect_same_bits(g_dw, u_dw, "dw vs unfused GPU");
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaFusedNorms,
                         ::testing::Values(Case{DType::f32, 96}, Case{DType::bf16, 96},
                                           Case{DType::f32, 768}, Case{DType::bf16, 768},
                                           Case{DType::bf16, 1024}, Case{DType::bf16, 2048},
                                           Case{DType::f32, 50}, Case{DType::bf16, 50}),
                         [](const ::testing::TestParamInfo<Case>& p) {
                           return std::string(dtype_name(p.param.dtype)) + "_C" +
                                  std::to_string(p.param.C);
                         });

double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
double gelu_erf(double x) {
  return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
}

// Largest |out[i] - f(pre[i])| over all elements, in fp64.
double max_dev(const Tensor& out, const Tensor& pre, double (*f)(double)) {
  const Tensor o = host(out).to(DType::f64), p = host(pre).to(DType::f64);
  double worst = 0.0;
  for (int64_t i = 0; i < o.numel(); ++i) {
    worst = std::max(worst, std::abs(o.data<double>()[i] - f(p.data<double>()[i])));
  }
  return worst;
}

// GELU_AUX_BIAS must be the tanh GELU (GPT-2's). The bias sweeps [-4, 4] across the columns and
// the product adds a little noise, so pre covers |x| ~ 2.7, where tanh and erf GELU differ most
// (4.7e-4). fp32: out must be within 2e-5 of tanh_gelu(pre) (pre as the GPU wrote it) for every
// element, and more than 1e-4 from erf_gelu(pre) somewhere, i.e. the test can tell them apart.
TEST(CudaFusedLinearGelu, EpilogueIsTanhGeluAndMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const int64_t N = 130, IC = 48;
  for (const DType dt : {DType::f32, DType::bf16}) {
    // OC = 64: the epilogue; OC = 50 (not a multiple of 8) and no bias: the unfused fallback.
    for (const auto& [OC, with_bias] :
         {std::pair<int64_t, bool>{64, true}, {50, true}, {64, false}}) {
      SCOPED_TRACE(str(dtype_name(dt), " OC=", OC, with_bias ? " bias" : " no bias"));
      const double tol = dt == DType::f32 ? kFp32Tol : kBf16Tol;
      Tensor b64 = Tensor::empty({OC}, DType::f64);
      for (int64_t j = 0; j < OC; ++j) {
        b64.data<double>()[j] = -4.0 + 8.0 * static_cast<double>(j) / static_cast<double>(OC - 1);
      }
      const Tensor inp = rnd({N, IC}, 30, dt), w = rnd({OC, IC}, 31, dt, 0.05);
      const Tensor b = with_bias ? b64.to(dt) : Tensor();
      Tensor pre = poisoned({N, OC}, dt), out = poisoned({N, OC}, dt);
      linear_gelu_forward(pre, out, inp, w, b);
      Tensor gpre = gpu_poisoned({N, OC}, dt), gout = gpu_poisoned({N, OC}, dt);
      linear_gelu_forward(gpre, gout, gpu(inp), gpu(w), with_bias ? gpu(b) : Tensor());
      expect_match(gpre, pre, tol, "pre");
      expect_match(gout, out, tol, "out");
      if (dt == DType::f32 && with_bias) {
        const double to_tanh = max_dev(gout, gpre, gelu_tanh);
        const double to_erf = max_dev(gout, gpre, gelu_erf);
        std::cout << "[   info   ] OC=" << OC << " fp32 GELU: max |out - tanh_gelu(pre)| "
                  << to_tanh << ", max |out - erf_gelu(pre)| " << to_erf << "\n";
        EXPECT_LT(to_tanh, 2e-5) << "not the tanh GELU? distance to erf GELU " << to_erf;
        EXPECT_GT(to_erf, 1e-4) << "inputs do not separate tanh and erf GELU";
      }
    }
  }
}

struct AdamCase {
  int64_t n;
  bool decay;
  DType copy;  // f64: no copy, i32: the copy is master itself
};

// Tensors: packed (n % 4 == 0), element-wise (n = 37, and a misaligned slice), several chunks
// (70001 > 2 x 32768), empty; bf16 and fp32 compute copies, an aliasing one, none.
std::vector<AdamWTensor> adam_tensors(Device device) {
  const std::vector<AdamCase> cases = {{1000, true, DType::bf16},  {37, false, DType::bf16},
                                       {70001, true, DType::f32},  {4, false, DType::f64},
                                       {96, true, DType::i32},     {0, true, DType::bf16},
                                       {65536, false, DType::bf16}};
  std::vector<AdamWTensor> out;
  for (size_t i = 0; i < cases.size(); ++i) {
    const AdamCase& c = cases[i];
    const uint64_t s = 500 + 10 * i;
    AdamWTensor t;
    t.master = randn({c.n}, s, DType::f64, 0.5).to(DType::f32).to(device);
    t.grad = randn({c.n}, s + 1, DType::f64, 0.1).to(DType::f32).to(device);
    t.m = randn({c.n}, s + 2, DType::f64, 0.01).to(DType::f32).to(device);
    Tensor v = randn({c.n}, s + 3, DType::f64, 0.1);
    for (int64_t j = 0; j < v.numel(); ++j) v.data<double>()[j] *= v.data<double>()[j];
    t.v = v.to(DType::f32).to(device);
    t.decay = c.decay;
    if (c.copy == DType::bf16 || c.copy == DType::f32) {
      t.compute = poisoned({c.n}, c.copy).to(device);
    } else if (c.copy == DType::i32) {
      t.compute = t.master;
    }
    out.push_back(t);
  }
  // A misaligned view (offset of one fp32 element): the element-wise path.
  AdamWTensor t;
  const Tensor big = randn({65}, 900, DType::f64, 0.5).to(DType::f32).to(device);
  t.master = big.slice(1, 65);
  t.grad = randn({65}, 901, DType::f64, 0.1).to(DType::f32).to(device).slice(1, 65);
  t.m = Tensor::zeros({65}, DType::f32, device).slice(1, 65);
  t.v = Tensor::zeros({65}, DType::f32, device).slice(1, 65);
  t.decay = true;
  t.compute = poisoned({65}, DType::bf16).to(device).slice(1, 65);
  out.push_back(t);
  return out;
}

TEST(CudaFusedAdamW, UpdateAllMatchesCpuAndPerTensorBitForBit) {
  SKIP_WITHOUT_GPU();
  const AdamWConfig cfg{0.9, 0.95, 1e-8, 0.1};
  std::vector<AdamWTensor> cpu = adam_tensors(Device::cpu);
  std::vector<AdamWTensor> all = adam_tensors(Device::cuda);
  std::vector<AdamWTensor> one = adam_tensors(Device::cuda);
  for (int64_t step = 1; step <= 3; ++step) {
    const double lr = 6e-4 * static_cast<double>(step), scale = 1.0 / (1.0 + step);
    adamw_update_all(cpu, lr, cfg, step, scale);
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
    expect_same_bits(all[i].master, cpu[i].master, at + "master vs CPU");
    expect_same_bits(all[i].m, cpu[i].m, at + "m vs CPU");
    expect_same_bits(all[i].v, cpu[i].v, at + "v vs CPU");
    expect_same_bits(all[i].master, one[i].master, at + "master vs per-tensor GPU");
    if (all[i].compute.defined()) {
      expect_same_bits(all[i].compute, cpu[i].compute, at + "compute vs CPU");
      expect_same_bits(all[i].compute, one[i].compute, at + "compute vs per-tensor GPU");
    }
  }
}

// A copy of a whole tensor on `device`: in the split form (split: the master's halves as compute
// and master_lo) or whole, its buffers `offset` elements into new allocations (1: not 16-byte
// aligned, the element-wise path).
AdamWTensor twin(const AdamWTensor& whole, Device device, bool split, int64_t offset) {
  const int64_t n = whole.grad.numel();
  auto place = [&](const Tensor& src, DType dtype) {
    Tensor t = Tensor::empty({n + offset}, dtype, device).slice(offset, n + offset);
    if (src.defined()) t.copy_from(src);
    return t;
  };
  AdamWTensor t;
  t.grad = place(whole.grad, DType::f32);
  t.m = place(whole.m, DType::f32);
  t.v = place(whole.v, DType::f32);
  t.decay = whole.decay;
  if (split) {
    const Tensor master = whole.master.to(device);
    t.compute = place(Tensor(), DType::bf16);
    t.master_lo = place(Tensor(), DType::i16);
    split_f32(t.compute, t.master_lo, master);
  } else {
    t.master = place(whole.master, DType::f32);
    t.compute = place(whole.compute, DType::bf16);
  }
  return t;
}

// The fp32 masters of a tensor, whole or split, on the CPU.
Tensor masters_of(const AdamWTensor& t) {
  if (!t.master_lo.defined()) return host(t.master);
  Tensor out = Tensor::empty(t.compute.shape(), DType::f32);
  join_f32(out, host(t.compute), host(t.master_lo));
  return out;
}

// Split masters (a bf16 model's) updated on the GPU (packed and element-wise) against whole ones
// with bf16 copies of their own on the GPU and on the CPU: the same masters, moments and compute
// copies bit for bit. Every 5th master starts as a tie (low 16 bits 0x8000) and the first step,
// at lr 0, keeps the masters as they are, so the copies show the ties' rounding (away from
// zero, the high half of a split master).
TEST(CudaFusedAdamW, SplitMastersMatchWholeMastersAndTheCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  const AdamWConfig cfg{0.9, 0.95, 1e-8, 0.1};
  std::vector<AdamWTensor> base;
  for (const AdamWTensor& t : adam_tensors(Device::cpu)) {
    if (t.compute.defined() && t.compute.dtype() == DType::bf16) base.push_back(t);
  }
  std::vector<AdamWTensor> cpu, whole, split, split_unpacked;
  for (AdamWTensor& t : base) {
    auto* bits = static_cast<uint32_t*>(t.master.raw());
    for (int64_t i = 0; i < t.master.numel(); i += 5) bits[i] = (bits[i] & 0xffff0000u) | 0x8000u;
    cpu.push_back(twin(t, Device::cpu, false, 0));
    whole.push_back(twin(t, Device::cuda, false, 0));
    split.push_back(twin(t, Device::cuda, true, 0));
    split_unpacked.push_back(twin(t, Device::cuda, true, 1));
  }
  for (int64_t step = 1; step <= 4; ++step) {
    SCOPED_TRACE(str("step ", step));
    const double lr = step == 1 ? 0.0 : 5e-4 * static_cast<double>(step);
    const double scale = 1.0 / (1.0 + step);
    for (std::vector<AdamWTensor>* set : {&cpu, &whole, &split, &split_unpacked}) {
      adamw_update_all(*set, lr, cfg, step, scale);
    }
    for (size_t i = 0; i < cpu.size(); ++i) {
      if (cpu[i].grad.numel() == 0) continue;
      const Tensor want = cpu[i].master;
      for (const auto& [got, what] :
           {std::pair{&whole[i], "whole GPU"}, std::pair{&split[i], "split GPU"},
            std::pair{&split_unpacked[i], "split GPU, element-wise"}}) {
        const std::string at = str("tensor ", i, " ", what, " ");
        expect_same_bits(masters_of(*got), want, at + "master");
        expect_same_bits(got->m, cpu[i].m, at + "m");
        expect_same_bits(got->v, cpu[i].v, at + "v");
        expect_same_bits(got->compute, cpu[i].compute, at + "compute");
      }
      if (step == 1) {
        const auto* bits = static_cast<const uint32_t*>(want.raw());
        const Tensor copy = host(split[i].compute);
        for (int64_t e = 0; e < want.numel(); e += 5) {
          EXPECT_EQ(copy.data<bf16>()[e].bits, (bits[e] + 0x8000u) >> 16)
              << "tensor " << i << " element " << e;
        }
      }
    }
  }
}

TEST(CudaFusedErrors, BadInputIsAClearError) {
  SKIP_WITHOUT_GPU();
  const Shape s{4, 8};
  const Tensor a = gpu(rnd(s, 1, DType::f32)), b_cpu = rnd(s, 2, DType::f32),
               w = gpu(rnd({8}, 3, DType::f32));
  Tensor x = gpu_poisoned(s, DType::f32), h = gpu_poisoned(s, DType::f32),
         rstd = gpu_poisoned({4}, DType::f32);
  expect_error([&] { add_rmsnorm_forward(x, h, rstd, a, b_cpu, w, 1e-5); }, "b is on cpu");
  const Tensor a64 = gpu(rnd(s, 4, DType::f64)), w64 = gpu(rnd({8}, 5, DType::f64));
  Tensor x64 = gpu_poisoned(s, DType::f64), h64 = gpu_poisoned(s, DType::f64),
         rstd64 = gpu_poisoned({4}, DType::f64);
  expect_error([&] { add_rmsnorm_forward(x64, h64, rstd64, a64, a64, w64, 1e-5); },
               "not supported on CUDA");
  Tensor dres_cpu = rnd(s, 6, DType::f32), dw = gpu(Tensor::zeros({8}, DType::f32));
  rmsnorm_forward(h, rstd, a, w, 1e-5);
  expect_error([&] { rmsnorm_backward_add(dres_cpu, dw, h, a, w, rstd); }, "is on cpu");

  std::vector<AdamWTensor> ts(1);
  ts[0].master = gpu(Tensor::zeros({8}, DType::f32));
  ts[0].grad = Tensor::zeros({8}, DType::f32);  // on the CPU
  ts[0].m = gpu(Tensor::zeros({8}, DType::f32));
  ts[0].v = gpu(Tensor::zeros({8}, DType::f32));
  expect_error([&] { adamw_update_all(ts, 1e-3, AdamWConfig{}, 1, 1.0); }, "grad is on cpu");
}

}  // namespace
}  // namespace ft::nn
