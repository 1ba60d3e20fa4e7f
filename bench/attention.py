"""The fused causal attention alone, forward and backward, bf16, on one GPU: engine's kernels next to
PyTorch's scaled_dot_product_attention (cuDNN and FlashAttention backends) from the same run.

Engine rows: the Hopper kernels (csrc/cuda/attention/attention_wgmma.cu, with the warp-specialised
attention_fwd_ws.cu and attention_bwd_ws.cu it chooses by shape) and the mma.sync kernels
(csrc/cuda/attention/attention_mma.cu) they replace; --forward-kernels / --backward-kernels add a
row for each Hopper kernel named (all of them without names). Prints one
JSON line per implementation: ms per call (mean over --iters after --warmup), TFLOP/s counting the
causal half of the (B, H, T, T) products, and the ratio to PyTorch's fastest backend (above 1 is
faster than PyTorch).

    python bench/attention.py                         # gpt2_124m's attention: B 16, H 12, T 1024, D 64
    python bench/attention.py --batch 64 --heads 6 --seq 256
    python bench/attention.py --heads 6 --head-dim 128          # the same width in heads of 128
    python bench/attention.py --forward-kernels --backward-kernels     # every Hopper kernel
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo's engine

import engine  # noqa: E402
from timing import seconds_per_call  # noqa: E402 (bench/)
from engine.backends import cuda as gpu  # noqa: E402


def _time(fn, iters: int, warmup: int, sync) -> float:
    return seconds_per_call(fn, iters, warmup, sync) * 1e3  # ms


def bench_engine(B, H, T, D, iters, warmup, wgmma: bool, forward_kernel: str | None = None,
                 backward_kernel: str | None = None) -> dict:
    rng = np.random.default_rng(0)
    q, k, v, g = (gpu.astype(gpu.from_numpy(rng.standard_normal((B, H, T, D)).astype(np.float32)), engine.bfloat16)
                  for _ in range(4))
    scale = D ** -0.5
    prev = gpu.attention_wgmma_forward(wgmma), gpu.attention_wgmma_backward(wgmma)
    prev_kernel = gpu.attention_wgmma_forward_kernel(gpu.FORWARD_KERNELS[forward_kernel]) if forward_kernel else None
    prev_bwd = gpu.attention_wgmma_backward_kernel(gpu.BACKWARD_KERNELS[backward_kernel]) if backward_kernel else None
    try:
        out, lse, _ = gpu.attention(q, k, v, True, scale)
        fwd = _time(lambda: gpu.attention(q, k, v, True, scale), iters, warmup, engine.cuda.synchronize)
        bwd = _time(lambda: gpu.attention_backward(g, q, k, v, out, lse, True, scale), iters, warmup,
                    engine.cuda.synchronize)
    finally:
        gpu.attention_wgmma_forward(prev[0])
        gpu.attention_wgmma_backward(prev[1])
        if prev_kernel is not None:
            gpu.attention_wgmma_forward_kernel(prev_kernel)
        if prev_bwd is not None:
            gpu.attention_wgmma_backward_kernel(prev_bwd)
    name = "engine wgmma" if wgmma else "engine mma.sync"
    if forward_kernel:
        name += f" (forward {forward_kernel})"
    if backward_kernel:
        name += f" (backward {backward_kernel})"
    row = {"impl": name, "fwd_ms": round(fwd, 4), "bwd_ms": round(bwd, 4)}
    if not wgmma and D == 128:
        row["bwd_kernel"] = "wmma"  # mma.sync has no backward at head dim 128
    return row


def bench_torch(B, H, T, D, iters, warmup, backend_name: str) -> dict | None:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as TF

    backend = getattr(SDPBackend, backend_name)
    q, k, v, g = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    try:
        with sdpa_kernel(backend):
            out = TF.scaled_dot_product_attention(q, k, v, is_causal=True)
            fwd = _time(lambda: TF.scaled_dot_product_attention(q, k, v, is_causal=True), iters, warmup,
                        torch.cuda.synchronize)
            bwd = _time(lambda: torch.autograd.grad(out, (q, k, v), g, retain_graph=True), iters, warmup,
                        torch.cuda.synchronize)
    except RuntimeError as e:  # that backend does not take these inputs on this GPU
        print(f"torch {backend_name}: not available ({str(e).splitlines()[0]})", file=sys.stderr)
        return None
    return {"impl": f"torch sdpa {backend_name.lower()}", "fwd_ms": round(fwd, 4), "bwd_ms": round(bwd, 4)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--no-torch", action="store_true", help="skip PyTorch's rows")
    ap.add_argument("--forward-kernels", nargs="*", default=None, metavar="NAME",
                    help="also time these Hopper forward kernels (names of engine.backends.cuda.FORWARD_KERNELS; "
                         "no names: all of them)")
    ap.add_argument("--backward-kernels", nargs="*", default=None, metavar="NAME",
                    help="also time these Hopper backward kernels (names of engine.backends.cuda.BACKWARD_KERNELS; "
                         "no names: all of them)")
    args = ap.parse_args(argv)
    if not engine.cuda.is_available():
        print(f"needs a GPU: {engine.cuda.unavailable_reason()}", file=sys.stderr)
        return 1
    B, H, T, D = args.batch, args.heads, args.seq, args.head_dim
    flops_fwd = 4 * B * H * T * T * D / 2  # S = Q K^T and P V over the causal half
    rows = []
    for wgmma in (True, False) if gpu.attention_wgmma_built() else (False,):
        rows.append(bench_engine(B, H, T, D, args.iters, args.warmup, wgmma))
    if args.forward_kernels is not None and gpu.attention_wgmma_built():
        for name in args.forward_kernels or gpu.FORWARD_KERNELS:
            rows.append(bench_engine(B, H, T, D, args.iters, args.warmup, True, name))
    if args.backward_kernels is not None and gpu.attention_wgmma_built():
        for name in args.backward_kernels or gpu.BACKWARD_KERNELS:
            rows.append(bench_engine(B, H, T, D, args.iters, args.warmup, True, backward_kernel=name))
    if not args.no_torch:
        try:
            import torch  # noqa: F401
        except ImportError:
            print("torch is not importable: PyTorch rows skipped", file=sys.stderr)
        else:
            for backend in ("CUDNN_ATTENTION", "FLASH_ATTENTION"):
                row = bench_torch(B, H, T, D, args.iters, args.warmup, backend)
                if row is not None:
                    rows.append(row)
    torch_rows = [r for r in rows if r["impl"].startswith("torch")]
    best_fwd = min((r["fwd_ms"] for r in torch_rows), default=None)
    best_bwd = min((r["bwd_ms"] for r in torch_rows), default=None)
    for r in rows:
        r.update(shape=[B, H, T, D], fwd_tflops=round(flops_fwd / r["fwd_ms"] / 1e9, 1),
                 bwd_tflops=round(2.5 * flops_fwd / r["bwd_ms"] / 1e9, 1))
        if best_fwd:
            r["fwd_vs_torch"] = round(best_fwd / r["fwd_ms"], 3)
            r["bwd_vs_torch"] = round(best_bwd / r["bwd_ms"], 3)
        print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
