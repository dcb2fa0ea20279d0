"""flashtrain.attention on GPU arrays of several frameworks (CuPy, PyTorch, JAX): the results
equal the CPU module's on the same inputs (fp32: within the fp32 bound of the float64 reference;
bf16 through each framework's own bfloat16), come back as the caller's array type on the
caller's device, and inputs are read in place. Skips without a GPU, a CUDA build or the
framework."""

import os

import numpy as np
import pytest

import reference as ref

attention = pytest.importorskip("flashtrain.attention")
if not attention.built_with_cuda() or attention._ext.cuda_device_count() == 0:
    pytest.skip("needs a GPU and a CUDA build of the module", allow_module_level=True)

FP32_BOUND = 1e-5


def case(seed=0, b=2, s=300, h=8, kv=2, d=128):
    rng = np.random.default_rng(seed)
    q, k, v, do = (rng.standard_normal(shape).astype(np.float32)
                   for shape in ((b, s, h, d), (b, s, kv, d), (b, s, kv, d), (b, s, h, d)))
    seg = np.repeat(np.arange(3, dtype=np.int32), s // 3 + 1)[None, :s].repeat(b, axis=0)
    seg[0, -17:] = -1
    return q, k, v, do, seg


def check(to_device, to_numpy, array_type):
    q, k, v, do, seg = case()
    kw = dict(causal=True, window=97)
    (o_ref, lse_ref), grads_ref = ref.attention(q, k, v, do, segment_ids=seg, **kw)
    dq_, dk_, dv_ = (to_device(t) for t in (q, k, v))
    o, lse = attention.forward(dq_, dk_, dv_, segment_ids=to_device(seg), **kw)
    assert isinstance(o, array_type) and isinstance(lse, array_type)
    assert ref.relative_error(to_numpy(o), o_ref) < FP32_BOUND
    assert ref.relative_error(to_numpy(lse), lse_ref) < FP32_BOUND
    grads = attention.backward(dq_, dk_, dv_, o, lse, to_device(do), segment_ids=to_device(seg),
                               **kw)
    for got, want in zip(grads, grads_ref):
        assert isinstance(got, array_type)
        assert ref.relative_error(to_numpy(got), want) < FP32_BOUND


def test_cupy_arrays():
    cupy = pytest.importorskip("cupy")
    check(cupy.asarray, cupy.asnumpy, cupy.ndarray)
    # On a non-default CuPy stream: the inputs are written on it just before the call.
    q, k, v, _, _ = case(seed=1)
    want, _ = attention.forward(q, k, v, causal=True)
    with cupy.cuda.Stream(non_blocking=True):
        got, _ = attention.forward(*(cupy.asarray(t) * 1.0 for t in (q, k, v)), causal=True)
        got = cupy.asnumpy(got)
    assert ref.relative_error(got, want) < FP32_BOUND


def test_torch_arrays_and_bf16():
    torch = pytest.importorskip("torch")
    check(lambda t: torch.from_numpy(t).cuda(), lambda t: t.double().cpu().numpy(), torch.Tensor)
    q, k, v, do, _ = case(seed=2)
    bits = [ref.bf16_bits(t) for t in (q, k, v)]
    want, _ = attention.forward(*bits, causal=True)  # CPU, uint16 bits
    got, lse = attention.forward(*(torch.from_numpy(b.view(np.int16)).cuda().view(torch.bfloat16)
                                   for b in bits), causal=True)
    assert got.dtype == torch.bfloat16 and got.is_cuda and lse.dtype == torch.float32
    err = ref.relative_error(got.float().cpu().numpy(), ref.bf16_value(want))
    assert err < 2e-2, err


def test_jax_arrays():
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    jax = pytest.importorskip("jax")
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("JAX sees no GPU")
    gpu = [d for d in jax.devices() if d.platform == "gpu"][0]
    check(lambda t: jax.device_put(t, gpu), lambda t: np.asarray(t), jax.Array)


def test_wrong_device_mix_is_a_value_error():
    torch = pytest.importorskip("torch")
    q, k, v, _, _ = case(seed=3, s=16)
    with pytest.raises(ValueError, match="one device"):
        attention.forward(torch.from_numpy(q).cuda(), torch.from_numpy(k), torch.from_numpy(v))
    misaligned = torch.zeros(q.size + 4, device="cuda")[1:1 + q.size].view(q.shape)
    with pytest.raises(ValueError, match="16-byte"):
        attention.forward(misaligned, *(torch.from_numpy(t).cuda() for t in (k, v)))
