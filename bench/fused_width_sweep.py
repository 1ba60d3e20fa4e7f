"""Where the fused backward ops start to pay: a GPT training step with and without each, by width.

engine/nn/transformer.py runs F.projected_self_attention (the attention projection's bias gradient
from the attention's backward) and F.mlp (the GELU's backward in c_proj's dx GEMM) from the widths
FUSED_ATTENTION_MIN_WIDTH and FUSED_MLP_MIN_WIDTH. This times bench/gpt_step.py's step (bf16 autocast,
replayed as one CUDA graph) at each --widths width (n_head = width / 64) in four variants, in turn,
--rounds times: neither op, the attention's, the MLP's, both. Prints one JSON line per run, then one
line per width with each variant's best time and its ratio to neither.

    python bench/fused_width_sweep.py                                  # widths 384 512 640 768, T 1024
    python bench/fused_width_sweep.py --widths 384 768 --seq 256 --batch 64 --layers 6
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo's engine
from gpt_step import engine_step  # noqa: E402  (the bench's step)

VARIANTS = {"neither": (False, False), "attention": (True, False), "mlp": (False, True), "both": (True, True)}


def time_step(width: int, variant: str, args, device: str = "cuda") -> float:
    """ms per step of a GPT of `width` with the variant's fused ops switched on, the others off."""
    import engine
    from engine.nn import transformer

    attention, mlp = VARIANTS[variant]
    off = 1 << 30
    transformer.FUSED_ATTENTION_MIN_WIDTH = 0 if attention else off
    transformer.FUSED_MLP_MIN_WIDTH = 0 if mlp else off
    c = dict(V=args.vocab, T=args.seq, L=args.layers, H=max(1, width // 64), D=width, B=args.batch)
    step_fn, idx, tgt, _ = engine_step(c, "bf16", device)
    step = engine.cuda.graphs.CapturedStep(step_fn) if device == "cuda" else step_fn
    for _ in range(args.warmup):
        step(idx, tgt)
    sync = engine.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step(idx, tgt)
    float(loss.numpy())
    sync()
    return (time.perf_counter() - t0) / args.steps * 1e3


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--widths", type=int, nargs="+", default=[384, 512, 640, 768])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2, help="times each variant runs, in turn with the others")
    ap.add_argument("--device", default="cuda", help="cuda (the measurement), or cpu for a smoke run")
    args = ap.parse_args(argv)
    for width in args.widths:
        best = {}
        for r in range(args.rounds):
            for variant in VARIANTS:
                ms = time_step(width, variant, args, args.device)
                best[variant] = min(best.get(variant, ms), ms)
                print(json.dumps(dict(bench="fused_width_sweep", width=width, variant=variant, round=r,
                                      ms_per_step=round(ms, 3))), flush=True)
        print(json.dumps(dict(bench="fused_width_sweep_summary", width=width, layers=args.layers, seq=args.seq,
                              batch=args.batch, best_ms={k: round(v, 3) for k, v in best.items()},
                              ratio_to_neither={k: round(v / best["neither"], 4) for k, v in best.items()})),
              flush=True)


if __name__ == "__main__":
    main()
