// The bookkeeping of a CUDA graph capture in progress on this thread (core/cuda/graph.cu owns
// it), which the allocator and the copies consult so that they follow graph.h's rules. Internal
// to core/cuda.
#pragma once

#include <cuda_runtime.h>

#include "core/cuda/graph.h"

#include <unordered_set>
#include <vector>

namespace ft::cuda {

struct CaptureState {
  cudaStream_t origin = nullptr;        // the stream the graph replays on
  std::unordered_set<void*> allocated;  // device memory the captured work allocated, still live
  std::vector<void*> deferred_frees;    // memory from before the capture that it released
  std::vector<void*> constants;         // page-locked copies of upload_constant's tables
};

// This thread's capture, or null when it is not capturing.
CaptureState* capture_state();

// A capture that failed leaves tensors pointing at allocations of a graph that never existed:
// freeing one of them later does nothing (forget_failed_capture records them; the allocator's
// free asks release_failed_capture_memory first).
void forget_failed_capture(const std::unordered_set<void*>& allocated);
bool release_failed_capture_memory(void* ptr);

// Page-locked host memory (cudaHostAlloc) and whether a pointer is in it.
void* allocate_pinned(size_t nbytes);
void free_pinned(void* ptr);
bool is_pinned(const void* ptr);

}  // namespace ft::cuda
