"""One rank of tests/engine/test_distributed.py's collective tests, run as a real process:

    python dist_rank.py RANK WORLD PORT TOKEN OUT

joins a "cpu" process group through the store at 127.0.0.1:PORT, runs all_reduce (sum, avg, max,
min), broadcast, barrier on tensors that differ per rank, and writes OUT (JSON) with the results."""
from __future__ import annotations

import json
import sys

import numpy as np

import engine
import engine.distributed as dist


def main(argv: list[str]) -> int:
    rank, world, port, token, out = int(argv[0]), int(argv[1]), int(argv[2]), argv[3], argv[4]
    store = dist.TCPStore("127.0.0.1", port, token)
    group = dist.init_process_group("cpu", rank, world, store, timeout=60.0)
    results = {"rank": dist.get_rank(), "world": dist.get_world_size(), "backend": dist.get_backend()}
    rng = np.random.default_rng(rank)
    x = rng.standard_normal(1000).astype(np.float32)  # a float sum whose value depends on the order
    results["x"] = x.tolist()
    for op in ("sum", "avg", "max", "min"):
        t = engine.tensor(x.copy())
        dist.all_reduce(t, op)
        results[op] = t.numpy().tolist()
    ints = engine.tensor(np.arange(5) * (rank + 1))
    dist.all_reduce(ints, dist.ReduceOp.SUM)
    results["int_sum"] = ints.numpy().tolist()
    b = engine.tensor(np.full((2, 3), float(rank), dtype=np.float32))
    work = dist.broadcast(b, src=world - 1, async_op=True)
    work.wait()
    results["broadcast"] = b.numpy().tolist()
    dist.barrier()
    assert group is dist.get_group()
    dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
