#include "sweep/check_data.h"

#include <filesystem>

#include "core/npy.h"
#include "core/rng.h"

namespace ft::sweep {
namespace {

Tensor random_bf16(const Shape& shape, Rng& rng) {
  Tensor t = Tensor::empty(shape, DType::f32);
  fill_normal(t, rng);
  return t.to(DType::bf16);
}

std::string path_of(const std::string& dir, const SweepMask& mask, const char* name) {
  return (std::filesystem::path(dir) / (mask.key + "_" + name + ".npy")).string();
}

Tensor load_checked(const std::string& path, const Shape& shape, DType dtype) {
  Tensor t = npy::load(path);
  FT_CHECK(t.shape() == shape && t.dtype() == dtype, "sweep check data ", path, " holds ",
           shape_str(t.shape()), " ", dtype_name(t.dtype()), ", expected ", shape_str(shape), " ",
           dtype_name(dtype), " (the parent and the worker disagree on the shape)");
  return t;
}

}  // namespace

CheckData make_check_data(const SweepShape& shape, const SweepMask& mask, uint64_t seed) {
  CheckData d;
  d.problem = check_problem(shape, mask);
  const attention::Problem& p = d.problem;
  Rng rng(seed);
  d.q = random_bf16({p.batch, p.seq_len, p.q_heads, p.head_dim}, rng);
  d.k = random_bf16({p.batch, p.seq_len, p.kv_heads, p.head_dim}, rng);
  d.v = random_bf16({p.batch, p.seq_len, p.kv_heads, p.head_dim}, rng);
  d.dout = random_bf16({p.batch, p.seq_len, p.q_heads, p.head_dim}, rng);
  if (p.mask.has_segments) d.segment_ids = check_segment_ids(mask.documents);
  using attention::Impl;
  const attention::ForwardOutput fwd =
      attention::forward(Impl::reference, p, d.q, d.k, d.v, d.segment_ids);
  const attention::Gradients grads =
      attention::backward(Impl::reference, p, d.q, d.k, d.v, fwd, d.dout, d.segment_ids);
  d.out = fwd.o;
  d.dq = grads.dq;
  d.dk = grads.dk;
  d.dv = grads.dv;
  return d;
}

void save_check_data(const std::string& dir, const SweepMask& mask, const CheckData& d) {
  std::filesystem::create_directories(dir);
  npy::save(path_of(dir, mask, "q"), d.q);
  npy::save(path_of(dir, mask, "k"), d.k);
  npy::save(path_of(dir, mask, "v"), d.v);
  npy::save(path_of(dir, mask, "dout"), d.dout);
  if (d.segment_ids.defined()) npy::save(path_of(dir, mask, "segment_ids"), d.segment_ids);
  npy::save(path_of(dir, mask, "ref_out"), d.out);
  npy::save(path_of(dir, mask, "ref_dq"), d.dq);
  npy::save(path_of(dir, mask, "ref_dk"), d.dk);
  npy::save(path_of(dir, mask, "ref_dv"), d.dv);
}

CheckData load_check_data(const std::string& dir, const SweepShape& shape, const SweepMask& mask) {
  CheckData d;
  d.problem = check_problem(shape, mask);
  const attention::Problem& p = d.problem;
  const Shape q_shape{p.batch, p.seq_len, p.q_heads, p.head_dim};
  const Shape kv_shape{p.batch, p.seq_len, p.kv_heads, p.head_dim};
  d.q = load_checked(path_of(dir, mask, "q"), q_shape, DType::bf16);
  d.k = load_checked(path_of(dir, mask, "k"), kv_shape, DType::bf16);
  d.v = load_checked(path_of(dir, mask, "v"), kv_shape, DType::bf16);
  d.dout = load_checked(path_of(dir, mask, "dout"), q_shape, DType::bf16);
  if (p.mask.has_segments) {
    d.segment_ids =
        load_checked(path_of(dir, mask, "segment_ids"), {p.batch, p.seq_len}, DType::i32);
  }
  d.out = load_checked(path_of(dir, mask, "ref_out"), q_shape, DType::f64);
  d.dq = load_checked(path_of(dir, mask, "ref_dq"), q_shape, DType::f64);
  d.dk = load_checked(path_of(dir, mask, "ref_dk"), kv_shape, DType::f64);
  d.dv = load_checked(path_of(dir, mask, "ref_dv"), kv_shape, DType::f64);
  return d;
}

}  // namespace ft::sweep
