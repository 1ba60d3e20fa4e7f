"""A GPT training step replayed as one CUDA graph (engine.cuda.graphs.CapturedStep) against the same
step run op by op from Python, on one GPU.

Prints one JSON line per (config, mode): ms/step, tokens/s, host ms/step (how long Python took to
queue a step; with capture it is the replay call), then one line per config with the speedups.
The step is bench/gpt_step.py's (forward, backward, AdamW, zero_grad) plus clip_grad_norm_(1.0)
and an lr that changes every step (so the graph is shown to follow a schedule). Modes: eager
fp32, graph fp32, and where engine.autocast exists eager bf16 and graph bf16; PyTorch eager fp32
from the same run as the reference (--no-torch skips it).

    python bench/graph_step.py                          # shakespeare_char, 30 steps after 8 warm-up
    python bench/graph_step.py --configs shakespeare_char gpt2_124m --steps 20

How to call the API from another bench: wrap the step function, call it with the batch:
    step = engine.cuda.graphs.CapturedStep(step_fn)     # step_fn(idx, tgt) -> loss
    loss = step(idx, tgt)                               # warm-up (2 eager calls), capture, replays
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo's engine
from gpt_step import CONFIGS, bench_torch  # noqa: E402  (same configs and PyTorch reference)


def bench_mode(name: str, graph: bool, bf16: bool, steps: int, warmup: int, dropout: float) -> dict:
    import numpy as np

    import engine
    from engine.nn import GPT, GPTConfig
    from engine.optim import AdamW, clip_grad_norm_

    c = CONFIGS[name]
    engine.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=c["V"], block_size=c["T"], n_layer=c["L"], n_head=c["H"], n_embd=c["D"],
                          dropout=dropout, bias=True)).to("cuda")
    opt = AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    rng = np.random.default_rng(0)
    idx = engine.tensor(rng.integers(0, c["V"], (c["B"], c["T"])), device="cuda")
    tgt = engine.tensor(rng.integers(0, c["V"], (c["B"], c["T"])), device="cuda")

    def step_fn(x, y):
        if bf16:
            with engine.autocast("cuda", dtype=engine.bfloat16):
                _, loss = model(x, y)
        else:
            _, loss = model(x, y)
        loss.backward()
        clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    step = engine.cuda.graphs.CapturedStep(step_fn) if graph else step_fn
    i = 0

    def run():
        nonlocal i
        for g in opt.param_groups:
            g["lr"] = 3e-4 * (1.0 - 0.5 * i / (warmup + steps))  # moves every step
        i += 1
        return step(idx, tgt)

    for _ in range(warmup):
        loss = run()
    first_loss = float(loss.numpy())
    engine.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = run()
    t_host = time.perf_counter()
    engine.cuda.synchronize()
    dt = (time.perf_counter() - t0) / steps
    out = dict(config=name, impl="engine", mode=("bf16" if bf16 else "fp32_tf32") + ("+graph" if graph else ""),
               dropout=dropout, ms_per_step=round(dt * 1e3, 3), host_ms_per_step=round((t_host - t0) / steps * 1e3, 3),
               tokens_per_s=round(c["B"] * c["T"] / dt), loss_after_warmup=round(first_loss, 4),
               loss=round(float(loss.numpy()), 4))
    if graph:
        out["captured"] = step.captured
        if not step.captured:
            out["fallback_reason"] = step.fallback_reason
        else:
            out["pool_mb"] = round(step.memory_stats()["reserved"] / 2**20, 1)
            out["mallocs_in_capture"] = step.memory_stats()["mallocs_in_capture"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=["shakespeare_char"], choices=list(CONFIGS))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args(argv)

    import engine

    if not engine.cuda.is_available():
        print(json.dumps(dict(error=f"no GPU: {engine.cuda.unavailable_reason()}")), flush=True)
        return 1
    modes = [(False, False), (True, False)]
    if hasattr(engine, "autocast"):
        modes += [(False, True), (True, True)]
    for name in args.configs:
        results = {}
        for graph, bf16 in modes:
            try:
                r = bench_mode(name, graph, bf16, args.steps, args.warmup, args.dropout)
            except Exception as e:  # one mode failing should not hide the others
                r = dict(config=name, mode=("bf16" if bf16 else "fp32") + ("+graph" if graph else ""),
                         error=repr(e)[:400])
            print(json.dumps(r), flush=True)
            results[r["mode"]] = r
            engine.cuda.empty_cache()
        ref = None
        if not args.no_torch:
            try:
                import torch

                if torch.cuda.is_available():
                    ref = bench_torch(name, args.steps, args.warmup)
                    print(json.dumps(ref), flush=True)
            except Exception as e:
                print(json.dumps(dict(config=name, impl="torch", error=repr(e)[:300])), flush=True)
        summary = dict(config=name)
        for a, b in (("fp32_tf32", "fp32_tf32+graph"), ("bf16", "bf16+graph")):
            if "ms_per_step" in results.get(a, {}) and "ms_per_step" in results.get(b, {}):
                summary[f"speedup_{b}_over_{a}"] = round(results[a]["ms_per_step"] / results[b]["ms_per_step"], 3)
        if ref and "ms_per_step" in ref:
            for mode, r in results.items():
                if "ms_per_step" in r and math.isfinite(r["ms_per_step"]):
                    summary[f"ratio_{mode}_over_torch_eager_fp32"] = round(r["ms_per_step"] / ref["ms_per_step"], 3)
        print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
