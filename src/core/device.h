// What the machine offers beyond the CPU. Without a CUDA build these report no GPU.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace ft {

// The host processor's model name (Linux: /proc/cpuinfo), "unknown" where it cannot be read.
std::string cpu_model_name();

int cuda_device_count();                // 0 without CUDA, a driver or a GPU
std::string cuda_unavailable_reason();  // why cuda_device_count() is 0 ("" when it is not)
bool cuda_training_supported();         // the CUDA training backend is compiled in
std::string cuda_device_name(int device);
// Compute capability as major * 10 + minor (90 for an H100/H200); 0 without a GPU.
int cuda_compute_capability(int device);
// The device this thread's CUDA calls go to (0 without a GPU).
int cuda_current_device();
// Makes GPU `device` this process's one GPU (before any CUDA tensor exists: the first CUDA
// tensor otherwise takes GPU 0). Throws naming the device and the count for a device that does
// not exist, and without CUDA.
void use_cuda_device(int device);
// Shared memory one block may use with the opt-in attribute, in bytes (0 without a GPU).
int64_t cuda_max_shared_memory_per_block(int device);
// Streaming multiprocessors of the device (0 without a GPU).
int cuda_sm_count(int device);
// fp32 GEMMs on the GPU use TF32 tensor cores only when allowed (off by default: fp32 mode is
// true fp32).
void set_tf32(bool allow);
// Matrix products on the GPU time a few of cuBLASLt's algorithms on each problem's first call and
// keep the fastest (core/cuda/gemm.h: two runs may then differ in the last bits); off by default.
void set_gemm_tuning(bool on);
// Waits for the device's queued work (a no-op on the CPU).
void synchronize(Device device);

}  // namespace ft
