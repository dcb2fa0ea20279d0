// Bad inputs give an ft::Error naming the offending value, through the library and through
// `flashtrain attention` end to end (non-zero exit, "error: ..." on stderr); a good CLI run
// writes its outputs and prints --check errors.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "attention_test_util.h"
#include "core/device.h"
#include "core/npy.h"

namespace ft::attention::testing {
namespace {

Tensor randn(const Shape& shape, DType dtype = DType::f32) {
  static Rng rng(99);
  return random_tensor(shape, dtype, rng);
}

TEST(AttentionErrors, MismatchedShapes) {
  const Tensor q = randn({2, 16, 4, 32});
  expect_error(
      [&] {
        make_problem(q, randn({2, 17, 2, 32}), randn({2, 17, 2, 32}), {});
      },
      {"[2, 17, 2, 32]"});
  expect_error(
      [&] {
        make_problem(q, randn({2, 16, 2, 32}), randn({2, 16, 2, 40}), {});
      },
      {"[2, 16, 2, 40]"});
  expect_error(
      [&] {
        make_problem(q, randn({1, 16, 2, 32}), randn({1, 16, 2, 32}), {});
      },
      {"[1, 16, 2, 32]"});
  expect_error(
      [&] {
        make_problem(randn({16, 4, 32}), randn({16, 2, 32}), randn({16, 2, 32}), {});
      },
      {"[16, 4, 32]"});
  // A tensor that disagrees with the problem it is passed with.
  const Problem p = make_problem(q, randn({2, 16, 2, 32}), randn({2, 16, 2, 32}), {});
  expect_error(
      [&] {
        forward(Impl::flash, p, q, randn({2, 16, 2, 32}), randn({2, 16, 1, 32}));
      },
      {"v", "[2, 16, 1, 32]"});
}

TEST(AttentionErrors, WrongDtypes) {
  const Tensor q = randn({1, 8, 2, 32});
  const Problem p = make_problem(q, randn({1, 8, 2, 32}), randn({1, 8, 2, 32}), {});
  for (Impl impl : {Impl::naive, Impl::flash}) {
    expect_error(
        [&] {
          forward(impl, p, q, randn({1, 8, 2, 32}, DType::bf16), randn({1, 8, 2, 32}));
        },
        {"k", "bf16", "fp32"});
  }
  const Tensor qi = Tensor::zeros({1, 8, 2, 32}, DType::i32);
  expect_error([&] { make_problem(qi, qi, qi, {}); }, {"int32"});
  const ForwardOutput f = forward(Impl::flash, p, q, randn({1, 8, 2, 32}), randn({1, 8, 2, 32}));
  expect_error(
      [&] {
        backward(Impl::flash, p, q, q, q, f, randn({1, 8, 2, 32}, DType::bf16));
      },
      {"dout", "bf16"});
}

TEST(AttentionErrors, UnsupportedHeadDims) {
  for (int64_t d : {12, 264, 0}) {
    const Tensor q = randn({1, 4, 1, d});
    expect_error([&] { make_problem(q, q, q, {}); }, {"head dim " + std::to_string(d), "256"});
  }
}

TEST(AttentionErrors, HeadsNotAMultiple) {
  expect_error(
      [&] {
        make_problem(randn({1, 4, 3, 8}), randn({1, 4, 2, 8}), randn({1, 4, 2, 8}), {});
      },
      {"(3)", "(2)"});
}

TEST(AttentionErrors, BadSegmentIds) {
  Mask m;
  m.has_segments = true;
  const Tensor q = randn({2, 8, 2, 16});
  const Problem p = make_problem(q, q, q, m);
  expect_error(
      [&] {
        forward(Impl::flash, p, q, q, q, Tensor::zeros({2, 9}, DType::i32));
      },
      {"segment ids", "[2, 9]", "[2, 8]"});
  expect_error(
      [&] {
        forward(Impl::naive, p, q, q, q, Tensor::zeros({2, 8}, DType::f32));
      },
      {"segment ids", "fp32", "int32"});
  expect_error([&] { forward(Impl::flash, p, q, q, q); }, {"segment ids", "missing"});
  const Problem no_segments = make_problem(q, q, q, {});
  expect_error(
      [&] {
        forward(Impl::flash, no_segments, q, q, q, Tensor::zeros({2, 8}, DType::i32));
      },
      {"segment ids", "has_segments"});
  Mask negative;
  negative.window = -3;
  expect_error([&] { make_problem(q, q, q, negative); }, {"window", "-3"});
}

// ---- the CLI, end to end ----

struct CliRun {
  int exit_code;
  std::string output;  // stdout and stderr
};

CliRun run_cli(const std::string& args) {
  const std::string cmd = std::string(FLASHTRAIN_CLI) + " attention " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  EXPECT_NE(pipe, nullptr);
  CliRun run{-1, ""};
  char buffer[4096];
  while (pipe && fgets(buffer, sizeof buffer, pipe)) run.output += buffer;
  const int status = pipe ? pclose(pipe) : -1;
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

class AttentionCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        std::filesystem::temp_directory_path() / ("ft_attention_cli_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
    Rng rng(5);
    save("q", random_tensor({2, 40, 4, 32}, DType::f32, rng));
    save("k", random_tensor({2, 40, 2, 32}, DType::f32, rng));
    save("v", random_tensor({2, 40, 2, 32}, DType::f32, rng));
    save("do", random_tensor({2, 40, 4, 32}, DType::f32, rng));
    save("k_bad_dim", random_tensor({2, 40, 2, 24}, DType::f32, rng));
    save("q_d12", random_tensor({2, 40, 4, 12}, DType::f32, rng));
    save("k_d12", random_tensor({2, 40, 2, 12}, DType::f32, rng));
    save("v_d12", random_tensor({2, 40, 2, 12}, DType::f32, rng));
    save("k_3heads", random_tensor({2, 40, 3, 32}, DType::f32, rng));
    save("seg", make_segment_ids(2, 40, rng));
    save("seg_short", make_segment_ids(2, 39, rng));
    save("q_f64", random_tensor({2, 40, 4, 32}, DType::f64, rng));
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void save(const std::string& name, const Tensor& t) { npy::save(path(name), t); }
  std::string path(const std::string& name) const { return (dir_ / (name + ".npy")).string(); }
  std::string inputs(const std::string& q, const std::string& k, const std::string& v = "v") const {
    return "--q " + path(q) + " --k " + path(k) + " --v " + path(v) + " --out-dir " +
           (dir_ / "out").string();
  }
  void expect_failure(const std::string& args, std::initializer_list<std::string> parts) {
    const CliRun run = run_cli(args);
    EXPECT_NE(run.exit_code, 0) << args;
    EXPECT_NE(run.output.find("error:"), std::string::npos) << run.output;
    for (const std::string& part : parts) {
      EXPECT_NE(run.output.find(part), std::string::npos)
          << "'" << part << "' not in: " << run.output;
    }
  }

  std::filesystem::path dir_;
};

TEST_F(AttentionCli, GoodRunWritesOutputsAndChecks) {
  const CliRun run =
      run_cli(inputs("q", "k") + " --do " + path("do") + " --segment-ids " + path("seg") +
              " --impl flash --dtype bf16 --causal --window 9 --check");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  for (const char* name : {"o", "lse", "dq", "dk", "dv"}) {
    const auto file = dir_ / "out" / (std::string(name) + ".npy");
    ASSERT_TRUE(std::filesystem::exists(file)) << file;
  }
  const Tensor o = npy::load((dir_ / "out" / "o.npy").string());
  EXPECT_EQ(o.shape(), (Shape{2, 40, 4, 32}));
  EXPECT_EQ(o.dtype(), DType::bf16);
  EXPECT_EQ(npy::load((dir_ / "out" / "lse.npy").string()).dtype(), DType::f32);
  for (const char* name : {"o ", "lse", "dq", "dk", "dv"}) {
    EXPECT_NE(run.output.find(std::string("check ") + name), std::string::npos) << run.output;
  }
  EXPECT_EQ(run.output.find("NOT FINITE"), std::string::npos) << run.output;
}

TEST_F(AttentionCli, BadInputsFailClearly) {
  expect_failure(inputs("q", "k_bad_dim"), {"[2, 40, 2, 24]"});
  expect_failure(inputs("q_d12", "k_d12", "v_d12") + " --impl naive", {"head dim 12"});
  expect_failure(inputs("q", "k_3heads"), {"[2, 40, 3, 32]"});
  expect_failure(inputs("q_f64", "k"), {"fp64", "float32"});
  expect_failure(inputs("q", "k") + " --segment-ids " + path("seg_short"), {"[2, 39]"});
  expect_failure(inputs("q", "k") + " --segment-ids " + path("q"), {"fp32", "int32"});
  if (cuda_device_count() == 0) {
    // Built without CUDA, or no GPU: the reason, never a crash (test_cuda_naive runs the GPU).
    expect_failure(inputs("q", "k") + " --device cuda --impl naive", {"--device cuda"});
  }
  expect_failure(inputs("q", "k") + " --impl fastest", {"fastest"});
  expect_failure(inputs("q", "missing"), {"missing.npy"});
}

}  // namespace
}  // namespace ft::attention::testing
