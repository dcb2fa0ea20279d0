// Every bad flag and bad input is refused before any work starts, as exactly one line
// "error: ..." and exit status 1: CLI11's own parse errors (unknown flag, a value that does not
// convert, a value outside its set, a flag given twice), values out of range, conflicting
// flags, and output paths that cannot be written. --help still prints help and exits 0.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/npy.h"
#include "models/checkpoint.h"
#include "models/transformer.h"
#include "test_util.h"

namespace ft {
namespace {

namespace fs = std::filesystem;

// The whole output is one line that starts with "error: " and holds `needle`.
void expect_one_error_line(const std::string& args, const std::string& needle) {
  const test::CommandResult r = test::run_cli(args);
  EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.output;
  EXPECT_EQ(r.output.rfind("error: ", 0), 0u) << args << "\n" << r.output;
  EXPECT_EQ(r.output.find('\n'), r.output.size() - 1) << "not one line: " << args << "\n"
                                                      << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\n" << r.output;
}

const std::string kQuick =
    "--device cpu --batch-size 1 --seq-len 8 --val-data '' --sample-tokens 0 ";

TEST(CliErrors, ParseErrorsAreOneErrorLineAndExit1) {
  expect_one_error_line("train --bogus", "--bogus");
  expect_one_error_line("train --lr abc", "abc");
  expect_one_error_line("train --dtype fp16", "fp16");
  expect_one_error_line("train --steps 1 --steps 2", "--steps");
  expect_one_error_line("train --attention fast", "fast");
  expect_one_error_line("train --recompute all",
                        "--recompute: all not in {none,attention,mlp,block,elementwise}");
  expect_one_error_line("", "subcommand");
  expect_one_error_line("no-such-command", "no-such-command");
  expect_one_error_line("attention --q q.npy", "required");
  expect_one_error_line("compare-loss", "required");
}

TEST(CliErrors, HelpIsNotAnError) {
  const test::CommandResult r = test::run_cli("train --help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--steps"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("error:"), std::string::npos) << r.output;
}

TEST(CliErrors, TrainValuesOutOfRangeAreRefusedBeforeStep1) {
  expect_one_error_line("train " + kQuick + "--weight-decay nan", "--weight-decay");
  expect_one_error_line("train " + kQuick + "--weight-decay -0.1", "--weight-decay");
  expect_one_error_line("train " + kQuick + "--min-lr-frac 2", "--min-lr-frac must be in [0, 1]");
  expect_one_error_line("train " + kQuick + "--classifier-chunk -3",
                        "--classifier-chunk takes auto or a number of rows >= 0");
  expect_one_error_line("train " + kQuick + "--classifier-chunk 12x", "got '12x'");
  expect_one_error_line("train " + kQuick + "--min-lr-frac -0.5", "--min-lr-frac");
  expect_one_error_line("train " + kQuick + "--grad-clip -1", "--grad-clip");
  expect_one_error_line("train " + kQuick + "--grad-clip inf", "--grad-clip");
  expect_one_error_line("train " + kQuick + "--eval-every -1", "--eval-every");
  expect_one_error_line("train " + kQuick + "--sample-tokens -5", "--sample-tokens");
  expect_one_error_line("train " + kQuick + "--sample-every -1", "--sample-every");
  expect_one_error_line("train " + kQuick + "--save-every -1", "--save-every");
  expect_one_error_line("train " + kQuick + "--save-every 2", "needs --save");
  expect_one_error_line("train " + kQuick + "--window -4", "--window");
  expect_one_error_line("train " + kQuick + "--global-every -2", "--global-every");
  expect_one_error_line("train " + kQuick + "--total-batch-size -8", "--total-batch-size");
  expect_one_error_line("train " + kQuick + "--lr -1", "lr must be a positive number");
  expect_one_error_line("train " + kQuick + "--layers -3", "--layers must be >= 1");
  expect_one_error_line("train " + kQuick + "--width 0", "--width must be >= 1");
  expect_one_error_line("train " + kQuick + "--tokenizer data/missing_tokenizer.bin",
                        "data/missing_tokenizer.bin");
  expect_one_error_line("train " + kQuick + "--sample-every 1 --tokenizer data/missing.bin",
                        "data/missing.bin");
}

TEST(CliErrors, ShapeOverridesConflictWithLoad) {
  test::TempDir dir;
  models::ModelOverrides o;
  o.layers = 1;
  o.width = 32;
  o.heads = 2;
  const models::ModelConfig config = models::apply_overrides(models::preset("gpt2-tiny"), o);
  models::Transformer model(config, DType::f32, {});
  model.init_weights(1);
  const std::string ckpt = dir.file("ck.bin");
  models::save_checkpoint(ckpt, model, DType::f32);
  expect_one_error_line("train " + kQuick + "--steps 1 --load '" + ckpt + "' --layers 6",
                        "--layers 6 would be ignored");
  expect_one_error_line("train " + kQuick + "--steps 1 --load '" + ckpt + "' --model llama3-tiny",
                        "--model llama3-tiny would be ignored");
  expect_one_error_line("train " + kQuick + "--steps 1 --load '" + ckpt + "' --context 64",
                        "--context 64");
  const test::CommandResult ok =
      test::run_cli("train " + kQuick + "--steps 1 --load '" + ckpt + "'");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
}

// The save path is checked before step 1: a run is never trained and then lost.
TEST(CliErrors, UnwritableOutputsAreRefusedBeforeStep1) {
  test::TempDir dir;
  const std::string missing_dir = dir.file("no/such/dir/ck.bin");
  expect_one_error_line("train " + kQuick + "--steps 30 --save '" + missing_dir + "'",
                        "does not exist");
  EXPECT_FALSE(fs::exists(dir.file("no")));
  expect_one_error_line("train " + kQuick + "--steps 30 --save '" + dir.path().string() + "'",
                        "is a directory");
  expect_one_error_line("train " + kQuick + "--steps 30 --log '" + missing_dir + "'", "--log");
  // Nothing of the probe is left behind next to a good path.
  const test::CommandResult ok =
      test::run_cli("train " + kQuick + "--steps 1 --save '" + dir.file("ck.bin") + "'");
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  }
}

// `attention` checks --do's shape and --out-dir before the forward runs.
TEST(CliErrors, AttentionChecksInputsAndOutputsBeforeComputing) {
  test::TempDir dir;
  auto write = [&](const std::string& name, const Shape& shape) {
    Tensor t = Tensor::empty(shape, DType::f32);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = 0.1f * static_cast<float>(i % 7);
    npy::save(dir.file(name), t);
  };
  write("q.npy", {1, 8, 2, 8});
  write("bad_do.npy", {1, 4, 2, 8});
  const std::string q = dir.file("q.npy");
  const std::string base = "attention --q '" + q + "' --k '" + q + "' --v '" + q + "' ";
  expect_one_error_line(
      base + "--do '" + dir.file("bad_do.npy") + "' --out-dir '" + dir.file("out") + "'", "--do");
  EXPECT_FALSE(fs::exists(dir.file("out")));
  expect_one_error_line(base + "--out-dir /proc/flashtrain_no_such_dir", "--out-dir");
  expect_one_error_line(base + "--out-dir '" + dir.file("out") + "' --window -1", "--window");
  const test::CommandResult ok = test::run_cli(base + "--out-dir '" + dir.file("out") + "'");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_TRUE(fs::exists(dir.file("out/o.npy")));
  // Segment ids as NumPy's default int64 give what the same ids as int32 give.
  std::string dict = "{'descr': '<i8', 'fortran_order': False, 'shape': (1, 8), }";
  while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  {
    std::ofstream out(dir.file("seg64.npy"), std::ios::binary);
    out.write("\x93NUMPY\x01\x00", 8);
    const char len[2] = {static_cast<char>(dict.size()), 0};
    out.write(len, 2);
    out << dict;
    for (int64_t t = 0; t < 8; ++t) {
      const int64_t id = t < 3 ? 0 : 1;
      out.write(reinterpret_cast<const char*>(&id), 8);
    }
  }
  Tensor seg32 = Tensor::empty({1, 8}, DType::i32);
  for (int64_t t = 0; t < 8; ++t) seg32.data<int32_t>()[t] = t < 3 ? 0 : 1;
  npy::save(dir.file("seg32.npy"), seg32);
  for (const char* seg : {"seg64", "seg32"}) {
    const test::CommandResult r =
        test::run_cli(base + "--causal --segment-ids '" + dir.file(std::string(seg) + ".npy") +
                      "' --out-dir '" + dir.file(seg) + "'");
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  EXPECT_EQ(max_abs_diff(npy::load(dir.file("seg64/o.npy")), npy::load(dir.file("seg32/o.npy"))),
            0.0);
}

// --kernel-config: a bad file is refused naming its row and field, before what the other flags
// say is judged; a good one where no configurable kernel runs (the CPU, naive attention) is
// refused as `attention --config` is there.
TEST(CliErrors, KernelConfigFilesAreCheckedFirst) {
  test::TempDir dir;
  const std::string bad = dir.file("bad.json"), good = dir.file("good.json");
  const std::string head = R"({"format": "flashtrain-kernel-config", "version": 1, "rows": [)";
  std::ofstream(bad) << head
                     << R"({"arch": "sm90", "max_head_dim": 128, "mask": "sparse", )"
                        R"("config": "fwd=64x64/128 bwd=64x64/128/double"}]})";
  std::ofstream(good) << head
                      << R"({"arch": "sm90", "max_head_dim": 128, "mask": "local", )"
                         R"("config": "fwd=64x64/128 bwd=64x64/128/double"}]})";
  const std::string bad_mask = "kernel config file " + bad + R"(: rows[0]: "mask": expected)";
  Tensor q = Tensor::empty({1, 8, 2, 8}, DType::f32);
  for (int64_t i = 0; i < q.numel(); ++i) q.data<float>()[i] = 0.1f * static_cast<float>(i % 5);
  npy::save(dir.file("q.npy"), q);
  const std::string qkv = "--q '" + dir.file("q.npy") + "' --k '" + dir.file("q.npy") + "' --v '" +
                          dir.file("q.npy") + "' --out-dir '" + dir.file("out") + "' ";
  expect_one_error_line("attention " + qkv + "--kernel-config '" + bad + "'", bad_mask);
  expect_one_error_line("attention " + qkv + "--device cuda --kernel-config '" + bad + "'",
                        bad_mask);
  expect_one_error_line("attention " + qkv + "--kernel-config '" + dir.file("none.json") + "'",
                        "kernel config file " + dir.file("none.json") + ": no such file");
  expect_one_error_line("attention " + qkv + "--kernel-config '" + good + "'",
                        "--kernel-config " + good +
                            " sets the CUDA flash kernels' tiles: it needs --impl flash "
                            "--device cuda");
  EXPECT_FALSE(fs::exists(dir.file("out")));

  expect_one_error_line("train " + kQuick + "--steps 1 --kernel-config '" + bad + "'", bad_mask);
  expect_one_error_line("train " + kQuick + "--steps 1 --kernel-config '" + good + "'",
                        "--kernel-config " + good +
                            " sets the CUDA flash kernels' configurations: it needs --attention "
                            "flash on a GPU (this run: naive attention on cpu)");
  expect_one_error_line(
      "train " + kQuick + "--steps 1 --attention flash --kernel-config '" + good + "'",
      "(this run: flash attention on cpu)");
  for (const char* command : {"train", "attention"}) {
    const test::CommandResult help = test::run_cli(std::string(command) + " --help");
    EXPECT_NE(help.output.find("--kernel-config"), std::string::npos) << help.output;
  }
}

TEST(CliErrors, OtherCommandsRangeCheckTheirFlags) {
  expect_one_error_line(
      "compare-loss tests/fixtures/report/ours_base tests/fixtures/report/ours_flash "
      "--threshold-fp32 -1",
      "--threshold-fp32");
  expect_one_error_line(
      "compare-loss tests/fixtures/report/ours_base tests/fixtures/report/ours_flash "
      "--threshold-bf16 nan",
      "--threshold-bf16");
  expect_one_error_line(
      "debug-step --load x.bin --tokens x.npy --targets y.npy --out-dir o --weight-decay nan",
      "--weight-decay must be a finite number >= 0");
  expect_one_error_line(
      "debug-step --load x.bin --tokens x.npy --targets y.npy --out-dir o --grad-clip inf",
      "--grad-clip");
}

// Commands whose output comes at the end check its path first.
TEST(CliErrors, ReportAndSweepOutputsAreCheckedFirst) {
  const test::CommandResult sweep =
      test::run_cli("sweep --dry-run --arch sm90 --json /proc/flashtrain_no_dir/sweep.json");
  EXPECT_EQ(sweep.exit_code, 1) << sweep.output;
  EXPECT_EQ(sweep.output.rfind("error: --json /proc/flashtrain_no_dir/sweep.json", 0), 0u)
      << sweep.output;
  const test::CommandResult summarize = test::run_cli(
      "summarize tests/fixtures/report/ours_base tests/fixtures/report/ours_flash --csv "
      "/proc/flashtrain_no_dir/s.csv");
  EXPECT_EQ(summarize.exit_code, 2) << summarize.output;
  EXPECT_EQ(summarize.output.rfind("error: --csv /proc/flashtrain_no_dir/s.csv", 0), 0u)
      << summarize.output;
}

}  // namespace
}  // namespace ft
