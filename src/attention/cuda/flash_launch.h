// Launchers of the CUDA flash kernels, called by flash.cu (which allocates the outputs, builds
// FlashParams, summarises the segment ids and runs the backward preprocess that fills
// FlashParams::dsum). Each launcher runs on `stream` and checks its launch.
#pragma once

#include <cuda_runtime.h>

#include "attention/cuda/flash_common.cuh"
#include "attention/kernel_config.h"

namespace ft::attention::cuda {

// fp32 (flash_fp32.cu): exact fp32 arithmetic on CUDA cores, fixed tiles, every head dim the
// API allows. Forward writes o (fp32) and lse. Backward reads o, lse and dsum and writes dq, dk
// and dv (fp32) without atomics: the same inputs give the same bits.
void flash_fp32_forward(const FlashParams& p, cudaStream_t stream);
void flash_fp32_backward(const FlashParams& p, cudaStream_t stream);

// bf16 (flash_bf16_*.cu): tensor cores, the tiles and paths of the configuration (can_implement()
// must have accepted it). Forward writes o (bf16) and lse. Backward reads o, lse and dsum,
// accumulates dq in dq_accum (fp32, zeroed by the preprocess) and writes dk and dv (bf16);
// flash.cu converts dq_accum into dq.
void flash_bf16_forward(const KernelConfig& config, const FlashParams& p, cudaStream_t stream);
void flash_bf16_backward(const KernelConfig& config, const FlashParams& p, cudaStream_t stream);

}  // namespace ft::attention::cuda
