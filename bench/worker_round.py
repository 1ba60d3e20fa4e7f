"""A worker's round outside its inner steps, phase by phase, on one device (no coordinator, no network).

Every HTTP worker, every peer and every simulated replica does this host and device work once a
round, beside the K inner steps; on a GPU it is the "other" and "eval" of bench/service.py. Here it
is timed part by part, for a model size, with the inner step's own time for scale:

    inner_step_ms     one captured training step (the round's K of them are the work)
    load_global_s     the first download loaded into the model and made the anchor
    round_tail_s      after the K steps: the pseudo-gradient (anchor - local) to the host
    encode_s          the codec's encode (int8 by default), pack_s: laid out as the upload's body
    apply_merge_s     the next round's merged weights loaded, the steps since sending kept on top
    eval_s            the val loss of the global weights on the worker's device (`--eval-batches` windows)

    python bench/worker_round.py --device cuda --model m124
    python bench/worker_round.py --model tiny --steps 3        # a CPU smoke run
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coop.codec import get_codec  # noqa: E402
from coop.replica import InnerConfig, Replica  # noqa: E402
from coop.wire import pack_view  # noqa: E402
from engine.data import TokenDataset  # noqa: E402
from engine.nn import GPTConfig  # noqa: E402

MODELS = {  # name -> model, batch size (those of bench/service.py)
    "tiny": (dict(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=96), 8),
    "m10": (dict(n_layer=6, n_head=6, n_embd=384, block_size=256, vocab_size=96), 16),
    "m124": (dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304), 8),
}


def timed(fn, repeats: int):
    """(median seconds, last result) of `repeats` calls."""
    times, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return float(np.median(times)), result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="m10", choices=sorted(MODELS))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--codec", default="int8")
    ap.add_argument("--steps", type=int, default=20, help="inner steps per measured round")
    ap.add_argument("--eval-batches", type=int, default=5, help="val windows one worker evaluates (20 shared by 4)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    model, batch = MODELS[args.model]
    config = GPTConfig(**model)
    rng = np.random.default_rng(0)
    data = TokenDataset(rng.integers(0, config.vocab_size, 2_000_000, dtype=np.uint16))
    replica = Replica(config, data, InnerConfig(batch_size=batch, block_size=config.block_size, warmup_steps=5),
                      device=args.device)
    codec = get_codec(args.codec)
    global_weights = {n: np.array(w) for n, w in replica.weights().items()}
    params = sum(w.size for w in global_weights.values())

    load_global_s, _ = timed(lambda: replica.load_global(global_weights), args.repeats)
    for _ in range(3):  # warm-up: the graph's capture
        replica.train_step()
    started = time.perf_counter()
    losses = [replica.train_step() for _ in range(args.steps)]
    float(losses[-1].item())
    inner_step_ms = 1000 * (time.perf_counter() - started) / args.steps

    round_tail_s, delta = timed(replica.pseudo_gradient, args.repeats)  # what run_round does after its last step
    sent = dict(replica.sent_at)
    encode_s, encoded = timed(lambda: codec.encode(delta), args.repeats)
    pack_s, body = timed(lambda: pack_view(encoded.tensors, dict(encoded.metadata, round=0)), args.repeats)  # the worker's
    merged = {n: w - 0.5 * delta[n] for n, w in global_weights.items()}

    def apply_merge():
        replica.sent_at = dict(sent)
        replica.apply_merge(merged, keep_progress=True)

    apply_merge_s, _ = timed(apply_merge, args.repeats)
    replica.evaluate_weights(merged, data, args.eval_batches)  # its model made, its first run
    eval_s, loss = timed(lambda: replica.evaluate_weights(merged, data, args.eval_batches), args.repeats)
    print(json.dumps({
        "bench": "worker_round", "model": args.model, "device": args.device, "params": params, "codec": args.codec,
        "inner_step_ms": round(inner_step_ms, 3), "load_global_s": round(load_global_s, 4),
        "round_tail_s": round(round_tail_s, 4), "encode_s": round(encode_s, 4), "pack_s": round(pack_s, 4),
        "apply_merge_s": round(apply_merge_s, 4), "eval_s": round(eval_s, 4), "eval_batches": args.eval_batches,
        "upload_MB": round(len(body) / 1e6, 2), "val_loss": round(float(loss), 4),
    }))


if __name__ == "__main__":
    main()
