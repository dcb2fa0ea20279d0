// The CUDA implementations behind the entry points of nn/layers.h and nn/adamw.h. Only the
// entry points call these: they check every argument (shapes, dtypes, one device, token and
// target ranges) first, so these functions assume valid arguments. They queue work on
// ft::cuda::current_stream() and return without synchronising unless a result must reach the
// host (global_grad_norm). Compute dtypes are fp32 and bf16; fp64 is rejected with a clear
// error. Same conventions as layers.h: parameter gradients are fp32 and accumulated (+=) or
// written (GradStore::overwrite), input gradients are written (=), an undefined tensor is
// skipped.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "nn/adamw.h"
#include "nn/layers.h"

namespace ft::nn::cuda {

// ---- layers (src/nn/cuda: embedding, norms, activations, rope, qkv, classifier, adamw) ----

// tokens: int32 [B, T] on the GPU or the CPU (copied over). host_tokens: the same ids on the
// CPU (backward buckets them there, which keeps it deterministic without atomics).
void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe);
void embedding_backward(Tensor& dwte, Tensor& dwpe, const Tensor& dout, const Tensor& host_tokens);

void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& w,
                       const Tensor& b, double eps);
void layernorm_backward(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dout, const Tensor& x,
                        const Tensor& w, const Tensor& mean, const Tensor& rstd, GradStore store);
void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& x, const Tensor& w, double eps);
void rmsnorm_backward(Tensor& dx, Tensor& dw, const Tensor& dout, const Tensor& x, const Tensor& w,
                      const Tensor& rstd, GradStore store);
// x_out = a + b, out = norm(x_out) in one kernel; mean undefined: RMSNorm (bias undefined too).
void add_norm_forward(Tensor& x_out, Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& a,
                      const Tensor& b, const Tensor& w, const Tensor& bias, double eps);
// dresidual += dx of the norm (dx rounded to the compute dtype first); mean undefined: RMSNorm;
// db may be undefined.
void norm_backward_add(Tensor& dresidual, Tensor& dw, Tensor& db, const Tensor& dout,
                       const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                       GradStore store);
// For tests and benchmarks: false sends every norm row to the streaming kernels, the register
// kernels' twins (the same bits but for the parameter gradients' order); returns the previous
// setting. Not for use while another thread launches norms.
bool set_norm_rows_in_registers(bool enabled);
// The warps a row of C elements takes on the norms' register path (1 or 4) when its pointers
// are 16-byte aligned, or 0 where it streams (every row while the register path is off).
int norm_register_row_warps(DType dtype, int64_t C);

void gelu_forward(Tensor& out, const Tensor& x);
void gelu_backward(Tensor& dx, const Tensor& dout, const Tensor& x);
void swiglu_forward(Tensor& out, const Tensor& gate, const Tensor& up);
void swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up);

// Fills table.cos_device / sin_device (fp32 copies of the fp64 table on the GPU).
void upload_rope_table(RopeTable& table);
// direction +1: forward rotation, -1: backward (inverse) rotation; out may alias x.
// Heads [0, rotated) of each position of x [B, T, H, D].
void rope_rotate(Tensor& out, const Tensor& x, const RopeTable& table, int64_t rotated,
                 int direction);

// Arguments checked by nn::decode_attention (layers.h).
void decode_attention(Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                      int64_t first_key, int64_t last_key, double scale);

void split_qkv(Tensor& q, Tensor& k, Tensor& v, const Tensor& qkv);
void merge_qkv(Tensor& dqkv, const Tensor& dq, const Tensor& dk, const Tensor& dv);
void add(Tensor& out, const Tensor& a, const Tensor& b);

// targets: int32 [N] on the GPU or the CPU (copied over), already range-checked.
void softmax_cross_entropy(Tensor& losses, Tensor& dlogits, const Tensor& logits,
                           const Tensor& targets, int64_t V, double dloss);

// The per-step scalars of AdamW, formed in fp64 and rounded to fp32 on the host exactly as the
// CPU update forms them (src/nn/adamw.cpp), so both devices run the same fp32 operations.
struct AdamWScalars {
  float decay_mul, one_minus_b1, b2, one_minus_b2, neg_step_size, bc2_sqrt, eps, grad_scale;
};
void adamw_update(Tensor& master, const Tensor& grad, Tensor& m, Tensor& v, const AdamWScalars& s);
// adamw_update for every tensor in ONE launch (s.decay_mul applies to tensors with decay,
// no_decay_mul to the others), writing each tensor's compute copy (bf16 or fp32, when defined
// and not master itself) in the same kernel. Arguments checked by nn::adamw_update_all.
void adamw_update_all(const std::vector<AdamWTensor>& tensors, const AdamWScalars& s,
                      float no_decay_mul);
// The same with s.grad_scale formed by the kernel from the device value *norm: max_norm / norm
// when max_norm > 0 and norm > max_norm, else 1, in fp64 and then rounded to fp32, as the host
// forms it (nn::clip_scale): no host wait for the norm.
void adamw_update_all(const std::vector<AdamWTensor>& tensors, const AdamWScalars& s,
                      float no_decay_mul, const double* norm, double max_norm);
// The same with the step's decay factor, step size and bias correction read by the kernel from
// the device copy of nn::write_adamw_step_values' tensor (s's fields for them are not used), so
// a captured graph takes each replay's lr.
void adamw_update_all(const std::vector<AdamWTensor>& tensors, const AdamWScalars& s,
                      float no_decay_mul, const double* norm, double max_norm,
                      const double* step_values);
// sqrt(sum of squares) of fp32/bf16 GPU tensors as a one-element fp64 GPU tensor: fp64
// accumulation, a deterministic two-stage reduction, the square root taken on the device
// (correctly rounded, as std::sqrt); nothing read back.
Tensor global_grad_norm_tensor(const std::vector<Tensor>& grads);

// ---- linear (src/nn/cuda/linear.cu, cuBLASLt) ----

// out = inp @ w^T + b through cuBLASLt with the bias in its epilogue (b may be undefined).
void linear_forward(Tensor& out, const Tensor& inp, const Tensor& w, const Tensor& b);
// pre = inp @ w^T + b, out = gelu_tanh(pre): one GEMM with the GELU_AUX_BIAS epilogue when b
// is defined and OC % 8 == 0, else linear_forward + gelu_forward.
void linear_gelu_forward(Tensor& pre, Tensor& out, const Tensor& inp, const Tensor& w,
                         const Tensor& b);
// dinp = dout @ w; dw += dout^T @ inp (fp32, beta = 1; overwrite: beta = 0); db += column sums
// of dout (deterministic; overwrite: =). Undefined dinp, dw or db are skipped.
void linear_backward(Tensor& dinp, Tensor& dw, Tensor& db, const Tensor& dout, const Tensor& inp,
                     const Tensor& w, GradStore store);
// nn::linear_gelu_backward: dpre = (dout @ w) * gelu'(pre) in the input-gradient GEMM's DGELU
// epilogue when cuBLASLt has one (IC % 8 == 0), else the GEMM and gelu_backward in place; then
// dw, db as linear_backward.
void linear_gelu_backward(Tensor& dpre, Tensor& dw, Tensor& db, const Tensor& dout,
                          const Tensor& act, const Tensor& w, const Tensor& pre, GradStore store);

}  // namespace ft::nn::cuda
