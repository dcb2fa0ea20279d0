#include "core/tensor.h"

#include <cmath>
#include <cstring>
#include <sstream>

#include "core/device.h"
#include "core/memory.h"

#ifdef FLASHTRAIN_WITH_CUDA
#include "core/cuda/tensor_ops.h"
#endif

namespace ft {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::f64:
      return 8;
    case DType::i32:
      return 4;
    case DType::i16:
      return 2;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "fp32";
    case DType::bf16:
      return "bf16";
    case DType::f64:
      return "fp64";
    case DType::i32:
      return "int32";
    case DType::i16:
      return "int16";
  }
  return "?";
}

DType parse_dtype(const std::string& s) {
  if (s == "fp32" || s == "f32" || s == "float32") return DType::f32;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  if (s == "fp64" || s == "f64" || s == "float64") return DType::f64;
  if (s == "int32" || s == "i32") return DType::i32;
  if (s == "int16" || s == "i16") return DType::i16;
  throw Error(str("unknown dtype '", s, "' (allowed: fp32, bf16, fp64, int32, int16)"));
}

const char* device_name(Device d) {
  return d == Device::cpu ? "cpu" : "cuda";
}

Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::cpu;
  if (s == "cuda" || s == "gpu") return Device::cuda;
  throw Error(str("unknown device '", s, "' (allowed: cpu, cuda)"));
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const Shape& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

Storage::Storage(Device device, size_t nbytes)
    : device_(device), nbytes_(nbytes), data_(allocate_bytes(device, nbytes)) {}

Storage::Storage(Device device, void* borrowed, size_t nbytes)
    : device_(device), nbytes_(nbytes), data_(borrowed), owned_(false) {}

Storage::Storage(Pinned, size_t nbytes) : device_(Device::cpu), nbytes_(nbytes), pinned_(true) {
  data_ = allocate_pinned_bytes(nbytes, page_locked_);  // after page_locked_'s initialiser
}

Storage::~Storage() {
  if (!owned_) return;
  if (pinned_) {
    free_pinned_bytes(data_, nbytes_, page_locked_);
  } else {
    free_bytes(device_, data_, nbytes_);
  }
}

#ifndef FLASHTRAIN_WITH_CUDA
namespace {

[[noreturn]] void no_cuda_build(const char* what) {
  throw Error(str(what, " on a CUDA tensor, but this flashtrain was built without CUDA ",
                  "(configure with -DFLASHTRAIN_CUDA=ON)"));
}

}  // namespace
#endif

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) FT_CHECK(d >= 0, "negative dimension in shape ", shape_str(shape));
  if (device == Device::cuda) {
#ifdef FLASHTRAIN_WITH_CUDA
    cuda::ensure_device_ready();
#else
    no_cuda_build("Tensor::empty");
#endif
  }
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_ = std::make_shared<Storage>(device, t.nbytes());
  return t;
}

Tensor Tensor::empty_pinned(const Shape& shape, DType dtype) {
  for (int64_t d : shape) FT_CHECK(d >= 0, "negative dimension in shape ", shape_str(shape));
#ifdef FLASHTRAIN_WITH_CUDA
  // Page-locked memory comes from the CUDA backend: set it up first where there is a GPU, or
  // a pinned tensor made before any CUDA tensor would silently be pageable.
  if (cuda_device_count() > 0) cuda::ensure_device_ready();
#endif
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = Device::cpu;
  t.storage_ = std::make_shared<Storage>(Storage::Pinned{}, t.nbytes());
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero();
  return t;
}

Tensor Tensor::wrap(void* data, const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) FT_CHECK(d >= 0, "negative dimension in shape ", shape_str(shape));
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = device;
  FT_CHECK(data != nullptr || t.nbytes() == 0, "Tensor::wrap: null data for shape ",
           shape_str(shape));
  t.storage_ = std::make_shared<Storage>(device, data, t.nbytes());
  return t;
}

int64_t Tensor::dim(int i) const {
  const int n = ndim();
  if (i < 0) i += n;
  FT_CHECK(i >= 0 && i < n, "dimension ", i, " out of range for shape ", shape_str(shape_));
  return shape_[static_cast<size_t>(i)];
}

void* Tensor::raw() const {
  FT_CHECK(defined(), "access to an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_bytes_;
}

Tensor Tensor::view(const Shape& shape) const {
  FT_CHECK(shape_numel(shape) == numel(), "cannot view ", shape_str(shape_), " as ",
           shape_str(shape));
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  FT_CHECK(ndim() >= 1, "slice of a 0-d tensor");
  FT_CHECK(0 <= begin && begin <= end && end <= shape_[0], "slice [", begin, ", ", end,
           ") out of range for shape ", shape_str(shape_));
  Tensor t = *this;
  const int64_t row = numel() / std::max<int64_t>(shape_[0], 1);
  t.offset_bytes_ += static_cast<size_t>(begin * row) * dtype_size(dtype_);
  t.shape_[0] = end - begin;
  return t;
}

namespace {

template <class Dst, class Src>
void convert(Dst* dst, const Src* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) store(dst[i], load(src[i]));
}

}  // namespace

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device_);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(DType dtype) const {
  Tensor t = empty(shape_, dtype, device_);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(Device device) const {
  Tensor t = empty(shape_, dtype_, device);
  t.copy_from(*this);
  return t;
}

void Tensor::copy_from(const Tensor& src) {
  FT_CHECK(src.numel() == numel(), "copy_from: ", shape_str(src.shape()), " into ",
           shape_str(shape_));
  FT_CHECK(src.dtype() == dtype_ || (!is_integer(dtype_) && !is_integer(src.dtype())),
           "cannot convert ", dtype_name(src.dtype()), " to ", dtype_name(dtype_));
  if (device_ == Device::cpu && src.device() == Device::cpu) {
    if (src.dtype() == dtype_) {
      std::memcpy(raw(), src.raw(), nbytes());
      return;
    }
    dispatch_float(dtype_, [&](auto d) {
      using D = decltype(d);
      dispatch_float(src.dtype(), [&](auto s) {
        using S = decltype(s);
        convert(data<D>(), src.data<S>(), numel());
      });
    });
    return;
  }
#ifdef FLASHTRAIN_WITH_CUDA
  if (src.dtype() == dtype_) {
    cuda::copy_bytes(raw(), device_, src.raw(), src.device(), nbytes());
  } else if (src.device() != device_) {
    copy_from(src.to(device_));  // move, then convert where the result lives
  } else {
    cuda::convert(raw(), dtype_, src.raw(), src.dtype(), numel());
  }
#else
  no_cuda_build("copy_from");
#endif
}

void Tensor::fill(double value) {
  if (device_ == Device::cuda) {
#ifdef FLASHTRAIN_WITH_CUDA
    cuda::fill(raw(), dtype_, numel(), value);
    return;
#else
    no_cuda_build("fill");
#endif
  }
  if (dtype_ == DType::i32) {
    int32_t* p = data<int32_t>();
    for (int64_t i = 0, n = numel(); i < n; ++i) p[i] = static_cast<int32_t>(value);
    return;
  }
  if (dtype_ == DType::i16) {
    int16_t* p = data<int16_t>();
    for (int64_t i = 0, n = numel(); i < n; ++i) p[i] = static_cast<int16_t>(value);
    return;
  }
  dispatch_float(dtype_, [&](auto d) {
    using D = decltype(d);
    D* p = data<D>();
    for (int64_t i = 0, n = numel(); i < n; ++i) store(p[i], value);
  });
}

void Tensor::zero() {
  if (device_ == Device::cpu) {
    std::memset(raw(), 0, nbytes());
    return;
  }
#ifdef FLASHTRAIN_WITH_CUDA
  cuda::zero_bytes(raw(), nbytes());
#else
  no_cuda_build("zero");
#endif
}

namespace {

// The tensor itself when it is on the CPU, else a CPU copy.
Tensor on_cpu(const Tensor& t) {
  return t.device() == Device::cpu ? t : t.to(Device::cpu);
}

template <class F>
void for_pairs(const Tensor& a, const Tensor& b, F&& f) {
  FT_CHECK(a.numel() == b.numel(), "compare: ", shape_str(a.shape()), " vs ", shape_str(b.shape()));
  const Tensor a64 = on_cpu(a).to(DType::f64);
  const Tensor b64 = on_cpu(b).to(DType::f64);
  const double* pa = a64.data<double>();
  const double* pb = b64.data<double>();
  for (int64_t i = 0, n = a.numel(); i < n; ++i) f(pa[i], pb[i]);
}

}  // namespace

double max_abs_diff(const Tensor& a, const Tensor& b) {
  double m = 0.0;
  for_pairs(a, b, [&](double x, double y) {
    const double d = std::fabs(x - y);
    m = (d > m || std::isnan(d)) ? d : m;
  });
  return m;
}

double relative_error(const Tensor& a, const Tensor& b) {
  double num = 0.0, den = 0.0;
  for_pairs(a, b, [&](double x, double y) {
    num += (x - y) * (x - y);
    den += y * y;
  });
  if (den == 0.0) return std::sqrt(num);
  return std::sqrt(num / den);
}

bool all_finite(const Tensor& tensor) {
  if (is_integer(tensor.dtype())) return true;
  const Tensor t = on_cpu(tensor);
  bool ok = true;
  dispatch_float(t.dtype(), [&](auto d) {
    using D = decltype(d);
    const D* p = t.data<D>();
    for (int64_t i = 0, n = t.numel(); i < n && ok; ++i)
      ok = std::isfinite(static_cast<double>(load(p[i])));
  });
  return ok;
}

}  // namespace ft
