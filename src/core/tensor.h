// Tensor: a shape, a dtype, a device and a view into reference-counted contiguous storage.
// Tensors are always contiguous (row-major); views share storage with their parent. Storage is
// allocated (and counted) by the library, or borrowed from a caller (Tensor::wrap).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace ft {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);  // "[2, 3, 4]"

class Storage {
 public:
  Storage(Device device, size_t nbytes);
  // Borrowed memory: neither counted nor freed.
  Storage(Device device, void* borrowed, size_t nbytes);
  // Host memory from allocate_pinned_bytes (page-locked where CUDA is set up).
  struct Pinned {};
  Storage(Pinned, size_t nbytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  Device device_;
  size_t nbytes_;
  void* data_;
  bool owned_ = true;
  bool pinned_ = false;       // from allocate_pinned_bytes
  bool page_locked_ = false;  // ... and page-locked
};

class Tensor {
 public:
  Tensor() = default;

  // Device::cuda sets up GPU 0 (cuda::init_device) on first use when nothing else has.
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu);
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu);
  // A CPU tensor in page-locked memory once the GPU is set up (core/memory.h), for data the GPU
  // copies from: such copies read it when they run (the host must not rewrite it before), and a
  // captured CUDA graph reads it at every replay (core/cuda/graph.h). Ordinary memory otherwise.
  static Tensor empty_pinned(const Shape& shape, DType dtype);
  // A tensor over memory the caller owns (another framework's array): nothing is allocated,
  // copied, counted or freed, and the caller keeps `data` alive and in place while this tensor
  // or any view of it lives. `data` must hold shape_numel(shape) contiguous elements on `device`.
  static Tensor wrap(void* data, const Shape& shape, DType dtype, Device device = Device::cpu);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const;  // negative i counts from the end
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  void* raw() const;
  template <class T>
  T* data() const {
    FT_CHECK(dtype_of<T>::value == dtype_, "tensor holds ", dtype_name(dtype_), ", accessed as ",
             dtype_name(dtype_of<T>::value));
    return static_cast<T*>(raw());
  }

  // Same storage, new shape with the same number of elements.
  Tensor view(const Shape& shape) const;
  // Rows [begin, end) along the first dimension, sharing storage.
  Tensor slice(int64_t begin, int64_t end) const;

  // Copies, on the tensor's device. Each returns a new tensor (never *this, even when nothing
  // changes). CUDA work is queued on cuda::current_stream(); anything that lands on the CPU is
  // synchronised first, so the caller may read it at once.
  Tensor clone() const;
  Tensor to(DType dtype) const;    // converts between float dtypes on the tensor's device
  Tensor to(Device device) const;  // same dtype and shape on `device` (CPU <-> CUDA transfers)
  // Same number of elements; any devices and any float dtypes (int32 only to int32). A dtype
  // change between devices moves the data first and converts on the destination device;
  // conversions round identically on the CPU and the GPU.
  void copy_from(const Tensor& src);
  void fill(double value);  // value converted as store() converts it (bf16: via fp32)
  void zero();

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_bytes_ = 0;
  Shape shape_;
  DType dtype_ = DType::f32;
  Device device_ = Device::cpu;
};

// Helpers used by tests and tools; CUDA tensors are copied to the CPU first.
double max_abs_diff(const Tensor& a, const Tensor& b);
// ||a - b|| / ||b|| over all elements, computed in double.
double relative_error(const Tensor& a, const Tensor& b);
bool all_finite(const Tensor& t);

}  // namespace ft
