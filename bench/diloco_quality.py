"""DiLoCo against synchronous data parallel at equal tokens: a sweep of `coop simulate` settings.

Prints one JSON line per run: the setting, DiLoCo's final val loss, the DDP baseline's on the same
setup (same data, init, eval windows), the gap in percent, and bytes sent per replica against
DDP's. The defaults are the settings of `../shared/bench/torch_diloco_reference.py` (4 replicas x
batch 16, K = 50, 2000 inner steps, AdamW 1e-3 -> 1e-4 with 100 warm-up steps and beta2 0.99,
outer Nesterov 0.7 / 0.9, a 3.2M GPT of 4 layers, width 256, block 128), so `--reference PATH`
runs that PyTorch script in the same call and prints its lines too.

    python bench/diloco_quality.py --device cuda --shakespeare data/tinyshakespeare.txt \\
        --reference ../shared/bench/torch_diloco_reference.py
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
    "smoke": [
        ("stdlib-smoke", {"corpus": "stdlib", "split": "whole", "default_corpus_chars": 200_000, "n_layer": 1,
                          "n_embd": 32, "block_size": 32, "rounds": 2, "inner_steps": 5, "eval_batches": 2,
                          "warmup_steps": 2}, [{}, {"compression": "int4"}]),
    ],
}


def make_config(setting: dict, device: str, shakespeare: str | None, out: str) -> sim.SimulateConfig:
    setting = dict(setting)
    corpus = setting.pop("corpus")
    data = None
    if corpus == "shakespeare":
        if not shakespeare or not os.path.isfile(shakespeare):
            raise SystemExit("the plan needs tinyshakespeare: pass --shakespeare PATH (../shared/data/tinyshakespeare.txt)")
        data = [shakespeare]
    setting.setdefault("default_corpus_chars", 40_000_000)
    return sim.SimulateConfig(**{**REFERENCE, **setting, "data": data, "device": device, "out": out, "plot": False,
                                 "quiet": True, "baseline": ["none"]})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", default="reference", choices=sorted(PLANS))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--shakespeare", help="path of tinyshakespeare.txt")
    ap.add_argument("--reference", help="path of torch_diloco_reference.py: run it too (needs torch and CUDA)")
    ap.add_argument("--out", default="runs/diloco_quality")
    args = ap.parse_args(argv)
    if args.reference:  # the PyTorch reference first: its lines arrive even if a coop run fails later
        env = dict(os.environ, SHAKESPEARE=args.shakespeare or "")
        for line in subprocess.run([sys.executable, args.reference], env=env, check=True, capture_output=True,
                                   text=True).stdout.splitlines():
            print(json.dumps({"impl": "torch_reference", **json.loads(line)}), flush=True)
    for name, setting, runs in PLANS[args.plan]:
        cfg = make_config(setting, args.device, args.shakespeare, os.path.join(args.out, name))
        start = time.perf_counter()
        setup = sim.build_setup(cfg)
        ddp = sim.run_baseline(setup, "ddp")
        ddp_loss, ddp_bytes = ddp.records[-1]["val_loss"], ddp.records[-1]["bytes_sent"]
        print(json.dumps({"impl": "coop", "setting": name, "run": "ddp", "val_loss": round(ddp_loss, 4),
                          "wall_s": round(time.perf_counter() - start, 1)}), flush=True)
        for overrides in runs:
            overrides = dict(overrides)
            codec = overrides.pop("compression", "fp32")
            run_cfg = replace(cfg, **overrides)
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
