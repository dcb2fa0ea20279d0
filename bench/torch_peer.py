"""PyTorch peer for the training benchmarks: the same GPT-2 / LLaMA-3 shapes as flashtrain's
presets, trained with AdamW on random tokens, eagerly ("pytorch-eager") or torch.compile'd
(--compile, "pytorch-compile"); attention either "naive" (matmul, mask, softmax, matmul,
materialising S x S) or "sdpa" (torch's scaled_dot_product_attention).
Prints one JSON line: tok/s (median over the timed steps), ms/step, peak allocated/reserved MB,
and with sdpa the attention kernels of one more, profiled, step (which backend SDPA picked).

--profile times one more step under torch.profiler and prints, before the JSON line, the table
`flashtrain train --profile` prints, with the same rows in the same order (ROWS): each kernel
(on the CPU: each op's own time) goes to the row of the region that launched it. The forward's
regions are record_function ranges around the model's calls; a backward op goes to the row of
the forward op that made its autograd node (the profiler's sequence numbers link the two);
what neither names goes by the name patterns of NAME_PATTERNS, or to "other (unattributed)".
A region's own GPU-side annotation, which the profiler links to the range itself, is not counted
(it spans the kernels its ops launched); should the rows still add up to more than the step, a
line on stderr says that the profiler linked some kernels twice.
FLOP rows get their work from the shapes (flashtrain's counts); byte rows are left blank (the
peer's ops move other amounts than ours). Times are kernel times, so the gaps between kernels
are in "other"; flashtrain's rows are stream time between marks, gaps included. With --compile
Inductor fuses across the rows and record_function is ignored inside compiled code: the
model's kernels then go by name patterns only.

  python3 bench/torch_peer.py --model gpt2 --batch-size 8 --seq-len 1024 --dtype bf16
  python3 bench/torch_peer.py --model gpt2 --batch-size 8 --seq-len 1024 --attention sdpa --profile
"""
import argparse
import contextlib
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {
    # name: (family, layers, width, heads, kv_heads, ffn, vocab)
    "gpt2-tiny": ("gpt2", 4, 128, 4, 4, 512, 50304),
    "llama3-tiny": ("llama3", 4, 128, 4, 2, 512, 50304),
    "gpt2": ("gpt2", 12, 768, 12, 12, 3072, 50304),
    "gpt2-d24": ("gpt2", 24, 1024, 16, 16, 4096, 50304),
    "llama3-1b": ("llama3", 16, 2048, 32, 8, 8192, 128256),
}


# The step profile's rows, in flashtrain's order (src/models/step_profile.cpp; a test there checks
# that this list is the same). The peer keeps every activation, so its "recompute" row (the
# forward ops that `flashtrain train --recompute` re-runs in backward) never appears.
ROWS = [
    "data",
    "zero grad",
    "embedding",
    "norm",
    "gemm qkv",
    "qkv split/merge",
    "rope",
    "attention forward",
    "attention backward",
    "gemm attn-out",
    "gemm mlp-up",
    "activation",
    "gemm mlp-down",
    "gemm classifier",
    "classifier + loss",
    "recompute",
    "all-reduce",
    "optimizer",
]
# Rows whose work is FLOPs (the others count bytes, which the peer does not report).
FLOP_ROWS = {"gemm qkv", "attention forward", "attention backward", "gemm attn-out",
             "gemm mlp-up", "gemm mlp-down", "gemm classifier", "recompute"}
# Rows of host or network transfers: no floor, as in flashtrain's table.
TRANSFER_ROWS = {"data", "all-reduce"}
# What the backward of a forward row is counted as (the rest keep their row).
BACKWARD_ROW = {"attention forward": "attention backward"}
# Ops and kernels outside every labelled region, by a piece of their (lower-cased) name; the
# first match wins: SDPA's backends (cuDNN "..._fprop_..." / "..._bprop_...", FlashAttention-2
# "flash_fwd" / "flash_bwd", memory-efficient "fmha_cutlassF" / "fmha_cutlassB"), the fused
# optimizer and clipping, the loss, and the ops that name their layer.
NAME_PATTERNS = [
    ("bprop", "attention backward"),
    ("flash_bwd", "attention backward"),
    ("fmha_cutlassb", "attention backward"),
    ("attention_backward", "attention backward"),
    ("fprop", "attention forward"),
    ("flash_fwd", "attention forward"),
    ("fmha_cutlassf", "attention forward"),
    ("scaled_dot_product", "attention forward"),
    ("adam", "optimizer"),
    ("_foreach_norm", "optimizer"),
    ("clip_grad", "optimizer"),
    ("nll_loss", "classifier + loss"),
    ("log_softmax", "classifier + loss"),
    ("cross_entropy", "classifier + loss"),
    ("embedding", "embedding"),
    ("layer_norm", "norm"),
    ("rms_norm", "norm"),
    ("gelu", "activation"),
    ("silu", "activation"),
    ("randint", "data"),
]
# Peak rates as flashtrain's table has them (src/train/profile_report.cpp, docs/PERF.md): keyed
# by a piece of the GPU's name; none for the CPU.
FLOORS = {
    "H200": {"bf16_tflops": 780.0, "fp32_tflops": 67.0, "copy_gbps": 4270.0,
             "source": "H200: cuBLAS bf16 780 TFLOP/s and device copy 4.27 TB/s "
                       "(bench/gpu_ceilings.py), fp32 67 TFLOP/s (datasheet, CUDA cores)"},
}

# Which record_function ranges are on: "model" (inside the model: eager only, and only for the
# profiled step, since each range costs a dispatcher call) and "step" (around the step's parts).
_labels = {"model": False, "step": False}


def region(name, scope="model"):
    return torch.profiler.record_function(name) if _labels[scope] else contextlib.nullcontext()


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope(x, cos, sin):
    # interleaved pairs (x[2i], x[2i+1]), as flashtrain and Meta's code rotate them
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2)


class Block(nn.Module):
    def __init__(self, family, C, H, Hkv, F_, attention):
        super().__init__()
        self.family, self.H, self.Hkv, self.D, self.attention = family, H, Hkv, C // H, attention
        bias = family == "gpt2"
        Norm = nn.LayerNorm if family == "gpt2" else RMSNorm
        self.norm1, self.norm2 = Norm(C), Norm(C)
        self.qkv = nn.Linear(C, (H + 2 * Hkv) * self.D, bias=bias)
        self.proj = nn.Linear(C, C, bias=bias)
        self.fc = nn.Linear(C, F_, bias=bias)
        self.gate = nn.Linear(C, F_, bias=False) if family == "llama3" else None
        self.out = nn.Linear(F_, C, bias=bias)

    def attend(self, q, k, v):
        if self.Hkv != self.H:
            k = k.repeat_interleave(self.H // self.Hkv, dim=1)
            v = v.repeat_interleave(self.H // self.Hkv, dim=1)
        if self.attention == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        S = q.shape[-2]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.D))
        mask = torch.ones(S, S, dtype=torch.bool, device=q.device).tril()
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        return att @ v

    def forward(self, x, cos, sin):
        # The regions of flashtrain's step profile. A residual add goes to "norm": flashtrain
        # fuses it into the norm that reads its result.
        B, T, C = x.shape
        with region("norm"):
            h = self.norm1(x)
        with region("gemm qkv"):
            qkv = self.qkv(h)
        with region("qkv split/merge"):
            q, k, v = qkv.split([self.H * self.D, self.Hkv * self.D, self.Hkv * self.D], dim=-1)
            q = q.view(B, T, self.H, self.D)
            k = k.view(B, T, self.Hkv, self.D)
            v = v.view(B, T, self.Hkv, self.D)
        if self.family == "llama3":
            with region("rope"):
                q, k = rope(q, cos, sin), rope(k, cos, sin)
        with region("attention forward"):
            y = self.attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        with region("qkv split/merge"):
            y = y.transpose(1, 2).reshape(B, T, C)
        with region("gemm attn-out"):
            a = self.proj(y)
        with region("norm"):
            x = x + a
            h = self.norm2(x)
        if self.family == "gpt2":
            with region("gemm mlp-up"):
                u = self.fc(h)
            with region("activation"):
                u = F.gelu(u, approximate="tanh")
        else:
            with region("gemm mlp-up"):
                g, u = self.gate(h), self.fc(h)
            with region("activation"):
                u = F.silu(g) * u
        with region("gemm mlp-down"):
            m = self.out(u)
        with region("norm"):
            return x + m


class Model(nn.Module):
    def __init__(self, name, seq_len, attention):
        super().__init__()
        family, L, C, H, Hkv, F_, V = PRESETS[name]
        self.family = family
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(seq_len, C) if family == "gpt2" else None
        self.blocks = nn.ModuleList(Block(family, C, H, Hkv, F_, attention) for _ in range(L))
        self.normf = nn.LayerNorm(C) if family == "gpt2" else RMSNorm(C)
        self.head = None if family == "gpt2" else nn.Linear(C, V, bias=False)
        D = C // H
        freqs = 500000.0 ** (-torch.arange(0, D, 2).float() / D)
        ang = torch.outer(torch.arange(seq_len).float(), freqs)
        self.register_buffer("cos", ang.cos()[None, :, None, :], persistent=False)
        self.register_buffer("sin", ang.sin()[None, :, None, :], persistent=False)
        # flashtrain's initialisation: N(0, 0.02), residual projections N(0, 0.02 / sqrt(2 L)).
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith(("proj.weight", "out.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        with region("embedding"):
            x = self.wte(idx)
            if self.wpe is not None:
                x = x + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x, self.cos, self.sin)
        with region("norm"):
            x = self.normf(x)
        with region("gemm classifier"):
            logits = x @ self.wte.weight.t() if self.head is None else self.head(x)
        with region("classifier + loss"):
            return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt2", choices=sorted(PRESETS))
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--dtype", default="bf16", choices=["fp32", "bf16"])
    ap.add_argument("--attention", default="naive", choices=["naive", "sdpa"])
    ap.add_argument("--steps", type=int, default=20, help="timed steps (after --warmup)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the model (default mode; the first warm-up step compiles)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cuda (the peer), or cpu (to try --profile on a tiny model)")
    ap.add_argument("--profile", action="store_true",
                    help="profile one more step and print flashtrain's step-profile table")
    args = ap.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 is true fp32, as in flashtrain
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    dev = args.device
    cuda = dev == "cuda"
    model = Model(args.model, args.seq_len, args.attention).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
    if args.compile:
        model = torch.compile(model)
    B, T = args.batch_size, args.seq_len
    autocast = torch.autocast(dev, dtype=torch.bfloat16, enabled=args.dtype == "bf16")
    def train_step():
        with region("data", "step"):
            idx = torch.randint(0, 50257, (B, T), device=dev)
            tgt = torch.randint(0, 50257, (B, T), device=dev)
        with autocast:
            loss = model(idx, tgt)
        loss.backward()
        with region("optimizer", "step"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        with region("zero grad", "step"):
            opt.zero_grad(set_to_none=True)
        return loss

    def synchronize():
        if cuda:
            torch.cuda.synchronize()

    times = []
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    header = {
        "peer": "pytorch-compile" if args.compile else "pytorch-eager",
        "torch": torch.__version__, "gpu": torch.cuda.get_device_name() if cuda else "cpu",
        "model": args.model, "dtype": args.dtype, "attention": args.attention, "batch": B,
        "seq_len": T}
    warmup_peak = warmup_reserved = 0
    try:
        for step in range(args.warmup + args.steps):
            if cuda and step == args.warmup:
                # The timed steps' own high-water mark beside the run's (warm-up and compilation
                # included): flashtrain's summary reports both the same way.
                warmup_peak = torch.cuda.max_memory_allocated()
                warmup_reserved = torch.cuda.max_memory_reserved()
                torch.cuda.reset_peak_memory_stats()
            synchronize()
            t0 = time.perf_counter()
            loss = train_step()
            synchronize()
            if step >= args.warmup:
                times.append(time.perf_counter() - t0)
    except torch.cuda.OutOfMemoryError as e:
        # Running out of memory is a result at this shape: say so, with the peak reached.
        print(json.dumps({**header, "error": "out of memory", "steps_run": len(times),
                          "peak_allocated_mb": round(max(warmup_peak,
                                                         torch.cuda.max_memory_allocated()) / 2**20),
                          "detail": str(e).splitlines()[0][:200]}))
        return
    ms = statistics.median(times) * 1000
    result = {
        **header, "ms": round(ms, 2), "tok_per_s": round(B * T / (ms / 1000)),
        "peak_allocated_mb": round(max(warmup_peak, torch.cuda.max_memory_allocated()) / 2**20)
        if cuda else None,
        "timed_peak_allocated_mb": round(torch.cuda.max_memory_allocated() / 2**20) if cuda else None,
        "peak_reserved_mb": round(max(warmup_reserved, torch.cuda.max_memory_reserved()) / 2**20)
        if cuda else None,
        "loss": round(loss.item(), 4),
        "attention_kernels": attention_kernels(train_step) if args.attention == "sdpa" and cuda else None}
    if args.profile:
        step = args.warmup + args.steps + (2 if result["attention_kernels"] is not None else 1)
        report = profile_step(train_step, args, step, synchronize)
        print(format_table(report))
        result["profile"] = report
    print(json.dumps(result))


def attention_kernels(train_step):
    """The GPU kernels of one more step whose names say attention: which backend SDPA picked
    (FlashAttention-2 "flash_*", cuDNN "*sdpa*"/"cudnn*", memory-efficient "fmha_*")."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        train_step()
        torch.cuda.synchronize()
    keys = ("flash", "fmha", "sdpa", "cudnn", "attention")
    return sorted({e.key[:80] for e in prof.key_averages()
                   if any(k in e.key.lower() for k in keys)})


# ---- --profile: one step under torch.profiler, in flashtrain's table ----

def row_flops(name, B, T):
    """FLOPs of a row in one step, as flashtrain counts them: 2 x rows x weights per linear layer
    forward, twice that backward; attention 4 x B x H x (causal pairs) x D forward, 2.5x that
    backward."""
    family, L, C, H, Hkv, F_, V = PRESETS[name]
    D, N = C // H, B * T
    linear = {"gemm qkv": C * (H + 2 * Hkv) * D, "gemm attn-out": C * C,
              "gemm mlp-up": C * F_ * (2 if family == "llama3" else 1), "gemm mlp-down": F_ * C}
    attention = 4.0 * B * H * (T * (T + 1) / 2) * D * L
    flops = {row: 3 * 2.0 * N * w * L for row, w in linear.items()}
    flops["gemm classifier"] = 3 * 2.0 * N * C * V
    flops["attention forward"] = attention
    flops["attention backward"] = 2.5 * attention
    return flops


def is_backward(event):
    return "Backward" in event.name or event.name.startswith("autograd::engine")


def ancestors(event):
    while event is not None:
        yield event
        event = event.cpu_parent


def by_pattern(name):
    lower = name.lower()
    return next((row for piece, row in NAME_PATTERNS if piece in lower), None)


def attribute(events, on_gpu):
    """{row: [calls, us]} from the profiler's events of one step: each kernel's time (on the
    CPU: each op's own time) goes to the row of the nearest labelled region around the op that
    ran it, or of the forward op whose autograd node it runs in (by sequence number), or of a
    name pattern; what none of them names is left out (the step's "other" row). calls counts
    kernels (on the CPU: ops)."""
    cpu = sorted((e for e in events if str(e.device_type).endswith("CPU")),
                 key=lambda e: e.time_range.start)
    # Forward ops inside a labelled region, by the sequence number their autograd node gets. An
    # op that makes no node peeks the next op's number, so the later op (the node's maker) wins.
    forward_row = {}
    for e in cpu:
        if e.sequence_nr >= 0 and not is_backward(e):
            row = next((a.name for a in ancestors(e) if a.name in ROWS), None)
            if row is not None:
                forward_row[e.sequence_nr] = row

    def row_of(event):
        for a in ancestors(event):
            if a.name in ROWS:
                return a.name
            if is_backward(a) and a.sequence_nr in forward_row:
                row = forward_row[a.sequence_nr]
                return BACKWARD_ROW.get(row, row)
        return next((r for r in map(by_pattern, (a.name for a in ancestors(event))) if r), None)

    rows = {}
    for e in cpu:
        if on_gpu:
            # A labelled range launches nothing itself: what the profiler links to it (its
            # GPU-side annotation, which spans the range's kernels) would count them twice.
            if e.name in ROWS:
                continue
            for k in e.kernels:
                row = row_of(e) or by_pattern(k.name)
                if row is not None:
                    cell = rows.setdefault(row, [0, 0.0])
                    cell[0] += 1
                    cell[1] += k.duration
        elif e.self_cpu_time_total > 0:  # a labelled range's own time is its row's too
            row = row_of(e)
            if row is not None:
                cell = rows.setdefault(row, [0, 0.0])
                cell[0] += 1
                cell[1] += e.self_cpu_time_total
    return rows


def profile_step(train_step, args, step, synchronize):
    """One step under torch.profiler, with the regions labelled: flashtrain's table as a dict."""
    from torch.profiler import ProfilerActivity, profile
    cuda = args.device == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    # Inside a compiled model record_function is ignored, and flipping the flag there would only
    # make Dynamo recompile: the model's ranges are for eager runs.
    _labels.update(model=not args.compile, step=True)
    try:
        synchronize()
        with profile(activities=activities) as prof:
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            t0 = time.perf_counter()
            train_step()
            if cuda:
                end.record()
            synchronize()
            step_ms = start.elapsed_time(end) if cuda else (time.perf_counter() - t0) * 1000
    finally:
        _labels.update(model=False, step=False)
    cells = attribute(prof.events(), cuda)
    gpu = torch.cuda.get_device_name() if cuda else ""
    floors = next((f for part, f in FLOORS.items() if part in gpu), None) if cuda else None
    matrix = None
    if floors is not None:
        matrix = floors["bf16_tflops"] if args.dtype == "bf16" else floors["fp32_tflops"]
    flops = row_flops(args.model, args.batch_size, args.seq_len)
    rows, attributed = [], 0.0
    for name in ROWS:
        if name not in cells:
            continue
        calls, us = cells[name]
        ms = us / 1000.0
        attributed += ms
        work = flops.get(name) if name in FLOP_ROWS else None
        row = {"region": name, "calls": calls, "ms": ms, "percent": 100.0 * ms / step_ms,
               "work": work, "unit": "flop" if name in FLOP_ROWS else "bytes",
               "achieved_per_s": work / (ms / 1000.0) if work and ms > 0 else None,
               "floor_per_s": None, "floor_ms": None}
        if floors is not None and name not in TRANSFER_ROWS:
            rate = matrix * 1e12 if name in FLOP_ROWS else floors["copy_gbps"] * 1e9
            row["floor_per_s"] = rate
            row["floor_ms"] = 1000.0 * work / rate if work else None
        rows.append(row)
    if attributed > step_ms * 1.001:
        # Kernel times are disjoint on one stream: more than the step means the profiler linked
        # some kernels to two ops. Say so rather than print a table that adds up to more.
        print(f"torch_peer: the attributed kernel time ({attributed:.3f} ms) exceeds the step "
              f"({step_ms:.3f} ms): the profiler linked some kernels twice; the rows overcount",
              file=sys.stderr)
    other = max(0.0, step_ms - attributed)
    rows.append({"region": "other (unattributed)", "calls": 0, "ms": other,
                 "percent": 100.0 * other / step_ms})
    rows.append({"region": "step", "calls": 0, "ms": step_ms, "percent": 100.0})
    peer = "pytorch-compile" if args.compile else "pytorch-eager"
    run = (f"{args.model} on {args.device}{f' ({gpu})' if gpu else ''}, {args.dtype}, "
           f"attention {args.attention}, batch {args.batch_size} x {args.seq_len}, {peer}")
    return {"step": step, "run": run, "floors": floors["source"] if floors else "", "rows": rows}


def significant(x):
    """Three significant digits without an exponent, as flashtrain prints them."""
    if x == 0:
        return "0"
    decimals = max(0, 2 - math.floor(math.log10(abs(x))))
    return f"{x:.{decimals}f}"


def si(x, unit):
    """x with the SI prefix that leaves 1 to 999 before the point, as flashtrain prints it."""
    prefixes = ["", "k", "M", "G", "T", "P", "E"]
    p = 0
    while abs(x) >= 999.5 and p + 1 < len(prefixes):
        x /= 1000.0
        p += 1
    return f"{significant(x)} {prefixes[p]}{unit}"


def format_table(report):
    """flashtrain's step-profile table (src/train/profile_report.cpp), column for column."""
    lines = [f"step profile: step {report['step']}, {report['run']}; floors: "
             f"{report['floors'] or 'none known here'}",
             f"{'region':<22}{'calls':>6}{'ms':>11}{'% step':>8}{'work':>15}{'achieved':>16}"
             f"{'floor':>14}{'floor ms':>10}"]
    for row in report["rows"]:
        total = "unit" not in row
        percent = f"{row['percent']:.1f}%"
        line = (f"{row['region']:<22}{'-' if total else str(row['calls']):>6}{row['ms']:>11.3f}"
                f"{percent:>8}")
        if not total:
            unit = "FLOP" if row["unit"] == "flop" else "B"

            def rate(r):
                return si(r, unit + "/s") if r else "-"
            work = si(row["work"], unit) if row["work"] else "-"
            floor_ms = significant(row["floor_ms"]) if row["floor_ms"] else "-"
            line += (f"{work:>15}{rate(row['achieved_per_s']):>16}{rate(row['floor_per_s']):>14}"
                     f"{floor_ms:>10}")
        lines.append(line)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
