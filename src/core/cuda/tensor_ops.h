// Device-side halves of Tensor's copy, conversion and fill (called by core/tensor.cpp, which
// stays free of kernel code). Only compiled with FLASHTRAIN_WITH_CUDA. Pointers are raw tensor
// data; all work is queued on cuda::current_stream().
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace ft::cuda {

// Sets up device 0 (cuda::init_device) unless a CUDA allocator is registered already, so that
// Tensor::empty(..., Device::cuda) works without an explicit init.
void ensure_device_ready();

// nbytes from src to dst between any two devices. A host destination is synchronised before
// return; a pageable host source may be reused at once (the driver stages it), a page-locked
// one is read when the copy runs. Under a CUDA graph capture only page-locked sources are
// taken, and no host destination (core/cuda/graph.h).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes);

// n elements from src to dst, both on the GPU, between f32, bf16 and f64. Rounds exactly as
// the CPU's store(load(x)) does (f64 -> bf16 via f32), so results are bit-identical.
void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n);

// core/f32_halves.h's split_f32 and join_f32 over n elements on the GPU: hi bf16, lo int16
// (null in split_f32: hi alone), values fp32. The same bits as the CPU's.
void split_f32(void* hi, void* lo, const void* values, int64_t n);
void join_f32(void* values, const void* hi, const void* lo, int64_t n);

// Every element of dst (GPU) becomes `value` converted as the CPU's Tensor::fill converts it.
void fill(void* dst, DType dtype, int64_t n, double value);
void zero_bytes(void* dst, size_t nbytes);

}  // namespace ft::cuda
