// The norms' register path where a row is split over warps (2048 and 4096 bf16 columns, 768 and
// 2048 fp32: four warps a row) and where it is not (one warp, or rows that stream), run
// through every entry point: add + norm forward, the unfused forward, the backward and the
// backward accumulating into the residual gradient, LayerNorm and RMSNorm. Each call is made
// twice on the GPU, with the register path and with it switched off (the streaming kernels,
// cuda::set_norm_rows_in_registers): every output but the parameter gradients must be the same
// bits (the row sums are added in one order on both paths), the parameter gradients agree to
// fp32 rounding, and all of it matches the CPU (fp32 1e-5 relative, bf16 one bf16 rounding).
// Rows whose pointers are not 16-byte aligned run the element-wise kernels and must match the
// CPU too. GPU outputs are poisoned with NaN first. Skips without CUDA or a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "core/device.h"
#include "cuda_test_util.h"
#include "grad_check.h"
#include "nn/layers.h"
#ifdef FLASHTRAIN_WITH_CUDA
#include "nn/cuda/cuda_layers.h"
#endif

namespace ft::nn {
namespace {

using namespace ft::nn::testing;

#ifdef FLASHTRAIN_WITH_CUDA

constexpr double kEps = 1e-5;
// 1203 rows: more than 256 blocks of 2 rows, so that the backward's row groups take
// several rows in turn, and a partial last block in the forward.
constexpr int64_t kB = 3, kT = 401, kRows = kB * kT;

struct RowCase {
  DType dtype;
  int64_t C;
  int warps;  // the warps a row takes on the register path; 0: the row streams
};

struct NormInputs {
  Tensor a, b, w, bias, dout, dres0, dw0, db0;  // on the CPU
};

struct NormOutputs {
  Tensor x, h, mean, rstd;                 // add + norm forward
  Tensor plain_h, plain_mean, plain_rstd;  // the unfused forward of x
  Tensor dx, dw, db;                       // the backward, onto dw0 and db0
  Tensor dres, add_dw, add_db;             // the backward accumulating into dres0
};

NormInputs make_inputs(DType dt, int64_t C) {
  const Shape shape{kB, kT, C};
  Tensor a = randn(shape, 1, DType::f64, 2.0);
  for (int64_t i = 0; i < a.numel(); ++i) a.data<double>()[i] += 3.0;  // offset mean
  return {a.to(dt),          rnd(shape, 2, dt), rnd({C}, 3, dt),         rnd({C}, 4, dt),
          rnd(shape, 5, dt), rnd(shape, 6, dt), rnd({C}, 7, DType::f32), rnd({C}, 8, DType::f32)};
}

// A GPU copy of t whose data starts one element past a 16-byte boundary.
Tensor gpu_unaligned(const Tensor& t) {
  Tensor flat = Tensor::zeros({t.numel() + 1}, t.dtype());
  const size_t bytes = dtype_size(t.dtype());
  std::memcpy(static_cast<char*>(flat.raw()) + bytes, t.raw(), bytes * t.numel());
  return gpu(flat).slice(1, t.numel() + 1).view(t.shape());
}

enum class Where { cpu, gpu, gpu_unaligned };

// Every norm entry point on in, on the CPU or the GPU; outputs poisoned first.
NormOutputs run_norms(const NormInputs& in, bool layer, Where where) {
  auto on = [&](const Tensor& t) {
    switch (where) {
      case Where::cpu:
        return t.clone();
      case Where::gpu:
        return gpu(t);
      default:
        return gpu_unaligned(t);
    }
  };
  const DType dt = in.a.dtype();
  const Shape shape = in.a.shape();
  const Tensor a = on(in.a), b = on(in.b), w = on(in.w), bias = on(in.bias), dout = on(in.dout);
  NormOutputs o;
  o.x = on(poisoned(shape, dt));
  o.h = on(poisoned(shape, dt));
  o.mean = on(poisoned({kRows}, DType::f32));
  o.rstd = on(poisoned({kRows}, DType::f32));
  o.plain_h = on(poisoned(shape, dt));
  o.plain_mean = on(poisoned({kRows}, DType::f32));
  o.plain_rstd = on(poisoned({kRows}, DType::f32));
  o.dx = on(poisoned(shape, dt));
  o.dw = on(in.dw0);
  o.db = on(in.db0);
  o.dres = on(in.dres0);
  o.add_dw = on(in.dw0);
  o.add_db = on(in.db0);
  if (layer) {
    add_layernorm_forward(o.x, o.h, o.mean, o.rstd, a, b, w, bias, kEps);
    layernorm_forward(o.plain_h, o.plain_mean, o.plain_rstd, o.x, w, bias, kEps);
    layernorm_backward(o.dx, o.dw, o.db, dout, o.x, w, o.mean, o.rstd);
    layernorm_backward_add(o.dres, o.add_dw, o.add_db, dout, o.x, w, o.mean, o.rstd);
  } else {
    add_rmsnorm_forward(o.x, o.h, o.rstd, a, b, w, kEps);
    rmsnorm_forward(o.plain_h, o.plain_rstd, o.x, w, kEps);
    rmsnorm_backward(o.dx, o.dw, dout, o.x, w, o.rstd);
    rmsnorm_backward_add(o.dres, o.add_dw, dout, o.x, w, o.rstd);
  }
  return o;
}

// got (GPU) against the CPU's outputs.
void expect_match_cpu(const NormOutputs& got, const NormOutputs& cpu, bool layer, double tol) {
  expect_same_bits(got.x, cpu.x, "x_out (one exactly rounded add)");
  expect_match(got.h, cpu.h, tol, "h");
  expect_match(got.rstd, cpu.rstd, kFp32Tol, "rstd");
  expect_match(got.plain_h, cpu.plain_h, tol, "unfused h");
  expect_match(got.plain_rstd, cpu.plain_rstd, kFp32Tol, "unfused rstd");
  expect_match(got.dx, cpu.dx, tol, "dx");
  expect_match(got.dw, cpu.dw, kFp32Tol, "dw");
  expect_match(got.dres, cpu.dres, tol, "dresidual");
  expect_match(got.add_dw, cpu.add_dw, kFp32Tol, "dw of the residual backward");
  if (layer) {
    expect_match(got.mean, cpu.mean, kFp32Tol, "mean");
    expect_match(got.plain_mean, cpu.plain_mean, kFp32Tol, "unfused mean");
    expect_match(got.db, cpu.db, kFp32Tol, "db");
    expect_match(got.add_db, cpu.add_db, kFp32Tol, "db of the residual backward");
  }
}

// Every output of a and b the same bits; the parameter gradients too when params.
void expect_same_outputs(const NormOutputs& a, const NormOutputs& b, bool layer, bool params,
                         const std::string& what) {
  SCOPED_TRACE(what);
  expect_same_bits(a.x, b.x, "x_out");
  expect_same_bits(a.h, b.h, "h");
  expect_same_bits(a.rstd, b.rstd, "rstd");
  expect_same_bits(a.plain_h, b.plain_h, "unfused h");
  expect_same_bits(a.plain_rstd, b.plain_rstd, "unfused rstd");
  expect_same_bits(a.dx, b.dx, "dx");
  expect_same_bits(a.dres, b.dres, "dresidual");
  if (layer) {
    expect_same_bits(a.mean, b.mean, "mean");
    expect_same_bits(a.plain_mean, b.plain_mean, "unfused mean");
  }
  if (params) {
    expect_same_bits(a.dw, b.dw, "dw");
    expect_same_bits(a.add_dw, b.add_dw, "dw of the residual backward");
    if (layer) {
      expect_same_bits(a.db, b.db, "db");
      expect_same_bits(a.add_db, b.add_db, "db of the residual backward");
    }
  }
}

// Restores the register path however the test leaves.
struct StreamingNorms {
  StreamingNorms() : was(cuda::set_norm_rows_in_registers(false)) {}
  ~StreamingNorms() { cuda::set_norm_rows_in_registers(was); }
  bool was;
};

class CudaNormRows : public ::testing::TestWithParam<RowCase> {};

TEST_P(CudaNormRows, RegisterAndStreamingKernelsGiveTheSameBits) {
  SKIP_WITHOUT_GPU();
  const RowCase& c = GetParam();
  const double tol = c.dtype == DType::f32 ? kFp32Tol : kBf16Tol;
  // The case runs the path it is meant to (a wrong expectation here is a test, not a kernel, bug).
  ASSERT_EQ(cuda::norm_register_row_warps(c.dtype, c.C), c.warps);
  const NormInputs in = make_inputs(c.dtype, c.C);
  for (const bool layer : {true, false}) {
    SCOPED_TRACE(layer ? "layernorm" : "rmsnorm");
    const NormOutputs cpu = run_norms(in, layer, Where::cpu);
    const NormOutputs regs = run_norms(in, layer, Where::gpu);
    {
      SCOPED_TRACE("register path against the CPU");
      expect_match_cpu(regs, cpu, layer, tol);
    }
    // Deterministic: the parameter gradients too.
    expect_same_outputs(run_norms(in, layer, Where::gpu), regs, layer, true, "a second run");
    // Fused and unfused backward: the same dx (rounded, then added) and the same dw, db.
    expect_same_bits(regs.add_dw, regs.dw, "dw fused vs unfused");
    if (layer) expect_same_bits(regs.add_db, regs.db, "db fused vs unfused");
    expect_same_bits(regs.plain_h, regs.h, "h fused vs unfused");
    expect_same_bits(regs.plain_rstd, regs.rstd, "rstd fused vs unfused");
    // dx may alias dout (and without parameter gradients the kernel skips its column sums).
    Tensor inplace = gpu(in.dout), no_dw, no_db;
    const Tensor gw = gpu(in.w);
    if (layer) {
      layernorm_backward(inplace, no_dw, no_db, inplace, regs.x, gw, regs.mean, regs.rstd);
    } else {
      rmsnorm_backward(inplace, no_dw, inplace, regs.x, gw, regs.rstd);
    }
    expect_same_bits(inplace, regs.dx, "dx written over dout");

    NormOutputs streamed;
    {
      const StreamingNorms streaming;
      streamed = run_norms(in, layer, Where::gpu);
    }
    {
      SCOPED_TRACE("streaming kernels against the CPU");
      expect_match_cpu(streamed, cpu, layer, tol);
    }
    // The parameter gradients are summed in another order on the two paths (the same bits only
    // where both stream).
    expect_same_outputs(regs, streamed, layer, c.warps == 0, "register vs streaming kernels");

    if (c.warps > 0) {
      SCOPED_TRACE("pointers off 16 bytes: the element-wise kernels");
      expect_match_cpu(run_norms(in, layer, Where::gpu_unaligned), cpu, layer, tol);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Rows, CudaNormRows,
    ::testing::Values(RowCase{DType::bf16, 2048, 4},  // llama3-1b: four warps of 2 packs a lane
                      RowCase{DType::bf16, 4096, 4},  // four warps of 4 packs
                      RowCase{DType::bf16, 3072, 4},  // four warps of 3 packs
                      RowCase{DType::bf16, 1032, 4},  // 129 packs: slices of 33, 33, 33, 30
                      RowCase{DType::bf16, 768, 1},   // GPT-2: one warp, 3 packs
                      RowCase{DType::f32, 2048, 4},   // four warps of 4 fp32 packs
                      RowCase{DType::f32, 768, 4},    // 192 packs: four warps of 2
                      RowCase{DType::f32, 4096, 0},   // 1024 packs: streams
                      RowCase{DType::bf16, 8192, 0},  // 1024 packs: streams in 8 slices
                      RowCase{DType::bf16, 2047, 0},  // odd: element-wise
                      RowCase{DType::f32, 2046, 0}),  // not whole packs: element-wise
    [](const ::testing::TestParamInfo<RowCase>& p) {
      return std::string(dtype_name(p.param.dtype)) + "_C" + std::to_string(p.param.C);
    });

#else

TEST(CudaNormRows, RegisterAndStreamingKernelsGiveTheSameBits) {
  SKIP_WITHOUT_GPU();
}

#endif

}  // namespace
}  // namespace ft::nn
