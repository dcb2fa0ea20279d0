// Host side of the TMA kernels (defined in tensor_map.cu): tensor maps over [B, S, H, D] tensors,
// the current device's multiprocessors and L2 bytes, and the tma forward's work-tile counters.
// The forward and the backward launchers (flash_tma_forward.cuh, flash_tma_backward.cuh) both
// read these declarations.
#pragma once

#include <cuda.h>  // CUtensorMap

#include <cstdint>

namespace ft::attention::cuda {

// A 4-d tensor map over a [B, S, H, D] bf16 tensor whose positions are `row_elems` elements
// apart (H * D when dense; more inside a fused QKV buffer): boxes of 64 columns x `box_rows` rows
// of one head, swizzled by 128 bytes.
CUtensorMap head_tensor_map(const void* base, int batch, int seq_len, int heads, int head_dim,
                            int64_t row_elems, int box_rows);
// A 4-d tensor map over a [B, S, H, D] fp32 tensor (the backward's dQ buffer) whose boxes are 32
// columns x 64 rows of one head, swizzled by 128 bytes.
CUtensorMap dq_tensor_map(float* base, int batch, int seq_len, int heads, int head_dim);
// Multiprocessors of the current device (the persistent grids' size).
int sm_count();
// L2 bytes of the current device (the backward's pair groups are sized to half of it).
int64_t l2_bytes();
// The two counters of the claimed work tiles (TmaForwardArgs::claims) for the stream the launch
// will run on, at zero; null where the launch deals by TileOrder instead: FT_TMA_DEAL=static, or a
// capture on a stream that has none yet.
int* tma_forward_claims();

}  // namespace ft::attention::cuda
