// The transformer skeleton shared by GPT-2 and LLaMA-3 (differences come from ModelConfig):
//
//   x = embed(tokens) [+ positions]
//   per layer:  x += proj(attention(rope?(split(qkv(norm1(x))))))
//               x += mlp(norm2(x))        gelu: proj(gelu(fc(h)))   swiglu: down(silu(gate(h)) *
//               up(h))
//   logits = head(norm_f(x))              (GPT-2: head is the token embedding, tied)
//   loss = mean cross-entropy over the real vocabulary
//
// Every layer runs its explicit forward and backward from src/nn; attention goes through
// src/attention with the implementation chosen at construction (naive or flash). Each residual
// add is fused with the norm that reads its result (norm2, the next layer's norm1, the final
// norm), and backward accumulates each norm's input gradient straight into one residual
// gradient buffer; GPT-2's fc + GELU is one GEMM with a GELU epilogue on the GPU.
//
// The parameters' master weights, gradients and compute copies are views into one flat buffer
// each (parameters in order, every offset a multiple of the parameter alignment), so that a run
// of consecutive parameters is one contiguous range: data parallelism (src/dist) reduces,
// shards and gathers such ranges without copies. A bf16 model keeps its fp32 masters split in
// two 16-bit halves (core/f32_halves.h): the bf16 compute copy is their high half and a buffer
// of int16 their low half, so the compute copy costs no memory of its own (Parameter).
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attention/attention.h"
#include "attention/kernel_config_file.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "models/config.h"
#include "models/step_profile.h"
#include "nn/layers.h"

namespace ft::models {

// One parameter's state. Its master weights (fp32; fp64 when computing in fp64) are what the
// optimizer updates and what checkpoints and resume states hold; its compute copy is what the
// layers read. fp32 and fp64 models keep the masters whole in `master`, and `compute` is the
// same tensor. bf16 models keep them split (core/f32_halves.h): `compute` is their high half
// (the master rounded to bf16, ties away from zero) and `master_lo` their low half, which give
// the fp32 master back exactly; `master` is then undefined. That is 4 bytes a parameter for the
// master and its bf16 copy instead of 4 + 2, and the optimizer, which joins, updates and splits
// them (nn::AdamWTensor), never refreshes a copy. Read and write masters of either kind with
// master_weights() and set_master_weights().
struct Parameter {
  std::string name;
  bool decay = false;  // weight decay applies to matrices only
  int64_t offset = 0;  // first element in the model's flat buffers (flat_grads() ...)
  Tensor master;       // whole master weights (fp32 or fp64 models), or undefined (split)
  Tensor master_lo;    // int16: the low halves of split master weights (bf16 models), or undefined
  Tensor grad;         // master dtype; accumulated over micro-batches
  Tensor compute;      // the copy layers read, in the compute dtype (master, or its high half)
  Tensor m, v;         // AdamW moments, master dtype

  bool split() const { return master_lo.defined(); }
  const Shape& shape() const { return grad.shape(); }
  int64_t numel() const { return grad.numel(); }
  DType master_dtype() const { return grad.dtype(); }
  // The master weights, exact, as a new tensor of the master dtype on the parameter's device,
  // or on `device` (split halves are copied there and joined there, so a CPU copy of a GPU
  // model's masters takes no GPU memory).
  Tensor master_weights() const;
  Tensor master_weights(Device device) const;
  // Sets the master weights, and with them the compute copy, to values (the parameter's element
  // count, any float dtype and device: converted to the master dtype as Tensor::copy_from does).
  void set_master_weights(const Tensor& values);
};

// The keys and values of the positions seen so far, per layer, so that generation feeds one
// new token per step instead of recomputing the whole sequence (one sequence: batch 1).
// Made by Transformer::make_kv_cache, filled by Transformer::forward_cached.
struct KvCache {
  std::vector<Tensor> k, v;       // per layer [capacity, Hkv, D] after RoPE; compute dtype, device
  std::vector<int32_t> segments;  // each cached position's segment id (documents; 0 without)
  int64_t length = 0;             // positions filled

  int64_t capacity() const { return k.empty() ? 0 : k.front().dim(0); }
  void clear() {
    length = 0;
    segments.clear();
  }
};

struct AttentionSettings {
  attention::Impl impl = attention::Impl::naive;
  int64_t window = 0;          // sliding window (0: none)
  int64_t global_every = 0;    // with a window: every N-th layer attends fully (0: none)
  bool deterministic = false;  // the attention backward gives the same bits on every run
  // Attention reads q, k, v inside the QKV projection's output where it can
  // (Transformer::reads_packed_qkv); false: they are always split out first. The same bits.
  bool qkv_in_place = true;
  // Rows that the CUDA flash kernels take before the built-in table (a kernel-config file,
  // attention/kernel_config_file.h) in every attention call; null: the built-in table. Only
  // flash on the GPU reads them.
  std::shared_ptr<const attention::KernelConfigFile> kernel_configs = nullptr;
};

// What each layer keeps from the forward for backward, and what its backward recomputes first
// (`flashtrain train --recompute`). The recomputation runs the forward's own ops on the inputs
// that were kept, with the same weights and in the same order (the forward draws no random
// numbers), so every mode gives the same losses and gradients as none, bit for bit.
enum class Recompute {
  none,  // keep everything the backward reads
  // Drop q, k and v (recomputed from norm1's output: qkv GEMM, split, RoPE). Flash keeps its o
  // and lse (its backward reads them, and re-running it would be the costly part); naive drops
  // its whole forward output, S x S probabilities included, and re-runs its forward.
  attention,
  mlp,    // drop the MLP's F-wide tensors (fc, gate, activation), recomputed from norm2's output
  block,  // keep only the layer's input (the residual stream); backward re-runs its forward
  // Drop what element-wise ops wrote: both norms' outputs (re-made from the layer's input and
  // x_mid) and LLaMA's SwiGLU output (from fc and gate). No GEMM runs again. GPT-2's GELU output
  // stays: on the GPU the up projection's GEMM epilogue writes it, and a GELU of its own would
  // not give the same bits.
  elementwise,
};
const char* recompute_name(Recompute mode);
Recompute parse_recompute(const std::string& name);  // none|attention|mlp|block|elementwise

// The logits bytes one classifier chunk of `flashtrain train` takes at most by default.
inline constexpr int64_t kClassifierChunkBytes = int64_t{512} << 20;
// Rows per classifier chunk (Transformer::set_classifier_chunk) for micro-batches of `rows`
// rows: equal chunks, each a multiple of 128 rows (GEMM tiles) whose logits in the compute
// dtype take at most kClassifierChunkBytes; 0 (the whole batch as one chunk) when it fits.
int64_t auto_classifier_chunk(const ModelConfig& config, DType compute_dtype, int64_t rows);

// Called by backward() once per parameter, as soon as its gradient is complete, with the
// parameter's index in parameters(): the last layers' first (the order is the same every time).
using GradientReady = std::function<void(size_t param_index)>;

// Offsets in the flat parameter buffers are multiples of this many elements (256 bytes of
// fp32), unless a Transformer is built with another alignment.
inline constexpr int64_t kParameterAlignment = 64;

class Transformer {
 public:
  // parameter_alignment (elements, >= 1): every parameter's offset in the flat buffers, and
  // their total size, is a multiple of it.
  Transformer(const ModelConfig& config, DType compute_dtype, AttentionSettings attention,
              Device device = Device::cpu, int64_t parameter_alignment = kParameterAlignment);
  ~Transformer();

  const ModelConfig& config() const { return config_; }
  DType compute_dtype() const { return compute_dtype_; }
  DType master_dtype() const { return master_dtype_; }

  // GPT-2 style initialisation: N(0, 0.02), residual projections N(0, 0.02 / sqrt(2 L)),
  // biases 0, norm weights 1, padded vocabulary rows 0.
  void init_weights(uint64_t seed);

  // tokens, targets: int32 [B, T] on the CPU. Returns the mean loss over B * T positions.
  // segment_ids (optional, int32 [B, T], on the CPU or the model's device) restricts attention
  // to documents in every layer (a window, if set, applies on top in the windowed layers); a
  // CPU tensor is copied to the model's device once per call.
  // With the whole batch as one classifier chunk (the default), logits() then holds the
  // logits until backward() turns them into gradients.
  double forward(const Tensor& tokens, const Tensor& targets, const Tensor& segment_ids = {});
  // forward() of a training micro-step whose backward(loss_scale) follows: each classifier
  // chunk's gradients (d loss / d norm_f's output, the head's weight gradient) are formed as soon
  // as its loss is, so no chunk's logits are kept or computed twice. backward() must then get
  // the same loss_scale.
  double forward_train(const Tensor& tokens, const Tensor& targets, double loss_scale,
                       const Tensor& segment_ids = {});
  // forward_train() without reading the loss back: returns the micro-batch's per-position losses
  // (fp32, [B * T], on the model's device) for mean_loss_of() to read later, so that a step of
  // several micro-batches waits for the device once, at its end, not after every forward.
  Tensor forward_train_deferred(const Tensor& tokens, const Tensor& targets, double loss_scale,
                                const Tensor& segment_ids = {});
  // The mean of per-position losses (forward_train_deferred's), summed in fp64 in order on the
  // host: what forward() and forward_train() return, bit for bit.
  static double mean_loss_of(const Tensor& losses);
  // Forward without targets; afterwards logits() holds [B * T, padded_vocab] in compute dtype.
  void forward_logits(const Tensor& tokens, const Tensor& segment_ids = {});
  const Tensor& logits() const { return logits_; }

  // forward() and forward_train() run the classifier and the loss over `rows` rows of the
  // batch at a time (`flashtrain train --classifier-chunk`), so the logits of the whole batch
  // never exist at once; 0 (the default): the whole batch as one chunk. A forward() over more
  // than one chunk keeps no logits, and its backward() computes each chunk's logits again;
  // forward_train() needs no second pass. Other chunkings give the same losses and gradients up
  // to the summation order of the head's weight gradient (and of GEMMs of other row counts).
  void set_classifier_chunk(int64_t rows);
  int64_t classifier_chunk() const { return classifier_chunk_; }
  // Bytes of the logits buffer the last forward used (one chunk's rows, or the whole batch's).
  int64_t logits_bytes() const { return logits_bytes_; }

  // A KV cache for up to `capacity` positions (0: the model's context).
  KvCache make_kv_cache(int64_t capacity = 0) const;
  // Forward of tokens int32 [1, T] at positions cache.length .. cache.length + T - 1, whose
  // keys and values are appended to the cache. An empty cache takes any T up to its capacity
  // (a prompt: attention as in training, through the model's implementation); a filled one
  // takes one token per call (nn::decode_attention over the cache, with the causal, window and
  // document limits). segment_ids (int32 [1, T] on the CPU, optional) continue the ids of the
  // cached positions. Afterwards logits() holds the last position's logits [1, padded_vocab].
  // Inference only: backward() is refused after it.
  void forward_cached(const Tensor& tokens, KvCache& cache, const Tensor& segment_ids = {});

  // The CUDA flash kernels' configuration for each mask class the layers run on micro-batches
  // of batch x seq_len (with or without segment ids), from AttentionSettings::kernel_configs
  // over the built-in table, each checked by can_implement: one that cannot run is an ft::Error
  // naming where it came from. Empty when no configuration applies (not flash on the GPU, or
  // fp32, whose kernels are fixed).
  std::vector<attention::KernelConfigChoice> flash_kernel_configs(int64_t batch, int64_t seq_len,
                                                                  bool with_segments) const;

  // Bytes the attention of all layers kept from the last forward for backward (its lse and
  // saved tensors): naive's S x S probabilities and log-sum-exp rows, flash's log-sum-exp rows
  // and, with segment ids, their chunk summary (0 before any forward).
  int64_t attention_saved_bytes() const { return attention_saved_bytes_; }
  // Bytes all layers kept from the last forward for backward (0 before any forward): each
  // layer's input and what its cache holds under the recompute mode. What only the top of the
  // model keeps (the final norm, the logits) is not counted: no mode changes it.
  int64_t saved_activation_bytes() const { return saved_activation_bytes_; }

  // What the next forward keeps for backward (none by default). Every mode gives the same
  // losses and gradients, so it may change between steps.
  void set_recompute(Recompute mode) { recompute_ = mode; }
  Recompute recompute() const { return recompute_; }

  // Backpropagates the last forward(); d(loss) = loss_scale, parameter grads accumulate.
  // ready (optional) hears of each parameter whose gradient this backward has completed.
  void backward(double loss_scale = 1.0, const GradientReady& ready = {});
  // Starts a new sum of gradients: the next micro-batch WRITES every gradient a GEMM or a norm
  // forms (nn::GradStore::overwrite; the classifier's first chunk the head's) and the later ones
  // add to them, the same bits as adding them all to zeros. Only the gradients the embedding's
  // scatter adds into without a writer before it are zeroed here: wpe, and wte unless it is the
  // tied head. Until the next backward the other gradients hold the last step's values.
  void zero_grad();
  // Bytes zero_grad() sets to zero (the elements between parameters are zeroed once, at
  // construction: nothing writes them).
  int64_t zeroed_grad_bytes() const;
  // false: the slow twin (tests compare against it): zero_grad() zeroes every gradient and
  // every micro-batch adds to them. true by default.
  void set_overwrite_first_grads(bool on) { overwrite_first_grads_ = on; }

  // Marks forward's and backward's ops as regions of `profile` (not owned; nullptr, the
  // default: none).
  void set_profile(StepProfile* profile) { profile_ = profile; }
  // The trainer's regions around the model (optimizer, communication) go to the same profile.
  StepProfile* profile() const { return profile_; }

  std::vector<Parameter>& parameters() { return params_; }
  const std::vector<Parameter>& parameters() const { return params_; }
  Parameter& parameter(const std::string& name);
  // Named per-layer parameter, e.g. layer_parameter(3, "attn.qkv.weight").
  Parameter& layer_parameter(int64_t layer, const std::string& name);

  // The flat buffers behind every parameter's master, grad, compute and master_lo views, 1-D;
  // equal sizes (a multiple of parameter_alignment()). Whole masters (fp32 and fp64 models):
  // flat_masters() is flat_compute() and flat_master_lo() is undefined. Split masters (bf16
  // models): flat_masters() is undefined, flat_compute() holds their high halves and
  // flat_master_lo() their low halves. Elements between parameters are zero and belong to none.
  bool split_masters() const { return flat_master_lo_.defined(); }
  const Tensor& flat_masters() const { return flat_master_; }
  const Tensor& flat_master_lo() const { return flat_master_lo_; }
  const Tensor& flat_grads() const { return flat_grad_; }
  const Tensor& flat_compute() const { return flat_compute_; }
  int64_t parameter_alignment() const { return parameter_alignment_; }
  // Elements [begin, end) of the flat master weights, exact, as a new tensor of the master
  // dtype on `device` (Parameter::master_weights over a range of the flat buffers).
  Tensor master_range(int64_t begin, int64_t end, Device device) const;
  // Sets elements [begin, begin + values.numel()) of the flat master weights (and compute
  // copies) to values (any float dtype and device).
  void set_master_range(int64_t begin, const Tensor& values);
  // Bytes the master weights and their compute copies take on the model's device (the flat
  // buffers): 4 a parameter in fp32 models (the copy is the master) and in bf16 models (2 + 2
  // halves; kept whole with a separate copy they would take 4 + 2), 8 in fp64 models.
  int64_t weight_bytes() const;

 private:
  struct LayerCache;
  struct Weights;
  struct NormWeights {
    Parameter *w = nullptr, *b = nullptr;  // b: LayerNorm only
  };
  struct NormOutput {
    Tensor out, mean, rstd;  // mean: LayerNorm only
  };

  void build_parameters();
  // With a cache (kv), positions start at kv->length and only the last position's logits are
  // formed.
  void run_forward(const Tensor& tokens, const Tensor& segment_ids, KvCache* kv = nullptr);
  // Also normalises x_out for its reader (norm_reading(l + 1)).
  void layer_forward(int64_t l, const Tensor& x_in, Tensor& x_out, KvCache* kv = nullptr);
  // The parts of layer_forward that backward may re-run (models/recompute.cpp), each from what
  // the one before left in the layer's cache: q, k, v from norm1 (RoPE at positions from
  // `past`; split out of the projection's output unless attention reads it as it is, which a
  // KV cache being filled (for_cache) does not); the attention's output over the whole sequence;
  // the residual after attention and norm2 (from x_in and the attention's output); the MLP's hidden
  // activations from norm2.
  void attention_inputs(int64_t l, LayerCache& c, int64_t past, bool for_cache);
  void attention_forward(int64_t l, LayerCache& c);
  void attention_output(int64_t l, LayerCache& c, const Tensor& x_in);
  void mlp_hidden(int64_t l, LayerCache& c);
  // After layer l's forward: release what the recompute mode does not keep.
  void drop_recomputable(LayerCache& c) const;
  // Before layer l's backward: recompute what drop_recomputable() released.
  void recompute_dropped(int64_t l);
  int64_t kept_bytes() const;  // of the layers, as saved_activation_bytes() reports it
  // The attention of layer l for the current token over the cache (decode step).
  void cached_attention(int64_t l, LayerCache& c, KvCache& kv);
  // dresidual: d loss / d x_out on entry, d loss / d x_in on return (updated in place).
  void layer_backward(int64_t l, Tensor& dresidual);
  Parameter* head_parameter() const;
  // Whether the layers hand attention the QKV projection's output as it is (forward_packed,
  // RoPE applied to q's and k's heads in place): where the implementation reads it in place.
  bool reads_packed_qkv() const;  // the classifier's weight (GPT-2: wte, tied)
  void check_targets(const Tensor& tokens, const Tensor& targets) const;
  // The classifier and the loss over the batch, chunk by chunk (classifier_chunk()): losses_,
  // and with dloss (d loss / d each row's loss) dnorm_ and the head's gradient.
  void classify(std::optional<double> dloss);
  // Rows [r0, r1) of classify(): their logits into `logits` (unless have_logits), their losses,
  // and with dloss the logits turned into dlogits in place, their rows of dnorm_ and the head's
  // weight gradient accumulated.
  void classifier_rows(int64_t r0, int64_t r1, Tensor& logits, bool have_logits,
                       std::optional<double> dloss);
  double mean_loss() const;                                   // of losses_
  attention::Problem attention_problem(int64_t layer) const;  // of the last forward's batch
  attention::Problem attention_problem(int64_t layer, int64_t batch, int64_t seq_len,
                                       bool with_segments) const;
  // The configuration of the kernel-config file for a problem (null without a file, or when
  // the call is not flash on the GPU: the attention library then takes the device's default).
  const attention::KernelConfig* flash_config(const attention::Problem& problem,
                                              attention::KernelConfig& storage) const;
  Tensor act(const Shape& shape) const;  // a compute-dtype activation buffer
  // How this micro-batch stores the gradients of the layers and norms (grads_fresh_), and of
  // the head's next classifier chunk (head_grad_fresh_, which it then clears).
  nn::GradStore grad_store() const;
  nn::GradStore take_head_grad_store();
  // The norm that reads residual_[l]: layer l's norm1, or the final norm for l = n_layer.
  NormWeights norm_weights_reading(int64_t l) const;
  NormOutput& norm_reading(int64_t l);
  NormOutput norm_forward(const Tensor& x, NormWeights n);
  // x_out = a + b, returns norm(x_out) (one fused call).
  NormOutput add_norm_forward(Tensor& x_out, const Tensor& a, const Tensor& b, NormWeights n);
  // dx = (accumulate: +=) the norm's input gradient for dout.
  void norm_backward(Tensor& dx, const Tensor& dout, const Tensor& x, NormWeights n,
                     const NormOutput& saved, bool accumulate, nn::GradStore store);
  Parameter* find(const std::string& name);
  // While a step is profiled: the attention FLOPs of `problem` (4 x attended pairs x D, times
  // `factor`: 2.5 for backward), counted after the step.
  void count_attention_flops(OpFamily family, const attention::Problem& problem, double factor);
  void report_ready(const GradientReady& ready, std::initializer_list<const Parameter*> params);

  ModelConfig config_;
  DType compute_dtype_, master_dtype_;
  AttentionSettings attention_;
  Device device_;
  int64_t parameter_alignment_;
  std::vector<Parameter> params_;
  Tensor flat_master_, flat_master_lo_, flat_grad_, flat_compute_;
  std::unique_ptr<Weights> w_;
  nn::RopeTable rope_;
  StepProfile* profile_ = nullptr;

  // Saved by the last forward for backward.
  int64_t B_ = 0, T_ = 0;
  Tensor tokens_, targets_, segment_ids_;
  std::vector<Tensor> residual_;  // residual_[l] is layer l's input; residual_[L] the output
  std::vector<LayerCache> cache_;
  int64_t attention_saved_bytes_ = 0, saved_activation_bytes_ = 0;
  Recompute recompute_ = Recompute::none;
  NormOutput final_norm_;
  Tensor logits_, losses_;
  Tensor dnorm_;  // d loss / d norm_f's output, once the classifier's backward has run
  int64_t classifier_chunk_ = 0, logits_bytes_ = 0;
  // Set by forward_train(): the loss scale the classifier's gradients were formed for.
  std::optional<double> head_loss_scale_;
  bool have_targets_ = false;
  // Set by zero_grad() (and at construction, the gradients being zero): the next backward
  // writes the gradients of layers and norms, the next classifier chunk with a gradient the
  // head's. Cleared once written.
  bool grads_fresh_ = true, head_grad_fresh_ = true;
  bool overwrite_first_grads_ = true;
};

}  // namespace ft::models
