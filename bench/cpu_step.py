"""CPU training-step time of a small GPT: engine's CPU backend next to PyTorch CPU, same run.

Prints one JSON line per framework and one with the ratio (engine ms / torch ms; lower is better).
    python bench/cpu_step.py [--steps 10] [--threads N]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

CONFIG = dict(V=65, T=128, L=4, H=4, D=128, B=16)


def time_steps(step, steps: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return times


def engine_step_times(steps: int, warmup: int) -> tuple[list[float], int]:
    import engine
    from engine.nn import GPT, GPTConfig

    c = CONFIG
    engine.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=c["V"], block_size=c["T"], n_layer=c["L"], n_head=c["H"], n_embd=c["D"]))
    opt = engine.optim.AdamW(model.parameters(), lr=3e-4)
    rng = np.random.default_rng(0)
    x = engine.tensor(rng.integers(0, c["V"], (c["B"], c["T"])))
    y = engine.tensor(rng.integers(0, c["V"], (c["B"], c["T"])))

    def step():
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()

    return time_steps(step, steps, warmup), model.num_parameters()


def torch_step_times(steps: int, warmup: int) -> list[float] | None:
    try:
        import torch
    except ImportError:
        return None
    sys.path.insert(0, os.path.dirname(__file__))
    from torch_gpt import TorchGPT

    c = CONFIG
    torch.manual_seed(0)
    model = TorchGPT(c["V"], c["T"], c["L"], c["H"], c["D"])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    x = torch.randint(0, c["V"], (c["B"], c["T"]))
    y = torch.randint(0, c["V"], (c["B"], c["T"]))

    def step():
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return time_steps(step, steps, warmup)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args()
    tokens = CONFIG["B"] * CONFIG["T"]
    ours, n_params = engine_step_times(args.steps, args.warmup)
    rows = [dict(framework="engine-cpu", params=n_params, **_stats(ours, tokens))]
    theirs = torch_step_times(args.steps, args.warmup)
    if theirs is not None:
        import torch

        rows.append(dict(framework=f"torch-{torch.__version__}-cpu", threads=torch.get_num_threads(), **_stats(theirs, tokens)))
    for r in rows:
        print(json.dumps({"bench": "cpu_step", "config": CONFIG, **r}), flush=True)
    if theirs is not None:
        ratio = statistics.median(ours) / statistics.median(theirs)
        print(json.dumps({"bench": "cpu_step", "ratio_engine_over_torch_median_ms": round(ratio, 3),
                          "target": "<= 2.0"}), flush=True)


def _stats(times: list[float], tokens: int) -> dict:
    med = statistics.median(times)
    return dict(median_ms=round(med * 1e3, 2), best_ms=round(min(times) * 1e3, 2), tokens_per_s=round(tokens / med))


if __name__ == "__main__":
    main()
