// flashtrain._flashtrain: the attention API (src/attention/attention.h) on DLPack arrays. As thin
// as the CLI: it turns arrays into tensors, calls forward()/backward() and hands the results
// back; python/flashtrain/attention.py adds the keywords and the frameworks' conventions.
//
// Inputs (arrays or DLPack capsules) are borrowed without a copy (Tensor::wrap): they must be
// C-contiguous, and on the GPU 16-byte aligned (the kernels' vector loads). Outputs are the
// library's tensors, exported without a copy (as NumPy arrays made here, as objects with
// __dlpack__, or as DLPack capsules handed to the caller's framework here); each keeps its
// storage alive until the consumer drops it. On the
// GPU every launch, allocation and free goes on the caller's stream (cuda::StreamScope), and an
// output's memory goes back to the pool on the stream it was made on.
//
// bf16 arrives as DLPack bfloat16 (PyTorch, JAX, CuPy) or, where the framework has no bf16
// (NumPy), as uint16 holding the bit patterns; outputs come back in the same form as q.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attention/attention.h"
#include "attention/kernel_config.h"
#include "attention_call.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/tensor.h"

#ifdef FLASHTRAIN_WITH_CUDA
#include "core/cuda/runtime.h"
#endif

namespace nb = nanobind;

namespace ft::python {
namespace {

using Array = nb::ndarray<nb::ro>;  // any dtype, shape, strides and device
// The array as the shared call code (attention_call.h) reads it.
ArrayView view(const Array& a) {
  const nb::dlpack::dtype d = a.dtype();
  return ArrayView{
      a.data(),        a.ndim(),     a.shape_ptr(), a.stride_ptr(), {d.code, d.bits, d.lanes},
      a.device_type(), a.device_id()};
}

// The forms an output can be handed back in (python/flashtrain/attention.py picks one):
//   dlpack   an object with __dlpack__, for consumers that import it themselves (CuPy, JAX);
//   numpy    a NumPy array made here;
//   capsule  a DLPack capsule made here, turned into the framework's tensor by the caller's
//            `from_capsule` (PyTorch's torch._C._from_dlpack) in this call when one is given:
//            no wrapper object and no Python-level __dlpack__() call per output.
enum class Export : int { dlpack = 0, numpy = 1, capsule = 2 };

// None as a null object: what a Keeper holds may be released on a thread without the GIL, and a
// null object needs no reference count.
nb::object null_if_none(nb::object o) {
  return o.is_none() ? nb::object() : std::move(o);
}

// The stream and device a call runs on (the CPU needs neither), and the form its outputs take.
class CallContext {
 public:
  CallContext(const Array& q, uintptr_t stream, nb::object stream_owner, int export_form,
              nb::object from_capsule)
      : stream_(stream),
        stream_owner_(null_if_none(std::move(stream_owner))),
        from_capsule_(null_if_none(std::move(from_capsule))) {
    if (export_form < 0 || export_form > static_cast<int>(Export::capsule)) {
      throw nb::value_error(
          str("attention: export form ", export_form, " (allowed: 0, 1, 2)").c_str());
    }
    export_ = static_cast<Export>(export_form);
#ifndef FLASHTRAIN_WITH_CUDA
    (void)q;
#else
    if (q.device_type() == nb::device::cuda::value) {
      device_id_ = q.device_id();
      use_device(device_id_);
      scope_.emplace(reinterpret_cast<cudaStream_t>(stream));
    }
#endif
  }
  uintptr_t stream() const {
    return stream_;
  }
  const nb::object& stream_owner() const {
    return stream_owner_;
  }
  Export export_form() const {
    return export_;
  }
  // Export::capsule's converter, or a null object (the capsules themselves are returned).
  const nb::object& from_capsule() const {
    return from_capsule_;
  }
  // The GPU the call runs on (q's), where its outputs are.
  int device_id() const {
    return device_id_;
  }

 private:
  uintptr_t stream_;
  nb::object stream_owner_;
  nb::object from_capsule_;
  Export export_ = Export::dlpack;
  int device_id_ = 0;
#ifdef FLASHTRAIN_WITH_CUDA
  std::optional<cuda::StreamScope> scope_;
#endif
};

// Keeps an output's storage alive for its consumer; a GPU buffer goes back to the pool on the
// stream it was made on. That stream must outlive the buffer: `stream_owner` (the framework's
// stream object, e.g. CuPy's, which destroys its stream when collected) is held until the free.
struct Keeper {
  Tensor tensor;
  uintptr_t stream;
  // Null or the framework's stream object, released after the body below (the stream lives
  // until the free); releasing it needs the GIL.
  nb::object stream_owner;

  ~Keeper() { release_output(tensor, stream); }
};

// The DLPack dtype an output is handed back in: q's form for q-like outputs (bfloat16 or
// uint16), plain floats otherwise.
nb::dlpack::dtype export_dtype(DType dtype, nb::dlpack::dtype q_form) {
  switch (dtype) {
    case DType::f32:
      return nb::dtype<float>();
    case DType::f64:
      return nb::dtype<double>();
    case DType::i32:
      return nb::dtype<int32_t>();
    case DType::i16:
      return nb::dtype<int16_t>();
    case DType::bf16:
      return q_form;
  }
  return q_form;
}

template <typename Framework>
nb::object export_as(void* data, const std::vector<size_t>& shape, nb::capsule owner,
                     nb::dlpack::dtype dtype, int device_type, int device_id) {
  return nb::cast(nb::ndarray<Framework>(data, shape.size(), shape.data(), owner, nullptr, dtype,
                                         device_type, device_id));
}

// DLPack's DLManagedTensor (dlpack.h): the unversioned form that every consumer imports.
struct ManagedTensor {
  nb::dlpack::dltensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor*);
};

constexpr size_t kMaxExportRank = 4;  // o, dq, dk, dv [B, S, H, D]; lse [B, H, S]

// One output as a DLPack capsule, in one allocation: the managed tensor, its shape and strides,
// and the Keeper of its storage. The consumer calls the deleter when it drops the tensor.
struct CapsuleExport {
  ManagedTensor managed;
  int64_t shape[kMaxExportRank];
  int64_t strides[kMaxExportRank];
  Keeper keeper;

  static void deleter(ManagedTensor* m) {
    auto* self = static_cast<CapsuleExport*>(m->manager_ctx);
    if (!self->keeper.stream_owner.is_valid()) {
      delete self;  // no Python object: safe on any thread (PyTorch may free off the GIL)
      return;
    }
    nb::gil_scoped_acquire gil;
    delete self;
  }

  // A consumer that takes the tensor renames the capsule ("used_dltensor"); one never consumed
  // still owns it when collected.
  static void delete_unconsumed(PyObject* capsule) {
    if (PyCapsule_IsValid(capsule, "dltensor")) {
      auto* m = static_cast<ManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
      m->deleter(m);
    }
  }
};

nb::object export_capsule(Tensor tensor, nb::dlpack::dtype dtype, int device_type, int device_id,
                          const CallContext& call) {
  const size_t rank = tensor.shape().size();
  FT_CHECK(rank <= kMaxExportRank, "attention: an output of rank ", rank, " (at most ",
           kMaxExportRank, ")");
  auto* e =
      new CapsuleExport{{}, {}, {}, Keeper{std::move(tensor), call.stream(), call.stream_owner()}};
  int64_t stride = 1;
  for (size_t i = rank; i-- > 0;) {
    e->shape[i] = e->keeper.tensor.shape()[i];
    e->strides[i] = stride;
    stride *= e->shape[i];
  }
  nb::dlpack::dltensor& t = e->managed.dl_tensor;
  t.data = e->keeper.tensor.raw();
  t.device = {device_type, device_id};
  t.ndim = static_cast<int32_t>(rank);
  t.dtype = dtype;
  t.shape = e->shape;
  t.strides = e->strides;
  e->managed.manager_ctx = e;
  e->managed.deleter = &CapsuleExport::deleter;
  PyObject* capsule = PyCapsule_New(&e->managed, "dltensor", &CapsuleExport::delete_unconsumed);
  if (capsule == nullptr) {
    delete e;
    throw nb::python_error();
  }
  return nb::steal(capsule);
}

nb::object hand_back(Tensor tensor, nb::dlpack::dtype q_form, const CallContext& call) {
  const bool gpu = tensor.device() == Device::cuda;
  const int device_type = gpu ? nb::device::cuda::value : nb::device::cpu::value;
  const int device_id = gpu ? call.device_id() : 0;
  const nb::dlpack::dtype dtype = export_dtype(tensor.dtype(), q_form);
  if (call.export_form() == Export::capsule) {
    nb::object capsule = export_capsule(std::move(tensor), dtype, device_type, device_id, call);
    return call.from_capsule().is_valid() ? call.from_capsule()(capsule) : capsule;
  }
  std::vector<size_t> shape(tensor.shape().begin(), tensor.shape().end());
  void* data = tensor.raw();
  auto* keeper = new Keeper{std::move(tensor), call.stream(), call.stream_owner()};
  nb::capsule owner(keeper, [](void* p) noexcept { delete static_cast<Keeper*>(p); });
  if (call.export_form() == Export::numpy) {
    return export_as<nb::numpy>(data, shape, owner, dtype, device_type, device_id);
  }
  return export_as<nb::array_api>(data, shape, owner, dtype, device_type, device_id);
}

// The call's inputs borrowed and checked (attention_call.h); segment_ids: an invalid array for
// None.
Inputs borrow_inputs(const Array& q, const Array& k, const Array& v, const Array& segment_ids,
                     bool causal, int64_t window, double scale, bool deterministic) {
  const ArrayView segments = segment_ids.is_valid() ? view(segment_ids) : ArrayView{};
  return python::borrow_inputs(view(q), view(k), view(v),
                               segment_ids.is_valid() ? &segments : nullptr, causal, window, scale,
                               deterministic);
}

// How far a forward call goes: a call goes all the way; bench/python_attention.py's pieces stop
// earlier (_forward_probe), so that the host time of each stage says what it adds.
enum class Stage : int { arguments = 0, context = 1, inputs = 2, library = 3, all = 4 };

nb::object forward_until(Stage stop, const Array& q, const Array& k, const Array& v,
                         const Array& segment_ids, bool causal, int64_t window, double scale,
                         const std::string& impl_name, const attention::KernelConfig* config,
                         uintptr_t stream, nb::object stream_owner, int export_form,
                         nb::object from_capsule) {
  if (stop == Stage::arguments) return nb::none();
  const attention::Impl impl = attention::parse_impl(impl_name);
  const CallContext call(q, stream, std::move(stream_owner), export_form, std::move(from_capsule));
  if (stop == Stage::context) return nb::none();
  const Inputs in = borrow_inputs(q, k, v, segment_ids, causal, window, scale, false);
  if (stop == Stage::inputs) return nb::none();
  attention::ForwardOutput out;
  {
    nb::gil_scoped_release release;
    out = attention::forward(impl, in.problem, in.q, in.k, in.v, in.segment_ids, config);
  }
  if (stop == Stage::library) return nb::none();  // out is freed here, on the call's stream
  return nb::make_tuple(hand_back(std::move(out.o), q.dtype(), call),
                        hand_back(std::move(out.lse), q.dtype(), call));
}

nb::tuple forward(const Array& q, const Array& k, const Array& v, const Array& segment_ids,
                  bool causal, int64_t window, double scale, const std::string& impl_name,
                  const attention::KernelConfig* config, uintptr_t stream, nb::object stream_owner,
                  int export_form, nb::object from_capsule) {
  return nb::steal<nb::tuple>(forward_until(Stage::all, q, k, v, segment_ids, causal, window, scale,
                                            impl_name, config, stream, std::move(stream_owner),
                                            export_form, std::move(from_capsule))
                                  .release());
}

nb::object forward_probe(int stage, const Array& q, const Array& k, const Array& v,
                         const Array& segment_ids, bool causal, int64_t window, double scale,
                         const std::string& impl_name, const attention::KernelConfig* config,
                         uintptr_t stream, nb::object stream_owner, int export_form,
                         nb::object from_capsule) {
  if (stage < static_cast<int>(Stage::arguments) || stage > static_cast<int>(Stage::all)) {
    throw nb::value_error(str("attention: probe stage ", stage, " (allowed: 0 to 4)").c_str());
  }
  return forward_until(static_cast<Stage>(stage), q, k, v, segment_ids, causal, window, scale,
                       impl_name, config, stream, std::move(stream_owner), export_form,
                       std::move(from_capsule));
}

// The library's flash forward (the default configuration) called `calls` times back to back from
// C++, on a call's inputs and stream, each call's outputs freed before the next as the C++ bench
// (bench/bench_attention_gpu.cpp) frees them: the host microseconds per call that the binding
// adds to, measured in this process.
double forward_loop(const Array& q, const Array& k, const Array& v, bool causal, uintptr_t stream,
                    int calls) {
  if (calls < 1) throw nb::value_error(str("attention: calls ", calls, " (allowed: >= 1)").c_str());
  const CallContext call(q, stream, nb::object(), static_cast<int>(Export::capsule), nb::object());
  const Inputs in = borrow_inputs(q, k, v, Array(), causal, 0, 0.0, false);
  nb::gil_scoped_release release;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) {
    (void)attention::forward(attention::Impl::flash, in.problem, in.q, in.k, in.v);
  }
  const std::chrono::duration<double, std::micro> elapsed =
      std::chrono::steady_clock::now() - start;
  return elapsed.count() / calls;
}

nb::tuple backward(const Array& q, const Array& k, const Array& v, const Array& o, const Array& lse,
                   const Array& dout, const Array& segment_ids, bool causal, int64_t window,
                   double scale, bool deterministic, const std::string& impl_name,
                   const attention::KernelConfig* config, uintptr_t stream, nb::object stream_owner,
                   int export_form, nb::object from_capsule) {
  const attention::Impl impl = attention::parse_impl(impl_name);
  const CallContext call(q, stream, std::move(stream_owner), export_form, std::move(from_capsule));
  const Inputs in = borrow_inputs(q, k, v, segment_ids, causal, window, scale, deterministic);
  BackwardInputs extra = borrow_backward_inputs(impl, view(q), view(o), view(lse), view(dout));
  attention::Gradients g;
  {
    nb::gil_scoped_release release;
    g = run_backward(impl, in, std::move(extra), config);
  }
  return nb::make_tuple(hand_back(std::move(g.dq), q.dtype(), call),
                        hand_back(std::move(g.dk), q.dtype(), call),
                        hand_back(std::move(g.dv), q.dtype(), call));
}

}  // namespace
}  // namespace ft::python

NB_MODULE(_flashtrain, m) {
  using namespace ft;
  using ft::attention::KernelConfig;
  m.doc() = "flashtrain's attention library (src/attention/attention.h) on DLPack arrays";

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const OutOfMemory& e) {
      PyErr_SetString(PyExc_MemoryError, e.what());
    } catch (const python::ArgumentTypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  nb::class_<KernelConfig>(m, "KernelConfig",
                           "Tiles and paths of the CUDA flash kernels (kernel_config.h), written "
                           "as 'fwd=128x64/128 bwd=64x64/128/double'.")
      .def(nb::init<>())
      .def_static(
          "parse", [](const std::string& text) { return KernelConfig::parse(text); },
          nb::arg("text"), "Parses the text form; a part left out keeps the default.")
      .def("__str__", &KernelConfig::str)
      .def("__repr__", [](const KernelConfig& c) { return "KernelConfig('" + c.str() + "')"; })
      .def("__eq__", [](const KernelConfig& a, const KernelConfig& b) { return a == b; })
      .def("__hash__", [](const KernelConfig& c) { return std::hash<std::string>()(c.str()); });

  m.def(
      "built_with_cuda", [] { return cuda_training_supported(); },
      "True when the module was built with the CUDA kernels.");
  m.def("cuda_device_count", &cuda_device_count);
  m.def(
      "synchronize_stream",
      [](uintptr_t stream) {
        nb::gil_scoped_release release;
        python::synchronize_stream(stream);
      },
      nb::arg("stream"), "Waits for the work queued on a cudaStream_t handle (CPU: nothing).");

  m.def(
      "_memory_stats",
      [](const std::string& device) {
        const MemoryStats s = memory_stats(parse_device(device));
        return nb::make_tuple(s.used_bytes, s.peak_used_bytes, s.peak_reserved_bytes);
      },
      nb::arg("device"),
      "(used, peak used, peak reserved) bytes of the library's memory on 'cpu' or 'cuda': the "
      "counters of libflashtrain_core.so, which _torch_ext reads too (tests/python).");

  m.def("forward", &python::forward, nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("segment_ids").none(), nb::arg("causal"), nb::arg("window"), nb::arg("scale"),
        nb::arg("impl"), nb::arg("config").none(), nb::arg("stream"),
        nb::arg("stream_owner").none(), nb::arg("export_form"), nb::arg("from_capsule").none(),
        "(o, lse): the library's forward; see flashtrain.attention.forward. stream_owner: held "
        "until the outputs are freed on `stream`; export_form: 0 DLPack object, 1 NumPy, 2 "
        "DLPack capsule, passed through from_capsule (e.g. torch._C._from_dlpack) unless None.");
  m.def("_forward_probe", &python::forward_probe, nb::arg("stage"), nb::arg("q"), nb::arg("k"),
        nb::arg("v"), nb::arg("segment_ids").none(), nb::arg("causal"), nb::arg("window"),
        nb::arg("scale"), nb::arg("impl"), nb::arg("config").none(), nb::arg("stream"),
        nb::arg("stream_owner").none(), nb::arg("export_form"), nb::arg("from_capsule").none(),
        "forward's stages up to `stage` (0: the arguments converted, 1: + the device and stream "
        "set, 2: + the inputs wrapped and checked, 3: + the library's forward, its outputs freed; "
        "4: forward itself), for bench/python_attention.py's pieces; None before 4.");
  m.def(
      "_forward_loop", &python::forward_loop, nb::arg("q"), nb::arg("k"), nb::arg("v"),
      nb::arg("causal"), nb::arg("stream"), nb::arg("calls"),
      "Host microseconds per call of `calls` back-to-back flash forwards called from C++ on "
      "these inputs and stream (the floor of forward's host time), for bench/python_attention.py.");
  m.def("backward", &python::backward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"),
        nb::arg("lse"), nb::arg("do"), nb::arg("segment_ids").none(), nb::arg("causal"),
        nb::arg("window"), nb::arg("scale"), nb::arg("deterministic"), nb::arg("impl"),
        nb::arg("config").none(), nb::arg("stream"), nb::arg("stream_owner").none(),
        nb::arg("export_form"), nb::arg("from_capsule").none(),
        "(dq, dk, dv): the library's backward; see flashtrain.attention.backward. The other "
        "arguments as forward's.");
}
