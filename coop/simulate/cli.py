"""`coop simulate`'s command line: one flag per SimulateConfig field."""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import fields
from pathlib import Path

from ..progress import format_duration
from . import report
from .config import SimulateConfig
from .runs import simulate


DESCRIPTION = """`coop simulate`: N DiLoCo replicas in one process, against the baselines, on one token budget.

Each round every taking-part replica starts from the merged weights, takes K inner steps on its
own shard, and sends its pseudo-gradient through the codec (encode -> decode, bytes counted
exactly); the merge (a topology: `star` = one global model and the outer optimizer, as the HTTP
coordinator does; `gossip` = coop.gossip.merge) makes the next round's weights. Baselines on the
same tokens: `ddp` (one model stepping on the concatenation of the N replicas' batches, drawn from
the same shards with the same RNGs: what synchronous data-parallel computes), `single` (one
replica alone on the same tokens) and `solo` (one replica alone for the same wall time: R x K steps). Metrics go to OUT/metrics.jsonl, OUT/plot.png and a summary table."""

HELP = {
    "data": "text file(s) (default: the embedded corpus of `coop train`)",
    "replicas": "N, replicas training together", "inner_steps": "K, inner steps between merges",
    "rounds": "R rounds (default 6)", "tokens": "token budget over all replicas, instead of --rounds",
    "split": "iid | contiguous (non-iid shards) | whole (every replica samples the whole train split)", "topology": "star (one global model) | gossip",
    "gossip_group_size": "gossip: replicas averaging together each round",
    "gossip_mix": "gossip: also average the group's weights",
    "compression": "codec(s) of the pseudo-gradients: fp32 fp16 bf16 int8 int4 topk topk8; one DiLoCo run each "
                   "(int4, topk, topk8 with error feedback)",
    "downlink": "codec of the merged update sent back to the replicas",
    "drop_prob": "chance that a replica misses a round",
    "join_at": "replica:round, a replica that arrives late, e.g. --join-at 3:5 2:8",
    "inner_optimizer": "adamw | sgd", "warmup_steps": "inner lr warm-up, then cosine to --min-lr",
    "outer_lr": "outer Nesterov SGD lr (1 with --outer-momentum 0: plain averaging)",
    "outer_warmup": "rounds of linear outer-lr warm-up",
    "outer_decay": "cosine decay of the outer lr over the local rounds",
    "outer_min_lr_factor": "--outer-decay ends at this x --outer-lr",
    "fragments": "streaming DiLoCo: P fragments merged in turn (a round is K / P inner steps); 1 = plain DiLoCo",
    "overlap_steps": "the merge arrives this many inner steps into the next round (overlap, one-step delay)",
    "warm_start_steps": "synchronous (ddp) inner steps before going local, a multiple of K",
    "aggregation": "the robust rule of the merge: filtered_mean | median | trimmed_mean | centered_clip | mean (plain)",
    "trim_fraction": "trimmed_mean: drop this fraction of the values at each end, per coordinate",
    "clip_factor": "clip each pseudo-gradient to this x the round's median norm (0: off)",
    "max_norm": "clip each pseudo-gradient to this global L2 norm (0: off)",
    "min_contributions": "rounds with fewer contributions take the plain weighted mean",
    "adversaries": "the first N replicas are adversaries: they send --attack instead of their update",
    "attack": "signflip (-S x update) | noise (gaussian of S x its norm) | scale (S x update)",
    "attack_scale": "S, the strength of --attack",
    "weight_by": "tokens | equal: the weight of each replica's update",
    "baseline": "baselines: ddp and/or single (same tokens), solo (same wall time), or none (default: ddp)",
    "eval_every": "measure the val loss every N points (of K inner steps) and at the end",
    "no_diloco": "run only the baselines", "tag": "suffix of the run names (to tell runs apart in --report)",
    "quiet": "no progress line", "plot": "write OUT/plot.png",
}


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("simulate", help="N DiLoCo replicas in one process, against ddp / single baselines",
                              description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = SimulateConfig()
    for f in fields(SimulateConfig):
        flag = "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        text = HELP["data"] if f.name == "data" else f"{HELP.get(f.name, '')} (default: {default})".lstrip()
        if isinstance(default, list) or f.name == "data":
            p.add_argument(flag, nargs="+", default=default, help=text)
        elif f.name in ("no_diloco", "quiet"):
            p.add_argument(flag, action="store_true", help=HELP[f.name])
        elif isinstance(default, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=text)
        else:
            kind = int if f.name in ("rounds", "tokens") else type(default)
            p.add_argument(flag, type=kind, default=default, help=text)
    p.add_argument("--report", nargs="+", metavar="JSONL",
                   help="train nothing: rebuild the table and OUT/plot.png from metrics.jsonl file(s)")
    p.set_defaults(run=run)


def run(args) -> int:
    if args.report:
        report.finish(report.read_jsonl(args.report), Path(args.out), args.plot)
        return 0
    try:
        cfg = SimulateConfig(**{f.name: getattr(args, f.name) for f in fields(SimulateConfig)})
        cfg.join_rounds()
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    start = time.perf_counter()
    simulate(cfg)
    print(f"done in {format_duration(time.perf_counter() - start)}")
    return 0
