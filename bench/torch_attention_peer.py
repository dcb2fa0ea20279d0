"""PyTorch peer of bench/bench_attention_gpu.cpp: the same attention cases, timed the same way,
printed as the same JSON lines ("side": "pytorch"), so bench/attention_table.py can put the two
side by side. bench/attention_gpu.sh runs both in one call.

Measures, per case, forward and backward separately:
  sdpa-flash / sdpa-cudnn / sdpa-efficient  F.scaled_dot_product_attention under sdpa_kernel()
      with one backend, is_causal=True; only for cases without window or documents (SDPA has no
      argument for them). GQA with enable_gqa=True; a backend that refuses it runs on k and v
      expanded to the query heads beforehand (repeat_interleave, outside the timing; gradients
      are then taken for the expanded k and v, without the sum over the group) and the row
      says "kv expanded".
  flex  FlexAttention compiled with torch.compile, a create_block_mask() block mask from a
      mask_mod for causal + window + same document; every case.
Method: CUDA events around every call after --warmup calls (and at least --warmup-ms of them),
median/min/max of --iters; inputs rotated through enough copies to exceed 4x L2; a queue of
fills ahead of the timed calls so that host overhead overlaps kernels (see the C++ side).
Backward is torch.autograd.grad(out, (q, k, v), dout, retain_graph=True) on one forward's graph
per input copy. FLOPs: 4 * attended pairs * D
forward, 2.5x backward, pairs counted exactly by evaluating the mask over every (query, key).
q, k, v, dout are [B, S, H, D] in memory (as flashtrain's), handed over as [B, H, S, D] views;
--layout bhsd makes them contiguous [B, H, S, D] instead. A backend that fails gives a row with
the error text.

  python3 bench/torch_attention_peer.py --case hero-causal,gpt2 --impl sdpa-flash,flex
  python3 bench/torch_attention_peer.py --device cpu --case gpt2 --batch 1 --seq-len 128  # logic
"""
import argparse
import json
import math
import statistics
import sys
import time
import traceback
import warnings

import torch
import torch.nn.functional as F

CASES = {
    "hero-causal": dict(batch=32, seq_len=4096, q_heads=16, kv_heads=4, head_dim=128,
                        window=0, docs=0),
    "hero-window-docs": dict(batch=32, seq_len=4096, q_heads=16, kv_heads=4, head_dim=128,
                             window=512, docs=5),
    "gpt2": dict(batch=8, seq_len=1024, q_heads=12, kv_heads=12, head_dim=64, window=0, docs=0),
    "llama-long": dict(batch=1, seq_len=32768, q_heads=32, kv_heads=8, head_dim=64, window=0,
                       docs=0),
    "hero-d256": dict(batch=32, seq_len=4096, q_heads=16, kv_heads=4, head_dim=256, window=0,
                      docs=0),
}
SDPA_IMPLS = {"sdpa-flash": "FLASH_ATTENTION", "sdpa-cudnn": "CUDNN_ATTENTION",
              "sdpa-efficient": "EFFICIENT_ATTENTION", "sdpa-math": "MATH"}
DEFAULT_IMPLS = "sdpa-flash,sdpa-cudnn,sdpa-efficient,flex"
SHAPE_KEYS = ("batch", "seq_len", "q_heads", "kv_heads", "head_dim", "window", "docs")


def log(*parts):
    print(*parts, file=sys.stderr, flush=True)


def emit(row):
    print(json.dumps(row), flush=True)


def document_ids(batch, seq_len, docs, device):
    """The ids of bench_attention_gpu.cpp: the document of position i in row b is the number of
    boundaries k * S // docs + (b % 64), k = 1 .. docs-1, at or before i."""
    pos = torch.arange(seq_len, device=device)[None, :]
    shift = (torch.arange(batch, device=device) % 64)[:, None]
    ids = torch.zeros(batch, seq_len, dtype=torch.int32, device=device)
    for k in range(1, docs):
        ids += (pos >= k * seq_len // docs + shift).to(torch.int32)
    return ids


def make_mask_mod(window, doc):
    """causal, key >= query - (window - 1) when window > 0, same document when doc is given."""
    def mask_mod(b, h, q_idx, kv_idx):
        keep = kv_idx <= q_idx
        if window > 0:
            keep = keep & (kv_idx > q_idx - window)
        if doc is not None:
            keep = keep & (doc[b, q_idx] == doc[b, kv_idx])
        return keep
    return mask_mod


def attended_pairs(spec, mask_mod, device):
    """Exact count over batch and query heads, by evaluating mask_mod on every (query, key)."""
    S = spec["seq_len"]
    q_idx = torch.arange(S, device=device)[:, None]
    kv_idx = torch.arange(S, device=device)[None, :]
    zero = torch.zeros((), dtype=torch.long, device=device)
    rows = range(spec["batch"]) if spec["docs"] > 0 else [0]
    pairs = sum(int(mask_mod(zero + b, zero, q_idx, kv_idx).sum()) for b in rows)
    if spec["docs"] == 0:
        pairs *= spec["batch"]
    return pairs * spec["q_heads"]


def mask_name(spec):
    parts = ["causal"]
    if spec["window"] > 0:
        parts.append(f"window={spec['window']}")
    if spec["docs"] > 0:
        parts.append("segments")
    return "+".join(parts)


class Timer:
    """CUDA events around each call; perf_counter after a synchronize on the CPU."""

    def __init__(self, device, n):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.events = [tuple(torch.cuda.Event(enable_timing=True) for _ in range(2))
                           for _ in range(n)]
        else:
            self.times = [[0.0, 0.0] for _ in range(n)]

    def start(self, i):
        if self.cuda:
            self.events[i][0].record()
        else:
            self.times[i][0] = time.perf_counter()

    def stop(self, i):
        if self.cuda:
            self.events[i][1].record()
        else:
            self.times[i][1] = time.perf_counter()

    def elapsed_ms(self):
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in self.events]
        return [(b - a) * 1e3 for a, b in self.times]


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


class QueueAhead:
    """Keeps the GPU busy while the host queues the timed calls, as the C++ side does."""

    def __init__(self, device):
        self.device = device
        if device.type != "cuda":
            return
        self.scratch = torch.empty(256 << 20, dtype=torch.uint8, device=device)
        self.scratch.zero_()
        t = Timer(device, 1)
        t.start(0)
        for _ in range(4):
            self.scratch.zero_()
        t.stop(0)
        self.fill_ms = max(t.elapsed_ms()[0] / 4, 1e-3)

    def enqueue(self, ms):
        if self.device.type != "cuda":
            return
        for _ in range(math.ceil(min(ms, 500.0) / self.fill_ms)):
            self.scratch.zero_()


def time_calls(call, args, device, queue, prepare=None):
    """call(i, prepare(i)) for the warm-ups, then between two events for each timed call;
    prepare's work is queued before the start event, so it is not timed."""
    run = prepare or (lambda i: None)
    host_ms = 1.0
    if args.warmup > 0:
        call(0, run(0))  # compiles, autotunes, loads modules
        synchronize(device)
        t0 = time.perf_counter()
        for w in range(1, args.warmup):
            call(w, run(w))
        if args.warmup > 1:
            host_ms = (time.perf_counter() - t0) * 1e3 / (args.warmup - 1)
        synchronize(device)
        # and on until --warmup-ms have passed: the GPU's clocks settle under a sustained load
        w = args.warmup
        while (time.perf_counter() - t0) * 1e3 < args.warmup_ms:
            call(w, run(w))
            if w % 8 == 0:
                synchronize(device)
            w += 1
        synchronize(device)
    timer = Timer(device, args.iters)
    queue.enqueue(1.25 * host_ms * args.iters + 0.2)
    for i in range(args.iters):
        ready = run(i)
        timer.start(i)
        call(i, ready)
        timer.stop(i)
    ms = timer.elapsed_ms()
    return dict(median_ms=statistics.median(ms), min_ms=min(ms), max_ms=max(ms),
                host_ms_per_call=host_ms)


def input_set_count(spec, dtype, l2_bytes, max_sets):
    elem = torch.finfo(dtype).bits // 8
    q_bytes = spec["batch"] * spec["seq_len"] * spec["q_heads"] * spec["head_dim"] * elem
    kv_bytes = q_bytes * spec["kv_heads"] // spec["q_heads"]
    set_bytes = 2 * q_bytes + 2 * kv_bytes
    return max(1, min(max_sets, -(-4 * l2_bytes // set_bytes)))


def random_input(shape_bshd, layout, dtype, device, gen):
    """N(0, 1) in [B, S, H, D] memory (or [B, H, S, D] with --layout bhsd), returned as a
    [B, H, S, D] tensor (a transposed view for bshd)."""
    B, S, H, D = shape_bshd
    if layout == "bhsd":
        return torch.randn(B, H, S, D, generator=gen, device=device).to(dtype)
    return torch.randn(B, S, H, D, generator=gen, device=device).to(dtype).transpose(1, 2)


def make_input_sets(spec, args, dtype, device, count):
    gen = torch.Generator(device=device)
    gen.manual_seed(2024)
    B, S, Hq, Hkv, D = (spec[k] for k in ("batch", "seq_len", "q_heads", "kv_heads", "head_dim"))
    sets = []
    for _ in range(count):
        q, k, v = (random_input((B, S, H, D), args.layout, dtype, device, gen).requires_grad_()
                   for H in (Hq, Hkv, Hkv))
        dout = random_input((B, S, Hq, D), args.layout, dtype, device, gen)
        sets.append(dict(q=q, k=k, v=v, dout=dout))
    return sets


def expand_kv(sets, group):
    """k and v repeated to the query heads, as new leaves made before any timing."""
    out = []
    for s in sets:
        k = s["k"].detach().repeat_interleave(group, dim=1).requires_grad_()
        v = s["v"].detach().repeat_interleave(group, dim=1).requires_grad_()
        out.append(dict(q=s["q"], k=k, v=v, dout=s["dout"]))
    return out


def sdpa_attention(backend_name, gqa):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = getattr(SDPBackend, backend_name)

    def attend(q, k, v):
        with sdpa_kernel([backend]):
            if gqa:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return attend


def flex_attention_fn(spec, device, doc):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    mask_mod = make_mask_mod(spec["window"], doc)
    B, S = spec["batch"], spec["seq_len"]
    block_mask = create_block_mask(mask_mod, B if doc is not None else None, None, S, S,
                                   device=device)
    # one compiled graph per case and GQA setting: keep them all rather than fall back to eager
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    compiled = torch.compile(flex_attention, dynamic=False)
    gqa = spec["q_heads"] != spec["kv_heads"]

    def attend(q, k, v):
        if gqa:
            return compiled(q, k, v, block_mask=block_mask, enable_gqa=True)
        return compiled(q, k, v, block_mask=block_mask)
    return attend


def try_call(attend, s):
    """Runs attend once (forward and backward), returning None or the error text, with any
    warnings PyTorch gave about why a backend was refused."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = attend(s["q"], s["k"], s["v"])
            torch.autograd.grad(out, (s["q"], s["k"], s["v"]), s["dout"])
            return None
        except Exception as e:  # noqa: BLE001 - every failure becomes a row
            why = f"{type(e).__name__}: {str(e).strip()}"
            notes = "; ".join(str(w.message).strip() for w in caught)
            return why + (f" (warnings: {notes})" if notes else "")


def directions(args):
    """The directions timed: --dir fwd, bwd or both (as bench_attention_gpu's --dir)."""
    return ("fwd", "bwd") if args.dir == "both" else (args.dir,)


def measure(attend, sets, args, device, queue):
    """{"fwd": stats or exception, "bwd": ...} (the directions of --dir) and notes. Backward runs
    on one retained graph per input set; if retaining fails, on a fresh forward made before each
    call's start event."""
    n = len(sets)
    results, notes = {}, []

    def fwd(i, _):
        s = sets[i % n]
        attend(s["q"], s["k"], s["v"])
    if "fwd" in directions(args):
        try:
            results["fwd"] = time_calls(fwd, args, device, queue)
        except Exception as e:  # noqa: BLE001
            results["fwd"] = e
    if "bwd" not in directions(args):
        return results, notes

    def grads(i, out, retain=True):
        s = sets[i % n]
        torch.autograd.grad(out, (s["q"], s["k"], s["v"]), s["dout"], retain_graph=retain)
    try:
        outs = [attend(s["q"], s["k"], s["v"]) for s in sets]
        results["bwd"] = time_calls(grads, args, device, queue, prepare=lambda i: outs[i % n])
    except Exception as e:  # noqa: BLE001
        outs = None
        log(f"backward on a retained graph failed ({error_head(str(e))}); fresh forward per call")
        try:
            def fresh_forward(i):
                return attend(*(sets[i % n][t] for t in "qkv"))
            results["bwd"] = time_calls(lambda i, out: grads(i, out, retain=False), args, device,
                                        queue, prepare=fresh_forward)
            notes.append("bwd on a fresh forward per call")
        except Exception as e2:  # noqa: BLE001
            results["bwd"] = e2
    return results, notes


def base_row(case, spec, impl, direction, pairs, args, gpu):
    fwd_flop = 4.0 * pairs * spec["head_dim"]
    return dict(side="pytorch", impl=impl, case=case, dir=direction,
                **{k: spec[k] for k in ("batch", "seq_len", "q_heads", "kv_heads", "head_dim")},
                dtype=args.dtype, mask=mask_name(spec), window=spec["window"], docs=spec["docs"],
                pairs=pairs, flop=fwd_flop if direction == "fwd" else 2.5 * fwd_flop,
                warmup=args.warmup, iters=args.iters, layout=args.layout, gpu=gpu)


def run_impl(case, spec, impl, sets, pairs, doc, args, device, queue, gpu):
    rows = {d: base_row(case, spec, impl, d, pairs, args, gpu) for d in directions(args)}
    for row in rows.values():
        row["input_sets"] = len(sets)
    notes = []
    try:
        if impl == "flex":
            attend = flex_attention_fn(spec, device, doc)
            error = try_call(attend, sets[0])
        elif spec["window"] > 0 or spec["docs"] > 0:
            attend, error = None, "skipped: SDPA has no window or document mask (is_causal only)"
        else:
            gqa = spec["q_heads"] != spec["kv_heads"]
            attend = sdpa_attention(SDPA_IMPLS[impl], gqa)
            error = try_call(attend, sets[0])
            if error and gqa:
                expanded = expand_kv(sets, spec["q_heads"] // spec["kv_heads"])
                attend = sdpa_attention(SDPA_IMPLS[impl], False)
                error2 = try_call(attend, expanded[0])
                if error2:
                    error = f"enable_gqa: {error} | kv expanded: {error2}"
                else:
                    log(f"{case} {impl}: enable_gqa refused ({error_head(error)}), k/v expanded")
                    error, sets = None, expanded
                    notes.append("kv expanded")
        if error:
            raise RuntimeError(error)
        results, more_notes = measure(attend, sets, args, device, queue)
        notes += more_notes
    except Exception as e:  # noqa: BLE001 - a failing backend is a row, not a crash
        results = {d: e for d in rows}
    for d, row in rows.items():
        r = results[d]
        if isinstance(r, Exception):
            text = str(r).strip() or type(r).__name__
            log(f"{case} {impl} {d}: {text}")
            if args.verbose:
                traceback.print_exception(r)
            row["error"] = text
            continue
        row.update(r)
        row["tflops"] = row["flop"] / (row["median_ms"] * 1e9)
        log(f"{case} {impl} {d}: {row['median_ms']:.3f} ms ({row['min_ms']:.3f} .. "
            f"{row['max_ms']:.3f}), {row['tflops']:.1f} TFLOP/s")
    for row in rows.values():
        if notes:
            row["note"] = ", ".join(notes)
        emit(row)


def error_head(text):
    return (text or "").splitlines()[0][:120]


def chosen_cases(args):
    names = list(CASES) if "all" in args.case else args.case
    for name in names:
        if name not in CASES:
            raise SystemExit(f"unknown case '{name}' (allowed: all, {', '.join(CASES)})")
    out = []
    for name in names:
        spec = dict(CASES[name])
        for key in SHAPE_KEYS:
            value = getattr(args, key)
            if value is not None:
                spec[key] = value
        out.append((name, spec))
    return out


def meta_row(device):
    row = dict(side="pytorch", meta=True, torch=torch.__version__, device=device.type)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        row.update(gpu=torch.cuda.get_device_name(device), cuda=torch.version.cuda,
                   cudnn=torch.backends.cudnn.version(), sms=props.multi_processor_count,
                   l2_bytes=getattr(props, "L2_cache_size", None))
    try:
        import triton
        row["triton"] = triton.__version__
    except Exception:  # noqa: BLE001 - optional
        pass
    return row


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", default=["all"], type=lambda s: s.split(","),
                    help="all, or a comma list of " + ", ".join(CASES))
    ap.add_argument("--impl", default=DEFAULT_IMPLS, type=lambda s: s.split(","),
                    help=f"comma list of {', '.join(SDPA_IMPLS)}, flex (default: {DEFAULT_IMPLS})")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--seq-len", type=int)
    ap.add_argument("--q-heads", type=int)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--head-dim", type=int)
    ap.add_argument("--window", type=int, help="sliding window, 0 = none")
    ap.add_argument("--docs", type=int, help="documents per row, 0 = no documents")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--dir", default="both", choices=["fwd", "bwd", "both"],
                    help="directions to time (default both)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--warmup-ms", type=float, default=300.0,
                    help="keep warming up until this many milliseconds have passed")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--max-sets", type=int, default=64)
    ap.add_argument("--layout", default="bshd", choices=["bshd", "bhsd"],
                    help="memory layout of q, k, v, dout (bshd: flashtrain's)")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu to exercise the logic")
    ap.add_argument("--verbose", action="store_true", help="tracebacks of failing backends")
    args = ap.parse_args(argv)
    if args.iters < 1:
        ap.error("--iters must be >= 1")
    for impl in args.impl:
        if impl not in SDPA_IMPLS and impl != "flex":
            ap.error(f"unknown --impl '{impl}' (allowed: {', '.join(SDPA_IMPLS)}, flex)")
    return args


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        log("torch_attention_peer: no CUDA device visible to torch")
        return 2
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    meta = meta_row(device)
    emit(meta)
    gpu = meta.get("gpu", device.type)
    l2_bytes = (meta.get("l2_bytes") or 60 << 20) if device.type == "cuda" else 0
    queue = QueueAhead(device)
    for case, spec in chosen_cases(args):
        doc = None
        if spec["docs"] > 0:
            doc = document_ids(spec["batch"], spec["seq_len"], spec["docs"], device)
        pairs = attended_pairs(spec, make_mask_mod(spec["window"], doc), device)
        count = input_set_count(spec, dtype, l2_bytes, args.max_sets)
        log(f"{case}: {spec}, mask {mask_name(spec)}, {pairs} attended pairs, {count} input set(s)")
        sets = make_input_sets(spec, args, dtype, device, count)
        for impl in args.impl:
            run_impl(case, spec, impl, sets, pairs, doc, args, device, queue, gpu)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        del sets
    return 0


if __name__ == "__main__":
    sys.exit(main())
