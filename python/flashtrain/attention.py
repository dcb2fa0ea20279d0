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
its current stream are handed over as DLPack capsules (``torch.utils.dlpack.to_dlpack``: the
producer's stream is ours, so there is nothing to order) and the outputs come back through
capsules too; every other input is taken through ``__dlpack__(stream=...)``, so the
producer orders its pending work before ours. The outputs are ready on that stream, and their
memory goes back to flashtrain's pool on it when they are dropped: a CuPy stream object is kept
alive until then; a ``stream=`` handle must outlive the outputs.
"""

import operator
import sys

from . import _flashtrain as _ext

KernelConfig = _ext.KernelConfig
built_with_cuda = _ext.built_with_cuda

_IMPLS = ("flash", "naive", "reference")
_DLPACK_CPU, _DLPACK_CUDA = 1, 2
# How the module hands outputs back (python/src/module.cpp, Export).
_EXPORT_DLPACK, _EXPORT_NUMPY = 0, 1

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
    call = _Call(q, causal, window, scale, impl, config, stream)
    o, lse = _ext.forward(call.take("q", q), call.take("k", k), call.take("v", v),
                          call.take_segments(segment_ids), call.causal, call.window, call.scale,
                          call.impl, call.config, call.stream, call.stream_owner, call.export)
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
    call = _Call(q, causal, window, scale, impl, config, stream)
    if not isinstance(deterministic, bool):
        raise TypeError(f"attention: deterministic must be a bool, got {deterministic!r}")
    dq, dk, dv = _ext.backward(call.take("q", q), call.take("k", k), call.take("v", v),
                               call.take("o", o), call.take("lse", lse), call.take("do", do),
                               call.take_segments(segment_ids), call.causal, call.window,
                               call.scale, deterministic, call.impl, call.config, call.stream,
                               call.stream_owner, call.export)
    call.done()
    return call.give(dq), call.give(dk), call.give(dv)


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
    """PyTorch's fast handles, looked up once: capsule export and import, the raw current
    stream."""

    def __init__(self, torch):
        self.tensor = torch.Tensor
        self.to_dlpack = torch.utils.dlpack.to_dlpack
        self.from_capsule = getattr(torch._C, "_from_dlpack", torch.utils.dlpack.from_dlpack)
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is None:  # a PyTorch without the raw query: the public, slower one
            def raw(index):
                return torch.cuda.current_stream(index).cuda_stream
        self.current_stream = raw


_torch = None


def _torch_handles():
    global _torch
    if _torch is None:
        _torch = _Torch(sys.modules["torch"])
    return _torch


class _Call:
    """One call's settings, how its inputs are handed to the module and its outputs back."""

    def __init__(self, q, causal, window, scale, impl, config, stream):
        self.framework = _framework(q)
        self.fast_torch = None  # _Torch when q is a PyTorch tensor on its current stream
        if self.framework == "torch" and isinstance(q, sys.modules["torch"].Tensor):
            self.cuda = q.is_cuda
            self.device_id = q.get_device() if self.cuda else 0
            if stream is None:
                self.fast_torch = _torch_handles()
        else:
            device_type, self.device_id = _dlpack_device("q", q)
            self.cuda = device_type == _DLPACK_CUDA
        if type(causal) is not bool:
            raise TypeError(f"attention: causal must be a bool, got {causal!r}")
        self.causal = causal
        if type(window) is int:
            self.window = window
        else:
            try:
                self.window = operator.index(window)
            except TypeError:
                raise TypeError(f"attention: window must be an int, got {window!r}") from None
            if isinstance(window, bool):
                raise TypeError(f"attention: window must be an int, got {window!r}")
        if scale is None:
            self.scale = 0.0  # the library's "1 / sqrt(D)"
        else:
            self.scale = float(scale)
            if self.scale == 0.0:
                raise ValueError("attention: scale must be nonzero (None means 1 / sqrt(D))")
        if impl not in _IMPLS:
            raise ValueError(f"attention: impl must be one of {', '.join(_IMPLS)}, got {impl!r}")
        self.impl = impl
        self.config = _config(config)
        self.explicit_stream = stream is not None
        self.stream_owner = None
        self.stream = self._stream(stream) if self.cuda else 0
        self.export = _EXPORT_NUMPY if self.framework == "numpy" else _EXPORT_DLPACK
        self.bf16_type = None  # ml_dtypes.bfloat16 when q is such a NumPy array

    def _stream(self, stream):
        if stream is not None:
            return int(stream)
        if self.fast_torch is not None:  # every PyTorch tensor without a stream= handle
            return self.fast_torch.current_stream(self.device_id)
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
        fast = self.fast_torch
        if fast is not None and isinstance(x, fast.tensor):
            # The producer's stream is ours: a capsule needs no event between them.
            return fast.to_dlpack(x.detach() if x.requires_grad else x)
        if self.framework == "torch":
            x = x.detach()  # an autograd tensor refuses export; the values are the same
        if self.framework == "numpy" and getattr(x, "dtype", None) is not None and \
                x.dtype.name == "bfloat16":
            self.bf16_type = self.bf16_type or x.dtype
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
