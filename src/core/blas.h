// CPU matrix products through BLAS (OpenBLAS). Row-major, like every tensor here.
// C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C, op = transpose when the flag is set.
// bf16 operands are widened to fp32 and multiplied with sgemm (fp32 accumulation); the
// result is rounded to bf16 only when C is bf16.
#pragma once

#include <cstdint>
#include <string>

#include "core/bf16.h"

namespace ft::cpu {

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha,
          const double* A, int64_t lda, const double* B, int64_t ldb, double beta, double* C,
          int64_t ldc);
// bf16 inputs, C in bf16 (rounded once at the end).
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A,
          int64_t lda, const bf16* B, int64_t ldb, float beta, bf16* C, int64_t ldc);
// bf16 inputs, fp32 output (used for weight gradients, accumulated in fp32).
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A,
          int64_t lda, const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc);

// Number of threads CPU kernels use (OpenMP's, 1 without OpenMP).
int num_threads();

// OpenBLAS's core type: the kernel set it picked for this processor, or the one the
// OPENBLAS_CORETYPE environment variable forces (e.g. "Haswell", "Zen", "SkylakeX").
std::string blas_core_name();
// OpenBLAS's build configuration ("OpenBLAS 0.3.21 DYNAMIC_ARCH USE_OPENMP ...").
std::string blas_config();

}  // namespace ft::cpu
