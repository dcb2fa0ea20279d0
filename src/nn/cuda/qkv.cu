// Fused-projection split/merge and elementwise add on the GPU.
//
// split/merge copy each token's q, k and v blocks between the fused row
// [q heads (Hq*D) | k heads (Hkv*D) | v heads (Hkv*D)] and the dense tensors: strided 2-D
// copies, done by cudaMemcpy2DAsync (device to device, dtype-agnostic bytes). Traffic: each
// element read and written once. add: out = a + b in fp32, 16-byte packs (common.cuh).
#include "nn/cuda/common.cuh"
#include "nn/cuda/cuda_layers.h"

namespace ft::nn::cuda {
namespace {

struct AddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// Copies `width` elements per token between a block of the fused row and a dense tensor.
void copy_block(void* dst, int64_t dst_stride, const void* src, int64_t src_stride, int64_t tokens,
                int64_t width, size_t elem) {
  if (tokens == 0 || width == 0) return;
  FT_CUDA_CHECK(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_stride) * elem, src,
                                  static_cast<size_t>(src_stride) * elem,
                                  static_cast<size_t>(width) * elem, static_cast<size_t>(tokens),
                                  cudaMemcpyDeviceToDevice, stream()));
}

struct QkvWidths {
  int64_t tokens, q, kv, row;
};

QkvWidths widths_of(const Tensor& q, const Tensor& k) {
  const int64_t q_width = q.dim(2) * q.dim(3), kv_width = k.dim(2) * k.dim(3);
  return {q.dim(0) * q.dim(1), q_width, kv_width, q_width + 2 * kv_width};
}

}  // namespace

void split_qkv(Tensor& q, Tensor& k, Tensor& v, const Tensor& qkv) {
  const QkvWidths s = widths_of(q, k);
  const size_t elem = dtype_size(qkv.dtype());
  const char* src = static_cast<const char*>(qkv.raw());
  copy_block(q.raw(), s.q, src, s.row, s.tokens, s.q, elem);
  copy_block(k.raw(), s.kv, src + s.q * elem, s.row, s.tokens, s.kv, elem);
  copy_block(v.raw(), s.kv, src + (s.q + s.kv) * elem, s.row, s.tokens, s.kv, elem);
}

void merge_qkv(Tensor& dqkv, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  const QkvWidths s = widths_of(dq, dk);
  const size_t elem = dtype_size(dqkv.dtype());
  char* dst = static_cast<char*>(dqkv.raw());
  copy_block(dst, s.row, dq.raw(), s.q, s.tokens, s.q, elem);
  copy_block(dst + s.q * elem, s.row, dk.raw(), s.kv, s.tokens, s.kv, elem);
  copy_block(dst + (s.q + s.kv) * elem, s.row, dv.raw(), s.kv, s.tokens, s.kv, elem);
}

void add(Tensor& out, const Tensor& a, const Tensor& b) {
  dispatch_cuda_float(a.dtype(), "add", [&](auto tag) {
    using T = decltype(tag);
    launch_map<T>(ptr<T>(out), ptr<T>(a), ptr<T>(b), a.numel(), AddOp{});
  });
}

}  // namespace ft::nn::cuda
