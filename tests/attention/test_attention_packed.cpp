// q, k, v read in place from one fused QKV buffer (forward_packed / backward_packed) against the
// dense calls on the three parts split out: o, lse and every gradient bit for bit, for the
// reference, naive and flash, fp32 and bf16, every mask, GQA, odd lengths and head dims 32..256
// (on the CPU, which reads the buffer in place, and on a GPU, whose packed calls copy). Since
// the dense calls meet the accuracy grid (test_attention_accuracy.cpp, test_cuda_flash.cpp), so
// do the packed ones. Then the packed calls' errors.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>

#include "attention_test_util.h"
#include "cuda_test_util.h"

namespace ft::attention::testing {
namespace {

const Case kPackedCases[] = {
    {"s1_h1_d32_none", {1, 1, 1, 1, 32}},
    {"s7_h8g2_d32_window3_segments", {2, 7, 8, 4, 32}, false, 3, true},
    {"s64_h4g2_d128_window16", {1, 64, 4, 2, 128}, false, 16},
    {"s64_h1_d256_causal", {1, 64, 1, 1, 256}, true},
    {"s97_h4g4_d64_causal_segments", {2, 97, 4, 1, 64}, true, 0, true},
    {"s130_h4g1_d32_causal_scattered", {2, 130, 4, 4, 32}, true, 0, true, true},
};

// A fused buffer [B, S, (Hq + 2 Hkv) * D] of random values, and q, k, v split out of it.
struct Packed {
  Problem problem;
  Tensor qkv, q, k, v, dout, segment_ids;
};

Packed make_packed(const Case& c, DType dtype, uint64_t seed) {
  const Shapes& s = c.shapes;
  Rng rng(seed);
  Packed in;
  const int64_t D = s.head_dim, width = (s.q_heads + 2 * s.kv_heads) * D;
  in.qkv = random_tensor({s.batch, s.seq_len, width}, dtype, rng);
  in.q = Tensor::empty({s.batch, s.seq_len, s.q_heads, D}, dtype);
  in.k = Tensor::empty({s.batch, s.seq_len, s.kv_heads, D}, dtype);
  in.v = Tensor::empty({s.batch, s.seq_len, s.kv_heads, D}, dtype);
  const size_t elem = dtype_size(dtype);
  const auto* row = static_cast<const char*>(in.qkv.raw());
  for (int64_t r = 0; r < s.batch * s.seq_len; ++r, row += width * elem) {
    const int64_t q_bytes = s.q_heads * D * static_cast<int64_t>(elem);
    const int64_t kv_bytes = s.kv_heads * D * static_cast<int64_t>(elem);
    std::memcpy(static_cast<char*>(in.q.raw()) + r * q_bytes, row, q_bytes);
    std::memcpy(static_cast<char*>(in.k.raw()) + r * kv_bytes, row + q_bytes, kv_bytes);
    std::memcpy(static_cast<char*>(in.v.raw()) + r * kv_bytes, row + q_bytes + kv_bytes, kv_bytes);
  }
  in.dout = random_tensor({s.batch, s.seq_len, s.q_heads, D}, dtype, rng);
  if (c.segments) in.segment_ids = make_segment_ids(s.batch, s.seq_len, rng, c.scattered);
  in.problem = make_problem(in.q, in.k, in.v, c.mask());
  return in;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to(Device::cpu), y = b.to(Device::cpu);
  return x.shape() == y.shape() && x.dtype() == y.dtype() &&
         std::memcmp(x.raw(), y.raw(), x.nbytes()) == 0;
}

// dq, dk, dv of the dense call laid out like the fused buffer (what backward_packed must write).
Tensor merged(const Problem& p, const Gradients& g) {
  const Tensor dq = g.dq.to(Device::cpu), dk = g.dk.to(Device::cpu), dv = g.dv.to(Device::cpu);
  const int64_t D = p.head_dim, width = (p.q_heads + 2 * p.kv_heads) * D;
  Tensor out = Tensor::empty({p.batch, p.seq_len, width}, dq.dtype());
  const size_t elem = dtype_size(dq.dtype());
  const int64_t q_bytes = p.q_heads * D * static_cast<int64_t>(elem);
  const int64_t kv_bytes = p.kv_heads * D * static_cast<int64_t>(elem);
  for (int64_t r = 0; r < p.batch * p.seq_len; ++r) {
    char* row = static_cast<char*>(out.raw()) + r * width * static_cast<int64_t>(elem);
    std::memcpy(row, static_cast<const char*>(dq.raw()) + r * q_bytes, q_bytes);
    std::memcpy(row + q_bytes, static_cast<const char*>(dk.raw()) + r * kv_bytes, kv_bytes);
    std::memcpy(row + q_bytes + kv_bytes, static_cast<const char*>(dv.raw()) + r * kv_bytes,
                kv_bytes);
  }
  return out;
}

Tensor on(const Tensor& t, Device device) {
  return t.defined() && t.device() != device ? t.to(device) : t;
}

// The packed calls against the dense ones on `device`, bit for bit.
void expect_packed_equals_dense(Impl impl, const Packed& in, Device device,
                                const std::string& what) {
  const Problem& p = in.problem;
  const Tensor qkv = on(in.qkv, device), q = on(in.q, device), k = on(in.k, device),
               v = on(in.v, device), dout = on(in.dout, device), seg = in.segment_ids;
  const ForwardOutput dense = forward(impl, p, q, k, v, seg);
  const ForwardOutput packed = forward_packed(impl, p, qkv, seg);
  EXPECT_TRUE(same_bits(packed.o, dense.o)) << what << ": o";
  EXPECT_TRUE(same_bits(packed.lse, dense.lse)) << what << ": lse";
  const Gradients g = backward(impl, p, q, k, v, dense, dout, seg);
  const DType grad_dtype = impl == Impl::reference ? DType::f64 : p.dtype;
  Tensor dqkv = Tensor::empty(qkv.shape(), grad_dtype, device);
  dqkv.fill(std::numeric_limits<double>::quiet_NaN());  // every element must be written
  backward_packed(impl, p, qkv, packed, dout, dqkv, seg);
  EXPECT_TRUE(all_finite(dqkv)) << what << ": dqkv has unwritten elements";
  EXPECT_TRUE(same_bits(dqkv, merged(p, g)))
      << what << ": dqkv differs from the dense gradients by up to "
      << max_abs_diff(dqkv, merged(p, g));
}

class PackedAttention : public ::testing::TestWithParam<Case> {};

TEST_P(PackedAttention, CpuGivesTheDenseCallsBitsForEveryImplementation) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Packed in = make_packed(GetParam(), dtype, 4321);
    for (Impl impl : {Impl::reference, Impl::naive, Impl::flash}) {
      expect_packed_equals_dense(impl, in, Device::cpu,
                                 std::string(impl_name(impl)) + " " + dtype_name(dtype));
    }
  }
  EXPECT_TRUE(reads_packed_in_place(Impl::flash, Device::cpu));
}

TEST_P(PackedAttention, GpuGivesTheDenseCallsBits) {
  const std::string why = gpu_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Packed in = make_packed(GetParam(), dtype, 8765);
    for (Impl impl : {Impl::naive, Impl::flash}) {
      expect_packed_equals_dense(impl, in, Device::cuda,
                                 std::string(impl_name(impl)) + " " + dtype_name(dtype));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, PackedAttention, ::testing::ValuesIn(kPackedCases),
                         [](const ::testing::TestParamInfo<Case>& param_info) {
                           return std::string(param_info.param.name);
                         });

TEST(PackedAttentionErrors, NameTheBadTensorAndWhatWasExpected) {
  const Packed in = make_packed(kPackedCases[1], DType::f32, 1);
  const Problem& p = in.problem;
  const ForwardOutput fwd = forward_packed(Impl::flash, p, in.qkv, in.segment_ids);
  // q alone is not a fused buffer.
  expect_error([&] { forward_packed(Impl::flash, p, in.q, in.segment_ids); },
               {"qkv has shape [2, 7, 8, 32], expected [2, 7, 512]"});
  expect_error([&] { forward_packed(Impl::flash, p, in.qkv.to(DType::bf16), in.segment_ids); },
               {"qkv has dtype bf16, expected fp32"});
  Tensor dqkv = Tensor::empty(in.qkv.shape(), DType::bf16);
  expect_error([&] { backward_packed(Impl::flash, p, in.qkv, fwd, in.dout, dqkv, in.segment_ids); },
               {"dqkv has dtype bf16, expected fp32"});
  Tensor alias = in.qkv;
  expect_error(
      [&] { backward_packed(Impl::flash, p, in.qkv, fwd, in.dout, alias, in.segment_ids); },
      {"dqkv must not alias qkv"});
  Tensor f32 = Tensor::empty(in.qkv.shape(), DType::f32);
  expect_error([&] { backward_packed(Impl::reference, p, in.qkv, fwd, in.dout, f32, {}); },
               {"segment ids"});
}

}  // namespace
}  // namespace ft::attention::testing
