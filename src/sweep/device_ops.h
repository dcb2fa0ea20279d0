// The few GPU helpers the sweep's timing needs that the library does not offer: random inputs
// drawn on the device (the hero inputs are over a billion samples), the largest difference of
// two device tensors without copying them back, and a kernel that keeps the stream busy while
// the host queues the timed calls. Plain C++ declarations; defined in device_ops.cu (CUDA
// builds only).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace ft::sweep::gpu {

// N(0, 1) samples, a counter-based hash of (seed, element): the same seed gives the same tensor.
// t: a CUDA tensor of fp32 or bf16.
void fill_normal(Tensor& t, uint64_t seed);

// max |a - b| over all elements, in double; +inf when any difference is NaN or Inf. a and b:
// CUDA tensors of the same dtype (fp32 or bf16) and element count.
double max_abs_diff(const Tensor& a, const Tensor& b);

// Queues a kernel on the current stream that spins for about `ms` milliseconds.
void busy_wait(double ms);

// Queues a kernel that writes through a bad pointer: the next synchronisation fails with an
// illegal-address error and the context is unusable afterwards. For tests of the recovery.
void illegal_address();

}  // namespace ft::sweep::gpu
