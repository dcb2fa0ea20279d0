"""flashtrain._torch_ext (the library on PyTorch tensors read as at::Tensor) against the DLPack
route of the nanobind module, on the CPU: the same bits for fp32, bf16 (also as uint16 bits) and
fp64, forward and backward, every mask, GQA, odd lengths, flash, naive and the reference; the
same exception types and messages for bad inputs; outputs that outlive their inputs; the ops'
schemas whichever registration serves; flash_attn_func's eager routes on either. Skips without
PyTorch or without the extension (a build without PyTorch, or against another version)."""

import gc
import zlib

import pytest

torch = pytest.importorskip("torch")
attention = pytest.importorskip("flashtrain.attention")


def _extension():
    try:
        from flashtrain import _torch_build
    except ImportError:
        pytest.skip("flashtrain was built without the PyTorch extension (FLASHTRAIN_TORCH)",
                    allow_module_level=True)
    if _torch_build.TORCH_VERSION != str(torch.__version__):
        pytest.skip(f"the extension was built against torch {_torch_build.TORCH_VERSION}, "
                    f"this is {torch.__version__}", allow_module_level=True)
    from flashtrain import _torch_ext
    return _torch_ext


EXT = attention._TorchExtension(torch, _extension())
DLPACK = attention._Torch(torch)

MASKS = {  # (causal, window, segments)
    "none": (False, 0, False),
    "causal": (True, 0, False),
    "window": (False, 9, False),
    "causal+window": (True, 9, False),
    "segments": (False, 0, True),
    "causal+window+segments": (True, 9, True),
}
SHAPES = [(2, 1, 4, 4, 16), (2, 37, 4, 1, 32), (1, 130, 6, 2, 40), (3, 65, 8, 8, 64)]


def make(shape, dtype, seed, segments):
    b, s, h, kv, d = shape
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(size, generator=g, dtype=torch.float64).to(dtype)
                   for size in ((b, s, h, d), (b, s, kv, d), (b, s, kv, d), (b, s, h, d)))
    seg = None
    if segments and s > 1:
        cuts = torch.randint(1, s, (b, 2), generator=g).sort(dim=1).values
        seg = torch.searchsorted(cuts, torch.arange(s).expand(b, s).contiguous(),
                                 right=True).to(torch.int32)
        seg[0, -max(1, s // 5):] = -1  # padding rows
    return q, k, v, do, seg


def both_routes(q, k, v, do, seg, causal, window, scale, impl, deterministic=False):
    """[(o, lse, dq, dk, dv) of each route]."""
    runs = []
    for route in (DLPACK, EXT):
        o, lse = route.call_forward(q, k, v, seg, causal, window, scale, impl, None)
        grads = route.call_backward(q, k, v, o, lse, do, seg, causal, window, scale,
                                    deterministic, impl, None)
        runs.append((o, lse, *grads))
    return runs


def assert_same_bits(a, b, name):
    assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device, name
    if a.dtype == torch.bfloat16:
        a, b = a.view(torch.int16), b.view(torch.int16)
    assert torch.equal(a, b), name


NAMES = ("o", "lse", "dq", "dk", "dv")


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("impl", ["flash", "naive"])
def test_same_bits_as_the_dlpack_route(mask, shape, dtype, impl):
    causal, window, segments = MASKS[mask]
    seed = zlib.crc32(repr((mask, shape, str(dtype), impl)).encode())
    q, k, v, do, seg = make(shape, dtype, seed, segments)
    dlpack, ext = both_routes(q, k, v, do, seg, causal, window, 0.0, impl)
    for name, a, b in zip(NAMES, dlpack, ext):
        assert_same_bits(a, b, name)
    assert ext[0].dtype == dtype and ext[1].dtype == torch.float32
    assert all(torch.isfinite(t).all() for t in ext[2:])


@pytest.mark.parametrize("impl", ["flash", "reference"])
def test_fp64_and_reference_same_bits(impl):
    dtype = torch.float64 if impl == "flash" else torch.float32
    q, k, v, do, seg = make((2, 33, 4, 2, 24), dtype, 11, True)
    dlpack, ext = both_routes(q, k, v, do, seg, True, 5, 0.3, impl)
    for name, a, b in zip(NAMES, dlpack, ext):
        assert_same_bits(a, b, name)
    assert ext[0].dtype == torch.float64  # the reference's outputs are fp64 whatever q is


def test_uint16_bf16_bits_and_settings_same_bits():
    """bf16 carried as uint16 comes back as uint16; a scale, a deterministic backward and a
    kernel configuration (text or KernelConfig: the CPU ignores it) change nothing between
    routes."""
    q, k, v, do, seg = make((1, 50, 4, 2, 32), torch.bfloat16, 12, True)
    bits = [t.view(torch.uint16) for t in (q, k, v, do)]
    dlpack, ext = both_routes(*bits, seg, False, 7, 0.2, "flash", deterministic=True)
    for name, a, b in zip(NAMES, dlpack, ext):
        assert_same_bits(a, b, name)
    assert ext[0].dtype == torch.uint16 and ext[2].dtype == torch.uint16
    text = "fwd=128x64/128 bwd=64x64/128/double"
    for config in (text, attention.KernelConfig.parse(text)):
        o, lse = EXT.call_forward(q, k, v, None, True, 0, 0.0, "flash", config)
        o_ref, _ = DLPACK.call_forward(q, k, v, None, True, 0, 0.0, "flash", None)
        assert_same_bits(o, o_ref, "o")


def test_public_calls_take_the_extension_route():
    """flashtrain.attention.forward/backward on tensors (common call and settings) and
    flash_attn_func give the extension's bits; the route is the extension unless turned off."""
    q, k, v, do, seg = make((2, 29, 4, 2, 32), torch.float32, 13, True)
    route = attention._torch_handles()
    o, lse = attention.forward(q, k, v, causal=True)
    want = EXT.call_forward(q, k, v, None, True, 0, 0.0, "flash", None)
    assert torch.equal(o, want[0]) and torch.equal(lse, want[1])
    o, lse = attention.forward(q, k, v, segment_ids=seg, window=4, scale=0.5)
    want = EXT.call_forward(q, k, v, seg, False, 4, 0.5, "flash", None)
    assert torch.equal(o, want[0])
    grads = attention.backward(q, k, v, o, lse, do, segment_ids=seg, window=4, scale=0.5)
    want = EXT.call_backward(q, k, v, o, lse, do, seg, False, 4, 0.5, False, "flash", None)
    for a, b in zip(grads, want):
        assert torch.equal(a, b)
    assert isinstance(route, attention._TorchExtension) or route.extension is None


def flash_attn_step(ft, q, k, v, do, **kw):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = ft.flash_attn_func(*leaves, **kw)
    with torch.no_grad():
        plain = ft.flash_attn_func(q, k, v, **kw)
    return (out.detach(), plain, *torch.autograd.grad(out, leaves, do))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flash_attn_func_same_bits_on_either_route(monkeypatch, dtype):
    """flash_attn_func's eager routes (the Function under autograd, the plain call, with and
    without a window) on the extension and on the DLPack route."""
    ft = pytest.importorskip("flashtrain.torch")
    q, k, v, do, _ = make((2, 45, 8, 2, 64), dtype, 14, False)
    runs = []
    for route in (EXT, DLPACK):
        monkeypatch.setattr(ft, "_TORCH", route)
        runs.append([flash_attn_step(ft, q, k, v, do, causal=True),
                     flash_attn_step(ft, q, k, v, do, window_size=(10, 0))])
    for ext, dlpack in zip(*runs):
        for name, a, b in zip(("out", "no grad", "dq", "dk", "dv"), ext, dlpack):
            assert_same_bits(a, b, name)


def bad_calls():
    """(what, forward arguments) that both routes must refuse alike."""
    q, k, v, _, _ = make((2, 16, 4, 2, 32), torch.float32, 15, False)
    seg = torch.zeros(2, 16, dtype=torch.int32)
    base = dict(q=q, k=k, v=v, seg=None, causal=False, window=0, scale=0.0, impl="flash")
    return [
        ("float16", dict(base, q=q.half(), k=k.half(), v=v.half())),
        ("mixed dtypes", dict(base, k=k.double())),
        ("int32 q", dict(base, q=q.int(), k=k.int(), v=v.int())),
        ("int64 segment ids", dict(base, seg=seg.long())),
        ("rank 3", dict(base, q=q[0], k=k[0], v=v[0])),
        ("strided q", dict(base, q=q.transpose(1, 2).contiguous().transpose(1, 2))),
        ("kv heads", dict(base, q=q[:, :, :3].contiguous())),
        ("head dim 12", dict(base, q=q[..., :12].contiguous(), k=k[..., :12].contiguous(),
                             v=v[..., :12].contiguous())),
        ("lengths", dict(base, k=k[:, :8].contiguous(), v=v[:, :8].contiguous())),
        ("segment ids shape", dict(base, seg=seg[:, :5].contiguous())),
        ("negative window", dict(base, window=-3)),
        ("impl", dict(base, impl="fast")),
    ]


@pytest.mark.parametrize("what", [c[0] for c in bad_calls()])
def test_bad_inputs_raise_alike(what):
    args = dict(bad_calls())[what]
    errors = []
    for route in (DLPACK, EXT):
        with pytest.raises((TypeError, ValueError)) as info:
            route.call_forward(args["q"], args["k"], args["v"], args["seg"], args["causal"],
                               args["window"], args["scale"], args["impl"], None)
        errors.append(info.value)
    dlpack, ext = errors
    assert type(ext) is type(dlpack) and str(ext) == str(dlpack), (dlpack, ext)
    assert str(ext)  # a message that names the problem (the library's own)


def test_bad_backward_inputs_raise_alike():
    q, k, v, do, _ = make((1, 20, 2, 2, 16), torch.float32, 16, False)
    o, lse = EXT.call_forward(q, k, v, None, True, 0, 0.0, "flash", None)
    for what, (o_, lse_, do_) in {"lse bf16": (o, lse.bfloat16(), do),
                                  "do dtype": (o, lse, do.double()),
                                  "lse rank": (o, lse[0], do)}.items():
        errors = []
        for route in (DLPACK, EXT):
            with pytest.raises((TypeError, ValueError)) as info:
                route.call_backward(q, k, v, o_, lse_, do_, None, True, 0, 0.0, False, "flash",
                                    None)
            errors.append(info.value)
        assert type(errors[0]) is type(errors[1]), what
        assert str(errors[0]) == str(errors[1]), what


def test_extension_arguments_are_checked():
    """What only the extension sees (the wrappers pass checked arguments): a non-tensor, a
    wrong argument count or type is a TypeError naming it; a bad configuration text the
    library's ValueError, as the nanobind module's parse gives it."""
    ext = EXT.extension
    q, k, v, _, _ = make((1, 8, 2, 2, 16), torch.float32, 17, False)
    with pytest.raises(TypeError, match="q is a list, not a torch.Tensor"):
        ext.forward([1.0], k, v, None, False, 0, 0.0, "flash", None)
    with pytest.raises(TypeError, match="takes 9 positional arguments, got 3"):
        ext.forward(q, k, v)
    with pytest.raises(TypeError, match="causal must be a bool"):
        ext.forward(q, k, v, None, 1, 0, 0.0, "flash", None)
    with pytest.raises(TypeError, match="window must be an int"):
        ext.forward(q, k, v, None, False, 1.5, 0.0, "flash", None)
    with pytest.raises(TypeError, match="impl must be a str"):
        ext.forward(q, k, v, None, False, 0, 0.0, None, None)
    with pytest.raises(ValueError) as ours:
        ext.forward(q, k, v, None, False, 0, 0.0, "flash", "fwd=7x7")
    with pytest.raises(ValueError) as module:
        attention.KernelConfig.parse("fwd=7x7")
    assert str(ours.value) == str(module.value)


@pytest.mark.parametrize("route", ["extension", "op"])
def test_outputs_outlive_their_inputs(route):
    """The outputs own the library's memory (at::for_blob with a deleter): they stay valid
    after the inputs, the other outputs and the call's tensors are gone, and free without
    trouble."""
    q, k, v, do, _ = make((2, 40, 4, 2, 32), torch.float32, 18, False)
    want = [t.clone() for t in DLPACK.call_forward(q, k, v, None, True, 0, 0.0, "flash", None)]
    if route == "extension":
        o, lse = EXT.call_forward(q, k, v, None, True, 0, 0.0, "flash", None)
    else:
        pytest.importorskip("flashtrain.torch")
        o, lse = torch.ops.flashtrain.attention_forward(q, k, v, None, True, 0, 0.0, "flash", "",
                                                        False)
    del q, k, v
    gc.collect()
    churn = [torch.randn(2, 40, 4, 32) for _ in range(20)]  # reuse of freed memory shows
    assert torch.equal(o, want[0])
    view = lse[0]
    del lse
    gc.collect()
    assert torch.equal(view, want[1][0]) and torch.equal(o * 1.0, want[0])
    del o, view, churn
    gc.collect()


def test_ops_schemas_are_the_custom_ops():
    """Either registration (the extension's C++ ops, or the Python custom ops of the DLPack
    route) defines the ops with the same schemas; the extension's when it serves."""
    ft = pytest.importorskip("flashtrain.torch")
    ops = torch.ops.flashtrain
    assert str(ops.attention_forward.default._schema) == (
        "flashtrain::attention_forward(Tensor q, Tensor k, Tensor v, Tensor? segment_ids, "
        "bool causal, SymInt window, float scale, str impl, str config, bool deterministic) -> "
        "(Tensor, Tensor)")
    assert str(ops.attention_backward.default._schema) == (
        "flashtrain::attention_backward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, "
        "Tensor do, Tensor? segment_ids, bool causal, SymInt window, float scale, str impl, "
        "str config, bool deterministic) -> (Tensor, Tensor, Tensor)")
    defined_in_python = ops.attention_forward.default._defined_in_python
    assert defined_in_python == (ft._TORCH.extension is None)


def test_ops_are_registered_once():
    """register_ops() defines the C++ ops once: again it does nothing where they are the
    extension's, and where the Python custom ops came first it is a RuntimeError (no crash), the
    ops working on."""
    ft = pytest.importorskip("flashtrain.torch")
    if ft._TORCH.extension is not None:
        assert EXT.extension.register_ops() is None
    else:
        with pytest.raises(RuntimeError, match="multiple times"):
            EXT.extension.register_ops()
    q, k, v, _, _ = make((1, 8, 2, 2, 16), torch.float32, 23, False)
    o, _ = torch.ops.flashtrain.attention_forward(q, k, v, None, True, 0, 0.0, "flash", "", False)
    assert_same_bits(o, DLPACK.call_forward(q, k, v, None, True, 0, 0.0, "flash", None)[0], "o")


def test_op_errors_are_the_calls():
    """The C++ ops raise the library's errors as the Python ops do: TypeError and ValueError
    with the same message."""
    ft = pytest.importorskip("flashtrain.torch")
    q, k, v, _, _ = make((1, 8, 2, 2, 16), torch.float32, 19, False)
    op = ft._forward_op
    with pytest.raises(TypeError, match="q has dtype float16"):
        op(q.half(), k.half(), v.half(), None, False, 0, 0.0, "flash", "", False)
    with pytest.raises(ValueError, match="is not contiguous"):
        op(q.transpose(1, 2).contiguous().transpose(1, 2), k, v, None, False, 0, 0.0, "flash",
           "", False)


# ---------------------------------------------------------------- on the GPU

CUDA = (torch.cuda.is_available() and EXT.extension.built_with_cuda()
        and attention.built_with_cuda())
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a GPU and CUDA builds of the extension "
                                                 "and the module")


def cuda_routes(q, k, v, do, seg, deterministic, **kw):
    """both_routes on the GPU; a backward without a deterministic path here skips."""
    try:
        return both_routes(q, k, v, do, seg, deterministic=deterministic, **kw)
    except ValueError as e:
        if deterministic and "deterministic" in str(e):
            pytest.skip(f"no deterministic backward here: {e}")
        raise


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mask", ["causal", "causal+window+segments"])
def test_cuda_same_bits_as_the_dlpack_route(dtype, mask):
    """The same kernels on the same stream: the same bits (bf16's backward deterministic, so
    that its dQ sums are ordered), segment ids on the GPU and on the CPU."""
    causal, window, segments = MASKS[mask]
    q, k, v, do, seg = make((2, 300, 8, 2, 128), dtype, 20, segments)
    q, k, v, do = (t.cuda() for t in (q, k, v, do))
    for ids in ([None] if seg is None else [seg.cuda(), seg]):
        dlpack, ext = cuda_routes(q, k, v, do, ids, dtype == torch.bfloat16, causal=causal,
                                  window=window, scale=0.0, impl="flash")
        for name, a, b in zip(NAMES, dlpack, ext):
            assert_same_bits(a, b, name)
        assert ext[0].device == q.device


@needs_cuda
def test_cuda_runs_on_the_current_stream_and_outputs_outlive_inputs():
    """On a side stream the extension's outputs equal the default stream's, made from inputs
    written just before on that stream; they outlive the inputs, and their memory goes back to
    the pool on that stream when dropped (a later call reuses it without trouble)."""
    q, k, v, do, _ = make((2, 300, 8, 2, 128), torch.bfloat16, 21, False)
    want = EXT.call_forward(q.cuda(), k.cuda(), v.cuda(), None, True, 0, 0.0, "flash", None)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        qs, ks, vs = (t.cuda() * 1.0 for t in (q, k, v))
        o, lse = EXT.call_forward(qs, ks, vs, None, True, 0, 0.0, "flash", None)
        del qs, ks, vs
        gc.collect()
        churn = [torch.randn(2, 300, 8, 128, device="cuda") for _ in range(8)]
        total = o.float().sum()
    side.synchronize()
    assert_same_bits(o, want[0], "o")
    assert_same_bits(lse, want[1], "lse")
    assert torch.isfinite(total)
    with torch.cuda.stream(side):
        del o, lse, churn
        gc.collect()
        again = EXT.call_forward(q.cuda(), k.cuda(), v.cuda(), None, True, 0, 0.0, "flash", None)
    side.synchronize()
    assert_same_bits(again[0], want[0], "o again")


@needs_cuda
def test_cuda_errors_alike():
    """A misaligned GPU input and a CPU tensor beside GPU ones: the DLPack route's errors."""
    q, k, v, _, _ = make((1, 64, 4, 4, 64), torch.bfloat16, 22, False)
    q, k, v = (t.cuda() for t in (q, k, v))
    flat = torch.empty(q.numel() + 1, dtype=q.dtype, device="cuda")
    misaligned = flat[1:].view(q.shape)
    misaligned.copy_(q)
    for bad in (dict(q=misaligned), dict(k=k.cpu())):
        args = dict(dict(q=q, k=k, v=v), **bad)
        errors = []
        for route in (DLPACK, EXT):
            with pytest.raises((TypeError, ValueError)) as info:
                route.call_forward(args["q"], args["k"], args["v"], None, True, 0, 0.0, "flash",
                                   None)
            errors.append(info.value)
        assert type(errors[0]) is type(errors[1]) and str(errors[0]) == str(errors[1])


@needs_cuda
def test_cuda_memory_comes_from_pytorchs_allocator():
    """The library's GPU memory in the extension's calls comes from PyTorch's caching allocator:
    torch.cuda.memory_allocated() counts the outputs while they live (the calls' scratch is given
    back at their end) and is where it was once they are dropped."""
    q, k, v, do, _ = make((2, 300, 8, 2, 128), torch.bfloat16, 23, False)
    q, k, v, do = (t.cuda() for t in (q, k, v, do))
    EXT.call_forward(q, k, v, None, True, 0, 0.0, "flash", None)  # the first call installs it
    gc.collect()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    o, lse = EXT.call_forward(q, k, v, None, True, 0, 0.0, "flash", None)
    grads = EXT.call_backward(q, k, v, o, lse, do, None, True, 0, 0.0, False, "flash", None)
    torch.cuda.synchronize()
    outputs = sum(t.untyped_storage().nbytes() for t in (o, lse, *grads))
    held = torch.cuda.memory_allocated() - before
    # PyTorch rounds each block up to 512 bytes; the backward's fp32 dQ buffer (2.4 MB) is not
    # among what is held.
    assert outputs <= held <= outputs + 5 * 512, (held, outputs)
    del o, lse, grads
    gc.collect()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before
