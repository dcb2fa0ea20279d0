// The CUDA flash implementation behind attention.h: allocates outputs and scratch, summarises the
// segment ids per 16 positions, runs the backward preprocess (D = rowsum(dO * O), dQ buffer
// zeroed) and the dQ conversion, and picks the compiled kernel of the configuration.
//
// Memory: o and lse forward; backward D [B, Hq, S] fp32 and, for bf16, a dQ buffer
// [B, S, Hq, D] fp32; for fp32 with grouped-query attention, per-query-head parts of dK and dV,
// 2 x [B, S, Hq, D] fp32. Nothing of size S x S.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "attention/cuda/cuda_kernels.h"
#include "attention/cuda/flash_bf16.cuh"
#include "attention/cuda/flash_launch.h"
#include "attention/cuda/flash_tma_backward.cuh"
#include "attention/cuda/flash_tma_forward.cuh"
#include "attention/cuda/flash_wgmma.cuh"
#include "core/cuda/check.h"
#include "core/cuda/runtime.h"

namespace ft::attention::cuda {
namespace {

__global__ void segment_chunks_kernel(const int32_t* ids, SegmentChunk* chunks, int batch,
                                      int seq_len, int per_row) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= batch * per_row) return;
  const int b = idx / per_row, c = idx % per_row;
  SegmentChunk s{0x7fffffff, -1, 0, 0};
  const int end = min(seq_len, (c + 1) * kSegmentChunk);
  for (int i = c * kSegmentChunk; i < end; ++i) {
    const int id = ids[int64_t{b} * seq_len + i];
    if (id < 0) {
      s.has_padding = 1;
    } else {
      s.lowest = min(s.lowest, id);
      s.highest = max(s.highest, id);
    }
  }
  chunks[idx] = s;
}

// One warp per (batch, position, head) row: dsum = sum_d dO * O (the fp32 path).
__global__ void backward_preprocess_fp32_kernel(const float* o, const float* dout, float* dsum,
                                                int64_t rows, int seq_len, int heads,
                                                int head_dim) {
  const int64_t row = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* o_row = o + row * head_dim;
  const float* do_row = dout + row * head_dim;
  float acc = 0.0f;
  for (int d = lane; d < head_dim; d += 32) acc += o_row[d] * do_row[d];
  for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
  const int64_t b = row / (int64_t{seq_len} * heads);
  const int i = static_cast<int>((row / heads) % seq_len), h = static_cast<int>(row % heads);
  if (lane == 0) dsum[(b * heads + h) * seq_len + i] = acc;
}

// The bf16 path: each thread takes 8 consecutive values (16 bytes) of O and dO, and the CHUNKS
// threads of a row (head_dim / 8, a power of two up to 32) sum them with shuffles; it also
// zeroes the same 8 values of the dQ buffer (laid out like O).
template <int CHUNKS>
__global__ void backward_preprocess_bf16_kernel(const __nv_bfloat16* o, const __nv_bfloat16* dout,
                                                float* dsum, float4* dq_accum, int64_t rows,
                                                int seq_len, int heads) {
  const int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t row = idx / CHUNKS;
  float acc = 0.0f;
  if (row < rows) {
    dq_accum[2 * idx] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    dq_accum[2 * idx + 1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const uint4 ov = reinterpret_cast<const uint4*>(o)[idx];
    const uint4 dv = reinterpret_cast<const uint4*>(dout)[idx];
    const auto* op = reinterpret_cast<const __nv_bfloat162*>(&ov);
    const auto* dp = reinterpret_cast<const __nv_bfloat162*>(&dv);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 a = __bfloat1622float2(op[k]), c = __bfloat1622float2(dp[k]);
      acc += a.x * c.x + a.y * c.y;
    }
  }
#pragma unroll
  for (int offset = CHUNKS / 2; offset > 0; offset /= 2) {
    acc += __shfl_xor_sync(0xffffffffu, acc, offset);
  }
  if (row < rows && idx % CHUNKS == 0) {
    const int64_t b = row / (int64_t{seq_len} * heads);
    const int i = static_cast<int>((row / heads) % seq_len), h = static_cast<int>(row % heads);
    dsum[(b * heads + h) * seq_len + i] = acc;
  }
}

// dq = dq_accum * scale in bf16, four values per thread: dq_accum holds dense rows of `cols`
// values (Hq * D, a multiple of 8, so four values never straddle two rows), which land dq_row
// elements apart in dq (cols when dense; wider inside a fused gradient buffer).
__global__ void convert_dq_kernel(const float4* dq_accum, __nv_bfloat16* dq, int64_t n4, int cols,
                                  int64_t dq_row, float scale) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= n4) return;
  const float4 v = dq_accum[i];
  const int64_t row = 4 * i / cols, col = 4 * i - row * cols;
  const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x * scale, v.y * scale);
  const __nv_bfloat162 hi = __floats2bfloat162_rn(v.z * scale, v.w * scale);
  *reinterpret_cast<uint2*>(dq + row * dq_row + col) =
      make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
}

unsigned blocks_for(int64_t threads_needed, int block) {
  return static_cast<unsigned>((threads_needed + block - 1) / block);
}

const Bf16Kernels& bf16_kernels() {
  static const Bf16Kernels table = [] {
    Bf16Kernels k;
    add_bf16_forward_d32(k);
    add_bf16_forward_d64(k);
    add_bf16_forward_d128(k);
    add_bf16_backward_d32(k);
    add_bf16_backward_d64(k);
    add_bf16_backward_d128(k);
    add_wgmma_forward_d64(k);
    add_wgmma_forward_d128(k);
    add_wgmma_backward_d64(k);
    add_wgmma_backward_d128(k);
    add_tma_forward_d64(k);
    add_tma_forward_d128(k);
    add_tma_forward_d256(k);
    add_tma_backward_d64(k);
    add_tma_backward_d128(k);
    add_tma_backward_d256(k);
    return k;
  }();
  return table;
}

// The problem's sizes and mask, with dense rows; the caller points q, k, v (and the gradients).
FlashParams make_params(const Problem& p) {
  FlashParams fp;
  fp.causal = p.mask.causal;
  // A window of S or more hides nothing; clamping keeps the int arithmetic of the kernels safe.
  fp.window = static_cast<int>(std::min(p.mask.window, p.seq_len));
  fp.batch = static_cast<int>(p.batch);
  fp.seq_len = static_cast<int>(p.seq_len);
  fp.q_heads = static_cast<int>(p.q_heads);
  fp.kv_heads = static_cast<int>(p.kv_heads);
  fp.head_dim = static_cast<int>(p.head_dim);
  fp.q_row = fp.dq_row = p.q_heads * p.head_dim;
  fp.k_row = fp.v_row = fp.dk_row = fp.dv_row = p.kv_heads * p.head_dim;
  fp.scale = static_cast<float>(p.effective_scale());
  fp.scale_log2 = static_cast<float>(p.effective_scale() * 1.4426950408889634);
  return fp;
}

// Pointers to q, k and v (or dq, dk and dv) inside one fused buffer [B, S, (Hq + 2 Hkv) * D],
// and the elements between its positions.
struct FusedParts {
  char *q, *k, *v;
  int64_t row;
};

FusedParts fused_parts(const Problem& p, const Tensor& qkv) {
  const int64_t elem = static_cast<int64_t>(dtype_size(qkv.dtype()));
  char* base = static_cast<char*>(const_cast<void*>(qkv.raw()));
  const int64_t q_cols = p.q_heads * p.head_dim, kv_cols = p.kv_heads * p.head_dim;
  return {base, base + q_cols * elem, base + (q_cols + kv_cols) * elem, q_cols + 2 * kv_cols};
}

void point_at_inputs(FlashParams& fp, const Problem& p, const Tensor& qkv) {
  const FusedParts f = fused_parts(p, qkv);
  fp.q = f.q;
  fp.k = f.k;
  fp.v = f.v;
  fp.q_row = fp.k_row = fp.v_row = f.row;
}

void point_at_gradients(FlashParams& fp, const Problem& p, Tensor& dqkv) {
  const FusedParts f = fused_parts(p, dqkv);
  fp.dq = f.q;
  fp.dk = f.k;
  fp.dv = f.v;
  fp.dq_row = fp.dk_row = fp.dv_row = f.row;
}

// Segment ids on the GPU and their chunk summary (undefined tensors without segments).
struct DeviceSegments {
  Tensor ids, chunks;
};

DeviceSegments device_segments(const Problem& p, const Tensor& segment_ids,
                               const Tensor& saved_chunks = {}) {
  DeviceSegments s;
  if (!p.mask.has_segments) return s;
  s.ids = segment_ids.device() == Device::cuda ? segment_ids : segment_ids.to(Device::cuda);
  const int per_row = static_cast<int>((p.seq_len + kSegmentChunk - 1) / kSegmentChunk);
  if (saved_chunks.defined()) {
    s.chunks = saved_chunks;
    return s;
  }
  s.chunks = Tensor::empty({p.batch, per_row, 4}, DType::i32, Device::cuda);
  segment_chunks_kernel<<<blocks_for(p.batch * per_row, 256), 256, 0, ft::cuda::current_stream()>>>(
      s.ids.data<int32_t>(), reinterpret_cast<SegmentChunk*>(s.chunks.data<int32_t>()),
      static_cast<int>(p.batch), static_cast<int>(p.seq_len), per_row);
  FT_CUDA_CHECK(cudaGetLastError());
  return s;
}

void attach(FlashParams& fp, const DeviceSegments& s) {
  if (!s.ids.defined()) return;
  fp.segment_ids = s.ids.data<int32_t>();
  fp.segment_chunks = reinterpret_cast<const SegmentChunk*>(s.chunks.data<int32_t>());
}

}  // namespace

void flash_bf16_forward(const KernelConfig& config, const FlashParams& p, cudaStream_t stream) {
  for (const auto& k : bf16_kernels().forward) {
    const bool knobs = k.path != ForwardPath::tma ||
                       (k.stages == config.forward_stages && k.pingpong == config.forward_pingpong);
    if (k.head_dim == p.head_dim && k.tile == config.forward && k.path == config.forward_path &&
        knobs) {
      return k.launch(p, stream);
    }
  }
  throw Error(str("attention: no compiled bf16 forward kernel for ", config.forward_str(),
                  " and head dim ", p.head_dim));
}

void flash_bf16_backward(const KernelConfig& config, const FlashParams& p, cudaStream_t stream) {
  // The tma path's ring depth: the one the configuration names, else its tile's first plan's.
  const TmaBackwardPlan* plan = find_tma_backward_plan(config, p.head_dim);
  const int stages = plan != nullptr ? plan->stages : 0;
  for (const auto& k : bf16_kernels().backward) {
    if (k.head_dim == p.head_dim && k.tile == config.backward && k.path == config.backward_path &&
        (k.path != BackwardPath::tma || k.stages == stages)) {
      return k.launch(p, stream);
    }
  }
  throw Error(str("attention: no compiled bf16 backward kernel for ", config.backward_str(),
                  " and head dim ", p.head_dim));
}

// The tma kernels (and the dQ conversion) take q, k, v and dq, dk, dv rows as far apart as a fused
// buffer's; the others read dense tensors.
bool flash_reads_packed(const Problem& p, const KernelConfig& config, KernelDirection which) {
  if (p.dtype != DType::bf16) return false;
  return which == KernelDirection::forward ? config.forward_path == ForwardPath::tma
                                           : config.backward_path == BackwardPath::tma;
}

namespace {

// The forward on fp's q, k and v: allocates o and lse and launches the configuration's kernel.
ForwardOutput run_forward(const Problem& p, FlashParams fp, const Tensor& segment_ids,
                          const KernelConfig& config) {
  FT_ASSERT(fp.dense_rows() || flash_reads_packed(p, config, KernelDirection::forward));
  const DeviceSegments seg = device_segments(p, segment_ids);
  attach(fp, seg);
  ForwardOutput out;
  out.o = Tensor::empty({p.batch, p.seq_len, p.q_heads, p.head_dim}, p.dtype, Device::cuda);
  out.lse = Tensor::empty({p.batch, p.q_heads, p.seq_len}, DType::f32, Device::cuda);
  out.saved = seg.chunks;
  fp.o = out.o.raw();
  fp.lse = out.lse.data<float>();
  if (p.dtype == DType::f32) {
    flash_fp32_forward(fp, ft::cuda::current_stream());
  } else {
    flash_bf16_forward(config, fp, ft::cuda::current_stream());
  }
  return out;
}

// The backward on fp's q, k, v into fp's dq, dk, dv: the preprocess, the configuration's
// kernel and (bf16) the dQ conversion, with the scratch they need.
void run_backward(const Problem& p, FlashParams fp, const ForwardOutput& fwd, const Tensor& dout,
                  const Tensor& segment_ids, const KernelConfig& config) {
  FT_ASSERT(fp.dense_rows() || flash_reads_packed(p, config, KernelDirection::backward));
  const DeviceSegments seg = device_segments(p, segment_ids, fwd.saved);
  attach(fp, seg);
  fp.lse = const_cast<float*>(fwd.lse.data<float>());
  fp.dout = dout.raw();
  Tensor dsum = Tensor::empty({p.batch, p.q_heads, p.seq_len}, DType::f32, Device::cuda);
  fp.dsum = dsum.data<float>();
  const bool bf16 = p.dtype == DType::bf16;
  const Shape q_shape{p.batch, p.seq_len, p.q_heads, p.head_dim};
  Tensor dq_accum;
  if (bf16) {
    dq_accum = Tensor::empty(q_shape, DType::f32, Device::cuda);
    fp.dq_accum = dq_accum.data<float>();
  }
  const int64_t rows = p.batch * p.seq_len * p.q_heads;
  const cudaStream_t stream = ft::cuda::current_stream();
  if (!bf16) {
    Tensor dkv_part;  // freed stream-ordered, after the kernels that use it
    if (p.q_heads != p.kv_heads) {
      dkv_part =
          Tensor::empty({2, p.batch, p.seq_len, p.q_heads, p.head_dim}, DType::f32, Device::cuda);
      fp.dkv_part = dkv_part.data<float>();
    }
    backward_preprocess_fp32_kernel<<<blocks_for(rows * 32, 256), 256, 0, stream>>>(
        fwd.o.data<float>(), dout.data<float>(), fp.dsum, rows, fp.seq_len, fp.q_heads,
        fp.head_dim);
    FT_CUDA_CHECK(cudaGetLastError());
    flash_fp32_backward(fp, stream);
    return;
  }
  // bf16 head dims are multiples of 8 up to 256 (can_implement): 4 to 32 chunks of 8 per row.
  const int chunks = static_cast<int>(p.head_dim / 8);
  const auto* o_bf16 = static_cast<const __nv_bfloat16*>(fwd.o.raw());
  const auto* do_bf16 = static_cast<const __nv_bfloat16*>(dout.raw());
  const unsigned pre_blocks = blocks_for(rows * chunks, 256);
  auto* dq4 = reinterpret_cast<float4*>(fp.dq_accum);
  switch (chunks) {
    case 4:
      backward_preprocess_bf16_kernel<4><<<pre_blocks, 256, 0, stream>>>(
          o_bf16, do_bf16, fp.dsum, dq4, rows, fp.seq_len, fp.q_heads);
      break;
    case 8:
      backward_preprocess_bf16_kernel<8><<<pre_blocks, 256, 0, stream>>>(
          o_bf16, do_bf16, fp.dsum, dq4, rows, fp.seq_len, fp.q_heads);
      break;
    case 16:
      backward_preprocess_bf16_kernel<16><<<pre_blocks, 256, 0, stream>>>(
          o_bf16, do_bf16, fp.dsum, dq4, rows, fp.seq_len, fp.q_heads);
      break;
    case 32:
      backward_preprocess_bf16_kernel<32><<<pre_blocks, 256, 0, stream>>>(
          o_bf16, do_bf16, fp.dsum, dq4, rows, fp.seq_len, fp.q_heads);
      break;
    default:
      throw Error(str("attention: no bf16 backward preprocess for head dim ", p.head_dim));
  }
  FT_CUDA_CHECK(cudaGetLastError());
  const int64_t n = p.batch * p.seq_len * p.q_heads * p.head_dim;
  Tensor dq_semaphore;  // freed stream-ordered, after the kernel that uses it
  if (p.deterministic) {
    const int64_t q_tiles = (p.seq_len + 63) / 64;
    dq_semaphore = Tensor::empty({p.batch, p.q_heads, q_tiles, 2}, DType::i32, Device::cuda);
    fp.dq_semaphore = dq_semaphore.data<int32_t>();
    FT_CUDA_CHECK(cudaMemsetAsync(fp.dq_semaphore, 0, dq_semaphore.nbytes(), stream));
  }
  flash_bf16_backward(config, fp, stream);
  convert_dq_kernel<<<blocks_for(n / 4, 256), 256, 0, stream>>>(
      reinterpret_cast<const float4*>(fp.dq_accum), static_cast<__nv_bfloat16*>(fp.dq), n / 4,
      fp.q_heads * fp.head_dim, fp.dq_row, fp.scale);
  FT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

ForwardOutput flash_forward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& segment_ids, const KernelConfig& config) {
  FlashParams fp = make_params(p);
  fp.q = q.raw();
  fp.k = k.raw();
  fp.v = v.raw();
  return run_forward(p, fp, segment_ids, config);
}

ForwardOutput flash_forward_packed(const Problem& p, const Tensor& qkv, const Tensor& segment_ids,
                                   const KernelConfig& config) {
  FT_CHECK(flash_reads_packed(p, config, KernelDirection::forward), "attention: the flash forward ",
           config.forward_str(), " does not read a fused QKV buffer in place");
  FlashParams fp = make_params(p);
  point_at_inputs(fp, p, qkv);
  return run_forward(p, fp, segment_ids, config);
}

Gradients flash_backward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                         const ForwardOutput& fwd, const Tensor& dout, const Tensor& segment_ids,
                         const KernelConfig& config) {
  FlashParams fp = make_params(p);
  fp.q = q.raw();
  fp.k = k.raw();
  fp.v = v.raw();
  Gradients g;
  g.dq = Tensor::empty(q.shape(), p.dtype, Device::cuda);
  g.dk = Tensor::empty(k.shape(), p.dtype, Device::cuda);
  g.dv = Tensor::empty(v.shape(), p.dtype, Device::cuda);
  fp.dq = g.dq.raw();
  fp.dk = g.dk.raw();
  fp.dv = g.dv.raw();
  run_backward(p, fp, fwd, dout, segment_ids, config);
  return g;
}

void flash_backward_packed(const Problem& p, const Tensor& qkv, const ForwardOutput& fwd,
                           const Tensor& dout, const Tensor& segment_ids,
                           const KernelConfig& config, Tensor& dqkv) {
  FT_CHECK(flash_reads_packed(p, config, KernelDirection::backward),
           "attention: the flash backward ", config.backward.str(), "/",
           backward_path_name(config.backward_path), " does not read a fused QKV buffer in place");
  FlashParams fp = make_params(p);
  point_at_inputs(fp, p, qkv);
  point_at_gradients(fp, p, dqkv);
  run_backward(p, fp, fwd, dout, segment_ids, config);
}

}  // namespace ft::attention::cuda
