"""flashtrain.torch (flash-attn's interface) against PyTorch's math SDPA in float64, on the CPU
and, where there is one, the GPU: forward and every gradient for causal, window, varlen and GQA
masks, head dims 64 and 128 (the GPU's kernels); bf16 within 2x PyTorch's own bf16 error; the
custom ops under torch.library.opcheck and torch.compile(fullgraph=True); the caller's stream;
and the arguments flash-attn has and we do not. Skips without PyTorch (CI has none)."""

import math

import pytest

torch = pytest.importorskip("torch")
ft = pytest.importorskip("flashtrain.torch")
from flashtrain import attention as ft_attention  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

F = torch.nn.functional

DEVICES = ["cpu"]
if torch.cuda.is_available() and ft_attention.built_with_cuda():
    DEVICES.append("cuda")

# fp32 against fp64: a few ulp times slowly growing factors of the reduction lengths; the
# project's fp32 bar. A wrong mask, index or scale gives errors of order 1.
FP32_BOUND = 1e-5


def rel(got, want):
    got, want = got.double(), want.double()
    assert torch.isfinite(got).all()
    return ((got - want).norm() / want.norm()).item()


def window_mask(S, left, right, device):
    """bool [S, S] of flash-attn's window: keys in [i - left, i + right], -1 unbounded."""
    i = torch.arange(S, device=device)[:, None]
    j = torch.arange(S, device=device)[None, :]
    keep = torch.ones(S, S, dtype=torch.bool, device=device)
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    return keep


def sdpa_math(q, k, v, mask, scale=None):
    """PyTorch's math SDPA on [B, S, H, D] with a bool mask [S, S] (or [B, 1, S, S])."""
    with sdpa_kernel(SDPBackend.MATH):
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), attn_mask=mask, scale=scale,
                                           enable_gqa=True)
    return o.transpose(1, 2)


def inputs(B, S, H, Hkv, D, device, dtype, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    shapes = [(B, S, H, D), (B, S, Hkv, D), (B, S, Hkv, D), (B, S, H, D)]
    return [torch.randn(s, generator=g, dtype=torch.float64).to(device) for s in shapes]


def run_both(fn_ours, fn_ref, tensors, dtype):
    """(ours: out and grads from dtype inputs, ref: out and grads in float64)."""
    q, k, v, do = tensors
    ours_in = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
    o = fn_ours(*ours_in)
    o.backward(do.to(dtype))
    r = fn_ref(*ref_in)
    r.backward(do)
    return [o] + [t.grad for t in ours_in], [r] + [t.grad for t in ref_in]


MASKS = {  # (causal, window_size)
    "none": (False, (-1, -1)),
    "causal": (True, (-1, -1)),
    "causal+window": (True, (40, -1)),
    "window left only": (False, (33, -1)),
    "window (left, 0)": (False, (25, 0)),
}


def head_dims(device):
    return [64, 128] if device == "cuda" else [32, 64]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("heads", [(4, 4), (8, 2)])
@pytest.mark.parametrize("d_index", [0, 1])
def test_fp32_matches_float64_math_sdpa(device, mask, heads, d_index):
    causal, window = MASKS[mask]
    D = head_dims(device)[d_index]
    S = 197
    tensors = inputs(2, S, heads[0], heads[1], D, device, torch.float32)
    keep = window_mask(S, window[0], 0 if causal else window[1], device)
    ours, ref = run_both(lambda q, k, v: ft.flash_attn_func(q, k, v, causal=causal,
                                                            window_size=window),
                         lambda q, k, v: sdpa_math(q, k, v, keep), tensors, torch.float32)
    for name, a, b in zip(("out", "dq", "dk", "dv"), ours, ref):
        assert a.dtype == torch.float32 and a.shape == b.shape
        assert rel(a, b) < FP32_BOUND, name


@pytest.mark.parametrize("device", DEVICES)
def test_softmax_scale(device):
    tensors = inputs(1, 50, 2, 1, 64, device, torch.float32, seed=1)
    keep = window_mask(50, -1, 0, device)
    ours, ref = run_both(lambda q, k, v: ft.flash_attn_func(q, k, v, softmax_scale=0.07,
                                                            causal=True),
                         lambda q, k, v: sdpa_math(q, k, v, keep, scale=0.07), tensors,
                         torch.float32)
    for a, b in zip(ours, ref):
        assert rel(a, b) < FP32_BOUND


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_matches_per_document_sdpa(device, causal):
    lengths = [37, 1, 100, 64]
    total = sum(lengths) + 6  # rows past cu_seqlens[-1] are padding
    D = head_dims(device)[-1]
    q, k, v, do = (t[0] for t in inputs(1, total, 4, 2, D, device, torch.float32, seed=2))
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32,
                      device=device)
    window = (20, -1)
    qs, ks, vs = (t.float().requires_grad_() for t in (q, k, v))
    o = ft.flash_attn_varlen_func(qs, ks, vs, cu, cu, max(lengths), max(lengths), causal=causal,
                                  window_size=window)
    o.backward(do.float())
    ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
    pieces = []
    for begin, end in zip(cu[:-1].tolist(), cu[1:].tolist()):
        n = end - begin
        keep = window_mask(n, window[0], 0 if causal else -1, device)
        pieces.append(sdpa_math(*(t[None, begin:end] for t in ref_in), keep)[0])
    r = torch.cat(pieces)
    r.backward(do[:cu[-1]])
    end = int(cu[-1])
    assert rel(o[:end], r) < FP32_BOUND
    assert torch.all(o[end:] == 0)
    for a, b in zip((qs, ks, vs), ref_in):
        assert rel(a.grad[:end], b.grad[:end]) < FP32_BOUND
        assert torch.all(a.grad[end:] == 0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mask", ["causal", "causal+window"])
def test_bf16_within_twice_pytorchs_own_bf16_error(device, mask):
    causal, window = MASKS[mask]
    D = head_dims(device)[-1]
    S = 256
    tensors = inputs(2, S, 8, 2, D, device, torch.bfloat16, seed=3)
    tensors = [t.to(torch.bfloat16).double() for t in tensors]  # the same rounded inputs
    keep = window_mask(S, window[0], 0, device)
    ours, ref = run_both(lambda q, k, v: ft.flash_attn_func(q, k, v, causal=causal,
                                                            window_size=window),
                         lambda q, k, v: sdpa_math(q, k, v, keep), tensors, torch.bfloat16)
    # PyTorch's own bf16 attention on the same inputs (its default backend for the device).
    theirs, _ = run_both(lambda q, k, v: F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=keep,
        enable_gqa=True).transpose(1, 2), lambda q, k, v: sdpa_math(q, k, v, keep), tensors,
        torch.bfloat16)
    for name, a, b, c in zip(("out", "dq", "dk", "dv"), ours, ref, theirs):
        assert a.dtype == torch.bfloat16
        err, their_err = rel(a, b), rel(c, b)
        assert err <= 2 * their_err + 1e-3, (name, err, their_err)


def test_custom_ops_pass_opcheck():
    q, k, v, _ = inputs(2, 19, 4, 2, 32, "cpu", torch.float32, seed=4)
    q, k, v = (t.float().requires_grad_() for t in (q, k, v))
    seg = torch.tensor([[0] * 10 + [1] * 7 + [-1] * 2, [0] * 19], dtype=torch.int32)
    for args in ((q, k, v, None, True, 0, 0.0, "flash", "", False),
                 (q, k, v, seg, False, 5, 0.3, "naive", "", True)):
        torch.library.opcheck(torch.ops.flashtrain.attention_forward.default, args)


class TinyGPT(torch.nn.Module):
    """Two pre-norm blocks whose attention is flash_attn_func, with GQA."""

    def __init__(self, vocab=97, width=64, heads=4, kv_heads=2, layers=2):
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, width // heads
        self.embed = torch.nn.Embedding(vocab, width)
        self.blocks = torch.nn.ModuleList()
        for _ in range(layers):
            self.blocks.append(torch.nn.ModuleDict({
                "norm": torch.nn.LayerNorm(width),
                "qkv": torch.nn.Linear(width, (heads + 2 * kv_heads) * self.d),
                "proj": torch.nn.Linear(width, width),
                "mlp": torch.nn.Sequential(torch.nn.LayerNorm(width),
                                           torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                           torch.nn.Linear(4 * width, width))}))
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, tokens, targets):
        B, T = tokens.shape
        x = self.embed(tokens)
        for blk in self.blocks:
            qkv = blk["qkv"](blk["norm"](x))
            q, k, v = qkv.split([self.heads * self.d, self.kv_heads * self.d,
                                 self.kv_heads * self.d], dim=-1)
            y = ft.flash_attn_func(q.view(B, T, self.heads, self.d),
                                   k.view(B, T, self.kv_heads, self.d),
                                   v.view(B, T, self.kv_heads, self.d), causal=True,
                                   window_size=(24, 0))
            x = x + blk["proj"](y.reshape(B, T, -1))
            x = x + blk["mlp"](x)
        return F.cross_entropy(self.head(x).flatten(0, 1), targets.flatten())


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph_gives_eager_loss_and_gradients(device):
    torch.manual_seed(0)
    model = TinyGPT().to(device)
    tokens = torch.randint(0, 97, (2, 40), device=device)
    targets = torch.randint(0, 97, (2, 40), device=device)
    loss = model(tokens, targets)
    loss.backward()
    eager = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    loss_c = compiled(tokens, targets)
    loss_c.backward()
    assert abs(loss_c.item() - loss.item()) <= 1e-5 * abs(loss.item())
    for name, p in model.named_parameters():
        assert rel(p.grad, eager[name]) < 1e-5, name


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a GPU and a CUDA build")
def test_runs_on_the_callers_stream():
    stream = torch.cuda.Stream()
    q, k, v, do = inputs(2, 300, 8, 2, 128, "cuda", torch.bfloat16, seed=5)
    want = ft.flash_attn_func(*(t.to(torch.bfloat16) for t in (q, k, v)), causal=True)
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        # Inputs made on the side stream just before the call: a launch on any other stream
        # could read them unwritten.
        qs, ks, vs = (t.to(torch.bfloat16) * 1.0 for t in (q, k, v))
        got = ft.flash_attn_func(qs, ks, vs, causal=True)
        total = got.float().sum()
    stream.synchronize()
    assert torch.equal(got, want) and torch.isfinite(total)


@pytest.mark.parametrize("device", DEVICES)
def test_what_flash_attn_has_and_we_do_not_raises(device):
    q, k, v, _ = (t.float() for t in inputs(1, 16, 4, 2, 64, device, torch.float32, seed=6))
    cases = [
        (dict(dropout_p=0.1), NotImplementedError, "dropout_p"),
        (dict(return_attn_probs=True), NotImplementedError, "return_attn_probs"),
        (dict(softcap=30.0), NotImplementedError, "softcap"),
        (dict(alibi_slopes=torch.ones(4)), NotImplementedError, "alibi"),
        (dict(window_size=(4, 3)), NotImplementedError, "right = 3"),
        (dict(window_size=(-2, 0)), ValueError, "each side"),
        (dict(window_size=7), TypeError, "pair"),
        (dict(softmax_scale=0.0), ValueError, "nonzero"),
    ]
    for kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            ft.flash_attn_func(q, k, v, **kwargs)
    # A right edge past the keys is unbounded (flash-attn's rule), and causal ignores it.
    ft.flash_attn_func(q, k, v, window_size=(4, 16))
    ft.flash_attn_func(q, k, v, causal=True, window_size=(4, 3))
    with pytest.raises(TypeError, match="float16"):
        ft.flash_attn_func(q.half(), k.half(), v.half())
    with pytest.raises(NotImplementedError, match="head dim 12"):
        ft.flash_attn_func(q[..., :12], k[..., :12], v[..., :12])
    with pytest.raises(NotImplementedError, match="lengths that differ"):
        ft.flash_attn_func(q, k[:, :8], v[:, :8])
    with pytest.raises(ValueError, match="multiple of the kv heads"):
        ft.flash_attn_func(q[:, :, :3], k, v)
    with pytest.raises(ValueError, match="4-D"):
        ft.flash_attn_func(q[0], k[0], v[0])
    cu = torch.tensor([0, 10, 16], dtype=torch.int32, device=device)
    with pytest.raises(NotImplementedError, match="differ"):
        ft.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu.flip(0).neg() + 16, 10, 10)
    with pytest.raises(TypeError, match="deterministic"):
        ft.flash_attn_func(q, k, v, deterministic=1)


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_gradients_are_bit_identical(device):
    """deterministic=True: two backwards of the same inputs give the same bits (on the GPU in
    bf16 through the tma backward, where the device has it), and the values of the default."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q, k, v, do = (t.to(dtype) for t in inputs(2, 300, 8, 2, 64, device, dtype, seed=7))
    runs = []
    for deterministic in (True, True, False):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        try:
            out = ft.flash_attn_func(*leaves, causal=True, deterministic=deterministic)
            runs.append(torch.autograd.grad(out, leaves, do))
        except ValueError as e:  # a GPU without the deterministic path says why
            assert "deterministic" in str(e), e
            pytest.skip(f"no deterministic backward here: {e}")
    for a, b in zip(runs[0], runs[1]):
        assert torch.equal(a, b)
    for a, b in zip(runs[0], runs[2]):
        assert rel(a.double(), b.double()) < (2e-2 if dtype == torch.bfloat16 else 1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_eager_and_custom_op_routes_agree(device):
    """flash_attn_func's eager route (autograd.Function, or no autograd) and the custom ops
    (what torch.compile runs) give the same bits."""
    q, k, v, do = (t.float() for t in inputs(2, 77, 4, 2, 64, device, torch.float32, seed=8))
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    eager = ft.flash_attn_func(*leaves, causal=True)
    eager_grads = torch.autograd.grad(eager, leaves, do)
    with torch.no_grad():
        plain = ft.flash_attn_func(q, k, v, causal=True)
    op_out, _ = torch.ops.flashtrain.attention_forward(*leaves, None, True, 0, 0.0, "flash", "",
                                                       False)
    op_grads = torch.autograd.grad(op_out, leaves, do)
    assert torch.equal(eager, plain) and torch.equal(eager, op_out)
    for a, b in zip(eager_grads, op_grads):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_common_call_and_general_route_agree(device):
    """flash_attn_func's common call (flash-attn's default keywords, plain tensors: no checks
    before the module) and the general route (here: a window_size tuple that is not the default
    object, nn.Parameter inputs) give the same bits, with and without autograd."""
    q, k, v, do = (t.float() for t in inputs(1, 29, 4, 2, 64, device, torch.float32, seed=10))
    params = [torch.nn.Parameter(t.clone()) for t in (q, k, v)]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    common = ft.flash_attn_func(*leaves, causal=True)
    general = ft.flash_attn_func(*params, causal=True, window_size=(-1, -1))
    assert torch.equal(common, general)
    for a, b in zip(torch.autograd.grad(common, leaves, do), torch.autograd.grad(general, params,
                                                                                  do)):
        assert torch.equal(a, b)
    with torch.no_grad():
        assert torch.equal(ft.flash_attn_func(q, k, v, causal=True), common)


@pytest.mark.parametrize("device", DEVICES)
def test_strided_inputs_are_made_contiguous(device):
    """q, k, v sliced out of a fused QKV tensor (strided) give what contiguous copies give."""
    B, T, H, D = 2, 33, 4, 64
    qkv = torch.randn(B, T, 3, H, D, device=device)
    q, k, v = qkv.unbind(2)
    assert not q.is_contiguous()
    got = ft.flash_attn_func(q, k, v, causal=True)
    want = ft.flash_attn_func(q.contiguous(), k.contiguous(), v.contiguous(), causal=True)
    assert torch.equal(got, want)
    assert math.isfinite(got.sum().item())


@pytest.mark.parametrize("device", DEVICES)
def test_attention_on_torch_tensors_both_routes_agree(device):
    """flashtrain.attention on PyTorch tensors: the capsule route (tensors that require grad
    taken as they are, the outputs made into tensors by the module) and the general route (a
    stream= handle: __dlpack__ and DLPack objects) give the same bits; raw capsules out (no
    from_capsule) import into PyTorch, and one never imported is freed with its capsule."""
    q, k, v, do = (t.float() for t in inputs(1, 40, 4, 2, 64, device, torch.float32, seed=9))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    stream = torch.cuda.current_stream().cuda_stream if device == "cuda" else 0
    kw = dict(causal=True, window=7)
    o, lse = ft_attention.forward(*leaves, **kw)
    grads = ft_attention.backward(*leaves, o, lse, do, **kw)
    o2, lse2 = ft_attention.forward(*leaves, stream=stream, **kw)
    grads2 = ft_attention.backward(*leaves, o2, lse2, do, stream=stream, **kw)
    assert isinstance(o, torch.Tensor) and o.device == q.device and not o.requires_grad
    assert lse.dtype == torch.float32 and lse.shape == (1, 4, 40)
    for a, b in zip((o, lse, *grads), (o2, lse2, *grads2)):
        assert torch.equal(a, b)
    to = torch.utils.dlpack.to_dlpack
    capsules = ft_attention._ext.forward(to(q), to(k), to(v), None, True, 7, 0.0, "flash", None,
                                         stream, None, ft_attention._EXPORT_CAPSULE, None)
    assert torch.equal(torch.utils.dlpack.from_dlpack(capsules[0]), o)
    del capsules  # lse's capsule was never imported: its destructor frees it
