// Layers with explicit forward and backward passes, on Tensors.
//
// Conventions (every function here follows them):
// - Activations and weights are in the compute dtype: fp32, bf16 or fp64 (fp64 for gradient
//   checks). Arithmetic accumulates in acc_t<T> (fp32 for fp32 and bf16, fp64 for fp64).
// - Parameter gradients (dw, db, ...) are in the accumulation dtype (fp32, or fp64 when the
//   compute dtype is fp64) and are ACCUMULATED (+=), so micro-batches add up; the calls that
//   take a GradStore may instead OVERWRITE them (a step's first micro-batch, whose gradients
//   then need no zeroing beforehand), with the bits accumulating into zeros gives.
// - Input gradients (dx, dinp, ...) are WRITTEN (=). An undefined input-gradient tensor means
//   "not needed" and is skipped.
// - Shapes are checked; a mismatch throws ft::Error naming both shapes.
// - Every tensor of a call is on one device (CPU or CUDA; token and target ids may stay on the
//   CPU for a CUDA call). CUDA calls dispatch from these entry points to src/nn/cuda after the
//   same argument checks; CUDA computes in fp32 and bf16 only (fp64 is a clear error).
#pragma once

#include <vector>

#include "core/tensor.h"

namespace ft::nn {

// How a backward call stores a parameter gradient: added to what the tensor holds, or written
// over it. Every sum behind a parameter gradient starts from +0 and adds, so it is never -0;
// overwrite therefore gives the bits that accumulate gives into a zeroed gradient (0 + s == s).
enum class GradStore { accumulate, overwrite };

// Token + optional learned position embedding.
// tokens int32 [B, T]; wte [V, C]; wpe [maxT, C] or undefined; out [B, T, C].
void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe);
// Deterministic: each embedding row sums its contributions in token order (no atomics).
void embedding_backward(Tensor& dwte, Tensor& dwpe, const Tensor& dout, const Tensor& tokens);

// out [N, OC] = inp [N, IC] @ w [OC, IC]^T + b [OC] (b may be undefined). Leading dims of inp
// and out are flattened into N.
void linear_forward(Tensor& out, const Tensor& inp, const Tensor& w, const Tensor& b);
// dinp = dout @ w; dw += dout^T @ inp; db += sum over rows of dout (db may be undefined);
// dw, db written instead with GradStore::overwrite.
void linear_backward(Tensor& dinp, Tensor& dw, Tensor& db, const Tensor& dout, const Tensor& inp,
                     const Tensor& w, GradStore store = GradStore::accumulate);

// Linear layer with GELU (tanh) in its epilogue: pre = inp @ w^T + b (kept for backward),
// out = gelu(pre), out shaped like pre. CPU: linear_forward then gelu_forward (bit-identical).
// CUDA: one cuBLASLt GEMM with the GELU_AUX_BIAS epilogue when b is defined and OC % 8 == 0
// (cuBLASLt's alignment rule for the pre-GELU output), else the two unfused calls.
void linear_gelu_forward(Tensor& pre, Tensor& out, const Tensor& inp, const Tensor& w,
                         const Tensor& b);
// The backward of a linear layer whose input is act = gelu(pre) (GPT-2's MLP down projection
// after linear_gelu_forward), through the GELU: dpre = (dout @ w) * gelu'(pre) (written: the
// gradient of the up projection's output), dw += dout^T @ act, db += column sums of dout (dw,
// db may be undefined). CPU: linear_backward then gelu_backward, bit-identical to those calls.
// CUDA: the GELU backward rides in the input-gradient GEMM's epilogue where cuBLASLt has it
// (dpre rounded once instead of twice in bf16).
void linear_gelu_backward(Tensor& dpre, Tensor& dw, Tensor& db, const Tensor& dout,
                          const Tensor& act, const Tensor& w, const Tensor& pre,
                          GradStore store = GradStore::accumulate);

// LayerNorm over the last dimension C. mean, rstd: [N] in the accumulation dtype (saved for
// backward).
void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& w,
                       const Tensor& b, double eps);
// dw, db: accumulated, or written with GradStore::overwrite (likewise in every norm backward).
void layernorm_backward(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dout, const Tensor& x,
                        const Tensor& w, const Tensor& mean, const Tensor& rstd,
                        GradStore store = GradStore::accumulate);

// RMSNorm over the last dimension: out = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps).
void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& x, const Tensor& w, double eps);
void rmsnorm_backward(Tensor& dx, Tensor& dw, const Tensor& dout, const Tensor& x, const Tensor& w,
                      const Tensor& rstd, GradStore store = GradStore::accumulate);

// Residual add fused with the norm that reads its result (the transformer's
// `x = a + b; h = norm(x)`): x_out = a + b in the compute dtype, h = norm(x_out), statistics
// saved as by the unfused norm. Bit-identical to add() then *norm_forward() on the CPU; one
// kernel on CUDA (a and b read once, x_out and h written once). h must not alias x_out, a or b;
// x_out may alias a or b.
void add_layernorm_forward(Tensor& x_out, Tensor& h, Tensor& mean, Tensor& rstd, const Tensor& a,
                           const Tensor& b, const Tensor& w, const Tensor& bias, double eps);
void add_rmsnorm_forward(Tensor& x_out, Tensor& h, Tensor& rstd, const Tensor& a, const Tensor& b,
                         const Tensor& w, double eps);
// Norm backward that ACCUMULATES its input gradient into the residual gradient:
// dresidual += dx (dx rounded to the compute dtype first, exactly as *norm_backward() then
// add() would form it: bit-identical on the CPU). dw/db as in *norm_backward(). dresidual must be
// defined and must not alias dout or x.
void layernorm_backward_add(Tensor& dresidual, Tensor& dw, Tensor& db, const Tensor& dout,
                            const Tensor& x, const Tensor& w, const Tensor& mean,
                            const Tensor& rstd, GradStore store = GradStore::accumulate);
void rmsnorm_backward_add(Tensor& dresidual, Tensor& dw, const Tensor& dout, const Tensor& x,
                          const Tensor& w, const Tensor& rstd,
                          GradStore store = GradStore::accumulate);

// GELU, tanh approximation (GPT-2's).
void gelu_forward(Tensor& out, const Tensor& x);
void gelu_backward(Tensor& dx, const Tensor& dout, const Tensor& x);

// SwiGLU: out = silu(gate) * up, all the same shape.
void swiglu_forward(Tensor& out, const Tensor& gate, const Tensor& up);
void swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up);

// Rotary position embedding on x [B, T, H, D], rotating interleaved pairs (x[2i], x[2i+1]) by
// angle t * freq_i (Meta's and llm.c's layout). The table holds cos and sin [maxT, D/2] in fp64
// and is built once per model. For CUDA tensors the table also needs its GPU copy
// (make_rope_table(..., Device::cuda)).
struct RopeTable {
  Tensor cos, sin;  // fp64 [max_seq_len, head_dim / 2], CPU
  // fp32 [max_seq_len, head_dim / 2] on the GPU (the values the kernels round the fp64 table
  // to); undefined unless the table was built for Device::cuda.
  Tensor cos_device, sin_device;
  int64_t max_seq_len = 0, head_dim = 0;
};
// freq_i = theta^(-2i/D); llama31_scaling applies Llama 3.1's frequency scaling
// (factor 8, low/high frequency factors 1 and 4, original context 8192). device == cuda also
// fills cos_device / sin_device; the CPU tables are always there.
RopeTable make_rope_table(int64_t max_seq_len, int64_t head_dim, double theta, bool llama31_scaling,
                          Device device = Device::cpu);
void rope_forward(Tensor& out, const Tensor& x, const RopeTable& table);  // out may alias x
// The same rotation for positions offset .. offset + T - 1 (generation with a KV cache: the new
// tokens come after `offset` cached ones); offset + T must not exceed the table.
void rope_forward(Tensor& out, const Tensor& x, const RopeTable& table, int64_t offset);
void rope_backward(Tensor& dx, const Tensor& dout, const RopeTable& table);  // dx may alias dout
// In place, only heads [0, heads) of each position of x [B, T, H, D], positions from 0: a fused
// QKV buffer viewed as [B, T, Hq + 2 Hkv, D] with heads = Hq + Hkv rotates q and k where the
// projection wrote them and leaves v as it is. The same values as rope_forward/rope_backward on
// the split q and k, bit for bit.
void rope_forward_heads(Tensor& x, const RopeTable& table, int64_t heads);
void rope_backward_heads(Tensor& dx, const RopeTable& table, int64_t heads);

// Split a fused projection qkv [B, T, (Hq + 2 Hkv) * D] into q [B, T, Hq, D], k and v
// [B, T, Hkv, D]; merge is its backward (writes dqkv).
void split_qkv(Tensor& q, Tensor& k, Tensor& v, const Tensor& qkv);
void merge_qkv(Tensor& dqkv, const Tensor& dq, const Tensor& dk, const Tensor& dv);

// Attention of one new query per head over a KV cache (the decode step of generation, one
// sequence): q and out [Hq, D]; k_cache and v_cache [capacity, Hkv, D] (Hq a multiple of Hkv;
// query head h reads kv head h / (Hq / Hkv)); the query attends to cached keys
// first_key..last_key (inclusive: the caller applies the causal, window and document limits).
// Softmax of scale * q.k in fp32, out in q's dtype. No backward (inference only).
void decode_attention(Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                      int64_t first_key, int64_t last_key, double scale);

// out = a + b (elementwise, same shapes; out may alias a or b).
void add(Tensor& out, const Tensor& a, const Tensor& b);

// Fused classifier: logits [N, Vp] -> per-row loss [N] (accumulation dtype), softmax over the
// first V columns only (columns >= V are padding). When dlogits is defined it receives
// (softmax - onehot(target)) * dloss for columns < V and 0 for padding; it may alias logits.
// targets int32 [N], each in [0, V).
void softmax_cross_entropy(Tensor& losses, Tensor& dlogits, const Tensor& logits,
                           const Tensor& targets, int64_t V, double dloss);

// Softmax over the first V columns of one row of logits (for sampling); probs fp32 [V].
void softmax_row(std::vector<float>& probs, const Tensor& logits, int64_t row, int64_t V,
                 double temperature);

}  // namespace ft::nn
