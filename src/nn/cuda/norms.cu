// LayerNorm and RMSNorm over the last dimension C on the GPU, fp32 accumulation.
//
// Forward: one warp per row (8 rows per 256-thread block), lanes stride the row in 16-byte
// packs. LayerNorm takes the mean, then the variance in a second pass over the row (no
// cancellation when |mean| >> std, as on the CPU; the second pass hits L1/L2), then writes out
// and saves mean/rstd. Traffic: x read once from DRAM, out written once.
// Backward, input gradient: one warp per row reduces sum(dnorm) and sum(dnorm * norm), dnorm =
// dout * w, then writes dx = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)).
// Backward, parameter gradients, deterministic without atomics: stage 1 gives each block a
// fixed chunk of rows and each thread one column, summing dout * norm and dout down the chunk
// (coalesced across the warp) into a partial per chunk; stage 2 adds the chunks' partials in
// order into dw/db. The chunking depends only on the number of rows.
// Parameter gradients are formed before dx is written, so dx may alias dout.
//
// The order of the fp32 row sums (row_slices below), the same on every path: a row of n packs
// is cut into 1 or 4 slices (rows of up to 128 or 512 packs; longer rows ceil(n / 128) slices)
// of equal length but the last; lane l sums its packs l, l + 32, ... of a slice, the
// lanes are added by warp_sum, then the slices' totals in slice order. A row of one slice (up to
// 1024 bf16 or 512 fp32 columns, GPT-2's) sums as a single warp striding the row always did.
//
// Rows held in registers (the fast path: rows of up to kMaxRowSlices slices of at most
// 32 * kMaxLanePacks packs of 16 bytes, i.e. 4096 bf16 or 2048 fp32 columns, every pointer
// 16-byte aligned): the same fp32 operations in the same order as the streaming kernels above,
// each rounded as written (square_add, norm_out, add_dnorm, norm_dx), so the same bits. Each
// slice of a row has its own warp (a row of 2048 bf16 columns: four warps, two 16-byte packs per
// lane, two rows per block); each lane loads its packs of the slice (pack lane + 32 k) all at
// once and keeps them, so that x (and a, b, dout) come from DRAM once with every load in flight
// together, and no pass re-reads the row. The warps of a row exchange their slices' totals
// through shared memory behind a named barrier per row (bar.sync 1 + row of the block, 32 *
// slices threads), so rows do not wait for each other. The backward also forms the parameter
// gradients in the same pass: each lane sums dout * norm and dout of its columns over the rows
// of its warp's row group (a fixed grid of at most kBackwardBlocks blocks, groups taking rows in
// turn), the block adds its groups in order through shared memory, and stage 2 below adds the
// blocks in order: deterministic, and x and dout are read once instead of twice (these sums
// differ from the streaming stage 1's order: dw and db agree to fp32 rounding, not bit for bit).
// Traffic of the fused backward per element: read dout, x (and dresidual), write dx: 3-4
// accesses instead of 5-6.
//
// Fused residual variants (one kernel each instead of two):
// add_norm_forward: the first pass over the row reads a and b, writes x_out = a + b (rounded to
// the compute dtype) and sums it; the statistics and output passes then re-read x_out, which
// the same lane just wrote (L1/L2, no DRAM). DRAM traffic per row element: read a, b; write
// x_out, h = 4 accesses instead of add (3) + norm (2) = 5, and one launch instead of two.
// norm_backward_add: the dx kernel reads the residual gradient and writes
// dresidual + round(dx) (the add with __fadd_rn, so no FMA contraction with the dx product:
// the same bits as the unfused norm backward + add). DRAM traffic per element: read dout, x,
// dresidual; write dresidual = 4 instead of dx kernel (3) + add (3) = 6, no dx temporary, one
// launch fewer. Parameter gradients are unchanged (same two-stage reduction).
#include <atomic>
#include <limits>
#include <type_traits>

#include "nn/cuda/common.cuh"
#include "nn/cuda/cuda_layers.h"

namespace ft::nn::cuda {
namespace {

constexpr int kRowThreads = 256;  // 8 warps, one row each
constexpr int kRowsPerBlock = kRowThreads / 32;
constexpr int kMaxRowChunks = 128;  // stage-1 chunks for the parameter gradients
constexpr int kColThreads = 256;

// The per-element arithmetic of every kernel below, each operation rounded as written (no FMA
// contraction): a compiler free to contract decides per kernel and instantiation, and the
// streaming and register kernels, fused residual or not, must give the same bits.
__device__ __forceinline__ float square_add(float acc, float d) {
  return __fadd_rn(acc, __fmul_rn(d, d));
}
// (x - mean) * rstd * w
__device__ __forceinline__ float norm_out(float x, float mu, float rs, float w) {
  return __fmul_rn(__fmul_rn(__fsub_rn(x, mu), rs), w);
}
// The row sums of dnorm = dout * w and of dnorm * norm.
__device__ __forceinline__ void add_dnorm(float& dnorm_sum, float& dnorm_norm_sum, float d, float w,
                                          float x, float mu, float rs) {
  const float dnorm = __fmul_rn(d, w);
  dnorm_sum = __fadd_rn(dnorm_sum, dnorm);
  dnorm_norm_sum = __fadd_rn(dnorm_norm_sum, __fmul_rn(__fmul_rn(dnorm, __fsub_rn(x, mu)), rs));
}
// dx = (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) * rstd
__device__ __forceinline__ float norm_dx(float d, float w, float x, float mu, float rs,
                                         float dnorm_mean, float dnorm_norm_mean) {
  const float norm = __fmul_rn(__fsub_rn(x, mu), rs);
  const float dnorm = __fmul_rn(d, w);
  return __fmul_rn(__fsub_rn(__fsub_rn(dnorm, dnorm_mean), __fmul_rn(norm, dnorm_norm_mean)), rs);
}

// Packs of a row slice per lane on the register path: a warp holds 32 * kMaxLanePacks packs
// (1024 bf16 or 512 fp32 columns). Eight packs per lane (2048 bf16 columns in one warp) took
// 242-255 registers in the backward, one block per multiprocessor, and made llama3-1b's norms
// slower (4.12 -> 4.57 ms a step, docs/PERF.md); longer rows are split over warps instead.
constexpr int kMaxLanePacks = 4;
constexpr int kMaxRowSlices = 4;  // warps per row on the register path: 4096 bf16, 2048 fp32
constexpr int kBlockWarps = kRowThreads / 32;

// The order of every row sum, on both paths: the row's n packs are cut into `count` slices of
// `len` packs (the last may be shorter); within a slice lane l sums packs l, l + 32, ... in
// turn, the lanes are added by warp_sum, and the slices' totals are added in slice order. The
// register path gives each slice its own warp; the streaming kernels walk the slices in turn.
// Rows of up to 128 packs are one slice (the order of a single warp striding the row).
struct RowSlices {
  int count;
  int len;
};
__host__ __device__ __forceinline__ RowSlices row_slices(int n_packs) {
  constexpr int kWarpPacks = 32 * kMaxLanePacks;
  int count = n_packs <= kWarpPacks ? 1 : (n_packs + kWarpPacks - 1) / kWarpPacks;
  // Rows of 129-512 packs take four slices (2048 bf16 columns: 2 packs a lane, not 4): the
  // backward of 4 packs a lane takes 159-177 registers (one 256-thread block per multiprocessor),
  // of 2 packs 102-126 (two blocks, twice the rows in flight).
  if (count > 1 && count <= kMaxRowSlices) count = kMaxRowSlices;
  return {count, (n_packs + count - 1) / count};
}

// The streaming kernels' row sums in the order above: add_pack(p, part) adds pack p into this
// lane's N partial sums; every lane gets the N row totals.
template <int N, class F>
__device__ __forceinline__ void sliced_row_sums(float (&total)[N], int n_packs, int lane,
                                                F&& add_pack) {
  const RowSlices sl = row_slices(n_packs);
  for (int s = 0; s < sl.count; ++s) {
    float part[N] = {};
    const int end = min((s + 1) * sl.len, n_packs);
    for (int p = s * sl.len + lane; p < end; p += 32) add_pack(p, part);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float t = warp_sum(part[j]);
      total[j] = s == 0 ? t : total[j] + t;
    }
  }
}

// The register kernels' step of the same order: v holds this warp's slice totals (warp_sum
// done); the row's n_slices warps (consecutive, starting at a multiple of n_slices) exchange
// them through slots[j][warp] and each gets the row totals, added in slice order. A named
// barrier per row (id 1 + the row's group in the block) syncs only that row's warps, so a row
// past the end may return without the others waiting for it.
template <int N>
__device__ __forceinline__ void add_row_slices(float (&v)[N], float (&slots)[N][kBlockWarps],
                                               int warp, int n_slices) {
  if (n_slices == 1) return;
  const int first = warp - warp % n_slices;
  if (threadIdx.x % 32 == 0) {
#pragma unroll
    for (int j = 0; j < N; ++j) slots[j][warp] = v[j];
  }
  asm volatile("bar.sync %0, %1;" ::"r"(1 + first / n_slices), "r"(32 * n_slices) : "memory");
#pragma unroll
  for (int j = 0; j < N; ++j) {
    float total = slots[j][first];
    for (int s = 1; s < n_slices; ++s) total += slots[j][first + s];
    v[j] = total;
  }
}

// mean == nullptr: RMSNorm (no centring); bias == nullptr: no bias. res_a != nullptr: the
// fused residual variant, x_out = res_a + res_b is written first and x must equal x_out.
template <class T, int W>
__global__ void norm_forward_kernel(T* out, float* mean, float* rstd, const T* x, T* x_out,
                                    const T* res_a, const T* res_b, const T* w, const T* bias,
                                    int64_t rows, int C, float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const T* xr = x + row * C;
  const int n_packs = C / W;
  float sum[1] = {};
  if (res_a != nullptr) {
    // The later passes read x_out (= x) back in another lane mapping where a slice does not
    // start at a multiple of 32 packs: the __syncwarp below orders those reads after the writes.
    sliced_row_sums(sum, n_packs, lane, [&](int p, float(&part)[1]) {
      const Pack<T, W> ap = load_pack<T, W>(res_a + row * C + p * W);
      const Pack<T, W> bp = load_pack<T, W>(res_b + row * C + p * W);
      Pack<T, W> sp;
#pragma unroll
      for (int k = 0; k < W; ++k) {
        sp.v[k] = from_f32<T>(to_f32(ap.v[k]) + to_f32(bp.v[k]));
        part[0] += to_f32(sp.v[k]);
      }
      store_pack<T, W>(x_out + row * C + p * W, sp);
    });
    __syncwarp();
  } else if (mean != nullptr) {
    sliced_row_sums(sum, n_packs, lane, [&](int p, float(&part)[1]) {
      const Pack<T, W> xp = load_pack<T, W>(xr + p * W);
#pragma unroll
      for (int k = 0; k < W; ++k) part[0] += to_f32(xp.v[k]);
    });
  }
  const float mu = mean != nullptr ? sum[0] / static_cast<float>(C) : 0.0f;
  float sq[1] = {};
  sliced_row_sums(sq, n_packs, lane, [&](int p, float(&part)[1]) {
    const Pack<T, W> xp = load_pack<T, W>(xr + p * W);
#pragma unroll
    for (int k = 0; k < W; ++k) part[0] = square_add(part[0], to_f32(xp.v[k]) - mu);
  });
  const float rs = 1.0f / sqrtf(sq[0] / static_cast<float>(C) + eps);
  T* o = out + row * C;
  for (int p = lane; p < n_packs; p += 32) {
    const Pack<T, W> xp = load_pack<T, W>(xr + p * W);
    const Pack<T, W> wp = load_pack<T, W>(w + p * W);
    Pack<T, W> bp{};
    if (bias != nullptr) bp = load_pack<T, W>(bias + p * W);
    Pack<T, W> op;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float y = norm_out(to_f32(xp.v[k]), mu, rs, to_f32(wp.v[k]));
      op.v[k] = from_f32<T>(bias != nullptr ? __fadd_rn(y, to_f32(bp.v[k])) : y);
    }
    store_pack<T, W>(o + p * W, op);
  }
  if (lane == 0) {
    if (mean != nullptr) mean[row] = mu;
    rstd[row] = rs;
  }
}

// Accumulate: dx is the residual gradient and receives dx + round(the norm's dx).
template <class T, int W, bool Accumulate>
__global__ void norm_dx_kernel(T* dx, const T* dout, const T* x, const T* w, const float* mean,
                               const float* rstd, int64_t rows, int C) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const T* xr = x + row * C;
  const T* dr = dout + row * C;
  const float mu = mean != nullptr ? mean[row] : 0.0f, rs = rstd[row];
  const int n_packs = C / W;
  // sums[0]: dnorm, sums[1]: dnorm * norm.
  float sums[2] = {};
  sliced_row_sums(sums, n_packs, lane, [&](int p, float(&part)[2]) {
    const Pack<T, W> xp = load_pack<T, W>(xr + p * W);
    const Pack<T, W> dp = load_pack<T, W>(dr + p * W);
    const Pack<T, W> wp = load_pack<T, W>(w + p * W);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      add_dnorm(part[0], part[1], to_f32(dp.v[k]), to_f32(wp.v[k]), to_f32(xp.v[k]), mu, rs);
    }
  });
  // Both sums are complete in every lane before any lane writes: dx may alias dout.
  const float dnorm_mean = mean != nullptr ? sums[0] / static_cast<float>(C) : 0.0f;
  const float dnorm_norm_mean = sums[1] / static_cast<float>(C);
  T* o = dx + row * C;
  for (int p = lane; p < n_packs; p += 32) {
    const Pack<T, W> xp = load_pack<T, W>(xr + p * W);
    const Pack<T, W> dp = load_pack<T, W>(dr + p * W);
    const Pack<T, W> wp = load_pack<T, W>(w + p * W);
    Pack<T, W> op;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      op.v[k] = from_f32<T>(norm_dx(to_f32(dp.v[k]), to_f32(wp.v[k]), to_f32(xp.v[k]), mu, rs,
                                    dnorm_mean, dnorm_norm_mean));
    }
    if constexpr (Accumulate) {
      const Pack<T, W> rp = load_pack<T, W>(o + p * W);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        op.v[k] = from_f32<T>(__fadd_rn(to_f32(rp.v[k]), to_f32(op.v[k])));
      }
    }
    store_pack<T, W>(o + p * W, op);
  }
}

// Stage 1: block (column block, chunk) sums rows [chunk * rows_per_chunk, ...) for its columns.
// partial: [2, n_chunks, C] (dw part, then db part).
template <class T>
__global__ void norm_param_partial_kernel(float* partial, const T* dout, const T* x,
                                          const float* mean, const float* rstd, int64_t rows,
                                          int64_t rows_per_chunk, int C, int n_chunks) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int chunk = blockIdx.y;
  if (c >= C) return;
  const int64_t begin = chunk * rows_per_chunk;
  const int64_t end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;
  float dw = 0.0f, db = 0.0f;
  for (int64_t r = begin; r < end; ++r) {
    const float d = to_f32(dout[r * C + c]);
    const float mu = mean != nullptr ? mean[r] : 0.0f;
    dw += d * (to_f32(x[r * C + c]) - mu) * rstd[r];
    db += d;
  }
  partial[static_cast<int64_t>(chunk) * C + c] = dw;
  partial[static_cast<int64_t>(n_chunks + chunk) * C + c] = db;
}

// Stage 2: dw[c] += the sum over chunks of the dw partials, db[c] the same with the db part
// (add_column_partials in common.cuh: a fixed order), both in one launch; = with overwrite.
void finish_param_grads(float* dw, float* db, const float* partial, int C, int n_chunks,
                        bool overwrite) {
  add_column_partials(dw, partial, n_chunks, C, overwrite, db,
                      partial + static_cast<int64_t>(n_chunks) * C);
}

// ---- rows held in registers ----

constexpr int kBackwardBlocks = 256;  // fixed (a function of the row count only): deterministic

// Lane `lane`'s packs of a row slice (pack lane + 32 k of the slice for k < K; those past the
// slice's n_packs are not loaded).
template <class T, int W, int K>
struct LanePacks {
  Pack<T, W> v[K];

  __device__ __forceinline__ void load(const T* slice, int n_packs, int lane) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (lane + 32 * k < n_packs) v[k] = load_pack<T, W>(slice + (lane + 32 * k) * W);
    }
  }
};

// Where a warp of a register kernel works: the `slices` warps of a row are consecutive in the
// block (row group `group` of `groups`); this warp holds slice `slice`, `len` packs from column
// `col0`.
struct SliceOfRow {
  int slices, groups, group, slice, col0, len;
};
__device__ __forceinline__ SliceOfRow slice_of_row(int n_packs, int W) {
  const RowSlices sl = row_slices(n_packs);
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int slice = warp % sl.count;
  return {sl.count, kBlockWarps / sl.count, warp / sl.count,
          slice,    slice * sl.len * W,     min(sl.len, n_packs - slice * sl.len)};
}

// As norm_forward_kernel, on the packs of the warp's slice of the row, in registers.
template <class T, int W, int K>
__global__ void __launch_bounds__(kRowThreads)
    norm_forward_rows_kernel(T* out, float* mean, float* rstd, const T* x, T* x_out, const T* res_a,
                             const T* res_b, const T* w, const T* bias, int64_t rows, int C,
                             float eps) {
  __shared__ float slots[2][1][kBlockWarps];  // [sum, sum of squares][1][warp]
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const SliceOfRow s = slice_of_row(C / W, W);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * s.groups + s.group;
  if (row >= rows) return;  // the row's other warps too
  const int64_t at = row * C + s.col0;
  auto live = [&](int k) { return lane + 32 * k < s.len; };
  LanePacks<T, W, K> xr;
  float sum[1] = {};
  if (res_a != nullptr) {
    LanePacks<T, W, K> a, b;
    a.load(res_a + at, s.len, lane);
    b.load(res_b + at, s.len, lane);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (!live(k)) continue;
#pragma unroll
      for (int i = 0; i < W; ++i) {
        xr.v[k].v[i] = from_f32<T>(to_f32(a.v[k].v[i]) + to_f32(b.v[k].v[i]));
        sum[0] += to_f32(xr.v[k].v[i]);
      }
      store_pack<T, W>(x_out + at + (lane + 32 * k) * W, xr.v[k]);
    }
  } else {
    xr.load(x + at, s.len, lane);
    if (mean != nullptr) {
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (!live(k)) continue;
#pragma unroll
        for (int i = 0; i < W; ++i) sum[0] += to_f32(xr.v[k].v[i]);
      }
    }
  }
  float mu = 0.0f;
  if (mean != nullptr) {
    sum[0] = warp_sum(sum[0]);
    add_row_slices(sum, slots[0], warp, s.slices);
    mu = sum[0] / static_cast<float>(C);
  }
  float sq[1] = {};
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (!live(k)) continue;
#pragma unroll
    for (int i = 0; i < W; ++i) {
      sq[0] = square_add(sq[0], to_f32(xr.v[k].v[i]) - mu);
    }
  }
  sq[0] = warp_sum(sq[0]);
  add_row_slices(sq, slots[1], warp, s.slices);
  const float rs = 1.0f / sqrtf(sq[0] / static_cast<float>(C) + eps);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (!live(k)) continue;
    const int col = s.col0 + (lane + 32 * k) * W;
    const Pack<T, W> wp = load_pack<T, W>(w + col);
    Pack<T, W> bp{};
    if (bias != nullptr) bp = load_pack<T, W>(bias + col);
    Pack<T, W> op;
#pragma unroll
    for (int i = 0; i < W; ++i) {
      const float y = norm_out(to_f32(xr.v[k].v[i]), mu, rs, to_f32(wp.v[i]));
      op.v[i] = from_f32<T>(bias != nullptr ? __fadd_rn(y, to_f32(bp.v[i])) : y);
    }
    store_pack<T, W>(out + row * C + col, op);
  }
  if (lane == 0 && s.slice == 0) {
    if (mean != nullptr) mean[row] = mu;
    rstd[row] = rs;
  }
}

// dx as norm_dx_kernel (Accumulate: dx is the residual gradient), and, when partial is given,
// this block's sums of dout * norm and dout per column into partial [2, gridDim.x, C] (dw part,
// then db part when WithDb). Each warp sums the columns of its slice over its group's rows; the
// block adds its groups in order. Dynamic shared memory: groups * C floats.
template <class T, int W, int K, bool Accumulate, bool WithDb>
__global__ void __launch_bounds__(kRowThreads)
    norm_backward_rows_kernel(T* dx, float* partial, const T* dout, const T* x, const T* w,
                              const float* mean, const float* rstd, int64_t rows, int C) {
  extern __shared__ float group_sums[];  // [groups, C]
  // [row parity][dnorm, dnorm * norm][warp]: a row's warp may start the next row (the other
  // parity's slots) while the others still read this row's.
  __shared__ float slots[2][2][kBlockWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const SliceOfRow s = slice_of_row(C / W, W);
  auto live = [&](int k) { return lane + 32 * k < s.len; };
  float dw_acc[K][W] = {}, db_acc[WithDb ? K : 1][W] = {};
  LanePacks<T, W, K> wr;  // the weight's packs of this slice: the same for every row
  wr.load(w + s.col0, s.len, lane);
  int parity = 0;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * s.groups + s.group; row < rows;
       row += static_cast<int64_t>(gridDim.x) * s.groups, parity ^= 1) {
    const int64_t at = row * C + s.col0;
    // Every load of the row is issued here, the residual gradient's too, so that a row waits on
    // memory once, not again after its reduction.
    LanePacks<T, W, K> xr, dr, rr;
    xr.load(x + at, s.len, lane);
    dr.load(dout + at, s.len, lane);
    if constexpr (Accumulate) rr.load(dx + at, s.len, lane);
    const float mu = mean != nullptr ? mean[row] : 0.0f, rs = rstd[row];
    float sums[2] = {};  // dnorm, dnorm * norm
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (!live(k)) continue;
#pragma unroll
      for (int i = 0; i < W; ++i) {
        add_dnorm(sums[0], sums[1], to_f32(dr.v[k].v[i]), to_f32(wr.v[k].v[i]),
                  to_f32(xr.v[k].v[i]), mu, rs);
      }
    }
    sums[0] = warp_sum(sums[0]);
    sums[1] = warp_sum(sums[1]);
    // dx may alias dout: a warp writes only the columns it has read.
    add_row_slices(sums, slots[parity], warp, s.slices);
    const float dnorm_mean = mean != nullptr ? sums[0] / static_cast<float>(C) : 0.0f;
    const float dnorm_norm_mean = sums[1] / static_cast<float>(C);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (!live(k)) continue;
      const int col = (lane + 32 * k) * W;
      Pack<T, W> op;
#pragma unroll
      for (int i = 0; i < W; ++i) {
        const float d = to_f32(dr.v[k].v[i]);
        op.v[i] = from_f32<T>(norm_dx(d, to_f32(wr.v[k].v[i]), to_f32(xr.v[k].v[i]), mu, rs,
                                      dnorm_mean, dnorm_norm_mean));
        // Rounded as written, so that every instantiation (fused or not) sums the same bits.
        dw_acc[k][i] = __fadd_rn(dw_acc[k][i],
                                 __fmul_rn(__fmul_rn(d, __fsub_rn(to_f32(xr.v[k].v[i]), mu)), rs));
        if constexpr (WithDb) db_acc[k][i] = __fadd_rn(db_acc[k][i], d);
      }
      if constexpr (Accumulate) {
#pragma unroll
        for (int i = 0; i < W; ++i) {
          op.v[i] = from_f32<T>(__fadd_rn(to_f32(rr.v[k].v[i]), to_f32(op.v[i])));
        }
      }
      store_pack<T, W>(dx + at + col, op);
    }
  }
  if (partial == nullptr) return;  // the same for the whole block
  for (int part = 0; part < (WithDb ? 2 : 1); ++part) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (!live(k)) continue;
#pragma unroll
      for (int i = 0; i < W; ++i) {
        group_sums[s.group * C + s.col0 + (lane + 32 * k) * W + i] =
            part == 0 || !WithDb ? dw_acc[k][i] : db_acc[WithDb ? k : 0][i];
      }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      float total = 0.0f;
      for (int g = 0; g < s.groups; ++g) total += group_sums[g * C + c];
      partial[(static_cast<int64_t>(part) * gridDim.x + blockIdx.x) * C + c] = total;
    }
    __syncthreads();
  }
}

// Set by set_norm_rows_in_registers (tests, benchmarks): false sends every row to the streaming
// kernels.
std::atomic<bool> g_rows_in_registers{true};

// Packs per lane (1..kMaxLanePacks) for rows of C elements on the register path, or 0 when the
// row streams: not 16-byte packs, more than kMaxRowSlices slices, or the path switched off.
template <class T>
int lane_packs(int C, std::initializer_list<const void*> ptrs) {
  if (!g_rows_in_registers.load(std::memory_order_relaxed)) return 0;
  if (!can_use_packs<T>(C, ptrs)) return 0;
  const RowSlices sl = row_slices(C / kPackWidth<T>);
  if (sl.count > kMaxRowSlices) return 0;
  return static_cast<int>(ceil_div(sl.len, 32));
}

// Rows a block of a register kernel covers for rows of C elements of T (lane_packs() > 0).
template <class T>
int rows_per_block(int C) {
  return kBlockWarps / row_slices(C / kPackWidth<T>).count;
}

// Calls f(std::integral_constant<int, K>{}) for the lane_packs() value k (one of 1..4).
template <class F>
void with_lane_packs(int k, F&& f) {
  switch (k) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    default:
      return f(std::integral_constant<int, kMaxLanePacks>{});
  }
}

// The register backward's shared memory, groups * C floats, is at most one fp32 per column of
// kBlockWarps full warp slices (bf16: 8 columns a pack): under the 48 KB a launch gets without
// opting in.
static_assert(sizeof(float) * kBlockWarps * 32 * kMaxLanePacks * kPackWidth<bf16_t> <= 48 * 1024);

int64_t rows_of(const Tensor& x) {
  return x.dim(-1) == 0 ? 0 : x.numel() / x.dim(-1);
}

// res_a == nullptr: plain norm of x; else x_out = res_a + res_b first and x = x_out.
template <class T>
void launch_norm_forward(T* out, float* mean, float* rstd, const T* x, T* x_out, const T* res_a,
                         const T* res_b, const T* w, const T* bias, int64_t rows, int C,
                         double eps) {
  const auto blocks = static_cast<unsigned>(ceil_div(rows, kRowsPerBlock));
  const auto e = static_cast<float>(eps);
  if (const int k = lane_packs<T>(C, {out, x, x_out, res_a, res_b, w, bias}); k > 0) {
    const auto row_blocks = static_cast<unsigned>(ceil_div(rows, rows_per_block<T>(C)));
    with_lane_packs(k, [&](auto K) {
      norm_forward_rows_kernel<T, kPackWidth<T>, decltype(K)::value>
          <<<row_blocks, kRowThreads, 0, stream()>>>(out, mean, rstd, x, x_out, res_a, res_b, w,
                                                     bias, rows, C, e);
    });
  } else if (can_use_packs<T>(C, {out, x, x_out, res_a, res_b, w, bias})) {
    norm_forward_kernel<T, kPackWidth<T>><<<blocks, kRowThreads, 0, stream()>>>(
        out, mean, rstd, x, x_out, res_a, res_b, w, bias, rows, C, e);
  } else {
    norm_forward_kernel<T, 1><<<blocks, kRowThreads, 0, stream()>>>(
        out, mean, rstd, x, x_out, res_a, res_b, w, bias, rows, C, e);
  }
  FT_CUDA_CHECK_LAUNCH();
}

template <class T, bool Accumulate>
void launch_norm_dx(T* dx, const T* dout, const T* x, const T* w, const float* mu, const float* rs,
                    int64_t rows, int C) {
  const auto blocks = static_cast<unsigned>(ceil_div(rows, kRowsPerBlock));
  if (can_use_packs<T>(C, {dx, dout, x, w})) {
    norm_dx_kernel<T, kPackWidth<T>, Accumulate>
        <<<blocks, kRowThreads, 0, stream()>>>(dx, dout, x, w, mu, rs, rows, C);
  } else {
    norm_dx_kernel<T, 1, Accumulate>
        <<<blocks, kRowThreads, 0, stream()>>>(dx, dout, x, w, mu, rs, rows, C);
  }
  FT_CUDA_CHECK_LAUNCH();
}

// mean undefined: RMSNorm. db may be null (RMSNorm, or not wanted). accumulate: dx is the
// residual gradient (+=).
void norm_backward(Tensor& dx, Tensor& dw, Tensor* db, const Tensor& dout, const Tensor& x,
                   const Tensor& w, const Tensor& mean, const Tensor& rstd, bool accumulate,
                   GradStore store, const char* fn) {
  const bool overwrite = store == GradStore::overwrite;
  const int64_t rows = rows_of(x);
  const int C = static_cast<int>(x.dim(-1));
  if (rows == 0 || C == 0) return;
  dispatch_cuda_float(x.dtype(), fn, [&](auto tag) {
    using T = decltype(tag);
    const float* mu = ptr_or_null<float>(mean);
    const float* rs = ptr<float>(rstd);
    float* dw_p = ptr_or_null<float>(dw);
    float* db_p = db != nullptr ? ptr_or_null<float>(*db) : nullptr;
    T* dx_p = ptr_or_null<T>(dx);
    const int k =
        dx_p != nullptr ? lane_packs<T>(C, {dx_p, ptr<T>(dout), ptr<T>(x), ptr<T>(w)}) : 0;
    if (k > 0) {
      const bool params = dw_p != nullptr || db_p != nullptr;
      const int64_t groups = rows_per_block<T>(C);
      const auto blocks =
          static_cast<int>(std::min<int64_t>(ceil_div(rows, groups), kBackwardBlocks));
      Tensor partial;
      if (params) partial = Tensor::empty({2, blocks, C}, DType::f32, Device::cuda);
      const size_t smem = params ? sizeof(float) * static_cast<size_t>(groups) * C : 0;
      with_lane_packs(k, [&](auto K) {
        auto launch = [&](auto kernel) {
          kernel<<<blocks, kRowThreads, smem, stream()>>>(dx_p, ptr_or_null<float>(partial),
                                                          ptr<T>(dout), ptr<T>(x), ptr<T>(w), mu,
                                                          rs, rows, C);
          FT_CUDA_CHECK_LAUNCH();
        };
        constexpr int k_packs = decltype(K)::value, w_pack = kPackWidth<T>;
        if (accumulate) {
          db_p != nullptr ? launch(norm_backward_rows_kernel<T, w_pack, k_packs, true, true>)
                          : launch(norm_backward_rows_kernel<T, w_pack, k_packs, true, false>);
        } else {
          db_p != nullptr ? launch(norm_backward_rows_kernel<T, w_pack, k_packs, false, true>)
                          : launch(norm_backward_rows_kernel<T, w_pack, k_packs, false, false>);
        }
      });
      if (params) {
        finish_param_grads(dw_p, db_p, ptr<float>(partial), C, blocks, overwrite);
      }
      return;
    }
    if (dw_p != nullptr || db_p != nullptr) {
      const int n_chunks = static_cast<int>(std::min<int64_t>(rows, kMaxRowChunks));
      const int64_t rows_per_chunk = ceil_div(rows, n_chunks);
      Tensor partial = Tensor::empty({2, n_chunks, C}, DType::f32, Device::cuda);
      const dim3 grid(static_cast<unsigned>(ceil_div(C, kColThreads)),
                      static_cast<unsigned>(n_chunks));
      norm_param_partial_kernel<T><<<grid, kColThreads, 0, stream()>>>(
          ptr<float>(partial), ptr<T>(dout), ptr<T>(x), mu, rs, rows, rows_per_chunk, C, n_chunks);
      FT_CUDA_CHECK_LAUNCH();
      finish_param_grads(dw_p, db_p, ptr<float>(partial), C, n_chunks, overwrite);
    }
    if (dx.defined()) {
      if (accumulate) {
        launch_norm_dx<T, true>(ptr<T>(dx), ptr<T>(dout), ptr<T>(x), ptr<T>(w), mu, rs, rows, C);
      } else {
        launch_norm_dx<T, false>(ptr<T>(dx), ptr<T>(dout), ptr<T>(x), ptr<T>(w), mu, rs, rows, C);
      }
    }
  });
}

}  // namespace

void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& w,
                       const Tensor& b, double eps) {
  const int64_t rows = rows_of(x);
  if (rows == 0) return;
  dispatch_cuda_float(x.dtype(), "layernorm_forward", [&](auto tag) {
    using T = decltype(tag);
    launch_norm_forward<T>(ptr<T>(out), ptr<float>(mean), ptr<float>(rstd), ptr<T>(x), nullptr,
                           nullptr, nullptr, ptr<T>(w), ptr_or_null<T>(b), rows,
                           static_cast<int>(x.dim(-1)), eps);
  });
}

void layernorm_backward(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dout, const Tensor& x,
                        const Tensor& w, const Tensor& mean, const Tensor& rstd, GradStore store) {
  norm_backward(dx, dw, &db, dout, x, w, mean, rstd, false, store, "layernorm_backward");
}

void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& x, const Tensor& w, double eps) {
  const int64_t rows = rows_of(x);
  if (rows == 0) return;
  dispatch_cuda_float(x.dtype(), "rmsnorm_forward", [&](auto tag) {
    using T = decltype(tag);
    launch_norm_forward<T>(ptr<T>(out), nullptr, ptr<float>(rstd), ptr<T>(x), nullptr, nullptr,
                           nullptr, ptr<T>(w), nullptr, rows, static_cast<int>(x.dim(-1)), eps);
  });
}

void rmsnorm_backward(Tensor& dx, Tensor& dw, const Tensor& dout, const Tensor& x, const Tensor& w,
                      const Tensor& rstd, GradStore store) {
  norm_backward(dx, dw, nullptr, dout, x, w, Tensor(), rstd, false, store, "rmsnorm_backward");
}

void add_norm_forward(Tensor& x_out, Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& a,
                      const Tensor& b, const Tensor& w, const Tensor& bias, double eps) {
  const int64_t rows = rows_of(a);
  if (rows == 0) return;
  dispatch_cuda_float(a.dtype(), "add_norm_forward", [&](auto tag) {
    using T = decltype(tag);
    T* xo = ptr<T>(x_out);
    launch_norm_forward<T>(ptr<T>(out), ptr_or_null<float>(mean), ptr<float>(rstd), xo, xo,
                           ptr<T>(a), ptr<T>(b), ptr<T>(w), ptr_or_null<T>(bias), rows,
                           static_cast<int>(a.dim(-1)), eps);
  });
}

void norm_backward_add(Tensor& dresidual, Tensor& dw, Tensor& db, const Tensor& dout,
                       const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                       GradStore store) {
  norm_backward(dresidual, dw, &db, dout, x, w, mean, rstd, true, store, "norm_backward_add");
}

bool set_norm_rows_in_registers(bool enabled) {
  return g_rows_in_registers.exchange(enabled);
}

int norm_register_row_warps(DType dtype, int64_t C) {
  if (C <= 0 || C > std::numeric_limits<int>::max()) return 0;
  const int c = static_cast<int>(C);
  int warps = 0;
  dispatch_cuda_float(dtype, "norm_register_row_warps", [&](auto tag) {
    using T = decltype(tag);
    if (lane_packs<T>(c, {}) > 0) warps = row_slices(c / kPackWidth<T>).count;
  });
  return warps;
}

}  // namespace ft::nn::cuda
