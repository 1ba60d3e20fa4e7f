"""The HTTP worker: `coop-worker join URL` against a coordinator.

    join -> download the data shard -> loop:
        download the global weights of the open round r
        train K inner steps from them (coop.replica.Replica, on --device)
        upload the encoded pseudo-gradient for round r
        long-poll until round r closes (re-uploading if a restarted coordinator lost it)
    until the run is done.

Network errors and coordinator restarts are retried with exponential backoff; a worker whose
token the coordinator no longer knows joins again and carries on at the current round. Ctrl-C
(or SIGTERM) leaves the run cleanly.
"""
from __future__ import annotations

import logging
import random
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from engine.data import TokenDataset
from engine.nn import GPTConfig

from .codec import get_codec
from .progress import Progress, format_duration
from .replica import InnerConfig, Replica
from .wire import WireError, pack, unpack

log = logging.getLogger("coop.worker")
UPLOAD_CHUNK = 8 << 20  # memoryview slices of 8 MB: httpx uploads them ~6x faster than one bytes object


class WorkerError(Exception):
    """The worker cannot go on (the message says why and what to do)."""


class NeedsRejoin(Exception):
    """The coordinator does not know our token (it lost its state, or we were removed): join again."""


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


def upload_chunks(body: bytes | bytearray | memoryview, chunk: int = UPLOAD_CHUNK) -> Iterator[memoryview]:
    view = memoryview(body).cast("B")
    for start in range(0, view.nbytes, chunk):
        yield view[start : start + chunk]


class CoordinatorClient:
    """httpx with the worker's token, retries with backoff, and errors turned into exceptions."""

    RETRY_STATUS = {502, 503, 504}

    def __init__(self, url: str, retry_for_s: float, timeout_s: float):
        self.url = url.rstrip("/")
        self.retry_for_s = retry_for_s
        timeout = httpx.Timeout(timeout_s, connect=10.0)
        self.http = httpx.Client(base_url=self.url, timeout=timeout, follow_redirects=True)
        self.token: str | None = None
        self.bytes_up = 0
        self.bytes_down = 0

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, *, token: str | None = None, retry: bool = True,
                ok: tuple[int, ...] = (200,), **kwargs: Any) -> httpx.Response:
        """Send, retrying network errors and 502/503/504 with exponential backoff (with jitter)
        for up to retry_for_s. 401 raises NeedsRejoin; other unexpected statuses WorkerError."""
        headers = dict(kwargs.pop("headers", {}) or {})
        bearer = token or self.token
        if bearer:
            headers["Authorization"] = f"Bearer {bearer}"
        body_factory = kwargs.pop("body_factory", None)
        start, attempt = time.monotonic(), 0
        while True:
            try:
                if body_factory is not None:
                    kwargs["content"] = body_factory()  # an iterator can be consumed only once
                response = self.http.request(method, path, headers=headers, **kwargs)
            except httpx.TransportError as error:
                problem = f"{type(error).__name__}: {error}"
            else:
                if response.status_code in ok:
                    return response
                if response.status_code == 401:
                    raise NeedsRejoin(_detail(response))
                if response.status_code not in self.RETRY_STATUS:
                    raise WorkerError(f"{method} {path} -> {response.status_code}: {_detail(response)}")
                problem = f"HTTP {response.status_code}: {_detail(response)}"
            elapsed = time.monotonic() - start
            if not retry or elapsed > self.retry_for_s:
                raise WorkerError(f"cannot reach the coordinator at {self.url} ({problem}); gave up after "
                                  f"{format_duration(elapsed)}")
            delay = min(5.0, 0.25 * 2 ** min(attempt, 5)) * random.uniform(0.5, 1.0)
            if attempt == 0 or attempt % 5 == 4:
                log.warning("%s %s failed (%s); retrying", method, path, problem)
            attempt += 1
            time.sleep(delay)


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json().get("detail", response.text))[:500]
    except (ValueError, AttributeError):
        return response.text[:500]


class Heartbeat(threading.Thread):
    """Tells the coordinator every `period` seconds that this worker is alive (while it trains)."""

    def __init__(self, client: CoordinatorClient, period: float):
        super().__init__(name="coop-heartbeat", daemon=True)
        self.client, self.period = client, period
        self.stopped = threading.Event()
        self.http = httpx.Client(base_url=client.url, timeout=httpx.Timeout(10.0))

    def run(self) -> None:
        while not self.stopped.wait(self.period):
            token = self.client.token
            if not token:
                continue
            try:
                self.http.post("/v1/heartbeat", headers={"Authorization": f"Bearer {token}"}, json={})
            except httpx.HTTPError:
                pass  # the main loop sees and retries real outages

    def stop(self) -> None:
        self.stopped.set()
        self.http.close()


class Worker:
    def __init__(self, options: WorkerOptions, out=sys.stderr):
        self.options = options
        self.out = out
        self.client = CoordinatorClient(options.url, options.retry_for_s, options.timeout_s)
        self.replica: Replica | None = None
        self.run_info: dict[str, Any] = {}
        self.codec = None
        self.weights: dict[str, np.ndarray] | None = None
        self.weights_round: int | None = None
        self.contributed = 0
        self.stale = 0
        self.tokens = 0
        self.last_loss: float | None = None
        self.started = time.monotonic()
        self.heartbeat: Heartbeat | None = None
        self.progress: Progress | None = None

    def say(self, message: str) -> None:
        if self.progress is not None:
            self.progress.note(message)
        elif not self.options.quiet:
            print(message, file=self.out, flush=True)

    # -- joining -----------------------------------------------------------------------------------
    def join(self) -> None:
        response = self.client.request("POST", "/v1/join", token=self.options.token,
                                       json={"name": self.options.name[:64], "device": self.options.device[:32]})
        info = response.json()
        self.client.token = info["worker_token"]
        self.run_info = info
        shard = self.fetch_shard(info)
        if self.replica is None:
            model_config = GPTConfig.from_dict(info["model"])
            inner = InnerConfig(**info["inner"])
            self.replica = Replica(model_config, shard, inner, device=self.options.device, seed=int(info["seed"]))
            self.codec = get_codec(info["compression"]["codec"], **info["compression"]["options"])
            n_params = sum(p.numel() for p in self.replica.model.parameters())
            self.say(f"joined {self.client.url} as {info['worker_id']} at round {info['round']}: GPT "
                     f"{n_params / 1e6:.2f}M parameters, K = {info['inner_steps']}, codec "
                     f"{info['compression']['codec']}, shard {info['shard']['index']}/{info['shard']['count']} "
                     f"({len(shard):,} tokens), device {self.options.device}")
        else:  # rejoined: keep the model and the inner optimizer state, take the (maybe new) shard
            self.replica.data = shard
            self.say(f"rejoined as {info['worker_id']} at round {info['round']}")
        if self.heartbeat is None:
            self.heartbeat = Heartbeat(self.client, float(info["heartbeat_s"]))
            self.heartbeat.start()
        if self.progress is None and not self.options.quiet:
            self.progress = Progress(total=int(info["max_rounds"]), start=int(info["round"]), stream=self.out)

    def fetch_shard(self, info: dict[str, Any]) -> TokenDataset:
        shard = info["shard"]
        cache = None
        if self.options.cache_dir is not None:
            cache = Path(self.options.cache_dir) / f"shard-{info['data_id']}-{shard['index']}of{shard['count']}.safetensors"
            if cache.is_file():
                try:
                    return self._shard_from(cache.read_bytes(), info)
                except WorkerError as error:
                    log.warning("ignoring the cached shard %s: %s", cache, error)
        response = self.client.request("GET", "/v1/shard")
        body = response.content
        self.client.bytes_down += len(body)
        data = self._shard_from(body, info)
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_name(cache.name + ".tmp")
            tmp.write_bytes(body)
            tmp.replace(cache)
        return data

    @staticmethod
    def _shard_from(body: bytes, info: dict[str, Any]) -> TokenDataset:
        try:
            tensors, meta = unpack(body)
        except WireError as error:
            raise WorkerError(f"the coordinator sent a malformed shard: {error}") from None
        tokens = tensors.get("tokens")
        if tokens is None or tokens.ndim != 1 or tokens.dtype.kind != "u" or meta.get("data_id") != info["data_id"]:
            raise WorkerError("the shard is not the one the coordinator described at join (data changed?)")
        if tokens.size and int(tokens.max()) >= int(info["model"]["vocab_size"]):
            raise WorkerError("the shard has token ids beyond the model's vocabulary")
        return TokenDataset(tokens, meta.get("tokenizer"))

    # -- one round ---------------------------------------------------------------------------------
    def fetch_weights(self) -> int:
        """Download the global weights (unless ours are already the open round's). Returns the round."""
        headers = {"If-None-Match": f'"r{self.weights_round}"'} if self.weights is not None else {}
        response = self.client.request("GET", "/v1/weights", headers=headers, ok=(200, 304))
        round_number = int(response.headers["X-Coop-Round"])
        if response.status_code == 304:
            return round_number
        body = response.content
        self.client.bytes_down += len(body)
        try:
            tensors, meta = unpack(body)
        except WireError as error:
            raise WorkerError(f"the coordinator sent malformed weights: {error}") from None
        expected = {name: tuple(p.shape) for name, p in self.replica.model.named_parameters()}
        if {n: tuple(a.shape) for n, a in tensors.items()} != expected or meta.get("round") != round_number:
            raise WorkerError("the coordinator's weights do not match the model it described at join")
        self.weights, self.weights_round = tensors, round_number
        return round_number

    def encode(self, result, round_number: int) -> bytes:
        encoded = self.codec.encode(result.pseudo_gradient)
        meta = dict(encoded.metadata, round=round_number, tokens=int(result.tokens), loss=result.mean_loss,
                    train_seconds=result.seconds, worker=self.client.token.split(".")[0])
        if not np.isfinite(meta["loss"]):
            meta["loss"] = None
        return pack(encoded.tensors, meta)

    def upload(self, round_number: int, body: bytes) -> str:
        """PUT the update; returns "accepted", or the coordinator's 409 reason."""
        response = self.client.request(
            "PUT", f"/v1/rounds/{round_number}/update", ok=(200, 409), body_factory=lambda: upload_chunks(body),
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(len(body))})
        if response.status_code == 200:
            self.client.bytes_up += len(body)
            return "accepted"
        reason = response.json().get("reason", "closed")
        if reason == "duplicate":  # counted before a retry: fine
            self.client.bytes_up += len(body)
            return "accepted"
        return reason

    def wait_round_end(self, round_number: int, body: bytes | None) -> dict[str, Any]:
        """Long-poll until round r closes. If the coordinator restarted and lost our update while
        the round is still open, upload it again."""
        while True:
            info = self.client.request("GET", f"/v1/rounds/{round_number}/wait", params={"timeout_s": 25},
                                       timeout=httpx.Timeout(60.0, connect=10.0)).json()
            if info["closed"] or info["done"] or info["round"] != round_number:
                return info
            if info.get("reported") is False and info["phase"] == "open" and body is not None:
                self.say(f"round {round_number}: the coordinator does not have our update (restarted?); sending it again")
                if self.upload(round_number, body) != "accepted":
                    return info

    def run(self) -> int:
        """Train until the run is done (0), or raise KeyboardInterrupt / WorkerError."""
        self.join()
        while True:
            try:
                done = self._one_round()
            except NeedsRejoin as error:
                self.say(f"the coordinator does not know this worker ({error}); joining again")
                self.client.token = None
                self.join()
                continue
            if done:
                return 0

    def _one_round(self) -> bool:
        """Returns True when the worker should stop (run done or --max-rounds reached)."""
        round_number = self.fetch_weights()
        info = self.client.request("POST", "/v1/heartbeat", json={}).json()
        if info["done"]:
            self.say(f"the run is done at round {info['round']}")
            return True
        if info["round"] != round_number:  # moved on between the two requests
            return False
        if info.get("phase", "open") != "open":  # being aggregated: an update now would be refused
            self.wait_round_end(round_number, None)
            return False
        result = self.replica.run_round(self.weights, int(self.run_info["inner_steps"]))
        body = self.encode(result, round_number)
        outcome = self.upload(round_number, body)
        if outcome == "accepted":
            self.contributed += 1
            self.tokens += result.tokens
            self.last_loss = result.mean_loss
            self._progress(round_number, result, len(body))
            end = self.wait_round_end(round_number, body)
            if self.options.max_rounds is not None and self.contributed >= self.options.max_rounds:
                self.say(f"contributed {self.contributed} rounds (--max-rounds); leaving")
                return True
            return bool(end["done"])
        self.stale += 1
        self.say(f"round {round_number}: update refused ({outcome}); resynchronising")
        if outcome == "aggregating":
            self.wait_round_end(round_number, None)
        return outcome == "done"

    def _progress(self, round_number: int, result, nbytes: int) -> None:
        rate = result.tokens / max(result.seconds, 1e-9)
        message = (f"round {round_number}  loss {result.mean_loss:.4f}  train {rate:,.0f} tok/s  "
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
        elapsed = time.monotonic() - self.started
        loss = "-" if self.last_loss is None else f"{self.last_loss:.4f}"
        return (f"{self.contributed} rounds contributed ({self.stale} refused as stale), {self.tokens:,} tokens, "
                f"last local loss {loss}, up {self.client.bytes_up / 1e6:.1f} MB, down "
                f"{self.client.bytes_down / 1e6:.1f} MB in {format_duration(elapsed)}")

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


__all__ = ["WorkerOptions", "Worker", "run_worker", "upload_chunks", "CoordinatorClient"]
