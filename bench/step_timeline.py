"""Where a GPT training step's GPU time goes between kernels: the idle gaps of the timeline.

Runs bench/gpt_step.py's step (bf16 autocast; with --graph replayed as one CUDA graph) and records 3
steps with torch.profiler (its CUDA activity sees engine's kernels, memsets and copies, those replayed
from a graph included). Prints one JSON line: the span of the steps, the sum of the kernels' times, the
idle time between them (the gaps), the gaps by what precedes and follows them (engine's kernels,
cuBLASLt's, memsets, copies), the largest gaps and the kernels by time with the gap before each. A
kernel-time profile (gpt_step.py --profile) cannot show this: the gaps are no kernel's time.

    python bench/step_timeline.py --config gpt2_124m --graph
    python bench/step_timeline.py --config shakespeare_char
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo's engine
from gpt_step import CONFIGS, engine_step  # noqa: E402


def kind(name: str) -> str:
    """Which library an event of the trace belongs to."""
    n = name.lower()
    if "nvjet" in n or "cublas" in n or "splitk" in n or n.startswith(("sm90_", "sm80_")):
        return "cublas"
    if "memset" in n:
        return "memset"
    if "memcpy" in n:
        return "memcpy"
    return "engine"


def timeline(events: list[dict], steps: int, top: int = 25) -> dict:
    """events: the trace's GPU events (name, ts, dur in us), in any order -> the summary (per step)."""
    ks = sorted(events, key=lambda e: e["ts"])
    starts = np.array([e["ts"] for e in ks], dtype=np.float64)
    ends = starts + np.array([e["dur"] for e in ks], dtype=np.float64)
    gaps = starts[1:] - np.maximum.accumulate(ends)[:-1]  # < 0 where an event overlaps the previous ones
    by_pair: dict = {}
    for i, g in enumerate(gaps):
        s = by_pair.setdefault(f"{kind(ks[i]['name'])} -> {kind(ks[i + 1]['name'])}", [0, 0.0])
        s[0] += 1
        s[1] += max(g, 0.0)
    per_kernel: dict = {}
    for i, e in enumerate(ks):
        s = per_kernel.setdefault(e["name"][:100], [0, 0.0, 0.0])
        s[0] += 1
        s[1] += e["dur"]
        s[2] += max(gaps[i - 1], 0.0) if i > 0 else 0.0
    order = np.argsort(-gaps)[:top]
    return dict(
        events_per_step=round(len(ks) / steps, 1),
        span_ms_per_step=round(float(ends.max() - starts.min()) / steps / 1e3, 3),
        kernel_ms_per_step=round(float(sum(e["dur"] for e in ks)) / steps / 1e3, 3),
        gap_ms_per_step=round(float(gaps[gaps > 0].sum()) / steps / 1e3, 3),
        gap_us_p50_p90_p99=[round(float(np.percentile(gaps, q)), 2) for q in (50, 90, 99)],
        gaps_by_neighbours=sorted(({"pair": k, "per_step": round(n / steps, 1), "us_per_step": round(g / steps, 1),
                                    "mean_us": round(g / n, 2)} for k, (n, g) in by_pair.items()),
                                  key=lambda r: -r["us_per_step"]),
        largest_gaps=[{"us": round(float(gaps[i]), 2), "after": ks[i]["name"][:80], "before": ks[i + 1]["name"][:80]}
                      for i in order],
        kernels=[{"kernel": k, "per_step": round(n / steps, 1), "us_per_step": round(d / steps, 1),
                  "gap_before_us_per_step": round(g / steps, 1)}
                 for k, (n, d, g) in sorted(per_kernel.items(), key=lambda kv: -kv[1][1])[:top * 2]],
    )


def record(config: str, graph: bool, steps: int = 3, warmup: int = 6) -> list[dict]:
    """The GPU events of `steps` training steps of `config` (after `warmup`), from torch.profiler."""
    import torch  # noqa: F401 - the profiler
    from torch.profiler import ProfilerActivity, profile

    import engine

    step_fn, idx, tgt, _ = engine_step(CONFIGS[config], "bf16")
    captured = engine.cuda.graphs.CapturedStep(step_fn) if graph else None
    for _ in range(warmup):
        captured(idx, tgt) if captured is not None else step_fn(idx, tgt)
    engine.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            captured(idx, tgt) if captured is not None else step_fn(idx, tgt)
        engine.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)["traceEvents"]
    return [e for e in trace if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy") and "dur" in e]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="gpt2_124m", choices=list(CONFIGS))
    ap.add_argument("--graph", action="store_true", help="replay the step as one CUDA graph (CapturedStep)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=25, help="how many of the largest gaps to list (kernels: twice)")
    args = ap.parse_args(argv)
    out = timeline(record(args.config, args.graph, args.steps), args.steps, args.top)
    print(json.dumps(dict(bench="step_timeline", config=args.config, mode="bf16_graph" if args.graph else "bf16",
                          **out)))


if __name__ == "__main__":
    main()
