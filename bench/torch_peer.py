"""PyTorch peer for the training benchmarks: the same GPT-2 / LLaMA-3 shapes as flashtrain's
presets, trained with AdamW on random tokens, eagerly ("pytorch-eager") or torch.compile'd
(--compile, "pytorch-compile"); attention either "naive" (matmul, mask, softmax, matmul,
materialising S x S) or "sdpa" (torch's scaled_dot_product_attention).
Prints one JSON line: tok/s (median over the timed steps), ms/step, peak allocated/reserved MB,
and with sdpa the attention kernels of one more, profiled, step (which backend SDPA picked).

  python3 bench/torch_peer.py --model gpt2 --batch-size 8 --seq-len 1024 --dtype bf16
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {
    # name: (family, layers, width, heads, kv_heads, ffn, vocab)
    "gpt2": ("gpt2", 12, 768, 12, 12, 3072, 50304),
    "gpt2-d24": ("gpt2", 24, 1024, 16, 16, 4096, 50304),
    "llama3-1b": ("llama3", 16, 2048, 32, 8, 8192, 128256),
}


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
        B, T, C = x.shape
        qkv = self.qkv(self.norm1(x))
        q, k, v = qkv.split([self.H * self.D, self.Hkv * self.D, self.Hkv * self.D], dim=-1)
        q = q.view(B, T, self.H, self.D)
        k = k.view(B, T, self.Hkv, self.D)
        v = v.view(B, T, self.Hkv, self.D)
        if self.family == "llama3":
            q, k = rope(q, cos, sin), rope(k, cos, sin)
        y = self.attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        h = self.norm2(x)
        if self.family == "gpt2":
            m = self.out(F.gelu(self.fc(h), approximate="tanh"))
        else:
            m = self.out(F.silu(self.gate(h)) * self.fc(h))
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
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x, self.cos, self.sin)
        x = self.normf(x)
        logits = x @ self.wte.weight.t() if self.head is None else self.head(x)
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
    args = ap.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 is true fp32, as in flashtrain
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    dev = "cuda"
    model = Model(args.model, args.seq_len, args.attention).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    if args.compile:
        model = torch.compile(model)
    V = PRESETS[args.model][6]
    B, T = args.batch_size, args.seq_len
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.dtype == "bf16")
    def train_step():
        idx = torch.randint(0, 50257, (B, T), device=dev)
        tgt = torch.randint(0, 50257, (B, T), device=dev)
        with autocast:
            loss = model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    times = []
    torch.cuda.reset_peak_memory_stats()
    for step in range(args.warmup + args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = train_step()
        torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    ms = statistics.median(times) * 1000
    print(json.dumps({
        "peer": "pytorch-compile" if args.compile else "pytorch-eager",
        "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
        "model": args.model, "dtype": args.dtype, "attention": args.attention, "batch": B,
        "seq_len": T, "ms": round(ms, 2), "tok_per_s": round(B * T / (ms / 1000)),
        "peak_allocated_mb": round(torch.cuda.max_memory_allocated() / 2**20),
        "peak_reserved_mb": round(torch.cuda.max_memory_reserved() / 2**20),
        "loss": round(loss.item(), 4),
        "attention_kernels": attention_kernels(train_step) if args.attention == "sdpa" else None}))


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


if __name__ == "__main__":
    main()
