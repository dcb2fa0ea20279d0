// The attention API: one problem description, three implementations.
//
//   q [B, S, Hq, D], k and v [B, S, Hkv, D]; or all three inside one fused QKV buffer
//   [B, S, (Hq + 2 Hkv) * D], read in place (forward_packed, below)
//   o like q; lse [B, Hq, S] fp32: log-sum-exp (natural log) of each query row's scaled scores
//   Hq % Hkv == 0: query head h reads kv head h / (Hq / Hkv) (grouped-query attention)
//
// Masks combine: causal (key <= query), sliding window W (key >= query - (W - 1); with causal
// this keeps the last W keys including the query itself; alone it bounds keys from below only),
// segment ids
// int32 [B, S] (attend only within the same id; id -1 is padding: it attends nothing and gets
// zero output, lse = -inf, and zero gradient).
//
//   reference  fp64, explicit S x S, CPU only: the oracle for tests and checks
//   naive      the baseline: GEMM, mask + softmax, GEMM; keeps the S x S probabilities
//   flash      tiled online softmax; never allocates anything of size S x S
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace ft::attention {

inline constexpr int64_t kMaxHeadDim = 256;  // head dims: multiples of 8 up to this

enum class Impl { reference, naive, flash };
const char* impl_name(Impl impl);
Impl parse_impl(const std::string& s);  // reference|naive|flash

// The mask, as a small value: the segment ids (if any) are passed beside it as a tensor.
struct Mask {
  bool causal = false;
  int64_t window = 0;         // 0: no window; W > 0 keeps keys >= query - W + 1
  bool has_segments = false;  // segment ids int32 [B, S] are given

  bool any() const { return causal || window > 0 || has_segments; }
  std::string describe() const;  // "causal+window=512+segments", "none"
};

struct Problem {
  int64_t batch = 0, seq_len = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  DType dtype = DType::f32;  // of q, k, v, o, do, dq, dk, dv: fp32 or bf16 (fp64 for reference)
  double scale = 0.0;        // 0 means 1 / sqrt(head_dim)
  Mask mask;
  // Backward: the same inputs give bit-identical dq, dk, dv on every run. The CPU and fp32 CUDA
  // paths always do; the bf16 CUDA flash backward does on the tma path (sm90), which then adds
  // the dQ parts in a fixed order (at a cost); the other bf16 paths refuse it.
  bool deterministic = false;

  double effective_scale() const;
  int64_t group_size() const { return q_heads / kv_heads; }
  // Throws ft::Error naming the bad value and what is allowed (D <= 256 and a multiple of 8,
  // Hq % Hkv == 0, positive sizes, window >= 0).
  void validate() const;
  // Number of (query, key) pairs the mask lets through, summed over batch and query heads
  // (segment ids, when present, must be given to count them).
  int64_t attended_pairs(const Tensor& segment_ids = {}) const;
  std::string describe() const;
};

// Build a problem from q, k, v shapes; checks that the shapes agree.
Problem make_problem(const Tensor& q, const Tensor& k, const Tensor& v, const Mask& mask,
                     double scale = 0.0);

struct ForwardOutput {
  Tensor o;      // like q
  Tensor lse;    // [B, Hq, S] fp32 (fp64 from reference and for fp64 problems)
  Tensor saved;  // what an implementation keeps for backward (naive: the probabilities)
};

struct Gradients {
  Tensor dq, dk, dv;  // like q, k, v; dk and dv sum over the query heads sharing a kv head
};

struct KernelConfig;  // kernel_config.h

// segment_ids: int32 [B, S] when problem.mask.has_segments, otherwise an undefined Tensor.
// config: the CUDA flash kernels' tiles (kernel_config.h); null means the device's default.
// Other implementations ignore it. A config that can_implement() refuses is an ft::Error
// carrying its reason; nothing is launched.
ForwardOutput forward(Impl impl, const Problem& problem, const Tensor& q, const Tensor& k,
                      const Tensor& v, const Tensor& segment_ids = {},
                      const KernelConfig* config = nullptr);

Gradients backward(Impl impl, const Problem& problem, const Tensor& q, const Tensor& k,
                   const Tensor& v, const ForwardOutput& fwd, const Tensor& dout,
                   const Tensor& segment_ids = {}, const KernelConfig* config = nullptr);

// q, k and v read where a fused QKV projection wrote them: qkv [B, S, (Hq + 2 Hkv) * D] holds,
// per position, the Hq query heads, then the Hkv key heads, then the Hkv value heads (D
// elements each: the output of one projection whose weight stacks W_q, W_k, W_v). The results
// are those of forward() and backward() on the three parts split out, bit for bit: o and lse as
// forward() returns them (dense), and backward_packed() writes dq, dk, dv into dqkv (shaped like
// qkv; fp64 from reference, otherwise the problem's dtype) in the same layout, every element.
ForwardOutput forward_packed(Impl impl, const Problem& problem, const Tensor& qkv,
                             const Tensor& segment_ids = {}, const KernelConfig* config = nullptr);
void backward_packed(Impl impl, const Problem& problem, const Tensor& qkv, const ForwardOutput& fwd,
                     const Tensor& dout, Tensor& dqkv, const Tensor& segment_ids = {},
                     const KernelConfig* config = nullptr);
// Whether `impl` reads a packed qkv in place on `device`: every CPU implementation does, and on
// the GPU flash does where its kernels take strided rows (bf16 on the tma path, sm90; the
// direction's configuration decides, call by call). Elsewhere the packed calls copy q, k and v
// out first and the gradients back in: the same results, with the copies a caller that splits
// the buffer itself would make, so a caller loses nothing by handing flash the fused buffer.
bool reads_packed_in_place(Impl impl, Device device);

// True when key position j may be attended by query position i of batch row b.
// The single definition of the mask that every implementation agrees with.
inline bool allowed(const Mask& mask, const int32_t* segment_row, int64_t i, int64_t j) {
  if (mask.causal && j > i) return false;
  if (mask.window > 0 && j < i - (mask.window - 1)) return false;
  if (mask.has_segments) {
    const int32_t si = segment_row[i];
    if (si < 0 || segment_row[j] != si) return false;
  }
  return true;
}

}  // namespace ft::attention
