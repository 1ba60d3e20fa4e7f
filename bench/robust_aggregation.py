"""Robust aggregation under attack, in `coop simulate` (docs/results.md, "Robust aggregation").

Each case is one DiLoCo run (star merge, fp32) with the first `adversaries` replicas sending an
attack (coop.simulate.adversary) and the merge aggregating with one rule; prints one JSON line
per run (its final val loss and its val-loss curve). The same runs from the command line:

    coop simulate --replicas 4 --adversaries 1 --attack signflip --attack-scale 100 \\
        --aggregation trimmed_mean --n-layer 2 --n-head 2 --n-embd 64 --block-size 64 ...

    python bench/robust_aggregation.py [--shard I/M] [--only SUBSTRING] > out.jsonl
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

from coop.simulate import SimulateConfig, build_setup, run_diloco

# the model and schedule of the measurement: "tiny" is what docs/results.md reports (2 CPU cores shared
# with other jobs: 10-40 s a run); "small" is the size first planned (minutes a run there)
SIZES = {"tiny": dict(n_layer=1, n_head=2, n_embd=32, block_size=32, batch_size=8, inner_steps=10, rounds=15,
                      lr=3e-3, min_lr=3e-4, warmup_steps=10),
         "small": dict(n_layer=2, n_head=2, n_embd=64, block_size=64, batch_size=16, inner_steps=20, rounds=15,
                       lr=3e-3, min_lr=3e-4, warmup_steps=20),
         # the 3.2M model of the DiLoCo quality runs (bench/diloco_quality.py), 1000 inner steps: a GPU's size
         "gpu": dict(n_layer=4, n_head=4, n_embd=256, block_size=128, batch_size=16, inner_steps=50, rounds=20,
                     lr=1e-3, min_lr=1e-4, warmup_steps=100, beta2=0.99, eval_batches=20)}
COMMON = dict(baseline=["none"], plot=False, quiet=True)
RULES = {  # name -> SimulateConfig fields
    "mean": dict(aggregation="mean", clip_factor=0.0),
    "trimmed_mean": dict(aggregation="trimmed_mean", trim_fraction=0.25, clip_factor=2.0),
    "median": dict(aggregation="median", clip_factor=2.0),
    "centered_clip": dict(aggregation="centered_clip", clip_factor=2.0),
    "filtered_mean": dict(aggregation="filtered_mean", clip_factor=2.0),
    "clip_only": dict(aggregation="mean", clip_factor=2.0),  # adaptive clipping alone, streamed
    "trimmed_noclip": dict(aggregation="trimmed_mean", trim_fraction=0.25, clip_factor=0.0),
}
ATTACKS = {"clean": (0, "signflip"), "signflip": (1, "signflip"), "noise": (1, "noise")}  # adversaries per 4


def cases() -> list[tuple[int, str, str]]:
    """(replicas, attack, rule), the most telling first."""
    out = [(n, a, r) for n in (4, 8) for r, a in [("mean", "clean"), ("trimmed_mean", "clean"),
                                                   ("trimmed_mean", "signflip"), ("trimmed_mean", "noise")]]
    out += [(n, a, r) for r in ("clip_only", "median", "centered_clip", "filtered_mean") for n in (4, 8) for a in ATTACKS]
    out += [(n, a, "mean") for n in (4, 8) for a in ("signflip", "noise")]
    out += [(4, a, "trimmed_noclip") for a in ATTACKS]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shard", default="0/1", help="I/M: run every M-th case from the I-th")
    parser.add_argument("--only", nargs="*", default=[""],
                        help="run the cases whose 'replicas/attack/rule' contains one of these")
    parser.add_argument("--attack-scale", type=float, default=100.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    index, count = (int(v) for v in args.shard.split("/"))
    todo = [c for k, c in enumerate(cases()) if k % count == index
            and any(o in "/".join(map(str, c)) for o in args.only)]
    setups = {}
    for replicas, attack_name, rule in todo:
        adversaries_per_4, attack = ATTACKS[attack_name]
        cfg = SimulateConfig(**SIZES[args.size], **COMMON, **RULES[rule], replicas=replicas, seed=args.seed, out="/tmp/robust-aggregation", device=args.device,
                             adversaries=adversaries_per_4 * replicas // 4, attack=attack,
                             attack_scale=args.attack_scale, tag=f"{attack_name}-{rule}")
        if replicas not in setups:
            setups[replicas] = build_setup(cfg)  # data, shards, initial weights: the same for every rule
        start = time.perf_counter()
        result = run_diloco(dataclasses.replace(setups[replicas], cfg=cfg), "fp32")
        print(json.dumps({"replicas": replicas, "adversaries": cfg.adversaries, "attack": attack_name,
                          "attack_scale": cfg.attack_scale if cfg.adversaries else 0, "rule": rule,
                          **RULES[rule], "size": args.size, "device": args.device, "seed": args.seed, "val_loss": result.records[-1]["val_loss"],
                          "val_curve": [r["val_loss"] for r in result.records],
                          "wall_s": round(time.perf_counter() - start, 1)}), flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
