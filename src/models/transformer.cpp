#include "models/transformer.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/device.h"
#include "core/error.h"
#include "core/f32_halves.h"
#include "models/transformer_parts.h"

namespace ft::models {

namespace {

int64_t rows(const Tensor& t) {
  return t.numel() / t.dim(-1);
}

// The masters whose whole form is `master` or whose halves are hi and lo, on `device`.
Tensor masters_on(Device device, const Tensor& master, const Tensor& hi, const Tensor& lo) {
  if (!lo.defined()) return master.to(device);
  Tensor out = Tensor::empty(hi.shape(), DType::f32, device);
  const bool here = hi.device() == device;
  join_f32(out, here ? hi : hi.to(device), here ? lo : lo.to(device));
  return out;
}

// Sets the masters whose whole form is `master` or whose halves are hi and lo to values. Split
// where the values are, and the halves moved: masters set from the host (initialisation, loads)
// take no fp32 copy on the GPU.
void set_masters(Tensor& master, Tensor& hi, Tensor& lo, const Tensor& values) {
  if (!lo.defined()) return master.copy_from(values);
  FT_CHECK(values.numel() == hi.numel(), "master weights: ", shape_str(values.shape()),
           " given for ", shape_str(hi.shape()));
  const Tensor f32 = values.dtype() == DType::f32 ? values : values.to(DType::f32);
  if (f32.device() == hi.device()) return split_f32(hi, lo, f32);
  Tensor h = Tensor::empty(hi.shape(), DType::bf16, f32.device());
  Tensor l = Tensor::empty(lo.shape(), DType::i16, f32.device());
  split_f32(h, l, f32);
  hi.copy_from(h);
  lo.copy_from(l);
}

}  // namespace

Tensor Parameter::master_weights() const {
  return master_weights(compute.device());
}

Tensor Parameter::master_weights(Device device) const {
  return masters_on(device, master, compute, master_lo);
}

void Parameter::set_master_weights(const Tensor& values) {
  set_masters(master, compute, master_lo, values);
}

Transformer::Transformer(const ModelConfig& config, DType compute_dtype,
                         AttentionSettings attention, Device device, int64_t parameter_alignment)
    : config_(config),
      compute_dtype_(compute_dtype),
      master_dtype_(compute_dtype == DType::f64 ? DType::f64 : DType::f32),
      attention_(attention),
      device_(device),
      parameter_alignment_(parameter_alignment),
      w_(std::make_unique<Weights>()) {
  config_.validate();
  FT_CHECK(
      compute_dtype == DType::f32 || compute_dtype == DType::bf16 || compute_dtype == DType::f64,
      "model dtype must be fp32 or bf16 (fp64 for tests), got ", dtype_name(compute_dtype));
  FT_CHECK(device == Device::cpu || cuda_training_supported(), "training on ", device_name(device),
           " needs a flashtrain built with CUDA; use --device cpu");
  if (device == Device::cuda) {
    const int gpu = cuda_current_device();
    const int cc = cuda_compute_capability(gpu);
    FT_CHECK(cc >= 80, "GPU ", gpu, " (", cuda_device_name(gpu), ") is sm_", cc,
             "; flashtrain's CUDA kernels and bf16 need sm_80 or newer");
  }
  FT_CHECK(parameter_alignment >= 1, "parameter alignment must be >= 1 element, got ",
           parameter_alignment);
  FT_CHECK(device == Device::cpu || compute_dtype != DType::f64,
           "fp64 models run on the CPU only (they exist for gradient checks)");
  FT_CHECK(attention.window >= 0, "window must be >= 0, got ", attention.window);
  build_parameters();
  if (config_.rope()) {
    rope_ = nn::make_rope_table(config_.max_seq_len, config_.head_dim(), config_.rope_theta,
                                config_.rope_scaling, device_);
  }
}

Transformer::~Transformer() = default;

void Transformer::build_parameters() {
  const ModelConfig& c = config_;
  const int64_t C = c.n_embd, F = c.ffn_hidden, Vp = c.padded_vocab_size;
  struct Spec {
    std::string name;
    Shape shape;
    Parameter** slot;
  };
  std::vector<Spec> specs;
  specs.push_back({"wte", {Vp, C}, &w_->wte});
  if (c.learned_positions()) specs.push_back({"wpe", {c.max_seq_len, C}, &w_->wpe});
  w_->layers.resize(static_cast<size_t>(c.n_layer));
  for (int64_t l = 0; l < c.n_layer; ++l) {
    Weights::Layer& L = w_->layers[static_cast<size_t>(l)];
    const std::string p = "h." + std::to_string(l) + ".";
    specs.push_back({p + "norm1.weight", {C}, &L.norm1_w});
    if (c.norm() == NormKind::layernorm) specs.push_back({p + "norm1.bias", {C}, &L.norm1_b});
    specs.push_back({p + "attn.qkv.weight", {c.qkv_width(), C}, &L.qkv_w});
    if (c.bias()) specs.push_back({p + "attn.qkv.bias", {c.qkv_width()}, &L.qkv_b});
    specs.push_back({p + "attn.proj.weight", {C, C}, &L.proj_w});
    if (c.bias()) specs.push_back({p + "attn.proj.bias", {C}, &L.proj_b});
    specs.push_back({p + "norm2.weight", {C}, &L.norm2_w});
    if (c.norm() == NormKind::layernorm) specs.push_back({p + "norm2.bias", {C}, &L.norm2_b});
    specs.push_back({p + "mlp.fc.weight", {F, C}, &L.fc_w});
    if (c.bias()) specs.push_back({p + "mlp.fc.bias", {F}, &L.fc_b});
    if (c.mlp() == MlpKind::swiglu) specs.push_back({p + "mlp.gate.weight", {F, C}, &L.gate_w});
    specs.push_back({p + "mlp.proj.weight", {C, F}, &L.out_w});
    if (c.bias()) specs.push_back({p + "mlp.proj.bias", {C}, &L.out_b});
  }
  specs.push_back({"normf.weight", {C}, &w_->normf_w});
  if (c.norm() == NormKind::layernorm) specs.push_back({"normf.bias", {C}, &w_->normf_b});
  if (!c.tied_embeddings()) specs.push_back({"head.weight", {Vp, C}, &w_->head});

  params_.resize(specs.size());  // sized once: the slots below point into it
  const int64_t align = parameter_alignment_;
  int64_t total = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    params_[i].offset = total;
    total += (shape_numel(specs[i].shape) + align - 1) / align * align;
  }
  flat_grad_ = Tensor::zeros({total}, master_dtype_, device_);
  if (compute_dtype_ == master_dtype_) {
    flat_master_ = flat_compute_ = Tensor::zeros({total}, master_dtype_, device_);
  } else {  // bf16: the fp32 masters split, the compute copy their high half
    flat_compute_ = Tensor::zeros({total}, compute_dtype_, device_);
    flat_master_lo_ = Tensor::zeros({total}, DType::i16, device_);
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    Parameter& p = params_[i];
    p.name = specs[i].name;
    p.decay = specs[i].shape.size() >= 2;
    const int64_t begin = p.offset, end = p.offset + shape_numel(specs[i].shape);
    auto view = [&](const Tensor& flat) { return flat.slice(begin, end).view(specs[i].shape); };
    if (flat_master_.defined()) p.master = view(flat_master_);
    if (flat_master_lo_.defined()) p.master_lo = view(flat_master_lo_);
    p.grad = view(flat_grad_);
    p.compute = view(flat_compute_);
    *specs[i].slot = &p;
  }
}

Tensor Transformer::master_range(int64_t begin, int64_t end, Device device) const {
  auto range = [&](const Tensor& flat) { return flat.defined() ? flat.slice(begin, end) : flat; };
  return masters_on(device, range(flat_master_), range(flat_compute_), range(flat_master_lo_));
}

void Transformer::set_master_range(int64_t begin, const Tensor& values) {
  const int64_t end = begin + values.numel();
  auto range = [&](const Tensor& flat) { return flat.defined() ? flat.slice(begin, end) : flat; };
  Tensor master = range(flat_master_), hi = range(flat_compute_), lo = range(flat_master_lo_);
  set_masters(master, hi, lo, values);
}

int64_t Transformer::weight_bytes() const {
  int64_t bytes = static_cast<int64_t>(flat_compute_.nbytes());
  if (flat_master_lo_.defined()) bytes += static_cast<int64_t>(flat_master_lo_.nbytes());
  return bytes;
}

void Transformer::report_ready(const GradientReady& ready,
                               std::initializer_list<const Parameter*> params) {
  if (!ready) return;
  // Queueing a bucket's collective (and, on the CPU, running it) is communication.
  const ProfileRegion region(profile_, OpFamily::all_reduce);
  for (const Parameter* p : params) {
    if (p != nullptr) ready(static_cast<size_t>(p - params_.data()));
  }
}

void Transformer::init_weights(uint64_t seed) {
  Rng rng(seed);
  const double std = 0.02, residual_std = 0.02 / std::sqrt(2.0 * config_.n_layer);
  for (Parameter& p : params_) {
    const bool is_norm = p.name.find("norm") != std::string::npos;
    const bool is_bias = p.name.ends_with(".bias");
    // Drawn on the CPU, so a model gets the same weights on every device.
    Tensor host = Tensor::empty(p.shape(), master_dtype_);
    if (is_norm && !is_bias) {
      host.fill(1.0);
    } else if (is_bias) {
      host.zero();
    } else {
      const bool residual =
          p.name.ends_with("attn.proj.weight") || p.name.ends_with("mlp.proj.weight");
      fill_normal(host, rng, 0.0, residual ? residual_std : std);
    }
    // Rows past the real vocabulary are never looked up and never predicted: keep them zero.
    if (&p == w_->wte || &p == w_->head) {
      Tensor pad = host.slice(config_.vocab_size, config_.padded_vocab_size);
      pad.zero();
    }
    p.set_master_weights(host);
  }
}

Parameter* Transformer::find(const std::string& name) {
  for (Parameter& p : params_)
    if (p.name == name) return &p;
  return nullptr;
}

Parameter& Transformer::parameter(const std::string& name) {
  Parameter* p = find(name);
  FT_CHECK(p != nullptr, "model ", config_.name, " has no parameter '", name, "'");
  return *p;
}

Parameter& Transformer::layer_parameter(int64_t layer, const std::string& name) {
  return parameter("h." + std::to_string(layer) + "." + name);
}

void Transformer::zero_grad() {
  if (!overwrite_first_grads_) {
    flat_grad_.zero();
    grads_fresh_ = head_grad_fresh_ = false;
    return;
  }
  // The embedding's backward adds its rows into wpe's and wte's gradients; a tied wte was
  // written by the classifier's backward before it.
  for (Parameter* p : {w_->wpe, w_->head ? w_->wte : nullptr}) {
    if (p != nullptr) p->grad.zero();
  }
  grads_fresh_ = head_grad_fresh_ = true;
}

int64_t Transformer::zeroed_grad_bytes() const {
  if (!overwrite_first_grads_) return flat_grad_.nbytes();
  int64_t bytes = 0;
  for (const Parameter* p : {w_->wpe, w_->head ? w_->wte : nullptr}) {
    if (p != nullptr) bytes += p->grad.nbytes();
  }
  return bytes;
}

nn::GradStore Transformer::grad_store() const {
  return grads_fresh_ ? nn::GradStore::overwrite : nn::GradStore::accumulate;
}

nn::GradStore Transformer::take_head_grad_store() {
  return std::exchange(head_grad_fresh_, false) ? nn::GradStore::overwrite
                                                : nn::GradStore::accumulate;
}

Tensor Transformer::act(const Shape& shape) const {
  return Tensor::empty(shape, compute_dtype_, device_);
}

void Transformer::count_attention_flops(OpFamily family, const attention::Problem& problem,
                                        double factor) {
  if (profile_ == nullptr || !profile_->recording()) return;
  // With document masks the pairs are counted element by element on the host: after the step.
  profile_->add_work_later(family, [problem, ids = segment_ids_, factor] {
    const Tensor host = ids.defined() && ids.device() != Device::cpu ? ids.to(Device::cpu) : ids;
    return factor * 4.0 * static_cast<double>(problem.attended_pairs(host)) *
           static_cast<double>(problem.head_dim);
  });
}

attention::Problem Transformer::attention_problem(int64_t layer) const {
  return attention_problem(layer, B_, T_, segment_ids_.defined());
}

attention::Problem Transformer::attention_problem(int64_t layer, int64_t batch, int64_t seq_len,
                                                  bool with_segments) const {
  attention::Problem p;
  p.batch = batch;
  p.seq_len = seq_len;
  p.q_heads = config_.n_head;
  p.kv_heads = config_.n_kv_head;
  p.head_dim = config_.head_dim();
  p.dtype = compute_dtype_;
  p.mask.causal = true;
  const bool global = attention_.global_every > 0 && (layer + 1) % attention_.global_every == 0;
  p.mask.window = global ? 0 : attention_.window;
  p.mask.has_segments = with_segments;
  p.deterministic = attention_.deterministic;
  return p;
}

const attention::KernelConfig* Transformer::flash_config(const attention::Problem& problem,
                                                         attention::KernelConfig& storage) const {
  if (!attention_.kernel_configs || device_ != Device::cuda ||
      attention_.impl != attention::Impl::flash) {
    return nullptr;
  }
  storage = attention::choose_kernel_config(attention_.kernel_configs.get(),
                                            attention::DeviceLimits::current(), problem)
                .config;
  return &storage;
}

std::vector<attention::KernelConfigChoice> Transformer::flash_kernel_configs(
    int64_t batch, int64_t seq_len, bool with_segments) const {
  std::vector<attention::KernelConfigChoice> out;
  if (device_ != Device::cuda || attention_.impl != attention::Impl::flash ||
      compute_dtype_ != DType::bf16) {
    return out;
  }
  const attention::DeviceLimits& device = attention::DeviceLimits::current();
  for (int64_t l = 0; l < config_.n_layer; ++l) {
    const attention::Problem p = attention_problem(l, batch, seq_len, with_segments);
    const attention::MaskClass mask_class = attention::mask_class_of(p.mask);
    const bool seen = std::any_of(out.begin(), out.end(),
                                  [&](const auto& c) { return c.mask_class == mask_class; });
    // Within a model only the mask class changes what is chosen and whether it can run.
    if (!seen) {
      out.push_back(attention::checked_kernel_config(attention_.kernel_configs.get(), device, p));
    }
  }
  return out;
}

Transformer::NormWeights Transformer::norm_weights_reading(int64_t l) const {
  if (l == config_.n_layer) return {w_->normf_w, w_->normf_b};
  const Weights::Layer& W = w_->layers[static_cast<size_t>(l)];
  return {W.norm1_w, W.norm1_b};
}

Transformer::NormOutput& Transformer::norm_reading(int64_t l) {
  return l == config_.n_layer ? final_norm_ : cache_[static_cast<size_t>(l)].norm1;
}

Transformer::NormOutput Transformer::norm_forward(const Tensor& x, NormWeights n) {
  NormOutput o{act(x.shape()), Tensor(), Tensor::empty({rows(x)}, master_dtype_, device_)};
  if (config_.norm() == NormKind::layernorm) {
    o.mean = Tensor::empty({rows(x)}, master_dtype_, device_);
    nn::layernorm_forward(o.out, o.mean, o.rstd, x, n.w->compute, n.b->compute, config_.norm_eps);
  } else {
    nn::rmsnorm_forward(o.out, o.rstd, x, n.w->compute, config_.norm_eps);
  }
  return o;
}

Transformer::NormOutput Transformer::add_norm_forward(Tensor& x_out, const Tensor& a,
                                                      const Tensor& b, NormWeights n) {
  x_out = act(a.shape());
  NormOutput o{act(a.shape()), Tensor(), Tensor::empty({rows(a)}, master_dtype_, device_)};
  if (config_.norm() == NormKind::layernorm) {
    o.mean = Tensor::empty({rows(a)}, master_dtype_, device_);
    nn::add_layernorm_forward(x_out, o.out, o.mean, o.rstd, a, b, n.w->compute, n.b->compute,
                              config_.norm_eps);
  } else {
    nn::add_rmsnorm_forward(x_out, o.out, o.rstd, a, b, n.w->compute, config_.norm_eps);
  }
  return o;
}

void Transformer::norm_backward(Tensor& dx, const Tensor& dout, const Tensor& x, NormWeights n,
                                const NormOutput& saved, bool accumulate, nn::GradStore store) {
  const bool ln = config_.norm() == NormKind::layernorm;
  const Tensor& w = n.w->compute;
  if (ln && accumulate) {
    nn::layernorm_backward_add(dx, n.w->grad, n.b->grad, dout, x, w, saved.mean, saved.rstd, store);
  } else if (ln) {
    nn::layernorm_backward(dx, n.w->grad, n.b->grad, dout, x, w, saved.mean, saved.rstd, store);
  } else if (accumulate) {
    nn::rmsnorm_backward_add(dx, n.w->grad, dout, x, w, saved.rstd, store);
  } else {
    nn::rmsnorm_backward(dx, n.w->grad, dout, x, w, saved.rstd, store);
  }
}

void Transformer::layer_forward(int64_t l, const Tensor& x_in, Tensor& x_out, KvCache* kv) {
  const Weights::Layer& W = w_->layers[static_cast<size_t>(l)];
  LayerCache& c = cache_[static_cast<size_t>(l)];
  const int64_t past = kv ? kv->length : 0;
  attention_inputs(l, c, past, kv != nullptr);
  if (kv) {
    Tensor k_rows = kv->k[static_cast<size_t>(l)].slice(past, past + T_);
    Tensor v_rows = kv->v[static_cast<size_t>(l)].slice(past, past + T_);
    k_rows.copy_from(c.k);
    v_rows.copy_from(c.v);
  }
  if (past > 0) {
    cached_attention(l, c, *kv);
  } else {
    attention_forward(l, c);
  }
  attention_output(l, c, x_in);
  mlp_hidden(l, c);
  Tensor mlp = act({B_, T_, config_.n_embd});
  ProfileRegion region(profile_, OpFamily::gemm_mlp_down, gemm_flops(B_ * T_, W.out_w));
  nn::linear_forward(mlp, c.mlp_act, W.out_w->compute, W.out_b ? W.out_b->compute : Tensor());
  region.enter(OpFamily::norm, traffic(mlp, 4));
  norm_reading(l + 1) = add_norm_forward(x_out, c.x_mid, mlp, norm_weights_reading(l + 1));
  region.leave();
  if (!kv) drop_recomputable(c);
}

void Transformer::attention_inputs(int64_t l, LayerCache& c, int64_t past, bool for_cache) {
  const Weights::Layer& W = w_->layers[static_cast<size_t>(l)];
  const int64_t B = B_, T = T_, D = config_.head_dim();
  Tensor qkv = act({B, T, config_.qkv_width()});
  ProfileRegion region(profile_, OpFamily::gemm_qkv, gemm_flops(B * T, W.qkv_w));
  nn::linear_forward(qkv, c.norm1.out, W.qkv_w->compute, W.qkv_b ? W.qkv_b->compute : Tensor());
  if (!for_cache && reads_packed_qkv()) {
    // Attention reads q, k, v where the projection wrote them: no split. RoPE turns q's and k's
    // heads in place (positions from 0: a cache, which starts elsewhere, takes the split).
    if (config_.rope()) {
      Tensor heads = qkv.view({B, T, config_.n_head + 2 * config_.n_kv_head, D});
      region.enter(OpFamily::rope, traffic(heads, 2) * (config_.n_head + config_.n_kv_head) /
                                       (config_.n_head + 2 * config_.n_kv_head));
      nn::rope_forward_heads(heads, rope_, config_.n_head + config_.n_kv_head);
    }
    c.qkv = qkv;
    return;
  }
  c.q = act({B, T, config_.n_head, D});
  c.k = act({B, T, config_.n_kv_head, D});
  c.v = act({B, T, config_.n_kv_head, D});
  region.enter(OpFamily::qkv_copy, traffic(qkv, 2));
  nn::split_qkv(c.q, c.k, c.v, qkv);
  if (config_.rope()) {
    region.enter(OpFamily::rope, traffic(c.q, 2) + traffic(c.k, 2));
    nn::rope_forward(c.q, c.q, rope_, past);
    nn::rope_forward(c.k, c.k, rope_, past);
  }
}

void Transformer::attention_forward(int64_t l, LayerCache& c) {
  const attention::Problem problem = attention_problem(l);
  const ProfileRegion region(profile_, OpFamily::attention_forward);
  count_attention_flops(OpFamily::attention_forward, problem, 1.0);
  attention::KernelConfig config;
  c.att = c.qkv.defined() ? attention::forward_packed(attention_.impl, problem, c.qkv, segment_ids_,
                                                      flash_config(problem, config))
                          : attention::forward(attention_.impl, problem, c.q, c.k, c.v,
                                               segment_ids_, flash_config(problem, config));
}

void Transformer::attention_output(int64_t l, LayerCache& c, const Tensor& x_in) {
  const Weights::Layer& W = w_->layers[static_cast<size_t>(l)];
  const int64_t B = B_, T = T_;
  Tensor proj = act({B, T, config_.n_embd});
  ProfileRegion region(profile_, OpFamily::gemm_attn_out, gemm_flops(B * T, W.proj_w));
  nn::linear_forward(proj, c.att.o.view({B, T, config_.n_head * config_.head_dim()}),
                     W.proj_w->compute, W.proj_b ? W.proj_b->compute : Tensor());
  region.enter(OpFamily::norm, traffic(proj, 4));  // x_in, proj read; x_mid, h written
  c.norm2 = add_norm_forward(c.x_mid, x_in, proj, {W.norm2_w, W.norm2_b});
}

void Transformer::mlp_hidden(int64_t l, LayerCache& c) {
  const Weights::Layer& W = w_->layers[static_cast<size_t>(l)];
  const int64_t B = B_, T = T_, F = config_.ffn_hidden;
  const Tensor fc_bias = W.fc_b ? W.fc_b->compute : Tensor();
  c.fc = act({B, T, F});
  c.mlp_act = act({B, T, F});
  ProfileRegion region(profile_);
  if (config_.mlp() == MlpKind::gelu) {
    region.enter(OpFamily::gemm_mlp_up, gemm_flops(B * T, W.fc_w));
    nn::linear_gelu_forward(c.fc, c.mlp_act, c.norm2.out, W.fc_w->compute, fc_bias);
  } else {
    region.enter(OpFamily::gemm_mlp_up, gemm_flops(B * T, W.fc_w) + gemm_flops(B * T, W.gate_w));
    nn::linear_forward(c.fc, c.norm2.out, W.fc_w->compute, fc_bias);
    c.gate = act({B, T, F});
    nn::linear_forward(c.gate, c.norm2.out, W.gate_w->compute, Tensor());
    region.enter(OpFamily::activation, traffic(c.fc, 3));
    nn::swiglu_forward(c.mlp_act, c.gate, c.fc);
  }
}

void Transformer::cached_attention(int64_t l, LayerCache& c, KvCache& kv) {
  const int64_t past = kv.length, Hq = config_.n_head, D = config_.head_dim();
  const attention::Problem problem = attention_problem(l);
  // The keys the new query at position `past` may attend: causal (up to itself), within the
  // window, and within its document (its segment's run of positions).
  int64_t first = 0;
  if (segment_ids_.defined()) {
    first = past;
    while (first > 0 &&
           kv.segments[static_cast<size_t>(first - 1)] == kv.segments[static_cast<size_t>(past)]) {
      --first;
    }
  }
  if (problem.mask.window > 0) first = std::max(first, past - (problem.mask.window - 1));
  c.att = attention::ForwardOutput{};
  c.att.o = act({1, 1, Hq, D});
  Tensor o = c.att.o.view({Hq, D});
  nn::decode_attention(o, c.q.view({Hq, D}), kv.k[static_cast<size_t>(l)],
                       kv.v[static_cast<size_t>(l)], first, past, problem.effective_scale());
}

KvCache Transformer::make_kv_cache(int64_t capacity) const {
  if (capacity == 0) capacity = config_.max_seq_len;
  FT_CHECK(capacity >= 1 && capacity <= config_.max_seq_len, "KV cache capacity ", capacity,
           " must be in [1, ", config_.max_seq_len, "] (the model's context)");
  KvCache cache;
  for (int64_t l = 0; l < config_.n_layer; ++l) {
    cache.k.push_back(act({capacity, config_.n_kv_head, config_.head_dim()}));
    cache.v.push_back(act({capacity, config_.n_kv_head, config_.head_dim()}));
  }
  return cache;
}

void Transformer::forward_cached(const Tensor& tokens, KvCache& cache, const Tensor& segment_ids) {
  FT_CHECK(tokens.dtype() == DType::i32 && tokens.ndim() == 2 && tokens.dim(0) == 1 &&
               tokens.dim(1) >= 1,
           "forward_cached: tokens must be int32 [1, T], got ", dtype_name(tokens.dtype()), " ",
           shape_str(tokens.shape()));
  const int64_t T = tokens.dim(1);
  FT_CHECK(
      static_cast<int64_t>(cache.k.size()) == config_.n_layer && cache.v.size() == cache.k.size(),
      "forward_cached: the cache has ", cache.k.size(), " layers, the model ", config_.n_layer,
      " (make it with make_kv_cache)");
  FT_CHECK(cache.length + T <= cache.capacity(), "forward_cached: ", cache.length, " cached + ", T,
           " new positions exceed the cache's capacity ", cache.capacity());
  FT_CHECK(cache.length == 0 || T == 1,
           "forward_cached: after the first chunk, one token per "
           "call (got ",
           T, " with ", cache.length, " cached)");
  run_forward(tokens, segment_ids, &cache);
  have_targets_ = false;
}

void Transformer::run_forward(const Tensor& tokens, const Tensor& segment_ids, KvCache* kv) {
  FT_CHECK(tokens.dtype() == DType::i32 && tokens.ndim() == 2, "tokens must be int32 [B, T], got ",
           dtype_name(tokens.dtype()), " ", shape_str(tokens.shape()));
  B_ = tokens.dim(0);
  T_ = tokens.dim(1);
  const int64_t past = kv ? kv->length : 0;
  FT_CHECK(past + T_ <= config_.max_seq_len, "sequence length ", past + T_,
           " exceeds the model's context ", config_.max_seq_len);
  if (segment_ids.defined()) {
    FT_CHECK(segment_ids.shape() == tokens.shape() && segment_ids.dtype() == DType::i32,
             "segment ids must be int32 ", shape_str(tokens.shape()), ", got ",
             dtype_name(segment_ids.dtype()), " ", shape_str(segment_ids.shape()));
  }
  tokens_ = tokens;
  // The last call's logits (or gradients) go before this forward allocates anything.
  logits_ = Tensor();
  dnorm_ = Tensor();
  ProfileRegion region(profile_);
  // Once per forward, not once per layer: every layer's attention (and backward) reads this copy.
  if (segment_ids.defined() && segment_ids.device() != device_) {
    region.enter(OpFamily::data, traffic(segment_ids, 1));
    segment_ids_ = segment_ids.to(device_);
  } else {
    segment_ids_ = segment_ids;
  }
  const int64_t L = config_.n_layer, C = config_.n_embd;
  residual_.assign(static_cast<size_t>(L + 1), Tensor());
  cache_.assign(static_cast<size_t>(L), LayerCache());
  residual_[0] = act({B_, T_, C});
  // Learned positions of the new tokens: rows past .. past + T - 1 of wpe.
  const Tensor wpe = w_->wpe ? w_->wpe->compute.slice(past, config_.max_seq_len) : Tensor();
  // The rows it gathers from wte (and wpe) and the rows it writes.
  region.enter(OpFamily::embedding, traffic(residual_[0], wpe.defined() ? 3 : 2));
  nn::embedding_forward(residual_[0], tokens, w_->wte->compute, wpe);
  region.enter(OpFamily::norm, traffic(residual_[0], 2));
  norm_reading(0) = norm_forward(residual_[0], norm_weights_reading(0));
  region.leave();
  if (kv) {
    // Segment ids of the new positions, for the decode steps' document limits.
    const Tensor ids = segment_ids_.defined() ? segment_ids_.to(Device::cpu) : Tensor();
    for (int64_t t = 0; t < T_; ++t)
      kv->segments.push_back(ids.defined() ? ids.data<int32_t>()[t] : 0);
  }
  for (int64_t l = 0; l < L; ++l) {
    layer_forward(l, residual_[static_cast<size_t>(l)], residual_[static_cast<size_t>(l + 1)], kv);
    if (kv) {  // inference: nothing is kept for backward
      cache_[static_cast<size_t>(l)] = LayerCache();
      residual_[static_cast<size_t>(l)] = Tensor();
    }
  }
  // Counted now: backward frees each layer's cache as soon as it is used.
  size_t attention_bytes = 0;
  for (const LayerCache& c : cache_) {
    for (const Tensor* t : {&c.att.lse, &c.att.saved}) {
      if (t->defined()) attention_bytes += t->nbytes();
    }
  }
  attention_saved_bytes_ = static_cast<int64_t>(attention_bytes);
  saved_activation_bytes_ = kept_bytes();
  if (kv) {
    kv->length += T_;
    logits_ = act({1, config_.padded_vocab_size});
    logits_bytes_ = logits_.nbytes();
    nn::linear_forward(logits_, final_norm_.out.view({T_, C}).slice(T_ - 1, T_),
                       head_parameter()->compute, Tensor());
  }
  // Without a cache the classifier runs in forward_logits(), forward() or forward_train().
}

void Transformer::forward_logits(const Tensor& tokens, const Tensor& segment_ids) {
  run_forward(tokens, segment_ids);
  have_targets_ = false;
  head_loss_scale_.reset();
  logits_ = act({B_ * T_, config_.padded_vocab_size});
  logits_bytes_ = logits_.nbytes();
  const ProfileRegion region(profile_, OpFamily::gemm_classifier,
                             gemm_flops(B_ * T_, head_parameter()));
  nn::linear_forward(logits_, final_norm_.out.view({B_ * T_, config_.n_embd}),
                     head_parameter()->compute, Tensor());
}

int64_t auto_classifier_chunk(const ModelConfig& config, DType compute_dtype, int64_t rows) {
  constexpr int64_t kTile = 128;
  const int64_t row_bytes =
      config.padded_vocab_size * static_cast<int64_t>(dtype_size(compute_dtype));
  const int64_t most = std::max(kTile, kClassifierChunkBytes / row_bytes / kTile * kTile);
  if (rows <= most) return 0;
  const int64_t chunks = (rows + most - 1) / most;
  const int64_t even = (rows + chunks - 1) / chunks;
  return std::min(most, (even + kTile - 1) / kTile * kTile);
}

void Transformer::set_classifier_chunk(int64_t rows) {
  FT_CHECK(rows >= 0, "classifier chunk ", rows, " must be >= 0 rows (0: the whole batch)");
  classifier_chunk_ = rows;
}

bool Transformer::reads_packed_qkv() const {
  return attention_.qkv_in_place && attention::reads_packed_in_place(attention_.impl, device_);
}

Parameter* Transformer::head_parameter() const {
  return w_->head ? w_->head : w_->wte;
}

void Transformer::classifier_rows(int64_t r0, int64_t r1, Tensor& logits, bool have_logits,
                                  std::optional<double> dloss) {
  const int64_t C = config_.n_embd, N = B_ * T_;
  Parameter* head = head_parameter();
  const Tensor h = final_norm_.out.view({N, C}).slice(r0, r1);
  ProfileRegion region(profile_);
  if (!have_logits) {
    region.enter(OpFamily::gemm_classifier, gemm_flops(r1 - r0, head));
    nn::linear_forward(logits, h, head->compute, Tensor());
  }
  Tensor losses = losses_.slice(r0, r1);
  Tensor dlogits = dloss ? logits : Tensor();  // the fused loss writes dlogits over the logits
  region.enter(OpFamily::classifier_loss, traffic(logits, dloss ? 2 : 1));
  nn::softmax_cross_entropy(losses, dlogits, logits, targets_.view({N}).slice(r0, r1),
                            config_.vocab_size, dloss.value_or(0.0));
  if (!dloss) return;
  Tensor dh = dnorm_.view({N, C}).slice(r0, r1);
  Tensor no_bias;
  region.enter(OpFamily::gemm_classifier, 2 * gemm_flops(r1 - r0, head));
  nn::linear_backward(dh, head->grad, no_bias, logits, h, head->compute, take_head_grad_store());
}

void Transformer::classify(std::optional<double> dloss) {
  const int64_t N = B_ * T_, Vp = config_.padded_vocab_size;
  losses_ = Tensor::empty({N}, master_dtype_, device_);
  if (dloss) dnorm_ = act({B_, T_, config_.n_embd});
  const int64_t chunk = classifier_chunk_ == 0 ? N : std::min(classifier_chunk_, N);
  // One chunk's logits buffer, reused by every chunk. A forward() over one chunk keeps its
  // logits for backward() (and logits()); otherwise no chunk's logits outlive the chunk.
  Tensor buffer = act({chunk, Vp});
  logits_bytes_ = buffer.nbytes();
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t r1 = std::min(N, r0 + chunk);
    Tensor logits = buffer.slice(0, r1 - r0);
    classifier_rows(r0, r1, logits, false, dloss);
  }
  logits_ = chunk == N && !dloss ? buffer : Tensor();
}

double Transformer::mean_loss() const {
  return mean_loss_of(losses_);
}

double Transformer::mean_loss_of(const Tensor& losses) {
  FT_CHECK(losses.defined() && losses.numel() > 0, "mean_loss_of: no losses (no forward yet)");
  const Tensor l64 = losses.to(Device::cpu).to(DType::f64);
  double sum = 0.0;
  for (int64_t i = 0; i < l64.numel(); ++i) sum += l64.data<double>()[i];
  return sum / static_cast<double>(l64.numel());
}

void Transformer::check_targets(const Tensor& tokens, const Tensor& targets) const {
  FT_CHECK(targets.shape() == tokens.shape() && targets.dtype() == DType::i32,
           "targets must be int32 ", shape_str(tokens.shape()), ", got ",
           dtype_name(targets.dtype()), " ", shape_str(targets.shape()));
}

double Transformer::forward(const Tensor& tokens, const Tensor& targets,
                            const Tensor& segment_ids) {
  check_targets(tokens, targets);
  run_forward(tokens, segment_ids);
  targets_ = targets;
  head_loss_scale_.reset();
  classify(std::nullopt);
  have_targets_ = true;
  return mean_loss();
}

double Transformer::forward_train(const Tensor& tokens, const Tensor& targets, double loss_scale,
                                  const Tensor& segment_ids) {
  return mean_loss_of(forward_train_deferred(tokens, targets, loss_scale, segment_ids));
}

Tensor Transformer::forward_train_deferred(const Tensor& tokens, const Tensor& targets,
                                           double loss_scale, const Tensor& segment_ids) {
  check_targets(tokens, targets);
  run_forward(tokens, segment_ids);
  targets_ = targets;
  classify(loss_scale / static_cast<double>(B_ * T_));
  head_loss_scale_ = loss_scale;
  have_targets_ = true;
  return losses_;  // classify() allocates a new one per forward: the caller's stays valid
}

void Transformer::layer_backward(int64_t l, Tensor& dresidual) {
  const Weights::Layer& W = w_->layers[static_cast<size_t>(l)];
  LayerCache& c = cache_[static_cast<size_t>(l)];
  const int64_t B = B_, T = T_, C = config_.n_embd, D = config_.head_dim();
  const int64_t Hq = config_.n_head, Hkv = config_.n_kv_head, F = config_.ffn_hidden;
  auto bias_grad = [](Parameter* p) { return p ? p->grad : Tensor(); };
  const nn::GradStore store = grad_store();
  const Tensor& x_in = residual_[static_cast<size_t>(l)];
  recompute_dropped(l);

  // MLP branch: dresidual flows both into the branch and along the residual.
  Tensor db_out = bias_grad(W.out_b);
  ProfileRegion region(profile_, OpFamily::gemm_mlp_down, 2 * gemm_flops(B * T, W.out_w));
  Tensor dfc = act({B, T, F});
  Tensor dh2 = act({B, T, C});
  Tensor db_fc = bias_grad(W.fc_b);
  Tensor no_bias;
  if (config_.mlp() == MlpKind::gelu) {
    // Through the GELU in the same call (on the GPU in the down projection's GEMM epilogue: a
    // GELU model's profile has no activation row).
    nn::linear_gelu_backward(dfc, W.out_w->grad, db_out, dresidual, c.mlp_act, W.out_w->compute,
                             c.fc, store);
    region.enter(OpFamily::gemm_mlp_up, 2 * gemm_flops(B * T, W.fc_w));
    nn::linear_backward(dh2, W.fc_w->grad, db_fc, dfc, c.norm2.out, W.fc_w->compute, store);
  } else {
    Tensor dact = act({B, T, F});
    nn::linear_backward(dact, W.out_w->grad, db_out, dresidual, c.mlp_act, W.out_w->compute, store);
    Tensor dgate = act({B, T, F});
    region.enter(OpFamily::activation, traffic(dact, 5));
    nn::swiglu_backward(dgate, dfc, dact, c.gate, c.fc);
    Tensor dh2_gate = act({B, T, C});
    region.enter(OpFamily::gemm_mlp_up,
                 2 * (gemm_flops(B * T, W.gate_w) + gemm_flops(B * T, W.fc_w)));
    nn::linear_backward(dh2_gate, W.gate_w->grad, no_bias, dgate, c.norm2.out, W.gate_w->compute,
                        store);
    nn::linear_backward(dh2, W.fc_w->grad, db_fc, dfc, c.norm2.out, W.fc_w->compute, store);
    // The two projections' input gradients summed (what a GEMM accumulating into dh2 would do).
    nn::add(dh2, dh2, dh2_gate);
  }
  region.enter(OpFamily::norm, traffic(dh2, 4));  // dh2, x_mid read; dresidual read and written
  norm_backward(dresidual, dh2, c.x_mid, {W.norm2_w, W.norm2_b}, c.norm2, true,
                store);  // now d x_mid

  // Attention branch.
  Tensor datt = act({B, T, Hq * D});
  Tensor db_proj = bias_grad(W.proj_b);
  region.enter(OpFamily::gemm_attn_out, 2 * gemm_flops(B * T, W.proj_w));
  nn::linear_backward(datt, W.proj_w->grad, db_proj, dresidual, c.att.o.view({B, T, Hq * D}),
                      W.proj_w->compute, store);
  const attention::Problem problem = attention_problem(l);
  region.enter(OpFamily::attention_backward);
  count_attention_flops(OpFamily::attention_backward, problem, 2.5);
  attention::KernelConfig config;
  Tensor dqkv = act({B, T, config_.qkv_width()});
  if (c.qkv.defined()) {
    // dq, dk, dv straight into the fused gradient: no merge.
    attention::backward_packed(attention_.impl, problem, c.qkv, c.att, datt.view({B, T, Hq, D}),
                               dqkv, segment_ids_, flash_config(problem, config));
    if (config_.rope()) {
      Tensor heads = dqkv.view({B, T, Hq + 2 * Hkv, D});
      region.enter(OpFamily::rope, traffic(heads, 2) * (Hq + Hkv) / (Hq + 2 * Hkv));
      nn::rope_backward_heads(heads, rope_, Hq + Hkv);
    }
  } else {
    attention::Gradients g =
        attention::backward(attention_.impl, problem, c.q, c.k, c.v, c.att,
                            datt.view({B, T, Hq, D}), segment_ids_, flash_config(problem, config));
    if (config_.rope()) {
      region.enter(OpFamily::rope, traffic(g.dq, 2) + traffic(g.dk, 2));
      nn::rope_backward(g.dq, g.dq, rope_);
      nn::rope_backward(g.dk, g.dk, rope_);
    }
    FT_ASSERT(g.dk.dim(2) == Hkv);
    region.enter(OpFamily::qkv_copy, traffic(dqkv, 2));
    nn::merge_qkv(dqkv, g.dq, g.dk, g.dv);
  }
  Tensor dh1 = act({B, T, C});
  Tensor db_qkv = bias_grad(W.qkv_b);
  region.enter(OpFamily::gemm_qkv, 2 * gemm_flops(B * T, W.qkv_w));
  nn::linear_backward(dh1, W.qkv_w->grad, db_qkv, dqkv, c.norm1.out, W.qkv_w->compute, store);
  region.enter(OpFamily::norm, traffic(dh1, 4));
  norm_backward(dresidual, dh1, x_in, {W.norm1_w, W.norm1_b}, c.norm1, true,
                store);  // now d x_in
  region.leave();
  c = LayerCache();  // free this layer's activations as soon as they are used
}

void Transformer::backward(double loss_scale, const GradientReady& ready) {
  FT_CHECK(have_targets_, "backward() needs a forward() with targets first");
  const int64_t C = config_.n_embd, N = B_ * T_, L = config_.n_layer;
  const double dloss = loss_scale / static_cast<double>(N);
  if (head_loss_scale_) {
    FT_CHECK(*head_loss_scale_ == loss_scale, "backward(", loss_scale,
             ") after forward_train(..., ", *head_loss_scale_,
             "): the classifier's gradients were formed for that scale");
  } else if (logits_.defined()) {
    // forward() over one chunk kept the logits: their loss and gradients without a second GEMM.
    dnorm_ = act({B_, T_, C});
    classifier_rows(0, N, logits_, true, dloss);
    logits_ = Tensor();
  } else {
    classify(dloss);  // forward() walked the rows in chunks: each chunk's logits again
  }
  head_loss_scale_.reset();
  Tensor dnorm = std::exchange(dnorm_, Tensor());
  ProfileRegion region(profile_);
  report_ready(ready, {w_->head});  // a tied head (wte) is complete after the embedding
  // One residual gradient buffer for the whole stack: each layer adds its branches into it.
  Tensor dresidual = act({B_, T_, C});
  region.enter(OpFamily::norm, traffic(dnorm, 3));
  norm_backward(dresidual, dnorm, residual_.back(), norm_weights_reading(L), final_norm_, false,
                grad_store());
  dnorm = Tensor();
  region.leave();
  report_ready(ready, {w_->normf_w, w_->normf_b});
  for (int64_t l = L - 1; l >= 0; --l) {
    layer_backward(l, dresidual);
    const Weights::Layer& W = w_->layers[static_cast<size_t>(l)];
    report_ready(ready, {W.norm1_w, W.norm1_b, W.qkv_w, W.qkv_b, W.proj_w, W.proj_b, W.norm2_w,
                         W.norm2_b, W.fc_w, W.fc_b, W.gate_w, W.out_w, W.out_b});
  }
  Tensor dwpe = w_->wpe ? w_->wpe->grad : Tensor();
  // dresidual read; the gradient rows of wte (and wpe) read and written.
  region.enter(OpFamily::embedding,
               traffic(dresidual, 1) + 2.0 * (dwpe.defined() ? 2 : 1) *
                                           static_cast<double>(dresidual.numel()) *
                                           static_cast<double>(dtype_size(master_dtype_)));
  nn::embedding_backward(w_->wte->grad, dwpe, dresidual, tokens_);
  region.leave();
  report_ready(ready, {w_->wte, w_->wpe});
  grads_fresh_ = false;   // the next micro-batch of this step adds to what this one wrote
  have_targets_ = false;  // the logits buffer now holds gradients
}

}  // namespace ft::models
