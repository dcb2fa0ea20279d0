// The packed calls (attention.h, forward_packed / backward_packed) on the GPU, for kernels that
// do not yet read a fused QKV buffer in place: q, k and v copied out of it, and dq, dk, dv back
// into the fused gradient, each as one strided 2-D copy on the current stream (rows of H * D
// elements, W = (Hq + 2 Hkv) * D apart in the fused buffer).
#include <cuda_runtime.h>

#include "attention/cuda/cuda_kernels.h"
#include "core/cuda/check.h"
#include "core/cuda/runtime.h"

namespace ft::attention::cuda {
namespace {

// Copies `rows` rows of `row_elems` elements, `src_row` elements apart from src, to dst
// `dst_row` apart (elements of `elem` bytes).
void copy_rows(void* dst, int64_t dst_row, const void* src, int64_t src_row, int64_t row_elems,
               int64_t rows, size_t elem) {
  FT_CUDA_CHECK(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_row) * elem, src,
                                  static_cast<size_t>(src_row) * elem,
                                  static_cast<size_t>(row_elems) * elem, static_cast<size_t>(rows),
                                  cudaMemcpyDeviceToDevice, ft::cuda::current_stream()));
}

// Element offsets of q, k and v in one position's row of the fused buffer, and the widths.
struct PackedRow {
  int64_t width, q_cols, kv_cols, k_offset, v_offset;
  explicit PackedRow(const Problem& p)
      : width((p.q_heads + 2 * p.kv_heads) * p.head_dim),
        q_cols(p.q_heads * p.head_dim),
        kv_cols(p.kv_heads * p.head_dim),
        k_offset(q_cols),
        v_offset(q_cols + kv_cols) {}
};

}  // namespace

Unpacked unpack(const Problem& p, const Tensor& qkv) {
  const PackedRow r(p);
  const int64_t rows = p.batch * p.seq_len;
  const size_t elem = dtype_size(qkv.dtype());
  Unpacked out{
      Tensor::empty({p.batch, p.seq_len, p.q_heads, p.head_dim}, qkv.dtype(), Device::cuda),
      Tensor::empty({p.batch, p.seq_len, p.kv_heads, p.head_dim}, qkv.dtype(), Device::cuda),
      Tensor::empty({p.batch, p.seq_len, p.kv_heads, p.head_dim}, qkv.dtype(), Device::cuda)};
  const char* base = static_cast<const char*>(qkv.raw());
  copy_rows(out.q.raw(), r.q_cols, base, r.width, r.q_cols, rows, elem);
  copy_rows(out.k.raw(), r.kv_cols, base + r.k_offset * elem, r.width, r.kv_cols, rows, elem);
  copy_rows(out.v.raw(), r.kv_cols, base + r.v_offset * elem, r.width, r.kv_cols, rows, elem);
  return out;
}

void pack_gradients(const Problem& p, const Gradients& g, Tensor& dqkv) {
  const PackedRow r(p);
  const int64_t rows = p.batch * p.seq_len;
  const size_t elem = dtype_size(dqkv.dtype());
  char* base = static_cast<char*>(dqkv.raw());
  copy_rows(base, r.width, g.dq.raw(), r.q_cols, r.q_cols, rows, elem);
  copy_rows(base + r.k_offset * elem, r.width, g.dk.raw(), r.kv_cols, r.kv_cols, rows, elem);
  copy_rows(base + r.v_offset * elem, r.width, g.dv.raw(), r.kv_cols, r.kv_cols, rows, elem);
}

}  // namespace ft::attention::cuda
