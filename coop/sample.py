"""`coop sample CHECKPOINT`: text from a trained model, as nanoGPT's sample.py.

Reads a checkpoint of `coop train` (its model config, weights and tokenizer travel in it), a
coordinator's state directory, a model file (what `GET /v1/model` answers, a peer's
--out/model.safetensors) or a Hugging Face GPT-2 directory (coop.model_source), and samples with
the model's KV cache on any device: temperature, top-k and nucleus (top-p) filtering, a seed for
the same text twice.

    coop sample runs/train/checkpoint --prompt "ROMEO:" --max-new-tokens 200 --temperature 0.8 --top-k 40
    coop sample state/ --prompt "def "          # the global model of a coordinator's run
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

import engine
from engine.checkpoint import CheckpointNotFoundError

from .devices import device_problem
from .model_source import load_trained


def sample(checkpoint: str, prompt: str = "\n", max_new_tokens: int = 200, temperature: float = 0.8,
           top_k: int | None = None, top_p: float | None = None, seed: int = 0, device: str = "cpu",
           samples: int = 1) -> list[str]:
    """`samples` continuations of `prompt` (the prompt included), decoded by the checkpoint's tokenizer."""
    trained = load_trained(checkpoint)
    tokenizer = trained.tokenizer
    model = trained.model(device)
    ids = tokenizer.encode(prompt)
    if not ids:
        raise ValueError("the prompt encodes to no tokens; give some text (the default is a newline)")
    idx = engine.tensor(np.array([ids] * samples, dtype=np.int64), device=device)
    out = model.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                         generator=np.random.default_rng(seed))
    return [tokenizer.decode(row.tolist()) for row in out.numpy()]


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("sample", help="sample text from a trained model (coop train, a coordinator, a peer)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a checkpoint directory (runs/train/checkpoint), a coordinator's state "
                                      "directory, a model file or a Hugging Face GPT-2 directory")
    p.add_argument("--prompt", default="\n", help="the text to continue (default: a newline)")
    p.add_argument("--max-new-tokens", type=int, default=200, help="(default: 200)")
    p.add_argument("--temperature", type=float, default=0.8, help="0: always the most likely token (default: 0.8)")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens only")
    p.add_argument("--top-p", type=float, default=None, help="nucleus: the fewest tokens holding this probability")
    p.add_argument("--seed", type=int, default=0, help="(default: 0)")
    p.add_argument("--samples", type=int, default=1, help="continuations to print (default: 1)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.set_defaults(run=run)


def run(args) -> int:
    bad = [text for ok, text in [
        (args.max_new_tokens >= 1, f"--max-new-tokens {args.max_new_tokens} (expected at least 1)"),
        (args.temperature >= 0, f"--temperature {args.temperature} (expected 0 or more)"),
        (args.top_k is None or args.top_k >= 1, f"--top-k {args.top_k} (expected at least 1)"),
        (args.top_p is None or 0 < args.top_p <= 1, f"--top-p {args.top_p} (expected in (0, 1])"),
        (args.samples >= 1, f"--samples {args.samples} (expected at least 1)")] if not ok]
    if bad:
        print(f"coop sample: bad option(s): {'; '.join(bad)}", file=sys.stderr)
        return 2
    if problem := device_problem("coop sample", args.device):
        print(problem, file=sys.stderr)
        return 2
    try:
        texts = sample(args.checkpoint, args.prompt, args.max_new_tokens, args.temperature, args.top_k, args.top_p,
                       args.seed, args.device, args.samples)
    except (CheckpointNotFoundError, ValueError) as error:
        print(f"coop sample: {error}", file=sys.stderr)
        return 2
    for i, text in enumerate(texts):
        if len(texts) > 1:
            print(f"--- sample {i + 1}")
        print(text)
    return 0
