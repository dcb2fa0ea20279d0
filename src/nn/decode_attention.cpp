// Attention of one new query per head over a KV cache, CPU: the decode step of generation,
// where the keys and values of earlier positions are kept instead of recomputed. For each query
// head h (kv head h / (Hq / Hkv)):
//   s_j = scale * q_h . k_j  for cached keys j in [first_key, last_key]
//   out_h = sum_j softmax(s)_j v_j
// accumulated in acc_t<T> (fp32 for fp32 and bf16), max-subtracted. Work: 4 * Hq * D * keys
// FLOPs, reading the cache once (memory bound). The CUDA twin (src/nn/cuda/decode_attention.cu)
// is tested against this; the model checks both against full recomputation.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "nn/checks.h"
#include "nn/layers.h"
#ifdef FLASHTRAIN_WITH_CUDA
#include "nn/cuda/cuda_layers.h"
#endif

namespace ft::nn {
namespace {

constexpr const char* kFn = "decode_attention";

template <class T>
void decode_kernel(T* out, const T* q, const T* k, const T* v, int64_t first, int64_t last,
                   int64_t Hq, int64_t Hkv, int64_t D, double scale) {
  using A = acc_t<T>;
  const int64_t group = Hq / Hkv, n = last - first + 1;
#pragma omp parallel for schedule(static) if (Hq * n * D >= detail::kParallelMinWork)
  for (int64_t h = 0; h < Hq; ++h) {
    const int64_t kvh = h / group;
    std::vector<A> scores(static_cast<size_t>(n));
    A mx = -std::numeric_limits<A>::infinity();
    for (int64_t j = 0; j < n; ++j) {
      const T* kj = k + ((first + j) * Hkv + kvh) * D;
      A s = 0;
      for (int64_t d = 0; d < D; ++d) s += load(q[h * D + d]) * load(kj[d]);
      s *= static_cast<A>(scale);
      scores[static_cast<size_t>(j)] = s;
      mx = std::max(mx, s);
    }
    A sum = 0;
    for (A& s : scores) {
      s = std::exp(s - mx);
      sum += s;
    }
    std::vector<A> acc(static_cast<size_t>(D), A(0));
    for (int64_t j = 0; j < n; ++j) {
      const T* vj = v + ((first + j) * Hkv + kvh) * D;
      const A p = scores[static_cast<size_t>(j)];
      for (int64_t d = 0; d < D; ++d) acc[static_cast<size_t>(d)] += p * load(vj[d]);
    }
    for (int64_t d = 0; d < D; ++d) store(out[h * D + d], acc[static_cast<size_t>(d)] / sum);
  }
}

}  // namespace

void decode_attention(Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                      int64_t first_key, int64_t last_key, double scale) {
  const Device device = detail::call_device(q, kFn, "q");
  detail::check_float(q, kFn, "q");
  FT_CHECK(q.ndim() == 2, kFn, ": q must be [Hq, D], got ", shape_str(q.shape()));
  const int64_t Hq = q.dim(0), D = q.dim(1);
  detail::check_on(k_cache, device, kFn, "k_cache");
  FT_CHECK(
      k_cache.ndim() == 3 && k_cache.dim(2) == D && k_cache.dim(1) >= 1 && Hq % k_cache.dim(1) == 0,
      kFn, ": k_cache ", shape_str(k_cache.shape()), " must be [capacity, Hkv, ", D,
      "] with Hq = ", Hq, " a multiple of Hkv");
  detail::check_dtype(k_cache, q.dtype(), kFn, "k_cache");
  detail::check_like(v_cache, k_cache, kFn, "v_cache", "k_cache");
  detail::check_like(out, q, kFn, "out", "q");
  FT_CHECK(first_key >= 0 && first_key <= last_key && last_key < k_cache.dim(0), kFn, ": keys [",
           first_key, ", ", last_key, "] must lie within the cache of ", k_cache.dim(0),
           " positions");
  FT_CHECK(std::isfinite(scale) && scale > 0, kFn, ": scale ", scale, " must be > 0");
#ifdef FLASHTRAIN_WITH_CUDA
  if (device == Device::cuda) {
    return cuda::decode_attention(out, q, k_cache, v_cache, first_key, last_key, scale);
  }
#endif
  dispatch_float(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    decode_kernel(out.data<T>(), q.data<T>(), k_cache.data<T>(), v_cache.data<T>(), first_key,
                  last_key, Hq, k_cache.dim(1), D, scale);
  });
}

}  // namespace ft::nn
