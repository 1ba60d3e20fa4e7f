"""One rank of tests/cuda/test_distributed_nccl.py's two-GPU test, run as a real process (GPU =
RANK, CUDA_VISIBLE_DEVICES left alone):

    python nccl_rank.py RANK WORLD PORT TOKEN [--die-after-init]

all_reduce (sum, avg) and broadcast over NCCL on engine CUDA tensors; prints one JSON line."""
from __future__ import annotations

import json
import os
import signal
import sys
import time

import numpy as np

import engine
import engine.distributed as dist


def main(argv: list[str]) -> int:
    rank, world, port, token = int(argv[0]), int(argv[1]), int(argv[2]), argv[3]
    store = dist.TCPStore("127.0.0.1", port, token)
    dist.init_process_group("nccl", rank, world, store, device=f"cuda:{rank}", timeout=60.0)
    if "--die-after-init" in argv and rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    started = time.monotonic()
    x = y = z = None
    try:  # with a dead peer, any of these raises DistributedError (the watchdog aborts), none hangs
        x = engine.tensor(np.arange(1 << 20, dtype=np.float32) * (rank + 1), device=f"cuda:{rank}")
        dist.all_reduce(x, "sum")
        y = engine.tensor(np.full(7, float(rank), dtype=np.float32), device=f"cuda:{rank}")
        dist.broadcast(y, src=world - 1, async_op=True).wait()
        z = engine.tensor(np.ones(3, dtype=np.float32) * (rank + 1), device=f"cuda:{rank}")
        for _ in range(100 if "--die-after-init" in argv else 1):
            dist.all_reduce(z, "avg")
            engine.cuda.synchronize(rank)
        error = None
    except dist.DistributedError as e:
        error = str(e)
    if error is not None:
        print(json.dumps({"rank": rank, "error": error, "seconds": time.monotonic() - started}), flush=True)
        return 3
    print(json.dumps({"rank": rank, "sum_head": x.numpy()[:4].tolist(), "broadcast": y.numpy().tolist(),
                      "avg": z.numpy().tolist(), "error": None, "seconds": time.monotonic() - started}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
