// FT_HOST_DEVICE: functions of plain headers that CUDA kernels call too (host and device under
// nvcc; plain C++ elsewhere, so that the CPU build and its tests read the same code).
#pragma once

#ifdef __CUDACC__
#define FT_HOST_DEVICE __host__ __device__
#else
#define FT_HOST_DEVICE
#endif
