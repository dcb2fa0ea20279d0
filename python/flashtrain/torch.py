"""flash-attn's interface on our kernels, for PyTorch.

``flash_attn_func`` and ``flash_attn_varlen_func`` take the arguments of the flash-attn
package's functions of the same names, with the same meaning. Under ``torch.compile`` they run
two ``torch.library`` ops, ``flashtrain::attention_forward`` and
``flashtrain::attention_backward``, each with a fake (meta) implementation, and an autograd
formula joining them, so that ``torch.compile(fullgraph=True)`` sees one opaque, differentiable
op. The ops are C++ ops (CPU and CUDA kernels in ``flashtrain._torch_ext``) where the package
was built with that extension against this PyTorch, else Python custom ops over the DLPack
route (flashtrain.attention's two routes); their fake implementations and autograd formula are
the ones below either way. Eagerly the same two calls run through a plain
``torch.autograd.Function`` (and without autograd when no input needs a gradient): an op's
dispatch costs microseconds a call on the host (a Python custom op's tens), which small shapes
would feel. Every route runs the same kernels.

``deterministic=True`` makes the backward bit-reproducible (on the GPU in bf16 the tma backward
orders its dQ sums, at a cost; where the device or head dim has no such path the call raises
``ValueError`` with the reason).

What flash-attn offers and we do not raises ``NotImplementedError`` with the reason: dropout,
``return_attn_probs``, ``softcap``, ALiBi, a window whose right edge is neither the query
(causal) nor unbounded, query and key lengths that differ. Bad values raise
``ValueError``/``TypeError``. float16 is not supported (our kernels are bf16 and fp32).

Non-contiguous q, k, v (e.g. slices of a fused QKV tensor) are copied to contiguous ones, as
our kernels read dense ``[B, S, H, D]`` tensors. On the GPU every call runs on PyTorch's
current stream. The outputs' memory comes from flashtrain's stream-ordered CUDA pool, not from
PyTorch's caching allocator (``torch.cuda.memory_allocated`` does not count it).
"""

from typing import Optional, Tuple

import torch

from . import attention as _attention

__all__ = ["flash_attn_func", "flash_attn_varlen_func"]

_IMPLS = ("flash", "naive")
_MAX_HEAD_DIM = 256
_BF16, _FP32 = torch.bfloat16, torch.float32
_DTYPES = (_BF16, _FP32)
_UNBOUNDED = (-1, -1)  # flash-attn's default window_size: no window
# flashtrain.attention's route for PyTorch tensors on the current stream: the extension
# (at::Tensor in and out) where it loads, else the nanobind module (capsules in, tensors out).
_TORCH = _attention._torch_handles()
# The module's settings (causal, window, scale, impl, config) of flash_attn_func's common call.
_CAUSAL_SETTINGS = (True, 0, 0.0, "flash", None)
_FULL_SETTINGS = (False, 0, 0.0, "flash", None)


# ---------------------------------------------------------------- the custom ops


def _lse_shape(q):
    return (q.shape[0], q.shape[2], q.shape[1])


def _forward_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  segment_ids: Optional[torch.Tensor], causal: bool, window: int, scale: float,
                  impl: str, config: str,
                  deterministic: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    # deterministic is the backward's; the forward carries it to the autograd formula.
    return _forward_call(q, k, v, segment_ids, causal, window, scale, impl, config)


def _backward_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                   lse: torch.Tensor, do: torch.Tensor, segment_ids: Optional[torch.Tensor],
                   causal: bool, window: int, scale: float, impl: str, config: str,
                   deterministic: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward_call(q, k, v, o, lse, do, segment_ids, causal, window, scale, impl, config,
                          deterministic)


# One definition of the ops: the extension's C++ ops (its kernels are its eager functions'
# C++, with the same schemas as _forward_impl's and _backward_impl's), or the Python custom ops
# around those two functions. A process holds one: the choice is _TORCH's, made once.
if _TORCH.extension is not None:
    _TORCH.extension.register_ops()
    _forward_op = torch.ops.flashtrain.attention_forward.default
    _backward_op = torch.ops.flashtrain.attention_backward.default
else:
    _forward_op = torch.library.custom_op("flashtrain::attention_forward", _forward_impl,
                                          mutates_args=())
    _backward_op = torch.library.custom_op("flashtrain::attention_backward", _backward_impl,
                                           mutates_args=())


@torch.library.register_fake("flashtrain::attention_forward")
def _(q, k, v, segment_ids, causal, window, scale, impl, config, deterministic):
    o = q.new_empty(q.shape)
    lse = q.new_empty(_lse_shape(q), dtype=torch.float32)
    return o, lse


@torch.library.register_fake("flashtrain::attention_backward")
def _(q, k, v, o, lse, do, segment_ids, causal, window, scale, impl, config, deterministic):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, segment_ids, causal, window, scale, impl, config, deterministic = inputs
    o, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, o, lse, segment_ids)
    ctx.settings = (causal, window, scale, impl, config, deterministic)


def _backward(ctx, do, _dlse):
    q, k, v, o, lse, segment_ids = ctx.saved_tensors
    dq, dk, dv = _backward_op(q, k, v, o, lse, do.contiguous(), segment_ids, *ctx.settings)
    return dq, dk, dv, None, None, None, None, None, None, None


torch.library.register_autograd("flashtrain::attention_forward", _backward,
                                setup_context=_setup_context)


# ---------------------------------------------------------------- the eager route


def _module_settings(causal, window, scale, impl, config):
    """The ops' arguments as flashtrain.attention's module route takes them (checked already:
    by flash_attn_func, or by the ops' schema and the module)."""
    return causal, window, scale, impl, _attention._config(config or None)


def _forward_call(q, k, v, segment_ids, causal, window, scale, impl, config):
    settings = _module_settings(causal, window, scale, impl, config)
    return _TORCH.forward(q, k, v, segment_ids, settings)


def _backward_call(q, k, v, o, lse, do, segment_ids, causal, window, scale, impl, config,
                   deterministic):
    settings = _module_settings(causal, window, scale, impl, config)
    return _TORCH.backward(q, k, v, o, lse, do, segment_ids, settings, deterministic)


class _EagerAttention(torch.autograd.Function):
    """The custom ops' autograd formula without their dispatch: what runs outside torch.compile
    when an input needs a gradient. Lean, as Function.apply's host time grows with the
    arguments and outputs: the settings come checked in one tuple, o is the only output (lse is
    saved beside the inputs), and the backward reuses the forward's settings, checking nothing
    again."""

    @staticmethod
    def forward(ctx, q, k, v, segment_ids, settings, deterministic):
        o, lse = _TORCH.forward(q, k, v, segment_ids, settings)
        ctx.save_for_backward(q, k, v, o, lse, segment_ids)
        ctx.settings = settings
        ctx.deterministic = deterministic
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, segment_ids = ctx.saved_tensors
        dq, dk, dv = _TORCH.backward(q, k, v, o, lse, do.contiguous(), segment_ids, ctx.settings,
                                     ctx.deterministic)
        return dq, dk, dv, None, None, None


def _attend_eager(q, k, v, causal, deterministic):
    """o of flash_attn_func's common eager call (flash, no window, the default scale and
    configuration): _attend's eager routes, straight to the route's module call when no
    gradient is wanted."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        settings = _CAUSAL_SETTINGS if causal else _FULL_SETTINGS
        return _EagerAttention.apply(q, k, v, None, settings, deterministic)
    return _TORCH.call_forward(q, k, v, None, causal, 0, 0.0, "flash", None)[0]


def _attend(q, k, v, segment_ids, causal, window, scale, impl, config, deterministic):
    """o by the route that fits: the custom op under torch.compile, else autograd's Function,
    else (no gradient wanted) the plain call."""
    if torch.compiler.is_compiling():
        o, _ = _forward_op(q, k, v, segment_ids, causal, window, scale, impl, config,
                           deterministic)
        return o
    settings = _module_settings(causal, window, scale, impl, config)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _EagerAttention.apply(q, k, v, segment_ids, settings, deterministic)
    return _TORCH.forward(q, k, v, segment_ids, settings)[0]


# ---------------------------------------------------------------- flash-attn's arguments


def _check_unsupported(dropout_p, softcap, alibi_slopes, deterministic, return_attn_probs):
    if dropout_p != 0.0:
        raise NotImplementedError(f"flashtrain: dropout_p={dropout_p} is not supported "
                                  "(our kernels have no dropout; pass 0.0)")
    if softcap != 0.0:
        raise NotImplementedError(f"flashtrain: softcap={softcap} is not supported (pass 0.0)")
    if alibi_slopes is not None:
        raise NotImplementedError("flashtrain: alibi_slopes are not supported (pass None)")
    if return_attn_probs:
        raise NotImplementedError("flashtrain: return_attn_probs=True is not supported (our "
                                  "kernels never form the attention probabilities)")
    if not isinstance(deterministic, bool):
        raise TypeError(f"flashtrain: deterministic must be a bool, got {deterministic!r}")


def _plain_dtypes(q, k, v):
    """True for plain tensors (no subclass) of one dtype that flash_attn_func takes: what its
    common call must check before the module, which accepts more (float64, uint16 as bf16)."""
    tensor = torch.Tensor
    if type(q) is not tensor or type(k) is not tensor or type(v) is not tensor:
        return False
    dtype = q.dtype
    return (dtype is _BF16 or dtype is _FP32) and k.dtype is dtype and v.dtype is dtype


def _plain_tensors(q, k, v, rank):
    """True for the common call, which every check of _check_tensors and the callers' length
    checks pass: plain tensors of one supported dtype and rank, k and v of one shape that is q's
    but for the heads, a supported head dim, a whole number of query heads per kv head. One
    cheap test, so that only a call that is not plain pays for the checks that say what is
    wrong."""
    tensor = torch.Tensor
    if type(q) is not tensor or type(k) is not tensor or type(v) is not tensor:
        return False
    dtype = q.dtype
    if dtype not in _DTYPES or k.dtype is not dtype or v.dtype is not dtype:
        return False
    q_shape, kv_shape = q.shape, k.shape
    if len(q_shape) != rank or v.shape != kv_shape or q_shape[:-2] != kv_shape[:-2]:
        return False
    heads, head_dim = q_shape[-2], q_shape[-1]
    kv_heads = kv_shape[-2]
    return (kv_shape[-1] == head_dim and head_dim % 8 == 0 and head_dim <= _MAX_HEAD_DIM and
            kv_heads > 0 and heads % kv_heads == 0)


def _check_tensors(q, k, v, rank, layout):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"flashtrain: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != rank:
            raise ValueError(f"flashtrain: {name} must be {rank}-D {layout}, got shape "
                             f"{tuple(t.shape)}")
        if t.dtype not in (torch.bfloat16, torch.float32):
            raise TypeError(f"flashtrain: {name} has dtype {t.dtype} (allowed: torch.bfloat16, "
                            "torch.float32; float16 is not supported)")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"flashtrain: q, k, v must share one dtype, got {q.dtype}, {k.dtype}, "
                        f"{v.dtype}")
    head_dim = q.shape[-1]
    if head_dim % 8 != 0 or head_dim > _MAX_HEAD_DIM:
        raise NotImplementedError(f"flashtrain: head dim {head_dim} is not supported (multiples "
                                  f"of 8 up to {_MAX_HEAD_DIM})")
    if k.shape[-1] != head_dim or v.shape[-1] != head_dim:
        raise ValueError(f"flashtrain: q, k, v must share the head dim, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    heads, kv_heads = q.shape[-2], k.shape[-2]
    if v.shape[-2] != kv_heads or heads % kv_heads != 0:
        raise ValueError(f"flashtrain: query heads ({heads}) must be a multiple of the kv heads "
                         f"of k ({kv_heads}) and v ({v.shape[-2]})")


def _check_lengths(q, k, v):
    if k.shape[:2] != q.shape[:2] or v.shape[:2] != q.shape[:2]:
        raise NotImplementedError(f"flashtrain: q {tuple(q.shape)}, k {tuple(k.shape)}, v "
                                  f"{tuple(v.shape)}: batch and seqlen must agree (query and key "
                                  "lengths that differ are not supported)")


def _mask(causal, window_size, seqlen):
    """flash-attn's (causal, window_size) as our (causal, window): query i sees keys
    [i - left, i + right], -1 meaning unbounded; causal sets right to 0."""
    if window_size is _UNBOUNDED:  # the default: what the general rule below gives for it
        return bool(causal), 0
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        raise TypeError(f"flashtrain: window_size must be a pair (left, right) of ints, got "
                        f"{window_size!r}") from None
    if left < -1 or right < -1:
        raise ValueError(f"flashtrain: window_size {tuple(window_size)}: each side is -1 "
                         "(unbounded) or >= 0")
    if causal:
        right = 0
    # flash-attn's own rule: a side at least as long as the keys is unbounded.
    if left >= seqlen:
        left = -1
    if right >= seqlen:
        right = -1
    if right not in (0, -1):
        raise NotImplementedError(f"flashtrain: window_size right = {right} is not supported "
                                  "(our windows end at the query (causal, right 0) or are "
                                  "unbounded to the right (-1))")
    return right == 0, 0 if left < 0 else left + 1


def _settings(softmax_scale, impl, config):
    if impl not in _IMPLS:
        raise ValueError(f"flashtrain: impl must be one of {', '.join(_IMPLS)}, got {impl!r}")
    scale = 0.0 if softmax_scale is None else float(softmax_scale)
    if softmax_scale is not None and scale == 0.0:
        raise ValueError("flashtrain: softmax_scale must be nonzero (None: 1 / sqrt(head dim))")
    return scale, "" if config is None else str(config)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=_UNBOUNDED, softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False, *, impl="flash", config=None):
    """Attention over q ``[B, S, Hq, D]``, k and v ``[B, S, Hkv, D]`` (Hq a multiple of Hkv:
    grouped-query attention); returns out ``[B, S, Hq, D]``. As flash-attn's function: the
    scale defaults to ``1 / sqrt(D)``, ``window_size=(left, right)`` keeps keys in
    ``[i - left, i + right]`` (-1 unbounded), ``causal`` ends the window at the query.

    Ours only: ``impl="naive"`` runs the GEMM + softmax + GEMM baseline instead;
    ``config`` picks the CUDA bf16 kernels' tiles (``"fwd=128x64/128 bwd=64x64/128/double"``).
    """
    if (window_size is _UNBOUNDED and softmax_scale is None and impl == "flash" and config is None
            and dropout_p == 0.0 and softcap == 0.0 and alibi_slopes is None
            and not return_attn_probs and type(deterministic) is bool
            and _plain_dtypes(q, k, v) and not torch.compiler.is_compiling()):
        # The common eager call: its keywords are flash-attn's defaults, and the module checks
        # the shapes. Only a call the module refuses pays for the checks that say what is wrong
        # in flash-attn's terms, and a strided input for its copy.
        try:
            return _attend_eager(q, k, v, bool(causal), deterministic)
        except (ValueError, TypeError) as e:
            refused = e
        _check_tensors(q, k, v, 4, "[batch, seqlen, heads, head dim]")
        _check_lengths(q, k, v)
        if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous()):
            return flash_attn_func(q.contiguous(), k.contiguous(), v.contiguous(), causal=causal,
                                   deterministic=deterministic)
        raise refused
    plain = _plain_tensors(q, k, v, 4)
    if not plain:
        _check_tensors(q, k, v, 4, "[batch, seqlen, heads, head dim]")
    _check_unsupported(dropout_p, softcap, alibi_slopes, deterministic, return_attn_probs)
    if not plain:
        _check_lengths(q, k, v)
    is_causal, window = _mask(causal, window_size, q.shape[1])
    scale, config = _settings(softmax_scale, impl, config)
    return _attend(q.contiguous(), k.contiguous(), v.contiguous(), None, is_causal, window, scale,
                   impl, config, deterministic)


def _segment_ids(cu_seqlens, total):
    """int32 [1, total]: document d for the rows [cu[d], cu[d + 1]), -1 past cu[-1]."""
    cu = cu_seqlens.to(torch.int64)
    rows = torch.arange(total, device=cu.device, dtype=torch.int64)
    ids = torch.searchsorted(cu[1:].contiguous(), rows, right=True)
    ids = torch.where(rows < cu[-1], ids, torch.full_like(ids, -1))
    return ids.to(torch.int32).unsqueeze(0)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=_UNBOUNDED,
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None, *, impl="flash",
                           config=None):
    """Attention over packed documents: q ``[total, Hq, D]``, k and v ``[total, Hkv, D]``,
    document d in rows ``[cu_seqlens[d], cu_seqlens[d + 1])``; returns out ``[total, Hq, D]``.
    The documents become our segment ids over one packed row, so nothing crosses a document
    boundary, and causal and window masks count positions within each document. Query and key
    documents must be the same (``cu_seqlens_q`` equal to ``cu_seqlens_k``); rows past
    ``cu_seqlens[-1]`` are padding and get zero output and zero gradient. Passing one tensor as
    both skips the equality check, which waits for the GPU (it is skipped under torch.compile).
    """
    _check_tensors(q, k, v, 3, "[total tokens, heads, head dim]")
    _check_unsupported(dropout_p, softcap, alibi_slopes, deterministic, return_attn_probs)
    if block_table is not None:
        raise NotImplementedError("flashtrain: block_table (paged KV cache) is not supported")
    if k.shape[0] != q.shape[0] or v.shape[0] != q.shape[0]:
        raise NotImplementedError(f"flashtrain: q {tuple(q.shape)}, k {tuple(k.shape)}: the "
                                  "packed query and key rows must be the same documents")
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.dtype not in (torch.int32,
                                                                                 torch.int64):
            raise TypeError(f"flashtrain: {name} must be a 1-D int32 tensor [batch + 1]")
        if cu.device != q.device:
            raise ValueError(f"flashtrain: {name} is on {cu.device}, q on {q.device}")
    if max_seqlen_q != max_seqlen_k:
        raise NotImplementedError(f"flashtrain: max_seqlen_q ({max_seqlen_q}) != max_seqlen_k "
                                  f"({max_seqlen_k}): query and key documents must be the same")
    if cu_seqlens_k is not cu_seqlens_q and not torch.compiler.is_compiling():
        if cu_seqlens_k.shape != cu_seqlens_q.shape or not torch.equal(cu_seqlens_q,
                                                                        cu_seqlens_k):
            raise NotImplementedError("flashtrain: cu_seqlens_q and cu_seqlens_k differ: query "
                                      "and key documents must be the same")
    is_causal, window = _mask(causal, window_size, max_seqlen_k)
    scale, config = _settings(softmax_scale, impl, config)
    segment_ids = _segment_ids(cu_seqlens_q, q.shape[0])
    o = _attend(q.contiguous().unsqueeze(0), k.contiguous().unsqueeze(0),
                v.contiguous().unsqueeze(0), segment_ids, is_causal, window, scale, impl, config,
                deterministic)
    return o.squeeze(0)
