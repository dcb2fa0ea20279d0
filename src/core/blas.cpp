#include "core/blas.h"

#include <cblas.h>

#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace ft::cpu {
namespace {

CBLAS_TRANSPOSE tr(bool t) {
  return t ? CblasTrans : CblasNoTrans;
}

// Widen a row-major [rows, cols] block with leading dimension ld into a dense fp32 copy.
std::vector<float> widen(const bf16* p, int64_t rows, int64_t cols, int64_t ld) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = p[r * ld + c].to_float();
  }
  return out;
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  cblas_sgemm(CblasRowMajor, tr(trans_a), tr(trans_b), static_cast<int>(M), static_cast<int>(N),
              static_cast<int>(K), alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb), beta,
              C, static_cast<int>(ldc));
}

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha,
          const double* A, int64_t lda, const double* B, int64_t ldb, double beta, double* C,
          int64_t ldc) {
  if (M == 0 || N == 0) return;
  cblas_dgemm(CblasRowMajor, tr(trans_a), tr(trans_b), static_cast<int>(M), static_cast<int>(N),
              static_cast<int>(K), alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb), beta,
              C, static_cast<int>(ldc));
}

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A,
          int64_t lda, const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  const int64_t a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
  const int64_t b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
  const std::vector<float> a = widen(A, a_rows, a_cols, lda);
  const std::vector<float> b = widen(B, b_rows, b_cols, ldb);
  gemm(trans_a, trans_b, M, N, K, alpha, a.data(), a_cols, b.data(), b_cols, beta, C, ldc);
}

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A,
          int64_t lda, const bf16* B, int64_t ldb, float beta, bf16* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  std::vector<float> c(static_cast<size_t>(M * N));
  if (beta != 0.0f) {
    for (int64_t r = 0; r < M; ++r)
      for (int64_t j = 0; j < N; ++j) c[r * N + j] = C[r * ldc + j].to_float();
  }
  gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, c.data(), N);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t j = 0; j < N; ++j) C[r * ldc + j] = bf16(c[r * N + j]);
}

std::string blas_core_name() {
  return openblas_get_corename();
}

std::string blas_config() {
  return openblas_get_config();
}

int num_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

}  // namespace ft::cpu
