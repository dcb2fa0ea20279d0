// One attention call as both Python bindings make it: module.cpp (the nanobind module, on DLPack
// arrays) and torch_ext.cpp (PyTorch tensors read as at::Tensor). Each binding describes its
// arrays in DLPack's terms (ArrayView); what follows is here once: the checks and their messages
// (so that both raise the same errors for the same inputs), the inputs borrowed without a copy,
// the library's backward as both call it, the GPU a call runs on, and an output's memory given
// back on its stream. Nothing here touches Python: a binding turns ArgumentTypeError into
// TypeError, OutOfMemory into MemoryError and any other ft::Error into ValueError.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "attention/attention.h"
#include "attention/kernel_config.h"
#include "core/error.h"
#include "core/tensor.h"

namespace ft::python {

// DLPack's element type (dlpack.h's DLDataType) and its type codes.
struct ElementType {
  uint8_t code = 0;
  uint8_t bits = 0;
  uint16_t lanes = 1;
};
enum TypeCode : uint8_t { kInt = 0, kUInt = 1, kFloat = 2, kBfloat = 4, kComplex = 5, kBool = 6 };
// DLPack's device types of the two devices the library runs on.
inline constexpr int32_t kDeviceCpu = 1;
inline constexpr int32_t kDeviceCuda = 2;

// An array as a binding sees it: its memory, shape, strides in elements, dtype and device.
struct ArrayView {
  const void* data = nullptr;
  size_t ndim = 0;
  const int64_t* shape = nullptr;
  const int64_t* strides = nullptr;
  ElementType dtype;
  int32_t device_type = kDeviceCpu;
  int32_t device_id = 0;
};

// A wrong dtype or kind of argument: Python's TypeError. Every other ft::Error of a call is a
// ValueError (OutOfMemory a MemoryError).
class ArgumentTypeError : public Error {
 public:
  using Error::Error;
};

bool same_dtype(ElementType a, ElementType b);
std::string dtype_str(ElementType d);  // "float32", "bfloat16", "int32", ...

// A borrowed tensor over the array's memory: rank, dtype, device, contiguity and (on the GPU)
// 16-byte alignment checked here, the shapes against each other by the library.
Tensor borrow(const char* name, const ArrayView& a, size_t rank, const char* layout);
// What must agree with q within one call: the DLPack dtype (so that uint16 and bfloat16 are not
// mixed) and the device.
void check_like_q(const char* name, const ArrayView& a, const ArrayView& q);

// The inputs of one call, borrowed, and its problem, checked.
struct Inputs {
  Tensor q, k, v, segment_ids;
  attention::Problem problem;
};
// segment_ids: null for none.
Inputs borrow_inputs(const ArrayView& q, const ArrayView& k, const ArrayView& v,
                     const ArrayView* segment_ids, bool causal, int64_t window, double scale,
                     bool deterministic);

// What backward reads beside the inputs: forward's o and lse, and the gradient of o.
struct BackwardInputs {
  attention::ForwardOutput fwd;
  Tensor dout;
};
BackwardInputs borrow_backward_inputs(attention::Impl impl, const ArrayView& q, const ArrayView& o,
                                      const ArrayView& lse, const ArrayView& dout);

// The library's backward as the bindings offer it. naive's backward reads the probabilities its
// forward keeps, which are not handed out: it recomputes its forward first.
attention::Gradients run_backward(attention::Impl impl, const Inputs& in, BackwardInputs extra,
                                  const attention::KernelConfig* config);

#ifdef FLASHTRAIN_WITH_CUDA
// Makes GPU `device_id` current on this thread. The library's one-GPU rule (cuda::init_device:
// another GPU is an ft::Error) is checked on a device's first call only, and the device is set
// only when the thread's current one is another: the framework has usually made it current, and
// the query costs less than setting it again.
void use_device(int device_id);
#endif

// Waits for the work queued on a cudaStream_t handle (nothing without CUDA). The modules reach
// the CUDA runtime only through the core (libflashtrain_core.so, python/CMakeLists.txt), which
// holds the one copy of it that the library's state lives in.
void synchronize_stream(uintptr_t stream);

// Drops an output the library made, its GPU memory going back to the pool on `stream` (a
// cudaStream_t), the stream it was made on; nothing escapes (a destructor or a framework's
// deleter calls it).
void release_output(Tensor& tensor, uintptr_t stream) noexcept;

}  // namespace ft::python
