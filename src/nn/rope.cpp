// Rotary position embedding, CPU, on x [B, T, H, D] with interleaved pairs (x[2i], x[2i+1])
// (Meta's and llm.c's layout). Position t rotates pair i by t * freq_i, freq_i = theta^(-2i/D),
// optionally rescaled as in Llama 3.1. The cos/sin table is fp64 so fp64 gradient checks see
// no table rounding; the kernels convert it to the accumulation dtype. Backward is the inverse
// rotation (the map is orthogonal). Memory bound: one read and one write per element.
// CUDA tensors use the table's fp32 GPU copy (make_rope_table(..., Device::cuda)).
#include <cmath>
#include <numbers>

#include "nn/checks.h"
#include "nn/layers.h"
#ifdef FLASHTRAIN_WITH_CUDA
#include "nn/cuda/cuda_layers.h"
#endif

namespace ft::nn {
namespace {

// Llama 3.1's frequency scaling (its reference code's constants).
constexpr double kLlamaFactor = 8.0;
constexpr double kLlamaLowFreqFactor = 1.0;
constexpr double kLlamaHighFreqFactor = 4.0;
constexpr double kLlamaOldContext = 8192.0;

// Wavelengths shorter than old_context / high_factor keep their frequency, longer than
// old_context / low_factor are slowed by `factor`, and the band between interpolates smoothly.
double llama31_scale_freq(double freq) {
  const double wavelen = 2.0 * std::numbers::pi / freq;
  const double high_freq_wavelen = kLlamaOldContext / kLlamaHighFreqFactor;
  const double low_freq_wavelen = kLlamaOldContext / kLlamaLowFreqFactor;
  if (wavelen < high_freq_wavelen) return freq;
  if (wavelen > low_freq_wavelen) return freq / kLlamaFactor;
  const double smooth = (kLlamaOldContext / wavelen - kLlamaLowFreqFactor) /
                        (kLlamaHighFreqFactor - kLlamaLowFreqFactor);
  return (1.0 - smooth) * freq / kLlamaFactor + smooth * freq;
}

void check_table(const RopeTable& table, Device device, const char* fn) {
  const Shape want{table.max_seq_len, table.head_dim / 2};
  FT_CHECK(table.cos.defined() && table.sin.defined(), fn,
           ": the RoPE table is empty (build it with make_rope_table)");
  FT_CHECK(table.cos.dtype() == DType::f64 && table.sin.dtype() == DType::f64, fn,
           ": the RoPE table must be fp64");
  FT_CHECK(table.cos.shape() == want && table.sin.shape() == want, fn, ": RoPE table cos ",
           shape_str(table.cos.shape()), " / sin ", shape_str(table.sin.shape()), " must be ",
           shape_str(want));
  if (device != Device::cuda) return;
  FT_CHECK(table.cos_device.defined() && table.sin_device.defined(), fn,
           ": the RoPE table has no GPU copy for CUDA tensors (build it with make_rope_table(..., "
           "Device::cuda))");
  for (const Tensor* t : {&table.cos_device, &table.sin_device}) {
    FT_CHECK(t->device() == Device::cuda && t->dtype() == DType::f32 && t->shape() == want, fn,
             ": the RoPE table's GPU copy must be fp32 ", shape_str(want), " on cuda, got ",
             dtype_name(t->dtype()), " ", shape_str(t->shape()), " on ", device_name(t->device()));
  }
}

// x [B, T, H, D] against the table: D == head_dim, T <= max_seq_len.
void check_rope_input(const Tensor& x, const RopeTable& table, const char* fn, const char* name) {
  detail::call_device(x, fn, name);
  detail::check_float(x, fn, name);
  FT_CHECK(x.ndim() == 4, fn, ": ", name, " must be [B, T, H, D], got ", shape_str(x.shape()));
  FT_CHECK(x.dim(3) == table.head_dim, fn, ": ", name, " ", shape_str(x.shape()), " has head_dim ",
           x.dim(3), " but the RoPE table was built for ", table.head_dim);
  FT_CHECK(x.dim(1) <= table.max_seq_len, fn, ": ", name, " ", shape_str(x.shape()),
           " has sequence length ", x.dim(1), " > RoPE table max_seq_len ", table.max_seq_len);
}

// direction +1 rotates by +angle (forward), -1 by -angle (backward), heads [0, rotated) of each
// position (the others are left as they are). out may alias x: each pair is read completely
// before it is written.
template <class T>
void rotate_kernel(T* out, const T* x, const double* cos_tab, const double* sin_tab,
                   const Shape& shape, int64_t rotated, int direction) {
  using A = acc_t<T>;
  const int64_t B = shape[0], T_len = shape[1], H = shape[2], D = shape[3], half = D / 2;
#pragma omp parallel for schedule(static) if (B * T_len * H * D >= detail::kParallelMinWork)
  for (int64_t bt = 0; bt < B * T_len; ++bt) {
    const int64_t t = bt % T_len;
    const double* cos_row = cos_tab + t * half;
    const double* sin_row = sin_tab + t * half;
    for (int64_t h = 0; h < rotated; ++h) {
      const int64_t base = (bt * H + h) * D;
      for (int64_t i = 0; i < half; ++i) {
        const A c = static_cast<A>(cos_row[i]), s = static_cast<A>(direction * sin_row[i]);
        const A x0 = load(x[base + 2 * i]), x1 = load(x[base + 2 * i + 1]);
        store(out[base + 2 * i], c * x0 - s * x1);
        store(out[base + 2 * i + 1], s * x0 + c * x1);
      }
    }
  }
}

// rotated: heads [0, rotated) of each position; -1: all of them.
void rotate(Tensor& out, const Tensor& x, const RopeTable& table, int direction, const char* fn,
            const char* out_name, const char* in_name, int64_t rotated = -1) {
  check_table(table, x.defined() ? x.device() : Device::cpu, fn);
  check_rope_input(x, table, fn, in_name);
  detail::check_like(out, x, fn, out_name, in_name);
  if (rotated < 0) rotated = x.dim(2);
  FT_CHECK(rotated <= x.dim(2), fn, ": ", rotated, " heads to rotate, but ", in_name, " ",
           shape_str(x.shape()), " has ", x.dim(2));
#ifdef FLASHTRAIN_WITH_CUDA
  if (x.device() == Device::cuda) return cuda::rope_rotate(out, x, table, rotated, direction);
#endif
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    rotate_kernel(out.data<T>(), x.data<T>(), table.cos.data<double>(), table.sin.data<double>(),
                  x.shape(), rotated, direction);
  });
}

}  // namespace

RopeTable make_rope_table(int64_t max_seq_len, int64_t head_dim, double theta, bool llama31_scaling,
                          Device device) {
  FT_CHECK(max_seq_len > 0, "make_rope_table: max_seq_len ", max_seq_len, " must be > 0");
  FT_CHECK(head_dim > 0 && head_dim % 2 == 0, "make_rope_table: head_dim ", head_dim,
           " must be positive and even");
  FT_CHECK(theta > 1.0, "make_rope_table: theta ", theta, " must be > 1");
  RopeTable table;
  table.max_seq_len = max_seq_len;
  table.head_dim = head_dim;
  const int64_t half = head_dim / 2;
  table.cos = Tensor::empty({max_seq_len, half}, DType::f64);
  table.sin = Tensor::empty({max_seq_len, half}, DType::f64);
  double* cos_tab = table.cos.data<double>();
  double* sin_tab = table.sin.data<double>();
  for (int64_t i = 0; i < half; ++i) {
    double freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    if (llama31_scaling) freq = llama31_scale_freq(freq);
    for (int64_t t = 0; t < max_seq_len; ++t) {
      const double angle = static_cast<double>(t) * freq;
      cos_tab[t * half + i] = std::cos(angle);
      sin_tab[t * half + i] = std::sin(angle);
    }
  }
  if (device == Device::cuda) {
#ifdef FLASHTRAIN_WITH_CUDA
    cuda::upload_rope_table(table);
#else
    throw Error("make_rope_table: a table for cuda, but flashtrain was built without CUDA");
#endif
  }
  return table;
}

void rope_forward(Tensor& out, const Tensor& x, const RopeTable& table) {
  rotate(out, x, table, +1, "rope_forward", "out", "x");
}

void rope_forward(Tensor& out, const Tensor& x, const RopeTable& table, int64_t offset) {
  FT_CHECK(offset >= 0 && offset < table.max_seq_len, "rope_forward: position offset ", offset,
           " outside the table's [0, ", table.max_seq_len, ")");
  if (offset == 0) return rope_forward(out, x, table);
  // The rows from `offset` on are a table of their own (views: nothing is copied).
  RopeTable rows;
  rows.max_seq_len = table.max_seq_len - offset;
  rows.head_dim = table.head_dim;
  rows.cos = table.cos.slice(offset, table.max_seq_len);
  rows.sin = table.sin.slice(offset, table.max_seq_len);
  if (table.cos_device.defined()) {
    rows.cos_device = table.cos_device.slice(offset, table.max_seq_len);
    rows.sin_device = table.sin_device.slice(offset, table.max_seq_len);
  }
  rotate(out, x, rows, +1, "rope_forward", "out", "x");
}

void rope_backward(Tensor& dx, const Tensor& dout, const RopeTable& table) {
  if (!dx.defined()) return;
  rotate(dx, dout, table, -1, "rope_backward", "dx", "dout");
}

void rope_forward_heads(Tensor& x, const RopeTable& table, int64_t heads) {
  FT_CHECK(heads >= 0, "rope_forward_heads: ", heads, " heads to rotate");
  rotate(x, x, table, +1, "rope_forward_heads", "x", "x", heads);
}

void rope_backward_heads(Tensor& dx, const RopeTable& table, int64_t heads) {
  FT_CHECK(heads >= 0, "rope_backward_heads: ", heads, " heads to rotate");
  rotate(dx, dx, table, -1, "rope_backward_heads", "dx", "dx", heads);
}

}  // namespace ft::nn
