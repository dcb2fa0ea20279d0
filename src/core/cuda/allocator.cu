// Device memory for every tensor on the GPU comes from CUDA's stream-ordered allocator: one
// memory pool per device whose release threshold is "never", so freed blocks stay reserved
// and later allocations reuse them without a device synchronisation. The pool's own
// high-water marks give "peak used" and "peak reserved" for each training step.
// Under a CUDA graph capture (graph.h) allocations become the graph's own memory, which the
// driver keeps apart from the pool: the peaks add the graph memory's marks to the pool's.
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

#include "core/cuda/capture_state.h"
#include "core/cuda/check.h"
#include "core/cuda/runtime.h"
#include "core/memory.h"

namespace ft::cuda {
namespace {

cudaMemPool_t g_pool = nullptr;
int g_device = -1;

void* pool_allocate(size_t nbytes) {
  void* ptr = nullptr;
  const cudaError_t err = cudaMallocAsync(&ptr, nbytes == 0 ? 1 : nbytes, current_stream());
  if (err != cudaSuccess) {
    cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    // Only a request the pool cannot serve is out of memory; any other error here (a sticky
    // fault of an earlier kernel) must not pass for one.
    if (err != cudaErrorMemoryAllocation) {
      throw Error(str("allocating ", nbytes / (1024 * 1024),
                      " MB on the GPU failed: ", cudaGetErrorString(err)));
    }
    throw OutOfMemory(str("out of GPU memory: asked for ", nbytes / (1024 * 1024), " MB with ",
                          free_bytes / (1024 * 1024), " MB free of ", total_bytes / (1024 * 1024),
                          " MB (", cudaGetErrorString(err), "); try a smaller --batch-size"));
  }
  if (CaptureState* capture = capture_state()) capture->allocated.insert(ptr);
  return ptr;
}

void pool_free(void* ptr) {
  // A capture may only free what it allocated; memory from before it is freed when it ends.
  if (CaptureState* capture = capture_state()) {
    if (capture->allocated.erase(ptr) == 0) {
      capture->deferred_frees.push_back(ptr);
      return;
    }
  } else if (release_failed_capture_memory(ptr)) {
    return;
  }
  FT_CUDA_CHECK(cudaFreeAsync(ptr, current_stream()));
}

int64_t pool_mark(cudaMemPoolAttr pool_attr, cudaGraphMemAttributeType graph_attr) {
  uint64_t pool = 0, graph = 0;
  FT_CUDA_CHECK(cudaMemPoolGetAttribute(g_pool, pool_attr, &pool));
  FT_CUDA_CHECK(cudaDeviceGetGraphMemAttribute(g_device, graph_attr, &graph));
  return static_cast<int64_t>(pool + graph);
}

int64_t pool_peak_used() {
  return pool_mark(cudaMemPoolAttrUsedMemHigh, cudaGraphMemAttrUsedMemHigh);
}

int64_t pool_peak_reserved() {
  return pool_mark(cudaMemPoolAttrReservedMemHigh, cudaGraphMemAttrReservedMemHigh);
}

void pool_reset_peak() {
  uint64_t zero = 0;  // resetting a high-water mark sets it to the current value
  FT_CUDA_CHECK(cudaMemPoolSetAttribute(g_pool, cudaMemPoolAttrReservedMemHigh, &zero));
  FT_CUDA_CHECK(cudaMemPoolSetAttribute(g_pool, cudaMemPoolAttrUsedMemHigh, &zero));
  FT_CUDA_CHECK(cudaDeviceSetGraphMemAttribute(g_device, cudaGraphMemAttrReservedMemHigh, &zero));
  FT_CUDA_CHECK(cudaDeviceSetGraphMemAttribute(g_device, cudaGraphMemAttrUsedMemHigh, &zero));
}

// The pool's reserve beyond what is in use goes back to the driver (before a graph takes its
// own memory, so that the two do not hold the same activations' worth twice).
void release_cached() {
  FT_CUDA_CHECK(cudaStreamSynchronize(current_stream()));
  FT_CUDA_CHECK(cudaMemPoolTrimTo(g_pool, 0));
}

}  // namespace

void init_device(int device) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  if (g_device == device) return;
  FT_CHECK(g_device < 0, "flashtrain uses one GPU per process (device ", g_device,
           " is in use, asked for ", device, ")");
  int count = 0;
  FT_CUDA_CHECK(cudaGetDeviceCount(&count));
  FT_CHECK(device >= 0 && device < count, "GPU ", device, " does not exist (", count, " found)");
  FT_CUDA_CHECK(cudaSetDevice(device));
  FT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&g_pool, device));
  uint64_t keep_everything = UINT64_MAX;
  FT_CUDA_CHECK(cudaMemPoolSetAttribute(g_pool, cudaMemPoolAttrReleaseThreshold, &keep_everything));
  g_device = device;
  register_device_allocator(
      Device::cuda, {pool_allocate, pool_free, pool_peak_used, pool_peak_reserved, pool_reset_peak,
                     allocate_pinned, free_pinned, release_cached});
}

}  // namespace ft::cuda
