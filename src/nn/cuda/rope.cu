// Rotary position embedding on the GPU, x [B, T, H, D] with interleaved pairs (x[2i], x[2i+1]).
// One thread per pair: out = (c x0 - s x1, s x0 + c x1) with (c, s) the table's angle for
// (t, i), s negated for the backward (inverse) rotation. The table lives on the GPU as fp32
// [maxT, D/2] copies of the fp64 CPU table: exactly the values the CPU kernel rounds to.
// Memory bound: each element read and written once, the table (maxT * D * 4 bytes) from L2.
// Each thread reads its pair before writing it, so out may alias x.
#include <vector>

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

Tensor upload_f32(const Tensor& table64) {
  const double* src = table64.data<double>();
  std::vector<float> host(static_cast<size_t>(table64.numel()));
  for (size_t k = 0; k < host.size(); ++k) host[k] = static_cast<float>(src[k]);
  Tensor t = Tensor::empty(table64.shape(), DType::f32, Device::cuda);
  FT_CUDA_CHECK(
      cudaMemcpyAsync(t.raw(), host.data(), t.nbytes(), cudaMemcpyHostToDevice, stream()));
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
    constexpr int kThreads = 256;
    rope_kernel<T><<<grid_for(n_pairs, kThreads), kThreads, 0, stream()>>>(
        ptr<T>(out), ptr<T>(x), ptr<float>(table.cos_device), ptr<float>(table.sin_device), n_pairs,
        x.dim(1), x.dim(2), rotated, x.dim(3) / 2, static_cast<float>(direction));
    FT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ft::nn::cuda
