"""`coop export CHECKPOINT OUT_DIR --format hf`: a trained model as a Hugging Face GPT-2 directory.

CHECKPOINT is anything `coop sample` reads (coop.model_source): a `coop train` checkpoint, a
coordinator's state directory, a model file (GET /v1/model, a peer's --out/model.safetensors).
OUT_DIR gets config.json, generation_config.json, model.safetensors, tokenizer.json,
tokenizer_config.json and special_tokens_map.json (coop.hf.directory), which transformers loads:

    coop export runs/train/checkpoint gpt2-mine --format hf
    python -c "from transformers import AutoTokenizer, GPT2LMHeadModel as M; \\
               m = M.from_pretrained('gpt2-mine'); t = AutoTokenizer.from_pretrained('gpt2-mine')"

A model that cannot be expressed so (its vocabulary or its tokenizer) exits 2 with one line saying why.
"""
from __future__ import annotations

import argparse
import sys

from engine.checkpoint import CheckpointNotFoundError

from .hf import HFFormatError, write_hf_dir
from .model_source import load_trained

FORMATS = ("hf",)


def export(checkpoint: str, out_dir: str, fmt: str = "hf", overwrite: bool = False) -> list[str]:
    """Write the model at `checkpoint` to `out_dir` in format `fmt`; returns the files written."""
    if fmt not in FORMATS:
        raise ValueError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    trained = load_trained(checkpoint)
    return [str(p) for p in write_hf_dir(trained, out_dir, overwrite=overwrite)]


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("export", help="write a trained model as a Hugging Face GPT-2 directory",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a checkpoint directory, a coordinator's state directory or a model file")
    p.add_argument("out_dir", help="the directory to write (new or empty)")
    p.add_argument("--format", default="hf", choices=FORMATS, help="hf: transformers' GPT-2 (default: hf)")
    p.add_argument("--overwrite", action="store_true", help="write into OUT_DIR even if it holds files")
    p.set_defaults(run=run)


def run(args) -> int:
    try:
        files = export(args.checkpoint, args.out_dir, args.format, args.overwrite)
    except (CheckpointNotFoundError, HFFormatError, ValueError) as error:
        print(f"coop export: {error}", file=sys.stderr)
        return 2
    print(f"wrote {len(files)} files to {args.out_dir}: {', '.join(p.rsplit('/', 1)[-1] for p in files)}")
    return 0
