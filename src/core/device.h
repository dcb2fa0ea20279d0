// What the machine offers beyond the CPU. Without a CUDA build these report no GPU.
#pragma once

#include <string>

namespace ft {

int cuda_device_count();                // 0 without CUDA, a driver or a GPU
std::string cuda_unavailable_reason();  // why cuda_device_count() is 0 ("" when it is not)
bool cuda_training_supported();         // the CUDA training backend is compiled in
std::string cuda_device_name(int device);

}  // namespace ft
