"""A model of how the warp-specialised attention kernels' items spread over the SMs under a causal
mask: what share of the SMs' time is idle at the end of the walk, for the order of items by batch
element (before the twelfth session) and by groups of heads sized to the L2 (attn::walk_group). No
GPU needed; docs/performance.md ("Twelfth session") cites it, and the kernels' measured times.

The items and their order mirror csrc/cuda/attention: attention_fwd_ws.cu (query tiles of 64 NWG
rows, three consumers at head dim 64 and two at 128, key tiles of 128, the first tile padded from T
512 so the tiles end at T) and attention_bwd_ws.cu (key tiles of 128, query tiles of 128 at head dim
64 and 64 at 128); attention_tiles.cuh's tile_order (heaviest first within a group of heads) and
walk_group. An item costs its tiles of the other operand plus a fixed overhead (--overhead tiles:
loading the first tiles, storing the output); each SM takes the next item when it is free, as the
dynamic walk does, and as the hardware hands out the blocks of a grid of a block an item.

    python bench/attention_walk.py                               # gpt2_124m's shape, both directions
    python bench/attention_walk.py --batch 16 --heads 6 --head-dim 128 --budgets 8 16 32
"""
from __future__ import annotations

import argparse
import heapq
import json
import math


def forward_items(T: int, D: int) -> list[int]:
    """Key tiles of 128 that each query tile of the forward sees (causal, S = T), heaviest first."""
    rows = 64 * (3 if D <= 64 else 2)
    tiles = math.ceil(T / rows)
    pad = (tiles * rows - T) // 64 * 64 if T >= 512 else 0
    seen = [math.ceil(max(0, min(T, i * rows - pad + rows)) / 128) for i in range(tiles)]
    return sorted(seen, reverse=True)


def backward_items(T: int, D: int) -> list[int]:
    """Query tiles that each key tile of 128 of the backward sees (causal, S = T), heaviest first."""
    rows = 128 if D <= 64 else 64
    return [math.ceil((T - k0 // rows * rows) / rows) for k0 in range(0, T, 128)]


def walk_group(bh: int, bytes_per_head: int, budget_mb: int) -> int:
    """attn::walk_group: bh heads in equal groups of at most budget_mb of what each head's items reread."""
    groups = max(1, math.ceil(bh * bytes_per_head / (budget_mb << 20)))
    return math.ceil(bh / groups)


def walk(tiles: list[int], bh: int, group: int) -> list[int]:
    """The items' costs in the walk's order: groups of heads, each heaviest rank first (tile_order)."""
    order = []
    for g0 in range(0, bh, group):
        n = min(group, bh - g0)
        for cost in tiles:
            order += [cost] * n
    return order


def idle_share(costs: list[int], sms: int, overhead: float) -> float:
    """Share of the SMs' time idle before the last one finishes, each SM taking the next item when free."""
    free_at = [0.0] * sms
    for cost in costs:
        heapq.heappush(free_at, heapq.heappop(free_at) + cost + overhead)
    busy = sum(costs) + overhead * len(costs)
    return 1.0 - busy / (sms * max(free_at))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--head-dim", type=int, default=64, choices=(64, 128))
    ap.add_argument("--sms", type=int, default=132, help="an H100 SXM's or H200's")
    ap.add_argument("--overhead", type=float, default=0.5, help="an item's fixed cost, in tiles")
    ap.add_argument("--budgets", type=int, nargs="+", default=[8, 16, 32], metavar="MB")
    args = ap.parse_args(argv)
    B, H, T, D = args.batch, args.heads, args.seq, args.head_dim
    bh, bytes_per_head = B * H, 4 * T * D  # two bf16 (T, D) operands a head: K and V, or Q and dO
    for direction, tiles in (("forward", forward_items(T, D)), ("backward", backward_items(T, D))):
        row = {"direction": direction, "shape": [B, H, T, D], "items": len(tiles) * bh,
               "idle_batch_element": round(idle_share(walk(tiles, bh, H), args.sms, args.overhead), 3)}
        for mb in args.budgets:
            group = walk_group(bh, bytes_per_head, mb)
            row[f"idle_{mb}mb"] = round(idle_share(walk(tiles, bh, group), args.sms, args.overhead), 3)
            row[f"group_{mb}mb"] = group
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
