// cuBLASLt behind ft::cuda::gemm (see gemm.h for the contract).
//
// Row-major through a column-major library: a row-major X[r, c] with leading dimension ld is
// the column-major X^T[c, r] with the same ld, so C = op(A) op(B) is computed as the
// column-major C^T[N, M] = op(B)^T op(A)^T: the operands swap places (B becomes cuBLASLt's
// "A") and m, n swap; the transpose flags keep their meaning. The bias then runs along the
// rows of C^T, which is what cuBLASLt's BIAS epilogue broadcasts (one value per row of its D).
//
// Types: fp32 x fp32 -> fp32 computes in CUBLAS_COMPUTE_32F (true fp32, no TF32, no bf16x9
// emulation) unless allow_tf32(true), then CUBLAS_COMPUTE_32F_FAST_TF32. bf16 x bf16 -> bf16
// or fp32 computes in CUBLAS_COMPUTE_32F with fp32 alpha/beta. The bias and the pre-GELU
// output have C's dtype (cuBLASLt's rule: bias elements are of D's type).
//
// State: one cuBLASLt handle per process and one 32 MiB workspace per calling thread and stream
// (each thread has its own stream, cudaStreamPerThread, unless a StreamScope lends it another),
// taken from the stream-ordered pool so it is counted in the memory statistics. Both live until
// exit on purpose: destroying them in static destructors would race the CUDA runtime's own
// teardown. The algorithm chosen by cuBLASLt's heuristic is cached per problem (shape, dtypes,
// epilogue, batching and pointer alignment), so repeated training-step GEMMs skip the heuristic
// query. With set_gemm_tuning(true) the first product of a problem times the heuristic's first
// kTuneCandidates algorithms instead and caches the fastest (see fastest_algo).
//
// Memory traffic: what cuBLASLt reads and writes (A, B, C once each in the best case); the
// fallback below for a bias cuBLASLt rejects costs one extra pass over C.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <climits>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "core/cuda/capture_state.h"
#include "core/cuda/check.h"
#include "core/cuda/event_timer.h"
#include "core/cuda/gemm.h"
#include "core/cuda/graph.h"
#include "core/cuda/runtime.h"
#include "core/tensor.h"

namespace ft::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

std::atomic<bool> g_allow_tf32{false};
std::atomic<bool> g_tune{false};
std::atomic<int64_t> g_tuned{0};

// Tuning: the heuristic's first candidates, each timed over a few runs after one untimed run.
constexpr int kTuneCandidates = 8;
constexpr int kTuneRuns = 3;
// A product whose C must not be overwritten during the timing (beta != 0, or C overlapping an
// input) is timed on a scratch copy of C's extent up to this size, else not tuned.
constexpr int64_t kTuneScratchBytes = int64_t{256} << 20;

const char* epilogue_name(Epilogue e) {
  switch (e) {
    case Epilogue::none:
      return "none";
    case Epilogue::bias:
      return "bias";
    case Epilogue::bias_gelu:
      return "bias_gelu";
    case Epilogue::gelu_grad:
      return "gelu_grad";
  }
  return "?";
}

std::string describe(const GemmArgs& a) {
  return str("gemm(M=", a.M, ", N=", a.N, ", K=", a.K, ", trans_a=", a.trans_a,
             ", trans_b=", a.trans_b, ", lda=", a.lda, ", ldb=", a.ldb, ", ldc=", a.ldc, ", ",
             dtype_name(a.ab_dtype), " -> ", dtype_name(a.c_dtype), ", batch_count=", a.batch_count,
             a.epilogue == Epilogue::none ? "" : str(", epilogue ", epilogue_name(a.epilogue)),
             ")");
}

#define FT_CUBLAS_CHECK(call, args)                                                               \
  do {                                                                                            \
    const cublasStatus_t ft_status_ = (call);                                                     \
    if (ft_status_ != CUBLAS_STATUS_SUCCESS)                                                      \
      throw ::ft::Error(::ft::str("cuBLASLt error ", cublasLtGetStatusString(ft_status_), " in ", \
                                  #call, " for ", describe(args)));                               \
  } while (0)

cublasLtHandle_t lt_handle() {
  static cublasLtHandle_t handle = [] {
    cublasLtHandle_t h = nullptr;
    const cublasStatus_t status = cublasLtCreate(&h);
    FT_CHECK(status == CUBLAS_STATUS_SUCCESS,
             "cublasLtCreate failed: ", cublasLtGetStatusString(status));
    return h;
  }();
  return handle;
}

// One per stream a thread launches on (a StreamScope can give a thread more than one), so that
// GEMMs queued on two streams never share a workspace. A captured GEMM takes the workspace of
// the stream its graph replays on (core/cuda/graph.h), where it runs in order with that
// stream's other GEMMs.
void* workspace() {
  thread_local std::map<cudaStream_t, Tensor*> buffers;  // never freed, see the top of the file
  Tensor*& buffer = buffers[execution_stream()];
  if (buffer == nullptr) {
    buffer = new Tensor(
        Tensor::empty({static_cast<int64_t>(kWorkspaceBytes / 4)}, DType::i32, Device::cuda));
  }
  return buffer->raw();
}

// RAII owners of the cuBLASLt descriptors.
struct MatmulDesc {
  cublasLtMatmulDesc_t desc = nullptr;
  ~MatmulDesc() {
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};
struct Layout {
  cublasLtMatrixLayout_t desc = nullptr;
  ~Layout() {
    if (desc) cublasLtMatrixLayoutDestroy(desc);
  }
};
struct Preference {
  cublasLtMatmulPreference_t desc = nullptr;
  ~Preference() {
    if (desc) cublasLtMatmulPreferenceDestroy(desc);
  }
};

cudaDataType_t cuda_type(DType t) {
  return t == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F;
}

// Largest power of two (at most 256, cuBLASLt's default assumption) dividing the address of
// every batch's operand.
uint32_t alignment_of(const void* ptr, int64_t stride_elems, DType dtype, int64_t batch_count) {
  uint64_t bits = reinterpret_cast<uint64_t>(ptr) | 256u;
  if (batch_count > 1) bits |= static_cast<uint64_t>(stride_elems) * dtype_size(dtype);
  return static_cast<uint32_t>(bits & (~bits + 1));
}

void validate(const GemmArgs& a) {
  const std::string what = describe(a);
  FT_CHECK(a.M >= 0 && a.N >= 0 && a.K >= 0, what, ": negative dimension");
  FT_CHECK(a.batch_count >= 1 && a.batch_count <= INT_MAX, what, ": batch_count must be in [1, ",
           INT_MAX, "]");
  FT_CHECK(a.ab_dtype == DType::f32 || a.ab_dtype == DType::bf16, what,
           ": A and B must be fp32 or bf16 on the GPU (fp64 GEMMs are CPU-only)");
  FT_CHECK(a.c_dtype == DType::f32 || (a.c_dtype == DType::bf16 && a.ab_dtype == DType::bf16), what,
           ": C must be fp32, or bf16 when A and B are bf16");
  // Stored (row-major) widths: op(A) is [M, K], so A is stored [M, K], or [K, M] when
  // transposed; B likewise [K, N] or [N, K]; C is [M, N].
  const int64_t a_cols = a.trans_a ? a.M : a.K, b_cols = a.trans_b ? a.K : a.N;
  FT_CHECK(a.lda >= std::max<int64_t>(a_cols, 1), what, ": lda must be >= ", a_cols);
  FT_CHECK(a.ldb >= std::max<int64_t>(b_cols, 1), what, ": ldb must be >= ", b_cols);
  FT_CHECK(a.ldc >= std::max<int64_t>(a.N, 1), what, ": ldc must be >= N = ", a.N);
  FT_CHECK(a.C != nullptr, what, ": C is null");
  FT_CHECK(a.K == 0 || (a.A != nullptr && a.B != nullptr), what, ": A or B is null");
  if (a.batch_count > 1) {
    FT_CHECK(a.stride_a >= 0 && a.stride_b >= 0 && a.stride_c >= a.M * a.ldc, what,
             ": batch strides (", a.stride_a, ", ", a.stride_b, ", ", a.stride_c,
             ") must be >= 0 and stride_c >= M * ldc = ", a.M * a.ldc,
             " (batches of C must not overlap)");
  }
  const char* name = epilogue_name(a.epilogue);
  if (a.epilogue == Epilogue::bias || a.epilogue == Epilogue::bias_gelu) {
    FT_CHECK(a.bias != nullptr, what, ": the ", name, " epilogue needs bias");
  }
  if (a.epilogue == Epilogue::gelu_grad) {
    FT_CHECK(a.batch_count == 1, what,
             ": the gelu_grad epilogue takes one product (batch_count 1)");
  }
  if (a.epilogue == Epilogue::bias_gelu || a.epilogue == Epilogue::gelu_grad) {
    FT_CHECK(a.pre_gelu != nullptr, what, ": the ", name, " epilogue needs pre_gelu");
    FT_CHECK(a.K > 0, what, ": the ", name, " epilogue needs K > 0");
    // pre_gelu has C's layout; cuBLASLt wants its leading dimension and batch stride
    // divisible by 8.
    FT_CHECK(a.ldc % 8 == 0 && (a.batch_count == 1 || a.stride_c % 8 == 0), what, ": the ", name,
             " epilogue needs ldc (and stride_c) divisible by 8, got ldc=", a.ldc,
             ", stride_c=", a.stride_c);
  }
}

// cuBLASLt's epilogue for ours. Its bias-gradient epilogues are not used (measured on the H200
// with cuBLAS 13.0, docs/PERF.md): BGRADB runs as a separate kernel after the GEMM, slower
// than our column reduction, and DGELU_BGRAD takes no fp32 bias gradient with a bf16 D.
cublasLtEpilogue_t lt_epilogue(const GemmArgs& a) {
  switch (a.epilogue) {
    case Epilogue::none:
      return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::bias:
      return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::bias_gelu:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epilogue::gelu_grad:
      return CUBLASLT_EPILOGUE_DGELU;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

bool reads_or_writes_aux(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU;
}

// C[b, i, j] = beta * C[b, i, j] + bias[j] (bias may be null). Never reads C when beta is 0,
// so a poisoned (NaN) output does not leak through, as cuBLAS guarantees for its beta = 0.
template <class T>
__global__ void scale_add_bias_kernel(T* c, const T* bias, float beta, int64_t rows, int64_t cols,
                                      int64_t ldc, int64_t stride_c, int64_t batch_count) {
  const int64_t total = batch_count * rows * cols;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += step) {
    const int64_t j = idx % cols, i = (idx / cols) % rows, b = idx / (cols * rows);
    T& out = c[b * stride_c + i * ldc + j];
    float v = beta == 0.0f ? 0.0f : beta * static_cast<float>(out);
    if (bias) v += static_cast<float>(bias[j]);
    out = static_cast<T>(v);
  }
}

void scale_add_bias(const GemmArgs& a, const void* bias) {
  const int64_t total = a.batch_count * a.M * a.N;
  if (total == 0) return;
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((total + threads - 1) / threads, 8192));
  if (a.c_dtype == DType::bf16) {
    scale_add_bias_kernel<<<blocks, threads, 0, current_stream()>>>(
        static_cast<__nv_bfloat16*>(a.C), static_cast<const __nv_bfloat16*>(bias), a.beta, a.M, a.N,
        a.ldc, a.stride_c, a.batch_count);
  } else {
    scale_add_bias_kernel<<<blocks, threads, 0, current_stream()>>>(
        static_cast<float*>(a.C), static_cast<const float*>(bias), a.beta, a.M, a.N, a.ldc,
        a.stride_c, a.batch_count);
  }
  FT_CUDA_CHECK_LAUNCH();
}

// Everything the heuristic's answer depends on.
using AlgoKey = std::array<int64_t, 20>;

AlgoKey key_of(const GemmArgs& a, bool tf32, cublasLtEpilogue_t epilogue,
               const std::array<uint32_t, 5>& align) {
  return {a.trans_a,
          a.trans_b,
          a.M,
          a.N,
          a.K,
          a.lda,
          a.ldb,
          a.ldc,
          static_cast<int64_t>(a.ab_dtype),
          static_cast<int64_t>(a.c_dtype),
          static_cast<int64_t>(epilogue),
          a.batch_count,
          a.batch_count > 1 ? a.stride_a : 0,
          a.batch_count > 1 ? a.stride_b : 0,
          a.batch_count > 1 ? a.stride_c : 0,
          tf32,
          align[0] | (int64_t{align[1]} << 16),
          align[2] | (int64_t{align[3]} << 16),
          align[4],
          0};
}

// Bytes from the start of a row-major matrix (rows x cols, leading dimension ld, `batch` of
// them `stride` elements apart) to the end of its last element.
int64_t extent_bytes(int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride,
                     DType dtype) {
  if (rows == 0 || cols == 0) return 0;
  const int64_t elems = (batch > 1 ? (batch - 1) * stride : 0) + (rows - 1) * ld + cols;
  return elems * static_cast<int64_t>(dtype_size(dtype));
}

bool overlap(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  const auto* x = static_cast<const char*>(a);
  const auto* y = static_cast<const char*>(b);
  return a != nullptr && b != nullptr && x < y + b_bytes && y < x + a_bytes;
}

// What one cuBLASLt call needs besides the algorithm.
struct MatmulCall {
  const GemmArgs& a;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc;
  float beta;
  cublasStatus_t run(const cublasLtMatmulAlgo_t& algo, void* c) const {
    const float alpha = a.alpha;
    return cublasLtMatmul(lt_handle(), op, &alpha, a.B, la, a.A, lb, &beta, c, lc, c, lc, &algo,
                          workspace(), kWorkspaceBytes, current_stream());
  }
};

// The fastest of the heuristic's candidates for this product, timed with CUDA events on the
// current stream (the host waits for each): once per problem, on the first call, never during a
// graph capture. The product then writes C as usual. C is the timing runs' output where
// rewriting it changes nothing (beta = 0 and no input overlaps it); otherwise a scratch buffer
// of C's extent takes the runs (not tuned beyond kTuneScratchBytes). An aux output (the
// pre-GELU of bias_gelu) is rewritten with the same values. Candidates that fail are skipped;
// nullopt when none ran.
std::optional<cublasLtMatmulAlgo_t> fastest_algo(const MatmulCall& call,
                                                 const cublasLtMatmulHeuristicResult_t* results,
                                                 int found) {
  const GemmArgs& a = call.a;
  const int64_t c_bytes = extent_bytes(a.M, a.N, a.ldc, a.batch_count, a.stride_c, a.c_dtype);
  const int64_t a_bytes = extent_bytes(a.trans_a ? a.K : a.M, a.trans_a ? a.M : a.K, a.lda,
                                       a.batch_count, a.stride_a, a.ab_dtype);
  const int64_t b_bytes = extent_bytes(a.trans_b ? a.N : a.K, a.trans_b ? a.K : a.N, a.ldb,
                                       a.batch_count, a.stride_b, a.ab_dtype);
  const bool in_place = call.beta != 0.0f || overlap(a.C, c_bytes, a.A, a_bytes) ||
                        overlap(a.C, c_bytes, a.B, b_bytes) ||
                        overlap(a.C, c_bytes, a.pre_gelu, c_bytes);
  if (in_place && c_bytes > kTuneScratchBytes) return std::nullopt;
  Tensor scratch;
  void* c = a.C;
  if (in_place) {
    scratch = Tensor::empty({(c_bytes + 3) / 4}, DType::i32, Device::cuda);
    FT_CUDA_CHECK(cudaMemsetAsync(scratch.raw(), 0, c_bytes, current_stream()));
    c = scratch.raw();
  }
  EventTimer timer(1);
  std::optional<cublasLtMatmulAlgo_t> best;
  double best_ms = 0.0;
  for (int i = 0; i < found; ++i) {
    if (call.run(results[i].algo, c) != CUBLAS_STATUS_SUCCESS) continue;  // untimed run
    timer.start(0);
    bool ok = true;
    for (int r = 0; r < kTuneRuns && ok; ++r)
      ok = call.run(results[i].algo, c) == CUBLAS_STATUS_SUCCESS;
    timer.stop(0);
    const double ms = timer.elapsed_ms()[0];
    if (ok && (!best || ms < best_ms)) {
      best = results[i].algo;
      best_ms = ms;
    }
  }
  if (best) g_tuned.fetch_add(1);
  return best;
}

// One cuBLASLt matmul with the given epilogue; false when cuBLASLt has no algorithm for it.
bool run_matmul(const GemmArgs& a, cublasLtEpilogue_t epilogue, float beta) {
  static std::mutex cache_mutex;
  static std::map<AlgoKey, std::optional<cublasLtMatmulAlgo_t>> cache;

  const bool tf32 = a.ab_dtype == DType::f32 && tf32_allowed();
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const cudaDataType_t ab_type = cuda_type(a.ab_dtype), c_type = cuda_type(a.c_dtype);

  // cuBLASLt's A is our B and its B is our A (see the top of the file).
  MatmulDesc op;
  FT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op.desc, compute, CUDA_R_32F), a);
  const cublasOperation_t op_a = a.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = a.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  FT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a), a);
  FT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b), a);
  FT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                 sizeof epilogue),
                  a);
  if (epilogue == CUBLASLT_EPILOGUE_BIAS || epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
    FT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                   &a.bias, sizeof a.bias),
                    a);
  }
  if (reads_or_writes_aux(epilogue)) {
    const int64_t aux_ld = a.ldc, aux_stride = a.stride_c;
    FT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                       &a.pre_gelu, sizeof a.pre_gelu),
        a);
    FT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                   &aux_ld, sizeof aux_ld),
                    a);
    if (a.batch_count > 1) {
      FT_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE,
                                         &aux_stride, sizeof aux_stride),
          a);
    }
  }

  // Column-major layouts: rows, cols, ld of the stored matrices as cuBLASLt sees them.
  Layout la, lb, lc;
  FT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la.desc, ab_type, a.trans_b ? a.K : a.N,
                                             a.trans_b ? a.N : a.K, a.ldb),
                  a);
  FT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb.desc, ab_type, a.trans_a ? a.M : a.K,
                                             a.trans_a ? a.K : a.M, a.lda),
                  a);
  FT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc.desc, c_type, a.N, a.M, a.ldc), a);
  if (a.batch_count > 1) {
    const int32_t count = static_cast<int32_t>(a.batch_count);
    const std::array<std::pair<cublasLtMatrixLayout_t, int64_t>, 3> batched = {
        {{la.desc, a.stride_b}, {lb.desc, a.stride_a}, {lc.desc, a.stride_c}}};
    for (const auto& [layout, stride] : batched) {
      FT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                       &count, sizeof count),
                      a);
      FT_CUBLAS_CHECK(
          cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                           &stride, sizeof stride),
          a);
    }
  }

  const std::array<uint32_t, 5> align = {
      alignment_of(a.B, a.stride_b, a.ab_dtype, a.batch_count),
      alignment_of(a.A, a.stride_a, a.ab_dtype, a.batch_count),
      alignment_of(a.C, a.stride_c, a.c_dtype, a.batch_count),
      a.bias != nullptr ? alignment_of(a.bias, 0, a.c_dtype, 1) : 256u,
      reads_or_writes_aux(epilogue) ? alignment_of(a.pre_gelu, a.stride_c, a.c_dtype, a.batch_count)
                                    : 256u};
  const AlgoKey key = key_of(a, tf32, epilogue, align);

  std::optional<cublasLtMatmulAlgo_t> algo;
  bool cached = false;
  {
    std::lock_guard<std::mutex> lock(cache_mutex);
    const auto it = cache.find(key);
    if (it != cache.end()) {
      algo = it->second;
      cached = true;
    }
  }
  if (!cached) {
    Preference pref;
    FT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref.desc), a);
    const uint64_t ws = kWorkspaceBytes;
    FT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
                        pref.desc, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
                    a);
    const std::array<cublasLtMatmulPreferenceAttributes_t, 4> align_attrs = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    const std::array<uint32_t, 4> align_values = {align[0], align[1], align[2], align[2]};
    for (size_t i = 0; i < align_attrs.size(); ++i) {
      FT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.desc, align_attrs[i],
                                                           &align_values[i], sizeof(uint32_t)),
                      a);
    }
    const bool tune = g_tune.load() && !capturing();
    std::array<cublasLtMatmulHeuristicResult_t, kTuneCandidates> results{};
    int found = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        lt_handle(), op.desc, la.desc, lb.desc, lc.desc, lc.desc, pref.desc,
        tune ? kTuneCandidates : 1, results.data(), &found);
    // An epilogue this cuBLASLt does not take for these types is reported as NOT_SUPPORTED or,
    // for some (DGELU_BGRAD with an fp32 bias on a bf16 D), INVALID_VALUE: both mean "no
    // algorithm" once validate() has passed the arguments.
    const bool unsupported =
        status == CUBLAS_STATUS_NOT_SUPPORTED ||
        (status == CUBLAS_STATUS_INVALID_VALUE && epilogue != CUBLASLT_EPILOGUE_DEFAULT);
    if (status == CUBLAS_STATUS_SUCCESS && found > 0) {
      if (tune && found > 1) {
        algo = fastest_algo({a, op.desc, la.desc, lb.desc, lc.desc, beta}, results.data(), found);
      }
      if (!algo) algo = results[0].algo;
    } else if (status != CUBLAS_STATUS_SUCCESS && !unsupported) {
      FT_CUBLAS_CHECK(status, a);
    }
    std::lock_guard<std::mutex> lock(cache_mutex);
    cache[key] = algo;
  }
  if (!algo) return false;

  const MatmulCall call{a, op.desc, la.desc, lb.desc, lc.desc, beta};
  FT_CUBLAS_CHECK(call.run(*algo, a.C), a);
  return true;
}

}  // namespace

void allow_tf32(bool allow) {
  g_allow_tf32.store(allow);
}

bool tf32_allowed() {
  return g_allow_tf32.load();
}

void set_gemm_tuning(bool on) {
  g_tune.store(on);
}

bool gemm_tuning() {
  return g_tune.load();
}

int64_t gemm_tuned_problems() {
  return g_tuned.load();
}

bool try_gemm(const GemmArgs& args) {
  validate(args);
  if (args.M == 0 || args.N == 0) {
    return true;  // nothing to write (gelu_grad's C is empty too)
  }
  const bool has_bias = args.epilogue == Epilogue::bias || args.epilogue == Epilogue::bias_gelu;
  if (args.K == 0) {  // no product: C = beta * C (+ bias); validate() kept the others out
    scale_add_bias(args, has_bias ? args.bias : nullptr);
    return true;
  }
  return run_matmul(args, lt_epilogue(args), args.beta);
}

void gemm(const GemmArgs& args) {
  if (try_gemm(args)) return;
  FT_CHECK(args.epilogue == Epilogue::bias, "cuBLASLt has no algorithm for ", describe(args));
  // No fused bias for this shape: put beta * C + bias into C first, then add the product
  // (one more pass over C, and a bf16 C is rounded twice instead of once).
  scale_add_bias(args, args.bias);
  FT_CHECK(run_matmul(args, CUBLASLT_EPILOGUE_DEFAULT, 1.0f), "cuBLASLt has no algorithm for ",
           describe(args));
}

}  // namespace ft::cuda
