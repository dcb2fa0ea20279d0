// The CUDA runtime as flashtrain uses it: one device per process, one stream per thread for all
// work (cudaStreamPerThread), which a caller may swap for its own for a while (StreamScope).
#pragma once

#include <cuda_runtime.h>

namespace ft::cuda {

// Selects the device and sets up its stream-ordered memory pool (idempotent).
void init_device(int device = 0);
// The stream every kernel and allocation of this thread uses.
cudaStream_t current_stream();
void synchronize();

// Makes current_stream() return `stream` on this thread until the scope ends, so that work done
// for another framework (PyTorch's, CuPy's current stream) is ordered with its own work. Memory
// allocated inside the scope is stream-ordered on `stream`: free it on the same stream (inside
// another scope of it), as a framework's caching allocator would.
class StreamScope {
 public:
  explicit StreamScope(cudaStream_t stream);
  ~StreamScope();
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  cudaStream_t previous_;
};

}  // namespace ft::cuda
