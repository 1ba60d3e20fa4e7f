"""Data parallel training on N GPUs against one GPU: tokens/s of a GPT training step (bf16 autocast,
the step captured as a CUDA graph, AdamW, clipping: coop.training.TrainStep, what a worker runs)
wrapped in engine.nn.parallel.DistributedDataParallel over NCCL, one process per GPU.

Prints one JSON line per world size (tokens/s over all ranks, ms/step), then one line with the
scaling: tokens/s on N GPUs / (N x tokens/s on 1 GPU), 1.0 being perfect. Each rank draws its own
batch of B x T tokens, so N GPUs train N x B x T tokens a step.

    python bench/data_parallel.py                       # gpt2_124m, all visible GPUs, 20 steps after 5
    python bench/data_parallel.py --gpus 0,1 --config shakespeare_char --steps 50
    python bench/data_parallel.py --no-graph            # eager steps (the bucketed all-reduce overlaps
                                                        # the backward on the side stream either way)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo's engine and coop
from gpt_step import CONFIGS  # noqa: E402  (the same model configurations as the other benches)


def rank_main(rank: int, world: int, port: int, token: str, config: str, steps: int, warmup: int, graph: bool,
              bucket_mb: float) -> None:
    """One rank (its GPU is its only visible one): time `steps` steps after `warmup`; rank 0 prints."""
    import numpy as np

    import engine
    import engine.distributed as dist
    from coop.training import TrainStep, make_optimizer
    from engine.nn import GPT, GPTConfig
    from engine.nn.parallel import DistributedDataParallel

    c = CONFIGS[config]
    store = dist.TCPStore("127.0.0.1", port, token)
    dist.init_process_group("nccl", rank, world, store, device="cuda:0")
    engine.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=c["V"], block_size=c["T"], n_layer=c["L"], n_head=c["H"], n_embd=c["D"],
                          dropout=0.0)).to("cuda")
    ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_mb)
    step = TrainStep(ddp, make_optimizer(model, "adamw", 6e-4, 0.1), device="cuda", lr=6e-4, min_lr=6e-5,
                     warmup_steps=10, total_steps=10_000, precision="bf16", graph=graph)
    rng = np.random.default_rng(rank)
    batches = [rng.integers(0, c["V"], size=(c["B"], c["T"] + 1)) for _ in range(4)]
    batches = [(engine.tensor(b[:, :-1], device="cuda"), engine.tensor(b[:, 1:], device="cuda")) for b in batches]
    for i in range(warmup):
        step(*batches[i % 4])
    engine.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for i in range(steps):
        loss = step(*batches[i % 4])
    float(loss.item())  # waits for the last step, collectives included
    seconds = time.perf_counter() - start
    if rank == 0:
        tokens = steps * c["B"] * c["T"] * world
        print(json.dumps({"bench": "data_parallel", "config": config, "gpus": world, "graph": graph,
                          "captured": bool(step.captured and step.captured.captured), "bucket_mb": bucket_mb,
                          "ms_per_step": round(1000 * seconds / steps, 2), "tokens_per_s": round(tokens / seconds),
                          "params": model.num_parameters()}), flush=True)
    dist.destroy_process_group()


def run_world(gpus: list[int], args) -> dict:
    """Start one rank per GPU, return rank 0's JSON line."""
    import secrets

    import engine.distributed as dist

    token = secrets.token_hex(8)
    store = dist.TCPStore("127.0.0.1", 0, token, is_server=True)
    procs = []
    for rank, gpu in enumerate(gpus):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu))
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank", str(rank), "--world",
                                       str(len(gpus)), "--port", str(store.port), "--token", token, "--config",
                                       args.config, "--steps", str(args.steps), "--warmup", str(args.warmup),
                                       "--bucket-mb", str(args.bucket_mb)] + ([] if args.graph else ["--no-graph"]),
                                      env=env, stdout=subprocess.PIPE, text=True))
    outs = [p.communicate()[0] for p in procs]
    store.close()
    if any(p.returncode for p in procs):
        raise SystemExit(f"bench/data_parallel.py: a rank failed on GPUs {gpus} (exit codes "
                         f"{[p.returncode for p in procs]})")
    line = json.loads(outs[0].strip().splitlines()[-1])
    print(json.dumps(line), flush=True)
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", default=None, help="GPUs to use, e.g. 0,1 (default: every visible GPU)")
    parser.add_argument("--config", default="gpt2_124m", choices=sorted(CONFIGS))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--bucket-mb", type=float, default=25.0)
    parser.add_argument("--graph", action=argparse.BooleanOptionalAction, default=True)
    for hidden in ("--rank", "--world", "--port"):
        parser.add_argument(hidden, type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--token", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.world, args.port, args.token, args.config, args.steps, args.warmup, args.graph,
                  args.bucket_mb)
        return
    import engine
    import engine.distributed as dist

    if not engine.cuda.is_available() or not dist.is_nccl_available():
        raise SystemExit(f"bench/data_parallel.py needs GPUs and NCCL: {engine.cuda.unavailable_reason() or ''} "
                         f"{dist.nccl_unavailable_reason()}".strip())
    gpus = [int(g) for g in args.gpus.split(",")] if args.gpus else list(range(engine.cuda.device_count()))
    one = run_world(gpus[:1], args)
    if len(gpus) > 1:
        many = run_world(gpus, args)
        print(json.dumps({"bench": "data_parallel_scaling", "config": args.config, "gpus": len(gpus),
                          "scaling": round(many["tokens_per_s"] / (len(gpus) * one["tokens_per_s"]), 3),
                          "speedup": round(many["tokens_per_s"] / one["tokens_per_s"], 3)}), flush=True)


if __name__ == "__main__":
    main()
