#!/usr/bin/env python3
"""How evenly the tma forward's persistent blocks share a problem's work tiles: a simulation.

Builds the work-tile list as attention/tile_order.h does (sections of (head, batch row) pairs,
inside a section the query blocks longest first, the pairs side by side) with each tile's cost in
key tiles (plus a fixed cost per work tile, --ramp, in the same unit), then the largest block's
total against the mean for
  - sections: the kernel's deal (TileOrder::next_tile: each section dealt in rounds of one tile
    a block, in a snake: walk step s gives block b the round's tile b, or grid - 1 - b when s is
    odd) with the section size make_tile_order chooses: under a causal mask alone, among whole
    GQA groups from half of what fits in 16 MiB of L2 up to all of it, the size whose busiest
    block does the least with a ramp of 2 key tiles a work tile (kWorkTileRampKeyTiles), the
    largest of equals (with a window or documents, the largest that fit);
  - largest: the same deal with the largest sections that fit (the rule before 2026-12-07);
  - one list: the deal before 2026-12-05 (the same snake over the whole list, so that rounds
    straddle sections);
  - claims: each block takes the next tile of the list when its producer has asked for the
    current one's last key tile, --lead key tiles before the tile ends (the ring's depth: the
    claimed work tiles, the default since session 60; the deal above is FT_TMA_DEAL=static).
No GPU: a model of the schedule only (every key tile costs the same, no clocks, no L2).

  python3 bench/tile_order_sim.py                      # the bench's cases
  python3 bench/tile_order_sim.py --shape 4,2048,32,8,64 --block-m 128 --ramp 2
"""
import argparse
import heapq

L2_BYTES_FOR_KV = 16 << 20  # kL2BytesForKv


RAMP_KEY_TILES = 2  # kWorkTileRampKeyTiles: the ramp make_tile_order's choice assumes


def fit_pairs(seq_len, batch, q_heads, kv_heads, head_dim):
    """The most pairs whose K and V fit in L2_BYTES_FOR_KV (whole GQA groups), and a group."""
    kv_head_bytes = 2 * seq_len * head_dim * 2
    kv_heads_fit = 1
    while kv_heads_fit * 2 * kv_head_bytes <= L2_BYTES_FOR_KV:
        kv_heads_fit *= 2
    group = q_heads // kv_heads
    return min(kv_heads_fit * group, batch * q_heads), group


def key_tiles(seq_len, block_m, block_n, batch, q_heads, kv_heads, head_dim, causal, window,
              section_pairs=None):
    """Key tiles per work tile in TileOrder's order (TileOrder::at) with sections of
    section_pairs pairs (default: the largest that fit), and the tiles a section."""
    q_blocks = (seq_len + block_m - 1) // block_m
    pairs = batch * q_heads
    if section_pairs is None:
        section_pairs = fit_pairs(seq_len, batch, q_heads, kv_heads, head_dim)[0]
    tiles = []
    for first in range(0, pairs, section_pairs):
        for rank in range(q_blocks):
            q = q_blocks - 1 - rank if causal else rank
            q0, q1 = q * block_m, min(q * block_m + block_m, seq_len)
            lo = max(0, q0 - (window - 1)) if window else 0
            hi = q1 if causal else seq_len
            n = (hi + block_n - 1) // block_n - lo // block_n
            tiles += [n] * min(section_pairs, pairs - first)
    return tiles, section_pairs * q_blocks


def chosen_section_pairs(shape, grid):
    """make_tile_order's section size for shape (the key_tiles arguments before section_pairs)."""
    seq_len, _, _, batch, q_heads, kv_heads, head_dim, causal, window = shape
    fit, group = fit_pairs(seq_len, batch, q_heads, kv_heads, head_dim)
    if not causal or window:  # the model's choice is made under a causal mask alone
        return fit

    def busiest(pairs):
        tiles, per = key_tiles(*shape, section_pairs=pairs)
        return snake([RAMP_KEY_TILES + k for k in tiles], grid, per)
    best, best_work = fit, busiest(fit)
    pairs = fit - group
    while pairs > 0 and 2 * pairs >= fit:
        work = busiest(pairs)
        if work < best_work:
            best, best_work = pairs, work
        pairs -= group
    return best


def snake(costs, grid, section_tiles=None):
    """The busiest block's work when the list is dealt in sections (None: as one list)."""
    per = section_tiles or len(costs)
    load = [0.0] * grid
    step0 = 0  # walk steps of the sections before
    for first in range(0, len(costs), per):
        section = costs[first:first + per]
        for t, c in enumerate(section):
            r, b = divmod(t, grid)
            load[b if (step0 + r) % 2 == 0 else grid - 1 - b] += c
        step0 += (per + grid - 1) // grid
    return max(load)


def claims(costs, grid, lead):
    """The last block's end when each block claims the list's next tile lead before its current
    one ends (its first tile: its index)."""
    ends = list(costs[:grid])  # each block's claimed work ends here
    ready = [(max(0.0, e - lead), b) for b, e in enumerate(ends)]  # when each claims its next
    heapq.heapify(ready)
    for c in costs[grid:]:
        _, b = heapq.heappop(ready)
        start = ends[b]
        ends[b] = start + c
        heapq.heappush(ready, (max(start, ends[b] - lead), b))
    return max(ends)


CASES = {  # name: (S, B, Hq, Hkv, D, causal, window, block_m, block_n, blocks or None: --blocks)
    "hero-causal": (4096, 32, 16, 4, 128, True, 0, 128, 128, None),
    "gpt2": (1024, 8, 12, 12, 64, True, 0, 64, 64, 396),  # 64x64/256: three blocks an SM
    "gpt2-b16": (1024, 16, 12, 12, 64, True, 0, 64, 64, 396),
    "gpt2-128": (1024, 8, 12, 12, 64, True, 0, 128, 128, None),
    "llama-4x2048": (2048, 4, 32, 8, 64, True, 0, 128, 128, None),
    "llama-long": (32768, 1, 32, 8, 64, True, 0, 192, 128, None),
    "llama-long-128": (32768, 1, 32, 8, 64, True, 0, 128, 128, None),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", help="B,S,Hq,Hkv,D (causal unless --no-causal); default: the cases")
    ap.add_argument("--no-causal", action="store_true")
    ap.add_argument("--window", type=int, default=0)
    ap.add_argument("--block-m", type=int, default=128)
    ap.add_argument("--block-n", type=int, default=128)
    ap.add_argument("--blocks", type=int, default=132, help="persistent blocks (H200: 132 SMs)")
    ap.add_argument("--ramp", type=float, default=0.0, help="fixed cost a work tile, in key tiles")
    ap.add_argument("--lead", type=float, default=2.0,
                    help="claims: key tiles before a tile's end that its block claims the next")
    a = ap.parse_args()
    cases = CASES
    if a.shape:
        b, s, hq, hkv, d = (int(x) for x in a.shape.split(","))
        cases = {a.shape: (s, b, hq, hkv, d, not a.no_causal, a.window, a.block_m, a.block_n, None)}
    print(f"{'case':16} {'tiles':>6} {'blocks':>6} {'pairs':>11} {'sections':>8} {'largest':>8} "
          f"{'one list':>8} {'claims':>8}  (mean block / busiest block)")
    for name, (s, b, hq, hkv, d, causal, window, bm, bn, blocks) in cases.items():
        grid = blocks or a.blocks
        shape = (s, bm, bn, b, hq, hkv, d, causal, window)
        chosen = chosen_section_pairs(shape, grid)
        largest = fit_pairs(s, b, hq, hkv, d)[0]
        tiles, per_section = key_tiles(*shape, section_pairs=chosen)
        costs = [a.ramp + k for k in tiles]
        mean = sum(costs) / grid
        big, big_per = key_tiles(*shape, section_pairs=largest)
        big = [a.ramp + k for k in big]
        balance = [mean / snake(costs, grid, per_section), mean / snake(big, grid, big_per),
                   mean / snake(big, grid), mean / claims(costs, grid, a.lead)]
        print(f"{name:16} {len(costs):6} {grid:6} {f'{chosen} of {largest}':>11} "
              + " ".join(f"{x:8.3f}" for x in balance))


if __name__ == "__main__":
    main()
