"""`coop train`: single-process training of a GPT on a text corpus.

AdamW with warm-up + cosine, gradient accumulation and clipping, val loss every N steps, a
progress line, atomic checkpoints with --resume (bit-for-bit the same run as an uninterrupted
one), and a text sample at the end. With no --data it trains on the running Python's standard
library source, a real corpus present on every machine."""
from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

import engine
import engine.distributed as dist
from engine.checkpoint import CheckpointNotFoundError, load_checkpoint, save_checkpoint
from engine.data import (BPETokenizer, CharTokenizer, default_corpus, encode_corpus_in_memory,
                         tokenizer_from_json)
from engine.nn import GPT, GPTConfig
from engine.nn.parallel import DistributedDataParallel

from . import launch
from .progress import Progress, format_duration
from .devices import device_problem
from .training import TrainStep, autocast_for, evaluate, make_optimizer


@dataclass
class TrainConfig:
    data: list[str] | None = None  # text files; None = the embedded default corpus
    default_corpus_chars: int = 2_000_000
    tokenizer: str = "char"  # "char" or "bpe"
    vocab_size: int = 2048  # for bpe
    out: str = "runs/train"
    resume: bool = False
    device: str = "cpu"
    precision: str = "auto"  # "auto": bf16 autocast on a GPU, float32 on the CPU; or "bf16" / "fp32"
    graph: bool = True  # on a GPU, run each training step as one captured CUDA graph (engine.cuda.graphs)
    seed: int = 0
    # model
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 128
    dropout: float = 0.0
    bias: bool = True  # biases in the Linear and LayerNorm layers (nanoGPT's shakespeare_char: --no-bias)
    # optimisation
    batch_size: int = 16
    grad_accum: int = 1
    max_steps: int = 500
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 50
    weight_decay: float = 0.1
    beta2: float = 0.95
    grad_clip: float = 1.0
    # evaluation and output
    val_fraction: float = 0.1
    eval_every: int = 100
    eval_batches: int = 10
    eval_train: bool = True  # also measure the train split at each evaluation (--no-eval-train: val only)
    checkpoint_every: int = 100
    log_every: int = 10
    sample_tokens: int = 300
    quiet: bool = False

    def __post_init__(self) -> None:
        """Every option checked before any work, each violation named with what is expected."""
        checks = [
            ("tokenizer", self.tokenizer in TOKENIZERS, " or ".join(TOKENIZERS)),
            ("precision", self.precision in PRECISIONS, " | ".join(PRECISIONS)),
            ("vocab-size", self.vocab_size >= 2, "at least 2"),
            ("default-corpus-chars", self.default_corpus_chars >= 1, "at least 1"),
            *((name, getattr(self, name.replace("-", "_")) >= 1, "at least 1") for name in
              ("n-layer", "n-head", "n-embd", "block-size", "batch-size", "grad-accum", "max-steps", "eval-batches",
               "log-every")),
            ("n-embd", self.n_embd % max(1, self.n_head) == 0, f"a multiple of --n-head {self.n_head}"),
            ("eval-every", self.eval_every >= 0, "0 (only at the end) or more"),
            ("checkpoint-every", self.checkpoint_every >= 0, "0 (only at the end) or more"),
            ("sample-tokens", self.sample_tokens >= 0, "0 (no sample) or more"),
            ("lr", self.lr > 0, "more than 0"), ("min-lr", 0 <= self.min_lr, "0 or more"),
            ("warmup-steps", self.warmup_steps >= 0, "0 or more"), ("weight-decay", self.weight_decay >= 0, "0 or more"),
            ("beta2", 0 <= self.beta2 < 1, "in [0, 1)"), ("grad-clip", self.grad_clip >= 0, "0 (off) or more"),
            ("dropout", 0 <= self.dropout < 1, "in [0, 1)"), ("val-fraction", 0 < self.val_fraction < 1, "in (0, 1)"),
        ]
        bad = [f"--{name} {getattr(self, name.replace('-', '_'))!r} (expected {expected})"
               for name, ok, expected in checks if not ok]
        if bad:
            raise ValueError(f"bad option(s): {'; '.join(bad)}")


TOKENIZERS = ("char", "bpe")
PRECISIONS = ("auto", "bf16", "fp32")


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
        self.tokenizer = tokenizer_from_json(state["tokenizer"]) if state else build_tokenizer(cfg, text)
        data = encode_corpus_in_memory(text, self.tokenizer)
        if len(data) < 2 * (cfg.block_size + 1) / max(cfg.val_fraction, 1e-9):
            raise SystemExit(f"coop train: the corpus has only {len(data)} tokens, too few for block size "
                             f"{cfg.block_size}; give more text or a smaller --block-size")
        self.train_data, self.val_data = data.split(cfg.val_fraction)

        model_cfg = GPTConfig(vocab_size=self.tokenizer.vocab_size, block_size=cfg.block_size, n_layer=cfg.n_layer,
                              n_head=cfg.n_head, n_embd=cfg.n_embd, dropout=cfg.dropout, bias=cfg.bias)
        if state:
            saved = GPTConfig.from_dict(state["model_config"])
            if saved != model_cfg:
                raise SystemExit(f"coop train: the checkpoint's model {saved} differs from the options given "
                                 f"{model_cfg}; resume with the same model options")
        engine.manual_seed(cfg.seed)
        self.model = GPT(model_cfg).to(cfg.device)
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
    log(f"model: {n_params / 1e6:.2f}M parameters, vocab {t.tokenizer.vocab_size}, device {cfg.device}; "
        f"data: {len(t.train_data):,} train / {len(t.val_data):,} val tokens; {tokens_per_step:,} tokens per step")
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
    p = subparsers.add_parser("train", help="train a GPT on a text corpus in this process",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = TrainConfig()
    p.add_argument("--data", nargs="+", help="text file(s) to train on (default: Python's standard library source)")
    for f in fields(TrainConfig):
        if f.name in ("data", "resume", "quiet", "graph", "eval_train", "bias"):
            continue
        flag = "--" + f.name.replace("_", "-")
        choices = {"tokenizer": TOKENIZERS, "precision": PRECISIONS}.get(f.name)
        notes = {"eval_every": "steps between evaluations, 0: only at the end",
                 "checkpoint_every": "steps between checkpoints, 0: only at the end"}
        p.add_argument(flag, type=type(getattr(defaults, f.name)), default=getattr(defaults, f.name), choices=choices,
                       help=f"{notes.get(f.name, '')} (default: {getattr(defaults, f.name)})".lstrip())
    p.add_argument("--eval-train", action=argparse.BooleanOptionalAction, default=defaults.eval_train,
                   help="also measure the train split at each evaluation (default: on)")
    p.add_argument("--bias", action=argparse.BooleanOptionalAction, default=defaults.bias,
                   help="biases in the Linear and LayerNorm layers (default: on; nanoGPT's shakespeare_char "
                        "recipe trains without: --no-bias)")
    p.add_argument("--graph", action=argparse.BooleanOptionalAction, default=defaults.graph,
                   help="on a GPU, replay each training step as one captured CUDA graph (default: on; "
                        "--no-graph runs every op from Python)")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    launch.add_gpus_options(p)
    p.set_defaults(run=run)


def run(args) -> int:
    place = launch.current_rank()
    if place is not None:  # a rank of --gpus: its one GPU (or the CPU)
        args.device = place.device
    try:
        cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})
    except ValueError as error:
        print(f"coop train: {error}", file=sys.stderr)
        return 2
    if problem := launch.launch_problem("coop train", args):
        print(problem, file=sys.stderr)
        return 2
    if launch.wants_launch(args):  # --gpus: one rank per GPU, each step's gradients averaged over them
        return launch.launch("coop train", "coop.cli", getattr(args, "argv", sys.argv[1:]), args)
    if problem := device_problem("coop train", cfg.device):
        print(problem, file=sys.stderr)
        return 2
    if place is None:
        train(cfg)
        return 0
    try:
        launch.init_rank_group(place)
    except dist.DistributedError as error:
        print(f"coop train: rank {place.rank}: {error}", file=sys.stderr)
        return 1
    try:
        train(cfg)
        return 0
    except dist.DistributedError as error:
        print(f"\ncoop train: rank {place.rank}: {error}", file=sys.stderr)
        return 1
    finally:
        try:
            dist.destroy_process_group()
        except dist.DistributedError:
            pass


__all__ = ["TrainConfig", "Trainer", "train", "math"]
