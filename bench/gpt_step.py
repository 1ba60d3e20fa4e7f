"""Full GPT training step (forward, backward, AdamW) on one GPU: engine against PyTorch.

Prints one JSON line per (config, implementation, mode) with ms/step and tokens/s, then one line
per config with every mode's tokens/s as a ratio to PyTorch's torch.compile bf16 (same model, same
run, same GPU). Modes: engine fp32 (TF32 matmuls), engine bf16 (engine.autocast) and engine bf16 with
the whole step replayed as one CUDA graph (engine.cuda.graphs.CapturedStep), and the same two with
FP8 linear layers (fp8, fp8_graph: engine.fp8, opt-in, not in the default set); PyTorch eager
fp32 (TF32), eager bf16 (torch.autocast), torch.compile bf16 and torch.compile bf16 in its
"reduce-overhead" mode (CUDA graphs), where torch is importable; a last line per config gives every
mode's ratio to the strongest torch.compile mode of the run. The two
configurations and the PyTorch model are the reference ones (bench/torch_gpt.py).

    python bench/gpt_step.py                      # both configs, 30 timed steps after 8 warm-up
    python bench/gpt_step.py --configs shakespeare_char --steps 10 --no-torch
    python bench/gpt_step.py --engine-modes bf16 --torch-modes compile_bf16
    python bench/gpt_step.py --configs gpt2_124m --engine-modes bf16 --no-torch --profile 60   # kernels by GPU time
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time

CONFIGS = {
    "shakespeare_char": dict(V=65, T=256, L=6, H=6, D=384, B=64),
    "gpt2_124m": dict(V=50304, T=1024, L=12, H=12, D=768, B=16),
}


def _flops_per_token(nparams: int, c: dict) -> float:
    # 6N per token + attention (12 L T D), as nanoGPT estimates
    return 6 * nparams + 12 * c["L"] * c["T"] * c["D"]


def engine_step(c: dict, mode: str = "bf16", device: str = "cuda"):
    """The bench's training step on engine for config c (a CONFIGS entry, or one like it): a GPT with
    biases and no dropout, AdamW with torch's defaults, one fixed random batch. mode: fp32 (no
    autocast), bf16..., fp8... (engine.fp8 on the linear layers). -> (step_fn(idx, tgt) -> loss, idx,
    tgt, model)."""
    import numpy as np

    import engine
    from engine.nn import GPT, GPTConfig

    engine.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=c["V"], block_size=c["T"], n_layer=c["L"], n_head=c["H"], n_embd=c["D"],
                          dropout=0.0, bias=True)).to(device)
    if mode.startswith("fp8"):  # bf16 autocast with the linear layers' forward and dx GEMMs in FP8 (engine.fp8)
        import engine.fp8
        engine.fp8.enable(model)
    opt = engine.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)  # torch's defaults
    rng = np.random.default_rng(0)
    idx = engine.tensor(rng.integers(0, c["V"], (c["B"], c["T"])), device=device)
    tgt = engine.tensor(rng.integers(0, c["V"], (c["B"], c["T"])), device=device)

    def step_fn(x, y):
        with engine.autocast(device, dtype=engine.bfloat16, enabled=mode != "fp32"):
            _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step_fn, idx, tgt, model


def bench_engine(name: str, steps: int, warmup: int, profile: int = 0, mode: str = "fp32") -> dict:
    import engine

    c = CONFIGS[name]
    step_fn, idx, tgt, model = engine_step(c, mode)
    nparams = model.num_parameters()
    captured = engine.cuda.graphs.CapturedStep(step_fn) if mode.endswith("_graph") else None

    def step():
        return captured(idx, tgt) if captured is not None else step_fn(idx, tgt)

    for _ in range(warmup):
        loss = step()
    first_loss = float(loss.numpy())
    engine.cuda.synchronize()
    engine.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    t_host = time.perf_counter()  # the host has queued every step; the GPU may still be working
    engine.cuda.synchronize()
    dt = (time.perf_counter() - t0) / steps
    toks = c["B"] * c["T"] / dt
    out = dict(config=name, impl="engine", mode={"fp32": "fp32_tf32", "bf16": "bf16_autocast"}.get(mode, mode), params=nparams, ms_per_step=round(dt * 1e3, 3),
               host_ms_per_step=round((t_host - t0) / steps * 1e3, 3), tokens_per_s=round(toks),
               tflops=round(_flops_per_token(nparams, c) * toks / 1e12, 2),
               peak_mem_gb=round(engine.cuda.max_memory_allocated() / 1e9, 2), loss_after_warmup=round(first_loss, 4),
               loss=round(float(loss.numpy()), 4))
    if captured is not None:
        out["captured"] = captured.captured
        if not captured.captured:
            out["fallback_reason"] = captured.fallback_reason
    if profile and captured is None:
        out["profile_top_kernels"] = _profile(step, 3, profile)
    return out


def _profile(step, n: int, top: int = 25, sync=None) -> list:
    """The kernels taking the most GPU time over `n` steps (torch.profiler sees every kernel of the process);
    `sync` waits for the GPU (default: engine's)."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return []
    if sync is None:  # the engine's step (a PyTorch mode's child process never imports the engine)
        import engine

        sync = engine.cuda.synchronize
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                step()
            sync()
    except Exception as e:  # a CPU-only torch has no CUDA activity
        return [dict(error=repr(e)[:200])]
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None)
        if t is None:
            t = getattr(e, "self_cuda_time_total", 0)
        if t > 0:
            rows.append(dict(kernel=e.key[:120], ms_per_step=round(t / n / 1e3, 3), calls_per_step=e.count / n))
    rows.sort(key=lambda r: -r["ms_per_step"])
    total = sum(r["ms_per_step"] for r in rows)
    return [dict(kernel="TOTAL", ms_per_step=round(total, 3))] + rows[:top]


def torch_model(c: dict):
    """The PyTorch reference GPT (bench/torch_gpt.py) for configuration c."""
    import os

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_gpt import TorchGPT

    return TorchGPT(c["V"], c["T"], c["L"], c["H"], c["D"])


def bench_torch(name: str, steps: int, warmup: int, mode: str = "eager_fp32", profile: int = 0) -> dict:
    import contextlib

    import torch

    c = CONFIGS[name]
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    m = torch_model(c).to("cuda")
    nparams = sum(p.numel() for p in m.parameters())
    # reduce-overhead: torch.compile replaying CUDA graphs, as our captured step does (the strongest mode)
    fwd = {"compile_bf16": lambda: torch.compile(m),
           "compile_bf16_reduce_overhead": lambda: torch.compile(m, mode="reduce-overhead")}.get(mode, lambda: m)()
    amp = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if "bf16" in mode else contextlib.nullcontext
    opt = torch.optim.AdamW(m.parameters(), lr=3e-4, fused=True)
    idx = torch.randint(0, c["V"], (c["B"], c["T"]), device="cuda")
    tgt = torch.randint(0, c["V"], (c["B"], c["T"]), device="cuda")

    graphs = mode == "compile_bf16_reduce_overhead"

    def step():
        if graphs:  # a new iteration: the last one's graph outputs may be overwritten (CUDA-graph trees)
            torch.compiler.cudagraph_mark_step_begin()
        with amp():
            loss = fwd(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(max(warmup, 12) if graphs else warmup):  # the trees record over the first few steps
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / steps
    toks = c["B"] * c["T"] / dt
    out = dict(config=name, impl="torch", mode={"eager_fp32": "eager_fp32_tf32"}.get(mode, mode), torch=torch.__version__, params=nparams,
               ms_per_step=round(dt * 1e3, 3), tokens_per_s=round(toks),
               tflops=round(_flops_per_token(nparams, c) * toks / 1e12, 2),
               peak_mem_gb=round(torch.cuda.max_memory_allocated() / 1e9, 2))
    if profile:
        out["profile_top_kernels"] = _profile(step, 3, profile, sync=torch.cuda.synchronize)
    del m, opt, fwd
    torch.cuda.empty_cache()
    return out


def torch_in_own_process(name: str, mode: str, args) -> dict:
    """bench_torch in a child process: each PyTorch mode alone, with nothing of the engine (or of
    another mode: torch.compile's caches) in its process."""
    argv = [sys.executable, __file__, "--_torch", name, mode, "--steps", str(args.steps), "--warmup", str(args.warmup)]
    child = subprocess.run(argv + (["--profile", str(args.profile)] if args.profile else []), capture_output=True,
                           text=True, timeout=1800)
    lines = [line for line in child.stdout.splitlines() if line.startswith("{")]
    if child.returncode != 0 or not lines:
        return dict(config=name, impl="torch", mode=mode, error=(child.stderr or child.stdout)[-500:])
    return json.loads(lines[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--engine-modes", nargs="+", default=["fp32", "bf16", "bf16_graph"],
                    choices=["fp32", "bf16", "bf16_graph", "fp8", "fp8_graph"])
    ap.add_argument("--torch-modes", nargs="+",
                    default=["eager_fp32", "eager_bf16", "compile_bf16", "compile_bf16_reduce_overhead"],
                    choices=["eager_fp32", "eager_bf16", "compile_bf16", "compile_bf16_reduce_overhead"])
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch reference")
    ap.add_argument("--profile", nargs="?", type=int, const=25, default=0, metavar="N",
                    help="add the top N kernels (25 without N) by GPU time of each eager mode (needs torch)")
    ap.add_argument("--_torch", nargs=2, metavar=("CONFIG", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._torch:  # a child of the run below: one PyTorch mode, alone in its process
        print(json.dumps(bench_torch(args._torch[0], args.steps, args.warmup, args._torch[1], args.profile)), flush=True)
        return 0

    import engine

    if not engine.cuda.is_available():
        print(json.dumps(dict(error=f"no GPU: {engine.cuda.unavailable_reason()}")), flush=True)
        return 1
    have_torch = not args.no_torch and importlib.util.find_spec("torch") is not None
    for name in args.configs:
        rows = []
        for mode in args.engine_modes:
            try:
                ours = bench_engine(name, args.steps, args.warmup, args.profile, mode)
            except Exception as e:  # one config failing (e.g. out of memory) should not hide the other
                ours = dict(config=name, impl="engine", mode=mode, error=repr(e)[:500])
            print(json.dumps(ours), flush=True)
            rows.append(ours)
            engine.cuda.empty_cache()
        for mode in (args.torch_modes if have_torch else []):
            ref = torch_in_own_process(name, mode, args)
            print(json.dumps(ref), flush=True)
            rows.append(ref)
        base = next((r for r in rows if r.get("mode") == "compile_bf16" and "tokens_per_s" in r), None)
        if base is not None:
            ratios = {f"{r['impl']}_{r['mode']}": round(r["tokens_per_s"] / base["tokens_per_s"], 3)
                      for r in rows if "tokens_per_s" in r}
            print(json.dumps(dict(config=name, tokens_per_s_ratio_to_torch_compile_bf16=ratios)), flush=True)
        compiled = [r for r in rows if r.get("impl") == "torch" and str(r.get("mode")).startswith("compile")
                    and "tokens_per_s" in r]
        if compiled:  # the strongest torch.compile mode of this run is the reference the engine is judged by
            best = max(compiled, key=lambda r: r["tokens_per_s"])
            ratios = {f"{r['impl']}_{r['mode']}": round(r["tokens_per_s"] / best["tokens_per_s"], 3)
                      for r in rows if "tokens_per_s" in r}
            print(json.dumps(dict(config=name, strongest_torch=best["mode"],
                                  tokens_per_s_ratio_to_strongest_torch=ratios)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
