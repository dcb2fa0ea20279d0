"""Attention in float64 NumPy, written from the definition (src/attention/attention.h): the
oracle the Python tests compare the module and the PyTorch wrapper against."""

import numpy as np


def allowed(seq_len, causal=False, window=0, segment_ids=None, batch=1):
    """bool [B, S, S]: query i may attend key j."""
    i = np.arange(seq_len)[:, None]
    j = np.arange(seq_len)[None, :]
    mask = np.ones((seq_len, seq_len), dtype=bool)
    if causal:
        mask &= j <= i
    if window > 0:
        mask &= j >= i - (window - 1)
    mask = np.broadcast_to(mask, (batch, seq_len, seq_len)).copy()
    if segment_ids is not None:
        seg = np.asarray(segment_ids)
        mask &= (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] >= 0)
    return mask


def _expand(k, heads):
    return np.repeat(k, heads // k.shape[2], axis=2)


def _group_sum(x, kv_heads):
    b, s, h, d = x.shape
    return x.reshape(b, s, kv_heads, h // kv_heads, d).sum(axis=3)


def attention(q, k, v, do=None, causal=False, window=0, segment_ids=None, scale=None):
    """(o, lse) and, with do, (dq, dk, dv); all float64. Fully masked rows: o = 0, lse = -inf,
    zero gradients."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    b, s, h, d = q.shape
    kv_heads = k.shape[2]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    kk, vv = _expand(k, h), _expand(v, h)
    mask = allowed(s, causal, window, segment_ids, b)[:, None]  # [B, 1, S, S]
    scores = np.where(mask, np.einsum("bihd,bjhd->bhij", q, kk) * scale, -np.inf)
    row_max = scores.max(axis=-1, keepdims=True)
    empty = ~np.isfinite(row_max)
    safe_max = np.where(empty, 0.0, row_max)
    p = np.where(mask, np.exp(scores - safe_max), 0.0)
    total = p.sum(axis=-1, keepdims=True)
    p = np.where(empty, 0.0, p / np.where(empty, 1.0, total))
    o = np.einsum("bhij,bjhd->bihd", p, vv)
    with np.errstate(divide="ignore"):
        lse = np.where(empty, -np.inf, safe_max + np.log(total))[..., 0]
    if do is None:
        return o, lse
    do = np.asarray(do, dtype=np.float64)
    dp = np.einsum("bihd,bjhd->bhij", do, vv)
    dsum = np.einsum("bihd,bihd->bhi", do, o)[..., None]
    ds = p * (dp - dsum)
    dq = np.einsum("bhij,bjhd->bihd", ds, kk) * scale
    dk = _group_sum(np.einsum("bhij,bihd->bjhd", ds, q) * scale, kv_heads)
    dv = _group_sum(np.einsum("bhij,bihd->bjhd", p, do), kv_heads)
    return (o, lse), (dq, dk, dv)


def relative_error(got, want):
    """||got - want|| / ||want|| in float64 over the finite entries of want (inf when got is
    not finite where want is, or the shapes differ)."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return np.inf
    finite = np.isfinite(want)
    if not np.array_equal(np.isfinite(got), finite) or not np.array_equal(got[~finite],
                                                                           want[~finite]):
        return np.inf
    diff = np.linalg.norm(got[finite] - want[finite])
    norm = np.linalg.norm(want[finite])
    return float(diff / norm) if norm > 0 else float(diff)


def bf16_bits(x):
    """float array -> uint16 bf16 bit patterns, rounded to nearest even."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_value(bits):
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)
