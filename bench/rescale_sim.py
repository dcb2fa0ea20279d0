#!/usr/bin/env python3
"""How often the tma forward rescales O: a count on the bench's random data.

A consumer warp holds 16 query rows of a work tile; after each key tile's online-softmax step
it multiplies its part of O by alpha unless every alpha of the warp is 1, i.e. unless no row's
maximum moved. A row's maximum moves when the tile's largest scaled score (base 2: the scores
times scale * log2(e)) exceeds it by more than the slack: 0 before 2026-12-05 (every new
maximum), kRescaleSlack = 8 (flash_bf16.cuh) since. Counts, over every warp and key tile
after a row block's first (which sets the maxima), the fraction of steps that rescale, for causal
masks and q, k drawn from N(0, 1) as bench_attention_gpu draws them. No GPU, one (batch, head)
pair of the shape per trial.

  python3 bench/rescale_sim.py                                   # the bench's cases
  python3 bench/rescale_sim.py --shape 2048,64 --tile 128x128 --slack 0,4,8
"""
import argparse

import numpy as np

CASES = [  # name, seq_len, head_dim, block_m, block_n (the default plans' tiles)
    ("gpt2, 64x64/256", 1024, 64, 64, 64),
    ("gpt2, 128x128/384", 1024, 64, 128, 128),
    ("hero causal, 128x128/384", 4096, 128, 128, 128),
]


def rescale_fraction(seq_len, head_dim, block_m, block_n, slack, trials, rng):
    steps = rescales = 0
    for _ in range(trials):
        q = rng.standard_normal((seq_len, head_dim)).astype(np.float32)
        k = rng.standard_normal((seq_len, head_dim)).astype(np.float32)
        scores = (q @ k.T) * (np.log2(np.e) / np.sqrt(head_dim))
        keys = np.arange(seq_len)
        scores[keys[None, :] > keys[:, None]] = -np.inf  # causal
        for q0 in range(0, seq_len, block_m):
            last_tile = (min(q0 + block_m, seq_len) - 1) // block_n
            for w0 in range(q0, min(q0 + block_m, seq_len), 16):
                rows = scores[w0:w0 + 16]
                row_max = np.full(rows.shape[0], -np.inf)
                for kb in range(last_tile + 1):
                    tile_max = rows[:, kb * block_n:(kb + 1) * block_n].max(axis=1)
                    moves = tile_max > row_max + slack
                    if kb > 0:
                        steps += 1
                        rescales += bool(moves.any())
                    row_max = np.where(moves, tile_max, row_max)
    return rescales / max(steps, 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", help="seq_len,head_dim (default: the bench's cases)")
    ap.add_argument("--tile", default="128x128", help="block_m x block_n with --shape")
    ap.add_argument("--slack", default="0,8", help="slacks to compare (log2 units)")
    ap.add_argument("--trials", type=int, default=2, help="(batch, head) pairs per case")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    slacks = [float(x) for x in args.slack.split(",")]
    cases = CASES
    if args.shape:
        seq_len, head_dim = (int(x) for x in args.shape.split(","))
        block_m, block_n = (int(x) for x in args.tile.split("x"))
        cases = [(f"S={seq_len} D={head_dim}, {args.tile}", seq_len, head_dim, block_m, block_n)]
    rng = np.random.default_rng(args.seed)
    print("| case | " + " | ".join(f"slack {s:g}" for s in slacks) + " |")
    print("|---|" + "---:|" * len(slacks))
    for name, seq_len, head_dim, block_m, block_n in cases:
        fractions = [rescale_fraction(seq_len, head_dim, block_m, block_n, s, args.trials, rng)
                     for s in slacks]
        print(f"| {name} | " + " | ".join(f"{f:.1%}" for f in fractions) + " |")


if __name__ == "__main__":
    main()
