// The --device flag of the commands that run a model (train, generate): auto picks the GPU when
// this build can use it.
#pragma once

#include <ostream>
#include <string>

#include "core/device.h"
#include "core/error.h"

namespace ft::cli {

inline Device resolve_device(const std::string& flag, std::ostream& out) {
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
