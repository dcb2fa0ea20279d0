// Token + learned position embedding on the GPU.
//
// Forward: one thread per 16-byte pack of an output row gathers the token's wte pack and the
// position's wpe pack: B*T*C reads of each table and B*T*C writes.
// Backward, deterministic without atomics. dwte: CUB's radix sort orders the pairs (id,
// position) by id on the device, over only the id bits that [0, V) needs (16 for GPT-2); the sort
// is stable, so each id's positions stay in token order. Then one block per (sorted position,
// column chunk): the first position of each id's run adds the run's dout rows into the dwte row
// in token order, exactly the CPU's order of additions (bit-identical); the other blocks exit.
// The host reads no token value and every launch size comes from the shapes alone, so a CUDA
// graph can capture the step and replay it on new batches. dwpe: one thread per (position,
// column) adds the batch's rows in batch order. Traffic: dout read once per table, plus a few
// passes over B*T int32 pairs for the sort.
#include <cub/device/device_radix_sort.cuh>

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

// Block (k, chunk): sorted position k. Only the head of an id's run works, so every dwte row
// has one writer per column; a grid of one block per token (not per distinct id) keeps its size
// independent of the token values. The head first finds where its run ends, a block-wide
// window at a time (the ids are sorted, so the run's positions are a prefix of each window),
// so that the additions then walk known bounds: their loads are independent of the ids and
// overlap (a walk that tested each next id before its add chained three loads per token, 589
// us a GPT-2 step against 179 for bounds known in advance).
template <class T>
__global__ void embedding_backward_wte_kernel(float* dwte, const T* dout, const int32_t* sorted_ids,
                                              const int32_t* sorted_pos, int n, int64_t C) {
  const int k = blockIdx.x;
  const int32_t id = sorted_ids[k];
  if (k > 0 && sorted_ids[k - 1] == id) return;  // the whole block: not a run's head
  int end = k;
  for (;;) {
    const int j = end + static_cast<int>(threadIdx.x);
    const int same = __syncthreads_count(j < n && sorted_ids[j] == id);
    end += same;
    if (same < static_cast<int>(blockDim.x)) break;
  }
  const int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float* row = dwte + static_cast<int64_t>(id) * C + c;
  float acc = *row;
#pragma unroll 4
  for (int j = k; j < end; ++j) acc += to_f32(dout[static_cast<int64_t>(sorted_pos[j]) * C + c]);
  *row = acc;
}

__global__ void iota_kernel(int32_t* out, int n) {
  const int stride = gridDim.x * blockDim.x;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = i;
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

// The key bits a sort of ids in [0, vocab) must compare: enough for vocab - 1, at least one (so
// the bit range is never empty), and never int32's sign bit (ids are non-negative), so CUB's
// flip of that bit for signed keys does not enter the order.
int id_bits(int64_t vocab) {
  int bits = 1;
  while (bits < 31 && (int64_t{1} << bits) < vocab) ++bits;
  return bits;
}

// The token positions ordered by id; within one id in ascending (token) order.
struct SortedTokens {
  Tensor ids;        // [n] int32, ascending
  Tensor positions;  // [n] int32
};

SortedTokens sort_by_id(const Tensor& dev_tokens, int n, int64_t vocab) {
  constexpr int kThreads = 256;
  Tensor positions = Tensor::empty({n}, DType::i32, Device::cuda);
  iota_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(ptr<int32_t>(positions), n);
  FT_CUDA_CHECK_LAUNCH();
  SortedTokens s{Tensor::empty({n}, DType::i32, Device::cuda),
                 Tensor::empty({n}, DType::i32, Device::cuda)};
  const int end_bit = id_bits(vocab);
  const auto sort = [&](void* temp, size_t& temp_bytes) {
    return cub::DeviceRadixSort::SortPairs(temp, temp_bytes, ptr<int32_t>(dev_tokens),
                                           ptr<int32_t>(s.ids), ptr<int32_t>(positions),
                                           ptr<int32_t>(s.positions), n, 0, end_bit, stream());
  };
  size_t temp_bytes = 0;
  FT_CUDA_CHECK(sort(nullptr, temp_bytes));  // only sizes the scratch; no device work
  // Freed in stream order after the sort, like positions.
  Tensor temp =
      Tensor::empty({ceil_div(static_cast<int64_t>(temp_bytes), 4)}, DType::i32, Device::cuda);
  FT_CUDA_CHECK(sort(temp.raw(), temp_bytes));
  return s;
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
      const SortedTokens sorted =
          sort_by_id(on_device_i32(host_tokens), static_cast<int>(n), dwte.dim(0));
      const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(ceil_div(C, kThreads)));
      embedding_backward_wte_kernel<T><<<grid, kThreads, 0, stream()>>>(
          ptr<float>(dwte), ptr<T>(dout), ptr<int32_t>(sorted.ids), ptr<int32_t>(sorted.positions),
          static_cast<int>(n), C);
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
