// Shared helpers of the attention tests: random problems (never zeros), segment ids with
// padding, and error measures that treat the -inf lse of rows that see no key exactly.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <ostream>
#include <string>

#include "attention/attention.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace ft::attention::testing {

struct Shapes {
  int64_t batch, seq_len, q_heads, kv_heads, head_dim;
};

struct Inputs {
  Problem problem;
  Tensor q, k, v, dout, segment_ids;
};

// A grid point of the accuracy tests (CPU and GPU).
struct Case {
  const char* name;
  Shapes shapes;
  bool causal = false;
  int64_t window = 0;
  bool segments = false;
  bool scattered = false;        // interleaved segment ids instead of packed runs
  bool segments_on_gpu = false;  // pass the ids as a GPU tensor (else the CPU one)

  Mask mask() const {
    Mask m;
    m.causal = causal;
    m.window = window;
    m.has_segments = segments;
    return m;
  }
};

inline void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

// Segment ids [B, S]: packed runs of random length with increasing ids, about 10% of positions
// padding (-1) scattered and a padded tail; with `scattered`, ids are drawn per position from
// {-1, 0, 1, 2} so segments interleave and every tile is cut by the mask.
inline Tensor make_segment_ids(int64_t batch, int64_t seq_len, Rng& rng, bool scattered = false) {
  Tensor seg = Tensor::empty({batch, seq_len}, DType::i32);
  int32_t* ids = seg.data<int32_t>();
  for (int64_t b = 0; b < batch; ++b) {
    int32_t id = 0;
    int64_t left_in_run = 1 + static_cast<int64_t>(rng.uniform() * (seq_len / 3 + 1));
    const int64_t tail = seq_len > 4 ? seq_len / 8 : 0;
    for (int64_t s = 0; s < seq_len; ++s) {
      int32_t& out = ids[b * seq_len + s];
      if (scattered) {
        out = static_cast<int32_t>(rng.uniform() * 4) - 1;
        continue;
      }
      if (left_in_run-- == 0) {
        ++id;
        left_in_run = static_cast<int64_t>(rng.uniform() * (seq_len / 3 + 1));
      }
      const bool pad = s >= seq_len - tail || rng.uniform() < 0.1;
      out = pad ? -1 : id;
    }
  }
  return seg;
}

inline Tensor random_tensor(const Shape& shape, DType dtype, Rng& rng) {
  Tensor t = Tensor::empty(shape, DType::f32);
  fill_normal(t, rng);
  return dtype == DType::f32 ? t : t.to(dtype);
}

inline Inputs make_inputs(const Shapes& s, const Mask& mask, DType dtype, uint64_t seed,
                          bool scattered_segments = false) {
  Rng rng(seed);
  Inputs in;
  in.q = random_tensor({s.batch, s.seq_len, s.q_heads, s.head_dim}, dtype, rng);
  in.k = random_tensor({s.batch, s.seq_len, s.kv_heads, s.head_dim}, dtype, rng);
  in.v = random_tensor({s.batch, s.seq_len, s.kv_heads, s.head_dim}, dtype, rng);
  in.dout = random_tensor({s.batch, s.seq_len, s.q_heads, s.head_dim}, dtype, rng);
  if (mask.has_segments) {
    in.segment_ids = make_segment_ids(s.batch, s.seq_len, rng, scattered_segments);
  }
  in.problem = make_problem(in.q, in.k, in.v, mask);
  return in;
}

// ||got - ref|| / ||ref||, except where the reference is exactly zero (causal + window 1: each
// row attends only itself, so the softmax passes no gradient to q or k): there the rms absolute
// error, meaningful because the inputs are unit normals.
inline double error_vs(const Tensor& got, const Tensor& ref) {
  const Tensor r = ref.to(DType::f64);
  double ref_norm = 0.0;
  for (int64_t i = 0; i < r.numel(); ++i) ref_norm += r.data<double>()[i] * r.data<double>()[i];
  if (ref_norm > 0.0) return relative_error(got, ref);
  return relative_error(got, ref) / std::sqrt(static_cast<double>(std::max<int64_t>(1, r.numel())));
}

// Relative error of lse over rows that see keys; rows where either side is -inf must be -inf on
// both sides (counted in `mismatched`).
struct LseError {
  double relative = 0.0;
  int64_t mismatched = 0;
};

inline LseError lse_error(const Tensor& got, const Tensor& ref) {
  const Tensor g = got.to(DType::f64), r = ref.to(DType::f64);
  LseError e;
  double num = 0, den = 0;
  for (int64_t i = 0; i < g.numel(); ++i) {
    const double a = g.data<double>()[i], b = r.data<double>()[i];
    if (std::isnan(a) || std::isnan(b) || std::isinf(a) || std::isinf(b)) {
      e.mismatched += (a == b && std::isinf(a) && a < 0) ? 0 : 1;
      continue;
    }
    num += (a - b) * (a - b);
    den += b * b;
  }
  e.relative = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return e;
}

// Largest |x| over the rows of a [B, S, H, D] tensor whose segment id is -1 (padding).
inline double max_abs_on_padding(const Tensor& t, const Tensor& segment_ids) {
  if (!segment_ids.defined()) return 0.0;
  const Tensor t64 = t.to(DType::f64);
  const int64_t B = t.dim(0), S = t.dim(1), row = t.dim(2) * t.dim(3);
  double m = 0.0;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t s = 0; s < S; ++s) {
      if (segment_ids.data<int32_t>()[b * S + s] >= 0) continue;
      const double* x = t64.data<double>() + (b * S + s) * row;
      for (int64_t i = 0; i < row; ++i) m = std::max(m, std::isnan(x[i]) ? 1e300 : std::abs(x[i]));
    }
  }
  return m;
}

// Expects `fn` to throw ft::Error whose message contains every one of `parts`.
inline void expect_error(const std::function<void()>& fn,
                         std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& part : parts) {
      EXPECT_NE(msg.find(part), std::string::npos)
          << "message '" << msg << "' lacks '" << part << "'";
    }
    return;
  }
  ADD_FAILURE() << "no ft::Error thrown";
}

}  // namespace ft::attention::testing
