// `flashtrain prepare-data`: text files, directories or JSON-lines files -> llm.c token shards
// with GPT-2's BPE (train/corpus.h). Progress goes to stderr, the shards written to stdout.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "core/error.h"
#include "train/bpe.h"
#include "train/corpus.h"
#include "train/tokenizer.h"

namespace ft::cli {
namespace {

struct PrepareFlags {
  train::CorpusOptions options;
  std::string tokenizer = "data/gpt2_tokenizer.bin";
};

// The escapes a shell makes awkward: \n, \r, \t and \\ (so that --split-on '\n\n' works).
std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    const char c = s[++i];
    FT_CHECK(c == 'n' || c == 'r' || c == 't' || c == '\\', "--split-on: unknown escape \\", c,
             " (allowed: \\n \\r \\t \\\\)");
    out += c == 'n' ? '\n' : c == 'r' ? '\r' : c == 't' ? '\t' : '\\';
  }
  return out;
}

void run(PrepareFlags& f) {
  train::CorpusOptions& o = f.options;
  o.split_on = unescape(o.split_on);
  const train::Tokenizer tokenizer(f.tokenizer);
  train::Gpt2Encoder encoder(tokenizer);
  const auto start = std::chrono::steady_clock::now();
  auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  double last_report = 0.0;
  // A line every few seconds on big inputs; small ones finish before the first.
  const train::CorpusSummary s =
      train::prepare_corpus(o, encoder, [&](const train::CorpusProgress& p) {
        if (seconds() - last_report < 2.0) return;
        last_report = seconds();
        const double mb = 1024.0 * 1024.0;
        std::fprintf(
            stderr,
            "prepare-data: %.1f of %.1f MB (%.0f%%), %lld documents, %lld tokens, "
            "%.1f MB/s\n",
            static_cast<double>(p.bytes_done) / mb, static_cast<double>(p.bytes_total) / mb,
            p.bytes_total
                ? 100.0 * static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total)
                : 100.0,
            static_cast<long long>(p.documents), static_cast<long long>(p.tokens),
            static_cast<double>(p.bytes_done) / mb / std::max(seconds(), 1e-9));
      });
  std::printf(
      "encoded %lld file%s, %lld documents, %lld tokens (GPT-2 BPE, end-of-text %d "
      "before each document) in %.1f s\n",
      static_cast<long long>(s.files), s.files == 1 ? "" : "s", static_cast<long long>(s.documents),
      static_cast<long long>(s.tokens), encoder.eot_token(), seconds());
  if (s.replaced_bytes > 0) {
    std::printf(
        "note: %lld bytes of documents with invalid UTF-8 were read with U+FFFD in "
        "place of the invalid bytes\n",
        static_cast<long long>(s.replaced_bytes));
  }
  for (const auto& [path, tokens] : s.shards) {
    std::printf("wrote %s (%lld tokens)\n", path.c_str(), static_cast<long long>(tokens));
  }
}

}  // namespace

void add_prepare_data_command(CLI::App& app) {
  auto flags = std::make_shared<PrepareFlags>();
  train::CorpusOptions& o = flags->options;
  CLI::App* cmd = app.add_subcommand(
      "prepare-data",
      "Tokenise text files, directories or JSON-lines files with GPT-2's BPE into llm.c token "
      "shards (NAME_val.bin, NAME_train.bin) for train --train-data / --val-data");
  cmd->add_option("inputs", o.inputs,
                  "Text files (each one document, or split with --split-on), directories (every "
                  "file under them, in path order) and *.jsonl files (one document per line)")
      ->required();
  cmd->add_option("--out-dir", o.out_dir, "Where the shards go (created if missing)")->required();
  cmd->add_option("--name", o.name, "Shard name prefix (default: the first input's stem)");
  cmd->add_option("--split-on", o.split_on,
                  "Split text files into documents at this separator, kept at the end of each "
                  "document (escapes \\n \\t \\r \\\\; e.g. '\\n\\n')");
  cmd->add_option("--jsonl-field", o.jsonl_field, "The string field of each JSON line")
      ->capture_default_str();
  cmd->add_option("--val-tokens", o.val_tokens,
                  "The first N tokens form the validation shard (0: none)")
      ->capture_default_str();
  cmd->add_option("--shard-tokens", o.shard_tokens,
                  "At most this many tokens per training shard (more: numbered shards)")
      ->capture_default_str();
  cmd->add_flag("--uint32", o.uint32_tokens,
                "Write llm.c's uint32 shards (magic 20240801) instead of uint16 (20240520)");
  cmd->add_option("--tokenizer", flags->tokenizer, "llm.c tokenizer file (GPT-2's)")
      ->capture_default_str();
  cmd->callback([flags]() { run(*flags); });
}

}  // namespace ft::cli
