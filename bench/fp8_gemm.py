"""The GEMMs of one gpt2_124m training step in bf16 (engine, PyTorch) and in FP8 (engine, PyTorch), on one GPU.

What FP8 takes off the step's GEMMs, and what its casts cost: every linear layer's
three GEMMs (forward y = x W^T, dx = dy W, dW = dy^T x) at the step's shapes (16384 tokens; the
attention's qkv and output projections, the MLP's two layers, the head), each timed alone:

- engine bf16: `engine.backends.cuda.matmul` (cuBLASLt, the layouts the step uses);
- torch bf16: `torch.matmul` on the same layouts;
- torch FP8: `torch._scaled_mm` with E4M3 operands (E5M2 for the output gradient in dx and dW, as
  FP8 training recipes do), per-tensor scales, bf16 out. Hopper's FP8 GEMM takes both operands
  K-major, so the operands are laid out that way beforehand; the casts (and transposes) a step
  would add are timed separately, per tensor, in the `cast` lines;
- engine FP8: `engine.backends.cuda.fp8.matmul_fp8` (cuBLASLt, the GEMM of engine.fp8's layers) on
  the same formats and layouts, fast accumulation in the forward only; its `cast` lines time
  engine.fp8's casts of x, dy and the weight (with its transposed copy), delayed scaling.

One JSON line per (layer, GEMM) with the three times, then a summary line for the whole step (12
layers of four linear layers and the head).

    python bench/fp8_gemm.py
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo's engine

from timing import seconds_per_call  # noqa: E402 (bench/)

N_TOKENS, C, LAYERS, V = 16 * 1024, 768, 12, 50304
# (name, in features, out features, count per step)
LINEARS = [("attn.qkv", C, 3 * C, LAYERS), ("attn.proj", C, C, LAYERS), ("mlp.fc", C, 4 * C, LAYERS),
           ("mlp.proj", 4 * C, C, LAYERS), ("head", C, V, 1)]


def gemms(i: int, o: int):
    """(name, M, N, K, A transposed, B transposed) of a linear layer's three GEMMs: y (N, o) = x W^T,
    dx (N, i) = dy W, dW (o, i) = dy^T x, as (M, K) @ (K, N) with the flags the step uses."""
    return [("fwd", N_TOKENS, o, i, False, True), ("dgrad", N_TOKENS, i, o, False, False),
            ("wgrad", o, i, N_TOKENS, True, False)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args(argv)
    import numpy as np
    import torch

    import engine
    from engine.backends import cuda as gpu

    if not torch.cuda.is_available() or not engine.cuda.is_available():
        print("needs a GPU with both engine's CUDA backend and torch", file=sys.stderr)
        return 1
    e4, e5 = torch.float8_e4m3fn, torch.float8_e5m2
    one = torch.ones((), device="cuda")
    rng = np.random.default_rng(0)
    totals = {"engine_bf16": 0.0, "torch_bf16": 0.0, "torch_fp8": 0.0, "engine_fp8": 0.0, "fp8_casts": 0.0,
              "engine_fp8_casts": 0.0}

    def t(fn, sync):
        return seconds_per_call(fn, args.iters, args.warmup, sync) * 1e3  # ms

    for name, i, o, count in LINEARS:
        for kind, M, Nn, K, ta, tb in gemms(i, o):
            a_shape = (K, M) if ta else (M, K)
            b_shape = (Nn, K) if tb else (K, Nn)
            ea, eb = (gpu.astype(gpu.from_numpy(rng.standard_normal(s).astype(np.float32)), engine.bfloat16)
                      for s in (a_shape, b_shape))
            t_engine = t(lambda: gpu.matmul(ea, eb, transpose_a=ta, transpose_b=tb), engine.cuda.synchronize)
            ta_t = torch.randn(a_shape, device="cuda", dtype=torch.bfloat16)
            tb_t = torch.randn(b_shape, device="cuda", dtype=torch.bfloat16)
            a_op, b_op = (ta_t.t() if ta else ta_t), (tb_t.t() if tb else tb_t)
            t_torch = t(lambda: a_op @ b_op, torch.cuda.synchronize)
            # FP8: A (M, K) row-major and B (K, N) column-major, i.e. both K-major
            # (dy in E5M2 for dx and dW, everything else E4M3)
            a8 = torch.randn(M, K, device="cuda").to(e5 if kind != "fwd" else e4)
            b8 = torch.randn(Nn, K, device="cuda").to(e4).t()
            t_fp8 = t(lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                      torch.cuda.synchronize)
            # engine FP8 (engine.backends.cuda.fp8.matmul_fp8, the GEMM of engine.fp8's layers) on the same layouts
            fa = "e4m3" if kind == "fwd" else "e5m2"
            e8a = gpu.fp8_cast(gpu.from_numpy(rng.standard_normal((M, K)).astype(np.float32)), fa,
                               gpu.fp8_meta(ea), True)
            e8b = gpu.fp8_cast(gpu.from_numpy(rng.standard_normal((Nn, K)).astype(np.float32)), "e4m3",
                               gpu.fp8_meta(ea), True)
            t_efp8 = t(lambda: gpu.matmul_fp8(e8a[0], fa, e8a[2], e8b[0], "e4m3", e8b[2], fast_accum=kind == "fwd"),
                       engine.cuda.synchronize)
            flops = 2.0 * M * Nn * K
            row = dict(bench="fp8_gemm", layer=name, gemm=kind, M=M, N=Nn, K=K, per_step=count,
                       engine_bf16_ms=round(t_engine, 4), torch_bf16_ms=round(t_torch, 4), torch_fp8_ms=round(t_fp8, 4),
                       engine_fp8_ms=round(t_efp8, 4), engine_bf16_tflops=round(flops / t_engine / 1e9, 1),
                       torch_fp8_tflops=round(flops / t_fp8 / 1e9, 1), engine_fp8_tflops=round(flops / t_efp8 / 1e9, 1))
            print(json.dumps(row), flush=True)
            totals["engine_bf16"] += count * t_engine
            totals["torch_bf16"] += count * t_torch
            totals["torch_fp8"] += count * t_fp8
            totals["engine_fp8"] += count * t_efp8
        # the casts one linear layer's FP8 GEMMs need each step: x and dy to FP8, and the transposed
        # copies dW's GEMM takes (x^T, dy^T); the weight's two layouts are the optimizer's to write
        x = torch.randn(N_TOKENS, i, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(N_TOKENS, o, device="cuda", dtype=torch.bfloat16)
        cast = t(lambda: (x.to(e4), dy.to(e5), x.t().contiguous().to(e4), dy.t().contiguous().to(e5)),
                 torch.cuda.synchronize)
        # engine.fp8's casts (fp8/cast.cu, delayed scaling): x to E4M3 and dy to E5M2, and the weight's
        # cast with its transposed copy
        ex, edy = (gpu.astype(gpu.from_numpy(rng.standard_normal(s).astype(np.float32)), engine.bfloat16)
                   for s in ((N_TOKENS, i), (N_TOKENS, o)))
        ew = gpu.from_numpy(rng.standard_normal((o, i)).astype(np.float32))
        mx, mdy, mw = gpu.fp8_meta(ex), gpu.fp8_meta(ex), gpu.fp8_meta(ex)
        ecast = t(lambda: (gpu.fp8_cast(ex, "e4m3", mx, False), gpu.fp8_cast(edy, "e5m2", mdy, False),
                           gpu.fp8_cast(ew, "e4m3", mw, False, transpose=True)), engine.cuda.synchronize)
        print(json.dumps(dict(bench="fp8_gemm_cast", layer=name, per_step=count, ms=round(cast, 4),
                              engine_ms=round(ecast, 4))), flush=True)
        totals["fp8_casts"] += count * cast
        totals["engine_fp8_casts"] += count * ecast
    print(json.dumps(dict(bench="fp8_gemm_summary", step_gemms_ms={k: round(v, 3) for k, v in totals.items()},
                          torch=torch.__version__)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
