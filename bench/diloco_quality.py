"""DiLoCo against synchronous data parallel at equal tokens: a sweep of `coop simulate` settings.

Prints one JSON line per run: the setting, DiLoCo's final val loss, the DDP baseline's on the same
setup (same data, init, eval windows), the gap in percent, and bytes sent per replica against
DDP's. The defaults are the settings of a PyTorch DiLoCo reference script (4 replicas x
batch 16, K = 50, 2000 inner steps, AdamW 1e-3 -> 1e-4 with 100 warm-up steps and beta2 0.99,
outer Nesterov 0.7 / 0.9, a 3.2M GPT of 4 layers, width 256, block 128), so `--reference PATH`
runs that PyTorch script in the same call and prints its lines too.

    python bench/diloco_quality.py --device cuda --shakespeare data/tinyshakespeare.txt \\
        --reference torch_diloco_reference.py     # optional: the PyTorch script, kept outside the project
    python bench/diloco_quality.py --plan smoke                  # a tiny CPU run of the plan's shape
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import replace

from coop import simulate as sim

# the reference's settings (torch_diloco_reference.py)
REFERENCE = dict(replicas=4, batch_size=16, inner_steps=50, rounds=40, lr=1e-3, min_lr=1e-4, warmup_steps=100,
                 beta2=0.99, weight_decay=0.1, grad_clip=1.0, n_layer=4, n_head=4, n_embd=256, block_size=128,
                 outer_lr=0.7, outer_momentum=0.9, val_fraction=0.1, eval_batches=50, seed=0)

M10 = dict(n_layer=6, n_head=6, n_embd=384, block_size=256)
# the plain mean: with every replica honest the robust default (filtered_mean) gives the same
# losses (docs/results.md) and costs host time per round a sweep of hundreds of rounds cannot spare
FAST_MERGE = dict(aggregation="mean")

# (name, setup overrides, run overrides): runs sharing setup overrides share data, init and the DDP baseline
PLANS = {
    "reference": [
        ("shakespeare-iid", {"corpus": "shakespeare", "dropout": 0.1, "split": "iid"}, [{}]),
        ("shakespeare-whole", {"corpus": "shakespeare", "dropout": 0.1, "split": "whole"}, [{}]),
        ("stdlib40m-iid", {"corpus": "stdlib", "split": "iid"}, [{}]),
        ("stdlib40m-whole", {"corpus": "stdlib", "split": "whole"},
         [{}, {"compression": "int4"}, {"compression": "topk8", "topk_ratio": 0.1}, {"outer_momentum": 0.8},
          {"inner_steps": 25, "rounds": 80}, {"inner_steps": 10, "rounds": 200, "outer_lr": 0.5}]),
    ],
    # the best of the first sweep (K = 10, outer lr 0.5) and K = 25 with momentum 0.8, in 4 bits
    "followup": [
        ("stdlib40m-whole", {"corpus": "stdlib", "split": "whole"},
         [{"compression": "int4", "inner_steps": 10, "rounds": 200, "outer_lr": 0.5},
          {"compression": "int4", "inner_steps": 25, "rounds": 80, "outer_momentum": 0.8}]),
    ],
    # issue 14's second sweep: why tinyshakespeare differs from the reference (coop's GPT drops out
    # in four places, the reference's only inside attention: compare at dropout 0)
    "explain": [
        ("shakespeare-whole-d0", {"corpus": "shakespeare", "dropout": 0.0, "split": "whole"}, [{}]),
        ("shakespeare-whole-d0.1", {"corpus": "shakespeare", "dropout": 0.1, "split": "whole"}, [{}]),
    ],
    # what closes the gap at 3.2M (2000 steps): outer decay, warm start, streaming, overlap, K
    "tune32": [
        ("stdlib40m-whole", {"corpus": "stdlib", "split": "whole", "steps": 2000, **FAST_MERGE},
         [{"compression": "int4", "inner_steps": 10, "outer_lr": 0.5},
          {"compression": "int4", "inner_steps": 10, "outer_lr": 0.5, "outer_decay": True},
          {"compression": "int4", "inner_steps": 10, "outer_lr": 0.5, "warm_start_steps": 40},
          {"compression": "int4", "inner_steps": 25, "outer_momentum": 0.8, "outer_decay": True},
          {"compression": "int4", "inner_steps": 50, "outer_decay": True},
          {"compression": "int4", "inner_steps": 50, "fragments": 2},
          {"compression": "int4", "inner_steps": 50, "fragments": 2, "overlap_steps": 5},
          {"compression": "int4", "inner_steps": 100, "fragments": 4, "overlap_steps": 5},
          {"compression": "int4", "inner_steps": 100, "fragments": 4, "overlap_steps": 5, "outer_decay": True},
          {"compression": "int4", "inner_steps": 20, "outer_lr": 0.5, "outer_decay": True},
          {"compression": "int4", "inner_steps": 10, "outer_lr": 0.5, "overlap_steps": 2}]),
    ],
    # the targets: the 10.8M model (6 layers, 6 heads, width 384, block 256), >= 4000 inner steps
    "m10x4": [
        ("stdlib40m-10.8M-x4", {"corpus": "stdlib", "split": "whole", "steps": 4000, **M10, **FAST_MERGE}, [
            {"compression": "int4", "inner_steps": 20, "outer_lr": 0.5},
            {"compression": "int4", "inner_steps": 100, "fragments": 4, "overlap_steps": 5},
            {"compression": "int4", "inner_steps": 25, "outer_momentum": 0.8, "outer_decay": True},
            {"inner_steps": 50},
            {"compression": "int4", "inner_steps": 10, "outer_lr": 0.5}]),
    ],
    # one run per process (--only I): the GPU takes several at once
    "m10more": [
        ("stdlib40m-10.8M-x4", {"corpus": "stdlib", "split": "whole", "steps": 4000, **M10, **FAST_MERGE}, [
            {"compression": "int4", "inner_steps": 100, "fragments": 4, "overlap_steps": 5},
            {"inner_steps": 50},
            {"compression": "int4", "inner_steps": 10, "outer_lr": 0.5},
            {"compression": "int4", "inner_steps": 20, "outer_lr": 0.5, "overlap_steps": 2},
            {"compression": "int4", "inner_steps": 50, "outer_lr": 0.7},
            {"compression": "int4", "inner_steps": 50, "outer_lr": 0.5, "fragments": 2, "overlap_steps": 5}]),
    ],
    # 8 replicas at batch 8: the same global batch (64) and tokens as 4 x 16, so that the corpus
    # is not repeated more (8 x 16 x 256 x 4000 tokens would go through the 36M-token split 3.6 times)
    "m10x8b8": [
        ("stdlib40m-10.8M-x8-b8", {"corpus": "stdlib", "split": "whole", "steps": 4000, "replicas": 8,
                                   "batch_size": 8, **M10, **FAST_MERGE}, [
            {"compression": "int4", "inner_steps": 20, "outer_lr": 0.5}]),
    ],
    "m10x8": [
        ("stdlib40m-10.8M-x8", {"corpus": "stdlib", "split": "whole", "steps": 4000, "replicas": 8, **M10,
                                **FAST_MERGE}, [
            {"compression": "int4", "inner_steps": 20, "outer_lr": 0.5},
            {"compression": "int4", "inner_steps": 25, "outer_momentum": 0.8, "outer_decay": True}]),
    ],
    "m10shakespeare": [
        ("shakespeare-10.8M-x4", {"corpus": "shakespeare", "dropout": 0.1, "split": "iid", "steps": 4000, **M10,
                                  **FAST_MERGE}, [
            {"compression": "int4", "inner_steps": 20, "outer_lr": 0.5},
            {"inner_steps": 50}]),
    ],
    # overlap at the service's K = 100: the merge applied 10 / 30 / 60 / 90 steps into the next round, the
    # steps beside it from the replica's end of round ("eager": False) or from the eager guess (coop.eager)
    "overlap": [
        ("stdlib40m-10.8M-x4", {"corpus": "stdlib", "split": "whole", "steps": 4000, **M10, **FAST_MERGE}, [
            {"compression": "int8", "inner_steps": 100},
            {"compression": "int8", "inner_steps": 100, "overlap_steps": 30, "eager": False},
            {"compression": "int8", "inner_steps": 100, "overlap_steps": 30, "eager": True},
            {"compression": "int8", "inner_steps": 100, "overlap_steps": 60, "eager": False},
            {"compression": "int8", "inner_steps": 100, "overlap_steps": 60, "eager": True},
            {"compression": "int8", "inner_steps": 100, "overlap_steps": 90, "eager": True},
            {"compression": "int8", "inner_steps": 100, "overlap_steps": 10, "eager": True},
            {"compression": "int8", "inner_steps": 100, "overlap_steps": 10, "eager": False}]),
    ],
    "smoke": [
        ("stdlib-smoke", {"corpus": "stdlib", "split": "whole", "default_corpus_chars": 200_000, "n_layer": 1,
                          "n_embd": 32, "block_size": 32, "rounds": 2, "inner_steps": 5, "eval_batches": 2,
                          "warmup_steps": 2}, [{}, {"compression": "int4"}]),
        ("stdlib-smoke-steps", {"corpus": "stdlib", "split": "whole", "default_corpus_chars": 200_000, "n_layer": 2,
                                "n_embd": 32, "block_size": 32, "steps": 20, "inner_steps": 10, "eval_batches": 2,
                                "warmup_steps": 2},
         [{"compression": "int4", "inner_steps": 10, "fragments": 2, "overlap_steps": 1, "outer_decay": True,
           "warm_start_steps": 10}]),
    ],
}


def make_config(setting: dict, device: str, shakespeare: str | None, out: str) -> sim.SimulateConfig:
    setting = dict(setting)
    corpus = setting.pop("corpus")
    data = None
    if corpus == "shakespeare":
        if not shakespeare or not os.path.isfile(shakespeare):
            raise SystemExit("the plan needs tinyshakespeare: pass --shakespeare PATH (tinyshakespeare.txt, fetched from its public URL as nanoGPT does: docs/results.md, Setup)")
        data = [shakespeare]
    setting.setdefault("default_corpus_chars", 40_000_000)
    setting.pop("steps", None)
    return sim.SimulateConfig(**{**REFERENCE, **setting, "data": data, "device": device, "out": out, "plot": False,
                                 "quiet": True, "baseline": ["none"]})


def with_steps(cfg: sim.SimulateConfig, steps: int | None, **overrides) -> sim.SimulateConfig:
    """The run's config: `steps` inner steps in all (rounds = steps / K), ~20 evaluations a run."""
    cfg = replace(cfg, **overrides)
    if steps is None:
        return cfg
    rounds = steps // cfg.inner_steps
    return replace(cfg, rounds=rounds, eval_every=max(1, rounds // 20))


def plot(jsonl: str, out: str) -> None:
    """Gap to DDP against fewer bytes than DDP, one point per DiLoCo run, one colour per setting."""
    try:
        import matplotlib  # only the plot needs it (optional: coop[plot])
    except ModuleNotFoundError:
        raise SystemExit("the plot needs matplotlib: pip install 'coop[plot]'") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in open(jsonl, encoding="utf-8") if line.strip()]
    rows = [r for r in rows if r.get("impl") == "coop" and "fewer_bytes_than_ddp" in r]
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for setting in sorted({r["setting"] for r in rows}):
        points = [r for r in rows if r["setting"] == setting]
        ax.scatter([r["fewer_bytes_than_ddp"] for r in points], [r["gap_pct"] for r in points], label=setting)
        for r in points:
            label = f"K{r.get('inner_steps', 50)} {r['codec']}" + (f" P{r['fragments']}" if r.get("fragments") else "")
            ax.annotate(label, (r["fewer_bytes_than_ddp"], r["gap_pct"]), fontsize=6, xytext=(3, 2),
                        textcoords="offset points")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("fewer bytes sent per replica than DDP (log)")
    ax.set_ylabel("val loss above DDP at equal tokens (%)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", default="reference", choices=sorted(PLANS))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--shakespeare", help="path of tinyshakespeare.txt")
    ap.add_argument("--reference", help="path of torch_diloco_reference.py: run it too (needs torch and CUDA)")
    ap.add_argument("--out", default="runs/diloco_quality")
    ap.add_argument("--only", type=int, nargs="+", help="run only these runs of the plan (0-based indices)")
    ap.add_argument("--ddp-val-loss", type=float,
                    help="DDP's val loss from an earlier run of the same setting: skip the DDP and solo runs")
    ap.add_argument("--plot", nargs=2, metavar=("JSONL", "PNG"), help="train nothing: plot the lines of a sweep")
    args = ap.parse_args(argv)
    if args.plot:
        plot(*args.plot)
        return 0
    if args.reference:  # the PyTorch reference first: its lines arrive even if a coop run fails later
        env = dict(os.environ, SHAKESPEARE=args.shakespeare or "")
        for line in subprocess.run([sys.executable, args.reference], env=env, check=True, capture_output=True,
                                   text=True).stdout.splitlines():
            print(json.dumps({"impl": "torch_reference", **json.loads(line)}), flush=True)
    for name, setting, runs in PLANS[args.plan]:
        steps = setting.get("steps")
        cfg = make_config(setting, args.device, args.shakespeare, os.path.join(args.out, name))
        start = time.perf_counter()
        setup = sim.build_setup(replace(cfg, **({"eval_every": 10} if steps else {})))
        ddp_cfg = with_steps(setup.cfg, steps)
        if args.ddp_val_loss:
            ddp_loss, ddp_bytes = args.ddp_val_loss, ddp_cfg.total_rounds * ddp_cfg.inner_steps * setup.fp32_bytes
        else:
            ddp = sim.run_baseline(replace(setup, cfg=ddp_cfg), "ddp")
            ddp_loss, ddp_bytes = ddp.records[-1]["val_loss"], ddp.records[-1]["bytes_sent"]
            print(json.dumps({"impl": "coop", "setting": name, "run": "ddp", "val_loss": round(ddp_loss, 4),
                              "wall_s": round(time.perf_counter() - start, 1)}), flush=True)
        if steps and not args.ddp_val_loss:  # one replica alone for the same wall time (R x K steps at batch B)
            solo = sim.run_baseline(replace(setup, cfg=with_steps(setup.cfg, steps)), "solo")
            solo_loss = solo.records[-1]["val_loss"]
            print(json.dumps({"impl": "coop", "setting": name, "run": "solo", "val_loss": round(solo_loss, 4),
                              "gap_pct": round(100 * (solo_loss / ddp_loss - 1), 2)}), flush=True)
        for overrides in [r for i, r in enumerate(runs) if args.only is None or i in args.only]:
            overrides = dict(overrides)
            codec = overrides.pop("compression", "fp32")
            run_cfg = with_steps(setup.cfg, steps, **overrides)
            start = time.perf_counter()
            result = sim.run_diloco(replace(setup, cfg=run_cfg), codec)
            last = result.records[-1]
            print(json.dumps({"impl": "coop", "setting": name, "run": result.name, "codec": codec, **overrides,
                              "val_loss": round(last["val_loss"], 4), "ddp_val_loss": round(ddp_loss, 4),
                              "gap_pct": round(100 * (last["val_loss"] / ddp_loss - 1), 2),
                              "bytes_sent_per_replica": last["bytes_sent"],
                              "fewer_bytes_than_ddp": round(ddp_bytes / max(last["bytes_sent"], 1), 1),
                              "wall_s": round(time.perf_counter() - start, 1)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
