// Model weights in llm.c's checkpoint formats, so that models move between flashtrain, llm.c
// and PyTorch scripts that write these files:
//   GPT-2:   1024-byte header of int32 (magic 20240326, version 3 = fp32 / 5 = bf16, context,
//            vocab, layers, heads, width, padded vocab), then the tensors grouped by kind
//            across layers (wte, wpe, ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b,
//            fcw, fcb, fcprojw, fcprojb, lnfw, lnfb).
//   LLaMA-3: 1024 bytes of int32 (magic 20240803, version 3 / 5, context, vocab, layers, heads,
//            kv heads, width, multiple_of, scaled rope, major, minor) and 1024 bytes of float
//            (ffn_dim_multiplier, norm_eps, rope_theta), then wte, ln1, qkv, attproj, ln2, fc
//            (up), fc2 (gate), proj (down), lnf, lm_head; embeddings hold the real vocabulary.
// Files are written to a temporary name and renamed, so a failed save leaves no partial file.
#pragma once

#include <string>

#include "models/config.h"
#include "models/transformer.h"

namespace ft::models {

constexpr int kGpt2CheckpointMagic = 20240326;
constexpr int kLlama3CheckpointMagic = 20240803;

// Writes the model's master weights, converted to file_dtype (fp32 or bf16).
void save_checkpoint(const std::string& path, const Transformer& model, DType file_dtype);

// Reads only the header: the model shape stored in the file. Throws ft::Error naming the file
// on a missing file, wrong magic or version, or a size that does not match the header.
ModelConfig read_checkpoint_config(const std::string& path);

// Loads the weights into a model whose shape must match the file's.
void load_checkpoint(const std::string& path, Transformer& model);

}  // namespace ft::models
