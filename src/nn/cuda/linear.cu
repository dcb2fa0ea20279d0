// Fully connected layer on the GPU: the products go through cuBLASLt (core/cuda/gemm.h), the
// bias gradient through a deterministic two-pass column reduction.
//
// Forward: out[N, OC] = inp[N, IC] @ w[OC, IC]^T + b, the bias added in cuBLASLt's epilogue, so
// a bf16 output is rounded once, after the bias is in (as on the CPU).
// Backward: dinp = dout @ w (beta = 0, written); dw += dout^T @ inp (beta = 1 straight into the
// fp32 gradient: bf16 operands, fp32 accumulation and fp32 C, no bf16 rounding of dw).
// db += column sums of dout (cuBLASLt's BGRADB epilogue, which would take them in the dw GEMM,
// runs as a separate kernel on the H200 and was slower than this: docs/PERF.md): pass 1 gives
// each (256-row chunk, 32-column tile) block one fp32
// partial sum per column, reading dout once, coalesced along the columns (when the columns are
// whole 16-byte packs, a pack per thread and 32 packs per tile); pass 2 adds a column's
// partials in a fixed order (add_column_partials, common.cuh). The order of every addition is
// fixed by the shape alone, so db is bitwise reproducible (no atomics). Traffic: N*OC*sizeof(T)
// read, chunks*OC*4 bytes written and read back.
// FLOPs: 2*N*IC*OC forward, twice that backward.
//
// linear_gelu_forward: the same GEMM with cuBLASLt's GELU_AUX_BIAS epilogue, which writes the
// pre-activation (pre = inp @ w^T + b, kept for backward) and gelu(pre) from the accumulator in
// one pass. Which GELU: NVIDIA's cuBLAS documentation of cublasLtEpilogue_t (and cublasLt.h)
// says only "apply GELU point-wise transform to the results (x := GELU(x))" and gives no
// formula; we found no statement in it that the epilogue is the tanh approximation. GPT-2
// needs the tanh form, so tests/nn/test_fused_layers.cpp compares the epilogue's output with
// the CPU's tanh GELU of the same pre values at a tolerance (2e-5 absolute in fp32) 20x below
// the largest tanh-vs-erf difference (4.7e-4 at |x| = 2.7), on inputs that cover that range,
// and tests/core/test_cuda_gemm.cpp prints the distance to both forms. Should the epilogue
// turn out to be the erf form on some cuBLAS version, those tests fail rather than the model
// training with the wrong activation.
// Saved against linear_forward + gelu_forward: the GELU kernel's read of pre and its write of
// out (2 * N * OC elements of traffic, one launch); the GEMM's extra write of out remains.
// Fallback (b undefined, or OC % 8 != 0, cuBLASLt's rule for the aux output): the two calls.
//
// linear_gelu_backward: the input-gradient GEMM of the layer after the GELU with cuBLASLt's
// DGELU epilogue, which multiplies the fp32 accumulator by gelu'(pre) (pre read as its aux
// input) before the one rounding to the output dtype. Saved against linear_backward +
// gelu_backward: the GELU kernel (reads d act and pre, writes dpre: 0.93 ms of a GPT-2 step)
// and d act's buffer. The derivative is cuBLASLt's (tanh GELU, as its forward;
// tests/nn/test_cuda_linear.cpp holds it to the CPU's formula). Fallback (IC % 8 != 0, or no
// algorithm): the GEMM, then gelu_backward in place.
#include <algorithm>

#include "core/cuda/gemm.h"
#include "nn/checks.h"
#include "nn/cuda/common.cuh"
#include "nn/cuda/cuda_layers.h"

namespace ft::nn::cuda {
namespace {

constexpr int kTileCols = 32;  // threads along the columns (one warp: coalesced rows)
constexpr int kRowLanes = 16;  // threads along the rows of a chunk
constexpr int64_t kMinChunkRows = 256;
constexpr int64_t kMaxChunks = 65535;  // gridDim.y limit

template <class T>
__global__ void column_partial_sums_kernel(float* partial, const T* dout, int64_t rows,
                                           int64_t cols, int64_t chunk_rows) {
  __shared__ float lane_sums[kRowLanes][kTileCols + 1];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kTileCols + threadIdx.x;
  const int64_t row_begin = static_cast<int64_t>(blockIdx.y) * chunk_rows;
  const int64_t row_end = std::min(rows, row_begin + chunk_rows);
  float sum = 0.0f;
  if (col < cols) {
    for (int64_t r = row_begin + threadIdx.y; r < row_end; r += kRowLanes) {
      sum += to_f32(dout[r * cols + col]);
    }
  }
  lane_sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float total = 0.0f;
    for (int y = 0; y < kRowLanes; ++y) total += lane_sums[y][threadIdx.x];
    partial[static_cast<int64_t>(blockIdx.y) * cols + col] = total;
  }
}

// As column_partial_sums_kernel with a 16-byte pack (W columns) per thread: a warp reads 512
// contiguous bytes of a row per load instead of 32 two-byte elements.
template <class T, int W>
__global__ void column_partial_sums_packed_kernel(float* partial, const T* dout, int64_t rows,
                                                  int64_t cols, int64_t chunk_rows) {
  __shared__ float lane_sums[kRowLanes][kTileCols * W + 1];
  const int64_t col0 = (static_cast<int64_t>(blockIdx.x) * kTileCols + threadIdx.x) * W;
  const int64_t row_begin = static_cast<int64_t>(blockIdx.y) * chunk_rows;
  const int64_t row_end = std::min(rows, row_begin + chunk_rows);
  float sum[W] = {};
  if (col0 < cols) {
#pragma unroll 4
    for (int64_t r = row_begin + threadIdx.y; r < row_end; r += kRowLanes) {
      const Pack<T, W> p = load_pack<T, W>(dout + r * cols + col0);
#pragma unroll
      for (int k = 0; k < W; ++k) sum[k] += to_f32(p.v[k]);
    }
  }
#pragma unroll
  for (int k = 0; k < W; ++k) lane_sums[threadIdx.y][threadIdx.x * W + k] = sum[k];
  __syncthreads();
  // The block's row lanes added in order, one column per thread.
  const int flat = threadIdx.y * kTileCols + threadIdx.x;
  for (int c = flat; c < kTileCols * W; c += kTileCols * kRowLanes) {
    const int64_t col = static_cast<int64_t>(blockIdx.x) * kTileCols * W + c;
    if (col >= cols) continue;
    float total = 0.0f;
    for (int y = 0; y < kRowLanes; ++y) total += lane_sums[y][c];
    partial[static_cast<int64_t>(blockIdx.y) * cols + col] = total;
  }
}

template <class T>
void bias_grad(float* db, const T* dout, int64_t rows, int64_t cols, bool overwrite) {
  if (rows == 0 || cols == 0) return;
  const int64_t chunk_rows = std::max(kMinChunkRows, ceil_div(rows, kMaxChunks));
  const int64_t chunks = ceil_div(rows, chunk_rows);
  Tensor partial = Tensor::empty({chunks, cols}, DType::f32, Device::cuda);
  const dim3 block(kTileCols, kRowLanes);
  if (can_use_packs<T>(cols, {dout})) {
    constexpr int W = kPackWidth<T>;
    const dim3 grid(static_cast<unsigned>(ceil_div(cols, kTileCols * W)),
                    static_cast<unsigned>(chunks));
    column_partial_sums_packed_kernel<T, W>
        <<<grid, block, 0, stream()>>>(partial.data<float>(), dout, rows, cols, chunk_rows);
  } else {
    const dim3 grid(static_cast<unsigned>(ceil_div(cols, kTileCols)),
                    static_cast<unsigned>(chunks));
    column_partial_sums_kernel<<<grid, block, 0, stream()>>>(partial.data<float>(), dout, rows,
                                                             cols, chunk_rows);
  }
  FT_CUDA_CHECK_LAUNCH();
  add_column_partials(db, partial.data<float>(), chunks, cols, overwrite);
}

// C[M, N] = op(A)[M, K] op(B)[K, N] of dense row-major tensors: each leading dimension is its
// matrix's stored row length (A is [K, M] when transposed, B [N, K]), at least 1 (cuBLASLt
// rejects ld 0 even when the dimension is empty).
ft::cuda::GemmArgs product(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                           const void* A, const void* B, void* C, DType ab_dtype, DType c_dtype) {
  auto ld = [](int64_t cols) { return std::max<int64_t>(cols, 1); };
  ft::cuda::GemmArgs g;
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.M = M;
  g.N = N;
  g.K = K;
  g.A = A;
  g.lda = ld(trans_a ? M : K);
  g.B = B;
  g.ldb = ld(trans_b ? K : N);
  g.C = C;
  g.ldc = ld(N);
  g.ab_dtype = ab_dtype;
  g.c_dtype = c_dtype;
  return g;
}

}  // namespace

void linear_forward(Tensor& out, const Tensor& inp, const Tensor& w, const Tensor& b) {
  dispatch_cuda_float(inp.dtype(), "linear_forward", [](auto) {});
  const int64_t IC = w.dim(1), OC = w.dim(0), N = detail::rows_of(inp);
  // out[N, OC] = inp[N, IC] @ w[OC, IC]^T
  ft::cuda::GemmArgs g =
      product(false, true, N, OC, IC, inp.raw(), w.raw(), out.raw(), inp.dtype(), inp.dtype());
  if (b.defined()) {
    g.epilogue = ft::cuda::Epilogue::bias;
    g.bias = b.raw();
  }
  ft::cuda::gemm(g);
}

void linear_gelu_forward(Tensor& pre, Tensor& out, const Tensor& inp, const Tensor& w,
                         const Tensor& b) {
  dispatch_cuda_float(inp.dtype(), "linear_gelu_forward", [](auto) {});
  const int64_t IC = w.dim(1), OC = w.dim(0), N = detail::rows_of(inp);
  if (!b.defined() || OC % 8 != 0 || IC == 0) {
    linear_forward(pre, inp, w, b);
    gelu_forward(out, pre);
    return;
  }
  ft::cuda::GemmArgs g =
      product(false, true, N, OC, IC, inp.raw(), w.raw(), out.raw(), inp.dtype(), inp.dtype());
  g.epilogue = ft::cuda::Epilogue::bias_gelu;
  g.bias = b.raw();
  g.pre_gelu = pre.raw();
  ft::cuda::gemm(g);
}

void linear_backward(Tensor& dinp, Tensor& dw, Tensor& db, const Tensor& dout, const Tensor& inp,
                     const Tensor& w, GradStore store) {
  const bool overwrite = store == GradStore::overwrite;
  const int64_t IC = w.dim(1), OC = w.dim(0), N = detail::rows_of(inp);
  dispatch_cuda_float(inp.dtype(), "linear_backward", [&](auto tag) {
    using T = decltype(tag);
    if (dinp.defined()) {  // dinp[N, IC] = dout[N, OC] @ w[OC, IC]
      ft::cuda::gemm(product(false, false, N, IC, OC, dout.raw(), w.raw(), dinp.raw(), inp.dtype(),
                             inp.dtype()));
    }
    // dw[OC, IC] += dout[N, OC]^T @ inp[N, IC], fp32 C; overwrite: beta = 0, C never read
    // (the same algorithm: cuBLASLt's heuristic does not see beta).
    if (dw.defined()) {
      ft::cuda::GemmArgs g =
          product(true, false, OC, IC, N, dout.raw(), inp.raw(), dw.raw(), inp.dtype(), DType::f32);
      g.beta = overwrite ? 0.0f : 1.0f;
      ft::cuda::gemm(g);
    }
    if (db.defined()) bias_grad(db.data<float>(), ptr<T>(dout), N, OC, overwrite);
  });
}

void linear_gelu_backward(Tensor& dpre, Tensor& dw, Tensor& db, const Tensor& dout,
                          const Tensor& act, const Tensor& w, const Tensor& pre, GradStore store) {
  const int64_t IC = w.dim(1), OC = w.dim(0), N = detail::rows_of(act);
  // dpre[N, IC] = (dout[N, OC] @ w[OC, IC]) * gelu'(pre)
  ft::cuda::GemmArgs g =
      product(false, false, N, IC, OC, dout.raw(), w.raw(), dpre.raw(), act.dtype(), act.dtype());
  g.epilogue = ft::cuda::Epilogue::gelu_grad;
  g.pre_gelu = const_cast<void*>(pre.raw());  // read only (gelu_grad)
  const bool fused = N > 0 && OC > 0 && IC > 0 && IC % 8 == 0 && ft::cuda::try_gemm(g);
  if (!fused) {  // the unfused twins: the product, then the GELU backward in place
    g.epilogue = ft::cuda::Epilogue::none;
    g.pre_gelu = nullptr;
    ft::cuda::gemm(g);
    gelu_backward(dpre, dpre, pre);
  }
  Tensor no_dinp;
  ft::nn::cuda::linear_backward(no_dinp, dw, db, dout, act, w, store);  // not nn:: (ADL)
}

}  // namespace ft::nn::cuda
