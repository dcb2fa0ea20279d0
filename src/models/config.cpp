#include "models/config.h"

#include <cmath>
#include <map>
#include <sstream>

#include "core/error.h"

namespace ft::models {

const char* family_name(Family f) {
  return f == Family::gpt2 ? "gpt2" : "llama3";
}

int64_t llama_ffn_hidden(int64_t n_embd, int64_t multiple_of, double ffn_dim_multiplier) {
  // n_embd comes from an int32 header field or a flag checked later: 8 * n_embd fits int64
  // for any int32, and a multiplier up to kMaxFfnDimMultiplier keeps the product in range.
  int64_t hidden = 2 * (4 * n_embd) / 3;
  if (ffn_dim_multiplier > 0 && ffn_dim_multiplier <= kMaxFfnDimMultiplier)
    hidden = static_cast<int64_t>(ffn_dim_multiplier * static_cast<double>(hidden));
  if (multiple_of < 1) return hidden;
  return multiple_of * ((hidden + multiple_of - 1) / multiple_of);
}

namespace {

ModelConfig gpt2(const std::string& name, int64_t layers, int64_t width, int64_t heads,
                 int64_t context) {
  ModelConfig c;
  c.name = name;
  c.family = Family::gpt2;
  c.n_layer = layers;
  c.n_embd = width;
  c.n_head = heads;
  c.n_kv_head = heads;
  c.vocab_size = 50257;
  c.max_seq_len = context;
  c.norm_eps = 1e-5;
  c.finalize();
  return c;
}

ModelConfig llama3(const std::string& name, int64_t layers, int64_t width, int64_t heads,
                   int64_t kv_heads, int64_t vocab, int64_t context, int64_t multiple_of,
                   double ffn_multiplier) {
  ModelConfig c;
  c.name = name;
  c.family = Family::llama3;
  c.n_layer = layers;
  c.n_embd = width;
  c.n_head = heads;
  c.n_kv_head = kv_heads;
  c.vocab_size = vocab;
  c.max_seq_len = context;
  c.norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  c.multiple_of = multiple_of;
  c.ffn_dim_multiplier = ffn_multiplier;
  c.finalize();
  return c;
}

const std::map<std::string, ModelConfig>& presets() {
  static const std::map<std::string, ModelConfig> table = {
      // Tiny models for CPU demos and tests; they read the GPT-2-tokenised shards, so the
      // LLaMA one uses GPT-2's vocabulary.
      {"gpt2-tiny", gpt2("gpt2-tiny", 4, 128, 4, 256)},
      {"llama3-tiny", llama3("llama3-tiny", 4, 128, 4, 2, 50257, 256, 32, 1.5)},
      {"gpt2", gpt2("gpt2", 12, 768, 12, 1024)},
      {"gpt2-d24", gpt2("gpt2-d24", 24, 1024, 16, 1024)},
      {"gpt2-d36", gpt2("gpt2-d36", 36, 1280, 20, 1024)},
      {"gpt2-d48", gpt2("gpt2-d48", 48, 1600, 25, 1024)},
      // Llama-3.2-1B shape (16 layers, width 2048, 32 heads, 8 kv heads, MLP 8192).
      {"llama3-1b", llama3("llama3-1b", 16, 2048, 32, 8, 128256, 8192, 256, 1.5)},
      // Llama-3-8B shape (32 layers, width 4096, 32 heads, 8 kv heads, MLP 14336).
      {"llama3-8b", llama3("llama3-8b", 32, 4096, 32, 8, 128256, 8192, 1024, 1.3)},
  };
  return table;
}

}  // namespace

void ModelConfig::finalize() {
  padded_vocab_size = (vocab_size + 127) / 128 * 128;
  if (family == Family::gpt2) {
    ffn_hidden = 4 * n_embd;
  } else {
    ffn_hidden = llama_ffn_hidden(n_embd, multiple_of, ffn_dim_multiplier);
  }
}

void ModelConfig::validate() const {
  FT_CHECK(n_layer >= 1 && n_layer <= kMaxLayers, "layers must be in [1, ", kMaxLayers, "], got ",
           n_layer);
  FT_CHECK(n_embd >= 8 && n_embd <= kMaxWidth, "width must be in [8, ", kMaxWidth, "], got ",
           n_embd);
  FT_CHECK(n_head >= 1 && n_embd % n_head == 0, "width ", n_embd,
           " must be a positive multiple of heads ", n_head);
  FT_CHECK(head_dim() % 2 == 0 || !rope(), "head dim ", head_dim(), " must be even for RoPE");
  FT_CHECK(n_kv_head >= 1 && n_head % n_kv_head == 0, "heads ", n_head,
           " must be a multiple of kv heads ", n_kv_head);
  FT_CHECK(family != Family::gpt2 || n_kv_head == n_head,
           "GPT-2 models have as many kv heads as heads (", n_head, "), got kv heads ", n_kv_head);
  FT_CHECK(vocab_size >= 2 && vocab_size <= kMaxVocab, "vocab must be in [2, ", kMaxVocab,
           "], got ", vocab_size);
  FT_CHECK(padded_vocab_size >= vocab_size && padded_vocab_size <= kMaxVocab + 127,
           "padded vocab must be in [vocab ", vocab_size, ", ", kMaxVocab + 127, "], got ",
           padded_vocab_size);
  FT_CHECK(max_seq_len >= 1 && max_seq_len <= kMaxContext, "context must be in [1, ", kMaxContext,
           "], got ", max_seq_len);
  FT_CHECK(std::isfinite(norm_eps) && norm_eps > 0, "norm eps must be a positive number, got ",
           norm_eps);
  if (family == Family::llama3) {
    FT_CHECK(multiple_of >= 1 && multiple_of <= kMaxMultipleOf, "multiple_of must be in [1, ",
             kMaxMultipleOf, "], got ", multiple_of);
    FT_CHECK(ffn_dim_multiplier >= 0 && ffn_dim_multiplier <= kMaxFfnDimMultiplier,
             "ffn_dim_multiplier must be in [0, ", kMaxFfnDimMultiplier, "] (0: none), got ",
             ffn_dim_multiplier);
    FT_CHECK(std::isfinite(rope_theta) && rope_theta > 0,
             "rope theta must be a positive number, got ", rope_theta);
  }
  FT_CHECK(ffn_hidden >= 1 && ffn_hidden <= kMaxFfnHidden, "MLP width ", ffn_hidden,
           " (from width ", n_embd, ") must be in [1, ", kMaxFfnHidden, "]");
}

int64_t ModelConfig::num_parameters() const {
  const int64_t C = n_embd, L = n_layer, Vp = padded_vocab_size;
  int64_t per_layer = C * qkv_width() + C * C;  // qkv and attention projection
  if (mlp() == MlpKind::gelu) {
    per_layer += 2 * C * ffn_hidden;
  } else {
    per_layer += 3 * C * ffn_hidden;
  }
  per_layer += (norm() == NormKind::layernorm ? 4 : 2) * C;  // two norms
  if (bias()) per_layer += qkv_width() + C + ffn_hidden + C;
  int64_t total = L * per_layer + Vp * C;
  if (learned_positions()) total += max_seq_len * C;
  if (!tied_embeddings()) total += Vp * C;
  total += (norm() == NormKind::layernorm ? 2 : 1) * C;
  return total;
}

std::string ModelConfig::describe() const {
  std::ostringstream os;
  os << name << " (" << family_name(family) << "): " << n_layer << " layers, width " << n_embd
     << ", " << n_head << " heads";
  if (n_kv_head != n_head) os << " / " << n_kv_head << " kv heads";
  os << ", head dim " << head_dim() << ", MLP " << ffn_hidden << ", vocab " << vocab_size
     << " (padded " << padded_vocab_size << "), context " << max_seq_len << ", " << num_parameters()
     << " parameters";
  return os.str();
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& [name, config] : presets()) names.push_back(name);
  return names;
}

ModelConfig preset(const std::string& name) {
  const auto& table = presets();
  auto it = table.find(name);
  if (it == table.end()) {
    std::string known;
    for (const auto& [n, c] : table) known += (known.empty() ? "" : ", ") + n;
    throw Error(str("unknown model preset '", name, "' (known: ", known, ")"));
  }
  return it->second;
}

bool ModelOverrides::any() const {
  return layers || width || heads || kv_heads || vocab || context || rope_scaling;
}

std::string ModelOverrides::describe() const {
  std::string out;
  auto add = [&](const char* flag, const std::optional<int64_t>& v) {
    if (v) out += str(out.empty() ? "" : ", ", flag, " ", *v);
  };
  add("--layers", layers);
  add("--width", width);
  add("--heads", heads);
  add("--kv-heads", kv_heads);
  add("--vocab", vocab);
  add("--context", context);
  if (rope_scaling) out += str(out.empty() ? "" : ", ", "--rope-scaling");
  return out;
}

ModelConfig apply_overrides(ModelConfig config, const ModelOverrides& o) {
  bool changed = false;
  auto set = [&](const std::optional<int64_t>& v, int64_t& field) {
    if (v) {
      field = *v;
      changed = true;
    }
  };
  set(o.layers, config.n_layer);
  set(o.width, config.n_embd);
  set(o.heads, config.n_head);
  set(o.vocab, config.vocab_size);
  set(o.context, config.max_seq_len);
  if (o.kv_heads) {
    config.n_kv_head = *o.kv_heads;
    changed = true;
  } else if (o.heads && config.family == Family::gpt2) {
    config.n_kv_head = config.n_head;  // GPT-2 keeps one kv head per head
  }
  if (o.rope_scaling) {
    FT_CHECK(config.family == Family::llama3, "RoPE scaling applies to LLaMA-3 models, not ",
             config.name);
    config.rope_scaling = *o.rope_scaling;
    changed = true;
  }
  if (changed) config.name += "*";
  config.finalize();
  config.validate();
  return config;
}

}  // namespace ft::models
