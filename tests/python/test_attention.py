"""flashtrain.attention on NumPy arrays (the CPU path) against the float64 reference of
reference.py: every mask, grouped-query attention, odd lengths, padding rows; bf16 as uint16
bits and as ml_dtypes.bfloat16; bad input raises TypeError/ValueError naming the problem."""

import zlib

import numpy as np
import pytest

import reference as ref

attention = pytest.importorskip("flashtrain.attention")

# fp32 against fp64: the kernels sum in fp32 over at most a few hundred terms, ~1e-7 relative;
# 1e-5 is the project's fp32 bar, while a wrong mask or index gives errors of order 1.
FP32_BOUND = 1e-5


def random_inputs(rng, b, s, h, kv, d, dtype=np.float32):
    q = rng.standard_normal((b, s, h, d)).astype(dtype)
    k = rng.standard_normal((b, s, kv, d)).astype(dtype)
    v = rng.standard_normal((b, s, kv, d)).astype(dtype)
    do = rng.standard_normal((b, s, h, d)).astype(dtype)
    return q, k, v, do


def documents(rng, b, s, padding=True):
    """int32 [B, S]: a few documents per row, and padding (-1) at the end of row 0."""
    seg = np.zeros((b, s), dtype=np.int32)
    for row in range(b):
        cuts = np.sort(rng.choice(np.arange(1, s), size=min(3, s - 1), replace=False))
        seg[row] = np.searchsorted(cuts, np.arange(s), side="right")
    if padding:
        seg[0, s - max(1, s // 5):] = -1
    return seg


MASKS = {
    "none": {},
    "causal": {"causal": True},
    "window": {"window": 9},
    "causal+window": {"causal": True, "window": 9},
    "segments": {"segments": True},
    "causal+window+segments": {"causal": True, "window": 9, "segments": True},
}


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("shape", [(2, 1, 4, 4, 16), (2, 37, 4, 1, 32), (1, 130, 6, 2, 40),
                                   (3, 65, 8, 8, 64)])
@pytest.mark.parametrize("impl", ["flash", "naive"])
def test_matches_float64_reference(mask, shape, impl):
    b, s, h, kv, d = shape
    rng = np.random.default_rng(zlib.crc32(repr((mask, shape, impl)).encode()))
    q, k, v, do = random_inputs(rng, b, s, h, kv, d)
    kw = {key: val for key, val in MASKS[mask].items() if key != "segments"}
    seg = documents(rng, b, s) if MASKS[mask].get("segments") and s > 1 else None
    (o_ref, lse_ref), grads_ref = ref.attention(q, k, v, do, segment_ids=seg, **kw)
    o, lse = attention.forward(q, k, v, segment_ids=seg, impl=impl, **kw)
    assert o.dtype == np.float32 and o.shape == q.shape
    assert lse.dtype == np.float32 and lse.shape == (b, h, s)
    assert ref.relative_error(o, o_ref) < FP32_BOUND
    assert ref.relative_error(lse, lse_ref) < FP32_BOUND
    grads = attention.backward(q, k, v, o, lse, do, segment_ids=seg, impl=impl, **kw)
    for name, got, want, like in zip(("dq", "dk", "dv"), grads, grads_ref, (q, k, v)):
        assert got.shape == like.shape and got.dtype == np.float32, name
        assert ref.relative_error(got, want) < FP32_BOUND, name


def test_padding_rows_are_zero_with_lse_minus_infinity():
    rng = np.random.default_rng(1)
    q, k, v, do = random_inputs(rng, 2, 23, 4, 2, 16)
    seg = documents(rng, 2, 23)
    pad = seg == -1
    assert pad.any()
    o, lse = attention.forward(q, k, v, segment_ids=seg, causal=True)
    dq, dk, dv = attention.backward(q, k, v, o, lse, do, segment_ids=seg, causal=True)
    assert np.all(o[pad] == 0) and np.all(dq[pad] == 0)
    assert np.all(dk[pad] == 0) and np.all(dv[pad] == 0)
    assert np.all(np.isneginf(lse.transpose(0, 2, 1)[pad]))
    assert np.all(np.isfinite(o)) and np.all(np.abs(o[~pad]).sum(axis=-1) > 0)


def test_scale_and_reference_impl():
    rng = np.random.default_rng(2)
    q, k, v, do = random_inputs(rng, 1, 19, 2, 1, 24)
    (o_ref, lse_ref), grads_ref = ref.attention(q, k, v, do, causal=True, scale=0.3)
    o, lse = attention.forward(q, k, v, causal=True, scale=0.3, impl="reference")
    assert o.dtype == np.float64 and lse.dtype == np.float64
    assert ref.relative_error(o, o_ref) < 1e-12
    o32, lse32 = attention.forward(q, k, v, causal=True, scale=0.3)
    assert ref.relative_error(o32, o_ref) < FP32_BOUND
    assert ref.relative_error(lse32, lse_ref) < FP32_BOUND
    grads = attention.backward(q, k, v, o, lse, do, causal=True, scale=0.3, impl="reference")
    for got, want in zip(grads, grads_ref):
        assert got.dtype == np.float64 and ref.relative_error(got, want) < 1e-12


def test_float64_inputs_on_the_cpu():
    rng = np.random.default_rng(3)
    q, k, v, do = random_inputs(rng, 2, 31, 4, 2, 16, dtype=np.float64)
    (o_ref, _), grads_ref = ref.attention(q, k, v, do, window=5)
    o, lse = attention.forward(q, k, v, window=5)
    assert o.dtype == np.float64 and ref.relative_error(o, o_ref) < 1e-12
    for got, want in zip(attention.backward(q, k, v, o, lse, do, window=5), grads_ref):
        assert ref.relative_error(got, want) < 1e-12


def bf16_errors(q, k, v, do, kw):
    """Relative errors of flash and naive on bf16 inputs against fp64 on the same (rounded)
    inputs: [(o, dq, dk, dv) for flash, same for naive]."""
    bits = [ref.bf16_bits(t) for t in (q, k, v, do)]
    values = [ref.bf16_value(t) for t in bits]
    (o_ref, _), grads_ref = ref.attention(*values, **kw)
    errors = []
    for impl in ("flash", "naive"):
        o, lse = attention.forward(*bits[:3], impl=impl, **kw)
        assert o.dtype == np.uint16 and lse.dtype == np.float32
        grads = attention.backward(*bits[:3], o, lse, bits[3], impl=impl, **kw)
        errors.append([ref.relative_error(ref.bf16_value(got), want)
                       for got, want in zip((o, *grads), (o_ref, *grads_ref))])
    return errors


@pytest.mark.parametrize("kw", [{"causal": True}, {"causal": True, "window": 17}])
def test_bf16_as_uint16_within_twice_naive(kw):
    rng = np.random.default_rng(4)
    q, k, v, do = random_inputs(rng, 2, 77, 4, 2, 32)
    flash, naive = bf16_errors(q, k, v, do, kw)
    for name, f, n in zip(("o", "dq", "dk", "dv"), flash, naive):
        assert np.isfinite(f) and f < 5e-2, name
        # DESIGN.md: at most 2x the naive bf16 error (plus half a bf16 ulp for ties).
        assert f <= 2 * n + 2e-3, (name, f, n)


def test_bf16_as_ml_dtypes_comes_back_as_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(5)
    q, k, v, do = random_inputs(rng, 1, 40, 2, 2, 16)
    as_bf16 = [t.astype(ml_dtypes.bfloat16) for t in (q, k, v, do)]
    o, lse = attention.forward(*as_bf16[:3], causal=True)
    assert o.dtype == ml_dtypes.bfloat16
    o_bits, _ = attention.forward(*[t.view(np.uint16) for t in as_bf16[:3]], causal=True)
    assert np.array_equal(o.view(np.uint16), o_bits)
    grads = attention.backward(*as_bf16[:3], o, lse, as_bf16[3], causal=True)
    assert all(g.dtype == ml_dtypes.bfloat16 for g in grads)


def test_outputs_are_fresh_writable_arrays():
    rng = np.random.default_rng(6)
    q, k, v, _ = random_inputs(rng, 1, 8, 2, 2, 8)
    before = [t.copy() for t in (q, k, v)]
    o1, lse1 = attention.forward(q, k, v)
    o2, _ = attention.forward(q, k, v)
    assert not np.shares_memory(o1, o2) and not np.shares_memory(o1, q)
    o1[...] = 0  # ours to keep or change
    assert np.array_equal(o2, attention.forward(q, k, v)[0])
    for t, b in zip((q, k, v), before):
        assert np.array_equal(t, b)  # inputs are read, never written
    del o2, lse1  # the library's memory goes back when the arrays go


def test_read_only_inputs_are_accepted():
    rng = np.random.default_rng(7)
    q, k, v, _ = random_inputs(rng, 1, 8, 2, 2, 8)
    for t in (q, k, v):
        t.flags.writeable = False
    o, _ = attention.forward(q, k, v, causal=True)
    assert np.all(np.isfinite(o))


def test_benchmark_probes():
    """The module's pieces for bench/python_attention.py: forward stopped after each stage returns
    None (the stages it went through still check), stage 4 is forward itself, and the C++ loop
    of the library's forward times itself."""
    rng = np.random.default_rng(10)
    q, k, v, _ = random_inputs(rng, 1, 8, 2, 2, 8)
    ext = attention._ext
    rest = (None, True, 0, 0.0, "flash", None, 0, None, attention._EXPORT_NUMPY, None)
    for stage in range(4):
        assert ext._forward_probe(stage, q, k, v, *rest) is None
    o, _ = ext._forward_probe(4, q, k, v, *rest)
    assert np.array_equal(o, attention.forward(q, k, v, causal=True)[0])
    with pytest.raises(ValueError, match="must agree in batch"):
        ext._forward_probe(2, q[:, :4].copy(), k, v, *rest)
    with pytest.raises(ValueError, match="stage 5"):
        ext._forward_probe(5, q, k, v, *rest)
    assert ext._forward_loop(q, k, v, True, 0, 3) > 0


def test_kernel_config_parses_and_prints():
    c = attention.KernelConfig.parse("fwd=128x64/128 bwd=64x64/128/double")
    assert str(c) == "fwd=128x64/128 bwd=64x64/128/double"
    assert c == attention.KernelConfig.parse(str(c))
    with pytest.raises(ValueError, match="fwd"):
        attention.KernelConfig.parse("fwd=banana")
    # The CPU ignores the CUDA kernels' tiles; a config (object or text) is still accepted.
    rng = np.random.default_rng(8)
    q, k, v, _ = random_inputs(rng, 1, 8, 2, 2, 8)
    o1, _ = attention.forward(q, k, v, config=c)
    o2, _ = attention.forward(q, k, v, config="fwd=128x64/128")
    assert np.array_equal(o1, o2)


# ---------------------------------------------------------------- bad input


@pytest.fixture
def qkv():
    rng = np.random.default_rng(9)
    return random_inputs(rng, 2, 16, 4, 2, 16)


def test_wrong_dtype_is_a_type_error(qkv):
    q, k, v, _ = qkv
    with pytest.raises(TypeError, match="q has dtype float16"):
        attention.forward(q.astype(np.float16), k, v)
    with pytest.raises(TypeError, match="k has dtype float64, q has float32"):
        attention.forward(q, k.astype(np.float64), v)
    with pytest.raises(TypeError, match="int32"):
        attention.forward(*(t.astype(np.int32) for t in (q, k, v)))
    with pytest.raises(TypeError, match="segment_ids has dtype int64"):
        attention.forward(q, k, v, segment_ids=np.zeros((2, 16), dtype=np.int64))
    with pytest.raises(TypeError, match="not an array"):
        attention.forward(q.tolist(), k, v)


def test_wrong_rank_and_shapes_are_value_errors(qkv):
    q, k, v, do = qkv
    with pytest.raises(ValueError, match=r"q must be 4-D \[B, S, Hq, D\], got shape \[2, 16, 64\]"):
        attention.forward(q.reshape(2, 16, 64), k, v)
    with pytest.raises(ValueError, match="must agree in batch, sequence length and head dim"):
        attention.forward(q[:, :8].copy(), k, v)
    with pytest.raises(ValueError, match=r"query heads \(4\) must be a multiple of kv heads \(3\)"):
        attention.forward(q, *(np.concatenate([t, t[:, :, :1]], axis=2) for t in (k, v)))
    with pytest.raises(ValueError, match="head dim 12 is not supported"):
        attention.forward(*(t[..., :12].copy() for t in (q, k, v)))
    with pytest.raises(ValueError, match="segment ids has shape"):
        attention.forward(q, k, v, segment_ids=np.zeros((2, 15), dtype=np.int32))
    o, lse = attention.forward(q, k, v)
    with pytest.raises(ValueError, match="lse"):
        attention.backward(q, k, v, o, lse[:, :2].copy(), do)


def test_non_contiguous_is_a_value_error(qkv):
    q, k, v, _ = qkv
    with pytest.raises(ValueError, match="q is not contiguous"):
        attention.forward(q.transpose(0, 2, 1, 3), k, v)
    fused = np.concatenate([q, k, v], axis=2)  # slices of a fused QKV are strided
    with pytest.raises(ValueError, match="k is not contiguous"):
        attention.forward(q, fused[:, :, 4:6], v)


def test_bad_keywords(qkv):
    q, k, v, _ = qkv
    with pytest.raises(ValueError, match="window must be >= 0"):
        attention.forward(q, k, v, window=-2)
    with pytest.raises(TypeError, match="window must be an int"):
        attention.forward(q, k, v, window=2.5)
    with pytest.raises(TypeError, match="causal must be a bool"):
        attention.forward(q, k, v, causal="yes")
    with pytest.raises(ValueError, match="impl must be one of"):
        attention.forward(q, k, v, impl="fast")
    with pytest.raises(ValueError, match="scale must be nonzero"):
        attention.forward(q, k, v, scale=0.0)
    with pytest.raises(TypeError, match="config must be"):
        attention.forward(q, k, v, config=3)
