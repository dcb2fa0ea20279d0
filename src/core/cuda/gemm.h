// Matrix products on the GPU through cuBLASLt (one handle and workspace per process, the
// workspace taken from the stream-ordered pool). Row-major like every tensor here:
//   C[M, N] = alpha * op(A)[M, K] * op(B)[K, N] + beta * C (+ bias[N] broadcast over rows)
// dtype: fp32 (true fp32: TF32 only when allow_tf32(true) was called) or bf16 (fp32
// accumulation and scaling; C in bf16, or fp32 when c_dtype is f32).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace ft::cuda {

// What runs on the product in cuBLASLt's epilogue, before C is written:
// - bias: C = product + bias[N]; bias_gelu: pre_gelu = product + bias, C = gelu(pre_gelu)
//   (tanh GELU, GPT-2's); bias and pre_gelu have C's dtype.
// - gelu_grad: C = product * gelu'(pre_gelu) (pre_gelu read, C's layout and dtype): the GELU's
//   backward in the input-gradient GEMM of the layer after it.
// cuBLASLt does not have gelu_grad for every GPU, dtype and shape: try_gemm says so (false),
// and the caller falls back to its own kernels.
enum class Epilogue { none, bias, bias_gelu, gelu_grad };

struct GemmArgs {
  bool trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0;
  const void* A = nullptr;
  int64_t lda = 0;
  const void* B = nullptr;
  int64_t ldb = 0;
  void* C = nullptr;
  int64_t ldc = 0;
  DType ab_dtype = DType::f32;  // of A and B
  DType c_dtype = DType::f32;   // of C (bf16 inputs may write fp32 C, e.g. weight gradients)
  float alpha = 1.0f, beta = 0.0f;
  Epilogue epilogue = Epilogue::none;
  const void* bias = nullptr;  // [N], dtype of C; with bias_gelu, pre_gelu receives C before GELU
  void* pre_gelu = nullptr;    // with gelu_grad, read (the forward's pre-activation)
  // Strided batches: batch_count products, operand i at A + i * stride_a elements, etc.
  int64_t batch_count = 1, stride_a = 0, stride_b = 0, stride_c = 0;
};

void gemm(const GemmArgs& args);
// As gemm(), but false (nothing computed) where cuBLASLt has no algorithm for the epilogue;
// gemm() throws there. Bad arguments throw in both.
bool try_gemm(const GemmArgs& args);

// fp32 products use TF32 tensor cores only after allow_tf32(true) (off by default).
void allow_tf32(bool allow);
bool tf32_allowed();

// Off (the default): each problem (shape, dtypes, epilogue, alignments) runs the first
// algorithm of cuBLASLt's heuristic, the same in every run. On: the first product of a problem
// outside a graph capture times the heuristic's first few candidates on the device and the
// process keeps the fastest; two runs may then pick differently and differ in the last bits.
// Problems seen before the switch keep their algorithm.
void set_gemm_tuning(bool on);
bool gemm_tuning();
// Problems whose algorithm was chosen by timing so far in this process.
int64_t gemm_tuned_problems();

}  // namespace ft::cuda
