// Activation recompute: what a layer keeps from its forward for backward under each Recompute
// mode, and the recomputation that its backward starts with.
//
// A layer's cache under none holds, per token: norm1's and norm2's outputs (C each, with their
// row statistics), q, k, v (Hq D + 2 Hkv D), the attention's o (Hq D) and lse (Hq fp32 values;
// naive also keeps its S x S probabilities), the residual after attention x_mid (C), and the
// MLP's F-wide fc, gate (LLaMA) and activation; beside it the layer's input (C) stays kept in
// the residual stream. Each mode releases a part after the forward and rebuilds it, with the
// forward's own functions (transformer.cpp), at the start of the layer's backward:
//
//   attention  q, k, v: qkv GEMM, split, RoPE from the kept norm1 output. Flash keeps o and lse
//              (its backward reads them; re-running flash would cost as much as its backward
//              saves); naive's probabilities are the big part, and they only come with a whole
//              forward, so naive keeps no attention output at all and re-runs its forward.
//   mlp        fc, gate and the activation: the up (and gate) GEMM and the activation from the
//              kept norm2 output.
//   block      everything but the input: norm1 (the unfused norm of the input is bit-identical
//              to the fused add + norm that wrote it, nn/norms.cpp), then the layer's forward up
//              to the MLP's activation (the down projection's output is only needed forward).
//   elementwise  the outputs of element-wise ops: norm1's and norm2's (unfused norms of the
//              layer's input and of x_mid, as block does for norm1) and, with SwiGLU, the
//              activation (from the kept fc and gate). No product runs again: one
//              element-wise pass per tensor re-made (llama3-1b: -2.66 GB for 1.5% of a step,
//              docs/PERF.md); GELU's output stays (on the GPU the up projection's GEMM epilogue
//              writes it: only re-running that GEMM, as mlp does, gives its bits).
//
// Bit-identical to none: the same ops on the same inputs in the same order, and nothing in the
// forward draws random numbers (no dropout). The CUDA kernels give the same bits on the same
// inputs too, so the recomputed activations equal the dropped ones.
//
// Profile: the recomputed ops go to the "recompute" row (models/step_profile.h), not to their
// families, so that every other row stays one forward's and one backward's work, comparable
// with a run without recompute and with the PyTorch peer, and the price of the memory saved is
// one number.
#include "core/error.h"
#include "models/transformer_parts.h"

namespace ft::models {

const char* recompute_name(Recompute mode) {
  switch (mode) {
    case Recompute::none:
      return "none";
    case Recompute::attention:
      return "attention";
    case Recompute::mlp:
      return "mlp";
    case Recompute::block:
      return "block";
    case Recompute::elementwise:
      return "elementwise";
  }
  return "?";
}

Recompute parse_recompute(const std::string& name) {
  for (Recompute mode : {Recompute::none, Recompute::attention, Recompute::mlp, Recompute::block,
                         Recompute::elementwise}) {
    if (name == recompute_name(mode)) return mode;
  }
  throw Error(str("unknown recompute mode '", name,
                  "' (allowed: none, attention, mlp, block, elementwise)"));
}

namespace {

// The attention's whole forward output is rebuilt by re-running it (every implementation but
// flash, whose o and lse are kept).
bool reruns_attention(attention::Impl impl) {
  return impl != attention::Impl::flash;
}

}  // namespace

void Transformer::drop_recomputable(LayerCache& c) const {
  switch (recompute_) {
    case Recompute::none:
      return;
    case Recompute::attention:
      c.q = c.k = c.v = c.qkv = Tensor();
      if (reruns_attention(attention_.impl)) c.att = attention::ForwardOutput{};
      return;
    case Recompute::mlp:
      c.fc = c.gate = c.mlp_act = Tensor();
      return;
    case Recompute::block:
      c = LayerCache();
      return;
    case Recompute::elementwise:
      c.norm1 = c.norm2 = NormOutput{};
      if (config_.mlp() == MlpKind::swiglu) c.mlp_act = Tensor();
      return;
  }
}

void Transformer::recompute_dropped(int64_t l) {
  if (recompute_ == Recompute::none) return;
  LayerCache& c = cache_[static_cast<size_t>(l)];
  const Tensor& x_in = residual_[static_cast<size_t>(l)];
  const ProfileRedirect redirect(profile_, OpFamily::recompute);
  if (recompute_ == Recompute::elementwise) {
    const Weights::Layer& W = w_->layers[static_cast<size_t>(l)];
    ProfileRegion region(profile_, OpFamily::norm, traffic(x_in, 4));
    c.norm1 = norm_forward(x_in, norm_weights_reading(l));
    c.norm2 = norm_forward(c.x_mid, {W.norm2_w, W.norm2_b});
    if (config_.mlp() == MlpKind::swiglu) {
      region.enter(OpFamily::activation, traffic(c.fc, 3));
      c.mlp_act = act(c.fc.shape());
      nn::swiglu_forward(c.mlp_act, c.gate, c.fc);
    }
    return;
  }
  const bool block = recompute_ == Recompute::block;
  const bool qkv = block || recompute_ == Recompute::attention;
  const bool rerun_attention = block || (qkv && reruns_attention(attention_.impl));
  if (block) {
    const ProfileRegion region(profile_, OpFamily::norm, traffic(x_in, 2));
    c.norm1 = norm_forward(x_in, norm_weights_reading(l));
  }
  // Training positions start at 0 (the KV cache's forward keeps nothing for backward).
  if (qkv) attention_inputs(l, c, 0, false);
  if (rerun_attention) attention_forward(l, c);
  if (block) attention_output(l, c, x_in);
  if (block || recompute_ == Recompute::mlp) mlp_hidden(l, c);
}

int64_t Transformer::kept_bytes() const {
  size_t bytes = 0;
  auto add = [&bytes](const Tensor& t) {
    if (t.defined()) bytes += t.nbytes();
  };
  for (size_t l = 0; l < cache_.size(); ++l) {
    const LayerCache& c = cache_[l];
    add(residual_[l]);
    for (const NormOutput* n : {&c.norm1, &c.norm2}) {
      add(n->out);
      add(n->mean);
      add(n->rstd);
    }
    for (const Tensor* t : {&c.q, &c.k, &c.v, &c.qkv, &c.att.o, &c.att.lse, &c.att.saved, &c.x_mid,
                            &c.fc, &c.gate, &c.mlp_act}) {
      add(*t);
    }
  }
  return static_cast<int64_t>(bytes);
}

}  // namespace ft::models
