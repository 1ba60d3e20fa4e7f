"""Layer norm backward on one GPU: the engine's kernel against PyTorch's, same run, same shapes.

The shapes of gpt2_124m (B 16 x T 1024 rows of 768) and shakespeare_char (64 x 256 rows of 384),
bf16 activations, with the weight and bias gradients, as a training step calls it (the engine's
weights are float32; PyTorch's CUDA kernel wants them in the activations' dtype, bf16).
The engine's op also adds the residual stream's gradient inside the kernel (`residual` lines:
F.add_layer_norm's backward); PyTorch's `native_layer_norm_backward` has no such input, so its
line is the backward alone, and `torch_plus_add` adds the separate add a step would make.
`us_residual_bias` is the engine's op as a GPT step calls it since the projections' biases moved
into it: the residual add's gradient and the column sums of the result (the attention or MLP
projection's bias gradient) in the same kernel; `us_bias_grad_pass` is the Linear layer's own
column-sum pass over the same gradient that this replaces. `tbps` beside each of the engine's backward
times is the DRAM traffic it needs at the least (bf16 rows of dout and x read, dx written, the
residual's gradient read where there is one; the row statistics) over its time, in TB/s: against the
GPU's bandwidth (H100 3.35, H200 4.8), how far the kernel is from bound by the memory.

    python bench/layer_norm.py            # one JSON line per (shape, implementation): us per call
"""
from __future__ import annotations

import argparse
import json

import numpy as np
from timing import seconds_per_call

SHAPES = {"gpt2_124m": (16 * 1024, 768), "shakespeare_char": (64 * 256, 384)}


def timed(call, sync, calls: int, warmup: int = 20) -> float:
    return seconds_per_call(call, calls, warmup, sync) * 1e6  # us


def bench_engine(N: int, C: int, calls: int) -> dict:
    import engine
    from engine.backends.cuda.matmul import _bias_grad
    from engine.backends.cuda.nn import add_layer_norm_backward, layer_norm, layer_norm_backward

    rng = np.random.default_rng(0)

    def array(shape, dtype):
        return engine.tensor(rng.standard_normal(shape).astype(np.float32), device="cuda").to(dtype).data

    x, g, res = (array((N, C), engine.bfloat16) for _ in range(3))
    w, b = array((C,), engine.float32), array((C,), engine.float32)
    _, mean, rstd = layer_norm(x, w, b, 1e-5)
    return {"us": timed(lambda: layer_norm_backward(g, x, w, mean, rstd, True), engine.cuda.synchronize, calls),
            "us_residual": timed(lambda: layer_norm_backward(g, x, w, mean, rstd, True, res),
                                 engine.cuda.synchronize, calls),
            "us_residual_bias": timed(lambda: add_layer_norm_backward(g, res, x, w, mean, rstd, True, True),
                                      engine.cuda.synchronize, calls),
            "us_bias_grad_pass": timed(lambda: _bias_grad(res, None, engine.float32), engine.cuda.synchronize, calls)}


# the bf16 (N, C) arrays each engine line moves at the least: dout, x, dx, and the residual's gradient
ROWS_MOVED = {"us": 3, "us_residual": 4, "us_residual_bias": 4}


def with_bandwidth(us: dict, N: int, C: int) -> dict:
    """us (key: microseconds a call) with `tbps_<key>` beside each backward: its least traffic over its time."""
    out = {}
    for key, t in us.items():
        out[key] = round(t, 1)
        if key in ROWS_MOVED:
            least = ROWS_MOVED[key] * N * C * 2 + 2 * N * 4  # + the float32 mean and rstd a row
            out["tbps" + key[2:]] = round(least / (t * 1e-6) / 1e12, 2)
    return out


def bench_torch(N: int, C: int, calls: int) -> dict:
    import torch

    x, g, res = (torch.randn(N, C, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    # bf16 weights: PyTorch's CUDA layer norm takes no float32 weights with bf16 activations
    w, b = torch.randn(C, device="cuda", dtype=torch.bfloat16), torch.randn(C, device="cuda", dtype=torch.bfloat16)
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [C], w, b, 1e-5)

    def backward():
        return torch.ops.aten.native_layer_norm_backward(g, x, [C], mean, rstd, w, b, [True, True, True])

    return {"us": timed(backward, torch.cuda.synchronize, calls),
            "us_plus_add": timed(lambda: backward()[0] + res, torch.cuda.synchronize, calls),
            "torch": torch.__version__}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args()
    for name, (N, C) in SHAPES.items():
        print(json.dumps({"bench": "layer_norm_backward", "config": name, "N": N, "C": C, "impl": "engine",
                          **with_bandwidth(bench_engine(N, C, args.calls), N, C)}), flush=True)
        if not args.no_torch:
            out = bench_torch(N, C, args.calls)
            print(json.dumps({"bench": "layer_norm_backward", "config": name, "N": N, "C": C, "impl": "torch",
                              **{k: round(v, 1) if isinstance(v, float) else v for k, v in out.items()}}), flush=True)


if __name__ == "__main__":
    main()
