// flashtrain._torch_ext: the attention API (src/attention/attention.h) on PyTorch tensors read as
// at::Tensor, built only against the PyTorch found at build time (FLASHTRAIN_TORCH,
// pyproject.toml). python/flashtrain/attention.py and torch.py route PyTorch tensors here when it
// loads, and to the nanobind module's DLPack route (module.cpp) otherwise; the checks, messages and
// library calls are attention_call.h's, in the one library both modules load
// (libflashtrain_core.so, python/CMakeLists.txt).
//
// Why this call path, the cheapest we found for a call from Python:
//   - a CPython METH_FASTCALL function: the arguments arrive as a C array, positional (the Python
//     wrappers pass them so), with no binding library's overload resolution and no keywords;
//   - tensors read with THPVariable_Check and THPVariable_Unpack (a type check and a pointer
//     read) instead of a DLPack capsule made and consumed per tensor (PyTorch's own to_dlpack and
//     _from_dlpack cost ~5 us a call on the H200's host for 3 inputs and 2 outputs,
//     docs/PYTHON.md);
//   - outputs: the library's tensors handed to PyTorch over their memory (at::for_blob with a
//     context deleter and the device given: no std::function, no pointer query), wrapped with
//     THPVariable_Wrap;
//   - no dispatcher: an op called from eager Python (torch.ops.flashtrain.*) pays PyTorch's
//     boxed dispatch, microseconds a call. The ops are registered too (register_ops, below), with
//     the same C++ functions as kernels, for torch.compile, whose graphs call them.
// On the GPU the call runs on PyTorch's current stream (c10::cuda::getCurrentCUDAStream), and the
// library's GPU memory (the outputs and the calls' scratch) comes from PyTorch's caching
// allocator (TorchDeviceMemory, below): torch.cuda.memory_allocated() counts it, and the process
// keeps one pool, not PyTorch's beside flashtrain's.
#include <ATen/DLConvertor.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/library.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "attention/attention.h"
#include "attention/kernel_config.h"
#include "attention_call.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/tensor.h"

#ifdef FLASHTRAIN_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>

#include <unordered_set>

#include "core/cuda/runtime.h"
#endif

namespace ft::python {
namespace {

// The tensor as the shared call code (attention_call.h) reads it, in DLPack's terms as PyTorch's
// own DLPack export gives them, so that the messages are the DLPack route's.
ArrayView view(const at::Tensor& t) {
  const DLDataType d = at::getDLDataType(t);
  const DLDevice device = at::torchDeviceToDLDevice(t.device());
  return ArrayView{t.const_data_ptr(),        static_cast<size_t>(t.dim()),
                   t.sizes().data(),          t.strides().data(),
                   {d.code, d.bits, d.lanes}, static_cast<int32_t>(device.device_type),
                   device.device_id};
}

// Parsed kernel configurations by their text ("" is the device's default: null), parsed once:
// the text comes with every call of the ops.
const attention::KernelConfig* kernel_config(std::string_view text) {
  if (text.empty()) return nullptr;
  static std::mutex mutex;
  static std::map<std::string, attention::KernelConfig, std::less<>> parsed;  // nodes stay put
  const std::lock_guard lock(mutex);
  auto it = parsed.find(text);
  if (it == parsed.end()) {
    const std::string key(text);
    it = parsed.emplace(key, attention::KernelConfig::parse(key)).first;
  }
  return &it->second;
}

// Keeps an output's storage alive for PyTorch: the context of its DataPtr, freed (on the stream
// the output was made on) when PyTorch frees the tensor, on whatever thread that happens.
struct OutputKeeper {
  Tensor tensor;
  uintptr_t stream;

  static void free(void* self) {
    auto* keeper = static_cast<OutputKeeper*>(self);
    release_output(keeper->tensor, keeper->stream);
    delete keeper;
  }
};

#ifdef FLASHTRAIN_TORCH_CUDA
// The library's device allocator over PyTorch's caching allocator, installed at the first call on
// the GPU (after the library has set the device up, which registers its own pool): blocks are
// taken on the library's current stream, which in a call is PyTorch's current stream, so a block
// freed after the call's last kernel is reused in that stream's order, as PyTorch's own are.
// Memory the library took from its pool before (none, unless the DLPack route ran first) goes
// back there; page-locked host memory and the pool's statistics stay the library's. A request
// PyTorch cannot serve raises flashtrain's out-of-memory error with PyTorch's message. The
// allocator is the library's, and both modules share the one library (libflashtrain_core.so):
// from the extension's first GPU call on, the nanobind module's calls (the DLPack route: CuPy,
// JAX, PyTorch tensors with a stream= handle) allocate here too, on their own streams.
class TorchDeviceMemory {
 public:
  static void install() {
    static std::once_flag once;
    std::call_once(once, [] {
      // Never destroyed: the core's state (libflashtrain_core.so) holds the allocator and may
      // free through it during its own teardown at exit, after this module's statics are gone.
      static TorchDeviceMemory* const memory =
          new TorchDeviceMemory(device_allocator(Device::cuda));
      DeviceAllocator mine;
      mine.allocate = [](size_t nbytes) { return memory->allocate(nbytes); };
      mine.free = [](void* ptr) { memory->free(ptr); };
      mine.allocate_pinned = memory->pool_.allocate_pinned;
      mine.free_pinned = memory->pool_.free_pinned;
      mine.release_cached = memory->pool_.release_cached;
      register_device_allocator(Device::cuda, std::move(mine));
    });
  }

 private:
  explicit TorchDeviceMemory(DeviceAllocator pool) : pool_(std::move(pool)) {}

  void* allocate(size_t nbytes) {
    void* ptr = nullptr;
    try {
      ptr = c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(nbytes == 0 ? 1 : nbytes,
                                                                   cuda::current_stream());
    } catch (const c10::OutOfMemoryError& e) {
      throw OutOfMemory(
          str("out of GPU memory (PyTorch's caching allocator): ", e.what_without_backtrace()));
    }
    const std::lock_guard lock(mutex_);
    mine_.insert(ptr);
    return ptr;
  }

  void free(void* ptr) {
    {
      const std::lock_guard lock(mutex_);
      if (mine_.erase(ptr) == 0) return pool_.free(ptr);
    }
    c10::cuda::CUDACachingAllocator::raw_delete(ptr);
  }

  DeviceAllocator pool_;
  std::mutex mutex_;
  std::unordered_set<void*> mine_;
};
#endif

// The device and stream a call runs on (q's; the CPU needs neither), and its outputs made into
// PyTorch tensors there.
class TorchCall {
 public:
  explicit TorchCall(const at::Tensor& q) : device_(q.device()), q_type_(q.scalar_type()) {
#ifdef FLASHTRAIN_TORCH_CUDA
    if (device_.is_cuda()) {
      use_device(device_.index());
      TorchDeviceMemory::install();
      stream_ =
          reinterpret_cast<uintptr_t>(c10::cuda::getCurrentCUDAStream(device_.index()).stream());
      scope_.emplace(reinterpret_cast<cudaStream_t>(stream_));
    }
#endif
  }

  // The library's output as a tensor over its memory: q-like outputs in q's dtype (bfloat16, or
  // uint16 carrying bf16 bits), the others in their own.
  at::Tensor hand_over(Tensor tensor) const {
    const at::ScalarType type = output_type(tensor.dtype());
    const at::Device device = tensor.device() == Device::cuda ? device_ : at::Device(at::kCPU);
    auto* keeper = new OutputKeeper{std::move(tensor), stream_};
    // The maker owns the keeper from here: if make_tensor throws, it frees it.
    return at::for_blob(keeper->tensor.raw(), keeper->tensor.shape())
        .context(keeper, &OutputKeeper::free)
        .target_device(device)
        .options(at::TensorOptions().dtype(type).device(device))
        .make_tensor();
  }

 private:
  at::ScalarType output_type(DType dtype) const {
    switch (dtype) {
      case DType::f32:
        return at::kFloat;
      case DType::f64:
        return at::kDouble;
      case DType::i32:
        return at::kInt;
      case DType::i16:
        return at::kShort;
      case DType::bf16:
        return q_type_;
    }
    return q_type_;
  }

  at::Device device_;
  at::ScalarType q_type_;
  uintptr_t stream_ = 0;
#ifdef FLASHTRAIN_TORCH_CUDA
  std::optional<cuda::StreamScope> scope_;
#endif
};

Inputs borrow_tensors(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const at::Tensor* segment_ids, bool causal, int64_t window, double scale,
                      bool deterministic) {
  const ArrayView segments = segment_ids != nullptr ? view(*segment_ids) : ArrayView{};
  return borrow_inputs(view(q), view(k), view(v), segment_ids != nullptr ? &segments : nullptr,
                       causal, window, scale, deterministic);
}

// (o, lse): the library's forward on PyTorch tensors; segment_ids null for none.
std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, const at::Tensor* segment_ids,
                                           bool causal, int64_t window, double scale,
                                           attention::Impl impl,
                                           const attention::KernelConfig* config) {
  const TorchCall call(q);
  const Inputs in = borrow_tensors(q, k, v, segment_ids, causal, window, scale, false);
  attention::ForwardOutput out =
      attention::forward(impl, in.problem, in.q, in.k, in.v, in.segment_ids, config);
  return {call.hand_over(std::move(out.o)), call.hand_over(std::move(out.lse))};
}

// (dq, dk, dv): the library's backward on PyTorch tensors.
std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& o,
    const at::Tensor& lse, const at::Tensor& dout, const at::Tensor* segment_ids, bool causal,
    int64_t window, double scale, bool deterministic, attention::Impl impl,
    const attention::KernelConfig* config) {
  const TorchCall call(q);
  const Inputs in = borrow_tensors(q, k, v, segment_ids, causal, window, scale, deterministic);
  BackwardInputs extra = borrow_backward_inputs(impl, view(q), view(o), view(lse), view(dout));
  attention::Gradients g = run_backward(impl, in, std::move(extra), config);
  return {call.hand_over(std::move(g.dq)), call.hand_over(std::move(g.dk)),
          call.hand_over(std::move(g.dv))};
}

// ---------------------------------------------------------------- the ops (torch.compile)

// The library's errors as PyTorch's, which its Python layer raises as TypeError, ValueError and
// torch.OutOfMemoryError with the same message.
template <class Body>
auto torch_errors(Body&& body) {
  try {
    return body();
  } catch (const ArgumentTypeError& e) {
    C10_THROW_ERROR(TypeError, e.what());
  } catch (const OutOfMemory& e) {
    C10_THROW_ERROR(OutOfMemoryError, e.what());
  } catch (const Error& e) {
    C10_THROW_ERROR(ValueError, e.what());
  }
}

const at::Tensor* optional_tensor(const std::optional<at::Tensor>& t) {
  return t.has_value() ? &*t : nullptr;
}

// flashtrain::attention_forward's kernel, CPU and CUDA. deterministic is the backward's: the
// forward carries it to the autograd formula (python/flashtrain/torch.py).
std::tuple<at::Tensor, at::Tensor> forward_op(const at::Tensor& q, const at::Tensor& k,
                                              const at::Tensor& v,
                                              const std::optional<at::Tensor>& segment_ids,
                                              bool causal, int64_t window, double scale,
                                              std::string_view impl, std::string_view config,
                                              bool /*deterministic*/) {
  return torch_errors([&] {
    return forward(q, k, v, optional_tensor(segment_ids), causal, window, scale,
                   attention::parse_impl(std::string(impl)), kernel_config(config));
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_op(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& o,
    const at::Tensor& lse, const at::Tensor& dout, const std::optional<at::Tensor>& segment_ids,
    bool causal, int64_t window, double scale, std::string_view impl, std::string_view config,
    bool deterministic) {
  return torch_errors([&] {
    return backward(q, k, v, o, lse, dout, optional_tensor(segment_ids), causal, window, scale,
                    deterministic, attention::parse_impl(std::string(impl)), kernel_config(config));
  });
}

// ---------------------------------------------------------------- the Python functions

// A Python exception is already set (PyErr_*): the function returns null.
struct PythonError {};

// The GIL released for a scope; taken back when the scope ends, an exception included.
class GilRelease {
 public:
  GilRelease() : state_(PyEval_SaveThread()) {}
  ~GilRelease() { PyEval_RestoreThread(state_); }
  GilRelease(const GilRelease&) = delete;
  GilRelease& operator=(const GilRelease&) = delete;

 private:
  PyThreadState* state_;
};

// The body's result, or null with a Python exception set: TypeError for ArgumentTypeError,
// MemoryError for OutOfMemory, ValueError for any other ft::Error (the nanobind module's
// mapping), RuntimeError for PyTorch's own errors.
template <class Body>
PyObject* python_errors(Body&& body) {
  try {
    return body();
  } catch (const PythonError&) {
  } catch (const ArgumentTypeError& e) {
    PyErr_SetString(PyExc_TypeError, e.what());
  } catch (const OutOfMemory& e) {
    PyErr_SetString(PyExc_MemoryError, e.what());
  } catch (const Error& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

void expect_args(const char* function, Py_ssize_t nargs, Py_ssize_t expected) {
  if (nargs != expected) {
    throw ArgumentTypeError(str("attention: _torch_ext.", function, " takes ", expected,
                                " positional arguments, got ", nargs));
  }
}

const at::Tensor& tensor_arg(PyObject* obj, const char* name) {
  if (!THPVariable_Check(obj)) {
    throw ArgumentTypeError(
        str("attention: ", name, " is a ", Py_TYPE(obj)->tp_name, ", not a torch.Tensor"));
  }
  return THPVariable_Unpack(obj);
}

const at::Tensor* optional_tensor_arg(PyObject* obj, const char* name) {
  return obj == Py_None ? nullptr : &tensor_arg(obj, name);
}

bool bool_arg(PyObject* obj, const char* name) {
  if (obj != Py_True && obj != Py_False) {
    throw ArgumentTypeError(
        str("attention: ", name, " must be a bool, got a ", Py_TYPE(obj)->tp_name));
  }
  return obj == Py_True;
}

int64_t int_arg(PyObject* obj, const char* name) {
  if (!PyLong_Check(obj) || PyBool_Check(obj)) {
    throw ArgumentTypeError(
        str("attention: ", name, " must be an int, got a ", Py_TYPE(obj)->tp_name));
  }
  const long long value = PyLong_AsLongLong(obj);
  if (value == -1 && PyErr_Occurred()) throw PythonError{};
  return value;
}

double float_arg(PyObject* obj) {
  const double value = PyFloat_AsDouble(obj);
  if (value == -1.0 && PyErr_Occurred()) throw PythonError{};
  return value;
}

std::string_view text_arg(PyObject* obj, const char* name) {
  if (!PyUnicode_Check(obj)) {
    throw ArgumentTypeError(
        str("attention: ", name, " must be a str, got a ", Py_TYPE(obj)->tp_name));
  }
  Py_ssize_t size = 0;
  const char* text = PyUnicode_AsUTF8AndSize(obj, &size);
  if (text == nullptr) throw PythonError{};
  return {text, static_cast<size_t>(size)};
}

// None (the device's default), a configuration's text, or any object whose str() is one (the
// nanobind module's KernelConfig).
const attention::KernelConfig* config_arg(PyObject* obj) {
  if (obj == Py_None) return nullptr;
  if (PyUnicode_Check(obj)) return kernel_config(text_arg(obj, "config"));
  PyObject* text = PyObject_Str(obj);
  if (text == nullptr) throw PythonError{};
  try {
    const attention::KernelConfig* config = kernel_config(text_arg(text, "config"));
    Py_DECREF(text);
    return config;
  } catch (...) {
    Py_DECREF(text);
    throw;
  }
}

// A tuple of the tensors, each wrapped as a Python tensor.
template <class... Tensors>
PyObject* wrap_tuple(Tensors&&... tensors) {
  PyObject* items[] = {THPVariable_Wrap(std::move(tensors))...};
  PyObject* tuple = PyTuple_New(sizeof...(Tensors));
  for (size_t i = 0; i < sizeof...(Tensors); ++i) {
    if (items[i] == nullptr || tuple == nullptr) {
      for (PyObject* item : items) Py_XDECREF(item);
      Py_XDECREF(tuple);
      throw PythonError{};
    }
  }
  for (size_t i = 0; i < sizeof...(Tensors); ++i) PyTuple_SET_ITEM(tuple, i, items[i]);
  return tuple;
}

// forward(q, k, v, segment_ids, causal, window, scale, impl, config) -> (o, lse)
PyObject* py_forward(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  return python_errors([&] {
    expect_args("forward", nargs, 9);
    const at::Tensor& q = tensor_arg(args[0], "q");
    const at::Tensor& k = tensor_arg(args[1], "k");
    const at::Tensor& v = tensor_arg(args[2], "v");
    const at::Tensor* segment_ids = optional_tensor_arg(args[3], "segment_ids");
    const bool causal = bool_arg(args[4], "causal");
    const int64_t window = int_arg(args[5], "window");
    const double scale = float_arg(args[6]);
    const attention::Impl impl = attention::parse_impl(std::string(text_arg(args[7], "impl")));
    const attention::KernelConfig* config = config_arg(args[8]);
    std::tuple<at::Tensor, at::Tensor> out;
    {
      const GilRelease release;
      out = forward(q, k, v, segment_ids, causal, window, scale, impl, config);
    }
    return wrap_tuple(std::move(std::get<0>(out)), std::move(std::get<1>(out)));
  });
}

// backward(q, k, v, o, lse, do, segment_ids, causal, window, scale, deterministic, impl, config)
// -> (dq, dk, dv)
PyObject* py_backward(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  return python_errors([&] {
    expect_args("backward", nargs, 13);
    const at::Tensor& q = tensor_arg(args[0], "q");
    const at::Tensor& k = tensor_arg(args[1], "k");
    const at::Tensor& v = tensor_arg(args[2], "v");
    const at::Tensor& o = tensor_arg(args[3], "o");
    const at::Tensor& lse = tensor_arg(args[4], "lse");
    const at::Tensor& dout = tensor_arg(args[5], "do");
    const at::Tensor* segment_ids = optional_tensor_arg(args[6], "segment_ids");
    const bool causal = bool_arg(args[7], "causal");
    const int64_t window = int_arg(args[8], "window");
    const double scale = float_arg(args[9]);
    const bool deterministic = bool_arg(args[10], "deterministic");
    const attention::Impl impl = attention::parse_impl(std::string(text_arg(args[11], "impl")));
    const attention::KernelConfig* config = config_arg(args[12]);
    std::tuple<at::Tensor, at::Tensor, at::Tensor> g;
    {
      const GilRelease release;
      g = backward(q, k, v, o, lse, dout, segment_ids, causal, window, scale, deterministic, impl,
                   config);
    }
    return wrap_tuple(std::move(std::get<0>(g)), std::move(std::get<1>(g)),
                      std::move(std::get<2>(g)));
  });
}

// The ops' schemas: those torch.library.custom_op infers from python/flashtrain/torch.py's
// annotations (int is SymInt there), so that either registration serves the same callers.
constexpr const char* kForwardSchema =
    "attention_forward(Tensor q, Tensor k, Tensor v, Tensor? segment_ids, bool causal, "
    "SymInt window, float scale, str impl, str config, bool deterministic) -> (Tensor, Tensor)";
constexpr const char* kBackwardSchema =
    "attention_backward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor do, "
    "Tensor? segment_ids, bool causal, SymInt window, float scale, str impl, str config, "
    "bool deterministic) -> (Tensor, Tensor, Tensor)";

// register_ops() -> None: defines flashtrain::attention_forward and attention_backward with the
// functions above as their CPU (and CUDA) kernels; python/flashtrain/torch.py adds the fake
// implementations and the autograd formula. A call, not TORCH_LIBRARY's static registration:
// loading the module then registers nothing, so that a process whose ops are already the Python
// custom ops (the DLPack route, chosen first) can still load it, and an error (the ops defined
// already) is a Python exception rather than a failure inside the loader. The library lives as
// long as the process (the registration goes when it is destroyed).
PyObject* py_register_ops(PyObject* /*module*/, PyObject* const* /*args*/, Py_ssize_t nargs) {
  return python_errors([&]() -> PyObject* {
    expect_args("register_ops", nargs, 0);
    static torch::Library* library = nullptr;
    if (library == nullptr) {
      auto* lib =
          new torch::Library(torch::Library::DEF, "flashtrain", std::nullopt, __FILE__, __LINE__);
      try {
        lib->set_python_module("flashtrain.torch");
        lib->def(kForwardSchema);
        lib->def(kBackwardSchema);
        lib->impl("attention_forward",
                  torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(forward_op)));
        lib->impl("attention_backward",
                  torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(backward_op)));
#ifdef FLASHTRAIN_TORCH_CUDA
        lib->impl("attention_forward",
                  torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(forward_op)));
        lib->impl("attention_backward",
                  torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(backward_op)));
#endif
      } catch (...) {
        delete lib;
        throw;
      }
      library = lib;
    }
    Py_RETURN_NONE;
  });
}

PyObject* py_built_with_cuda(PyObject* /*module*/, PyObject* const* /*args*/, Py_ssize_t nargs) {
  return python_errors([&] {
    expect_args("built_with_cuda", nargs, 0);
#ifdef FLASHTRAIN_TORCH_CUDA
    Py_RETURN_TRUE;
#else
    Py_RETURN_FALSE;
#endif
  });
}

// _memory_stats(device) -> (used, peak used, peak reserved): the library's memory counters on
// "cpu" or "cuda", as the nanobind module's function of the same name reads them: both modules
// load one libflashtrain_core.so, so the two agree (tests/python/test_shared_core.py).
PyObject* py_memory_stats(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  return python_errors([&] {
    expect_args("_memory_stats", nargs, 1);
    const MemoryStats s = memory_stats(parse_device(std::string(text_arg(args[0], "device"))));
    return Py_BuildValue("(LLL)", static_cast<long long>(s.used_bytes),
                         static_cast<long long>(s.peak_used_bytes),
                         static_cast<long long>(s.peak_reserved_bytes));
  });
}

PyMethodDef methods[] = {
    {"forward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&py_forward)),
     METH_FASTCALL,
     "forward(q, k, v, segment_ids, causal, window, scale, impl, config) -> (o, lse): the "
     "library's forward on PyTorch tensors (positional; config None, its text or a KernelConfig); "
     "see flashtrain.attention.forward."},
    {"backward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&py_backward)),
     METH_FASTCALL,
     "backward(q, k, v, o, lse, do, segment_ids, causal, window, scale, deterministic, impl, "
     "config) -> (dq, dk, dv): the library's backward on PyTorch tensors; see "
     "flashtrain.attention.backward."},
    {"register_ops", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&py_register_ops)),
     METH_FASTCALL,
     "Defines the ops flashtrain::attention_forward and attention_backward with this module's "
     "kernels (once; python/flashtrain/torch.py calls it)."},
    {"built_with_cuda",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&py_built_with_cuda)),
     METH_FASTCALL, "True when CUDA tensors are served (the library and PyTorch have CUDA)."},
    {"_memory_stats", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&py_memory_stats)),
     METH_FASTCALL,
     "_memory_stats(device) -> (used, peak used, peak reserved) bytes of the library's memory on "
     "'cpu' or 'cuda': the counters the nanobind module's _memory_stats reads too."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT,
                          "_torch_ext",
                          "flashtrain's attention library on PyTorch tensors (at::Tensor)",
                          -1,
                          methods,
                          nullptr,
                          nullptr,
                          nullptr,
                          nullptr};

}  // namespace
}  // namespace ft::python

PyMODINIT_FUNC PyInit__torch_ext() {
  // PyTorch's Python layer first: THPVariable_Check reads the tensor type it sets up.
  PyObject* torch = PyImport_ImportModule("torch");
  if (torch == nullptr) return nullptr;
  Py_DECREF(torch);
  return PyModule_Create(&ft::python::module_def);
}
