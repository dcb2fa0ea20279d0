#!/usr/bin/env python3
"""Parity of flashtrain's GPT-2 and LLaMA-3 training step with PyTorch.

For each model family this script builds a small model in PyTorch with random weights, computed
exactly as flashtrain computes it (src/models/transformer.cpp, src/nn/*.cpp), writes it as an
llm.c checkpoint (src/models/checkpoint.h) together with a random batch of tokens (.npy), runs
`flashtrain debug-step` on it for each requested device and dtype, and compares:

  logits       [B*T, padded vocab] of the first forward   relative norm error
  loss         mean cross-entropy of the first forward    relative error
  grad <name>  every parameter's gradient, one row each   relative norm error per tensor
  adamw losses the loss before each of --steps AdamW      max relative error over the steps
               updates on the same batch (constant lr, the
               global gradient norm clipped to --grad-clip)
  grad norms   the global gradient norm before each update max relative error over the steps

flashtrain's steps go through train::Optimizer, the object its trainer steps with (global
norm, clipping, the multi-tensor AdamW update); the PyTorch side clips as that object does (fp64
norm, gradients scaled by clip / norm when the norm is larger) and then runs torch.optim.AdamW.

The PyTorch side is always the fp32 model (TF32 off), on --torch-device. flashtrain's bf16 mode
(bf16 weights and activations, fp32 master weights, moments and accumulation) is compared
against that same fp32 model, with bounds derived from bf16's precision (see BOUNDS below and
docs/CUDA.md, "Parity with PyTorch"): torch.autocast keeps other tensors in fp32 than flashtrain
does, so it would not be a bit-closer reference, only a different bf16 approximation.

Prints one table row per comparison (model, device, dtype, quantity, error, bound, ok) and
exits non-zero if any comparison fails or a flashtrain run fails.

Needs python3 with torch and numpy (not part of CI). Example:
    python3 tests/torch_parity.py --cli build/flashtrain --device cuda
"""

import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

GPT2_MAGIC = 20240326
LLAMA3_MAGIC = 20240803
VERSION_FP32 = 3

# Relative error bounds per dtype (docs/CUDA.md, "Parity with PyTorch", gives the measured
# errors). fp32: the 1e-5 for everything. Two fp32 implementations that sum in different
# orders differ by a few ulp (2^-24 ~ 6e-8) times a slowly growing factor of the reduction
# lengths; on the CPU the worst tensor is ~1.5e-6, so 1e-5 leaves room for the GPU's orders
# while TF32 (10-bit mantissa, ~5e-4) or any wrong operation fails it.
# bf16: every stored weight and activation is rounded to 8 significant bits (at most
# u = 2^-8 ~ 3.9e-3 relative, ~u/sqrt(3) ~ 2e-3 on average), independently per element, and the
# errors compound along the layers: the CPU run measures ~1.4e-2 on the logits and ~2.4e-2 on
# the worst gradient (the backward chain has about twice the roundings). Bounds: 5e-2 (~13u) for
# logits and 1e-1 (~26u) per gradient tensor (and for the gradient norms), room for the GPU's
# other bf16 rounding points (fused epilogues, bf16 attention probabilities) while a wrong
# operation still gives errors of order 1. The loss is a mean of
# B*T log-probabilities whose errors average out (measured ~4e-5); its bound and the AdamW
# trajectory's are the 1e-2 that flashtrain's design sets for bf16 loss curves.
BOUNDS = {
    "fp32": {"logits": 1e-5, "loss": 1e-5, "grad": 1e-5, "adamw losses": 1e-5,
             "grad norms": 1e-5},
    "bf16": {"logits": 5e-2, "loss": 1e-2, "grad": 1e-1, "adamw losses": 1e-2,
             "grad norms": 1e-1},
}


# ---------------------------------------------------------------- model shapes and weights


def padded(vocab):
    """flashtrain pads the vocabulary (embedding and head rows) to a multiple of 128."""
    return (vocab + 127) // 128 * 128


def llama_ffn_hidden(width, multiple_of, ffn_dim_multiplier):
    """LLaMA's MLP width rule, as models::llama_ffn_hidden computes it."""
    hidden = 2 * (4 * width) // 3
    hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def make_config(family, args):
    if family == "gpt2":
        cfg = dict(family="gpt2", layers=2, width=64, heads=4, kv_heads=4, vocab=50257,
                   context=128)
        cfg["ffn"] = 4 * cfg["width"]
    else:
        cfg = dict(family="llama3", layers=2, width=128, heads=4, kv_heads=2, vocab=2000,
                   context=128, multiple_of=32, ffn_dim_multiplier=1.5, rope_theta=500000.0)
        cfg["ffn"] = llama_ffn_hidden(cfg["width"], cfg["multiple_of"], cfg["ffn_dim_multiplier"])
    cfg["padded_vocab"] = padded(cfg["vocab"])
    cfg["head_dim"] = cfg["width"] // cfg["heads"]
    cfg["eps"] = 1e-5
    return cfg


def parameter_shapes(cfg):
    """flashtrain's parameter names (Transformer::build_parameters) and shapes, in its order."""
    C, F_, Vp, D = cfg["width"], cfg["ffn"], cfg["padded_vocab"], cfg["head_dim"]
    qkv = (cfg["heads"] + 2 * cfg["kv_heads"]) * D
    gpt2 = cfg["family"] == "gpt2"
    shapes = {"wte": (Vp, C)}
    if gpt2:
        shapes["wpe"] = (cfg["context"], C)
    for layer in range(cfg["layers"]):
        p = f"h.{layer}."
        shapes[p + "norm1.weight"] = (C,)
        if gpt2:
            shapes[p + "norm1.bias"] = (C,)
        shapes[p + "attn.qkv.weight"] = (qkv, C)
        if gpt2:
            shapes[p + "attn.qkv.bias"] = (qkv,)
        shapes[p + "attn.proj.weight"] = (C, C)
        if gpt2:
            shapes[p + "attn.proj.bias"] = (C,)
        shapes[p + "norm2.weight"] = (C,)
        if gpt2:
            shapes[p + "norm2.bias"] = (C,)
        shapes[p + "mlp.fc.weight"] = (F_, C)
        if gpt2:
            shapes[p + "mlp.fc.bias"] = (F_,)
        if not gpt2:
            shapes[p + "mlp.gate.weight"] = (F_, C)
        shapes[p + "mlp.proj.weight"] = (C, F_)
        if gpt2:
            shapes[p + "mlp.proj.bias"] = (C,)
    shapes["normf.weight"] = (C,)
    if gpt2:
        shapes["normf.bias"] = (C,)
    else:
        shapes["head.weight"] = (Vp, C)
    return shapes


def random_weights(cfg, gen):
    """Random fp32 weights, drawn so that every pre-activation is of order 1: each matrix has
    std 1/sqrt(fan-in) (wider than GPT-2's 0.02), so attention is far from uniform (the causal
    mask, GQA and RoPE matter), GELU and SiLU work in their curved range and the softmax of the
    logits is far from flat. Norm weights and biases are random too (not 1 and 0), so that a
    mistake in how they are applied shows."""
    weights = {}
    for name, shape in parameter_shapes(cfg).items():
        if "norm" in name and name.endswith(".weight"):
            w = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif name.endswith(".bias"):
            w = 0.1 * torch.randn(shape, generator=gen)
        else:
            w = torch.randn(shape, generator=gen) / math.sqrt(shape[1])
        if name in ("wte", "head.weight"):
            w[cfg["vocab"]:] = 0.0  # padded rows: never looked up, never predicted
        weights[name] = w.float()
    return weights


# ---------------------------------------------------------------- llm.c checkpoint


def write_checkpoint(path, cfg, weights):
    """Writes the llm.c checkpoint that models::load_checkpoint reads (fp32, version 3)."""
    L = cfg["layers"]

    def stacked(kind):
        return [weights[f"h.{layer}.{kind}"] for layer in range(L)]

    if cfg["family"] == "gpt2":
        ints = [GPT2_MAGIC, VERSION_FP32, cfg["context"], cfg["vocab"], L, cfg["heads"],
                cfg["width"], cfg["padded_vocab"]]
        header = struct.pack("<256i", *(ints + [0] * (256 - len(ints))))
        tensors = [weights["wte"], weights["wpe"]]
        for kind in ("norm1.weight", "norm1.bias", "attn.qkv.weight", "attn.qkv.bias",
                     "attn.proj.weight", "attn.proj.bias", "norm2.weight", "norm2.bias",
                     "mlp.fc.weight", "mlp.fc.bias", "mlp.proj.weight", "mlp.proj.bias"):
            tensors += stacked(kind)
        tensors += [weights["normf.weight"], weights["normf.bias"]]
    else:
        ints = [LLAMA3_MAGIC, VERSION_FP32, cfg["context"], cfg["vocab"], L, cfg["heads"],
                cfg["kv_heads"], cfg["width"], cfg["multiple_of"], 0, 3, 1]
        floats = [cfg["ffn_dim_multiplier"], cfg["eps"], cfg["rope_theta"]]
        header = struct.pack("<256i", *(ints + [0] * (256 - len(ints))))
        header += struct.pack("<256f", *(floats + [0.0] * (256 - len(floats))))
        V = cfg["vocab"]
        tensors = [weights["wte"][:V]]  # LLaMA-3 files hold the real vocabulary only
        for kind in ("norm1.weight", "attn.qkv.weight", "attn.proj.weight", "norm2.weight",
                     "mlp.fc.weight", "mlp.gate.weight", "mlp.proj.weight"):
            tensors += stacked(kind)
        tensors += [weights["normf.weight"], weights["head.weight"][:V]]
    with open(path, "wb") as f:
        f.write(header)
        for t in tensors:
            f.write(t.detach().cpu().contiguous().numpy().astype("<f4").tobytes())


# ---------------------------------------------------------------- the model, in PyTorch


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_tables(cfg, T, device):
    """cos/sin [T, D/2] of flashtrain's table: freq_i = theta^(-2i/D), built in fp64."""
    D = cfg["head_dim"]
    i = torch.arange(D // 2, dtype=torch.float64)
    freq = cfg["rope_theta"] ** (-2.0 * i / D)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * freq[None, :]
    return torch.cos(angle).float().to(device), torch.sin(angle).float().to(device)


def apply_rope(x, cos, sin):
    """Rotates the interleaved pairs (x[2i], x[2i+1]) of x [B, T, H, D] by position."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((c * x0 - s * x1, s * x0 + c * x1), dim=-1).flatten(-2)


def causal_attention(q, k, v):
    """Naive attention on [B, T, H, D]; query head h reads kv head h // (Hq / Hkv)."""
    group = q.shape[2] // k.shape[2]
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    T = q.shape[2]
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v
    return out.transpose(1, 2).flatten(2)


def forward(cfg, p, tokens, targets):
    """Returns (logits [B*T, padded vocab], mean cross-entropy over the real vocabulary)."""
    B, T = tokens.shape
    H, Hkv, D, eps = cfg["heads"], cfg["kv_heads"], cfg["head_dim"], cfg["eps"]
    gpt2 = cfg["family"] == "gpt2"

    def norm(x, prefix):
        if gpt2:
            return F.layer_norm(x, (x.shape[-1],), p[prefix + ".weight"], p[prefix + ".bias"], eps)
        return rms_norm(x, p[prefix + ".weight"], eps)

    def linear(x, prefix):
        return F.linear(x, p[prefix + ".weight"], p.get(prefix + ".bias"))

    x = p["wte"][tokens]
    if gpt2:
        x = x + p["wpe"][:T][None]
    else:
        cos, sin = rope_tables(cfg, T, tokens.device)
    for layer in range(cfg["layers"]):
        pre = f"h.{layer}."
        qkv = linear(norm(x, pre + "norm1"), pre + "attn.qkv")
        q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
        q, k, v = q.view(B, T, H, D), k.view(B, T, Hkv, D), v.view(B, T, Hkv, D)
        if not gpt2:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        x = x + linear(causal_attention(q, k, v), pre + "attn.proj")
        h = norm(x, pre + "norm2")
        if gpt2:
            act = F.gelu(linear(h, pre + "mlp.fc"), approximate="tanh")
        else:
            act = F.silu(linear(h, pre + "mlp.gate")) * linear(h, pre + "mlp.fc")
        x = x + linear(act, pre + "mlp.proj")
    head = p["wte"] if gpt2 else p["head.weight"]
    logits = F.linear(norm(x, "normf"), head).view(B * T, -1)
    loss = F.cross_entropy(logits[:, :cfg["vocab"]], targets.reshape(-1))
    return logits, loss


def global_norm(params):
    """sqrt(sum of g^2) over every gradient, in fp64 (as nn::global_grad_norm sums)."""
    total = sum(float((t.grad.double() ** 2).sum()) for t in params.values())
    return math.sqrt(total)


def torch_reference(cfg, weights, tokens, targets, steps, lr, weight_decay, grad_clip, device):
    """First-step logits, loss and gradients, and the loss and global gradient norm before each
    AdamW update, the gradients clipped to grad_clip (None: half the first norm, so that
    clipping acts; 0: off) as train::Optimizer clips."""
    params = {n: w.clone().to(device).requires_grad_(True) for n, w in weights.items()}
    tokens = torch.from_numpy(tokens).long().to(device)
    targets = torch.from_numpy(targets).long().to(device)
    decay = [t for t in params.values() if t.dim() >= 2]
    no_decay = [t for t in params.values() if t.dim() < 2]
    # Single-tensor AdamW (foreach=False): flashtrain follows its operation order.
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    logits, loss = forward(cfg, params, tokens, targets)
    first_logits = logits.detach().cpu().double().numpy()
    loss.backward()
    first_loss = loss.item()
    grads = {n: t.grad.detach().cpu().double().numpy() for n, t in params.items()}
    if grad_clip is None:
        grad_clip = 0.5 * global_norm(params)
    losses, norms, clipped = [], [], 0
    for step in range(steps):
        if step > 0:
            opt.zero_grad(set_to_none=True)
            _, loss = forward(cfg, params, tokens, targets)
            loss.backward()
        losses.append(loss.item())
        norm = global_norm(params)
        norms.append(norm)
        if grad_clip > 0 and norm > grad_clip:
            clipped += 1
            with torch.no_grad():
                for t in params.values():
                    t.grad.mul_(grad_clip / norm)
        opt.step()
    return {"logits": first_logits, "loss": first_loss, "grads": grads, "losses": losses,
            "grad_norms": norms, "grad_clip": grad_clip, "clipped": clipped}


# ---------------------------------------------------------------- comparison


def relative_error(ours, ref):
    """||ours - ref|| / ||ref|| in fp64 (the absolute norm when ref is all zeros); inf when ours
    is not finite or the shapes differ."""
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if ours.shape != ref.shape or not np.all(np.isfinite(ours)):
        return math.inf
    diff = np.linalg.norm(ours - ref)
    scale = np.linalg.norm(ref)
    return float(diff / scale) if scale > 0 else float(diff)


def max_relative_error(ours, ref):
    """Largest |ours_i - ref_i| / |ref_i| over a sequence; inf on a length mismatch."""
    if len(ours) != len(ref) or len(ref) == 0:
        return math.inf
    return max(relative_error(a, b) for a, b in zip(ours, ref))


def run_flashtrain(args, ckpt, tokens_path, targets_path, out_dir, device, dtype, grad_clip):
    cmd = [args.cli, "debug-step", "--load", ckpt, "--tokens", tokens_path, "--targets",
           targets_path, "--out-dir", out_dir, "--device", device, "--dtype", dtype,
           "--attention", args.attention, "--steps", str(args.steps), "--lr", repr(args.lr),
           "--weight-decay", repr(args.weight_decay), "--grad-clip", repr(grad_clip)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        print(f"flashtrain failed ({result.returncode}): {' '.join(cmd)}\n"
              f"{result.stdout}{result.stderr}", file=sys.stderr)
        return None
    with open(os.path.join(out_dir, "losses.json")) as f:
        summary = json.load(f)
    grads = {}
    for name in os.listdir(out_dir):
        if name.startswith("grad_") and name.endswith(".npy"):
            grads[name[len("grad_"):-len(".npy")]] = np.load(os.path.join(out_dir, name))
    return {"logits": np.load(os.path.join(out_dir, "logits.npy")), "loss": summary["loss"],
            "grads": grads, "losses": summary["losses"], "grad_norms": summary["grad_norms"]}


def compare(model, device, dtype, ours, ref, verbose_grads):
    """Table rows (model, device, dtype, quantity, error, bound, ok) for one flashtrain run."""
    bounds = BOUNDS[dtype]
    rows = []

    def row(quantity, error, bound):
        rows.append((model, device, dtype, quantity, error, bound, error <= bound))

    row("logits", relative_error(ours["logits"], ref["logits"]), bounds["logits"])
    row("loss", relative_error(ours["loss"], ref["loss"]), bounds["loss"])
    missing = sorted(set(ref["grads"]) - set(ours["grads"]))
    extra = sorted(set(ours["grads"]) - set(ref["grads"]))
    for name in missing + extra:
        row(f"grad {name} ({'missing' if name in missing else 'unexpected'})", math.inf, 0.0)
    grad_rows = [(f"grad {name}", relative_error(ours["grads"][name], g), bounds["grad"])
                 for name, g in ref["grads"].items() if name in ours["grads"]]
    if verbose_grads:
        for r in grad_rows:
            row(*r)
    else:
        worst = max(grad_rows, key=lambda r: r[1])
        failed = [r for r in grad_rows if not r[1] <= r[2]]
        for r in failed:
            row(*r)
        row(f"grads, worst of {len(grad_rows)} ({worst[0][5:]})", worst[1], bounds["grad"])
    row(f"adamw losses ({len(ref['losses'])} steps)",
        max_relative_error(ours["losses"], ref["losses"]), bounds["adamw losses"])
    row(f"grad norms ({len(ref['grad_norms'])} steps, {ref['clipped']} clipped)",
        max_relative_error(ours["grad_norms"], ref["grad_norms"]), bounds["grad norms"])
    return rows


def print_table(rows):
    header = ("model", "device", "dtype", "quantity", "error", "bound", "ok")
    cells = [header] + [(m, d, t, q, f"{e:.2e}", f"{b:.0e}", "ok" if ok else "FAIL")
                        for m, d, t, q, e, b, ok in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for i, r in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))


def main():
    parser = argparse.ArgumentParser(
        description="Compare flashtrain's GPT-2 and LLaMA-3 logits, loss, gradients and AdamW "
                    "losses with PyTorch's on random weights (exit 1 on any failure).")
    parser.add_argument("--cli", default="build/flashtrain",
                        help="the flashtrain binary (default: %(default)s)")
    parser.add_argument("--device", nargs="+", choices=["cpu", "cuda"], default=["cpu"],
                        help="flashtrain devices to check (default: cpu)")
    parser.add_argument("--dtype", nargs="+", choices=["fp32", "bf16"], default=["fp32", "bf16"],
                        help="flashtrain dtypes to check (default: fp32 bf16)")
    parser.add_argument("--models", nargs="+", choices=["gpt2", "llama3"],
                        default=["gpt2", "llama3"], help="model families (default: both)")
    parser.add_argument("--attention", choices=["naive", "flash"], default="naive",
                        help="flashtrain's attention implementation (default: naive)")
    parser.add_argument("--batch", type=int, default=2, help="sequences per batch (default: 2)")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per sequence (default: 64)")
    parser.add_argument("--steps", type=int, default=10,
                        help="AdamW steps on the batch (default: %(default)s)")
    parser.add_argument("--lr", type=float, default=3e-4,
                        help="constant AdamW learning rate (default: %(default)s)")
    parser.add_argument("--weight-decay", type=float, default=0.1,
                        help="AdamW weight decay on 2-D parameters (default: %(default)s)")
    parser.add_argument("--grad-clip", type=float, default=None,
                        help="clip the global gradient norm to this (0: off; default: half the "
                             "first step's norm, so that clipping acts)")
    parser.add_argument("--seed", type=int, default=1234, help="weights and tokens seed")
    parser.add_argument("--torch-device", default="cpu",
                        help="where PyTorch computes the fp32 reference (default: cpu)")
    parser.add_argument("--work-dir", default=None,
                        help="keep checkpoints and outputs here (default: a temporary directory)")
    parser.add_argument("--all-grads", action="store_true",
                        help="one table row per gradient (default: failures and the worst one)")
    args = parser.parse_args()

    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if not os.path.isfile(args.cli):
        parser.error(f"--cli {args.cli}: no such file (build flashtrain first)")
    if args.torch_device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--torch-device {args.torch_device}: PyTorch sees no GPU")
    # fp32 is true fp32 on both sides.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")

    work = args.work_dir or tempfile.mkdtemp(prefix="flashtrain_parity_")
    os.makedirs(work, exist_ok=True)
    rows, failed_runs = [], 0
    for family in args.models:
        cfg = make_config(family, args)
        if args.seq_len > cfg["context"]:
            parser.error(f"--seq-len {args.seq_len} exceeds the models' context {cfg['context']}")
        gen = torch.Generator().manual_seed(args.seed)
        weights = random_weights(cfg, gen)
        shape = (args.batch, args.seq_len)
        tokens = torch.randint(0, cfg["vocab"], shape, generator=gen).numpy().astype(np.int32)
        targets = torch.randint(0, cfg["vocab"], shape, generator=gen).numpy().astype(np.int32)
        ckpt = os.path.join(work, f"{family}.bin")
        tokens_path = os.path.join(work, f"{family}_tokens.npy")
        targets_path = os.path.join(work, f"{family}_targets.npy")
        write_checkpoint(ckpt, cfg, weights)
        np.save(tokens_path, tokens)
        np.save(targets_path, targets)
        ref = torch_reference(cfg, weights, tokens, targets, args.steps, args.lr,
                              args.weight_decay, args.grad_clip, args.torch_device)
        print(f"{family}: {cfg['layers']} layers, width {cfg['width']}, heads {cfg['heads']}/"
              f"{cfg['kv_heads']}, MLP {cfg['ffn']}, vocab {cfg['vocab']} "
              f"(padded {cfg['padded_vocab']}), batch {shape[0]}x{shape[1]}; PyTorch "
              f"{torch.__version__} fp32 on {args.torch_device}: loss {ref['loss']:.6f}, "
              f"before AdamW step {args.steps} {ref['losses'][-1]:.6f}, grad clip "
              f"{ref['grad_clip']:.6g} (acted in {ref['clipped']} of {args.steps} steps)")
        for device in args.device:
            for dtype in args.dtype:
                out_dir = os.path.join(work, f"{family}_{device}_{dtype}")
                ours = run_flashtrain(args, ckpt, tokens_path, targets_path, out_dir, device,
                                      dtype, ref["grad_clip"])
                if ours is None:
                    failed_runs += 1
                    rows.append((family, device, dtype, "flashtrain run", math.inf, 0.0, False))
                    continue
                rows += compare(family, device, dtype, ours, ref, args.all_grads)
    print()
    print_table(rows)
    failures = sum(1 for r in rows if not r[6])
    print(f"\n{len(rows) - failures} passed, {failures} failed"
          + (f" ({failed_runs} flashtrain runs failed)" if failed_runs else "")
          + (f"; files in {work}" if args.work_dir or failures else ""))
    if not args.work_dir and not failures:
        shutil.rmtree(work)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
