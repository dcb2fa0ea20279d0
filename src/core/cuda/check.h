// Error checks for CUDA calls: every call's status becomes an ft::Error naming the call.
#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

#define FT_CUDA_CHECK(call)                                                                   \
  do {                                                                                        \
    const cudaError_t ft_err_ = (call);                                                       \
    if (ft_err_ != cudaSuccess)                                                               \
      throw ::ft::Error(::ft::str("CUDA error: ", cudaGetErrorString(ft_err_), " in ", #call, \
                                  " at ", __FILE__, ":", __LINE__));                          \
  } while (0)

// After a kernel launch: launch errors now, execution errors at the next synchronisation.
#define FT_CUDA_CHECK_LAUNCH() FT_CUDA_CHECK(cudaGetLastError())
