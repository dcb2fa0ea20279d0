#include "core/cuda/check.h"
#include "core/cuda/runtime.h"

namespace ft::cuda {

cudaStream_t current_stream() {
  // The per-thread default stream: work is ordered without a stream handle to pass around;
  // separate streams can come when work overlaps (data-parallel communication).
  return cudaStreamPerThread;
}

void synchronize() {
  FT_CUDA_CHECK(cudaStreamSynchronize(current_stream()));
}

}  // namespace ft::cuda
