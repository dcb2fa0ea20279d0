#include "core/device.h"

#ifdef FLASHTRAIN_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace ft {

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

#endif

bool cuda_training_supported() {
  return false;
}

}  // namespace ft
