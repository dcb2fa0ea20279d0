// Rotary position embedding on the GPU, x [B, T, H, D] with interleaved pairs (x[2i], x[2i+1]).
// out = (c x0 - s x1, s x0 + c x1) with (c, s) the table's angle for (t, i), s negated for the
// backward (inverse) rotation. The table lives on the GPU as fp32 [maxT, D/2] copies of the
// fp64 CPU table: exactly the values the CPU kernel rounds to. Memory bound: each element read
// and written once, the table (maxT * D * 4 bytes) from L1/L2. Head dims that are whole 16-byte
// packs: one block per position, each thread a pack (W / 2 pairs) of its rotated heads, so the
// index arithmetic is one division per block; otherwise one thread per pair. Each thread reads
// its pack or pair before writing it, so out may alias x.
#include <vector>

#include "core/cuda/graph.h"
#include "nn/cuda/common.cuh"
#include "nn/cuda/cuda_layers.h"

namespace ft::nn::cuda {
namespace {

// Pair p of the rotated ones: pair i of head h < rotated at position bt (= b * T + t), the
// element 2 i of that head; with every head rotated, element 2 p.
template <class T>
__global__ void rope_kernel(T* out, const T* x, const float* cos_tab, const float* sin_tab,
                            int64_t n_pairs, int64_t T_len, int64_t H, int64_t rotated,
                            int64_t half, float direction) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < n_pairs;
       p += stride) {
    const int64_t i = p % half, h = (p / half) % rotated, bt = p / half / rotated;
    const int64_t t = bt % T_len, e = ((bt * H + h) * half + i) * 2;
    const float c = cos_tab[t * half + i], s = direction * sin_tab[t * half + i];
    const float x0 = to_f32(x[e]), x1 = to_f32(x[e + 1]);
    out[e] = from_f32<T>(c * x0 - s * x1);
    out[e + 1] = from_f32<T>(s * x0 + c * x1);
  }
}

// Block bt = b * T + t rotates the first `rotated_packs` packs of its position's H * D / W.
template <class T, int W>
__global__ void rope_pack_kernel(T* out, const T* x, const float* cos_tab, const float* sin_tab,
                                 int T_len, int row_packs, int rotated_packs, int head_packs,
                                 int half, float direction) {
  const int64_t bt = blockIdx.x;
  const int t = static_cast<int>(bt % T_len);
  const float* cos_row = cos_tab + static_cast<int64_t>(t) * half;
  const float* sin_row = sin_tab + static_cast<int64_t>(t) * half;
  const int64_t row = bt * row_packs * W;
  for (int p = threadIdx.x; p < rotated_packs; p += blockDim.x) {
    const int i0 = (p % head_packs) * (W / 2);  // the pack's first pair within its head
    const Pack<T, W> xp = load_pack<T, W>(x + row + static_cast<int64_t>(p) * W);
    Pack<T, W> op;
#pragma unroll
    for (int j = 0; j < W / 2; ++j) {
      const float c = cos_row[i0 + j], s = direction * sin_row[i0 + j];
      const float x0 = to_f32(xp.v[2 * j]), x1 = to_f32(xp.v[2 * j + 1]);
      op.v[2 * j] = from_f32<T>(c * x0 - s * x1);
      op.v[2 * j + 1] = from_f32<T>(s * x0 + c * x1);
    }
    store_pack<T, W>(out + row + static_cast<int64_t>(p) * W, op);
  }
}

Tensor upload_f32(const Tensor& table64) {
  const double* src = table64.data<double>();
  std::vector<float> host(static_cast<size_t>(table64.numel()));
  for (size_t k = 0; k < host.size(); ++k) host[k] = static_cast<float>(src[k]);
  Tensor t = Tensor::empty(table64.shape(), DType::f32, Device::cuda);
  ft::cuda::upload_constant(t.raw(), host.data(), t.nbytes());
  return t;
}

}  // namespace

void upload_rope_table(RopeTable& table) {
  table.cos_device = upload_f32(table.cos);
  table.sin_device = upload_f32(table.sin);
}

void rope_rotate(Tensor& out, const Tensor& x, const RopeTable& table, int64_t rotated,
                 int direction) {
  const int64_t n_pairs = x.dim(0) * x.dim(1) * rotated * (x.dim(3) / 2);
  if (n_pairs == 0) return;
  dispatch_cuda_float(x.dtype(), direction > 0 ? "rope_forward" : "rope_backward", [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = kPackWidth<T>;
    const int64_t B = x.dim(0), T_len = x.dim(1), H = x.dim(2), D = x.dim(3);
    if (can_use_packs<T>(D, {out.raw(), x.raw()}) && B * T_len < (int64_t{1} << 31)) {
      const int head_packs = static_cast<int>(D / W);
      const int rotated_packs = static_cast<int>(rotated) * head_packs;
      const int threads =
          static_cast<int>(std::min<int64_t>(128, ceil_div(rotated_packs, 32) * 32));
      rope_pack_kernel<T, W><<<static_cast<unsigned>(B * T_len), threads, 0, stream()>>>(
          ptr<T>(out), ptr<T>(x), ptr<float>(table.cos_device), ptr<float>(table.sin_device),
          static_cast<int>(T_len), static_cast<int>(H) * head_packs, rotated_packs, head_packs,
          static_cast<int>(D / 2), static_cast<float>(direction));
      FT_CUDA_CHECK_LAUNCH();
      return;
    }
    constexpr int kThreads = 256;
    rope_kernel<T><<<grid_for(n_pairs, kThreads), kThreads, 0, stream()>>>(
        ptr<T>(out), ptr<T>(x), ptr<float>(table.cos_device), ptr<float>(table.sin_device), n_pairs,
        x.dim(1), x.dim(2), rotated, x.dim(3) / 2, static_cast<float>(direction));
    FT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ft::nn::cuda
