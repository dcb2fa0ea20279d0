// Model shapes. GPT-2 and LLaMA-3 share one transformer skeleton; a config names the small
// parts in which they differ (norm, positions, MLP, bias, tied head) instead of forking code.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ft::models {

enum class Family { gpt2, llama3 };

// The largest shapes validate() accepts: far above every preset and every released model of
// both families, and small enough that no size computed from them overflows int64
// (num_parameters() stays below 2^51). A checkpoint header is checked against them before its
// sizes are used.
inline constexpr int64_t kMaxLayers = 1024;
inline constexpr int64_t kMaxWidth = 65536;
inline constexpr int64_t kMaxVocab = int64_t{1} << 24;
inline constexpr int64_t kMaxContext = int64_t{1} << 20;
inline constexpr int64_t kMaxMultipleOf = 65536;
inline constexpr int64_t kMaxFfnHidden = int64_t{1} << 22;
inline constexpr double kMaxFfnDimMultiplier = 16.0;
enum class NormKind { layernorm, rmsnorm };
enum class MlpKind { gelu, swiglu };

const char* family_name(Family f);

struct ModelConfig {
  std::string name;  // preset name, or "custom"
  Family family = Family::gpt2;
  int64_t n_layer = 0, n_embd = 0, n_head = 0, n_kv_head = 0;
  int64_t vocab_size = 0;         // real vocabulary; softmax runs over these columns
  int64_t padded_vocab_size = 0;  // rows of the embedding / head (a multiple of 128)
  int64_t max_seq_len = 0;        // context length
  int64_t ffn_hidden = 0;         // MLP width
  double norm_eps = 1e-5;
  // LLaMA-3 only (kept in its checkpoint header):
  double rope_theta = 500000.0;
  bool rope_scaling = false;  // Llama 3.1 frequency scaling
  int64_t multiple_of = 256;
  double ffn_dim_multiplier = 1.3;

  // The named differences between the two families.
  NormKind norm() const { return family == Family::gpt2 ? NormKind::layernorm : NormKind::rmsnorm; }
  MlpKind mlp() const { return family == Family::gpt2 ? MlpKind::gelu : MlpKind::swiglu; }
  bool learned_positions() const { return family == Family::gpt2; }
  bool rope() const { return family == Family::llama3; }
  bool bias() const { return family == Family::gpt2; }
  bool tied_embeddings() const { return family == Family::gpt2; }

  int64_t head_dim() const { return n_embd / n_head; }
  int64_t qkv_width() const { return (n_head + 2 * n_kv_head) * head_dim(); }
  int64_t num_parameters() const;

  // Recomputes the derived fields (padded vocab, LLaMA's MLP width) after a change.
  void finalize();
  // Throws ft::Error naming the bad field and what is allowed (the kMax* limits above).
  void validate() const;
  std::string describe() const;
};

// Flags that override any preset field.
struct ModelOverrides {
  std::optional<int64_t> layers, width, heads, kv_heads, vocab, context;
  std::optional<bool> rope_scaling;  // LLaMA-3 only: Llama 3.1 frequency scaling

  bool any() const;
  std::string describe() const;  // the flags that are set: "--layers 6, --width 256"
};

std::vector<std::string> preset_names();
// Throws ft::Error listing the known presets when the name is unknown.
ModelConfig preset(const std::string& name);
ModelConfig apply_overrides(ModelConfig config, const ModelOverrides& overrides);

// LLaMA's MLP width rule: 2/3 of 4C, times ffn_dim_multiplier, rounded up to multiple_of.
// A multiplier outside (0, kMaxFfnDimMultiplier] or a multiple_of below 1 is not applied
// (validate() refuses both), so that any header's values can be passed.
int64_t llama_ffn_hidden(int64_t n_embd, int64_t multiple_of, double ffn_dim_multiplier);

}  // namespace ft::models
