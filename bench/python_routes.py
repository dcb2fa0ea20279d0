"""Host time per call of flashtrain's two routes for PyTorch tensors, back to back in one process:
the DLPack route (the nanobind module: capsules in, torch._C._from_dlpack out) and the extension
(flashtrain._torch_ext: at::Tensor in and out), for each entry point:

  attention.forward       flashtrain.attention.forward(q, k, v, causal=True), no autograd
  flash_attn_func         flashtrain.torch.flash_attn_func(q, k, v, causal=True), no autograd
  flash_attn_func (grad)  the same on leaves that require grad (the autograd.Function's forward)
and with --dir fwd+bwd also
  attention.forward+backward   forward, then flashtrain.attention.backward
  flash_attn_func+grad         forward, then torch.autograd.grad of q, k, v

The kernels are the same on both routes, so the difference is the routes' host time. A second
table times, on the same inputs, the routes' module calls without their Python wrappers beside
the library's forward called back to back from C++ in this process (the nanobind module's
_forward_loop: the floor any binding adds to). Each round
times, for every entry point, --calls back-to-back calls on one route and then on the other (the
order alternating from round to round), each after a synchronize: the C++ bench's "idle" method
(bench/python_attention.py). Per entry point: the median over --rounds rounds of each route's
host us per call, and the median of the rounds' paired differences (extension minus DLPack, the
saving when negative) with the spread of those differences (their 25th..75th percentiles), which
is what says whether a difference is more than noise.

  OMP_NUM_THREADS=1 python3 bench/python_routes.py --device cpu --dtype fp32,bf16
  OMP_NUM_THREADS=1 python3 bench/python_routes.py --device cpu --shape 1,16,1,64   # host-bound
  python3 bench/python_routes.py --device cuda --dir fwd,fwd+bwd                     # the GPU

Prints Markdown on stdout (--jsonl FILE keeps the rows); exits 2 without the extension.
"""
import argparse
import contextlib
import json
import platform
import statistics
import sys
import time

import torch

SHAPE = "1,128,4,64"  # bench/python_attention.py's tiny case: B, S, H (q and kv), D
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
DIRS = ("fwd", "fwd+bwd")


def log(*parts):
    print(*parts, file=sys.stderr, flush=True)


def routes():
    """{"dlpack": route, "extension": route or None}: flashtrain.attention's two routes for
    PyTorch tensors, built here whichever the package picked (the extension's None where it
    cannot load)."""
    from flashtrain import attention
    found = {"dlpack": attention._Torch(torch), "extension": None}
    extension = attention._torch_extension(torch)
    if extension is not None:
        found["extension"] = attention._TorchExtension(torch, extension)
    return found


@contextlib.contextmanager
def use_route(route):
    """flashtrain.attention and flashtrain.torch call through `route` inside the block."""
    from flashtrain import attention
    import flashtrain.torch as ft_torch
    saved = attention._torch, ft_torch._TORCH
    attention._torch = ft_torch._TORCH = route
    try:
        yield
    finally:
        attention._torch, ft_torch._TORCH = saved


def entry_points(shape, dtype, device, directions):
    """[(name, direction, fn())] on one set of inputs."""
    from flashtrain import attention
    from flashtrain.torch import flash_attn_func
    b, s, h, d = shape
    gen = torch.Generator(device="cpu").manual_seed(0)
    q, k, v, dout = (torch.randn(b, s, h, d, generator=gen).to(device=device, dtype=dtype)
                     for _ in range(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    points = []
    if "fwd" in directions:
        points += [
            ("attention.forward", "fwd", lambda: attention.forward(q, k, v, causal=True)),
            ("flash_attn_func", "fwd", lambda: flash_attn_func(q, k, v, causal=True)),
            ("flash_attn_func (grad)", "fwd", lambda: flash_attn_func(*leaves, causal=True)),
        ]
    if "fwd+bwd" in directions:
        def attention_step():
            o, lse = attention.forward(q, k, v, causal=True)
            return attention.backward(q, k, v, o, lse, dout, causal=True)

        def func_step():
            return torch.autograd.grad(flash_attn_func(*leaves, causal=True), leaves, dout)
        points += [("attention.forward+backward", "fwd+bwd", attention_step),
                   ("flash_attn_func+grad", "fwd+bwd", func_step)]
    return points


def module_calls(shape, dtype, device):
    """[(name, fn(calls) -> host us per call)]: the routes' module calls alone (no wrapper) and
    the library's forward looped in C++, on one set of inputs (forward, causal)."""
    from flashtrain import attention
    b, s, h, d = shape
    q, k, v = (torch.randn(b, s, h, d).to(device=device, dtype=dtype) for _ in range(3))
    found = routes()
    dlpack, ext = found["dlpack"].call_forward, found["extension"].call_forward
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0

    def timed(fn):
        return lambda calls: host_us(fn, calls, device)
    return [
        ("library forward looped in C++ (the floor)",
         lambda calls: attention._ext._forward_loop(q, k, v, True, stream, calls)),
        ("extension: _torch_ext.forward", timed(lambda: ext(q, k, v, None, True, 0, 0.0, "flash",
                                                             None))),
        ("DLPack: _Torch.call_forward (to_dlpack x3, module forward, _from_dlpack x2)",
         timed(lambda: dlpack(q, k, v, None, True, 0, 0.0, "flash", None))),
    ]


def measure_calls(calls, args, device):
    """Rows: the median over rounds (the calls interleaved) of each call's host us."""
    samples = {name: [] for name, _ in calls}
    for _, fn in calls:
        fn(args.warmup)
    for i in range(args.rounds):
        for name, fn in (calls if i % 2 == 0 else reversed(calls)):
            synchronize(device)
            samples[name].append(fn(args.calls))
    return [dict(call=name, host_us=statistics.median(samples[name]), runs=samples[name])
            for name, _ in calls]


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def host_us(fn, calls, device):
    """Host us per call of `calls` back-to-back calls, after a synchronize."""
    synchronize(device)
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter_ns() - start
    synchronize(device)
    return elapsed / 1e3 / calls


def quartiles(values):
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def measure(points, found, args, device):
    """Rows: per entry point, each route's median and the paired differences' median and
    quartiles."""
    samples = {(name, r): [] for name, _, _ in points for r in found}
    for name, _, fn in points:  # warm-up
        for route in found.values():
            with use_route(route):
                for _ in range(args.warmup):
                    fn()
    for i in range(args.rounds):
        for name, _, fn in points:
            order = list(found) if i % 2 == 0 else list(reversed(found))
            for r in order:
                with use_route(found[r]):
                    samples[(name, r)].append(host_us(fn, args.calls, device))
        log(f"round {i + 1}/{args.rounds}")
    rows = []
    for name, direction, _ in points:
        dlpack, ext = samples[(name, "dlpack")], samples[(name, "extension")]
        diffs = [e - d for e, d in zip(ext, dlpack)]
        low, high = quartiles(diffs)
        rows.append(dict(entry=name, dir=direction, dlpack_us=statistics.median(dlpack),
                         extension_us=statistics.median(ext),
                         difference_us=statistics.median(diffs), difference_q1=low,
                         difference_q3=high, dlpack_runs=dlpack, extension_runs=ext))
    return rows


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--dtype", default="fp32,bf16", type=lambda s: s.split(","),
                    help="comma list of fp32, bf16")
    ap.add_argument("--shape", default=SHAPE,
                    type=lambda s: tuple(int(x) for x in s.split(",")),
                    help=f"B,S,H,D, causal (default {SHAPE}: python_attention.py's tiny case)")
    ap.add_argument("--dir", default=["fwd"], type=lambda s: s.split(","),
                    help="fwd, fwd+bwd or both (comma list)")
    ap.add_argument("--calls", type=int, default=200, help="back-to-back calls per timing")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=20, help="calls of each before the rounds")
    ap.add_argument("--jsonl", help="write every row here as JSON lines")
    args = ap.parse_args(argv)
    for name in args.dtype:
        if name not in DTYPES:
            ap.error(f"unknown --dtype '{name}' (allowed: {', '.join(DTYPES)})")
    for direction in args.dir:
        if direction not in DIRS:
            ap.error(f"unknown --dir '{direction}' (allowed: {', '.join(DIRS)})")
    if len(args.shape) != 4 or min(args.shape) < 1:
        ap.error("--shape is B,S,H,D, each >= 1")
    for name in ("calls", "rounds"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    found = routes()
    if found["extension"] is None:
        log("python_routes: flashtrain._torch_ext does not load here (built without PyTorch, "
            "against another version, or FLASHTRAIN_TORCH_EXT=0): nothing to compare")
        return 2
    b, s, h, d = args.shape
    cpu = cpu_name()
    threads = torch.get_num_threads()
    lines = ["# flashtrain's PyTorch routes: host us per call (bench/python_routes.py)", "",
             f"device {device} ({cpu}), torch {torch.__version__}, Python "
             f"{platform.python_version()}, torch threads {threads}; B={b} S={s} H={h} D={d} "
             f"causal; median of {args.rounds} rounds of {args.calls} back-to-back calls, the "
             "routes alternating; difference: extension minus DLPack, median of the rounds' "
             "paired differences [25th..75th percentile]", "",
             "| dtype | entry point | DLPack us | extension us | difference us |",
             "|---|---|---:|---:|---:|"]
    jsonl = open(args.jsonl, "w") if args.jsonl else None
    calls = ["", "The module calls alone (forward; median host us per call):", "",
             "| dtype | call | host us |", "|---|---|---:|"]
    for name in args.dtype:
        points = entry_points(args.shape, DTYPES[name], device, args.dir)
        rows = measure(points, found, args, device)
        for row in rows:
            lines.append(f"| {name} | {row['entry']} | {row['dlpack_us']:.2f} | "
                         f"{row['extension_us']:.2f} | {row['difference_us']:+.2f} "
                         f"[{row['difference_q1']:+.2f}..{row['difference_q3']:+.2f}] |")
        pieces = measure_calls(module_calls(args.shape, DTYPES[name], device), args, device)
        for row in pieces:
            calls.append(f"| {name} | {row['call']} | {row['host_us']:.2f} |")
        for row in rows + pieces:
            row.update(dtype=name, device=str(device), shape=list(args.shape))
            if jsonl:
                jsonl.write(json.dumps(row) + "\n")
    if jsonl:
        jsonl.close()
    lines += calls
    print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
