// Bring your own data: text files, directories of them, or JSON-lines files tokenised with
// GPT-2's BPE into llm.c token shards (`flashtrain prepare-data`).
//
// Documents: each text file is one, or it is split at `split_on` (the separator stays at the
// end of every document but the last, so the text comes back exactly); each line of a JSON-lines
// file (*.jsonl) is one, its `jsonl_field` string. A directory stands for every regular file
// under it, in path order (names starting with '.' skipped). Files are read whole, bytes as
// they are; invalid UTF-8 is replaced by U+FFFD (and counted). Every document is preceded by
// the end-of-text token, as llm.c's scripts do. The first `val_tokens` tokens go to
// NAME_val.bin, the rest to NAME_train.bin, or to NAME_train_000000.bin, ... when there are more
// than `shard_tokens` of them. tinyshakespeare.txt split at "\n\n" with 32768 validation tokens
// gives the shipped shards byte for byte (tests/apps/test_prepare_data.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "train/bpe.h"

namespace ft::train {

struct CorpusOptions {
  std::vector<std::string> inputs;  // files or directories
  std::string out_dir;
  std::string name;  // output prefix; empty: the first input's stem
  std::string jsonl_field = "text";
  std::string split_on;  // empty: one document per file (or JSON line)
  int64_t val_tokens = 32768;
  int64_t shard_tokens = 100'000'000;
  bool uint32_tokens = false;  // llm.c's LLaMA-3 shard format (else uint16)
};

struct CorpusProgress {
  int64_t bytes_done = 0, bytes_total = 0, tokens = 0, documents = 0;
};

struct CorpusSummary {
  int64_t documents = 0, tokens = 0, replaced_bytes = 0, files = 0;
  std::vector<std::pair<std::string, int64_t>> shards;  // path, tokens
};

// The files the inputs stand for, in the order they are read. Throws ft::Error for an input
// that does not exist, or inputs that hold no file.
std::vector<std::string> corpus_files(const std::vector<std::string>& inputs);

// Checks every option and input (the files exist, the output directory takes files), then
// tokenises and writes the shards. progress is called now and then while it works.
CorpusSummary prepare_corpus(const CorpusOptions& options, Gpt2Encoder& encoder,
                             const std::function<void(const CorpusProgress&)>& progress = {});

}  // namespace ft::train
