// `flashtrain train` as a user runs it: samples are valid UTF-8 on a pipe and in the JSON log.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "models/checkpoint.h"
#include "models/transformer.h"
#include "test_util.h"
#include "train/generate.h"
#include "train/tokenizer.h"
#include "train/utf8.h"

namespace ft {
namespace {

namespace fs = std::filesystem;

bool have_python() {
  return std::system("python3 --version >/dev/null 2>&1") == 0;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A freshly initialised model samples almost uniformly from GPT-2's 50257 tokens, 344 of which
// are pieces of UTF-8 characters. The final sample of this run is reproduced from its saved
// checkpoint: its raw token bytes are not valid UTF-8 (checked), yet what the run printed on a
// pipe decodes as strict UTF-8, is exactly those bytes with only whole characters kept, and the
// JSON log (samples included) parses.
TEST(TrainSamples, AreValidUtf8OnAPipeAndInTheLog) {
  if (!have_python()) GTEST_SKIP() << "python3 not found";
  test::TempDir dir;
  const std::string log = dir.file("run.jsonl"), ckpt = dir.file("ck.bin");
  const int64_t tokens = 300;
  const uint64_t seed = 3;
  const std::string train = std::string("'") + FLASHTRAIN_CLI +
                            "' train --batch-size 1 --seq-len 8 --steps 2 --val-data '' "
                            "--sample-every 1 --sample-tokens " +
                            std::to_string(tokens) + " --seed " + std::to_string(seed) +
                            " --save '" + ckpt + "' --log '" + log + "'";
  const test::CommandResult r =
      test::run_shell(train + " | tee '" + dir.file("out.txt") +
                      "' | python3 -c \"import sys; sys.stdin.buffer.read().decode('utf-8')\"");
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const models::ModelConfig mc = models::read_checkpoint_config(ckpt);
  models::Transformer model(mc, DType::f32, {});
  models::load_checkpoint(ckpt, model);
  const train::Tokenizer tokenizer(test::source_path("data/gpt2_tokenizer.bin"));
  train::GenerateOptions o;
  o.tokens = tokens;
  o.seed = seed;
  std::string raw;
  for (int32_t id : train::generate_tokens(model, {tokenizer.eot_token()}, o))
    raw += tokenizer.decode(id);
  ASSERT_FALSE(train::is_valid_utf8(raw)) << "this sample should split a character";
  const std::string printed = read_file(dir.file("out.txt"));
  const std::string expected = "sample:\n" + train::valid_utf8(raw) + "\n";
  EXPECT_NE(printed.find(expected), std::string::npos) << printed;

  const test::CommandResult j = test::run_shell(
      "python3 -c \"import json, sys\n"
      "lines = open(sys.argv[1], encoding='utf-8').read().splitlines()\n"
      "samples = [json.loads(l) for l in lines if json.loads(l).get('event') == 'sample']\n"
      "assert len(samples) == 1 and samples[0]['step'] == 1 and samples[0]['text'], samples\n"
      "summary = json.loads(lines[-1])\n"
      "assert summary['event'] == 'summary' and summary['sample'], summary\n"
      "\" '" +
      log + "'");
  EXPECT_EQ(j.exit_code, 0) << j.output;
  std::ifstream in(log);
  std::string line, last;
  while (std::getline(in, line)) last = line;
  EXPECT_EQ(nlohmann::json::parse(last)["sample"], train::valid_utf8(raw));
}

}  // namespace
}  // namespace ft
