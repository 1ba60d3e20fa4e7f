"""The bf16 loss curve of gpt2_124m against float32's, over the same steps on the same data, on one GPU.

Trains the reference gpt2_124m configuration (bench/gpt_step.py's: 12 layers, width 768, vocabulary
50304, B 16 x T 1024) for --steps steps of AdamW (lr 6e-4 after 20 warm-up steps, weight decay 0.1,
gradients clipped at 1.0) on the bytes of a text file, in each --modes mode (fp32: TF32 matmuls;
bf16: engine.autocast; bf16_graph: autocast with the step replayed as one CUDA graph; fp8, fp8_graph:
the same with the linear layers' forward and dx GEMMs in FP8, engine.fp8) for each
--seeds seed (the weights' initialisation; the batches are the same for every run). Prints one
JSON line per run with its losses, then one summary line: the largest gap between each mode's curve
and float32's of the same seed (and, with FP8 modes, between each FP8 mode's and bf16's), next to the
gap between float32's curves of two seeds (the noise), all on curves smoothed over 10 steps, over all
steps and after step 50. `--summarize FILE` prints that line again from a run's saved lines.

    python bench/precision_curve.py --data ../shared/data/tinyshakespeare.txt
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo's engine

import engine  # noqa: E402
import engine.fp8  # noqa: E402
from engine.nn import GPT, GPTConfig  # noqa: E402

B, T = 16, 1024
WARMUP, LR, SMOOTH = 20, 6e-4, 10
AFTER = 50  # the summary's second gap starts here, past the warm-up's spikes


def batches(data: np.ndarray, steps: int, seed: int = 1234) -> list[tuple[np.ndarray, np.ndarray]]:
    """`steps` (x, y) pairs of B windows of T + 1 bytes, the same for every run."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        starts = rng.integers(0, len(data) - T - 1, B)
        w = np.stack([data[s:s + T + 1] for s in starts]).astype(np.int64)
        out.append((w[:, :-1], w[:, 1:]))
    return out


def run(mode: str, seed: int, data: list) -> tuple[list[float], bool]:
    """The losses of every step, and whether the step ran as a captured graph."""
    engine.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=50304, block_size=T, n_layer=12, n_head=12, n_embd=768, dropout=0.0,
                          bias=True)).to("cuda")
    if mode.startswith("fp8"):
        engine.fp8.enable(model)
    opt = engine.optim.AdamW(model.optimizer_groups(0.1), lr=LR, betas=(0.9, 0.95))

    def step_fn(x, y):
        with engine.autocast("cuda", dtype=engine.bfloat16, enabled=mode != "fp32"):
            _, loss = model(x, y)
        loss.backward()
        engine.optim.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    step = engine.cuda.graphs.CapturedStep(step_fn) if mode.endswith("_graph") else step_fn
    losses = []
    for i, (xb, yb) in enumerate(data):
        for group in opt.param_groups:
            group["lr"] = LR * min(1.0, (i + 1) / WARMUP)
        losses.append(step(engine.tensor(xb, device="cuda"), engine.tensor(yb, device="cuda")))
    captured = getattr(step, "captured", False)
    return [round(float(loss.item()), 4) for loss in losses], captured


def smooth(curve: list[float]) -> np.ndarray:
    c = np.asarray(curve)
    return np.convolve(c, np.ones(SMOOTH) / SMOOTH, mode="valid")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="a text file; its bytes are the tokens")
    ap.add_argument("--summarize", metavar="JSONL", help="only print the summary of a saved run's lines")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--modes", nargs="+", default=["fp32", "bf16_graph"],
                    choices=["fp32", "bf16", "bf16_graph", "fp8", "fp8_graph"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    args = ap.parse_args(argv)
    if args.summarize:
        return summarize_file(args.summarize)
    if not args.data:
        ap.error("--data is required (or --summarize a saved run)")
    if not engine.cuda.is_available():
        print(f"needs a GPU: {engine.cuda.unavailable_reason()}", file=sys.stderr)
        return 1
    data = np.frombuffer(open(args.data, "rb").read(), dtype=np.uint8)
    if len(data) < 2 * (T + 1):
        print(f"{args.data}: {len(data)} bytes, too short for windows of {T + 1}", file=sys.stderr)
        return 1
    windows = batches(data, args.steps)
    curves = {}
    for mode in args.modes:
        for seed in args.seeds:
            curves[mode, seed], captured = run(mode, seed, windows)
            c = curves[mode, seed]
            print(json.dumps(dict(bench="precision_curve", mode=mode, seed=seed, steps=args.steps, captured=captured,
                                  last_10_mean=round(float(np.mean(c[-10:])), 4), losses=c)), flush=True)
    print(json.dumps(summarize(curves, args.modes, args.seeds, args.steps)), flush=True)
    return 0


def summarize(curves: dict, modes: list, seeds: list, steps: int) -> dict:
    """The summary line: for each pair compared, the largest gap between the smoothed curves, over all
    steps and after the first AFTER steps (past the warm-up's loss spikes, whose height and step vary
    from run to run)."""
    summary = dict(bench="precision_curve_summary", steps=steps, smoothed_over=SMOOTH, after_step=AFTER)

    def gap(mode_a, mode_b, name, pairs):
        d = [np.abs(smooth(curves[mode_a, sa]) - smooth(curves[mode_b, sb])) for sa, sb in pairs]
        summary[f"{name}_gap_max"] = round(float(max(x.max() for x in d)), 4)
        summary[f"{name}_gap_max_after"] = round(float(max(x[AFTER:].max() for x in d)), 4)

    if "fp32" in modes and len(seeds) > 1:
        gap("fp32", "fp32", "fp32_seed", [(seeds[0], seeds[1])])
    for mode in modes:
        if mode != "fp32" and "fp32" in modes:
            gap(mode, "fp32", f"{mode}_vs_fp32", [(s, s) for s in seeds])
    bf16 = next((m for m in ("bf16_graph", "bf16") if m in modes), None)
    for mode in modes:
        if mode.startswith("fp8") and bf16 is not None:
            gap(mode, bf16, f"{mode}_vs_{bf16}", [(s, s) for s in seeds])
    return summary


def summarize_file(path: str) -> int:
    """The summary line again, from a run's saved JSON lines (--summarize)."""
    rows = [json.loads(line) for line in open(path) if '"bench": "precision_curve"' in line]
    curves = {(r["mode"], r["seed"]): r["losses"] for r in rows}
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    seeds = list(dict.fromkeys(r["seed"] for r in rows))
    print(json.dumps(summarize(curves, modes, seeds, rows[0]["steps"])), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
