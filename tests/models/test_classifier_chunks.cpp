// The classifier and loss in chunks of rows (Transformer::set_classifier_chunk, forward_train):
// forward_train() forms the same losses and gradients as forward() + backward() bit for bit
// under every chunking (the same ops on the same rows); other chunkings agree with the whole
// batch within fp32 rounding (the head's gradient summed in another order) over 50 training
// steps; a chunked forward() keeps no logits; the default chunk sizes and the errors.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "models/transformer.h"
#include "small_models.h"
#include "tensor_test_util.h"

namespace ft::models {
namespace {

using test::same_bits;
using testing::adamw_step;
using testing::Trace;

constexpr int64_t kBatch = 2, kSeq = 16, kRows = kBatch * kSeq;
// The whole batch, chunks that divide it, one that leaves a short last chunk, single rows.
constexpr int64_t kChunks[] = {0, 16, 7, 1};

ModelConfig small(const std::string& preset_name) {
  return testing::small_model(preset_name, 32, 37, kSeq);
}

Tensor random_tokens(int64_t vocab, Rng& rng) {
  return testing::random_tokens(kBatch, kSeq, vocab, rng);
}

// A learning rate at which the runs stay stable: at 1e-3, llama3-tiny's memorising run has its
// gradients grow tenfold from step 33 on, which amplifies rounding differences to ~4e-6.
constexpr double kLr = 3e-4;

// `steps` training steps of two micro-batches each (the second accumulates onto the first's
// gradients, the head's included); fused: forward_train() instead of forward(). Fresh random
// batches every step, or (repeat) the same two every step, which the model learns.
Trace train_steps(const ModelConfig& config, DType dtype, int64_t chunk, bool fused, int64_t steps,
                  bool repeat = false) {
  Transformer model(config, dtype, AttentionSettings{attention::Impl::flash});
  model.set_classifier_chunk(chunk);
  model.init_weights(17);
  Rng rng(29);
  Trace trace;
  for (int64_t step = 1; step <= steps; ++step) {
    model.zero_grad();
    if (repeat) rng = Rng(29);
    double loss = 0.0;
    for (int micro = 0; micro < 2; ++micro) {
      const Tensor x = random_tokens(config.vocab_size, rng);
      const Tensor y = random_tokens(config.vocab_size, rng);
      loss += fused ? model.forward_train(x, y, 0.5) : model.forward(x, y);
      model.backward(0.5);
    }
    trace.losses.push_back(loss);
    trace.grads.push_back(model.flat_grads().clone());
    adamw_step(model, step, kLr);
  }
  return trace;
}

class ClassifierChunks : public ::testing::TestWithParam<std::string> {};

TEST_P(ClassifierChunks, ForwardTrainGivesForwardAndBackwardsBitsUnderEveryChunking) {
  const ModelConfig config = small(GetParam());
  for (const char* dtype_name : {"fp32", "bf16"}) {
    const DType dtype = parse_dtype(dtype_name);
    for (int64_t chunk : kChunks) {
      const Trace plain = train_steps(config, dtype, chunk, false, 3);
      const Trace fused = train_steps(config, dtype, chunk, true, 3);
      const std::string what = GetParam() + " " + dtype_name + " chunk " + std::to_string(chunk);
      EXPECT_EQ(fused.losses, plain.losses) << what;
      for (size_t s = 0; s < plain.grads.size(); ++s) {
        EXPECT_TRUE(same_bits(fused.grads[s], plain.grads[s]))
            << what << " step " << s + 1 << ": gradients differ by up to "
            << max_abs_diff(fused.grads[s], plain.grads[s]);
      }
    }
  }
}

TEST_P(ClassifierChunks, TrainTheLossesOfTheWholeBatchWithin1e6Over50Fp32Steps) {
  const ModelConfig config = small(GetParam());
  const Trace whole = train_steps(config, DType::f32, 0, true, 50, true);
  // The run learns: otherwise agreeing losses would say little.
  ASSERT_LT(whole.losses.back(), whole.losses.front() - 0.1);
  for (int64_t chunk : {int64_t{16}, int64_t{7}}) {
    const Trace chunked = train_steps(config, DType::f32, chunk, true, 50, true);
    for (size_t s = 0; s < whole.losses.size(); ++s) {
      EXPECT_NEAR(chunked.losses[s], whole.losses[s], 1e-6)
          << GetParam() << " chunk " << chunk << " step " << s + 1;
    }
    // The gradients of the first step (same weights): the head's summed in another order.
    EXPECT_LT(max_abs_diff(chunked.grads.front(), whole.grads.front()), 1e-6)
        << GetParam() << " chunk " << chunk;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ClassifierChunks, ::testing::Values("gpt2-tiny", "llama3-tiny"));

TEST(ClassifierChunk, AChunkedForwardKeepsNoLogitsAndOneChunkKeepsThem) {
  const ModelConfig config = small("gpt2-tiny");
  Transformer model(config, DType::f32, {});
  model.init_weights(3);
  Rng rng(5);
  const Tensor x = random_tokens(config.vocab_size, rng), y = random_tokens(config.vocab_size, rng);
  const int64_t row_bytes = config.padded_vocab_size * 4;

  model.forward(x, y);
  ASSERT_TRUE(model.logits().defined());
  EXPECT_EQ(model.logits().shape(), (Shape{kRows, config.padded_vocab_size}));
  EXPECT_EQ(model.logits_bytes(), kRows * row_bytes);
  const Tensor whole = model.logits().clone();
  model.backward(1.0);

  model.set_classifier_chunk(7);
  const double loss = model.forward(x, y);
  EXPECT_FALSE(model.logits().defined());
  EXPECT_EQ(model.logits_bytes(), 7 * row_bytes);
  model.backward(1.0);
  model.forward_train(x, y, 1.0);
  EXPECT_FALSE(model.logits().defined());
  model.backward(1.0);

  // forward_logits() still gives the whole batch's logits, the ones forward() kept.
  model.forward_logits(x);
  EXPECT_EQ(max_abs_diff(model.logits(), whole), 0.0);
  EXPECT_GT(loss, 0.0);
}

TEST(ClassifierChunk, ABackwardWithAnotherScaleThanForwardTrainsIsRefused) {
  const ModelConfig config = small("llama3-tiny");
  Transformer model(config, DType::f32, {});
  model.init_weights(3);
  model.set_classifier_chunk(5);
  Rng rng(5);
  const Tensor x = random_tokens(config.vocab_size, rng), y = random_tokens(config.vocab_size, rng);
  model.forward_train(x, y, 0.25);
  try {
    model.backward(1.0);
    FAIL() << "backward with another scale was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("forward_train(..., 0.25)"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(model.set_classifier_chunk(-1), Error);
}

TEST(ClassifierChunk, AutoChunksAreEqualTileMultiplesWithinTheBudget) {
  // kClassifierChunkBytes (512 MiB). GPT-2 124M, bf16, 16 x 1024 rows: 100608 bytes a row, at
  // most 5336 rows; 4 chunks of 4096.
  const ModelConfig gpt2 = preset("gpt2");
  EXPECT_EQ(auto_classifier_chunk(gpt2, DType::bf16, 16 * 1024), 4096);
  // llama3's 128256-row vocabulary, 4 x 2048: at most 2093 rows; 4 chunks of 2048.
  const ModelConfig llama = preset("llama3-1b");
  EXPECT_EQ(auto_classifier_chunk(llama, DType::bf16, 4 * 2048), 2048);
  for (const ModelConfig& config : {gpt2, llama}) {
    for (DType dtype : {DType::bf16, DType::f32}) {
      for (int64_t rows : {int64_t{1}, int64_t{1000}, int64_t{4096}, int64_t{65536}}) {
        const int64_t chunk = auto_classifier_chunk(config, dtype, rows);
        const int64_t row_bytes =
            config.padded_vocab_size * static_cast<int64_t>(dtype_size(dtype));
        if (rows * row_bytes <= kClassifierChunkBytes) {
          EXPECT_EQ(chunk, 0) << config.name << " " << rows;
          continue;
        }
        EXPECT_EQ(chunk % 128, 0) << config.name << " " << rows;
        EXPECT_LE(chunk * row_bytes, kClassifierChunkBytes) << config.name << " " << rows;
        EXPECT_LT(chunk, rows);
      }
    }
  }
  EXPECT_EQ(auto_classifier_chunk(small("gpt2-tiny"), DType::f32, kRows), 0);
}

}  // namespace
}  // namespace ft::models
