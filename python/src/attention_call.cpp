#include "attention_call.h"

#include <atomic>

#ifdef FLASHTRAIN_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda/check.h"
#include "core/cuda/runtime.h"
#endif

namespace ft::python {
namespace {

std::string shape_of(const ArrayView& a) {
  return shape_str(Shape(a.shape, a.shape + a.ndim));
}

std::string strides_of(const ArrayView& a) {
  return shape_str(Shape(a.strides, a.strides + a.ndim));
}

// The element type an array holds for the library: fp32, fp64, bf16 (DLPack bfloat16, or uint16
// carrying bf16 bits) or int32.
DType library_dtype(const char* name, const ArrayView& a) {
  const ElementType d = a.dtype;
  if (d.lanes == 1) {
    if (d.code == kFloat && d.bits == 32) return DType::f32;
    if (d.code == kFloat && d.bits == 64) return DType::f64;
    if (d.code == kBfloat && d.bits == 16) return DType::bf16;
    if (d.code == kUInt && d.bits == 16) return DType::bf16;
    if (d.code == kInt && d.bits == 32) return DType::i32;
  }
  throw ArgumentTypeError(str("attention: ", name, " has dtype ", dtype_str(d),
                              " (allowed: float32, bfloat16 or uint16 holding bf16 bits, float64; "
                              "segment ids int32)"));
}

Device device_of(const char* name, const ArrayView& a) {
  if (a.device_type == kDeviceCpu) return Device::cpu;
  if (a.device_type == kDeviceCuda) {
#ifdef FLASHTRAIN_WITH_CUDA
    return Device::cuda;
#else
    throw Error(str("attention: ", name,
                    " is on a CUDA device, but this flashtrain "
                    "module was built without CUDA (reinstall with FLASHTRAIN_CUDA=ON)"));
#endif
  }
  throw Error(str("attention: ", name, " is on DLPack device type ", a.device_type,
                  " (allowed: CPU, CUDA)"));
}

}  // namespace

bool same_dtype(ElementType a, ElementType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

std::string dtype_str(ElementType d) {
  const char* kind = nullptr;
  switch (d.code) {
    case kInt:
      kind = "int";
      break;
    case kUInt:
      kind = "uint";
      break;
    case kFloat:
      kind = "float";
      break;
    case kBfloat:
      kind = "bfloat";
      break;
    case kComplex:
      kind = "complex";
      break;
    case kBool:
      kind = "bool";
      break;
    default:
      return str("dlpack-code", static_cast<int>(d.code), "-bits", static_cast<int>(d.bits));
  }
  return str(kind, static_cast<int>(d.bits), d.lanes != 1 ? str("x", d.lanes) : "");
}

Tensor borrow(const char* name, const ArrayView& a, size_t rank, const char* layout) {
  if (a.ndim != rank) {
    throw Error(
        str("attention: ", name, " must be ", rank, "-D ", layout, ", got shape ", shape_of(a)));
  }
  const DType dtype = library_dtype(name, a);
  const Device device = device_of(name, a);
  int64_t expected = 1;
  for (size_t i = rank; i-- > 0;) {
    if (a.shape[i] != 1 && a.strides[i] != expected) {
      throw Error(str("attention: ", name, " is not contiguous (shape ", shape_of(a), ", strides ",
                      strides_of(a),
                      " in elements); pass a C-contiguous array "
                      "(numpy.ascontiguousarray, tensor.contiguous())"));
    }
    expected *= a.shape[i];
  }
  const auto address = reinterpret_cast<uintptr_t>(a.data);
  if (device == Device::cuda && address % 16 != 0) {
    throw Error(str("attention: ", name,
                    " starts at an address that is not 16-byte "
                    "aligned (",
                    address % 16,
                    " bytes past); the CUDA kernels load 16 "
                    "bytes at a time: pass a copy"));
  }
  const Shape shape(a.shape, a.shape + rank);  // one allocation, not one a dim
  return Tensor::wrap(const_cast<void*>(a.data), shape, dtype, device);
}

void check_like_q(const char* name, const ArrayView& a, const ArrayView& q) {
  if (!same_dtype(a.dtype, q.dtype)) {
    throw ArgumentTypeError(str("attention: ", name, " has dtype ", dtype_str(a.dtype), ", q has ",
                                dtype_str(q.dtype), " (they must be the same)"));
  }
  if (a.device_type != q.device_type || a.device_id != q.device_id) {
    throw Error(str("attention: ", name, " is on device (", a.device_type, ", ", a.device_id,
                    "), q on (", q.device_type, ", ", q.device_id,
                    ") (DLPack device type, id): they must be on one device"));
  }
}

Inputs borrow_inputs(const ArrayView& q, const ArrayView& k, const ArrayView& v,
                     const ArrayView* segment_ids, bool causal, int64_t window, double scale,
                     bool deterministic) {
  Inputs in;
  in.q = borrow("q", q, 4, "[B, S, Hq, D]");
  check_like_q("k", k, q);
  check_like_q("v", v, q);
  in.k = borrow("k", k, 4, "[B, S, Hkv, D]");
  in.v = borrow("v", v, 4, "[B, S, Hkv, D]");
  if (in.q.dtype() == DType::i32) {
    throw ArgumentTypeError(
        "attention: q, k and v have dtype int32 (allowed: float32, bfloat16 or "
        "uint16 holding bf16 bits, float64)");
  }
  attention::Mask mask;
  mask.causal = causal;
  mask.window = window;
  if (segment_ids != nullptr) {
    in.segment_ids = borrow("segment_ids", *segment_ids, 2, "[B, S]");
    if (in.segment_ids.dtype() != DType::i32) {
      throw ArgumentTypeError(str("attention: segment_ids has dtype ",
                                  dtype_str(segment_ids->dtype), " (allowed: int32)"));
    }
    mask.has_segments = true;
  }
  in.problem = attention::make_problem(in.q, in.k, in.v, mask, scale);
  in.problem.deterministic = deterministic;
  return in;
}

BackwardInputs borrow_backward_inputs(attention::Impl impl, const ArrayView& q, const ArrayView& o,
                                      const ArrayView& lse, const ArrayView& dout) {
  // The reference widens any float dtype (its o is fp64 whatever q is); the others take q's.
  if (impl != attention::Impl::reference) check_like_q("o", o, q);
  check_like_q("do", dout, q);
  BackwardInputs extra;
  extra.fwd.o = borrow("o", o, 4, "[B, S, Hq, D]");
  extra.fwd.lse = borrow("lse", lse, 3, "[B, Hq, S]");
  if (extra.fwd.lse.dtype() != DType::f32 && extra.fwd.lse.dtype() != DType::f64) {
    throw ArgumentTypeError(
        str("attention: lse has dtype ", dtype_str(lse.dtype), " (allowed: float32, float64)"));
  }
  extra.dout = borrow("do", dout, 4, "[B, S, Hq, D]");
  return extra;
}

attention::Gradients run_backward(attention::Impl impl, const Inputs& in, BackwardInputs extra,
                                  const attention::KernelConfig* config) {
  if (impl == attention::Impl::naive) {
    extra.fwd = attention::forward(impl, in.problem, in.q, in.k, in.v, in.segment_ids);
  }
  return attention::backward(impl, in.problem, in.q, in.k, in.v, extra.fwd, extra.dout,
                             in.segment_ids, config);
}

#ifdef FLASHTRAIN_WITH_CUDA
void use_device(int device_id) {
  static std::atomic<int> ready{-1};
  if (ready.load(std::memory_order_acquire) != device_id) {
    cuda::init_device(device_id);
    ready.store(device_id, std::memory_order_release);
  }
  int current = -1;
  FT_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device_id) FT_CUDA_CHECK(cudaSetDevice(device_id));
}
#endif

void synchronize_stream(uintptr_t stream) {
#ifdef FLASHTRAIN_WITH_CUDA
  FT_CUDA_CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)));
#else
  (void)stream;
#endif
}

void release_output(Tensor& tensor, uintptr_t stream) noexcept {
  try {
#ifdef FLASHTRAIN_WITH_CUDA
    if (tensor.defined() && tensor.device() == Device::cuda) {
      cuda::StreamScope scope(reinterpret_cast<cudaStream_t>(stream));
      tensor = Tensor();
      return;
    }
#else
    (void)stream;
#endif
    tensor = Tensor();
  } catch (...) {
    // A failing free (a broken context) cannot be reported from a destructor or a deleter.
  }
}

}  // namespace ft::python
