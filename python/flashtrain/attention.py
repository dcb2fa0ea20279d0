"""Our attention kernels on DLPack arrays: ``forward`` and ``backward``.

Layout (src/attention/attention.h): q ``[B, S, Hq, D]``, k and v ``[B, S, Hkv, D]`` with
``Hq % Hkv == 0`` (query head h reads kv head ``h // (Hq // Hkv)``); o like q; lse
``[B, Hq, S]`` float32, the natural-log sum of each query row's scaled exponentiated scores.

Masks combine: ``causal`` (key <= query), ``window=W`` (key >= query - W + 1; with causal the
last W keys including the query itself), ``segment_ids`` int32 ``[B, S]`` (attend only within
one id; -1 is padding: zero output, lse -inf, zero gradient).

Arrays: NumPy on the CPU; PyTorch, CuPy, JAX (anything with ``__dlpack__``) on the CPU or the
GPU. Inputs are read in place (no copy) and must be C-contiguous; outputs come back as arrays
of q's framework, again without a copy. dtypes: float32, bf16 and (CPU, or ``impl="reference"``)
float64. NumPy has no bf16: pass uint16 arrays holding the bf16 bit patterns (what
``flashtrain attention`` reads from .npy files), or ``ml_dtypes.bfloat16`` arrays; outputs come
back in the same form.

On the GPU the work runs on the caller's current stream: PyTorch's
``torch.cuda.current_stream()``, CuPy's ``cupy.cuda.get_current_stream()``; for other
frameworks (JAX) the legacy default stream, or the ``stream=`` handle given. PyTorch tensors on
its current stream go to ``flashtrain._torch_ext`` where the package was built with it, against
the PyTorch that runs (it reads them as ``at::Tensor`` and hands its outputs back as tensors, no
conversion); otherwise (or with ``FLASHTRAIN_TORCH_EXT=0`` in the environment) they are handed
over as DLPack capsules (``torch.utils.dlpack.to_dlpack``: the producer's stream is ours, so
there is nothing to order) and the module turns its outputs into tensors itself
(``torch._C._from_dlpack`` on capsules it makes). Every other input is taken through
``__dlpack__(stream=...)``, so the producer orders its pending work before ours. The outputs
are ready on that stream, and their memory goes back to flashtrain's pool on it when they are
dropped: a CuPy stream object is kept alive until then; a ``stream=`` handle must outlive the
outputs.
"""

import operator
import os
import sys
import warnings

from . import _flashtrain as _ext

KernelConfig = _ext.KernelConfig
built_with_cuda = _ext.built_with_cuda

_IMPLS = ("flash", "naive", "reference")
_DLPACK_CPU, _DLPACK_CUDA = 1, 2
# How the module hands outputs back (python/src/module.cpp, Export).
_EXPORT_DLPACK, _EXPORT_NUMPY, _EXPORT_CAPSULE = 0, 1, 2

__all__ = ["forward", "backward", "KernelConfig", "built_with_cuda"]


def forward(q, k, v, *, causal=False, window=0, segment_ids=None, scale=None, impl="flash",
            config=None, stream=None):
    """Attention forward: returns ``(o, lse)``.

    causal: keys after the query are hidden. window: 0 for none, W > 0 keeps keys
    ``>= query - W + 1``. segment_ids: int32 ``[B, S]`` or None. scale: None for
    ``1 / sqrt(D)``. impl: ``"flash"`` (ours), ``"naive"`` (GEMM + softmax + GEMM) or
    ``"reference"`` (fp64, CPU; its outputs are float64). config: a ``KernelConfig`` or its text
    (``"fwd=128x64/128 bwd=64x64/128/double"``) for the CUDA bf16 kernels; None for the
    device's default. stream: a ``cudaStream_t`` handle (int) overriding the caller's current
    stream.

    Raises TypeError for a wrong dtype, ValueError for a wrong rank, shape, head count, mask,
    non-contiguous input or a kernel configuration the device cannot run.
    """
    torch = _torch
    if (torch is not None and stream is None and segment_ids is None and scale is None
            and config is None and type(causal) is bool and type(window) is int
            and impl in _IMPLS):
        # The common call, PyTorch tensors with plain keywords, with nothing left to check here:
        # straight to the route's module call.
        tensor = torch.tensor
        if isinstance(q, tensor) and isinstance(k, tensor) and isinstance(v, tensor):
            return torch.call_forward(q, k, v, None, causal, window, 0.0, impl, None)
    settings = _settings(causal, window, scale, impl, config)
    torch_route = _torch_route(q, k, v, segment_ids, stream)
    if torch_route is not None:
        return torch_route.forward(q, k, v, segment_ids, settings)
    call = _Call(q, stream)
    o, lse = _ext.forward(call.take("q", q), call.take("k", k), call.take("v", v),
                          call.take_segments(segment_ids), *settings, call.stream,
                          call.stream_owner, call.export, None)
    call.done()
    return call.give(o), call.give(lse, like_q=False)


def backward(q, k, v, o, lse, do, *, causal=False, window=0, segment_ids=None, scale=None,
             impl="flash", config=None, stream=None, deterministic=False):
    """Attention backward: returns ``(dq, dk, dv)`` (like q, k, v; dk and dv sum over the query
    heads that share a kv head).

    o and lse are forward's outputs for the same inputs and keywords; do is the gradient of o.
    ``impl="naive"`` recomputes its forward (its saved probabilities are not handed out);
    ``impl="reference"`` recomputes everything in fp64. deterministic: the same inputs give
    bit-identical gradients on every call (on the GPU in bf16 the tma backward orders its dQ
    sums, at a cost; a configuration that cannot is a ValueError with the reason; the CPU and
    fp32 paths always are). Raises as ``forward`` does.
    """
    torch = _torch
    if (torch is not None and stream is None and segment_ids is None and scale is None
            and config is None and type(causal) is bool and type(window) is int
            and impl in _IMPLS and type(deterministic) is bool):
        tensor = torch.tensor  # as in forward: the common call straight to the module
        if (isinstance(q, tensor) and isinstance(k, tensor) and isinstance(v, tensor)
                and isinstance(o, tensor) and isinstance(lse, tensor) and isinstance(do, tensor)):
            return torch.call_backward(q, k, v, o, lse, do, None, causal, window, 0.0,
                                       deterministic, impl, None)
    settings = _settings(causal, window, scale, impl, config)
    if not isinstance(deterministic, bool):
        raise TypeError(f"attention: deterministic must be a bool, got {deterministic!r}")
    torch_route = _torch_route(q, k, v, segment_ids, stream, o, lse, do)
    if torch_route is not None:
        return torch_route.backward(q, k, v, o, lse, do, segment_ids, settings, deterministic)
    call = _Call(q, stream)
    causal, window, scale, impl, config = settings
    dq, dk, dv = _ext.backward(call.take("q", q), call.take("k", k), call.take("v", v),
                               call.take("o", o), call.take("lse", lse), call.take("do", do),
                               call.take_segments(segment_ids), causal, window, scale,
                               deterministic, impl, config, call.stream, call.stream_owner,
                               call.export, None)
    call.done()
    return call.give(dq), call.give(dk), call.give(dv)


def _settings(causal, window, scale, impl, config):
    """The keywords as the module takes them, checked: (causal, window, scale, impl, config).
    The module checks the rest (the window's sign, shapes, dtypes), each rule in one place."""
    if type(causal) is not bool:
        raise TypeError(f"attention: causal must be a bool, got {causal!r}")
    if type(window) is not int:  # a NumPy integer is fine; a bool or a float is not
        if isinstance(window, bool):
            raise TypeError(f"attention: window must be an int, got {window!r}")
        try:
            window = operator.index(window)
        except TypeError:
            raise TypeError(f"attention: window must be an int, got {window!r}") from None
    if scale is None:
        scale = 0.0  # the library's "1 / sqrt(D)"
    else:
        scale = float(scale)
        if scale == 0.0:
            raise ValueError("attention: scale must be nonzero (None means 1 / sqrt(D))")
    if impl not in _IMPLS:
        raise ValueError(f"attention: impl must be one of {', '.join(_IMPLS)}, got {impl!r}")
    return causal, window, scale, impl, _config(config)


def _framework(x):
    """'numpy', 'torch', 'cupy', 'jax' or None (another DLPack producer) for an array."""
    root = type(x).__module__.split(".")[0]
    if root in ("numpy", "torch", "cupy"):
        return root
    if root in ("jax", "jaxlib"):
        return "jax"
    return None


def _dlpack_device(name, x):
    if not hasattr(x, "__dlpack_device__"):
        raise TypeError(f"attention: {name} is a {type(x).__name__}, not an array "
                        "(expected a NumPy, PyTorch, CuPy or JAX array: anything with __dlpack__)")
    device_type, device_id = x.__dlpack_device__()
    return int(device_type), int(device_id)


_parsed_configs = {}  # config text -> KernelConfig, so that a call does not parse it again


def _config(config):
    if config is None or isinstance(config, KernelConfig):
        return config
    if isinstance(config, str):
        parsed = _parsed_configs.get(config)
        if parsed is None:
            parsed = _parsed_configs.setdefault(config, KernelConfig.parse(config))
        return parsed
    raise TypeError("attention: config must be a KernelConfig, its text or None, "
                    f"got {type(config).__name__}")


class _Torch:
    """The route of PyTorch tensors on PyTorch's current stream through the nanobind module,
    with its handles looked up once: the inputs go to the module as DLPack capsules
    (``torch.utils.dlpack.to_dlpack``, which takes a tensor that requires grad as it is: no
    detach), the module makes the outputs into tensors (``torch._C._from_dlpack`` on capsules it
    makes), and the stream is the raw current one.

    Both routes (this and _TorchExtension) offer the same calls: ``call_forward(q, k, v,
    segment_ids, causal, window, scale, impl, config) -> (o, lse)`` and ``call_backward(q, k, v,
    o, lse, do, segment_ids, causal, window, scale, deterministic, impl, config) -> (dq, dk,
    dv)``, positional, on settings checked already; ``forward``/``backward`` take the settings
    as _settings returns them."""

    extension = None  # flashtrain._torch_ext where it is the route

    def __init__(self, torch):
        self.tensor = torch.Tensor
        self.to_capsule = torch.utils.dlpack.to_dlpack
        self.from_capsule = getattr(torch._C, "_from_dlpack", torch.utils.dlpack.from_dlpack)
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is None:  # a PyTorch without the raw query: the public, slower one
            def raw(index):
                return torch.cuda.current_stream(index).cuda_stream
        self.current_stream = raw

    def call_forward(self, q, k, v, segment_ids, causal, window, scale, impl, config):
        to = self.to_capsule
        return _ext.forward(to(q), to(k), to(v), None if segment_ids is None else to(segment_ids),
                            causal, window, scale, impl, config,
                            self.current_stream(q.get_device()) if q.is_cuda else 0, None,
                            _EXPORT_CAPSULE, self.from_capsule)

    def call_backward(self, q, k, v, o, lse, do, segment_ids, causal, window, scale,
                      deterministic, impl, config):
        to = self.to_capsule
        return _ext.backward(to(q), to(k), to(v), to(o), to(lse), to(do),
                             None if segment_ids is None else to(segment_ids), causal, window,
                             scale, deterministic, impl, config,
                             self.current_stream(q.get_device()) if q.is_cuda else 0, None,
                             _EXPORT_CAPSULE, self.from_capsule)

    def forward(self, q, k, v, segment_ids, settings):
        """(o, lse) for settings checked by _settings."""
        return self.call_forward(q, k, v, segment_ids, *settings)

    def backward(self, q, k, v, o, lse, do, segment_ids, settings, deterministic):
        """(dq, dk, dv) for settings checked by _settings and a bool deterministic."""
        causal, window, scale, impl, config = settings
        return self.call_backward(q, k, v, o, lse, do, segment_ids, causal, window, scale,
                                  deterministic, impl, config)


class _TorchExtension(_Torch):
    """The route of PyTorch tensors through flashtrain._torch_ext (python/src/torch_ext.cpp),
    which reads them as at::Tensor and returns tensors: no DLPack conversion either way, and the
    current stream read in C++. Its calls are the extension's functions themselves (same
    positional arguments as _Torch's; config None, its text or a KernelConfig)."""

    def __init__(self, torch, extension):
        super().__init__(torch)  # the handles serve the general route's mixed calls (_Call)
        self.extension = extension
        self.call_forward = extension.forward
        self.call_backward = extension.backward


_torch = None  # _Torch or _TorchExtension once a call has met PyTorch (or flashtrain.torch is
# imported)


def _torch_extension(torch):
    """flashtrain._torch_ext when it can serve this process, else None: not built (no PyTorch at
    build time, FLASHTRAIN_TORCH=OFF), turned off (FLASHTRAIN_TORCH_EXT=0), or built against
    another PyTorch than the one imported (its C++ ABI is that version's), or for another Python."""
    if os.environ.get("FLASHTRAIN_TORCH_EXT", "1") == "0":
        return None
    try:
        from . import _torch_build
    except ImportError:
        return None
    if _torch_build.TORCH_VERSION != str(torch.__version__):
        warnings.warn(f"flashtrain: the PyTorch extension was built against torch "
                      f"{_torch_build.TORCH_VERSION}, this is {torch.__version__}: PyTorch "
                      "tensors take the DLPack route (reinstall flashtrain to build it again)",
                      RuntimeWarning, stacklevel=3)
        return None
    try:
        from . import _torch_ext
    except ImportError as e:
        warnings.warn(f"flashtrain: the PyTorch extension does not load ({e}): PyTorch tensors "
                      "take the DLPack route", RuntimeWarning, stacklevel=3)
        return None
    return _torch_ext


def _torch_handles():
    global _torch
    if _torch is None:
        torch = sys.modules["torch"]
        extension = _torch_extension(torch)
        _torch = _Torch(torch) if extension is None else _TorchExtension(torch, extension)
    return _torch


def _torch_route(q, k, v, segment_ids, stream, *others):
    """_Torch when every array of the call is a PyTorch tensor and no stream= handle is given
    (PyTorch's current stream), else None (the general route, _Call)."""
    if stream is not None or "torch" not in sys.modules:
        return None
    torch = _torch_handles()
    tensor = torch.tensor
    if not (isinstance(q, tensor) and isinstance(k, tensor) and isinstance(v, tensor)):
        return None
    if segment_ids is not None and not isinstance(segment_ids, tensor):
        return None
    for x in others:
        if not isinstance(x, tensor):
            return None
    return torch


class _Call:
    """How one call of the general route (NumPy, CuPy, JAX, other producers, a stream= handle)
    hands its inputs to the module and its outputs back."""

    def __init__(self, q, stream):
        self.framework = _framework(q)
        if self.framework == "torch" and isinstance(q, sys.modules["torch"].Tensor):
            self.cuda = q.is_cuda
            self.device_id = q.get_device() if self.cuda else 0
        else:
            device_type, self.device_id = _dlpack_device("q", q)
            self.cuda = device_type == _DLPACK_CUDA
        self.explicit_stream = stream is not None
        self.stream_owner = None
        self.stream = self._stream(stream) if self.cuda else 0
        self.export = _EXPORT_NUMPY if self.framework == "numpy" else _EXPORT_DLPACK
        self.bf16_type = None  # ml_dtypes.bfloat16 when q is such a NumPy array

    def _stream(self, stream):
        if stream is not None:
            return int(stream)
        if self.framework == "torch":  # a PyTorch tensor beside other arrays
            return _torch_handles().current_stream(self.device_id)
        if self.framework == "cupy":
            import cupy
            # Held by the outputs: CuPy destroys a stream when its object is collected, and the
            # outputs' memory goes back to the pool on this stream when they are dropped.
            self.stream_owner = cupy.cuda.get_current_stream()
            return self.stream_owner.ptr
        return 0  # the legacy default stream

    def take(self, name, x):
        """What the module reads for array x: the array itself on the CPU, a DLPack capsule made
        ready on our stream on the GPU."""
        if _framework(x) == "torch":
            x = x.detach()  # an autograd tensor refuses __dlpack__; the values are the same
        if self.framework == "numpy":
            dtype = getattr(x, "dtype", None)
            # kind first: NumPy builds dtype.name anew on each access (microseconds).
            if dtype is not None and dtype.kind == "V" and dtype.name == "bfloat16":
                self.bf16_type = self.bf16_type or dtype
                x = x.view("uint16")
        device_type, _ = _dlpack_device(name, x)
        if device_type != _DLPACK_CUDA:
            return x
        # DLPack names the legacy default stream 1 (0 is ambiguous and not allowed).
        return x.__dlpack__(stream=self.stream or 1)

    def take_segments(self, segment_ids):
        return None if segment_ids is None else self.take("segment_ids", segment_ids)

    def done(self):
        """A consumer whose stream we cannot name (JAX) gets finished outputs."""
        if self.cuda and self.framework not in ("torch", "cupy") and not self.explicit_stream:
            _ext.synchronize_stream(self.stream)

    def give(self, out, like_q=True):
        """The module's output as an array of q's framework (no copy)."""
        if self.export == _EXPORT_NUMPY:  # made in the module
            if like_q and self.bf16_type is not None and out.dtype.name == "uint16":
                return out.view(self.bf16_type)
            return out
        if self.framework == "torch":
            # The capsule, not the object: torch.from_dlpack(object) asks it for a capsule on
            # PyTorch's current stream, a protocol call that costs ~10 us; the outputs are ready
            # on the call's stream already.
            return _torch_handles().from_capsule(out.__dlpack__())
        if self.framework == "cupy":
            import cupy
            return cupy.from_dlpack(out)
        if self.framework == "jax":
            import jax
            return jax.dlpack.from_dlpack(out)
        return out
