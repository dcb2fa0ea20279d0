// decode_attention (one new query per head over a KV cache) is the attention library's fp64
// reference at the query's row, for GQA, windows and a first key > 0, in fp64, fp32 and bf16;
// rope_forward with a position offset rotates as the full sequence's rows at those positions.
#include <gtest/gtest.h>

#include "attention/attention.h"
#include "grad_check.h"
#include "nn/layers.h"

namespace ft::nn {
namespace {

using namespace ft::nn::testing;

struct Case {
  int64_t S, Hq, Hkv, D, window, first;  // first: the document's first key (0: none)
};

// The reference's output row for query S - 1 over keys [first, S - 1] (the window and document
// limits as the model applies them), against decode_attention over the same keys as a cache.
void check(const Case& c, DType dtype, double tol) {
  SCOPED_TRACE(::testing::Message()
               << "S " << c.S << " Hq " << c.Hq << " Hkv " << c.Hkv << " D " << c.D << " window "
               << c.window << " first " << c.first << " " << dtype_name(dtype));
  const Tensor q = randn({1, c.S, c.Hq, c.D}, 1).to(dtype).to(DType::f64);
  const Tensor k = randn({1, c.S, c.Hkv, c.D}, 2).to(dtype).to(DType::f64);
  const Tensor v = randn({1, c.S, c.Hkv, c.D}, 3).to(dtype).to(DType::f64);
  attention::Mask mask;
  mask.causal = true;
  mask.window = c.window;
  Tensor segments;
  if (c.first > 0) {
    mask.has_segments = true;
    segments = Tensor::empty({1, c.S}, DType::i32);
    for (int64_t t = 0; t < c.S; ++t) segments.data<int32_t>()[t] = t < c.first ? 0 : 1;
  }
  const attention::Problem p = attention::make_problem(q, k, v, mask);
  const attention::ForwardOutput ref =
      attention::forward(attention::Impl::reference, p, q, k, v, segments);
  const Tensor want = ref.o.view({c.S, c.Hq * c.D}).slice(c.S - 1, c.S).view({c.Hq, c.D});

  const Tensor q_last = q.view({c.S, c.Hq * c.D}).slice(c.S - 1, c.S).view({c.Hq, c.D}).to(dtype);
  // The cache holds more positions than are filled: only keys up to S - 1 may be read.
  Tensor k_cache = poisoned({c.S + 5, c.Hkv, c.D}, dtype),
         v_cache = poisoned(k_cache.shape(), dtype);
  k_cache.slice(0, c.S).copy_from(k.to(dtype));
  v_cache.slice(0, c.S).copy_from(v.to(dtype));
  int64_t first = c.first;
  if (c.window > 0) first = std::max(first, c.S - c.window);
  Tensor out = poisoned({c.Hq, c.D}, dtype);
  decode_attention(out, q_last, k_cache, v_cache, first, c.S - 1, p.effective_scale());
  EXPECT_EQ(out.dtype(), dtype);
  expect_close(out.to(DType::f64), want, tol, "decode_attention vs reference");
}

const Case kCases[] = {{1, 2, 2, 8, 0, 0},       {17, 4, 4, 16, 0, 0},  {33, 8, 2, 32, 0, 0},
                       {64, 4, 1, 64, 8, 0},     {50, 6, 3, 24, 0, 20}, {300, 4, 2, 64, 64, 100},
                       {300, 4, 2, 64, 250, 100}};

TEST(DecodeAttention, IsTheReferenceAtTheQueryRow) {
  for (const Case& c : kCases) {
    check(c, DType::f64, 1e-12);
    check(c, DType::f32, 1e-5);
    check(c, DType::bf16, 1e-2);
  }
}

TEST(DecodeAttention, BadArgumentsAreErrors) {
  const Tensor q = randn({4, 8}, 1, DType::f32);
  const Tensor cache = randn({10, 2, 8}, 2, DType::f32);
  Tensor out = poisoned({4, 8}, DType::f32);
  expect_error([&] { decode_attention(out, q, cache, cache, 0, 10, 0.5); }, "within the cache");
  expect_error([&] { decode_attention(out, q, cache, cache, 5, 4, 0.5); }, "keys [5, 4]");
  const Tensor odd = randn({10, 3, 8}, 2, DType::f32);
  expect_error([&] { decode_attention(out, q, odd, odd, 0, 3, 0.5); }, "multiple of Hkv");
  const Tensor wide = randn({4, 16}, 1, DType::f32);
  expect_error([&] { decode_attention(out, wide, cache, cache, 0, 3, 0.5); }, "k_cache");
}

// Rows offset.. of a rotation with an offset are the full sequence's rows at those positions.
TEST(Rope, OffsetRotatesAsTheFullSequence) {
  const int64_t T = 12, H = 3, D = 8, offset = 7;
  const RopeTable table = make_rope_table(32, D, 500000.0, false);
  const Tensor full = randn({1, T, H, D}, 5);
  Tensor rotated = poisoned(full.shape());
  rope_forward(rotated, full, table);
  const Tensor tail = full.view({T, H * D}).slice(offset, T).clone().view({1, T - offset, H, D});
  Tensor tail_rotated = poisoned(tail.shape());
  rope_forward(tail_rotated, tail, table, offset);
  const Tensor want = rotated.view({T, H * D}).slice(offset, T);
  EXPECT_EQ(max_abs_diff(tail_rotated.view({T - offset, H * D}), want), 0.0);
  expect_error([&] { rope_forward(tail_rotated, tail, table, 30); }, "sequence length");
  expect_error([&] { rope_forward(tail_rotated, tail, table, 32); }, "position offset 32");
}

}  // namespace
}  // namespace ft::nn
