// Fused-projection split/merge and elementwise add, CPU.
//
// A fused QKV row per token is [q heads (Hq*D) | k heads (Hkv*D) | v heads (Hkv*D)]; split
// copies each block into q [B, T, Hq, D], k and v [B, T, Hkv, D], and merge (its backward) copies
// the gradients back. Pure copies, so they are dtype-agnostic (bytes), and memory bound.
#include <cstring>

#include "nn/checks.h"
#include "nn/layers.h"
#ifdef FLASHTRAIN_WITH_CUDA
#include "nn/cuda/cuda_layers.h"
#endif

namespace ft::nn {
namespace {

struct QkvShape {
  int64_t tokens, q_width, kv_width;  // q_width = Hq*D, kv_width = Hkv*D
};

// q [B, T, Hq, D], k and v [B, T, Hkv, D], fused [B, T, (Hq + 2 Hkv) * D], one dtype, all on
// q's device.
QkvShape check_qkv(const Tensor& fused, const Tensor& q, const Tensor& k, const Tensor& v,
                   const char* fn, const char* fused_name) {
  detail::call_device(q, fn, "q");
  detail::check_float(q, fn, "q");
  FT_CHECK(q.ndim() == 4, fn, ": q must be [B, T, Hq, D], got ", shape_str(q.shape()));
  const int64_t B = q.dim(0), T = q.dim(1), Hq = q.dim(2), D = q.dim(3);
  detail::check_on(k, q.device(), fn, "k");
  FT_CHECK(k.ndim() == 4 && k.dim(0) == B && k.dim(1) == T && k.dim(3) == D, fn, ": k ",
           shape_str(k.shape()), " must be [", B, ", ", T, ", Hkv, ", D, "] to match q ",
           shape_str(q.shape()));
  const int64_t Hkv = k.dim(2);
  detail::check_like(v, k, fn, "v", "k");
  detail::check_dtype(k, q.dtype(), fn, "k");
  detail::check_on(fused, q.device(), fn, fused_name);
  detail::check_dtype(fused, q.dtype(), fn, fused_name);
  detail::check_shape(fused, {B, T, (Hq + 2 * Hkv) * D}, fn, fused_name);
  return {B * T, Hq * D, Hkv * D};
}

// Copies `width` elements per token between a block of the fused row and a dense tensor.
void copy_block(char* dst, int64_t dst_stride, const char* src, int64_t src_stride, int64_t tokens,
                int64_t width, size_t elem) {
#pragma omp parallel for schedule(static) if (tokens * width >= detail::kParallelMinWork)
  for (int64_t t = 0; t < tokens; ++t) {
    std::memcpy(dst + static_cast<size_t>(t * dst_stride) * elem,
                src + static_cast<size_t>(t * src_stride) * elem,
                static_cast<size_t>(width) * elem);
  }
}

template <class T>
void add_kernel(T* out, const T* a, const T* b, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= detail::kParallelMinWork)
  for (int64_t i = 0; i < n; ++i) store(out[i], load(a[i]) + load(b[i]));
}

}  // namespace

void split_qkv(Tensor& q, Tensor& k, Tensor& v, const Tensor& qkv) {
  const QkvShape s = check_qkv(qkv, q, k, v, "split_qkv", "qkv");
#ifdef FLASHTRAIN_WITH_CUDA
  if (q.device() == Device::cuda) return cuda::split_qkv(q, k, v, qkv);
#endif
  const int64_t row = s.q_width + 2 * s.kv_width;
  const size_t elem = dtype_size(qkv.dtype());
  const char* src = static_cast<const char*>(qkv.raw());
  copy_block(static_cast<char*>(q.raw()), s.q_width, src, row, s.tokens, s.q_width, elem);
  src += static_cast<size_t>(s.q_width) * elem;
  copy_block(static_cast<char*>(k.raw()), s.kv_width, src, row, s.tokens, s.kv_width, elem);
  src += static_cast<size_t>(s.kv_width) * elem;
  copy_block(static_cast<char*>(v.raw()), s.kv_width, src, row, s.tokens, s.kv_width, elem);
}

void merge_qkv(Tensor& dqkv, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  const QkvShape s = check_qkv(dqkv, dq, dk, dv, "merge_qkv", "dqkv");
#ifdef FLASHTRAIN_WITH_CUDA
  if (dq.device() == Device::cuda) return cuda::merge_qkv(dqkv, dq, dk, dv);
#endif
  const int64_t row = s.q_width + 2 * s.kv_width;
  const size_t elem = dtype_size(dqkv.dtype());
  char* dst = static_cast<char*>(dqkv.raw());
  copy_block(dst, row, static_cast<const char*>(dq.raw()), s.q_width, s.tokens, s.q_width, elem);
  dst += static_cast<size_t>(s.q_width) * elem;
  copy_block(dst, row, static_cast<const char*>(dk.raw()), s.kv_width, s.tokens, s.kv_width, elem);
  dst += static_cast<size_t>(s.kv_width) * elem;
  copy_block(dst, row, static_cast<const char*>(dv.raw()), s.kv_width, s.tokens, s.kv_width, elem);
}

void add(Tensor& out, const Tensor& a, const Tensor& b) {
  constexpr const char* fn = "add";
  detail::call_device(a, fn, "a");
  detail::check_float(a, fn, "a");
  detail::check_like(b, a, fn, "b", "a");
  detail::check_like(out, a, fn, "out", "a");
#ifdef FLASHTRAIN_WITH_CUDA
  if (a.device() == Device::cuda) return cuda::add(out, a, b);
#endif
  dispatch_float(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    add_kernel(out.data<T>(), a.data<T>(), b.data<T>(), a.numel());
  });
}

}  // namespace ft::nn
