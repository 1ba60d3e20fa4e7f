"""`coop train`: single-process training of a GPT on a text corpus.

AdamW with warm-up + cosine, gradient accumulation and clipping, val loss every N steps, a
progress line, atomic checkpoints with --resume (bit-for-bit the same run as an uninterrupted
one), and a text sample at the end. With no --data it trains on the running Python's standard
library source, a real corpus present on every machine. --init-from HF_DIR starts from a Hugging
Face GPT-2 directory (coop.hf): its weights, its shape and its tokenizer."""
from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import threading
import time
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import ConfigDict, Field, field_validator
from pydantic.dataclasses import dataclass

import engine
import engine.distributed as dist
from engine.checkpoint import CheckpointNotFoundError, load_checkpoint, save_checkpoint
from engine.data import (BPETokenizer, CharTokenizer, default_corpus, encode_corpus_in_memory,
                         tokenizer_from_json)
from engine.nn import GPT, GPTConfig
from engine.nn.parallel import DistributedDataParallel

from . import launch
from .progress import Progress, format_duration
from .devices import DEVICE_HELP, describe_device, resolve_device
from .hf import HFFormatError, read_hf_config, read_hf_dir
from .hf.gpt2 import from_hf_config
from .options import OptionsError, build_options, existing_files, given_options, read_options_file
from .trained import ModelSourceError
from .training import TrainStep, autocast_for, evaluate, load_weights, make_optimizer


TOKENIZERS = ("char", "bpe")
PRECISIONS = ("auto", "bf16", "fp8", "fp32")
MODEL_SHAPE = ("n_layer", "n_head", "n_embd", "block_size", "bias")  # with --init-from: the directory's
AtLeast1 = Annotated[int, Field(ge=1)]
AtLeast0 = Annotated[int, Field(ge=0)]


@dataclass(config=ConfigDict(extra="forbid"))
class TrainConfig:
    """Every option of `coop train`, checked (pydantic) before any work: a bad value raises a
    ValueError that names it; `coop train` prints it as one line and exits 2 (coop.options)."""

    data: list[str] | None = None  # text files; None = the embedded default corpus
    default_corpus_chars: AtLeast1 = 2_000_000
    tokenizer: Literal["char", "bpe"] = "char"
    vocab_size: Annotated[int, Field(ge=2)] = 2048  # for bpe
    out: str = "runs/train"
    resume: bool = False
    device: Annotated[str, Field(validate_default=True)] = "auto"  # auto: cuda when a GPU is seen, else cpu
    # "auto": bf16 autocast on a GPU, float32 on the CPU; "fp8": bf16 with FP8 linear layers (engine.fp8, Hopper)
    precision: Literal["auto", "bf16", "fp8", "fp32"] = "auto"
    graph: bool = True  # on a GPU, run each training step as one captured CUDA graph (engine.cuda.graphs)
    seed: Annotated[int, Field(ge=0, lt=2**32)] = 0
    # a Hugging Face GPT-2 directory to start from: its weights and tokenizer; the model options
    # below (n_layer, n_head, n_embd, block_size, bias) are then the directory's
    init_from: str | None = None
    # model
    n_layer: AtLeast1 = 4
    n_head: AtLeast1 = 4
    n_embd: AtLeast1 = 128
    block_size: AtLeast1 = 128
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0
    bias: bool = True  # biases in the Linear and LayerNorm layers (nanoGPT's shakespeare_char: --no-bias)
    # optimisation
    batch_size: AtLeast1 = 16
    grad_accum: AtLeast1 = 1
    max_steps: AtLeast1 = 500
    lr: Annotated[float, Field(gt=0)] = 1e-3
    min_lr: Annotated[float, Field(ge=0)] = 1e-4
    warmup_steps: AtLeast0 = 50
    weight_decay: Annotated[float, Field(ge=0)] = 0.1
    beta2: Annotated[float, Field(ge=0, lt=1)] = 0.95
    grad_clip: Annotated[float, Field(ge=0)] = 1.0  # 0: off
    # evaluation and output
    val_fraction: Annotated[float, Field(gt=0, lt=1)] = 0.1
    eval_every: AtLeast0 = 100  # 0: only at the end
    eval_batches: AtLeast1 = 10
    eval_train: bool = True  # also measure the train split at each evaluation (--no-eval-train: val only)
    checkpoint_every: AtLeast0 = 100  # 0: only at the end
    log_every: AtLeast1 = 10
    sample_tokens: AtLeast0 = 300  # 0: no sample
    quiet: bool = False

    _real_device = field_validator("device")(resolve_device)  # "auto" -> cuda or cpu
    _data_files = field_validator("data")(existing_files)

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"--n-embd {self.n_embd} must be a multiple of --n-head {self.n_head}")


def model_shape(config: GPTConfig) -> dict:
    return {name: getattr(config, name) for name in MODEL_SHAPE}


class Interrupt:
    """Within `with`: the first Ctrl-C (SIGINT) only asks the training loop to stop after its step,
    so that it can write a checkpoint; a second one stops at once. Outside the main thread: nothing."""

    def __init__(self):
        self.asked, self._previous = False, None

    def _handle(self, signum, frame):
        if self.asked:
            raise KeyboardInterrupt
        self.asked = True

    def __enter__(self) -> Interrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def every(step: int, period: int) -> bool:
    """Whether `step` is one of every `period` steps (period 0: never)."""
    return period > 0 and step % period == 0


def load_corpus(cfg: TrainConfig) -> str:
    if not cfg.data:
        return default_corpus(cfg.default_corpus_chars)
    texts = []
    for name in cfg.data:
        path = Path(name)
        if not path.is_file():
            raise SystemExit(f"coop train: --data {name}: no such file")
        texts.append(path.read_text(encoding="utf-8", errors="replace"))
    return "\n".join(texts)


def build_tokenizer(cfg: TrainConfig, text: str):
    if cfg.tokenizer == "char":
        return CharTokenizer.from_text(text)
    if cfg.tokenizer == "bpe":
        return BPETokenizer.train(texts=[text], vocab_size=cfg.vocab_size)
    raise SystemExit(f"coop train: --tokenizer must be 'char' or 'bpe', got {cfg.tokenizer!r}")


class Trainer:
    """Holds everything a run's state is made of, so that a checkpoint can restore all of it."""

    def __init__(self, cfg: TrainConfig, log=print):
        self.cfg, self.log = cfg, log
        autocast_for(cfg.device, cfg.precision)  # a bad --precision fails before any work
        self.out = Path(cfg.out)
        self.ckpt_path = self.out / "checkpoint"
        state = None
        if cfg.resume:
            try:
                state = load_checkpoint(self.ckpt_path)
            except CheckpointNotFoundError:
                raise SystemExit(f"coop train: --resume given but there is no checkpoint in {self.ckpt_path}; "
                                 "start without --resume") from None
        text = load_corpus(cfg)
        hf = None
        if cfg.init_from:  # the shape comes from the directory (or, resuming, from the checkpoint)
            saved_shape = GPTConfig.from_dict(state["model_config"]) if state else None
            hf = None if state else read_hf_dir(cfg.init_from, cfg.dropout)
            self.cfg = cfg = replace(cfg, **model_shape(saved_shape or hf.config))
        if state:
            self.tokenizer = tokenizer_from_json(state["tokenizer"])
        else:
            self.tokenizer = hf.tokenizer if hf else build_tokenizer(cfg, text)
        data = encode_corpus_in_memory(text, self.tokenizer)
        if len(data) < 2 * (cfg.block_size + 1) / max(cfg.val_fraction, 1e-9):
            raise SystemExit(f"coop train: the corpus has only {len(data)} tokens, too few for block size "
                             f"{cfg.block_size}; give more text or a smaller --block-size")
        self.train_data, self.val_data = data.split(cfg.val_fraction)

        vocab = self.tokenizer.vocab_size
        if cfg.init_from:  # GPT-2's vocabulary may be padded beyond its tokenizer's
            vocab = GPTConfig.from_dict(state["model_config"]).vocab_size if state else hf.config.vocab_size
        model_cfg = GPTConfig(vocab_size=vocab, block_size=cfg.block_size, n_layer=cfg.n_layer,
                              n_head=cfg.n_head, n_embd=cfg.n_embd, dropout=cfg.dropout, bias=cfg.bias)
        if state:
            saved = GPTConfig.from_dict(state["model_config"])
            if saved != model_cfg:
                raise SystemExit(f"coop train: the checkpoint's model {saved} differs from the options given "
                                 f"{model_cfg}; resume with the same model options")
        engine.manual_seed(cfg.seed)
        self.model = GPT(model_cfg).to(cfg.device)
        if hf:
            load_weights(self.model, hf.weights)
            self.log(f"initialised from {cfg.init_from} (GPT-2: {cfg.n_layer} layers, {cfg.n_embd} wide, "
                     f"vocab {vocab}, {self.tokenizer!r})")
        self.optimizer = make_optimizer(self.model, "adamw", cfg.lr, cfg.weight_decay, (0.9, cfg.beta2))
        # --gpus: rank r draws its own batches (rank 0 those of a one-GPU run); rank 0 evaluates and saves
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.rng = np.random.default_rng(cfg.seed + 1_000_003 * self.rank)
        step = 0
        self.history: list[dict] = []
        if state:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.rng.bit_generator.state = state["data_rng"]
            engine.set_rng_state(state["engine_rng"])
            step = int(state["step"])
            self.history = list(state["history"])
            self.log(f"resumed from {self.ckpt_path} at step {step}")
        # with a process group, every step's gradients are averaged over the ranks (after the
        # checkpoint's weights are in, so the wrap's broadcast from rank 0 carries them)
        stepped = DistributedDataParallel(self.model) if dist.is_initialized() else self.model
        self.train_step_fn = TrainStep(stepped, self.optimizer, device=cfg.device, lr=cfg.lr, min_lr=cfg.min_lr,
                                       warmup_steps=cfg.warmup_steps, total_steps=cfg.max_steps,
                                       precision=cfg.precision, grad_clip=cfg.grad_clip, grad_accum=cfg.grad_accum,
                                       graph=cfg.graph)
        self.train_step_fn.step_count = step

    @property
    def step(self) -> int:
        return self.train_step_fn.step_count

    def lr_at(self, step: int) -> float:
        return self.train_step_fn.lr_at(step)

    def train_step(self) -> engine.Tensor:
        """One optimiser step over grad_accum micro-batches; the loss stays on the device."""
        batches = [self.train_data.get_batch(self.cfg.batch_size, self.cfg.block_size, self.rng)
                   for _ in range(self.cfg.grad_accum)]
        if self.cfg.grad_accum == 1:
            return self.train_step_fn(*batches[0])  # (B, T)
        return self.train_step_fn(np.stack([b[0] for b in batches]), np.stack([b[1] for b in batches]))  # (A, B, T)

    def evaluate(self) -> dict:
        rng = np.random.default_rng(10_000 + self.cfg.seed)  # the same windows every evaluation
        splits = (("train", self.train_data),) if self.cfg.eval_train else ()
        return {name: evaluate(self.model, (data.get_batch(self.cfg.batch_size, self.cfg.block_size, rng)
                                            for _ in range(self.cfg.eval_batches)), self.cfg.device, self.cfg.precision)
                for name, data in splits + (("val", self.val_data),)}

    def save(self) -> None:
        save_checkpoint(self.ckpt_path, model=self.model.state_dict(), optimizer=self.optimizer.state_dict(),
                        step=self.step, data_rng=self.rng.bit_generator.state, engine_rng=engine.get_rng_state(),
                        model_config=self.model.config.to_dict(), train_config=asdict(self.cfg),
                        tokenizer=self.tokenizer.to_json(), history=self.history)

    def sample(self, prompt: str = "\n", tokens: int | None = None, temperature: float = 0.8, top_k: int = 40) -> str:
        ids = self.tokenizer.encode(prompt) or [0]
        idx = engine.tensor([ids], device=self.cfg.device)
        out = self.model.generate(idx, tokens or self.cfg.sample_tokens, temperature=temperature, top_k=top_k,
                                  generator=np.random.default_rng(self.cfg.seed))
        return self.tokenizer.decode(out.numpy()[0].tolist())


def train(cfg: TrainConfig, log=print) -> dict:
    """Run (or resume) a training run; returns a summary with the final losses. With a process
    group (`coop train --gpus`), every rank trains and rank 0 alone logs, evaluates and saves."""
    if dist.get_rank() != 0:
        return _follow_training(cfg)
    t = Trainer(cfg, log)
    t.out.mkdir(parents=True, exist_ok=True)
    n_params = t.model.num_parameters()
    tokens_per_step = cfg.batch_size * cfg.block_size * cfg.grad_accum * t.world_size
    log(f"model: {n_params / 1e6:.2f}M parameters, vocab {t.tokenizer.vocab_size}, "
        f"device {describe_device(cfg.device)}; data: {len(t.train_data):,} train / {len(t.val_data):,} val tokens; "
        f"{tokens_per_step:,} tokens per step")
    progress = Progress(total=cfg.max_steps, start=t.step, quiet=cfg.quiet)
    pending = []  # losses not yet read back: one host sync per log line, not per step
    start = time.perf_counter()
    metrics_path = t.out / "metrics.jsonl"
    interrupt = Interrupt()
    with open(metrics_path, "a", encoding="utf-8") as metrics, interrupt:
        while t.step < cfg.max_steps:
            pending.append(t.train_step())
            if interrupt.asked:  # Ctrl-C: the step is whole, so the checkpoint is a consistent one
                t.save()
                log(f"\ninterrupted at step {t.step}: checkpoint written to {t.ckpt_path} (--resume continues from it)")
                raise KeyboardInterrupt
            last = t.step == cfg.max_steps
            if every(t.step, cfg.log_every) or last:
                loss = float(engine.stack(pending).mean().item())
                pending.clear()
                progress.update(t.step, f"loss {loss:.4f}  lr {t.lr_at(t.step - 1):.2e}",
                                tokens=tokens_per_step * cfg.log_every)
            if every(t.step, cfg.eval_every) or last:
                ev = t.evaluate()
                record = {"step": t.step, "train_loss": ev.get("train"), "val_loss": ev["val"],
                          "elapsed_s": round(time.perf_counter() - start, 3)}
                t.history.append(record)
                metrics.write(json.dumps(record) + "\n")
                metrics.flush()
                train_part = f"train loss {ev['train']:.4f}, " if "train" in ev else ""
                progress.note(f"step {t.step}: {train_part}val loss {ev['val']:.4f}")
            if every(t.step, cfg.checkpoint_every) or last:
                t.save()
    progress.close()
    elapsed = time.perf_counter() - start
    final = t.history[-1] if t.history else t.evaluate()
    best = min(t.history, key=lambda r: r["val_loss"]) if t.history else {"step": t.step, "val_loss": final["val"]}
    summary = {"steps": t.step, "train_loss": final.get("train_loss", final.get("train")),
               "val_loss": final.get("val_loss", final.get("val")), "best_val_loss": best["val_loss"],
               "best_step": best["step"], "seconds": round(elapsed, 2), "parameters": n_params,
               "checkpoint": str(t.ckpt_path)}
    if cfg.sample_tokens:
        summary["sample"] = t.sample()
        log("sample:\n" + summary["sample"])
    train_part = f"train loss {summary['train_loss']:.4f}, " if summary["train_loss"] is not None else ""
    log(f"done: {t.step} steps in {format_duration(elapsed)}, {train_part}val loss {summary['val_loss']:.4f} "
        f"(best {summary['best_val_loss']:.4f} at step {summary['best_step']}); checkpoint in {t.ckpt_path}")
    return summary


def _follow_training(cfg: TrainConfig) -> dict:
    """A rank other than 0 of `coop train --gpus`: the same steps on its own batches, nothing written."""
    t = Trainer(cfg, log=lambda *a, **k: None)
    with Interrupt() as interrupt:  # Ctrl-C: this rank too stops after its step, as rank 0 does
        while t.step < cfg.max_steps:
            t.train_step()
            if interrupt.asked:
                raise KeyboardInterrupt
    engine.cuda.synchronize()
    return {"steps": t.step}


def add_parser(subparsers) -> None:
    # default SUPPRESS: a flag not given is absent from args, so --config's value (or the field's default) stands
    p = subparsers.add_parser("train", help="train a GPT on a text corpus in this process",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                              argument_default=argparse.SUPPRESS)
    p.add_argument("--config", metavar="FILE", help="a TOML file of these options (max_steps = 100, ...); "
                   "the flags given override it")
    p.add_argument("--data", nargs="+", help="text file(s) to train on (default: Python's standard library source)")
    notes = {"eval_every": "steps between evaluations, 0: only at the end",
             "checkpoint_every": "steps between checkpoints, 0: only at the end",
             "log_every": "steps between progress lines", "sample_tokens": "tokens sampled at the end, 0: none",
             "precision": "auto: bf16 autocast on a GPU, fp32 on the CPU; fp8: bf16 with FP8 linear layers "
                          "(a GPU with FP8 tensor cores: Hopper or later)"}
    for f in fields(TrainConfig):
        if f.name in ("data", "resume", "quiet", "graph", "eval_train", "bias", "init_from"):
            continue
        flag = "--" + f.name.replace("_", "-")
        if f.name == "device":
            p.add_argument(flag, metavar="DEVICE", help=DEVICE_HELP)
            continue
        choices = {"tokenizer": TOKENIZERS, "precision": PRECISIONS}.get(f.name)
        from_model = "; with --init-from: the model's" if f.name in MODEL_SHAPE else ""
        p.add_argument(flag, type=type(f.default), choices=choices,
                       help=f"{notes.get(f.name, '')} (default: {f.default}{from_model})".lstrip())
    p.add_argument("--eval-train", action=argparse.BooleanOptionalAction,
                   help="also measure the train split at each evaluation (default: on)")
    p.add_argument("--bias", action=argparse.BooleanOptionalAction,
                   help="biases in the Linear and LayerNorm layers (default: on; nanoGPT's shakespeare_char "
                        "recipe trains without: --no-bias)")
    p.add_argument("--init-from", metavar="HF_DIR",
                   help="start from a Hugging Face GPT-2 directory (config.json, model.safetensors, tokenizer.json): "
                        "its weights, its shape and its tokenizer, which the corpus is then tokenized with")
    p.add_argument("--graph", action=argparse.BooleanOptionalAction,
                   help="on a GPU, replay each training step as one captured CUDA graph (default: on; "
                        "--no-graph runs every op from Python)")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    launch.add_gpus_options(p)
    p.set_defaults(run=run)


def shape_disagreements(init_from: str, given: dict) -> list[str]:
    """The model options given on the command line that differ from the directory's (HFFormatError if unreadable)."""
    shape = model_shape(from_hf_config(read_hf_config(init_from))[0])
    bad = []
    for name, value in given.items():
        if value != shape[name]:
            flag = ("--bias" if value else "--no-bias") if name == "bias" else f"--{name.replace('_', '-')} {value}"
            bad.append(f"{flag} (the model's: {'biases' if name == 'bias' else shape[name]})")
    return bad


def run(args) -> int:
    place = launch.current_rank()
    if place is not None:  # a rank of --gpus: its one GPU (or the CPU)
        args.device = place.device
    given, config_file = given_options(args, TrainConfig), getattr(args, "config", None)
    try:
        cfg = build_options(TrainConfig, given, config_file)
    except OptionsError as error:
        print(f"coop train: {error}", file=sys.stderr)
        return 2
    if problem := launch.launch_problem("coop train", args):
        print(problem, file=sys.stderr)
        return 2
    if launch.wants_launch(args):  # --gpus: one rank per GPU, each step's gradients averaged over them
        return launch.launch("coop train", "coop.cli", getattr(args, "argv", sys.argv[1:]), args)
    # the model options given (flags, or the file) must agree with --init-from's directory
    chosen = {**(read_options_file(config_file, TrainConfig) if config_file else {}), **given}
    shape_given = {name: chosen[name] for name in MODEL_SHAPE if name in chosen}
    if place is not None:  # a rank of --gpus: into the launcher's process group first
        try:
            launch.init_rank_group(place)
        except dist.DistributedError as error:
            print(f"coop train: rank {place.rank}: {error}", file=sys.stderr)
            return 1
    try:
        if cfg.init_from and (bad := shape_disagreements(cfg.init_from, shape_given)):
            raise HFFormatError(f"{'; '.join(bad)}; leave these options out, the shape comes from the directory")
        train(cfg)
    except (HFFormatError, ModelSourceError) as error:
        print(f"coop train: --init-from {cfg.init_from}: {error}", file=sys.stderr)
        return 2
    except dist.DistributedError as error:
        print(f"\ncoop train: rank {place.rank if place else 0}: {error}", file=sys.stderr)
        return 1
    finally:
        if place is not None:
            try:
                dist.destroy_process_group()
            except dist.DistributedError:
                pass
    return 0


__all__ = ["TrainConfig", "Trainer", "train", "math"]
