// Fused softmax + cross-entropy over padded logits, CPU, and a sampling softmax.
//
// Each row (one token): max over its first V columns, then the sum of exp(x - max) (numerically
// stable), the loss logsumexp - x[target], and with dlogits the gradient (softmax - onehot) *
// dloss; each logit is read before its gradient overwrites it, so dlogits may alias logits. Padding
// columns [V, Vp) never enter the softmax and get gradient 0. Rows are independent: parallel over
// rows. Traffic: logits read three times (mostly from cache for one row), dlogits written once.
// fp32 and bf16 rows take fast_row: exp from nn/cpu_exp.h and sums in fixed lanes, loops the
// compiler vectorises (2.6x the std::exp loop on a 512 x 50304 batch); fp64 keeps std::exp.
// CUDA logits go to src/nn/cuda/classifier.cu (targets may stay on the CPU); softmax_row copies
// one CUDA row to the host.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "nn/checks.h"
#include "nn/cpu_exp.h"
#include "nn/layers.h"
#ifdef FLASHTRAIN_WITH_CUDA
#include "nn/cuda/cuda_layers.h"
#endif

namespace ft::nn {
namespace {

constexpr const char* kCe = "softmax_cross_entropy";

template <class A>
struct RowStats {
  A max, sum_exp;  // sum of exp(x - max) over the first V columns
};

template <class T>
RowStats<acc_t<T>> row_stats(const T* row, int64_t V) {
  using A = acc_t<T>;
  A mx = -std::numeric_limits<A>::infinity();
  for (int64_t j = 0; j < V; ++j) mx = std::max(mx, load(row[j]));
  A sum = 0;
  for (int64_t j = 0; j < V; ++j) sum += std::exp(load(row[j]) - mx);
  return {mx, sum};
}

// One row's loss and, with drow, its gradient, for fp32 accumulation (fp32 and bf16 logits):
// every pass a loop the compiler vectorises. exp(x - max) is computed once per logit into e
// (drow itself for fp32, a per-thread row otherwise), summed in kLanes fixed partial sums (the
// same order every run), then scaled in place.
template <class T>
float fast_row(const T* row, T* drow, float* e, int64_t Vp, int64_t V, int32_t target,
               float dloss) {
  constexpr int64_t kLanes = 16;
  float lane[kLanes];
  std::fill(lane, lane + kLanes, -std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + kLanes <= V; j += kLanes) {
    for (int64_t k = 0; k < kLanes; ++k) lane[k] = std::max(lane[k], load(row[j + k]));
  }
  float mx = *std::max_element(lane, lane + kLanes);
  for (; j < V; ++j) mx = std::max(mx, load(row[j]));
  const float shifted_target = load(row[target]) - mx;  // read before drow may overwrite it
  for (int64_t i = 0; i < V; ++i) e[i] = cpu::exp_vectorizable(load(row[i]) - mx);
  std::fill(lane, lane + kLanes, 0.0f);
  for (j = 0; j + kLanes <= V; j += kLanes) {
    for (int64_t k = 0; k < kLanes; ++k) lane[k] += e[j + k];
  }
  float sum = 0.0f;
  for (int64_t k = 0; k < kLanes; ++k) sum += lane[k];
  for (; j < V; ++j) sum += e[j];
  if (drow) {
    const float factor = dloss / sum;
    for (int64_t i = 0; i < V; ++i) store(drow[i], e[i] * factor);
    store(drow[target], load(drow[target]) - dloss);
    for (int64_t i = V; i < Vp; ++i) store(drow[i], 0.0f);
  }
  return std::log(sum) - shifted_target;
}

template <class T>
void cross_entropy_kernel(acc_t<T>* losses, T* dlogits, const T* logits, const int32_t* targets,
                          int64_t N, int64_t Vp, int64_t V, double dloss) {
  using A = acc_t<T>;
  if constexpr (std::is_same_v<A, float>) {
#pragma omp parallel if (N * Vp >= detail::kParallelMinWork)
    {
      // fp32 keeps exp(x - max) in dlogits itself; bf16 (and a loss-only call) in this row.
      std::vector<float> scratch;
#pragma omp for schedule(static)
      for (int64_t r = 0; r < N; ++r) {
        T* drow = dlogits ? dlogits + r * Vp : nullptr;  // may alias the logits row
        float* e = nullptr;
        if constexpr (std::is_same_v<T, float>) e = drow;
        if (e == nullptr) {
          scratch.resize(static_cast<size_t>(V));
          e = scratch.data();
        }
        losses[r] =
            fast_row(logits + r * Vp, drow, e, Vp, V, targets[r], static_cast<float>(dloss));
      }
    }
    return;
  }
  // fp64: std::exp, the reference the fast path is tested against.
#pragma omp parallel for schedule(static) if (N * Vp >= detail::kParallelMinWork)
  for (int64_t r = 0; r < N; ++r) {
    const T* row = logits + r * Vp;
    const int32_t target = targets[r];
    T* drow = dlogits ? dlogits + r * Vp : nullptr;  // may alias row
    // Where dlogits can hold exp(x - max) exactly as computed (not bf16), keep it there and
    // scale it afterwards: one pass of exp per row instead of two.
    constexpr bool keep_exp = !std::is_same_v<T, bf16>;
    if (keep_exp && drow) {
      A mx = -std::numeric_limits<A>::infinity();
      for (int64_t j = 0; j < V; ++j) mx = std::max(mx, load(row[j]));
      const A shifted_target = load(row[target]) - mx;
      A sum = 0;
      for (int64_t j = 0; j < V; ++j) {
        const A e = std::exp(load(row[j]) - mx);  // row[j] is read before drow[j] is written
        sum += e;
        store(drow[j], e);
      }
      losses[r] = std::log(sum) - shifted_target;
      const A inv_sum = A(1) / sum, scale = static_cast<A>(dloss);
      for (int64_t j = 0; j < V; ++j) store(drow[j], load(drow[j]) * inv_sum * scale);
      store(drow[target], load(drow[target]) - scale);
      for (int64_t j = V; j < Vp; ++j) store(drow[j], A(0));
      continue;
    }
    const auto [mx, sum] = row_stats(row, V);
    // logsumexp - x[t] as log(sum) - (x[t] - max): the shifted logit is small, so large
    // logits lose no precision to cancellation.
    losses[r] = std::log(sum) - (load(row[target]) - mx);
    if (!drow) continue;
    const A inv_sum = A(1) / sum, scale = static_cast<A>(dloss);
    for (int64_t j = 0; j < V; ++j) {
      const A p = std::exp(load(row[j]) - mx) * inv_sum;
      store(drow[j], (p - (j == target ? A(1) : A(0))) * scale);
    }
    for (int64_t j = V; j < Vp; ++j) store(drow[j], A(0));
  }
}

// Targets are checked before the parallel region: an exception must not escape one. A CUDA call
// may keep its targets on the GPU: they are copied to the host for the check. Returns the
// targets on the CPU.
Tensor check_targets(const Tensor& targets, Device device, int64_t N, int64_t V) {
  FT_CHECK(targets.defined(), kCe, ": targets is undefined");
  if (targets.device() != Device::cpu) {
    FT_CHECK(device == Device::cuda, kCe, ": targets are on ", device_name(targets.device()),
             " but the call runs on ", device_name(device));
    return check_targets(targets.to(Device::cpu), device, N, V);
  }
  detail::check_defined(targets, kCe, "targets");
  detail::check_dtype(targets, DType::i32, kCe, "targets");
  FT_CHECK(targets.numel() == N, kCe, ": targets ", shape_str(targets.shape()), " must hold ", N,
           " values, one per logits row");
  const int32_t* t = targets.data<int32_t>();
  for (int64_t i = 0; i < N; ++i) {
    FT_CHECK(t[i] >= 0 && t[i] < V, kCe, ": target ", t[i], " at row ", i, " outside [0, ", V, ")");
  }
  return targets;
}

}  // namespace

void softmax_cross_entropy(Tensor& losses, Tensor& dlogits, const Tensor& logits,
                           const Tensor& targets, int64_t V, double dloss) {
  const Device device = detail::call_device(logits, kCe, "logits");
  detail::check_float(logits, kCe, "logits");
  FT_CHECK(logits.ndim() >= 1, kCe, ": logits must be [N, Vp], got ", shape_str(logits.shape()));
  const int64_t Vp = logits.dim(-1), N = detail::rows_of(logits);
  FT_CHECK(V > 0 && V <= Vp, kCe, ": V ", V, " must be in [1, ", Vp, "] for logits ",
           shape_str(logits.shape()));
  const Tensor targets_cpu = check_targets(targets, device, N, V);
  detail::check_on(losses, device, kCe, "losses");
  detail::check_dtype(losses, detail::acc_dtype_of(logits.dtype()), kCe, "losses");
  FT_CHECK(losses.numel() == N, kCe, ": losses ", shape_str(losses.shape()), " must hold ", N,
           " values, one per row of logits ", shape_str(logits.shape()));
  if (dlogits.defined()) detail::check_like(dlogits, logits, kCe, "dlogits", "logits");
#ifdef FLASHTRAIN_WITH_CUDA
  if (device == Device::cuda) {
    return cuda::softmax_cross_entropy(losses, dlogits, logits, targets, V, dloss);
  }
#endif
  dispatch_float(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_kernel(losses.data<acc_t<T>>(), dlogits.defined() ? dlogits.data<T>() : nullptr,
                         logits.data<T>(), targets_cpu.data<int32_t>(), N, Vp, V, dloss);
  });
}

void softmax_row(std::vector<float>& probs, const Tensor& logits, int64_t row, int64_t V,
                 double temperature) {
  constexpr const char* fn = "softmax_row";
  detail::call_device(logits, fn, "logits");
  detail::check_float(logits, fn, "logits");
  const int64_t Vp = logits.dim(-1), N = detail::rows_of(logits);
  FT_CHECK(row >= 0 && row < N, fn, ": row ", row, " outside [0, ", N, ") for logits ",
           shape_str(logits.shape()));
  FT_CHECK(V > 0 && V <= Vp, fn, ": V ", V, " must be in [1, ", Vp, "]");
  FT_CHECK(temperature > 0, fn, ": temperature ", temperature, " must be > 0");
  if (logits.device() != Device::cpu) {
    // Sampling is off the hot path: bring the one row over and use the CPU code.
    const Tensor host_row = logits.view({N, Vp}).slice(row, row + 1).to(Device::cpu);
    return softmax_row(probs, host_row, 0, V, temperature);
  }
  probs.resize(static_cast<size_t>(V));
  dispatch_float(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    // Sampling is off the hot path: compute in fp64 for every dtype.
    const T* x = logits.data<T>() + row * Vp;
    const double scale = 1.0 / temperature;
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, static_cast<double>(load(x[j])) * scale);
    double sum = 0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(static_cast<double>(load(x[j])) * scale - mx);
    for (int64_t j = 0; j < V; ++j) {
      probs[j] = static_cast<float>(std::exp(static_cast<double>(load(x[j])) * scale - mx) / sum);
    }
  });
}

}  // namespace ft::nn
