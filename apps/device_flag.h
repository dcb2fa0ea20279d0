// The --device flag of the commands that run a model (train, generate): auto picks the GPU when
// this build can use it.
#pragma once

#include <ostream>
#include <string>

#include "core/device.h"
#include "core/error.h"

namespace ft::cli {

// "cuda:K" names GPU K: the device is cuda, and *gpu (when given) gets K; otherwise *gpu is
// left as it is.
inline Device resolve_device(const std::string& flag, std::ostream& out, int* gpu = nullptr) {
  if (flag.rfind("cuda:", 0) == 0) {
    const std::string index = flag.substr(5);
    FT_CHECK(!index.empty() && index.size() < 6 &&
                 index.find_first_not_of("0123456789") == std::string::npos,
             "--device ", flag, ": expected cuda:K with K a GPU number");
    const int k = std::stoi(index);
    FT_CHECK(cuda_device_count() > 0, "--device ", flag, ": ", cuda_unavailable_reason());
    FT_CHECK(k < cuda_device_count(), "--device ", flag, ": this machine has ", cuda_device_count(),
             " GPU", cuda_device_count() == 1 ? "" : "s",
             " (cuda:0 to cuda:", cuda_device_count() - 1, ")");
    if (gpu != nullptr) *gpu = k;
    return Device::cuda;
  }
  if (flag == "cpu") return Device::cpu;
  if (flag == "cuda") {
    FT_CHECK(cuda_device_count() > 0, "--device cuda: ", cuda_unavailable_reason());
    return Device::cuda;
  }
  if (cuda_device_count() > 0 && cuda_training_supported()) return Device::cuda;
  if (cuda_device_count() > 0) {
    out << "note: a GPU is present, but this build trains on the CPU only (the CUDA training "
           "backend is not built yet)\n";
  }
  return Device::cpu;
}

}  // namespace ft::cli
