"""The classifier's cross-entropy on one GPU: the loss and the logits' gradient, the engine's kernel
against PyTorch's, same run, same shapes.

gpt2_124m's head: 16 x 1024 rows of GPT-2's padded vocabulary (50304), bf16 logits. The engine's
kernel (F.linear_cross_entropy's) writes the losses and overwrites the logits with
softmax - onehot(target); PyTorch's line is `F.cross_entropy(logits, targets, reduction="sum")` and its
backward on the same bf16 logits, eager and under torch.compile (its fused Triton kernels).
`gb_per_s` counts the logits read once and the gradient written once.

    python bench/cross_entropy.py            # one JSON line per (shape, implementation): us per call
"""
from __future__ import annotations

import argparse
import json

import numpy as np
from timing import seconds_per_call

SHAPES = {"gpt2_124m": (16 * 1024, 50304), "vocab_32000": (16 * 1024, 32000), "vocab_8192": (16 * 1024, 8192)}


def timed(call, sync, calls: int, warmup: int = 10) -> float:
    return seconds_per_call(call, calls, warmup, sync) * 1e6  # us


def bench_engine(N: int, V: int, calls: int) -> dict:
    import engine
    from engine.backends import cuda as gpu

    rng = np.random.default_rng(0)
    rows = (rng.standard_normal((256, V)) * 3).astype(np.float32)  # tiled: the timing does not depend on the values
    logits = engine.tensor(np.tile(rows, (N // 256, 1)), device="cuda").to(engine.bfloat16).data
    targets = gpu.from_numpy(rng.integers(0, V, N))
    # the kernel overwrites its logits with their gradient; the timing does not depend on the values
    return {"us": timed(lambda: gpu.cross_entropy_with_grad_(logits, targets, -100), engine.cuda.synchronize, calls)}


def bench_torch(N: int, V: int, calls: int) -> dict:
    import torch
    import torch.nn.functional as F

    logits = (torch.randn(N, V, device="cuda") * 3).to(torch.bfloat16).requires_grad_()
    targets = torch.randint(0, V, (N,), device="cuda")

    def loss_and_grad(fn):
        def call():
            logits.grad = None
            fn(logits, targets).backward()
        return call

    def loss(x, t):
        return F.cross_entropy(x, t, reduction="sum")

    return {"us": timed(loss_and_grad(loss), torch.cuda.synchronize, calls),
            "us_compile": timed(loss_and_grad(torch.compile(loss)), torch.cuda.synchronize, calls),
            "torch": torch.__version__}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--vocab", type=int, nargs="+", help="vocabulary sizes to time instead of the named shapes")
    args = ap.parse_args()
    if args.vocab and min(args.vocab) < 2:
        ap.error(f"--vocab: sizes of 2 and more, got {min(args.vocab)}")
    shapes = {f"vocab_{V}": (16 * 1024, V) for V in args.vocab} if args.vocab else SHAPES
    for name, (N, V) in shapes.items():
        gb = 2 * N * V * 2 / 1e9  # bf16 logits read, gradient written
        ours = bench_engine(N, V, args.calls)
        line = {"bench": "cross_entropy_with_grad", "config": name, "N": N, "V": V, "impl": "engine",
                "us": round(ours["us"], 1), "gb_per_s": round(gb / ours["us"] * 1e6)}
        if not args.no_torch:
            theirs = bench_torch(N, V, args.calls)
            best = min(theirs["us"], theirs["us_compile"])
            print(json.dumps({"bench": "cross_entropy_with_grad", "config": name, "N": N, "V": V, "impl": "torch",
                              "us": round(theirs["us"], 1), "us_compile": round(theirs["us_compile"], 1),
                              "torch": theirs["torch"]}), flush=True)
            line["vs_torch_best"] = round(best / ours["us"], 3)
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
