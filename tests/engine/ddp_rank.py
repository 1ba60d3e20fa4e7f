"""One rank of the data-parallel tests (tests/engine/test_ddp.py starts it as a real process):

    python ddp_rank.py RANK WORLD PORT TOKEN OUT STEPS BATCH [--die-at STEP]

trains a tiny GPT for STEPS AdamW steps with DistributedDataParallel over the "cpu" backend; each
step's batch of BATCH x WORLD rows is drawn from one seeded RNG and this rank takes rows
[RANK*BATCH, (RANK+1)*BATCH). Writes OUT (JSON): its losses and a checksum of its final weights.
WORLD 1 runs the same loop without a process group: the reference at WORLD x the batch.
--die-at STEP: this rank kills itself (SIGKILL) at that step, mid-training."""
from __future__ import annotations

import json
import os
import signal
import sys

import numpy as np

import engine
import engine.distributed as dist
from engine.nn import GPT, GPTConfig
from engine.nn.parallel import DistributedDataParallel
from engine.optim import AdamW, clip_grad_norm_


def main(argv: list[str]) -> int:
    rank, world, port, token, out, steps, batch = argv[:7]
    rank, world, port, steps, batch = int(rank), int(world), int(port), int(steps), int(batch)
    die_at = int(argv[argv.index("--die-at") + 1]) if "--die-at" in argv else -1
    engine.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.0))
    if rank != 0:  # the other ranks start from other weights: the wrap's broadcast must fix that
        engine.manual_seed(1 + rank)
        model = GPT(model.config)
    if world > 1:
        store = dist.TCPStore("127.0.0.1", port, token)
        dist.init_process_group("cpu", rank, world, store, timeout=60.0)
        trained = DistributedDataParallel(model, bucket_cap_mb=0.02)  # several buckets of a small model
    else:
        trained = model
    optimizer = AdamW(model.optimizer_groups(0.1), lr=3e-3)
    rng = np.random.default_rng(1234)
    tokens = (np.arange(20_000) * 5 + rng.integers(0, 2, size=20_000)) % 32  # learnable: the next token is +5 or +6
    losses = []
    for step in range(steps):
        starts = rng.integers(0, len(tokens) - 17, size=batch * world)
        rows = np.stack([tokens[s:s + 17] for s in starts])
        mine = rows[rank * batch:(rank + 1) * batch] if world > 1 else rows
        if step == die_at:
            os.kill(os.getpid(), signal.SIGKILL)
        optimizer.zero_grad()
        _, loss = trained(engine.tensor(mine[:, :-1]), engine.tensor(mine[:, 1:]))
        loss.backward()
        clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    weights = {n: p.numpy().astype(np.float64) for n, p in model.named_parameters()}
    with open(out, "w") as f:
        json.dump({"losses": losses, "weights": {n: float(w.sum()) for n, w in weights.items()},
                   "first": weights["transformer.wte.weight"].ravel()[:8].tolist() if "transformer.wte.weight" in weights
                   else next(iter(weights.values())).ravel()[:8].tolist()}, f)
    if world > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
