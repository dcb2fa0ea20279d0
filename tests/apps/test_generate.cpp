// `flashtrain generate`: the KV cache prints what recomputing prints (greedy fp32, GPT-2 and
// LLaMA-3), the prompt is GPT-2 BPE after an end-of-text token, the text is whole
// UTF-8 characters through a pipe even when the sampled token bytes split characters, and every
// bad flag is one error line before any work.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "core/rng.h"
#include "models/checkpoint.h"
#include "models/transformer.h"
#include "test_util.h"
#include "train/bpe.h"
#include "train/generate.h"
#include "train/tokenizer.h"
#include "train/utf8.h"

namespace ft {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

models::ModelConfig small(const std::string& name) {
  models::ModelOverrides o;
  o.layers = 2;
  o.width = 64;
  o.heads = 4;
  o.context = 32;
  if (name == "llama3-tiny") o.kv_heads = 2;
  return models::apply_overrides(models::preset(name), o);
}

// A checkpoint of a small model with GPT-2's vocabulary. spread > 0 draws every weight from
// N(0, spread) (norms 1 + N(0, spread / 3)) so that greedy decoding wanders; 0 keeps GPT-2's
// initialisation, whose samples are near uniform over the vocabulary.
std::string checkpoint(const test::TempDir& dir, const std::string& name, double spread) {
  models::Transformer model(small(name), DType::f32, {});
  model.init_weights(7);
  if (spread > 0) {
    Rng rng(8);
    for (models::Parameter& p : model.parameters()) {
      Tensor host = Tensor::empty(p.shape(), p.master_dtype());
      const bool norm = p.name.find("norm") != std::string::npos;
      fill_normal(host, rng, norm ? 1.0 : 0.0, norm ? spread / 3 : spread);
      p.set_master_weights(host);
    }
  }
  const std::string path = dir.file(name + ".bin");
  models::save_checkpoint(path, model, DType::f32);
  return path;
}

std::string generate(const std::string& ckpt, const std::string& flags, const std::string& out) {
  // stdout to the file; stderr (the statistics line) to the result.
  const test::CommandResult r =
      test::run_shell(std::string("('") + FLASHTRAIN_CLI + "' generate --load '" + ckpt +
                      "' --device cpu " + flags + " > '" + out + "')");
  EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.output;  // stderr: the statistics line
  EXPECT_NE(r.output.find("tokens/s"), std::string::npos) << r.output;
  return read_file(out);
}

TEST(GenerateCli, KvCachePrintsWhatRecomputingPrints) {
  test::TempDir dir;
  for (const std::string name : {"gpt2-tiny", "llama3-tiny"}) {
    const std::string ckpt = checkpoint(dir, name, 0.3);
    // Greedy, 60 tokens: past the context of 32, so the window restarts. (Sampled generation is
    // the same up to rounding; tests/train/test_generate.cpp compares it in fp64.)
    const std::string flags = "--prompt 'First Citizen:' --tokens 60 --temperature 0";
    const std::string cached = generate(ckpt, flags, dir.file("cached.txt"));
    const std::string recomputed =
        generate(ckpt, flags + " --no-kv-cache", dir.file("recomputed.txt"));
    EXPECT_EQ(cached, recomputed) << name;
    EXPECT_EQ(cached.rfind("First Citizen:", 0), 0u) << cached;
    EXPECT_GT(cached.size(), std::string("First Citizen:").size() + 30) << cached;
  }
}

// The printed text is the prompt and the generated tokens' bytes, with only whole characters:
// here the sampled bytes split a character (checked), and strict UTF-8 decoding of the pipe
// succeeds.
TEST(GenerateCli, PrintsWholeUtf8CharactersThroughAPipe) {
  if (std::system("python3 --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "no python3";
  test::TempDir dir;
  const std::string ckpt = checkpoint(dir, "gpt2-tiny", 0);
  const std::string prompt = "caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD";
  const std::string flags = "--prompt '" + prompt + "' --tokens 300 --seed 1";

  const train::Tokenizer tokenizer(test::source_path("data/gpt2_tokenizer.bin"));
  train::Gpt2Encoder encoder(tokenizer);
  std::vector<int32_t> ids = {encoder.eot_token()};
  for (int32_t id : encoder.encode(prompt)) ids.push_back(id);
  models::Transformer model(models::read_checkpoint_config(ckpt), DType::f32, {});
  models::load_checkpoint(ckpt, model);
  train::GenerateOptions o;
  o.tokens = 300;
  o.seed = 1;
  std::string raw;
  for (int32_t id : train::generate_tokens(model, ids, o)) raw += tokenizer.decode(id);
  ASSERT_FALSE(train::is_valid_utf8(raw)) << "this sample should split a character";

  const test::CommandResult r =
      test::run_shell(std::string("'") + FLASHTRAIN_CLI + "' generate --load '" + ckpt +
                      "' --device cpu " + flags + " 2>/dev/null | tee '" + dir.file("out.txt") +
                      "' | python3 -c \"import sys; sys.stdin.buffer.read().decode('utf-8')\"");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_file(dir.file("out.txt")), prompt + train::valid_utf8(raw) + "\n");
}

TEST(GenerateCli, BadFlagsAreOneErrorLineBeforeAnyWork) {
  test::TempDir dir;
  const std::string ckpt = checkpoint(dir, "gpt2-tiny", 0);
  auto expect_error = [](const std::string& args, const std::string& needle) {
    const test::CommandResult r = test::run_cli("generate " + args);
    EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.output;
    EXPECT_EQ(r.output.rfind("error: ", 0), 0u) << r.output;
    EXPECT_EQ(r.output.find('\n'), r.output.size() - 1) << "one line: " << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\n" << r.output;
  };
  const std::string load = "--load '" + ckpt + "' --device cpu ";
  expect_error("--prompt hi", "--load is required");
  expect_error(load + "--tokens 0", "--tokens must be >= 1");
  expect_error(load + "--temperature -1", "--temperature");
  expect_error(load + "--temperature nan", "--temperature");
  expect_error(load + "--top-k -3", "--top-k");
  expect_error(load + "--prompt-file '" + dir.file("missing.txt") + "'", "missing.txt");
  expect_error(load + "--prompt a --prompt-file '" + ckpt + "'", "both given");
  expect_error(load + "--tokenizer '" + dir.file("none.bin") + "'", "none.bin");
  expect_error("--load '" + dir.file("none.bin") + "'", "none.bin");
  expect_error(load + "--dtype fp16", "fp16");
  // A model whose vocabulary cannot hold the prompt's ids.
  models::ModelOverrides o;
  o.layers = 1;
  o.width = 32;
  o.heads = 2;
  o.vocab = 1000;
  models::Transformer tiny(models::apply_overrides(models::preset("gpt2-tiny"), o), DType::f32, {});
  tiny.init_weights(1);
  models::save_checkpoint(dir.file("v1000.bin"), tiny, DType::f32);
  expect_error("--load '" + dir.file("v1000.bin") + "' --device cpu --prompt hi",
               "outside the model's vocabulary [0, 1000)");
}

}  // namespace
}  // namespace ft
