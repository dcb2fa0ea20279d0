// Host side of the TMA kernels: tensor maps over [B, S, H, D] tensors (bf16 tiles, dense or
// inside a fused QKV buffer, and the fp32 dQ buffer that the backward reduces into), encoded
// through the driver's cuTensorMapEncodeTiled (reached through the runtime, so nothing links
// libcuda), the device's multiprocessor count for persistent grids and its L2 bytes, and the tma
// forward's work-tile counters (one pair per device and stream). Declared in tensor_map.h.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "attention/cuda/tensor_map.h"
#include "core/cuda/check.h"
#include "core/cuda/graph.h"
#include "core/tensor.h"

namespace ft::attention::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_function() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    FT_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                                   cudaEnableDefault, &found));
    FT_CHECK(found == cudaDriverEntryPointSuccess && f != nullptr,
             "attention: the CUDA driver has no cuTensorMapEncodeTiled (TMA needs a driver for "
             "CUDA 12 or newer)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

}  // namespace

namespace {

// A 4-d map over a [B, S, H, D] tensor whose positions are row_elems elements apart (H * D when
// dense): boxes of box_cols columns x box_rows rows of one head, swizzled by 128 bytes
// (box_cols * element bytes is the swizzle's 128).
CUtensorMap tiled_head_map(const void* base, CUtensorMapDataType type, cuuint64_t element,
                           int batch, int seq_len, int heads, int head_dim, int64_t row_elems,
                           int box_cols, int box_rows) {
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(seq_len), static_cast<cuuint64_t>(batch)};
  // Bytes between consecutive heads, positions and batch rows (the innermost dimension is
  // dense). TMA wants each a multiple of 16 bytes, as the base address.
  const cuuint64_t row_bytes = static_cast<cuuint64_t>(row_elems) * element;
  const cuuint64_t strides[3] = {dims[0] * element, row_bytes, row_bytes * dims[2]};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(box_cols), 1,
                             static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  CUtensorMap map;
  const CUresult r =
      encode_function()(&map, type, 4, const_cast<void*>(base), dims, strides, box, element_strides,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  FT_CHECK(r == CUDA_SUCCESS, "attention: cuTensorMapEncodeTiled failed (error ", int{r},
           ") for a [", batch, ", ", seq_len, ", ", heads, ", ", head_dim, "] tensor at ", base,
           " with positions ", row_elems, " elements apart and ", box_cols, "x", box_rows,
           " boxes");
  return map;
}

}  // namespace

CUtensorMap head_tensor_map(const void* base, int batch, int seq_len, int heads, int head_dim,
                            int64_t row_elems, int box_rows) {
  return tiled_head_map(base, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, batch, seq_len, heads, head_dim,
                        row_elems, 64, box_rows);
}

CUtensorMap dq_tensor_map(float* base, int batch, int seq_len, int heads, int head_dim) {
  return tiled_head_map(base, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, batch, seq_len, heads, head_dim,
                        int64_t{heads} * head_dim, 32, 64);
}

namespace {

// An attribute of the current device, read once per device.
int device_attribute(cudaDeviceAttr attribute) {
  static std::mutex mutex;
  static std::map<std::pair<int, int>, int> values;
  int device = 0;
  FT_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  const std::pair<int, int> key{device, static_cast<int>(attribute)};
  auto it = values.find(key);
  if (it != values.end()) return it->second;
  int n = 0;
  FT_CUDA_CHECK(cudaDeviceGetAttribute(&n, attribute, device));
  return values.emplace(key, n).first->second;
}

}  // namespace

int sm_count() {
  return device_attribute(cudaDevAttrMultiProcessorCount);
}

int64_t l2_bytes() {
  return device_attribute(cudaDevAttrL2CacheSize);
}

int* tma_forward_claims() {
  // FT_TMA_DEAL=static: TileOrder's static deal, the claims' twin (the tests compare the two).
  if (const char* deal = std::getenv("FT_TMA_DEAL"); deal != nullptr && *deal != 0) {
    FT_CHECK(std::strcmp(deal, "claims") == 0 || std::strcmp(deal, "static") == 0,
             "FT_TMA_DEAL is '", deal, "': 'claims' (the default) or 'static'");
    if (std::strcmp(deal, "static") == 0) return nullptr;
  }
  // One pair per device and stream a thread launches on, never freed (two words each). Launches
  // on one stream run one after the other, and each leaves its counters at zero. A captured
  // launch takes those of the stream its graph replays on (core/cuda/graph.h), in order with
  // that stream's other launches.
  thread_local std::map<std::pair<int, cudaStream_t>, Tensor*> counters;
  int device = 0;
  FT_CUDA_CHECK(cudaGetDevice(&device));
  Tensor*& c = counters[{device, ft::cuda::execution_stream()}];
  if (c == nullptr) {
    // Zeroed in stream order on the stream that will read them, so not inside a capture (its
    // graph would zero them only when replayed): a capture that finds none deals statically.
    if (ft::cuda::capturing()) return nullptr;
    c = new Tensor(Tensor::zeros({2}, DType::i32, Device::cuda));
  }
  return static_cast<int*>(c->raw());
}

}  // namespace ft::attention::cuda
