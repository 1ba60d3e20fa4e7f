"""`coop simulate`'s command line: one flag per SimulateConfig field, and --config FILE (coop.options)."""
from __future__ import annotations

import argparse
import sys
import time
import types
import typing
from dataclasses import MISSING, fields
from pathlib import Path

from ..devices import DEVICE_HELP, describe_device
from ..options import OptionsError, build_options, choices_of, given_options
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
    "eager": "overlap (star): the steps beside the merge start from the outer step taken with the replica's own "
             "update (eager updates); --no-eager: from the replica's end of round; default: eager for an overlap "
             "of at least a quarter of the round",
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
    # default SUPPRESS: a flag not given is absent from args, so --config's value (or the field's default) stands
    p = subparsers.add_parser("simulate", help="N DiLoCo replicas in one process, against ddp / single baselines",
                              description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
                              argument_default=argparse.SUPPRESS)
    p.add_argument("--config", metavar="FILE", help="a TOML file of these options (replicas = 4, ...); "
                   "the flags given override it")
    hints = typing.get_type_hints(SimulateConfig)  # Annotated[...] stripped: int, list[Literal[...]], ...
    for f in fields(SimulateConfig):
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not MISSING else f.default_factory()  # no instance: no device probe
        kind = hints[f.name]
        if typing.get_origin(kind) in (typing.Union, types.UnionType):  # int | None
            kind = next(k for k in typing.get_args(kind) if k is not type(None))
        item = typing.get_args(kind)[0] if typing.get_origin(kind) is list else kind
        choices = choices_of(item)
        text = HELP["data"] if f.name == "data" else f"{HELP.get(f.name, '')} (default: {default})".lstrip()
        if f.name == "device":
            p.add_argument(flag, metavar="DEVICE", help=DEVICE_HELP)
        elif typing.get_origin(kind) is list:
            p.add_argument(flag, nargs="+", choices=choices, help=text)
        elif f.name in ("no_diloco", "quiet"):
            p.add_argument(flag, action="store_true", help=HELP[f.name])
        elif kind is bool:
            p.add_argument(flag, action=argparse.BooleanOptionalAction, help=text)
        else:
            p.add_argument(flag, type=str if choices else kind, choices=choices, help=text)
    p.add_argument("--report", nargs="+", metavar="JSONL",
                   help="train nothing: rebuild the table and OUT/plot.png from metrics.jsonl file(s)")
    p.set_defaults(run=run)


def run(args) -> int:
    if getattr(args, "report", None):
        report.finish(report.read_jsonl(args.report), Path(getattr(args, "out", SimulateConfig.out)),
                      getattr(args, "plot", True))
        return 0
    try:
        cfg = build_options(SimulateConfig, given_options(args, SimulateConfig), getattr(args, "config", None))
    except OptionsError as error:
        print(f"coop simulate: {error}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    print(f"coop simulate: device {describe_device(cfg.device)}")
    simulate(cfg)
    print(f"done in {format_duration(time.perf_counter() - start)}")
    return 0
