// Token + learned position embedding on the GPU.
//
// Forward: one thread per 16-byte pack of an output row gathers the token's wte pack and the
// position's wpe pack: B*T*C reads of each table and B*T*C writes.
// Backward, deterministic without atomics: the host sorts token positions by vocabulary id
// (stable, so each id keeps token order; the ids are tiny next to the activations), uploads that
// order once, and one block per (used id, column chunk) adds its tokens' dout rows into the
// dwte row in token order, exactly the CPU's order of additions. dwpe: one thread per
// (position, column) adds the batch's rows in batch order. Traffic: dout read once per table.
#include <algorithm>
#include <numeric>
#include <vector>

#include "nn/cuda/common.cuh"
#include "nn/cuda/cuda_layers.h"

namespace ft::nn::cuda {
namespace {

template <class T, int W>
__global__ void embedding_forward_kernel(T* out, const int32_t* tokens, const T* wte, const T* wpe,
                                         int64_t BT, int64_t T_len, int64_t C) {
  const int64_t packs_per_row = C / W, n_packs = BT * packs_per_row;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < n_packs;
       p += stride) {
    const int64_t bt = p / packs_per_row, c = (p % packs_per_row) * W;
    const Pack<T, W> tok = load_pack<T, W>(wte + static_cast<int64_t>(tokens[bt]) * C + c);
    Pack<T, W> o = tok;
    if (wpe != nullptr) {
      const Pack<T, W> pos = load_pack<T, W>(wpe + (bt % T_len) * C + c);
#pragma unroll
      for (int k = 0; k < W; ++k) o.v[k] = from_f32<T>(to_f32(tok.v[k]) + to_f32(pos.v[k]));
    }
    store_pack<T, W>(out + bt * C + c, o);
  }
}

// Block (u, chunk): vocabulary id ids[u], whose token positions are order[start[u], start[u+1]).
template <class T>
__global__ void embedding_backward_wte_kernel(float* dwte, const T* dout, const int32_t* ids,
                                              const int32_t* start, const int32_t* order,
                                              int64_t C) {
  const int u = blockIdx.x;
  const int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float* row = dwte + static_cast<int64_t>(ids[u]) * C + c;
  float acc = *row;
  for (int k = start[u]; k < start[u + 1]; ++k) acc += to_f32(dout[order[k] * C + c]);
  *row = acc;
}

template <class T>
__global__ void embedding_backward_wpe_kernel(float* dwpe, const T* dout, int64_t B, int64_t T_len,
                                              int64_t C) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T_len * C) return;
  const int64_t t = i / C, c = i % C;
  float acc = dwpe[i];
  for (int64_t b = 0; b < B; ++b) acc += to_f32(dout[(b * T_len + t) * C + c]);
  dwpe[i] = acc;
}

// The token positions grouped by id, each group in token order, as one int32 array:
// [ids (n_used) | start (n_used + 1) | order (n)].
struct TokenGroups {
  std::vector<int32_t> packed;
  int64_t n_used = 0;
};

TokenGroups group_tokens(const int32_t* tokens, int64_t n) {
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return tokens[a] < tokens[b]; });
  std::vector<int32_t> ids, start;
  for (int64_t k = 0; k < n; ++k) {
    if (k == 0 || tokens[order[k]] != tokens[order[k - 1]]) {
      ids.push_back(tokens[order[k]]);
      start.push_back(static_cast<int32_t>(k));
    }
  }
  start.push_back(static_cast<int32_t>(n));
  TokenGroups g;
  g.n_used = static_cast<int64_t>(ids.size());
  g.packed = ids;
  g.packed.insert(g.packed.end(), start.begin(), start.end());
  g.packed.insert(g.packed.end(), order.begin(), order.end());
  return g;
}

}  // namespace

void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe) {
  const int64_t B = tokens.dim(0), T_len = tokens.dim(1), C = wte.dim(1);
  if (B * T_len * C == 0) return;
  const Tensor dev_tokens = on_device_i32(tokens);
  dispatch_cuda_float(wte.dtype(), "embedding_forward", [&](auto tag) {
    using T = decltype(tag);
    constexpr int kThreads = 256;
    const T* wpe_p = ptr_or_null<T>(wpe);
    const int32_t* tok = ptr<int32_t>(dev_tokens);
    if (can_use_packs<T>(C, {out.raw(), wte.raw(), wpe_p})) {
      constexpr int W = kPackWidth<T>;
      embedding_forward_kernel<T, W>
          <<<grid_for(B * T_len * C / W, kThreads), kThreads, 0, stream()>>>(
              ptr<T>(out), tok, ptr<T>(wte), wpe_p, B * T_len, T_len, C);
    } else {
      embedding_forward_kernel<T, 1><<<grid_for(B * T_len * C, kThreads), kThreads, 0, stream()>>>(
          ptr<T>(out), tok, ptr<T>(wte), wpe_p, B * T_len, T_len, C);
    }
    FT_CUDA_CHECK_LAUNCH();
  });
}

void embedding_backward(Tensor& dwte, Tensor& dwpe, const Tensor& dout, const Tensor& host_tokens) {
  const int64_t B = dout.dim(0), T_len = dout.dim(1), C = dout.dim(2), n = B * T_len;
  if (n * C == 0) return;
  FT_CHECK(n < (int64_t{1} << 31), "embedding_backward: ", n, " tokens exceed the int32 range");
  constexpr int kThreads = 256;
  dispatch_cuda_float(dout.dtype(), "embedding_backward", [&](auto tag) {
    using T = decltype(tag);
    if (dwte.defined()) {
      const TokenGroups g = group_tokens(host_tokens.data<int32_t>(), n);
      Tensor groups =
          Tensor::empty({static_cast<int64_t>(g.packed.size())}, DType::i32, Device::cuda);
      // From pageable memory: returns once the host buffer has been staged, so g may go.
      FT_CUDA_CHECK(cudaMemcpyAsync(groups.raw(), g.packed.data(), groups.nbytes(),
                                    cudaMemcpyHostToDevice, stream()));
      const int32_t* ids = ptr<int32_t>(groups);
      const dim3 grid(static_cast<unsigned>(g.n_used),
                      static_cast<unsigned>(ceil_div(C, kThreads)));
      embedding_backward_wte_kernel<T><<<grid, kThreads, 0, stream()>>>(
          ptr<float>(dwte), ptr<T>(dout), ids, ids + g.n_used, ids + 2 * g.n_used + 1, C);
      FT_CUDA_CHECK_LAUNCH();
    }
    if (dwpe.defined()) {
      const auto blocks = static_cast<unsigned>(ceil_div(T_len * C, kThreads));
      embedding_backward_wpe_kernel<T>
          <<<blocks, kThreads, 0, stream()>>>(ptr<float>(dwpe), ptr<T>(dout), B, T_len, C);
      FT_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace ft::nn::cuda
