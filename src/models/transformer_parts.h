// The transformer's private parts, shared by its two source files: transformer.cpp (the model)
// and recompute.cpp (what a layer keeps for backward, and its recomputation). Not for other
// includers: Transformer's interface is models/transformer.h.
#pragma once

#include <vector>

#include "models/transformer.h"

namespace ft::models {

// Non-owning views of the parameters, by role. Absent roles (no bias in LLaMA, no gate in
// GPT-2) stay null.
struct Transformer::Weights {
  struct Layer {
    Parameter *norm1_w = nullptr, *norm1_b = nullptr;
    Parameter *qkv_w = nullptr, *qkv_b = nullptr;
    Parameter *proj_w = nullptr, *proj_b = nullptr;
    Parameter *norm2_w = nullptr, *norm2_b = nullptr;
    Parameter *fc_w = nullptr, *fc_b = nullptr;    // GPT-2 fc; LLaMA up projection
    Parameter* gate_w = nullptr;                   // LLaMA gate projection
    Parameter *out_w = nullptr, *out_b = nullptr;  // MLP output (GPT-2 proj, LLaMA down)
  };
  Parameter *wte = nullptr, *wpe = nullptr;
  std::vector<Layer> layers;
  Parameter *normf_w = nullptr, *normf_b = nullptr;
  Parameter* head = nullptr;  // null when tied to wte
};

// What one layer keeps from forward for backward (under Recompute::none; the other modes
// release some of it after the forward and recompute it before the backward).
struct Transformer::LayerCache {
  NormOutput norm1;  // written by whoever produced the layer's input (fused with its add)
  Tensor q, k, v;    // after RoPE
  // Or, where attention reads them in place (Transformer::reads_packed_qkv), the projection's
  // output [B, T, (Hq + 2 Hkv) D] with q, k, v inside, and no q, k, v of their own.
  Tensor qkv;
  attention::ForwardOutput att;
  Tensor x_mid;  // residual after attention
  NormOutput norm2;
  Tensor fc, gate;  // MLP pre-activations (gate: LLaMA only)
  Tensor mlp_act;   // gelu(fc) or silu(gate) * up
};

// What the step profile counts (models/step_profile.h): a linear layer's forward product over
// `rows` rows (its backward is two such), and the bytes of `tensors` tensors shaped like `like`
// (an elementwise op moves each tensor it reads or writes once).
inline double gemm_flops(int64_t rows, const Parameter* w) {
  return 2.0 * static_cast<double>(rows) * static_cast<double>(w->numel());
}

inline double traffic(const Tensor& like, int tensors) {
  return static_cast<double>(tensors) * static_cast<double>(like.nbytes());
}

}  // namespace ft::models
