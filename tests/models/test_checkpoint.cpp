// llm.c checkpoint files: exact round trips in fp32 (also of a bf16 model's split masters), bf16
// rounding, headers, and bad files.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <vector>

#include "core/rng.h"
#include "models/checkpoint.h"
#include "tensor_test_util.h"
#include "test_util.h"

namespace ft::models {
namespace {

using test::same_bits;

ModelConfig small(const std::string& name) {
  ModelOverrides o;
  o.layers = 2;
  o.width = 32;
  o.heads = 4;
  o.vocab = 300;  // not a multiple of 128: exercises the padded rows
  o.context = 16;
  if (name == "llama3-tiny") o.kv_heads = 2;
  return apply_overrides(preset(name), o);
}

class CheckpointTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CheckpointTest, Fp32RoundTripIsExact) {
  test::TempDir dir;
  const ModelConfig config = small(GetParam());
  Transformer a(config, DType::f32, {});
  a.init_weights(42);
  save_checkpoint(dir.file("model.bin"), a, DType::f32);

  const ModelConfig read = read_checkpoint_config(dir.file("model.bin"));
  EXPECT_EQ(read.family, config.family);
  EXPECT_EQ(read.n_layer, config.n_layer);
  EXPECT_EQ(read.n_embd, config.n_embd);
  EXPECT_EQ(read.n_head, config.n_head);
  EXPECT_EQ(read.n_kv_head, config.n_kv_head);
  EXPECT_EQ(read.vocab_size, config.vocab_size);
  EXPECT_EQ(read.padded_vocab_size, config.padded_vocab_size);
  EXPECT_EQ(read.ffn_hidden, config.ffn_hidden);
  EXPECT_EQ(read.max_seq_len, config.max_seq_len);

  Transformer b(read, DType::f32, {});
  b.init_weights(7);  // different weights, to be overwritten
  load_checkpoint(dir.file("model.bin"), b);
  for (size_t i = 0; i < a.parameters().size(); ++i) {
    EXPECT_TRUE(same_bits(a.parameters()[i].master_weights(), b.parameters()[i].master_weights()))
        << a.parameters()[i].name;
  }
}

// A bf16 model keeps its fp32 masters in two halves: an fp32 file holds them whole and exact,
// and loading it gives a bf16 model the same halves and an fp32 model the same masters. The
// masters are drawn with ties (low 16 bits 0x8000) among them, whose bf16 copies round away from
// zero.
TEST_P(CheckpointTest, Bf16ModelSavesAndLoadsItsExactMasters) {
  test::TempDir dir;
  const ModelConfig config = small(GetParam());
  Transformer a(config, DType::bf16, {});
  a.init_weights(5);
  Rng rng(6);
  for (Parameter& p : a.parameters()) {
    Tensor host = Tensor::empty(p.shape(), DType::f32);
    fill_normal(host, rng, 0.0, 0.5);
    auto* bits = static_cast<uint32_t*>(host.raw());
    for (int64_t i = 0; i < host.numel(); i += 3) bits[i] = (bits[i] & 0xffff0000u) | 0x8000u;
    if (p.name == "wte" || p.name == "head.weight") {
      Tensor pad = host.slice(config.vocab_size, config.padded_vocab_size);
      pad.zero();  // rows a LLaMA-3 file does not store
    }
    p.set_master_weights(host);
    EXPECT_TRUE(same_bits(p.master_weights(), host)) << p.name;
    const Tensor copy = p.compute;
    for (int64_t i = 0; i < host.numel(); i += 3) {
      ASSERT_EQ(copy.data<bf16>()[i].bits, (bits[i] + 0x8000u) >> 16) << p.name << " " << i;
    }
  }
  save_checkpoint(dir.file("model.bin"), a, DType::f32);
  Transformer b(config, DType::bf16, {}), c(config, DType::f32, {});
  load_checkpoint(dir.file("model.bin"), b);
  load_checkpoint(dir.file("model.bin"), c);
  for (size_t i = 0; i < a.parameters().size(); ++i) {
    const Parameter &p = a.parameters()[i], &q = b.parameters()[i], &r = c.parameters()[i];
    EXPECT_TRUE(same_bits(p.master_weights(), q.master_weights())) << p.name;
    EXPECT_TRUE(same_bits(p.compute, q.compute)) << p.name;
    EXPECT_TRUE(same_bits(p.master_lo, q.master_lo)) << p.name;
    EXPECT_TRUE(same_bits(p.master_weights(), r.master_weights())) << p.name;
  }
}

TEST_P(CheckpointTest, Bf16FileHoldsRoundedWeights) {
  test::TempDir dir;
  const ModelConfig config = small(GetParam());
  Transformer a(config, DType::f32, {});
  a.init_weights(42);
  save_checkpoint(dir.file("model.bin"), a, DType::bf16);
  Transformer b(config, DType::f32, {});
  load_checkpoint(dir.file("model.bin"), b);
  for (size_t i = 0; i < a.parameters().size(); ++i) {
    const Tensor rounded = a.parameters()[i].master_weights().to(DType::bf16).to(DType::f32);
    EXPECT_TRUE(same_bits(rounded, b.parameters()[i].master_weights())) << a.parameters()[i].name;
  }
}

TEST_P(CheckpointTest, FileSizeMatchesTheFormat) {
  test::TempDir dir;
  const ModelConfig c = small(GetParam());
  Transformer a(c, DType::f32, {});
  a.init_weights(1);
  save_checkpoint(dir.file("model.bin"), a, DType::f32);
  // GPT-2 stores the padded vocabulary; LLaMA-3 the real one, for the embedding and the head.
  const int64_t embedding_rows = c.family == Family::gpt2 ? c.padded_vocab_size : c.vocab_size;
  const int64_t stored = c.num_parameters() - (c.padded_vocab_size - embedding_rows) * c.n_embd *
                                                  (c.tied_embeddings() ? 1 : 2);
  const int64_t header = c.family == Family::gpt2 ? 1024 : 2048;
  EXPECT_EQ(static_cast<int64_t>(std::filesystem::file_size(dir.file("model.bin"))),
            header + 4 * stored);
}

INSTANTIATE_TEST_SUITE_P(Families, CheckpointTest, ::testing::Values("gpt2-tiny", "llama3-tiny"));

void expect_error_naming(const std::string& path, const std::string& needle) {
  try {
    read_checkpoint_config(path);
    Transformer m(small("gpt2-tiny"), DType::f32, {});
    load_checkpoint(path, m);
    FAIL() << "no error for " << path;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, BadFilesGiveClearErrors) {
  test::TempDir dir;
  Transformer a(small("gpt2-tiny"), DType::f32, {});
  a.init_weights(1);
  const std::string good = dir.file("good.bin");
  save_checkpoint(good, a, DType::f32);
  std::vector<char> bytes(std::filesystem::file_size(good));
  std::ifstream(good, std::ios::binary)
      .read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  auto write = [&](const std::string& name, const std::vector<char>& b) {
    std::ofstream(dir.file(name), std::ios::binary)
        .write(b.data(), static_cast<std::streamsize>(b.size()));
    return dir.file(name);
  };
  std::vector<char> magic = bytes;
  magic[0] = 1;
  expect_error_naming(write("magic.bin", magic), "magic");
  std::vector<char> version = bytes;
  version[4] = 9;
  expect_error_naming(write("version.bin", version), "version");
  expect_error_naming(write("truncated.bin", std::vector<char>(bytes.begin(), bytes.end() - 100)),
                      "truncated");
  expect_error_naming(write("header.bin", std::vector<char>(bytes.begin(), bytes.begin() + 10)),
                      "truncated");
  expect_error_naming(dir.file("missing.bin"), "cannot open");

  // A file for another shape does not load into this model.
  Transformer other(small("llama3-tiny"), DType::f32, {});
  other.init_weights(1);
  save_checkpoint(dir.file("llama.bin"), other, DType::f32);
  try {
    load_checkpoint(dir.file("llama.bin"), a);
    FAIL() << "loaded a LLaMA checkpoint into a GPT-2 model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not match"), std::string::npos) << e.what();
  }
}

// A header is checked (shape limits, LLaMA's floats) and compared with the file's size before
// a model is built from it, so a few bytes cannot ask for gigabytes (found by fuzz_checkpoint:
// tests/fuzz/corpus/checkpoint/regress-*).
TEST(Checkpoint, HeaderMustFitTheFileAndTheLimits) {
  test::TempDir dir;
  Transformer a(small("llama3-tiny"), DType::f32, {});
  a.init_weights(1);
  const std::string good = dir.file("good.bin");
  save_checkpoint(good, a, DType::f32);
  std::vector<char> bytes(std::filesystem::file_size(good));
  std::ifstream(good, std::ios::binary)
      .read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  auto with = [&](const std::string& name, size_t offset, auto value) {
    std::vector<char> b = bytes;
    std::memcpy(b.data() + offset, &value, sizeof value);
    std::ofstream(dir.file(name), std::ios::binary)
        .write(b.data(), static_cast<std::streamsize>(b.size()));
    return dir.file(name);
  };
  auto expect_refused = [&](const std::string& path, const std::string& needle) {
    try {
      read_checkpoint_config(path);
      FAIL() << "no error for " << path;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_refused(with("vocab.bin", 3 * 4, int32_t{16000000}), "truncated, or not this model");
  expect_refused(with("layers.bin", 4 * 4, int32_t{1000000}), "layers must be in [1, 1024]");
  expect_refused(with("context.bin", 2 * 4, int32_t{2000000000}), "context must be in");
  expect_refused(with("ffn.bin", 1024, std::numeric_limits<float>::quiet_NaN()),
                 "ffn_dim_multiplier must be in [0, 16]");
  expect_refused(with("ffn_big.bin", 1024, 3e23f), "ffn_dim_multiplier must be in [0, 16]");
  expect_refused(with("eps.bin", 1024 + 4, -1.0f), "norm eps must be a positive number");
  EXPECT_EQ(read_checkpoint_config(good).n_layer, a.config().n_layer);
}

TEST(Checkpoint, FailedSaveLeavesNoFile) {
  test::TempDir dir;
  Transformer a(small("gpt2-tiny"), DType::f32, {});
  const std::string path = dir.file("no_such_dir/model.bin");
  EXPECT_THROW(save_checkpoint(path, a, DType::f32), Error);
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

}  // namespace
}  // namespace ft::models
