// q, k, v read in place from one fused QKV buffer (forward_packed / backward_packed) against the
// dense calls on the three parts split out: o, lse and every gradient bit for bit, for the
// reference, naive and flash, fp32 and bf16, every mask, GQA, odd lengths and head dims 32..256
// (on the CPU, which reads the buffer in place, and on a GPU, where the tma kernels read it in
// place and the others copy; every tma plan on longer problems). Since the dense calls meet the
// accuracy grid (test_attention_accuracy.cpp, test_cuda_flash.cpp), so do the packed ones. Then
// the packed calls' errors.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>

#include "attention_test_util.h"
#include "cuda_test_util.h"
#include "tensor_test_util.h"

namespace ft::attention::testing {
namespace {

using test::same_bits;

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

// Whether the GPU's flash kernels refuse the backward of `p` (a bf16 head dim with a forward
// kernel and no backward one on this GPU's family).
bool backward_refused(Impl impl, const Problem& p, Device device) {
  if (device != Device::cuda || impl != Impl::flash) return false;
  const DeviceLimits& limits = DeviceLimits::current();
  return !can_implement(default_config(limits, p), p, limits, KernelDirection::backward).empty();
}

// The packed calls against the dense ones on `device`, bit for bit (the backward where it runs).
void expect_packed_equals_dense(Impl impl, const Packed& in, Device device,
                                const std::string& what) {
  const Problem& p = in.problem;
  const Tensor qkv = on(in.qkv, device), q = on(in.q, device), k = on(in.k, device),
               v = on(in.v, device), dout = on(in.dout, device), seg = in.segment_ids;
  const ForwardOutput dense = forward(impl, p, q, k, v, seg);
  const ForwardOutput packed = forward_packed(impl, p, qkv, seg);
  EXPECT_TRUE(same_bits(packed.o, dense.o)) << what << ": o";
  EXPECT_TRUE(same_bits(packed.lse, dense.lse)) << what << ": lse";
  if (backward_refused(impl, p, device)) {  // both calls refuse it, with the same reason
    Tensor dqkv = Tensor::empty(qkv.shape(), p.dtype, device);
    expect_error([&] { backward(impl, p, q, k, v, dense, dout, seg); }, {"cannot run", "head dim"});
    expect_error([&] { backward_packed(impl, p, qkv, packed, dout, dqkv, seg); },
                 {"cannot run", "head dim"});
    return;
  }
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

// Longer, grouped and masked problems at the tma kernels' head dims: several key and query
// tiles, a ragged last tile, GQA, every mask class.
const Case kTmaPackedCases[] = {
    {"s513_h8g4_d64_causal", {2, 513, 8, 2, 64}, true},
    {"s1000_h4g2_d64_window100_segments", {1, 1000, 4, 2, 64}, false, 100, true},
    {"s700_h4g1_d128_none", {1, 700, 4, 4, 128}, false},
    {"s600_h6g3_d128_causal_scattered", {1, 600, 6, 2, 128}, true, 0, true, true},
    {"s300_h2g2_d256_causal_segments", {2, 300, 2, 1, 256}, true, 0, true},
};

// The tma kernels read q, k, v inside the fused buffer through tensor maps with its row stride,
// and the tma backward writes dq, dk, dv into dqkv: for every compiled tma forward plan and tma
// backward tile, the packed calls give the dense calls' bits (the backward in deterministic
// mode, whose dQ sums have a fixed order, so that two runs may be compared bit for bit).
TEST(PackedAttention, GpuTmaKernelsReadAndWriteTheFusedBuffersInPlace) {
  const std::string why = gpu_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  const DeviceLimits& device = DeviceLimits::current();
  int forward_checked = 0, backward_checked = 0;
  for (const Case& c : kTmaPackedCases) {
    Packed in = make_packed(c, DType::bf16, 2468);
    const Tensor qkv = in.qkv.to(Device::cuda), q = in.q.to(Device::cuda),
                 k = in.k.to(Device::cuda), v = in.v.to(Device::cuda),
                 dout = in.dout.to(Device::cuda);
    const Tensor& seg = in.segment_ids;
    for (const KernelConfig& config : configs_under_test(in.problem, KernelDirection::forward)) {
      if (config.forward_path != ForwardPath::tma) continue;
      const std::string what = std::string(c.name) + " " + config.forward_str();
      const ForwardOutput dense = forward(Impl::flash, in.problem, q, k, v, seg, &config);
      const ForwardOutput packed = forward_packed(Impl::flash, in.problem, qkv, seg, &config);
      EXPECT_TRUE(same_bits(packed.o, dense.o)) << what << ": o";
      EXPECT_TRUE(same_bits(packed.lse, dense.lse)) << what << ": lse";
      ++forward_checked;
    }
    Problem p = in.problem;
    p.deterministic = true;
    for (const KernelConfig& config : configs_under_test(p)) {
      if (config.backward_path != BackwardPath::tma) continue;
      const std::string what = std::string(c.name) + " " + config.str();
      const ForwardOutput fwd = forward(Impl::flash, p, q, k, v, seg, &config);
      const Tensor expected = merged(p, backward(Impl::flash, p, q, k, v, fwd, dout, seg, &config));
      Tensor dqkv = Tensor::empty(qkv.shape(), DType::bf16, Device::cuda);
      dqkv.fill(std::numeric_limits<double>::quiet_NaN());  // every element must be written
      backward_packed(Impl::flash, p, qkv, fwd, dout, dqkv, seg, &config);
      EXPECT_TRUE(all_finite(dqkv)) << what << ": dqkv has unwritten elements";
      EXPECT_TRUE(same_bits(dqkv, expected))
          << what << ": dqkv differs from the dense gradients by up to "
          << max_abs_diff(dqkv, expected);
      ++backward_checked;
    }
  }
  if (device.arch != "sm90") GTEST_SKIP() << "no tma kernels run on " << device.arch;
  EXPECT_GT(forward_checked, 0);
  EXPECT_GT(backward_checked, 0);
  EXPECT_TRUE(reads_packed_in_place(Impl::flash, Device::cuda));
  EXPECT_FALSE(reads_packed_in_place(Impl::naive, Device::cuda));
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
