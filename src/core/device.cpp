#include "core/device.h"

#include <fstream>

#include "core/error.h"

#ifdef FLASHTRAIN_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda/gemm.h"
#include "core/cuda/runtime.h"
#endif

namespace ft {

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    const size_t start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? "unknown" : line.substr(start);
  }
  return "unknown";
}

#ifdef FLASHTRAIN_WITH_CUDA

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

std::string cuda_unavailable_reason() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return std::string("no usable CUDA GPU (") + cudaGetErrorString(err) + ")";
  }
  return n == 0 ? "no CUDA GPU found" : "";
}

std::string cuda_device_name(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return "unknown";
  return prop.name;
}

int cuda_compute_capability(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return prop.major * 10 + prop.minor;
}

int cuda_current_device() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return device;
}

int64_t cuda_max_shared_memory_per_block(int device) {
  int bytes = 0;
  if (cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
      cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return bytes;
}

int cuda_sm_count(int device) {
  int count = 0;
  if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

void use_cuda_device(int device) {
  cuda::init_device(device);
}

void set_tf32(bool allow) {
  cuda::allow_tf32(allow);
}

void set_gemm_tuning(bool on) {
  cuda::set_gemm_tuning(on);
}

bool cuda_training_supported() {
  return true;
}

void synchronize(Device device) {
  if (device == Device::cuda) cuda::synchronize();
}

#else

int cuda_device_count() {
  return 0;
}

std::string cuda_unavailable_reason() {
  return "this flashtrain was built without CUDA (configure with -DFLASHTRAIN_CUDA=ON)";
}

std::string cuda_device_name(int) {
  return "none";
}

int cuda_compute_capability(int) {
  return 0;
}

int cuda_current_device() {
  return 0;
}

void use_cuda_device(int device) {
  throw Error(str("GPU ", device, " asked for, but ", cuda_unavailable_reason()));
}

int64_t cuda_max_shared_memory_per_block(int) {
  return 0;
}

int cuda_sm_count(int) {
  return 0;
}

void set_tf32(bool allow) {
  FT_CHECK(!allow, "--tf32 needs a flashtrain built with CUDA");
}

void set_gemm_tuning(bool on) {
  FT_CHECK(!on, "--gemm-tune needs a flashtrain built with CUDA");
}

bool cuda_training_supported() {
  return false;
}

void synchronize(Device) {}

#endif

}  // namespace ft
