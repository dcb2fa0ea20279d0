// Token + learned position embedding, CPU.
//
// Forward gathers one wte row (and one wpe row) per token: B*T*C reads and writes.
// Backward scatters dout rows back into dwte/dwpe. To stay deterministic without atomics the
// tokens are first bucketed by vocabulary id (a counting sort that keeps token order), then
// each vocabulary row is owned by one thread and sums its tokens in order; dwpe rows are owned
// by position and sum over the batch in order. The result does not depend on the thread count.
// CUDA calls (src/nn/cuda/embedding.cu) accept token ids on either device; they are checked
// (and, for the backward, grouped) on the host.
#include <vector>

#include "nn/checks.h"
#include "nn/layers.h"
#ifdef FLASHTRAIN_WITH_CUDA
#include "nn/cuda/cuda_layers.h"
#endif

namespace ft::nn {
namespace {

using detail::check_defined;
using detail::check_dtype;
using detail::check_on;

constexpr const char* kFwd = "embedding_forward";
constexpr const char* kBwd = "embedding_backward";

// The token ids on the CPU, for the range check and the CPU kernels. A CUDA call may keep its
// tokens on the GPU (they are copied here); a CPU call needs them on the CPU.
Tensor host_tokens(const Tensor& tokens, Device device, const char* fn) {
  FT_CHECK(tokens.defined(), fn, ": tokens is undefined");
  if (tokens.device() == Device::cpu) return tokens;
  FT_CHECK(device == Device::cuda, fn, ": tokens are on ", device_name(tokens.device()),
           " but the call runs on ", device_name(device));
  return tokens.to(Device::cpu);
}

// Tokens must be checked before any parallel region: an exception must not escape one.
void check_tokens(const Tensor& tokens, int64_t vocab, const char* fn) {
  check_defined(tokens, fn, "tokens");
  check_dtype(tokens, DType::i32, fn, "tokens");
  FT_CHECK(tokens.ndim() == 2, fn, ": tokens must be [B, T], got ", shape_str(tokens.shape()));
  const int32_t* tok = tokens.data<int32_t>();
  for (int64_t i = 0; i < tokens.numel(); ++i) {
    FT_CHECK(tok[i] >= 0 && tok[i] < vocab, fn, ": token id ", tok[i], " at position ", i,
             " outside [0, ", vocab, ")");
  }
}

template <class T>
void forward_kernel(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t B,
                    int64_t T_len, int64_t C) {
#pragma omp parallel for schedule(static) if (B * T_len * C >= detail::kParallelMinWork)
  for (int64_t bt = 0; bt < B * T_len; ++bt) {
    const T* tok_row = wte + tokens[bt] * C;
    const T* pos_row = wpe ? wpe + (bt % T_len) * C : nullptr;
    T* o = out + bt * C;
    for (int64_t c = 0; c < C; ++c) {
      acc_t<T> v = load(tok_row[c]);
      if (pos_row) v += load(pos_row[c]);
      store(o[c], v);
    }
  }
}

// Token indices grouped by vocabulary id, each group in token order (CSR layout).
struct TokenBuckets {
  std::vector<int64_t> start;     // [V + 1]: group v is order[start[v], start[v + 1])
  std::vector<int64_t> order;     // token positions
  std::vector<int32_t> used_ids;  // vocabulary ids that occur, ascending
};

TokenBuckets bucket_tokens(const int32_t* tokens, int64_t n, int64_t vocab) {
  TokenBuckets b;
  b.start.assign(static_cast<size_t>(vocab + 1), 0);
  for (int64_t i = 0; i < n; ++i) ++b.start[static_cast<size_t>(tokens[i]) + 1];
  for (int64_t v = 0; v < vocab; ++v) {
    if (b.start[v + 1] > 0) b.used_ids.push_back(static_cast<int32_t>(v));
    b.start[v + 1] += b.start[v];
  }
  b.order.resize(static_cast<size_t>(n));
  std::vector<int64_t> fill(b.start.begin(), b.start.end() - 1);
  for (int64_t i = 0; i < n; ++i) b.order[fill[tokens[i]]++] = i;
  return b;
}

template <class T>
void backward_wte(acc_t<T>* dwte, const T* dout, const TokenBuckets& b, int64_t C) {
  const auto n_used = static_cast<int64_t>(b.used_ids.size());
#pragma omp parallel for schedule(dynamic, 4) if (n_used * C >= detail::kParallelMinWork)
  for (int64_t u = 0; u < n_used; ++u) {
    const int32_t v = b.used_ids[u];
    acc_t<T>* row = dwte + static_cast<int64_t>(v) * C;
    for (int64_t k = b.start[v]; k < b.start[v + 1]; ++k) {
      const T* d = dout + b.order[k] * C;
      for (int64_t c = 0; c < C; ++c) row[c] += load(d[c]);
    }
  }
}

template <class T>
void backward_wpe(acc_t<T>* dwpe, const T* dout, int64_t B, int64_t T_len, int64_t C) {
#pragma omp parallel for schedule(static) if (B * T_len * C >= detail::kParallelMinWork)
  for (int64_t t = 0; t < T_len; ++t) {
    acc_t<T>* row = dwpe + t * C;
    for (int64_t b = 0; b < B; ++b) {
      const T* d = dout + (b * T_len + t) * C;
      for (int64_t c = 0; c < C; ++c) row[c] += load(d[c]);
    }
  }
}

}  // namespace

void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe) {
  const Device device = detail::call_device(wte, kFwd, "wte");
  detail::check_float(wte, kFwd, "wte");
  FT_CHECK(wte.ndim() == 2, kFwd, ": wte must be [V, C], got ", shape_str(wte.shape()));
  const Tensor tokens_cpu = host_tokens(tokens, device, kFwd);
  check_tokens(tokens_cpu, wte.dim(0), kFwd);
  const int64_t B = tokens.dim(0), T_len = tokens.dim(1), C = wte.dim(1);
  if (wpe.defined()) {
    check_on(wpe, device, kFwd, "wpe");
    check_dtype(wpe, wte.dtype(), kFwd, "wpe");
    FT_CHECK(wpe.ndim() == 2 && wpe.dim(1) == C, kFwd, ": wpe ", shape_str(wpe.shape()),
             " must be [maxT, ", C, "] to match wte ", shape_str(wte.shape()));
    FT_CHECK(T_len <= wpe.dim(0), kFwd, ": sequence length ", T_len, " exceeds wpe rows ",
             wpe.dim(0));
  }
  check_on(out, device, kFwd, "out");
  detail::check_shape(out, {B, T_len, C}, kFwd, "out");
  check_dtype(out, wte.dtype(), kFwd, "out");
#ifdef FLASHTRAIN_WITH_CUDA
  if (device == Device::cuda) return cuda::embedding_forward(out, tokens, wte, wpe);
#endif
  dispatch_float(wte.dtype(), [&](auto tag) {
    using T = decltype(tag);
    forward_kernel(out.data<T>(), tokens_cpu.data<int32_t>(), wte.data<T>(),
                   wpe.defined() ? wpe.data<T>() : nullptr, B, T_len, C);
  });
}

void embedding_backward(Tensor& dwte, Tensor& dwpe, const Tensor& dout, const Tensor& tokens) {
  const Device device = detail::call_device(dout, kBwd, "dout");
  detail::check_float(dout, kBwd, "dout");
  FT_CHECK(dout.ndim() == 3, kBwd, ": dout must be [B, T, C], got ", shape_str(dout.shape()));
  const int64_t B = dout.dim(0), T_len = dout.dim(1), C = dout.dim(2);
  FT_CHECK(tokens.defined() && tokens.shape() == Shape({B, T_len}), kBwd, ": tokens ",
           tokens.defined() ? shape_str(tokens.shape()) : "undefined", " must be [", B, ", ", T_len,
           "] to match dout ", shape_str(dout.shape()));
  const DType acc = detail::acc_dtype_of(dout.dtype());
  Tensor tokens_cpu;  // only the dwte part reads the ids
  if (dwte.defined()) {
    check_on(dwte, device, kBwd, "dwte");
    check_dtype(dwte, acc, kBwd, "dwte");
    FT_CHECK(dwte.ndim() == 2 && dwte.dim(1) == C, kBwd, ": dwte ", shape_str(dwte.shape()),
             " must be [V, ", C, "] to match dout ", shape_str(dout.shape()));
    tokens_cpu = host_tokens(tokens, device, kBwd);
    check_tokens(tokens_cpu, dwte.dim(0), kBwd);
  }
  if (dwpe.defined()) {
    check_on(dwpe, device, kBwd, "dwpe");
    check_dtype(dwpe, acc, kBwd, "dwpe");
    FT_CHECK(dwpe.ndim() == 2 && dwpe.dim(1) == C && dwpe.dim(0) >= T_len, kBwd, ": dwpe ",
             shape_str(dwpe.shape()), " must be [maxT >= ", T_len, ", ", C, "] to match dout ",
             shape_str(dout.shape()));
  }
#ifdef FLASHTRAIN_WITH_CUDA
  if (device == Device::cuda) return cuda::embedding_backward(dwte, dwpe, dout, tokens_cpu);
#endif
  dispatch_float(dout.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    if (dwte.defined()) {
      const TokenBuckets buckets =
          bucket_tokens(tokens_cpu.data<int32_t>(), B * T_len, dwte.dim(0));
      backward_wte(dwte.data<A>(), dout.data<T>(), buckets, C);
    }
    if (dwpe.defined()) backward_wpe(dwpe.data<A>(), dout.data<T>(), B, T_len, C);
  });
}

}  // namespace ft::nn
