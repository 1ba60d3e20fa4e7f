"""The HTTP worker: `coop-worker join URL` against a coordinator.

    join -> download the data shard (and the val slice) -> the round loop (coop.round.RoundLoop
    over HttpTransport):
        download the global weights of the open round r
        train K inner steps from them (coop.replica.Replica, on --device)
        upload the encoded pseudo-gradient for round r
        every eval_every rounds: evaluate the weights of round r, report their val loss
        long-poll until round r closes (re-uploading if a restarted coordinator lost it)
    until the run is done; then evaluate the final weights and report them.

Network errors and coordinator restarts are retried with exponential backoff; a worker whose
token the coordinator no longer knows joins again and carries on at the current round. Ctrl-C
(or SIGTERM) leaves the run cleanly.
"""
from __future__ import annotations

import dataclasses

import logging
import os
import re
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from engine.data import TokenDataset
from engine.nn import GPTConfig

from ..codec import get_codec
from ..eager import EagerOuter
from ..outer import NesterovSGD
from ..progress import Progress, format_duration
from ..replica import InnerConfig, Replica
from ..round import RoundLoop, RoundReport
from ..streaming import fragments
from ..throttle import Link
from ..wire import WireError, unpack
from .client import CoordinatorClient, Heartbeat, NeedsRejoin, WorkerError
from .transport import HttpTransport, ValCheck

log = logging.getLogger("coop.worker")


@dataclass
class WorkerOptions:
    url: str
    token: str | None = None  # the run's access token, for joining
    name: str = field(default_factory=socket.gethostname)
    device: str = "cpu"
    cache_dir: Path | None = None  # downloaded shards are kept here (None: not cached)
    max_rounds: int | None = None  # leave after contributing this many rounds (None: until the run ends)
    retry_for_s: float = 900.0  # give up when the coordinator is unreachable for this long
    timeout_s: float = 600.0  # for one transfer
    quiet: bool = False
    link: Link | None = None  # --limit-rate / --latency: the transfers paced as over such a link
    # makes the replica (Replica's signature); --gpus: coop.data_parallel's LeadingReplica, whose steps
    # are data parallel over the worker's GPUs. None: a plain Replica on `device`
    replica_factory: Callable[..., Replica] | None = None
    gpus: int = 1  # the GPUs training this worker's replica together (--gpus); its updates count all their tokens

    @property
    def device_label(self) -> str:
        """The device as the coordinator is told it: 'cuda', or 'cuda x2' for two GPUs (coop.contribution)."""
        return self.device if self.gpus == 1 else f"{self.device} x{self.gpus}"


# What a name from the network may hold before it becomes part of a file name: no separator, no
# "..", nothing a shell or a file system treats specially. (The coordinator's data_id is hex.)
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def shard_cache_path(cache_dir: Path, info: dict[str, Any]) -> Path:
    """Where the shard described by a join reply is cached, built only from checked parts: a
    hostile coordinator answering data_id = "/../../outside/x" gets a WorkerError, not a file
    outside `cache_dir`."""
    data_id, shard = info.get("data_id"), info.get("shard")
    if not isinstance(data_id, str) or not _SAFE_NAME.fullmatch(data_id) or ".." in data_id:
        raise WorkerError(f"the coordinator sent a data_id unfit for a file name ({data_id!r:.80}); expected "
                          "letters, digits, '_', '-', '.' (at most 128). Is this a coop coordinator you trust?")
    if not isinstance(shard, dict):
        raise WorkerError(f"the coordinator's join reply has no shard description, got {shard!r:.80}")
    index, count = shard.get("index"), shard.get("count")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (index, count)) or not 0 <= index < count <= 1 << 20:
        raise WorkerError(f"the coordinator sent shard {index!r:.20} of {count!r:.20}; expected 0 <= index < count")
    root = cache_dir.resolve()
    path = (root / f"shard-{data_id}-{index}of{count}.safetensors").resolve()
    if path.parent != root:  # cannot happen with the checks above; kept as the rule itself
        raise WorkerError(f"the shard's cache path {path} would leave --cache-dir {root}")
    return path


def eager_outer(info: dict[str, Any]) -> EagerOuter | None:
    """The eager step of the run's overlap (coop.eager), from the join's answer; None without overlap,
    with `[outer] eager = false`, or from a coordinator that does not say its outer step."""
    outer = info.get("outer")
    if not int(info.get("overlap_steps", 0)) or not isinstance(outer, dict) or not outer.get("eager"):
        return None
    schedule = NesterovSGD()
    try:  # the coordinator's NesterovSGD.hyperparameters(), checked as a saved state would be
        schedule.load_state_dict({**{k: v for k, v in outer.items() if k != "eager"}, "momentum_buffer": {}})
        return EagerOuter.of(schedule)
    except (KeyError, TypeError, ValueError) as error:
        log.warning("the coordinator's outer step is unreadable (%s); the overlap starts from the round's end", error)
        return None


class Worker:
    def __init__(self, options: WorkerOptions, out=sys.stderr):
        self.options = options
        self.out = out
        self.client = CoordinatorClient(options.url, options.retry_for_s, options.timeout_s, options.link)
        self.replica: Replica | None = None
        self.loop: RoundLoop | None = None
        self.run_info: dict[str, Any] = {}
        self.val_data: TokenDataset | None = None  # the coordinator's val slice (GET /v1/val)
        self.val_check: ValCheck | None = None
        self.contributed = 0
        self.stale = 0
        self.refused_in_a_row = 0  # reset by an accepted update
        self.tokens = 0
        self.train_seconds = 0.0  # in inner steps, over the rounds that counted
        self.merge_wait_seconds = 0.0  # blocked on a merge in the middle of a round (overlap)
        self.first_round_at: float | None = None
        # the steady state: from the end of this worker's first round (its set-up, the full download of
        # the weights and the first wait for everyone to join are behind it) to the end of its run
        self.first_report: RoundReport | None = None
        self.steady_from: tuple[float, dict[str, float]] | None = None  # (when, the transport's `spent` then)
        self.steady_train_seconds = 0.0
        self.steady_merge_wait_seconds = 0.0
        self.unsettled: RoundReport | None = None  # sent in the background, its answer not yet counted
        self.transport: HttpTransport | None = None
        self.last_loss: float | None = None
        self.started = time.monotonic()
        self.heartbeat: Heartbeat | None = None
        self.progress: Progress | None = None

    def _overlap_said(self, info: dict[str, Any]) -> str:
        steps = int(info.get("overlap_steps", 0))
        if not steps:
            return ""
        start = "the eager outer step" if self.replica.eager is not None else "the round's end"
        return f"; overlap up to {steps} steps, from {start}"

    def say(self, message: str) -> None:
        if self.progress is not None:
            self.progress.note(message)
        elif not self.options.quiet:
            print(message, file=self.out, flush=True)

    # -- joining -----------------------------------------------------------------------------------
    def join(self) -> None:
        response = self.client.request("POST", "/v1/join", token=self.options.token,
                                       json={"name": self.options.name[:64], "device": self.options.device_label[:32]})
        info = response.json()
        self.client.token = info["worker_token"]
        self.client.use_upload_port(info.get("upload_port"), weights=info.get("weights_on_upload_port") is True)
        self.run_info = info
        shard = self.fetch_shard(info)
        every = int((info.get("eval") or {}).get("every", 0))
        if every:
            self.val_data = self._tokens_from(self.client.request("GET", "/v1/val").content, info, "val slice")
        if self.replica is None:
            model_config = GPTConfig.from_dict(info["model"])
            inner = InnerConfig(**info["inner"])
            make = self.options.replica_factory or Replica
            self.replica = make(model_config, shard, inner, device=self.options.device, seed=int(info["seed"]))
            self.replica.eager = eager_outer(info)
            shapes = {name: tuple(p.shape) for name, p in self.replica.model.named_parameters()}
            codec = get_codec(info["compression"]["codec"], **info["compression"]["options"])
            parts = fragments(shapes, int(info.get("fragments", 1)))  # streaming DiLoCo: a fragment a round
            self.val_check = ValCheck(every, int(info["max_rounds"]), self.evaluate_global, self.start_global)
            self.transport = HttpTransport(self.client, shapes, self.say, parts, self.val_check,
                                           overlap_steps=int(info.get("overlap_steps", 0)),
                                           round_steps=int(info["inner_steps"]) // len(parts),
                                           last_round=int(info["max_rounds"]) - 1)
            self.loop = RoundLoop(self.replica, codec, self.transport, int(info["inner_steps"]) // len(parts))
            n_params = sum(p.numel() for p in self.replica.model.parameters())
            self.say(f"joined {self.client.url} as {info['worker_id']} at round {info['round']}: GPT "
                     f"{n_params / 1e6:.2f}M parameters, K = {info['inner_steps']}, codec "
                     f"{info['compression']['codec']}, shard {info['shard']['index']}/{info['shard']['count']} "
                     f"({len(shard):,} tokens), device {self.options.device_label}" + self._overlap_said(info)
                     + (f", updates to {self.client.upload_url}" if self.client.upload_url else ""))
        else:  # rejoined: keep the model and the inner optimizer state, take the (maybe new) shard
            self.replica.data = shard
            self.val_check.every, self.val_check.max_rounds = every, int(info["max_rounds"])  # a restart may change them
            self.transport.last_round = int(info["max_rounds"]) - 1
            self.replica.eager = eager_outer(info)  # and its outer step (the momentum is read afresh)
            self.say(f"rejoined as {info['worker_id']} at round {info['round']}")
        if self.heartbeat is None:
            self.heartbeat = Heartbeat(self.client, float(info["heartbeat_s"]))
            self.heartbeat.start()
        if self.progress is None and not self.options.quiet:
            self.progress = Progress(total=int(info["max_rounds"]), start=int(info["round"]), stream=self.out,
                                     unit="round", steps_per_point=self.loop.inner_steps)
            self.replica.step_callback = self.progress.step  # the line moves within a round too

    def fetch_shard(self, info: dict[str, Any]) -> TokenDataset:
        cache = None
        if self.options.cache_dir is not None:
            cache = shard_cache_path(Path(self.options.cache_dir), info)
            if cache.is_file():
                try:
                    return self._tokens_from(cache.read_bytes(), info)
                except WorkerError as error:
                    log.warning("ignoring the cached shard %s: %s", cache, error)
        response = self.client.request("GET", "/v1/shard")
        body = response.content
        self.client.bytes_down += len(body)
        data = self._tokens_from(body, info)
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = cache.with_name(cache.name + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # the run's data: this user's only
            with open(fd, "wb") as f:
                f.write(body)
            tmp.replace(cache)
        return data

    @staticmethod
    def _tokens_from(body: bytes, info: dict[str, Any], what: str = "shard") -> TokenDataset:
        """The shard (or the val slice) in a body from the coordinator, checked against the join reply."""
        try:
            tensors, meta = unpack(body)
        except WireError as error:
            raise WorkerError(f"the coordinator sent a malformed {what}: {error}") from None
        tokens = tensors.get("tokens")
        if tokens is None or tokens.ndim != 1 or tokens.dtype.kind != "u" or meta.get("data_id") != info["data_id"]:
            raise WorkerError(f"the {what} is not of the data the coordinator described at join (data changed?)")
        if tokens.size and int(tokens.max()) >= int(info["model"]["vocab_size"]):
            raise WorkerError(f"the {what} has token ids beyond the model's vocabulary")
        if tokens.size <= int(info["inner"]["block_size"]):
            raise WorkerError(f"the {what} has {tokens.size} tokens, fewer than a window of block_size + 1")
        return TokenDataset(tokens, meta.get("tokenizer"))

    def evaluate_global(self, weights: dict[str, np.ndarray]) -> tuple[float, int]:
        """(mean loss, tokens) of the global weights on the val slice, on this worker's device under its
        training precision. evaluate_weights puts the replica's own weights back (a streaming replica's
        local ones train on) and draws the windows with a fixed seed. The workers share them: shard i of
        n evaluates windows i, i + n, ..., so the coordinator's token-weighted mean of the n reports is
        the whole evaluation, at 1/n of its cost to each."""
        pending, tokens = self.start_global(weights)
        return pending.result(), tokens

    def start_global(self, weights: dict[str, np.ndarray]):
        """`evaluate_global` queued beside the next round's inner steps (overlap): (its pending
        evaluation, the tokens it covers); the weights are loaded now."""
        batches = int(self.run_info["eval"]["batches"])
        count = min(int(self.run_info["shard"]["count"]), batches)
        index = int(self.run_info["shard"]["index"]) % count
        pending = self.replica.start_evaluation(weights, self.val_data, batches, part=(index, count))
        return pending, len(range(index, batches, count)) * self.replica.inner.batch_size * self.replica.inner.block_size

    # -- the rounds --------------------------------------------------------------------------------
    def run(self) -> int:
        """Train until the run is done (0), or raise KeyboardInterrupt / WorkerError."""
        self.join()
        self.first_round_at = time.monotonic()
        while True:
            try:
                report = self.loop.run_round()
            except NeedsRejoin as error:
                self.say(f"the coordinator does not know this worker ({error}); joining again")
                self.client.token = None
                self.join()
                continue
            if report is None:
                self._settle()  # the last update sent in the background
                return 0
            if self.first_report is None:
                self.first_report, self.steady_from = report, (time.monotonic(), dict(self.transport.spent))
            if self._account(report):
                return 0

    def _account(self, report: RoundReport) -> bool:
        """Count and show one round; True when the worker should stop (run done or --max-rounds reached).
        An update sent in the background (overlap) is counted once its answer came: at the next
        round's end, by when its merge has arrived, or when the run ends."""
        if self._settle():
            return True
        if report.outcome.outcome == "queued":
            self.unsettled = report
            return False
        return self._count(report)

    def _settle(self) -> bool:
        """Count the update still in the background, if any; True when the worker should stop."""
        if self.unsettled is None:
            return False
        report, self.unsettled = self.unsettled, None
        try:
            delivery = report.outcome.settled.result(timeout=600)
        except Exception as error:  # the upload failed: the round loop has said so or will
            self.say(f"round {report.round}: the upload did not complete ({type(error).__name__}: {error})")
            return False
        return self._count(dataclasses.replace(report, outcome=delivery))

    def _count(self, report: RoundReport) -> bool:
        delivery = report.outcome
        if delivery.outcome == "accepted":
            self.refused_in_a_row = 0
            self.contributed += 1
            self.tokens += report.result.tokens
            self.train_seconds += report.result.seconds
            self.merge_wait_seconds += report.result.waited
            if self.first_report is not None and report.result is not self.first_report.result:
                self.steady_train_seconds += report.result.seconds
                self.steady_merge_wait_seconds += report.result.waited
            self.last_loss = report.result.mean_loss
            self._progress(report.round, report.result, delivery.nbytes)
            if self.options.max_rounds is not None and self.contributed >= self.options.max_rounds:
                self.say(f"contributed {self.contributed} rounds (--max-rounds); leaving")
                return True
            return delivery.done
        if delivery.outcome == "diverged":
            self.say(f"round {report.round}: not sent, {report.refused}; starting again from the global weights")
            return False
        self.stale += 1
        self.refused_in_a_row += 1
        self.say(f"round {report.round}: update refused ({delivery.outcome}); resynchronising")
        if self.refused_in_a_row == 2:
            self.say(f"{self.refused_in_a_row} updates in a row were refused: this worker finishes its rounds after "
                     "the others' deadline closes them, so its GPU time counts for nothing; a faster device, or a "
                     "run with a longer deadline ([coordinator] deadline_factor, min_deadline_s), would let it count")
        return delivery.done

    def _progress(self, round_number: int, result, nbytes: int) -> None:
        rate = result.tokens / max(result.seconds, 1e-9)
        k = self.loop.inner_steps if self.loop is not None else 0
        fewer = f"{len(result.losses)}/{k} steps  " if 0 < len(result.losses) < k else ""  # what fit the deadline
        message = (f"round {round_number}  {fewer}loss {result.mean_loss:.4f}  train {rate:,.0f} tok/s  "
                   f"update {nbytes / 1e6:.2f} MB  up {self.client.bytes_up / 1e6:.1f} MB  "
                   f"down {self.client.bytes_down / 1e6:.1f} MB")
        if self.progress is not None:
            self.progress.update(round_number + 1, message, tokens=result.tokens)
        log.info(message)

    # -- leaving -----------------------------------------------------------------------------------
    def leave(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if self.client.token:
            try:
                self.client.request("POST", "/v1/leave", retry=False, timeout=5.0)
            except (WorkerError, NeedsRejoin, httpx.HTTPError):
                pass
            self.client.token = None

    def summary(self) -> str:
        now = time.monotonic()
        elapsed = now - self.started
        loss = "-" if self.last_loss is None else f"{self.last_loss:.4f}"
        trained = self.replica.tokens_seen if self.replica is not None else 0
        thrown = f" (of {trained:,} trained: the rest was in updates not taken)" if trained > self.tokens else ""
        line = (f"{self.contributed} rounds contributed ({self.stale} refused as stale), {self.tokens:,} tokens"
                f"{thrown}, last local loss {loss}, up {self.client.bytes_up / 1e6:.1f} MB, down "
                f"{self.client.bytes_down / 1e6:.1f} MB in {format_duration(elapsed)}")
        if self.first_round_at is None or self.transport is None:
            return line
        # from the first round's start (the join, the shard's download and the set-up are not rounds)
        rounds = now - self.first_round_at
        spent = dict(self.transport.spent)
        spent["wait"] += self.merge_wait_seconds
        line += f"; in inner steps {self.busy(self.train_seconds, rounds, spent)}"
        if self.steady_from is not None and self.steady_train_seconds > 0:
            since, spent_then = self.steady_from
            steady = {name: seconds - spent_then.get(name, 0.0) for name, seconds in self.transport.spent.items()}
            steady["wait"] += self.steady_merge_wait_seconds
            steady_part = self.busy(self.steady_train_seconds, now - since, steady)
            line += f"; after the first round, in inner steps {steady_part}"
        return line

    @staticmethod
    def busy(train_seconds: float, seconds: float, outside: dict[str, float]) -> str:
        """'T s of S s of rounds (P%; outside them: download D s, ...)' of the summary line."""
        parts = ", ".join(f"{name} {spent:.2f} s" for name, spent in outside.items())
        return (f"{train_seconds:.2f} s of {seconds:.2f} s of rounds "
                f"({100 * train_seconds / max(seconds, 1e-9):.0f}%; outside them: {parts})")

    def close(self) -> None:
        self.leave()
        self.client.close()


def run_worker(options: WorkerOptions, out=sys.stderr) -> int:
    """Join the coordinator at options.url and train until the run ends. Exit status: 0 done,
    1 gave up (unreachable / refused), 130 interrupted."""
    worker = None
    try:
        worker = Worker(options, out)  # inside the try: a Ctrl-C while setting up also leaves cleanly
        status = worker.run()
        print(f"\ncoop-worker: done: {worker.summary()}", file=out, flush=True)
        return status
    except KeyboardInterrupt:
        summary = worker.summary() if worker is not None else "nothing contributed yet"
        print(f"\ncoop-worker: interrupted; leaving the run. {summary}", file=out, flush=True)
        return 130
    except (WorkerError, NeedsRejoin) as error:
        print(f"\ncoop-worker: {error}", file=out, flush=True)
        return 1
    finally:
        if worker is not None:
            worker.close()


__all__ = ["WorkerOptions", "Worker", "run_worker"]
