// Problem description: validation, mask naming and the attended-pair count that the benchmark
// and the sweep use to turn times into FLOP rates.
#include <cmath>
#include <sstream>

#include "attention/attention.h"
#include "attention/mask_bounds.h"

namespace ft::attention {

const char* impl_name(Impl impl) {
  switch (impl) {
    case Impl::reference:
      return "reference";
    case Impl::naive:
      return "naive";
    case Impl::flash:
      return "flash";
  }
  return "?";
}

Impl parse_impl(const std::string& s) {
  if (s == "reference") return Impl::reference;
  if (s == "naive") return Impl::naive;
  if (s == "flash") return Impl::flash;
  throw Error(str("unknown attention implementation '", s, "' (allowed: reference, naive, flash)"));
}

std::string Mask::describe() const {
  std::string out;
  auto add = [&](const std::string& part) { out += (out.empty() ? "" : "+") + part; };
  if (causal) add("causal");
  if (window > 0) add(str("window=", window));
  if (has_segments) add("segments");
  return out.empty() ? "none" : out;
}

double Problem::effective_scale() const {
  return scale != 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

void Problem::validate() const {
  FT_CHECK(batch > 0, "attention: batch must be positive, got ", batch);
  FT_CHECK(seq_len > 0, "attention: sequence length must be positive, got ", seq_len);
  FT_CHECK(q_heads > 0, "attention: query heads must be positive, got ", q_heads);
  FT_CHECK(kv_heads > 0, "attention: kv heads must be positive, got ", kv_heads);
  FT_CHECK(q_heads % kv_heads == 0, "attention: query heads (", q_heads,
           ") must be a multiple of kv heads (", kv_heads, ")");
  FT_CHECK(head_dim > 0 && head_dim <= kMaxHeadDim && head_dim % 8 == 0, "attention: head dim ",
           head_dim, " is not supported (allowed: a multiple of 8 up to ", kMaxHeadDim, ")");
  FT_CHECK(mask.window >= 0, "attention: window must be >= 0 (0 = no window), got ", mask.window);
  FT_CHECK(std::isfinite(scale), "attention: scale must be finite, got ", scale);
  FT_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f64, "attention: dtype ",
           dtype_name(dtype), " is not supported (allowed: fp32, bf16, fp64)");
}

int64_t Problem::attended_pairs(const Tensor& segment_ids) const {
  if (mask.has_segments) {
    FT_CHECK(segment_ids.defined() && segment_ids.dtype() == DType::i32 &&
                 segment_ids.numel() == batch * seq_len,
             "attended_pairs: the mask has segments, so int32 segment ids [", batch, ", ", seq_len,
             "] must be given");
  }
  int64_t pairs = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int32_t* row = mask.has_segments ? segment_ids.data<int32_t>() + b * seq_len : nullptr;
    for (int64_t i = 0; i < seq_len; ++i) {
      const PositionRange keys = key_range(mask, i, i + 1, seq_len);
      if (!mask.has_segments) {
        pairs += keys.size();
        continue;
      }
      for (int64_t j = keys.begin; j < keys.end; ++j) pairs += allowed(mask, row, i, j) ? 1 : 0;
    }
  }
  return pairs * q_heads;
}

std::string Problem::describe() const {
  std::ostringstream os;
  os << "B=" << batch << " S=" << seq_len << " Hq=" << q_heads << " Hkv=" << kv_heads
     << " D=" << head_dim << " " << dtype_name(dtype) << " scale=" << effective_scale()
     << " mask=" << mask.describe();
  return os.str();
}

Problem make_problem(const Tensor& q, const Tensor& k, const Tensor& v, const Mask& mask,
                     double scale) {
  FT_CHECK(q.defined() && k.defined() && v.defined(), "attention: q, k and v must all be given");
  FT_CHECK(q.ndim() == 4, "attention: q must be [B, S, Hq, D], got ", shape_str(q.shape()));
  FT_CHECK(k.ndim() == 4, "attention: k must be [B, S, Hkv, D], got ", shape_str(k.shape()));
  FT_CHECK(k.shape() == v.shape(), "attention: k ", shape_str(k.shape()), " and v ",
           shape_str(v.shape()), " must have the same shape");
  FT_CHECK(q.dim(0) == k.dim(0) && q.dim(1) == k.dim(1) && q.dim(3) == k.dim(3), "attention: q ",
           shape_str(q.shape()), " and k ", shape_str(k.shape()),
           " must agree in batch, sequence length and head dim");
  Problem p;
  p.batch = q.dim(0);
  p.seq_len = q.dim(1);
  p.q_heads = q.dim(2);
  p.kv_heads = k.dim(2);
  p.head_dim = q.dim(3);
  p.dtype = q.dtype();
  p.scale = scale;
  p.mask = mask;
  p.validate();
  return p;
}

}  // namespace ft::attention
