// `flashtrain generate`: text from an llm.c checkpoint, a prompt encoded with GPT-2's BPE and
// the KV cache (train/generate.h). The prompt and the generated text go to stdout as whole
// UTF-8 characters, token by token; a line of statistics goes to stderr.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>

#include "commands.h"
#include "core/device.h"
#include "core/error.h"
#include "device_flag.h"
#include "models/checkpoint.h"
#include "models/transformer.h"
#include "train/bpe.h"
#include "train/generate.h"
#include "train/saved_run.h"
#include "train/tokenizer.h"
#include "train/utf8.h"

namespace ft::cli {
namespace {

struct GenerateFlags {
  std::string load_path, prompt, prompt_file, tokenizer = "data/gpt2_tokenizer.bin";
  std::string device = "auto", dtype = "fp32", attention = "naive";
  train::GenerateOptions options;
  bool no_kv_cache = false;
  CLI::App* cmd = nullptr;
};

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  FT_CHECK(in.good(), "--prompt-file ", path, ": cannot open");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void run(GenerateFlags& f) {
  train::GenerateOptions& o = f.options;
  FT_CHECK(o.tokens >= 1, "--tokens must be >= 1, got ", o.tokens);
  FT_CHECK(std::isfinite(o.temperature) && o.temperature >= 0,
           "--temperature must be a finite number >= 0 (0: greedy), got ", o.temperature);
  FT_CHECK(o.top_k >= 0, "--top-k must be >= 0 (0: every token), got ", o.top_k);
  FT_CHECK(f.cmd->count("--prompt") == 0 || f.prompt_file.empty(),
           "--prompt and --prompt-file both given; pass one");
  o.kv_cache = !f.no_kv_cache;

  // A save an interrupt cut short after its commit point is finished first (train/saved_run.h).
  const std::string note = train::recover_saved_run(f.load_path);
  if (!note.empty()) std::fprintf(stderr, "note: %s\n", note.c_str());
  const models::ModelConfig mc = models::read_checkpoint_config(f.load_path);
  const std::string prompt = f.prompt_file.empty() ? f.prompt : read_text_file(f.prompt_file);
  const train::Tokenizer tokenizer(f.tokenizer);
  train::Gpt2Encoder encoder(tokenizer);
  // Training documents start after an end-of-text token; so does the prompt.
  std::vector<int32_t> ids = {encoder.eot_token()};
  for (int32_t id : encoder.encode(prompt)) ids.push_back(id);
  for (int32_t id : ids) {
    FT_CHECK(id < mc.vocab_size, "the prompt holds token id ", id, " (tokenizer ", f.tokenizer,
             "), outside the model's vocabulary [0, ", mc.vocab_size, ")");
  }
  const Device device = resolve_device(f.device, std::cerr);
  const DType dtype = parse_dtype(f.dtype);
  models::AttentionSettings attention;
  attention.impl = attention::parse_impl(f.attention);
  models::Transformer model(mc, dtype, attention, device);
  models::load_checkpoint(f.load_path, model);

  train::Utf8Decoder utf8;
  std::cout << train::valid_utf8(prompt) << std::flush;
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int32_t> generated = train::generate_tokens(model, ids, o, [&](int32_t id) {
    if (id < tokenizer.vocab_size()) std::cout << utf8.push(tokenizer.decode(id)) << std::flush;
  });
  synchronize(device);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << utf8.finish() << "\n" << std::flush;
  std::fprintf(
      stderr,
      "generate: %zu tokens after a %zu-token prompt in %.2f s (%.1f tokens/s, %s), %s "
      "%s\n",
      generated.size(), ids.size(), seconds, static_cast<double>(generated.size()) / seconds,
      o.kv_cache ? "KV cache" : "recomputing each step", device_name(device), dtype_name(dtype));
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto flags = std::make_shared<GenerateFlags>();
  GenerateFlags& f = *flags;
  CLI::App* cmd = app.add_subcommand(
      "generate",
      "Generate text from an llm.c checkpoint after a prompt (GPT-2 BPE), with a KV cache; "
      "prints the prompt and the text to stdout");
  cmd->add_option("--load", f.load_path, "llm.c checkpoint (GPT-2 or LLaMA-3)")->required();
  cmd->add_option("--prompt", f.prompt,
                  "Text to continue (encoded after an end-of-text token, as training documents "
                  "start; empty: from the end-of-text token alone)");
  cmd->add_option("--prompt-file", f.prompt_file, "Read the prompt from this file instead");
  cmd->add_option("--tokens,-n", f.options.tokens, "Tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", f.options.temperature,
                  "Softmax temperature (0: greedy, the most likely token each step)")
      ->capture_default_str();
  cmd->add_option("--top-k", f.options.top_k, "Sample among the k most likely tokens (0: all)")
      ->capture_default_str();
  cmd->add_option("--seed", f.options.seed, "Seed of the sampler")->capture_default_str();
  cmd->add_option("--tokenizer", f.tokenizer,
                  "llm.c tokenizer file (GPT-2's): encodes the prompt, decodes the text")
      ->capture_default_str();
  cmd->add_option("--device", f.device, "cpu, cuda, or auto (the GPU when usable)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--dtype", f.dtype, "fp32 or bf16 (weights and activations)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--attention", f.attention,
                  "naive or flash: the prompt's attention (each new token attends over the "
                  "cache)")
      ->check(CLI::IsMember({"naive", "flash"}))
      ->capture_default_str();
  cmd->add_flag("--no-kv-cache", f.no_kv_cache,
                "Recompute the whole window for every token (the slow path the cache is "
                "checked against)");
  f.cmd = cmd;
  cmd->callback([flags]() { run(*flags); });
}

}  // namespace ft::cli
