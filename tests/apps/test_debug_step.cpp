// `flashtrain debug-step`: the dumped logits, loss and gradients are those of Transformer on the
// same checkpoint and batch, the AdamW losses start at that loss and fall, and bad input fails
// with one clear line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/device.h"
#include "core/npy.h"
#include "core/rng.h"
#include "models/checkpoint.h"
#include "models/transformer.h"
#include "test_util.h"
#include "train/optimizer.h"

namespace ft {
namespace {

constexpr int64_t kBatch = 2, kSeq = 8;

models::ModelConfig tiny(const std::string& preset) {
  models::ModelOverrides o;
  o.layers = 2;
  o.width = 32;
  o.heads = 4;
  o.vocab = 300;  // pads to 384: the dumped logits cover the padded columns
  o.context = 16;
  if (preset == "llama3-tiny") o.kv_heads = 2;
  return models::apply_overrides(models::preset(preset), o);
}

Tensor random_ids(int64_t vocab, uint64_t seed, int64_t T = kSeq) {
  Rng rng(seed);
  Tensor ids = Tensor::empty({kBatch, T}, DType::i32);
  for (int64_t i = 0; i < ids.numel(); ++i) {
    ids.data<int32_t>()[i] = static_cast<int32_t>(rng.uniform() * static_cast<double>(vocab));
  }
  return ids;
}

// A checkpoint written by the library and a batch, in a temporary directory.
struct Fixture {
  test::TempDir dir;
  models::ModelConfig config;
  Tensor tokens, targets;

  explicit Fixture(const std::string& preset) : config(tiny(preset)) {
    models::Transformer model(config, DType::f32, {});
    model.init_weights(42);
    models::save_checkpoint(dir.file("model.bin"), model, DType::f32);
    tokens = random_ids(config.vocab_size, 1);
    targets = random_ids(config.vocab_size, 2);
    npy::save(dir.file("x.npy"), tokens);
    npy::save(dir.file("y.npy"), targets);
  }

  std::string args(const std::string& extra = "") const {
    return "debug-step --load '" + dir.file("model.bin") + "' --tokens '" + dir.file("x.npy") +
           "' --targets '" + dir.file("y.npy") + "' --out-dir '" + dir.file("out") + "' " + extra;
  }
};

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

class DebugStepTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DebugStepTest, DumpsWhatTransformerComputes) {
  Fixture f(GetParam());
  const test::CommandResult r = test::run_cli(f.args("--steps 4 --lr 1e-3"));
  ASSERT_EQ(r.exit_code, 0) << r.output;

  models::Transformer model(f.config, DType::f32, {});
  models::load_checkpoint(f.dir.file("model.bin"), model);
  model.zero_grad();
  const double loss = model.forward(f.tokens, f.targets);
  const Tensor logits = model.logits().clone();
  model.backward(1.0);

  const nlohmann::json summary = read_json(f.dir.file("out/losses.json"));
  EXPECT_NEAR(summary["loss"].get<double>(), loss, 1e-6 * loss);
  const std::vector<double> losses = summary["losses"].get<std::vector<double>>();
  ASSERT_EQ(losses.size(), 4u);
  EXPECT_EQ(losses[0], summary["loss"].get<double>());
  EXPECT_LT(losses.back(), losses.front()) << "AdamW on one batch should lower its loss";
  EXPECT_EQ(summary["grad_norms"].size(), 4u);

  const Tensor dumped_logits = npy::load(f.dir.file("out/logits.npy"));
  ASSERT_EQ(dumped_logits.shape(), Shape({kBatch * kSeq, f.config.padded_vocab_size}));
  EXPECT_EQ(dumped_logits.dtype(), DType::f32);
  EXPECT_LT(relative_error(dumped_logits, logits), 1e-6);
  for (const models::Parameter& p : model.parameters()) {
    const std::string path = f.dir.file("out/grad_" + p.name + ".npy");
    ASSERT_TRUE(std::filesystem::exists(path)) << path;
    const Tensor g = npy::load(path);
    ASSERT_EQ(g.shape(), p.grad.shape()) << p.name;
    EXPECT_LT(relative_error(g, p.grad), 1e-6) << p.name;
  }
}

TEST_P(DebugStepTest, Bf16RunsAndStaysNearFp32) {
  Fixture f(GetParam());
  ASSERT_EQ(test::run_cli(f.args("--steps 1")).exit_code, 0);
  const double fp32_loss = read_json(f.dir.file("out/losses.json"))["loss"].get<double>();
  const test::CommandResult r = test::run_cli(f.args("--steps 1 --dtype bf16"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const double bf16_loss = read_json(f.dir.file("out/losses.json"))["loss"].get<double>();
  EXPECT_NEAR(bf16_loss, fp32_loss, 1e-2 * fp32_loss);
}

// The AdamW steps are training's optimizer step (train::Optimizer: norm, clipping, the
// multi-tensor update that refreshes the compute copies): the same losses and norms, bit for
// bit, as that object stepping the model in this process, with clipping acting (bf16: the
// compute copies feed every forward after the first). Bit for bit holds because the CLI runs
// with this process's environment: the same OpenBLAS kernel and OpenMP thread count.
TEST_P(DebugStepTest, AdamWStepsAreTrainingsOptimizer) {
  Fixture f(GetParam());
  for (const char* dtype : {"fp32", "bf16"}) {
    SCOPED_TRACE(dtype);
    const double clip = 0.05, lr = 1e-3;
    const test::CommandResult r = test::run_cli(
        f.args(str("--steps 4 --lr ", lr, " --grad-clip ", clip, " --dtype ", dtype)));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const nlohmann::json summary = read_json(f.dir.file("out/losses.json"));
    const std::vector<double> losses = summary["losses"].get<std::vector<double>>();
    const std::vector<double> norms = summary["grad_norms"].get<std::vector<double>>();
    ASSERT_EQ(losses.size(), 4u);
    ASSERT_EQ(norms.size(), 4u);

    models::Transformer model(f.config, parse_dtype(dtype), {});
    models::load_checkpoint(f.dir.file("model.bin"), model);
    train::Optimizer optimizer(model, nn::AdamWConfig{}, clip);
    for (size_t step = 1; step <= 4; ++step) {
      model.zero_grad();
      const double loss = model.forward(f.tokens, f.targets);
      model.backward(1.0);
      const train::OptimizerStep s = optimizer.step(static_cast<int64_t>(step), lr);
      EXPECT_EQ(losses[step - 1], loss) << "step " << step;
      EXPECT_EQ(norms[step - 1], s.grad_norm()) << "step " << step;
      EXPECT_LT(s.grad_scale(), 1.0) << "step " << step << ": clipping should act";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, DebugStepTest, ::testing::Values("gpt2-tiny", "llama3-tiny"));

// Runs the command with one input replaced and expects exit 1 and `expected` in the message.
void expect_error(const std::string& args, const std::string& expected) {
  const test::CommandResult r = test::run_cli(args);
  EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.output;
  EXPECT_NE(r.output.find("error: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(expected), std::string::npos)
      << "expected '" << expected << "' in: " << r.output;
}

TEST(DebugStepCli, BadInputGivesClearErrors) {
  Fixture f("gpt2-tiny");
  const std::string bad = f.dir.file("bad.npy");
  expect_error(f.args("--steps -1"), "--steps must be >= 0");

  Tensor floats = Tensor::zeros({kBatch, kSeq}, DType::f32);
  npy::save(bad, floats);
  expect_error("debug-step --load '" + f.dir.file("model.bin") + "' --tokens '" + bad +
                   "' --targets '" + f.dir.file("y.npy") + "' --out-dir '" + f.dir.file("o") + "'",
               "token ids must be integers ('<i4' int32 or '<i8' int64), got .npy dtype '<f4'");

  Tensor out_of_range = f.tokens.clone();
  out_of_range.data<int32_t>()[3] = 300;
  npy::save(bad, out_of_range);
  expect_error("debug-step --load '" + f.dir.file("model.bin") + "' --tokens '" + bad +
                   "' --targets '" + f.dir.file("y.npy") + "' --out-dir '" + f.dir.file("o") + "'",
               "id 300 at index 3 is outside [0, 300)");

  npy::save(bad, random_ids(300, 3, kSeq / 2));
  expect_error("debug-step --load '" + f.dir.file("model.bin") + "' --tokens '" +
                   f.dir.file("x.npy") + "' --targets '" + bad + "' --out-dir '" + f.dir.file("o") +
                   "'",
               "must have the shape of the tokens");

  npy::save(bad, random_ids(300, 3, 32));
  expect_error("debug-step --load '" + f.dir.file("model.bin") + "' --tokens '" + bad +
                   "' --targets '" + bad + "' --out-dir '" + f.dir.file("o") + "'",
               "more than the model's context 16");

  expect_error("debug-step --load '" + f.dir.file("missing.bin") + "' --tokens '" +
                   f.dir.file("x.npy") + "' --targets '" + f.dir.file("y.npy") + "' --out-dir '" +
                   f.dir.file("o") + "'",
               "missing.bin: cannot open checkpoint");
  EXPECT_FALSE(std::filesystem::exists(f.dir.file("o"))) << "no output for a failed run";

  const test::CommandResult r = test::run_cli(f.args("--dtype fp16"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("fp16"), std::string::npos) << r.output;
}

// NumPy's default integer dtype is int64: such ids give what the same ids as int32 give.
void save_int64_npy(const std::string& path, const Tensor& ids) {
  std::string dict = "{'descr': '<i8', 'fortran_order': False, 'shape': (" +
                     std::to_string(ids.dim(0)) + ", " + std::to_string(ids.dim(1)) + "), }";
  while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  const char len[2] = {static_cast<char>(dict.size() & 0xff), static_cast<char>(dict.size() >> 8)};
  out.write(len, 2);
  out << dict;
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const int64_t v = ids.data<int32_t>()[i];
    out.write(reinterpret_cast<const char*>(&v), 8);
  }
}

TEST(DebugStepCli, Int64IdsAreReadLikeInt32) {
  Fixture f("gpt2-tiny");
  ASSERT_EQ(test::run_cli(f.args("--steps 1")).exit_code, 0);
  const double loss32 = read_json(f.dir.file("out/losses.json"))["loss"].get<double>();
  save_int64_npy(f.dir.file("x64.npy"), f.tokens);
  save_int64_npy(f.dir.file("y64.npy"), f.targets);
  const std::string args = "debug-step --load '" + f.dir.file("model.bin") + "' --tokens '" +
                           f.dir.file("x64.npy") + "' --targets '" + f.dir.file("y64.npy") +
                           "' --steps 1 --out-dir '" + f.dir.file("out64") + "'";
  const test::CommandResult r = test::run_cli(args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_json(f.dir.file("out64/losses.json"))["loss"].get<double>(), loss32);

  Tensor out_of_range = f.tokens.clone();
  out_of_range.data<int32_t>()[5] = 300;
  save_int64_npy(f.dir.file("bad64.npy"), out_of_range);
  expect_error("debug-step --load '" + f.dir.file("model.bin") + "' --tokens '" +
                   f.dir.file("bad64.npy") + "' --targets '" + f.dir.file("y64.npy") +
                   "' --out-dir '" + f.dir.file("o") + "'",
               "id 300 at index 5 is outside [0, 300)");
  // The output directory is checked before the step runs.
  expect_error(f.args("--steps 1")
                   .replace(f.args("--steps 1").find(f.dir.file("out")), f.dir.file("out").size(),
                            "/proc/flashtrain_no_dir"),
               "--out-dir /proc/flashtrain_no_dir");
}

TEST(DebugStepCli, CudaWithoutGpuIsAClearError) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present";
  Fixture f("llama3-tiny");
  expect_error(f.args("--device cuda"), "--device cuda");
}

}  // namespace
}  // namespace ft
