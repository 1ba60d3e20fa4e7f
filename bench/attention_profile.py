"""One causal attention backward (or, with --direction forward, forward) of the engine (the kernel it chooses
by shape, or --backward-kernel) and one of PyTorch's cuDNN backend, bf16, between cudaProfilerStart and
cudaProfilerStop, for Nsight Compute to compare the kernels side by side (docs/performance.md, "Tenth session"):

    ncu --profile-from-start off --clock-control none --section SpeedOfLight --section WarpStateStats \\
        --section SchedulerStats --section LaunchStats --section MemoryWorkloadAnalysis \\
        --csv --page details python bench/attention_profile.py > ncu.csv

Both run twice first (kernel choice, cuDNN's plan, PyTorch's gradient buffers), so only the
pass's own kernels fall in the profiled range.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo's engine

import engine  # noqa: E402
from engine.backends import cuda as gpu  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--backward-kernel", default="by shape", choices=list(gpu.BACKWARD_KERNELS), metavar="NAME",
                    help="the engine's Hopper backward kernel (a name of engine.backends.cuda.BACKWARD_KERNELS)")
    ap.add_argument("--forward-kernel", default="by shape", choices=list(gpu.FORWARD_KERNELS), metavar="NAME",
                    help="the engine's Hopper forward kernel (a name of engine.backends.cuda.FORWARD_KERNELS)")
    ap.add_argument("--direction", default="backward", choices=("forward", "backward"))
    args = ap.parse_args(argv)
    if not engine.cuda.is_available():
        print(f"needs a GPU: {engine.cuda.unavailable_reason()}", file=sys.stderr)
        return 1
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        print(f"needs PyTorch with CUDA for cuDNN's side ({e})", file=sys.stderr)
        return 1

    B, H, T, D = args.batch, args.heads, args.seq, args.head_dim
    previous = gpu.attention_wgmma_backward_kernel(gpu.BACKWARD_KERNELS[args.backward_kernel])
    previous_forward = gpu.attention_wgmma_forward_kernel(gpu.FORWARD_KERNELS[args.forward_kernel])
    scale = D ** -0.5
    rng = np.random.default_rng(0)
    q, k, v, g = (gpu.astype(gpu.from_numpy(rng.standard_normal((B, H, T, D)).astype(np.float32)), engine.bfloat16)
                  for _ in range(4))
    out, lse, _ = gpu.attention(q, k, v, True, scale)
    tq, tk, tv = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    tg = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        for _ in range(2):
            gpu.attention_backward(g, q, k, v, out, lse, True, scale)
            F.scaled_dot_product_attention(tq, tk, tv, is_causal=True).backward(tg)
        o = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
        for t in (tq, tk, tv):
            t.grad = None  # no gradient accumulation kernels in the range
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        if args.direction == "forward":
            gpu.attention(q, k, v, True, scale)
            torch.cuda.synchronize()
            F.scaled_dot_product_attention(tq, tk, tv, is_causal=True)  # with its lse, for a backward
        else:
            gpu.attention_backward(g, q, k, v, out, lse, True, scale)
            torch.cuda.synchronize()
            o.backward(tg)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    gpu.attention_wgmma_backward_kernel(previous)
    gpu.attention_wgmma_forward_kernel(previous_forward)
    kernel = args.forward_kernel if args.direction == "forward" else args.backward_kernel
    print(f"profiled one {args.direction} each: B {B} H {H} T {T} D {D}, causal, bf16 (engine: {kernel})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
