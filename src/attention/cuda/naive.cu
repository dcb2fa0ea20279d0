// naive attention on the GPU: the baseline "Matmul + Mask + Softmax + Matmul" that a training
// framework runs without fused attention, with its backward. It materialises the S x S
// probabilities P of every (batch, query head) and keeps them for backward (ForwardOutput::saved).
//
// Launches: per batch row b and position j inside the kv groups (G = Hq / Hkv; query head h reads
// kv head h / G), one strided-batched GEMM covers the query heads j, G + j, 2G + j, ... against
// their kv heads 0, 1, 2, ... (B * G launches of Hkv products each). q, k, v and do are read in
// place through the leading dimensions (a head's rows are H * D apart); o, dq, dk and dv are
// written head-major [B, H, S, D] (batches of a GEMM's C may not interleave) and moved to
// [B, S, H, D] by one copy kernel at the end.
//
// Forward: S = Q K^T (fp32, written into P); masked_softmax_rows() scales, masks (causal, window,
// segment ids) and normalises each row in place and writes lse; O = P V.
// Backward: dP = dO V^T (fp32); softmax_backward_rows() gives dS = scale * P * (dP - rowsum(P dP));
// dV (+)= P^T dO, dQ = dS K, dK (+)= dS^T Q. dK and dV sum over the G query heads of a kv group by
// running the G launches in order with beta = 1 (deterministic, no atomics); bf16 with G > 1 sums
// in fp32 and rounds once.
//
// Precision: scores, P, lse and dP are fp32 for both dtypes. bf16 GEMMs take bf16 operands, so
// the row kernels also write a bf16 copy of the launch's P (and dS in bf16) for them; the saved
// P stays fp32 so that the softmax backward works on unrounded probabilities (bf16 P there would
// add a second rounding to dS: dq/dk errors ~1.7-3x the CPU naive's instead of ~1.4x). fp32
// runs true fp32 GEMMs (no TF32 unless ft::cuda::allow_tf32(true)).
//
// Memory: saved P is B * Hq * S * S fp32 (4 bytes per element, both dtypes). Scratch per launch,
// Hkv * S * S elements: the bf16 copy of P (bf16 only) forward; fp32 dP (dS in place for fp32;
// + bf16 dS and P copies for bf16) backward; plus head-major o/dq/dk/dv (fp32 dK/dV for bf16
// GQA). Traffic per S x S element, forward: the QK^T GEMM writes 4 B, the softmax reads them
// (twice, the second time mostly from L1/L2) and writes 4 B (+2 B copy), P V reads 4 B (2 B);
// backward: dP written 4 B and read, P read 4 B, dS written (and the copy of P for bf16), and
// three GEMMs read P or dS.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "attention/cuda/cuda_kernels.h"
#include "core/cuda/check.h"
#include "core/cuda/gemm.h"
#include "core/cuda/runtime.h"

namespace ft::attention::cuda {
namespace {

constexpr int kMaxRowThreads = 256;

// ---- device helpers ----

__device__ __forceinline__ float to_float(float x) {
  return x;
}
__device__ __forceinline__ float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// A running softmax denominator: `sum` of exp(x - max) over the values seen so far.
struct MaxSum {
  float max, sum;
};

__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.max, b.max);
  if (m == -INFINITY) return {m, 0.0f};  // neither side saw a key (avoids exp(-inf + inf))
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

// Reductions over a block of a multiple of 32 threads (at most 1024); every thread gets the
// result. The order is fixed, so results are the same run after run.
__device__ MaxSum block_reduce(MaxSum v) {
  __shared__ MaxSum warp_results[32];
  for (int offset = 16; offset > 0; offset /= 2) {
    const MaxSum other{__shfl_xor_sync(0xffffffffu, v.max, offset),
                       __shfl_xor_sync(0xffffffffu, v.sum, offset)};
    v = combine(v, other);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) warp_results[warp] = v;
  __syncthreads();
  MaxSum total = warp_results[0];
  for (int w = 1; w < warps; ++w) total = combine(total, warp_results[w]);
  return total;
}

__device__ float block_sum(float v) {
  __shared__ float warp_results[32];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) warp_results[warp] = v;
  __syncthreads();
  float total = warp_results[0];
  for (int w = 1; w < warps; ++w) total += warp_results[w];
  return total;
}

// The keys query i may attend: [begin, end) from causal and window, then segment ids. Must agree
// with attention.h's allowed() (the tests compare every probability with the fp64 reference's).
struct RowKeys {
  int64_t begin, end;
  const int32_t* segments;  // this batch row's ids, or null
  int32_t query_segment;

  __device__ bool allowed(int64_t j) const {
    return j >= begin && j < end && (segments == nullptr || segments[j] == query_segment);
  }
};

__device__ RowKeys row_keys(int64_t i, int64_t seq_len, bool causal, int64_t window,
                            const int32_t* segments) {
  RowKeys r{0, seq_len, segments, 0};
  if (causal) r.end = i + 1;
  if (window > 0) r.begin = i - (window - 1) > 0 ? i - (window - 1) : 0;
  if (segments != nullptr) {
    r.query_segment = segments[i];
    if (r.query_segment < 0) r.end = r.begin;  // padding attends nothing
  }
  return r;
}

// ---- kernels ----

// One block per query row (blockIdx.x = i, blockIdx.y = head of the launch). Turns the fp32
// scores in `probs` into probabilities in place: scales and masks them, normalises the row
// (zeros where masked) and writes lse; with `copy`, also a bf16 copy of the row (the operand of
// the bf16 P V product). A row that sees no key gets P = 0 and lse = -inf. Each element is
// read and then written by the same thread, after the whole block has read the row once.
__global__ void masked_softmax_rows(float* probs, int64_t probs_head_stride, __nv_bfloat16* copy,
                                    int64_t copy_head_stride, float* lse, int64_t lse_head_stride,
                                    int64_t seq_len, float scale, bool causal, int64_t window,
                                    const int32_t* segments) {
  const int64_t i = blockIdx.x, head = blockIdx.y;
  float* row = probs + head * probs_head_stride + i * seq_len;
  const RowKeys keys = row_keys(i, seq_len, causal, window, segments);

  MaxSum acc{-INFINITY, 0.0f};
  for (int64_t j = keys.begin + threadIdx.x; j < keys.end; j += blockDim.x) {
    if (!keys.allowed(j)) continue;
    const float x = row[j] * scale;
    if (x > acc.max) {
      acc.sum = acc.sum * expf(acc.max - x) + 1.0f;
      acc.max = x;
    } else {
      acc.sum += expf(x - acc.max);
    }
  }
  const MaxSum total = block_reduce(acc);
  const bool empty = total.max == -INFINITY;
  const float inv_sum = empty ? 0.0f : 1.0f / total.sum;
  __nv_bfloat16* copy_row = copy ? copy + head * copy_head_stride + i * seq_len : nullptr;
  for (int64_t j = threadIdx.x; j < seq_len; j += blockDim.x) {
    const float p = keys.allowed(j) ? expf(row[j] * scale - total.max) * inv_sum : 0.0f;
    row[j] = p;
    if (copy_row) copy_row[j] = __float2bfloat16_rn(p);
  }
  if (threadIdx.x == 0)
    lse[head * lse_head_stride + i] = empty ? -INFINITY : total.max + logf(total.sum);
}

// Softmax backward of one row per block: dS = scale * P * (dP - sum_j P * dP), from the fp32
// P. Masked entries (P == 0) are written as exact zeros whatever dP holds. With `copy`, also
// writes a bf16 copy of P's row (the operand of the bf16 P^T dO product). `dprobs` may alias
// `dscores` (fp32).
template <class DS>
__global__ void softmax_backward_rows(const float* probs, int64_t probs_head_stride,
                                      const float* dprobs, int64_t dprobs_head_stride, DS* dscores,
                                      int64_t dscores_head_stride, __nv_bfloat16* copy,
                                      int64_t copy_head_stride, int64_t seq_len, float scale) {
  const int64_t i = blockIdx.x, head = blockIdx.y;
  const float* p_row = probs + head * probs_head_stride + i * seq_len;
  const float* dp_row = dprobs + head * dprobs_head_stride + i * seq_len;
  DS* ds_row = dscores + head * dscores_head_stride + i * seq_len;
  __nv_bfloat16* copy_row = copy ? copy + head * copy_head_stride + i * seq_len : nullptr;
  float dot = 0.0f;
  for (int64_t j = threadIdx.x; j < seq_len; j += blockDim.x) {
    const float p = p_row[j];
    if (p != 0.0f) dot += p * dp_row[j];
  }
  dot = block_sum(dot);
  for (int64_t j = threadIdx.x; j < seq_len; j += blockDim.x) {
    const float p = p_row[j];
    ds_row[j] = from_float<DS>(p == 0.0f ? 0.0f : scale * p * (dp_row[j] - dot));
    if (copy_row) copy_row[j] = __float2bfloat16_rn(p);
  }
}

// [B, H, S, D] (head-major, where the batched GEMMs write) -> [B, S, H, D] (the API's layout),
// converting fp32 sums to bf16 where Dst is bf16. Writes every element of dst.
template <class Src, class Dst>
__global__ void heads_to_rows(const Src* src, Dst* dst, int64_t heads, int64_t seq_len,
                              int64_t head_dim, int64_t n) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += step) {
    const int64_t d = idx % head_dim, h = (idx / head_dim) % heads;
    const int64_t s = (idx / (head_dim * heads)) % seq_len, b = idx / (head_dim * heads * seq_len);
    dst[idx] = from_float<Dst>(to_float(src[((b * heads + h) * seq_len + s) * head_dim + d]));
  }
}

// ---- host side ----

int row_threads(int64_t seq_len) {
  const int64_t warps = (seq_len + 31) / 32;
  return static_cast<int>(warps * 32 < kMaxRowThreads ? warps * 32 : kMaxRowThreads);
}

// An element offset into a tensor's storage, as a byte pointer for the GEMM arguments.
void* at(const Tensor& t, int64_t elements) {
  return static_cast<char*>(t.raw()) + elements * static_cast<int64_t>(dtype_size(t.dtype()));
}

// A GPU tensor whose every byte is 0xFF (NaN in fp32 and bf16): an element a kernel forgets
// to write fails every check instead of passing with stale memory.
Tensor poisoned(const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype, Device::cuda);
  FT_CUDA_CHECK(cudaMemsetAsync(t.raw(), 0xFF, t.nbytes(), ft::cuda::current_stream()));
  return t;
}

struct Operand {
  const void* data;
  int64_t ld, batch_stride;
};

void batched_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, Operand a, Operand b,
                  void* c, int64_t ldc, int64_t stride_c, DType ab_dtype, DType c_dtype, float beta,
                  int64_t count) {
  ft::cuda::GemmArgs g;
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.M = M;
  g.N = N;
  g.K = K;
  g.A = a.data;
  g.lda = a.ld;
  g.stride_a = a.batch_stride;
  g.B = b.data;
  g.ldb = b.ld;
  g.stride_b = b.batch_stride;
  g.C = c;
  g.ldc = ldc;
  g.stride_c = stride_c;
  g.ab_dtype = ab_dtype;
  g.c_dtype = c_dtype;
  g.beta = beta;
  g.batch_count = count;
  ft::cuda::gemm(g);
}

// One launch covers batch row b and the query heads j, G + j, 2G + j, ...: query head g * G + j
// of kv head g, for every kv head g (the strided batch). Offsets are in elements. Inputs are
// read in place in [B, S, H, D] (rows H * D apart); the GEMMs write o, dq, dk and dv head-major,
// [B, H, S, D], because ft::cuda::gemm rejects interleaved batches of C, and
// copy_heads_to_rows() moves them to the API's layout once at the end.
struct HeadBatch {
  int64_t q;         // of (b, 0, j, 0) in q, do
  int64_t kv;        // of (b, 0, 0, 0) in k, v
  int64_t q_heads;   // of (b, j, 0, 0) in the head-major o, dq
  int64_t kv_heads;  // of (b, 0, 0, 0) in the head-major dk, dv
  int64_t probs;     // of (b, j, 0, 0) in P
  int64_t lse;       // of (b, j, 0) in lse
};

struct Layout {
  int64_t S, D, Hq, Hkv, G;
  int64_t q_row() const { return Hq * D; }  // between sequence positions of one head
  int64_t kv_row() const { return Hkv * D; }
  int64_t q_head() const { return G * D; }  // between the launch's consecutive heads
  int64_t kv_head() const { return D; }
  int64_t q_head_major() const { return G * S * D; }
  int64_t kv_head_major() const { return S * D; }
  int64_t probs_head() const { return G * S * S; }
  int64_t lse_head() const { return G * S; }
  int64_t square() const { return S * S; }  // between heads of the per-launch scratch

  HeadBatch launch(int64_t b, int64_t j) const {
    return {(b * S * Hq + j) * D, b * S * Hkv * D,      (b * Hq + j) * S * D,
            b * Hkv * S * D,      (b * Hq + j) * S * S, (b * Hq + j) * S};
  }
};

Layout layout_of(const Problem& p) {
  return {p.seq_len, p.head_dim, p.q_heads, p.kv_heads, p.group_size()};
}

// Normalises the scores of one launch in place in P (and fills the bf16 copy when given).
void launch_softmax(const Layout& l, const Tensor& probs, int64_t probs_offset, const Tensor& copy,
                    float* lse, float scale, const Mask& mask, const int32_t* segments) {
  const dim3 grid(static_cast<unsigned>(l.S), static_cast<unsigned>(l.Hkv));
  masked_softmax_rows<<<grid, row_threads(l.S), 0, ft::cuda::current_stream()>>>(
      static_cast<float*>(at(probs, probs_offset)), l.probs_head(),
      copy.defined() ? static_cast<__nv_bfloat16*>(copy.raw()) : nullptr, l.square(), lse,
      l.lse_head(), l.S, scale, mask.causal, mask.window, segments);
  FT_CUDA_CHECK_LAUNCH();
}

// dS of one launch from P and dP (fp32: in place over dP); bf16 also gets the bf16 copy of P.
void launch_softmax_backward(const Layout& l, const Tensor& probs, int64_t probs_offset,
                             const Tensor& dprobs, const Tensor& dscores, const Tensor& copy,
                             float scale) {
  const dim3 grid(static_cast<unsigned>(l.S), static_cast<unsigned>(l.Hkv));
  const int threads = row_threads(l.S);
  cudaStream_t stream = ft::cuda::current_stream();
  const float* p = static_cast<const float*>(at(probs, probs_offset));
  if (dscores.dtype() == DType::f32) {
    softmax_backward_rows<float>
        <<<grid, threads, 0, stream>>>(p, l.probs_head(), dprobs.data<float>(), l.square(),
                                       dscores.data<float>(), l.square(), nullptr, 0, l.S, scale);
  } else {
    softmax_backward_rows<__nv_bfloat16><<<grid, threads, 0, stream>>>(
        p, l.probs_head(), dprobs.data<float>(), l.square(),
        static_cast<__nv_bfloat16*>(dscores.raw()), l.square(),
        static_cast<__nv_bfloat16*>(copy.raw()), l.square(), l.S, scale);
  }
  FT_CUDA_CHECK_LAUNCH();
}

// dst [B, S, H, D] from src [B, H, S, D]: same dtype, or fp32 sums into bf16.
void copy_heads_to_rows(const Tensor& src, const Tensor& dst) {
  const int64_t n = dst.numel(), heads = dst.dim(2), seq_len = dst.dim(1), head_dim = dst.dim(3);
  const int threads = 256;
  const unsigned blocks =
      static_cast<unsigned>(std::min<int64_t>((n + threads - 1) / threads, 65536));
  cudaStream_t stream = ft::cuda::current_stream();
  if (src.dtype() == DType::f32 && dst.dtype() == DType::f32) {
    heads_to_rows<<<blocks, threads, 0, stream>>>(src.data<float>(), dst.data<float>(), heads,
                                                  seq_len, head_dim, n);
  } else if (src.dtype() == DType::f32) {
    heads_to_rows<<<blocks, threads, 0, stream>>>(
        src.data<float>(), static_cast<__nv_bfloat16*>(dst.raw()), heads, seq_len, head_dim, n);
  } else {
    heads_to_rows<<<blocks, threads, 0, stream>>>(static_cast<const __nv_bfloat16*>(src.raw()),
                                                  static_cast<__nv_bfloat16*>(dst.raw()), heads,
                                                  seq_len, head_dim, n);
  }
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace

ForwardOutput naive_forward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& segment_ids) {
  const Layout l = layout_of(p);
  const int64_t B = p.batch, S = l.S, D = l.D;
  const DType dt = p.dtype;
  const float scale = static_cast<float>(p.effective_scale());
  Tensor segments;  // on the GPU
  if (p.mask.has_segments) {
    segments = segment_ids.device() == Device::cuda ? segment_ids : segment_ids.to(Device::cuda);
  }
  ForwardOutput out;
  out.o = Tensor::empty(q.shape(), dt, Device::cuda);
  out.lse = poisoned({B, l.Hq, S}, DType::f32);
  out.saved = Tensor::empty({B, l.Hq, S, S}, DType::f32, Device::cuda);
  const Tensor o_heads = poisoned({B, l.Hq, S, D}, dt);
  // bf16: the P V product reads a bf16 copy of the launch's probabilities.
  const Tensor p_copy =
      dt == DType::bf16 ? Tensor::empty({l.Hkv, S, S}, dt, Device::cuda) : Tensor{};

  for (int64_t b = 0; b < B; ++b) {
    const int32_t* seg_row = segments.defined() ? segments.data<int32_t>() + b * S : nullptr;
    for (int64_t j = 0; j < l.G; ++j) {
      const HeadBatch hb = l.launch(b, j);
      batched_gemm(false, true, S, S, D, {at(q, hb.q), l.q_row(), l.q_head()},
                   {at(k, hb.kv), l.kv_row(), l.kv_head()}, at(out.saved, hb.probs), S,
                   l.probs_head(), dt, DType::f32, 0.0f, l.Hkv);
      launch_softmax(l, out.saved, hb.probs, p_copy, out.lse.data<float>() + hb.lse, scale, p.mask,
                     seg_row);
      const Operand probs = p_copy.defined() ? Operand{p_copy.raw(), S, l.square()}
                                             : Operand{at(out.saved, hb.probs), S, l.probs_head()};
      batched_gemm(false, false, S, D, S, probs, {at(v, hb.kv), l.kv_row(), l.kv_head()},
                   at(o_heads, hb.q_heads), D, l.q_head_major(), dt, dt, 0.0f, l.Hkv);
    }
  }
  copy_heads_to_rows(o_heads, out.o);
  return out;
}

Gradients naive_backward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                         const ForwardOutput& fwd, const Tensor& dout) {
  const Layout l = layout_of(p);
  const int64_t B = p.batch, S = l.S, D = l.D;
  const DType dt = p.dtype;
  const float scale = static_cast<float>(p.effective_scale());
  Gradients g{Tensor::empty(q.shape(), dt, Device::cuda),
              Tensor::empty(k.shape(), dt, Device::cuda),
              Tensor::empty(v.shape(), dt, Device::cuda)};
  // dK and dV sum over a group's G launches (beta = 1 after the first): in fp32 when the result
  // is bf16 and G > 1, so that the sum is rounded to bf16 once.
  const DType sum_dtype = dt == DType::bf16 && l.G > 1 ? DType::f32 : dt;
  const Tensor dq_heads = poisoned({B, l.Hq, S, D}, dt);
  const Tensor dk_heads = poisoned({B, l.Hkv, S, D}, sum_dtype);
  const Tensor dv_heads = poisoned({B, l.Hkv, S, D}, sum_dtype);
  const Tensor dprobs = Tensor::empty({l.Hkv, S, S}, DType::f32, Device::cuda);
  const bool bf16 = dt == DType::bf16;
  const Tensor dscores = bf16 ? Tensor::empty({l.Hkv, S, S}, dt, Device::cuda) : dprobs;
  const Tensor p_copy = bf16 ? Tensor::empty({l.Hkv, S, S}, dt, Device::cuda) : Tensor{};
  const Operand ds{dscores.raw(), S, l.square()};

  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < l.G; ++j) {
      const HeadBatch hb = l.launch(b, j);
      const float beta = j == 0 ? 0.0f : 1.0f;
      const Operand q_in{at(q, hb.q), l.q_row(), l.q_head()};
      const Operand do_in{at(dout, hb.q), l.q_row(), l.q_head()};
      const Operand k_in{at(k, hb.kv), l.kv_row(), l.kv_head()};
      const Operand v_in{at(v, hb.kv), l.kv_row(), l.kv_head()};
      // dP = dO V^T, then dS (scaled) from the fp32 P: in place (fp32) or into bf16 dS
      batched_gemm(false, true, S, S, D, do_in, v_in, dprobs.raw(), S, l.square(), dt, DType::f32,
                   0.0f, l.Hkv);
      launch_softmax_backward(l, fwd.saved, hb.probs, dprobs, dscores, p_copy, scale);
      // dV (+)= P^T dO
      const Operand probs = bf16 ? Operand{p_copy.raw(), S, l.square()}
                                 : Operand{at(fwd.saved, hb.probs), S, l.probs_head()};
      batched_gemm(true, false, S, D, S, probs, do_in, at(dv_heads, hb.kv_heads), D,
                   l.kv_head_major(), dt, sum_dtype, beta, l.Hkv);
      // dQ = dS K
      batched_gemm(false, false, S, D, S, ds, k_in, at(dq_heads, hb.q_heads), D, l.q_head_major(),
                   dt, dt, 0.0f, l.Hkv);
      // dK (+)= dS^T Q
      batched_gemm(true, false, S, D, S, ds, q_in, at(dk_heads, hb.kv_heads), D, l.kv_head_major(),
                   dt, sum_dtype, beta, l.Hkv);
    }
  }
  copy_heads_to_rows(dq_heads, g.dq);
  copy_heads_to_rows(dk_heads, g.dk);
  copy_heads_to_rows(dv_heads, g.dv);
  return g;
}

}  // namespace ft::attention::cuda
