// The CUDA runtime as flashtrain uses it: one device per process, one stream for all work.
#pragma once

#include <cuda_runtime.h>

namespace ft::cuda {

// Selects the device and sets up its stream-ordered memory pool (idempotent).
void init_device(int device = 0);
// The stream every kernel and allocation uses.
cudaStream_t current_stream();
void synchronize();

}  // namespace ft::cuda
