#include "core/cuda/check.h"
#include "core/cuda/runtime.h"

namespace ft::cuda {
namespace {

// The per-thread default stream: work is ordered without a stream handle to pass around;
// separate streams can come when work overlaps (data-parallel communication).
thread_local cudaStream_t t_stream = cudaStreamPerThread;

}  // namespace

cudaStream_t current_stream() {
  return t_stream;
}

void synchronize() {
  FT_CUDA_CHECK(cudaStreamSynchronize(current_stream()));
}

StreamScope::StreamScope(cudaStream_t stream) : previous_(t_stream) {
  t_stream = stream;
}

StreamScope::~StreamScope() {
  t_stream = previous_;
}

}  // namespace ft::cuda
