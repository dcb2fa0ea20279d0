"""Attention from Python: flashtrain's two Python entry points beside PyTorch SDPA's backends and
the C++ bench, on the same shapes, in one call.

Times, per case (every one causal, bf16), "fwd" (forward only) and "fwd+bwd" (forward then the
gradients of q, k, v, as a training step makes them) of
  ft-func    flashtrain.torch.flash_attn_func (under autograd) on the DLPack route
  ft-dlpack  flashtrain.attention.forward / backward on PyTorch tensors through DLPack
  ft-func-ext, ft-ext  the same two through flashtrain._torch_ext (at::Tensor in and out; a row
             with the reason where the package was built without it)
  sdpa-cudnn / sdpa-flash / sdpa-efficient  F.scaled_dot_product_attention under sdpa_kernel()
      with that one backend (enable_gqa for GQA; a backend that refuses it runs on k and v
      expanded beforehand, outside the timing, and its row says "kv expanded")
and, in the same call, build-gpu/carry/bench_attention_gpu (the C++ bench: the library called
directly) on each shape ("c++" rows; its fwd+bwd is its forward plus its backward).

Cases: gpt2 B=8 S=1024 H=12 D=64; hero-causal B=32 S=4096 Hq=16 Hkv=4 D=128; tiny B=1 S=128
H=4 D=64, where launch overhead dominates.

Two numbers per row:
  GPU ms    CUDA events around each call after warm-up (--warmup calls and --warmup-ms), median
            of --iters, inputs rotated past 4x L2, a queue of fills ahead of the timed calls so
            that host work overlaps kernels (the method of bench_attention_gpu and
            bench/torch_attention_peer.py, whose helpers this script uses).
  host us   host time per call, two ways:
            idle   the C++ bench's own method (bench_attention_gpu's host_ms_per_call): after a
                   synchronize, --host-calls calls back to back on a GPU that starts idle, their
                   mean; here the median of --host-rounds such rounds, and the C++ bench's the
                   median of --cxx-runs runs (one round each).
            queue  the same calls behind a queue of fills that keeps the GPU busy for the whole
                   round (median of --host-rounds rounds), so that a call that waits on the GPU
                   shows as a long host time. The C++ bench has no such number.
            "binding" is the Python host time minus the C++ one, both measured the C++ bench's
            way: what the binding costs per call (issue 20: under 5 us). The library's forward
            called back to back from C++ in this process (_forward_loop) is timed both ways too:
            the GPU's state changes the library's own host time (cudaMallocAsync/cudaFreeAsync
            and the launch behind 2.5 ms of queued work against an idle GPU), so a Python time
            taken behind a queue is not comparable with the C++ bench's. On a shape where the GPU
            takes longer per call than the host, host times can include waits on a full launch
            queue; the tiny case is the one that measures the binding.
  pieces    on the smallest case chosen, the host time per call of each piece of one
            flashtrain.attention.forward, measured as host us is: the current-stream query, the
            DLPack exports and imports, the module call stopped after each of its stages
            (_forward_probe: arguments converted; device and stream set; inputs wrapped; the
            library's forward), its outputs as capsules and as tensors, the library's forward
            called back to back from C++ in this process (_forward_loop: on torch's stream and
            on the C++ bench's cudaStreamPerThread), the wrappers, the backward's module call,
            and the autograd round trip beside PyTorch's own for a built-in op and for an
            identity autograd.Function; then what each step adds (differences of medians), to
            say where the binding's time goes (--no-parts leaves it out).

  python3 bench/python_attention.py                          # every case, every impl
  python3 bench/python_attention.py --case tiny --impl ft-dlpack,ft-func --host-calls 100
  python3 bench/python_attention.py --device cpu --case tiny --iters 3 --warmup-ms 0  # logic

Prints Markdown (the GPU, versions, one table per case, the binding's overhead) on stdout and
progress on stderr; --jsonl FILE keeps every row as a JSON line. Exits 1 when a flashtrain row
or the C++ bench failed (a PyTorch backend that refuses a shape is a row, not a failure).
"""
import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import python_routes  # noqa: E402  (flashtrain's two routes for PyTorch tensors)
import torch_attention_peer as peer  # noqa: E402  (the shared timing method)

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
CASES = {
    "gpt2": dict(batch=8, seq_len=1024, q_heads=12, kv_heads=12, head_dim=64),
    "hero-causal": dict(batch=32, seq_len=4096, q_heads=16, kv_heads=4, head_dim=128),
    "tiny": dict(batch=1, seq_len=128, q_heads=4, kv_heads=4, head_dim=64),
}
FT_IMPLS = ("ft-func", "ft-dlpack", "ft-func-ext", "ft-ext")
SDPA_IMPLS = {"sdpa-cudnn": "CUDNN_ATTENTION", "sdpa-flash": "FLASH_ATTENTION",
              "sdpa-efficient": "EFFICIENT_ATTENTION", "sdpa-math": "MATH"}
DEFAULT_IMPLS = "ft-func,ft-dlpack,ft-func-ext,ft-ext,sdpa-cudnn,sdpa-flash,sdpa-efficient"
DIRS = ("fwd", "fwd+bwd")
# Binding calls a direction makes: fwd+bwd is a forward call, then a backward call.
CALLS_PER_DIR = {"fwd": 1, "fwd+bwd": 2}
BINDING_TARGET_US = 5.0


def log(*parts):
    print(*parts, file=sys.stderr, flush=True)


def flop(spec, direction):
    """4 * attended pairs * D forward, 2.5x that backward; causal pairs counted exactly."""
    S = spec["seq_len"]
    pairs = spec["batch"] * spec["q_heads"] * S * (S + 1) // 2
    fwd = 4.0 * pairs * spec["head_dim"]
    return fwd if direction == "fwd" else 3.5 * fwd


# ---------------------------------------------------------------- the C++ bench


def cxx_command(binary, spec, args):
    """bench_attention_gpu on one shape: the gpt2 preset with every shape flag given, flash only,
    --warmup one more than --host-calls so that its host time per call covers as many calls
    (its host_ms_per_call: the calls after the first, back to back on an idle GPU)."""
    return [binary, "--case", "gpt2", "--impl", "flash", "--dtype", "bf16",
            "--batch", str(spec["batch"]), "--seq-len", str(spec["seq_len"]),
            "--q-heads", str(spec["q_heads"]), "--kv-heads", str(spec["kv_heads"]),
            "--head-dim", str(spec["head_dim"]), "--window", "0", "--docs", "0",
            "--warmup", str(max(args.warmup, args.host_calls + 1)),
            "--warmup-ms", str(args.warmup_ms), "--iters", str(args.iters),
            "--max-sets", str(args.max_sets)]


def parse_cxx(stdout):
    """{"fwd": row, "bwd": row} from bench_attention_gpu's JSON lines (the meta line skipped)."""
    rows = {}
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        if row.get("meta") or row.get("impl") != "flash":
            continue
        rows[row["dir"]] = row
    return rows


def cxx_rows(case, spec, args):
    """The C++ bench's fwd and fwd+bwd on this shape as rows of ours, or one row with the
    reason it gave none. It runs --cxx-runs times: its host time per call is one round of
    --host-calls calls a run, so the rows take the median of the runs' (GPU times: the first
    run's); host_us_runs keeps each."""
    binary = args.cxx_bench
    base = dict(side="c++", impl="c++", case=case, **spec)
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        return [dict(base, dir="fwd", error=f"no C++ bench at {binary} (carry "
                     "build-gpu/carry.tar.xz from scripts/build_gpu.sh, or pass --cxx-bench)")]
    cmd = cxx_command(binary, spec, args)
    log(f"{case} c++: {' '.join(cmd)} (x{args.cxx_runs})")
    runs = []
    for _ in range(args.cxx_runs):
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=args.cxx_timeout)
        except subprocess.TimeoutExpired:
            return [dict(base, dir="fwd", error=f"timed out after {args.cxx_timeout} s")]
        if run.stderr.strip() and not runs:
            log("\n".join("  c++: " + line for line in run.stderr.strip().splitlines()))
        got = parse_cxx(run.stdout)
        if run.returncode != 0 or "fwd" not in got:
            tail = (run.stderr.strip().splitlines() or ["no output"])[-1]
            return [dict(base, dir="fwd", error=f"exit {run.returncode}: {tail}")]
        runs.append(got)
    out = []
    fwd, bwd = runs[0]["fwd"], runs[0].get("bwd", {})
    for direction in DIRS:
        row = dict(base, dir=direction, flop=flop(spec, direction), gpu=fwd.get("gpu"))
        parts = [fwd] if direction == "fwd" else [fwd, bwd]
        errors = [p["error"] for p in parts if "error" in p or not p]
        if any("median_ms" not in p for p in parts):
            row["error"] = errors[0] if errors else "no timing"
        else:
            row["median_ms"] = sum(p["median_ms"] for p in parts)
            row["min_ms"] = sum(p["min_ms"] for p in parts)
            row["max_ms"] = sum(p["max_ms"] for p in parts)
            each = [1e3 * sum(r[p].get("host_ms_per_call", float("nan"))
                              for p in (("fwd",) if direction == "fwd" else ("fwd", "bwd")))
                    for r in runs]
            row["host_us_runs"] = each
            row["host_us"] = row["host_us_idle"] = statistics.median(each)
            row["tflops"] = row["flop"] / (row["median_ms"] * 1e9)
            row["config"] = fwd.get("config")
        out.append(row)
    return out


# ---------------------------------------------------------------- the Python side


def make_sets(spec, args, dtype, device, count):
    """The peer's input sets ([B, H, S, D] views of [B, S, H, D] memory, leaves for SDPA) with
    flashtrain's [B, S, H, D] leaves over the same memory beside them."""
    sets = peer.make_input_sets(spec, args, dtype, device, count)
    for s in sets:
        for name in ("q", "k", "v"):
            s["ft_" + name] = s[name].detach().transpose(1, 2).requires_grad_()
        s["ft_dout"] = s["dout"].transpose(1, 2)
        assert s["ft_q"].is_contiguous() and s["ft_dout"].is_contiguous()
    return sets


class NoExtension(RuntimeError):
    """A -ext impl where flashtrain._torch_ext does not load: a row with the reason, not a
    failure of the run (a package built without PyTorch has no such route)."""


def flashtrain_route(impl):
    """The block an impl of ours is timed in: flashtrain calling through its route (the DLPack
    route, or the extension for the -ext impls); NoExtension where the extension does not
    load."""
    found = python_routes.routes()
    route = found["extension" if impl.endswith("-ext") else "dlpack"]
    if route is None:
        raise NoExtension("flashtrain._torch_ext does not load here (built without PyTorch, "
                           "against another version, or FLASHTRAIN_TORCH_EXT=0)")
    return python_routes.use_route(route)


def flashtrain_step(impl, direction):
    """call(s) for one of our impls on a set of make_sets."""
    if impl in ("ft-func", "ft-func-ext"):
        from flashtrain.torch import flash_attn_func

        def forward(s):
            return flash_attn_func(s["ft_q"], s["ft_k"], s["ft_v"], causal=True)

        def step(s):
            out = forward(s)
            torch.autograd.grad(out, (s["ft_q"], s["ft_k"], s["ft_v"]), s["ft_dout"])
        return forward if direction == "fwd" else step
    from flashtrain import attention

    def forward_dlpack(s):
        return attention.forward(s["ft_q"], s["ft_k"], s["ft_v"], causal=True)

    def step_dlpack(s):
        o, lse = forward_dlpack(s)
        attention.backward(s["ft_q"], s["ft_k"], s["ft_v"], o, lse, s["ft_dout"], causal=True)
    return forward_dlpack if direction == "fwd" else step_dlpack


def sdpa_step(direction, gqa):
    """call(s) for SDPA; the caller holds sdpa_kernel() around the timing."""
    def forward(s):
        if gqa:
            return F.scaled_dot_product_attention(s["q"], s["k"], s["v"], is_causal=True,
                                                  enable_gqa=True)
        return F.scaled_dot_product_attention(s["q"], s["k"], s["v"], is_causal=True)

    def step(s):
        out = forward(s)
        torch.autograd.grad(out, (s["q"], s["k"], s["v"]), s["dout"])
    return forward if direction == "fwd" else step


def try_once(step, s):
    """None, or the error text of one call, with the warnings PyTorch gave about why a backend
    refused it."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            step(s)
            return None
        except Exception as e:  # noqa: BLE001 - every failure becomes a row
            why = f"{type(e).__name__}: {str(e).strip()}"
            notes = "; ".join(str(w.message).strip() for w in caught)
            return why + (f" (warnings: {notes})" if notes else "")


def _timed_rounds(fn, args, device, fill=None):
    """Median and min over --host-rounds of the host time per call of --host-calls back-to-back
    calls of fn(i), each round after a synchronize and, with fill = (queue, ms), behind that
    many milliseconds of queued GPU work."""
    samples = []
    for _ in range(args.host_rounds):
        peer.synchronize(device)
        if fill is not None:
            fill[0].enqueue(fill[1])
        t0 = time.perf_counter()
        for i in range(args.host_calls):
            fn(i)
        samples.append((time.perf_counter() - t0) * 1e6 / args.host_calls)
        peer.synchronize(device)
    return statistics.median(samples), min(samples)


def host_us(fn, args, device, queue, host_ms_guess):
    """Host us per call of fn(i) (median, min over rounds), each round behind fills that keep
    the GPU busy past its end."""
    return _timed_rounds(fn, args, device, (queue, 1.5 * host_ms_guess * args.host_calls + 1.0))


def idle_host_us(fn, args, device, queue=None, host_ms_guess=None):
    """The C++ bench's method (bench_attention_gpu's host_ms_per_call): after a synchronize,
    --host-calls back-to-back calls of fn(i) on an idle GPU, their mean; median and min over
    --host-rounds rounds."""
    return _timed_rounds(fn, args, device)


def loop_host_us(loop, args, device, queue):
    """Median and min over --host-rounds of what loop(calls) returns (host us per call of
    --host-calls calls made back to back in C++), each round behind fills as host_us's are."""
    samples = []
    for _ in range(args.host_rounds):
        peer.synchronize(device)
        queue.enqueue(1.5 * 0.02 * args.host_calls + 1.0)
        samples.append(loop(args.host_calls))
        peer.synchronize(device)
    return statistics.median(samples), min(samples)


def loop_idle_host_us(loop, args, device, queue=None):
    """loop_host_us the C++ bench's way: each round after a synchronize, no fills."""
    samples = []
    for _ in range(args.host_rounds):
        peer.synchronize(device)
        samples.append(loop(args.host_calls))
        peer.synchronize(device)
    return statistics.median(samples), min(samples)


class _Identity(torch.autograd.Function):
    """The smallest Python autograd.Function: what any attention written as one (flash-attn's
    FlashAttnFunc, ours) pays in PyTorch's autograd before its own work."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


def binding_parts(case, s, args, device, queue):
    """Rows of host us per call for the pieces of one flashtrain.attention.forward (what it
    does around the C++ call, and the module call itself, stage by stage), so that one run says
    where the binding's time goes; and of the autograd round trip beside PyTorch's own cost of
    one for a built-in op and for a Python autograd.Function."""
    from flashtrain import attention
    from flashtrain.torch import flash_attn_func
    ext = attention._ext
    q, k, v = (s["ft_" + n].detach() for n in "qkv")
    leaves = tuple(s["ft_" + n] for n in "qkv")
    dout = s["ft_dout"]
    cuda = device.type == "cuda"
    stream = torch.cuda.current_stream(device).cuda_stream if cuda else 0

    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    index = device.index if device.index is not None else 0
    to_dlpack = torch.utils.dlpack.to_dlpack
    from_capsule = getattr(torch._C, "_from_dlpack", torch.utils.dlpack.from_dlpack)
    capsule = attention._EXPORT_CAPSULE

    def module_stage(stage):  # forward's stages (module.cpp, Stage) on capsules of q, k, v
        return lambda _: ext._forward_probe(stage, to_dlpack(q), to_dlpack(k), to_dlpack(v), None,
                                            True, 0, 0.0, "flash", None, stream, None, capsule,
                                            from_capsule)

    def module_forward(_):  # what attention.forward does for tensors on the current stream
        return ext.forward(to_dlpack(q), to_dlpack(k), to_dlpack(v), None, True, 0, 0.0, "flash",
                           None, stream, None, capsule, from_capsule)

    def module_capsules(_):  # the same without making tensors of the outputs
        return ext.forward(to_dlpack(q), to_dlpack(k), to_dlpack(v), None, True, 0, 0.0, "flash",
                           None, stream, None, capsule, None)

    o_saved, lse_saved = attention.forward(q, k, v, causal=True)
    dout_plain = dout.detach()

    def module_backward(_):  # what attention.backward does for tensors on the current stream
        return ext.backward(to_dlpack(q), to_dlpack(k), to_dlpack(v), to_dlpack(o_saved),
                            to_dlpack(lse_saved), to_dlpack(dout_plain), None, True, 0, 0.0,
                            False, "flash", None, stream, None, capsule, from_capsule)

    def dlpack_step(_):
        o, lse = attention.forward(*leaves, causal=True)
        attention.backward(*leaves, o, lse, dout, causal=True)

    side = torch.cuda.Stream(device) if cuda else None
    found = python_routes.routes()

    def on_route(route, fn):  # fn timed with flashtrain calling through `route`
        def routed(timer):
            def timed(*timer_args):
                with python_routes.use_route(route):
                    return timer(*timer_args)
            return timed
        return fn, routed

    def on_side_stream(fn):  # fn, its fills and its outputs' frees on a stream of its own
        def on_side(timer):
            def timed(*timer_args):
                with torch.cuda.stream(side):
                    return timer(*timer_args)
            return timed
        return fn, on_side

    out_dlpack = ext.forward(q, k, v, None, True, 0, 0.0, "flash", None, stream, None,
                             attention._EXPORT_DLPACK, None)[0]
    # (name, fn(i) for host_us); a "loop:" piece's fn(calls) returns the host us per call of
    # that many back-to-back calls made in C++; a "fwd+bwd:" piece is a training step's calls.
    parts = []
    if cuda:
        parts += [
            ("torch.cuda.current_stream(device).cuda_stream",
             lambda _: torch.cuda.current_stream(device).cuda_stream),
            ("torch._C._cuda_getCurrentRawStream(index)", lambda _: raw_stream(index)),
        ]
    parts += [
        ("tensor.detach()", lambda _: q.detach()),
        ("tensor.__dlpack__(stream=...) (CPU: none)",
         lambda _: q.__dlpack__(stream=stream or 1) if cuda else q),
        ("torch.utils.dlpack.to_dlpack(tensor)", lambda _: to_dlpack(q)),
        ("3 x torch.utils.dlpack.to_dlpack(tensor)",
         lambda _: (to_dlpack(q), to_dlpack(k), to_dlpack(v))),
        ("torch.from_dlpack(a DLPack object)", lambda _: torch.from_dlpack(out_dlpack)),
        ("torch._C._from_dlpack(object.__dlpack__())",
         lambda _: from_capsule(out_dlpack.__dlpack__())),
        ("module stage 0: 3 capsules made and converted (nanobind's call)", module_stage(0)),
        ("module stage 1: + device and stream set", module_stage(1)),
        ("module stage 2: + inputs wrapped, problem checked", module_stage(2)),
        ("module stage 3: + the library's forward (outputs freed in C++)", module_stage(3)),
        ("module forward: 3 capsules in, 2 capsules out", module_capsules),
        ("module forward: 3 capsules in, 2 tensors out", module_forward),
        ("loop: library forward from C++ in this process, on torch's current stream",
         lambda calls: ext._forward_loop(q, k, v, True, stream, calls)),
    ]
    parts.append(("flashtrain.attention.forward",
                  lambda _: attention.forward(q, k, v, causal=True)))
    if cuda:
        parts.append(("flashtrain.attention.forward on a side stream (not the legacy default)",
                      on_side_stream(lambda _: attention.forward(q, k, v, causal=True))))
    if found["extension"] is not None:
        torch_ext = found["extension"].extension
        parts += [
            ("extension: _torch_ext.forward, 3 tensors in, 2 tensors out",
             lambda _: torch_ext.forward(q, k, v, None, True, 0, 0.0, "flash", None)),
            ("extension: flashtrain.attention.forward",
             on_route(found["extension"], lambda _: attention.forward(q, k, v, causal=True))),
            ("extension: flash_attn_func, no autograd",
             on_route(found["extension"], lambda _: flash_attn_func(q, k, v, causal=True))),
            ("extension: bwd: _torch_ext.backward, 6 tensors in, 3 tensors out",
             lambda _: torch_ext.backward(q, k, v, o_saved, lse_saved, dout_plain, None, True, 0,
                                          0.0, False, "flash", None)),
        ]
    parts += [
        ("flash_attn_func, no autograd", lambda _: flash_attn_func(q, k, v, causal=True)),
        ("flash_attn_func, inputs that require grad (forward only)",
         lambda _: flash_attn_func(*leaves, causal=True)),
        ("bwd: module backward: 6 capsules in, 3 tensors out", module_backward),
        ("bwd: flashtrain.attention.backward",
         lambda _: attention.backward(q, k, v, o_saved, lse_saved, dout_plain, causal=True)),
        ("fwd+bwd: flashtrain.attention.forward + backward (no autograd)", dlpack_step),
        ("fwd+bwd: x * 2.0 + autograd.grad (a built-in op's C++ backward)",
         lambda _: torch.autograd.grad(leaves[0] * 2.0, leaves[0], dout)),
        ("fwd+bwd: identity autograd.Function + autograd.grad (a Python backward)",
         lambda _: torch.autograd.grad(_Identity.apply(leaves[0]), leaves[0], dout)),
        ("fwd+bwd: flash_attn_func + autograd.grad",
         lambda _: torch.autograd.grad(flash_attn_func(*leaves, causal=True), leaves, dout)),
    ]
    if cuda:
        # Last: once used, cudaStreamPerThread (handle 2, the stream the C++ bench runs on) is a
        # blocking stream that the legacy default stream's later work would be ordered after.
        parts.append(("loop: library forward from C++ in this process, on cudaStreamPerThread "
                      "(the C++ bench's stream)",
                      lambda calls: ext._forward_loop(q, k, v, True, 2, calls)))
    rows = []
    for name, fn in parts:
        direction = name.split(":")[0] if name.startswith(("bwd:", "fwd+bwd:")) else "fwd"
        row = dict(side="profile", impl="part", case=case, dir=direction, part=name)
        try:
            # Each piece both ways (see the top): behind fills, and the C++ bench's way.
            fn, wrap = fn if isinstance(fn, tuple) else (fn, lambda timer: timer)
            guess_ms = 0.1 if direction == "fwd" else 0.5
            if name.startswith("loop:"):
                fn(1)
                timers = ((loop_host_us, ()), (loop_idle_host_us, ()))
            else:
                fn(0)
                timers = ((host_us, (guess_ms,)), (idle_host_us, (guess_ms,)))
            (queue_timer, extra), (idle_timer, _) = timers
            row["host_us"], row["host_us_min"] = wrap(queue_timer)(fn, args, device, queue,
                                                                   *extra)
            row["host_us_idle"], row["host_us_idle_min"] = wrap(idle_timer)(fn, args, device,
                                                                            queue, *extra)
        except Exception as e:  # noqa: BLE001 - a piece that fails is a row
            row["error"] = f"{type(e).__name__}: {str(e).strip()}"
        rows.append(row)
        log(f"{case} binding part {name}: {row.get('host_us', row.get('error'))} "
            f"(idle GPU: {row.get('host_us_idle')})")
    return rows


def backend(impl):
    """The context one impl's calls run in: sdpa_kernel() with that one backend for SDPA, ours'
    route for ours."""
    if impl in FT_IMPLS:
        return flashtrain_route(impl)
    if impl not in SDPA_IMPLS:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([getattr(SDPBackend, SDPA_IMPLS[impl])])


def measure(impl, direction, case, spec, sets, args, device, queue, gpu):
    row = dict(side="flashtrain" if impl in FT_IMPLS else "pytorch", impl=impl, case=case,
               dir=direction, **spec, flop=flop(spec, direction), gpu=gpu,
               input_sets=len(sets), iters=args.iters, host_calls=args.host_calls)
    gqa = spec["q_heads"] != spec["kv_heads"]
    try:
        with backend(impl):
            if impl in FT_IMPLS:
                step = flashtrain_step(impl, direction)
                error = try_once(step, sets[0])
            else:
                step = sdpa_step(direction, gqa)
                error = try_once(step, sets[0])
                if error and gqa:
                    expanded = peer.expand_kv(sets, spec["q_heads"] // spec["kv_heads"])
                    step = sdpa_step(direction, False)
                    error2 = try_once(step, expanded[0])
                    if error2:
                        error = f"enable_gqa: {error} | kv expanded: {error2}"
                    else:
                        error, sets = None, expanded
                        row["note"] = "kv expanded"
            if error:
                raise RuntimeError(error)
            timed = peer.time_calls(lambda i, _: step(sets[i % len(sets)]), args, device, queue)
            host, host_min = host_us(lambda i: step(sets[i % len(sets)]), args, device, queue,
                                     timed["host_ms_per_call"])
            idle, idle_min = idle_host_us(lambda i: step(sets[i % len(sets)]), args, device)
    except Exception as e:  # noqa: BLE001 - a failing impl is a row, not a crash
        row["error"] = str(e).strip() or type(e).__name__
        row["unavailable"] = isinstance(e, NoExtension)
        log(f"{case} {impl} {direction}: {row['error']}")
        return row
    row.update(median_ms=timed["median_ms"], min_ms=timed["min_ms"], max_ms=timed["max_ms"],
               host_us=host, host_us_min=host_min, host_us_idle=idle, host_us_idle_min=idle_min,
               tflops=row["flop"] / (timed["median_ms"] * 1e9))
    log(f"{case} {impl} {direction}: {row['median_ms']:.4f} ms, {row['tflops']:.1f} TFLOP/s, "
        f"host {host:.1f} us/call (idle GPU: {idle:.1f})")
    return row


# ---------------------------------------------------------------- report


def versions(device):
    meta = peer.meta_row(device)
    info = dict(gpu=meta.get("gpu", device.type), torch=torch.__version__,
                cuda=meta.get("cuda"), cudnn=meta.get("cudnn"), sms=meta.get("sms"),
                l2_bytes=meta.get("l2_bytes"), python=platform.python_version())
    try:
        import flashtrain
        from flashtrain import attention
        info["flashtrain"] = flashtrain.__version__
        info["flashtrain_cuda"] = bool(attention.built_with_cuda())
        info["flashtrain_path"] = os.path.dirname(flashtrain.__file__)
    except Exception as e:  # noqa: BLE001 - the SDPA rows still mean something
        info["flashtrain_error"] = f"{type(e).__name__}: {e}"
    try:
        query = ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]
        info["nvidia_smi"] = subprocess.run(query, capture_output=True, text=True,
                                            timeout=30).stdout.strip().splitlines()[0]
    except Exception:  # noqa: BLE001 - optional
        pass
    return info


def header(info, args):
    lines = ["# Attention from Python beside PyTorch SDPA and the C++ bench "
             "(bench/python_attention.py)", ""]
    gpu = info["gpu"] + (f" ({info['sms']} SMs)" if info.get("sms") else "")
    if info.get("nvidia_smi"):
        gpu += f"; nvidia-smi: {info['nvidia_smi']}"
    lines.append(f"GPU: {gpu}")
    ft = (f"flashtrain {info['flashtrain']} ({'CUDA' if info['flashtrain_cuda'] else 'CPU only'}"
          f", {info['flashtrain_path']})" if "flashtrain" in info
          else f"flashtrain: {info.get('flashtrain_error')}")
    lines.append(f"torch {info['torch']}, CUDA {info['cuda']}, cuDNN {info['cudnn']}, {ft}, "
                 f"Python {info['python']}")
    lines.append(f"bf16, causal; GPU ms: median of {args.iters} (events, queue ahead); host us: "
                 f"median of {args.host_rounds} rounds of {args.host_calls} back-to-back calls, "
                 "behind a queue of fills (queue) and as the C++ bench times them, on a GPU "
                 f"that starts idle (idle; the C++ bench: median of {args.cxx_runs} runs); "
                 "TFLOP/s from 4*pairs*D forward, 3.5x that forward+backward")
    return lines


def fmt(row, key, spec):
    value = row.get(key)
    return "" if value is None else format(value, spec)


def case_table(case, spec, rows):
    shape = (f"B={spec['batch']} S={spec['seq_len']} Hq={spec['q_heads']} "
             f"Hkv={spec['kv_heads']} D={spec['head_dim']}")
    lines = ["", f"## {case}: {shape}", "",
             "| impl | dir | GPU ms (median) | min .. max | TFLOP/s | host us/call idle | "
             "host us/call queue | note |",
             "|---|---|---:|---|---:|---:|---:|---|"]
    for row in rows:
        if row["side"] == "profile":
            continue
        if "error" in row:
            why = " ".join(row["error"].split())
            why = why if len(why) <= 300 else why[:300] + " ..."
            lines.append(f"| {row['impl']} | {row['dir']} | | | | | | {why} |")
            continue
        span = f"{row['min_ms']:.4f} .. {row['max_ms']:.4f}"
        note = row.get("note", "") or (f"config {row['config']}" if row.get("config") else "")
        queue = "" if row["impl"] == "c++" else fmt(row, "host_us", ".1f")
        lines.append(f"| {row['impl']} | {row['dir']} | {fmt(row, 'median_ms', '.4f')} | {span} "
                     f"| {fmt(row, 'tflops', '.1f')} | {fmt(row, 'host_us_idle', '.1f')} | "
                     f"{queue} | {note} |")
    return lines


# What each step of flashtrain.attention.forward adds: (step, later piece, earlier piece), the
# difference of the two pieces' medians (pieces of binding_parts, by the start of their names).
STEPS = [
    ("nanobind's call: 13 arguments, 3 capsules converted", "module stage 0",
     "3 x torch.utils.dlpack.to_dlpack"),
    ("device and stream set (CallContext)", "module stage 1", "module stage 0"),
    ("inputs wrapped, problem checked", "module stage 2", "module stage 1"),
    ("the library's forward called from Python, outputs freed", "module stage 3",
     "module stage 2"),
    ("... of which the library itself (its C++ loop on the same stream)",
     "loop: library forward from C++ in this process, on torch's", None),
    ("the C++ loop in this process against the C++ bench (its process, build and stream)",
     "loop: library forward from C++ in this process, on cudaStreamPerThread", "C++ bench"),
    ("2 outputs exported as capsules (freed by Python)",
     "module forward: 3 capsules in, 2 capsules", "module stage 3"),
    ("2 capsules made into tensors (torch._C._from_dlpack) and freed by PyTorch",
     "module forward: 3 capsules in, 2 tensors", "module forward: 3 capsules in, 2 capsules"),
    ("flashtrain.attention's Python wrapper", "flashtrain.attention.forward",
     "module forward: 3 capsules in, 2 tensors"),
    ("flash_attn_func's Python wrapper", "flash_attn_func, no autograd",
     "flashtrain.attention.forward"),
    ("flashtrain.attention.backward's Python wrapper", "bwd: flashtrain.attention.backward",
     "bwd: module backward"),
    ("legacy default stream against a side stream (whole call)", "flashtrain.attention.forward",
     "flashtrain.attention.forward on a side stream"),
    ("torch's current stream against cudaStreamPerThread (C++ loop)",
     "loop: library forward from C++ in this process, on torch's",
     "loop: library forward from C++ in this process, on cudaStreamPerThread"),
    ("autograd.Function.apply (forward only)", "flash_attn_func, inputs that require grad",
     "flash_attn_func, no autograd"),
    ("autograd.grad around a Python autograd.Function, beyond a built-in op's",
     "fwd+bwd: identity autograd.Function", "fwd+bwd: x * 2.0"),
    ("the extension's call beyond the library's (its C++ loop on the same stream)",
     "extension: _torch_ext.forward", "loop: library forward from C++ in this process, on torch's"),
    ("the extension's call against the DLPack module call (3 capsules in, 2 tensors out)",
     "extension: _torch_ext.forward", "module forward: 3 capsules in, 2 tensors"),
    ("flashtrain.attention.forward: extension against DLPack route",
     "extension: flashtrain.attention.forward", "flashtrain.attention.forward"),
    ("flash_attn_func (no autograd): extension against DLPack route",
     "extension: flash_attn_func, no autograd", "flash_attn_func, no autograd"),
]


def parts_lines(rows, cxx_rows):
    """Where the host time of flashtrain.attention.forward goes, beside the C++ bench's: each
    piece both ways (idle: the C++ bench's method; queue: behind fills), then what each step
    adds (differences of medians, so within the pieces' spread)."""
    if not rows:
        return []
    case = rows[0]["case"]
    rows = list(rows)
    for r in cxx_rows:
        if r["dir"] == "fwd" and "host_us" in r:
            runs = ", ".join(f"{x:.2f}" for x in r.get("host_us_runs", []))
            rows.insert(0, dict(part=f"C++ bench: attention::forward (runs: {runs})",
                                host_us_idle=r["host_us"], host_us_idle_min=min(
                                    r.get("host_us_runs", [r["host_us"]]))))
    lines = ["", f"## Host us per call of the pieces of flashtrain.attention.forward ({case})", "",
             "| piece | idle (C++ bench's way), median | min | queue (behind fills), median | "
             "min |", "|---|---:|---:|---:|---:|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['part']} | {' '.join(r['error'].split())[:200]} | | | |")
        else:
            lines.append(f"| {r['part']} | {fmt(r, 'host_us_idle', '.2f')} | "
                         f"{fmt(r, 'host_us_idle_min', '.2f')} | {fmt(r, 'host_us', '.2f')} | "
                         f"{fmt(r, 'host_us_min', '.2f')} |")

    def median_of(prefix, key):
        for r in rows:
            if r["part"].startswith(prefix) and key in r:
                return r[key]
        return None
    steps = []
    for step, later, earlier in STEPS:
        cells = []
        for key in ("host_us_idle", "host_us"):
            a = median_of(later, key)
            b = 0.0 if earlier is None else median_of(earlier, key)
            cells.append("" if a is None or b is None else f"{a - b:+.2f}")
        if any(cells):
            steps.append(f"| {step} | {' | '.join(cells)} |")
    if steps:
        lines += ["", "What each step adds (difference of the two pieces' medians):", "",
                  "| step | idle | queue |", "|---|---:|---:|"] + steps
    return lines


def binding_lines(rows_by_case):
    """Python host time minus the C++ bench's, per case and direction, for our two entry
    points, both measured the C++ bench's way (idle); the verdict from the tiny case."""
    lines = ["", "## Binding overhead: host us, Python minus the C++ bench", "",
             "(both timed the C++ bench's way: back-to-back calls after a synchronize; behind "
             "fills the library's own host time differs, see the pieces; a fwd+bwd row is two "
             "calls, forward then backward, and its verdict below is per call)", "",
             f"| case | dir | C++ host us | {' | '.join(FT_IMPLS)} | C++ GPU ms |",
             "|---|---|---:|" + "---:|" * len(FT_IMPLS) + "---:|"]
    verdict = []
    for case, rows in rows_by_case.items():
        for direction in DIRS:
            def find(impl):
                for r in rows:
                    if r["impl"] == impl and r["dir"] == direction and "host_us_idle" in r:
                        return r
                return None
            cxx = find("c++")
            if cxx is None:
                continue
            cells = []
            for impl in FT_IMPLS:
                r = find(impl)
                over = None if r is None else r["host_us_idle"] - cxx["host_us_idle"]
                cells.append("" if r is None else f"{over:+.1f}")
                if r is not None and case == "tiny":
                    verdict.append((impl, direction, over))
            lines.append(f"| {case} | {direction} | {cxx['host_us_idle']:.1f} | "
                         f"{' | '.join(cells)} | {cxx['median_ms']:.4f} |")
    if len(lines) == 7:
        return lines + ["", "(no C++ rows: nothing to compare)"]
    lines.append("")
    for impl, direction, us in verdict:
        calls = CALLS_PER_DIR[direction]
        per_call = us / calls
        met = "under" if per_call < BINDING_TARGET_US else "NOT under"
        pair = f" ({us:+.1f} us over {calls} calls)" if calls > 1 else ""
        lines.append(f"- tiny {direction}, {impl}: {per_call:+.1f} us per call{pair}, {met} "
                     f"the {BINDING_TARGET_US:.0f} us target")
    return lines


# ---------------------------------------------------------------- main


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", default=list(CASES), type=lambda s: s.split(","),
                    help=f"comma list of {', '.join(CASES)} (default: all)")
    ap.add_argument("--impl", default=DEFAULT_IMPLS.split(","), type=lambda s: s.split(","),
                    help=f"comma list of {', '.join(FT_IMPLS + tuple(SDPA_IMPLS))} "
                         f"(default: {DEFAULT_IMPLS})")
    ap.add_argument("--dir", default=list(DIRS), type=lambda s: s.split(","),
                    help="fwd, fwd+bwd or both (comma list)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--warmup-ms", type=float, default=300.0,
                    help="keep warming up until this many milliseconds have passed")
    ap.add_argument("--iters", type=int, default=20, help="event-timed calls (median)")
    ap.add_argument("--max-sets", type=int, default=64, help="at most this many input sets")
    ap.add_argument("--host-calls", type=int, default=50,
                    help="back-to-back calls per host-timing round (also the C++ bench's)")
    ap.add_argument("--host-rounds", type=int, default=5)
    ap.add_argument("--cxx-bench", default=os.path.join(REPO, "build-gpu", "carry",
                                                        "bench_attention_gpu"),
                    help="bench_attention_gpu; '' to leave the C++ rows out")
    ap.add_argument("--cxx-timeout", type=float, default=300.0, help="seconds per C++ run")
    ap.add_argument("--cxx-runs", type=int, default=3,
                    help="C++ bench runs per case (its host time: the median of theirs)")
    ap.add_argument("--no-parts", dest="parts", action="store_false",
                    help="leave out the host time of the binding's pieces (smallest case)")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu to exercise the logic")
    ap.add_argument("--jsonl", help="write every row (and the versions) here as JSON lines")
    args = ap.parse_args(argv)
    for name in args.case:
        if name not in CASES:
            ap.error(f"unknown --case '{name}' (allowed: {', '.join(CASES)})")
    for impl in args.impl:
        if impl not in FT_IMPLS and impl not in SDPA_IMPLS:
            ap.error(f"unknown --impl '{impl}' (allowed: "
                     f"{', '.join(FT_IMPLS + tuple(SDPA_IMPLS))})")
    for direction in args.dir:
        if direction not in DIRS:
            ap.error(f"unknown --dir '{direction}' (allowed: {', '.join(DIRS)})")
    for name in ("iters", "host_calls", "host_rounds", "max_sets", "cxx_runs"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    args.layout = "bshd"  # the peer's input sets: [B, S, H, D] memory, as flashtrain reads
    return args


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        log("python_attention: no CUDA device visible to torch")
        return 2
    dtype = torch.bfloat16
    # The C++ bench first, before this process holds GPU memory.
    cxx = {}
    for case in args.case:
        cxx[case] = cxx_rows(case, CASES[case], args) if args.cxx_bench else []
    info = versions(device)
    jsonl = open(args.jsonl, "w") if args.jsonl else None
    if jsonl:
        jsonl.write(json.dumps(dict(meta=True, **info)) + "\n")
    l2_bytes = (info["l2_bytes"] or 60 << 20) if device.type == "cuda" else 0
    queue = peer.QueueAhead(device)
    rows_by_case, failed, parts = {}, False, []
    parts_case = min(args.case, key=lambda c: flop(CASES[c], "fwd"))
    for case in args.case:
        spec = CASES[case]
        count = peer.input_set_count(dict(spec), dtype, l2_bytes, args.max_sets)
        log(f"{case}: {spec}, {count} input set(s)")
        sets = make_sets(dict(spec, window=0, docs=0), args, dtype, device, count)
        rows = [r for r in cxx[case] if r["dir"] in args.dir or "error" in r]
        for impl in args.impl:
            for direction in args.dir:
                rows.append(measure(impl, direction, case, spec, sets, args, device, queue,
                                    info["gpu"]))
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        if args.parts and case == parts_case and "flashtrain" in info:
            try:
                # The DLPack route unless a piece says otherwise.
                with python_routes.use_route(python_routes.routes()["dlpack"]):
                    parts = binding_parts(case, sets[0], args, device, queue)
            except Exception as e:  # noqa: BLE001 - the tables above still stand
                log(f"{case} binding parts: {type(e).__name__}: {e}")
            rows.extend(parts)
        del sets
        rows_by_case[case] = rows
        failed = failed or any("error" in r and not r.get("unavailable") for r in rows
                               if r["side"] in ("flashtrain", "c++"))
        if jsonl:
            for r in rows:
                jsonl.write(json.dumps(r) + "\n")
            jsonl.flush()
    lines = header(info, args)
    for case, rows in rows_by_case.items():
        lines += case_table(case, CASES[case], rows)
    lines += binding_lines(rows_by_case)
    lines += parts_lines(parts, cxx.get(parts[0]["case"], []) if parts else [])
    print("\n".join(lines), flush=True)
    if jsonl:
        jsonl.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
