// forward() and backward(): check every tensor against the problem (so that a wrong shape,
// dtype or device is reported with its value, never read out of bounds), then call the chosen
// implementation on the device that q lives on. Segment ids may be on either device.
#include "attention/attention.h"
#include "attention/cpu/cpu_kernels.h"
#include "attention/kernel_config.h"
#ifdef FLASHTRAIN_WITH_CUDA
#include "attention/cuda/cuda_kernels.h"
#endif

namespace ft::attention {
namespace {

// The device every tensor of a call must be on: q's (the CPU when q is missing, so that the
// missing tensor is what gets reported).
Device device_of(const Tensor& q) {
  return q.defined() ? q.device() : Device::cpu;
}

void check_device(Impl impl, Device device) {
  if (device == Device::cpu) return;
  FT_CHECK(impl != Impl::reference,
           "attention: reference is CPU only (q is on cuda; copy the inputs to the CPU)");
#ifndef FLASHTRAIN_WITH_CUDA
  throw Error("attention: q is on cuda but flashtrain was built without CUDA");
#endif
}

void check_tensor(const char* name, const Tensor& t, const Shape& shape, DType dtype,
                  Device device = Device::cpu) {
  FT_CHECK(t.defined(), "attention: ", name, " is missing");
  FT_CHECK(t.device() == device, "attention: ", name, " is on ", device_name(t.device()),
           ", expected ", device_name(device), " like q");
  FT_CHECK(t.shape() == shape, "attention: ", name, " has shape ", shape_str(t.shape()),
           ", expected ", shape_str(shape));
  FT_CHECK(t.dtype() == dtype, "attention: ", name, " has dtype ", dtype_name(t.dtype()),
           ", expected ", dtype_name(dtype));
}

// The reference widens any float input to fp64, so it only needs a float dtype.
void check_float(const char* name, const Tensor& t, const Shape& shape) {
  FT_CHECK(t.defined(), "attention: ", name, " is missing");
  check_tensor(name, t, shape, t.dtype() == DType::i32 ? DType::f32 : t.dtype());
}

void check_segments(const Problem& p, const Tensor& segment_ids, Device device) {
  if (p.mask.has_segments) {
    // Small, and read by the mask on whichever device runs: accepted on either.
    const Device seg_device = segment_ids.defined() ? segment_ids.device() : device;
    check_tensor("segment ids", segment_ids, {p.batch, p.seq_len}, DType::i32, seg_device);
    FT_CHECK(device == Device::cuda || seg_device == Device::cpu,
             "attention: segment ids are on cuda but q is on the CPU");
  } else {
    FT_CHECK(!segment_ids.defined(), "attention: segment ids ", shape_str(segment_ids.shape()),
             " were given but the mask has no segments (set mask.has_segments)");
  }
}

void check_inputs(Impl impl, const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& segment_ids) {
  p.validate();
  const Device device = device_of(q);
  check_device(impl, device);
  const Shape q_shape{p.batch, p.seq_len, p.q_heads, p.head_dim};
  const Shape kv_shape{p.batch, p.seq_len, p.kv_heads, p.head_dim};
  if (impl == Impl::reference) {
    check_float("q", q, q_shape);
    check_float("k", k, kv_shape);
    check_float("v", v, kv_shape);
  } else {
    check_tensor("q", q, q_shape, p.dtype, device);
    check_tensor("k", k, kv_shape, p.dtype, device);
    check_tensor("v", v, kv_shape, p.dtype, device);
  }
  check_segments(p, segment_ids, device);
}

// The packed call's qkv (and dqkv) [B, S, (Hq + 2 Hkv) * D].
Shape packed_shape(const Problem& p) {
  return {p.batch, p.seq_len, (p.q_heads + 2 * p.kv_heads) * p.head_dim};
}

void check_packed_inputs(Impl impl, const Problem& p, const Tensor& qkv,
                         const Tensor& segment_ids) {
  p.validate();
  const Device device = device_of(qkv);
  check_device(impl, device);
  if (impl == Impl::reference) {
    check_float("qkv", qkv, packed_shape(p));
  } else {
    check_tensor("qkv", qkv, packed_shape(p), p.dtype, device);
  }
  check_segments(p, segment_ids, device);
}

DType lse_dtype(Impl impl, DType dtype) {
  return impl == Impl::reference || dtype == DType::f64 ? DType::f64 : DType::f32;
}

void check_backward_inputs(Impl impl, const Problem& p, Device device, const ForwardOutput& fwd,
                           const Tensor& dout) {
  const Shape q_shape{p.batch, p.seq_len, p.q_heads, p.head_dim};
  if (impl == Impl::reference) {
    check_float("dout", dout, q_shape);
    return;  // the reference recomputes its own forward
  }
  check_tensor("dout", dout, q_shape, p.dtype, device);
  check_tensor("forward output o", fwd.o, q_shape, p.dtype, device);
  check_tensor("forward lse", fwd.lse, {p.batch, p.q_heads, p.seq_len}, lse_dtype(impl, p.dtype),
               device);
  if (impl == Impl::naive) {
    check_tensor("naive's saved probabilities", fwd.saved,
                 {p.batch, p.q_heads, p.seq_len, p.seq_len}, lse_dtype(impl, p.dtype), device);
  }
}

#ifdef FLASHTRAIN_WITH_CUDA
// The configuration the CUDA flash kernels run: the given one or the device's default, checked
// by can_implement() for the direction about to run, so that nothing it refuses is launched.
KernelConfig checked_config(const Problem& p, const KernelConfig* config, KernelDirection which) {
  const DeviceLimits& device = DeviceLimits::current();
  const KernelConfig c = config != nullptr ? *config : default_config(device, p);
  const std::string reason = can_implement(c, p, device, which);
  FT_CHECK(reason.empty(), "attention: the flash kernels (", c.str(), ") cannot run ", p.describe(),
           " on ", device.arch, ": ", reason);
  return c;
}
#endif

ForwardOutput cpu_forward(Impl impl, const Problem& p, const cpu::Layout& l, const Tensor& q,
                          const Tensor& k, const Tensor& v, const Tensor& segment_ids) {
  switch (impl) {
    case Impl::reference:
      return cpu::reference_forward(p, l, q, k, v, segment_ids);
    case Impl::naive:
      return cpu::naive_forward(p, l, q, k, v, segment_ids);
    case Impl::flash:
      return cpu::flash_forward(p, l, q, k, v, segment_ids);
  }
  throw Error("attention: unknown implementation");
}

void cpu_backward(Impl impl, const Problem& p, const cpu::Layout& l, const Tensor& q,
                  const Tensor& k, const Tensor& v, const ForwardOutput& fwd, const Tensor& dout,
                  const Tensor& segment_ids, Gradients& into) {
  switch (impl) {
    case Impl::reference:
      return cpu::reference_backward(p, l, q, k, v, fwd, dout, segment_ids, into);
    case Impl::naive:
      return cpu::naive_backward(p, l, q, k, v, fwd, dout, segment_ids, into);
    case Impl::flash:
      return cpu::flash_backward(p, l, q, k, v, fwd, dout, segment_ids, into);
  }
  throw Error("attention: unknown implementation");
}

}  // namespace

ForwardOutput forward(Impl impl, const Problem& problem, const Tensor& q, const Tensor& k,
                      const Tensor& v, const Tensor& segment_ids, const KernelConfig* config) {
  check_inputs(impl, problem, q, k, v, segment_ids);
#ifdef FLASHTRAIN_WITH_CUDA
  // check_device() let only naive and flash through on the GPU.
  if (q.device() == Device::cuda) {
    if (impl == Impl::naive) return cuda::naive_forward(problem, q, k, v, segment_ids);
    return cuda::flash_forward(problem, q, k, v, segment_ids,
                               checked_config(problem, config, KernelDirection::forward));
  }
#else
  (void)config;
#endif
  return cpu_forward(impl, problem, cpu::Layout::dense(problem), q, k, v, segment_ids);
}

Gradients backward(Impl impl, const Problem& problem, const Tensor& q, const Tensor& k,
                   const Tensor& v, const ForwardOutput& fwd, const Tensor& dout,
                   const Tensor& segment_ids, const KernelConfig* config) {
  check_inputs(impl, problem, q, k, v, segment_ids);
  check_backward_inputs(impl, problem, device_of(q), fwd, dout);
#ifdef FLASHTRAIN_WITH_CUDA
  if (q.device() == Device::cuda) {
    // naive's saved probabilities carry the mask: segment ids are not needed again.
    if (impl == Impl::naive) return cuda::naive_backward(problem, q, k, v, fwd, dout);
    return cuda::flash_backward(problem, q, k, v, fwd, dout, segment_ids,
                                checked_config(problem, config, KernelDirection::backward));
  }
#else
  (void)config;
#endif
  // Filled with NaN, so that an element a kernel forgets to write fails every check.
  const DType out = impl == Impl::reference ? DType::f64 : problem.dtype;
  Gradients g{cpu::poisoned(q.shape(), out), cpu::poisoned(k.shape(), out),
              cpu::poisoned(v.shape(), out)};
  cpu_backward(impl, problem, cpu::Layout::dense(problem), q, k, v, fwd, dout, segment_ids, g);
  return g;
}

ForwardOutput forward_packed(Impl impl, const Problem& problem, const Tensor& qkv,
                             const Tensor& segment_ids, const KernelConfig* config) {
  check_packed_inputs(impl, problem, qkv, segment_ids);
#ifdef FLASHTRAIN_WITH_CUDA
  if (qkv.device() == Device::cuda) {
    if (impl == Impl::flash) {
      const KernelConfig c = checked_config(problem, config, KernelDirection::forward);
      if (cuda::flash_reads_packed(problem, c, KernelDirection::forward)) {
        return cuda::flash_forward_packed(problem, qkv, segment_ids, c);
      }
    }
    const cuda::Unpacked in = cuda::unpack(problem, qkv);
    return forward(impl, problem, in.q, in.k, in.v, segment_ids, config);
  }
#else
  (void)config;
#endif
  return cpu_forward(impl, problem, cpu::Layout::packed(problem), qkv, qkv, qkv, segment_ids);
}

void backward_packed(Impl impl, const Problem& problem, const Tensor& qkv, const ForwardOutput& fwd,
                     const Tensor& dout, Tensor& dqkv, const Tensor& segment_ids,
                     const KernelConfig* config) {
  check_packed_inputs(impl, problem, qkv, segment_ids);
  check_backward_inputs(impl, problem, qkv.device(), fwd, dout);
  check_tensor("dqkv", dqkv, packed_shape(problem),
               impl == Impl::reference ? DType::f64 : problem.dtype, qkv.device());
  FT_CHECK(dqkv.raw() != qkv.raw(),
           "attention: dqkv must not alias qkv (the backward reads qkv "
           "while it writes dqkv)");
#ifdef FLASHTRAIN_WITH_CUDA
  if (qkv.device() == Device::cuda) {
    if (impl == Impl::flash) {
      const KernelConfig c = checked_config(problem, config, KernelDirection::backward);
      if (cuda::flash_reads_packed(problem, c, KernelDirection::backward)) {
        cuda::flash_backward_packed(problem, qkv, fwd, dout, segment_ids, c, dqkv);
        return;
      }
    }
    const cuda::Unpacked in = cuda::unpack(problem, qkv);
    cuda::pack_gradients(
        problem, backward(impl, problem, in.q, in.k, in.v, fwd, dout, segment_ids, config), dqkv);
    return;
  }
#else
  (void)config;
#endif
  Gradients into{dqkv, dqkv, dqkv};
  cpu_backward(impl, problem, cpu::Layout::packed(problem), qkv, qkv, qkv, fwd, dout, segment_ids,
               into);
}

bool reads_packed_in_place(Impl impl, Device device) {
  return device == Device::cpu || impl == Impl::flash;
}

}  // namespace ft::attention
