// The CUDA implementations behind attention.h's forward()/backward(). dispatch.cpp validates
// every tensor before calling them (shapes, dtypes, q/k/v/do on the GPU), so they may assume
// agreeing shapes. This header is plain C++: dispatch.cpp includes it without nvcc.
#pragma once

#include "attention/attention.h"
#include "attention/kernel_config.h"
#include "core/tensor.h"

namespace ft::attention::cuda {

// naive: q, k, v (and do) fp32 or bf16 on the GPU; segment ids int32 [B, S] on the CPU or the
// GPU. o, lse and the gradients are returned on the GPU; lse is fp32. saved holds the fp32
// probabilities P [B, Hq, S, S] for both dtypes, as on the CPU: the softmax backward then sees
// unrounded probabilities (bf16 copies are made per launch where P is a GEMM operand).
ForwardOutput naive_forward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& segment_ids);
Gradients naive_backward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                         const ForwardOutput& fwd, const Tensor& dout);

// flash: q, k, v (and do) fp32 or bf16 on the GPU; segment ids on either device. config: the
// bf16 kernels' tiles (already accepted by can_implement); fp32 runs its fixed kernels. lse is
// fp32; saved holds the per-16-position segment summary (int32 [B, ceil(S/16), 4]) when the mask
// has segments, so backward does not recompute it.
ForwardOutput flash_forward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& segment_ids, const KernelConfig& config);
Gradients flash_backward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                         const ForwardOutput& fwd, const Tensor& dout, const Tensor& segment_ids,
                         const KernelConfig& config);

// The same reading q, k and v inside a fused QKV buffer [B, S, (Hq + 2 Hkv) * D] (attention.h's
// forward_packed) and writing dq, dk and dv into dqkv in the same layout, for configurations
// whose kernels take strided rows in that direction (flash_reads_packed: bf16 on the tma path).
bool flash_reads_packed(const Problem& p, const KernelConfig& config, KernelDirection which);
ForwardOutput flash_forward_packed(const Problem& p, const Tensor& qkv, const Tensor& segment_ids,
                                   const KernelConfig& config);
void flash_backward_packed(const Problem& p, const Tensor& qkv, const ForwardOutput& fwd,
                           const Tensor& dout, const Tensor& segment_ids,
                           const KernelConfig& config, Tensor& dqkv);

// The packed calls for kernels that read dense q, k, v (packed.cu): the three parts of a fused
// QKV buffer [B, S, (Hq + 2 Hkv) * D] copied out, and dq, dk, dv copied into the fused gradient.
struct Unpacked {
  Tensor q, k, v;
};
Unpacked unpack(const Problem& p, const Tensor& qkv);
void pack_gradients(const Problem& p, const Gradients& g, Tensor& dqkv);

}  // namespace ft::attention::cuda
