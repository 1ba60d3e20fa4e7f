"""The HTTP service end to end: a real coordinator and N real workers (processes, 127.0.0.1), R rounds.

Prints one JSON line per configuration, next to one process training alone on the same device in
the same run (coop.training's TrainStep, the step `coop train` and every worker take):

- utilisation: each worker's time in inner steps over the wall time of its rounds (from the worker's
  summary line: from its first round's start, so the join and set-up are left out), and the mean;
  the same after each worker's first round (steady_*: what a long run sees once the first full
  download, the graph captures and the wait for everyone to join are behind it);
  the seconds per round outside them (download, upload, eval, wait, other), and the GPU's own busy
  fraction over the rounds (nvidia-smi);
- aggregate tokens/s of the swarm (every accepted token over the rounds' wall time) against the
  lone process's tokens/s (with N workers sharing one GPU, 1.0 means the service costs nothing);
- time per round (the coordinator's history: open -> closed), the close (aggregation, outer step,
  checkpoint), and the bytes each way per worker per round.

    python bench/service.py --device cuda --model m10 --workers 4 --inner-steps 100 --rounds 8
    python bench/service.py --model tiny --workers 2 --inner-steps 5 --rounds 3     # a CPU smoke run
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

MODELS = {  # name -> [model] section and batch size
    "tiny": (dict(n_layer=2, n_head=2, n_embd=32, block_size=32), 8),
    "m10": (dict(n_layer=6, n_head=6, n_embd=384, block_size=256), 16),  # the 10.8M shakespeare model
    "m124": (dict(n_layer=12, n_head=12, n_embd=768, block_size=1024), 8),  # GPT-2 small
}
SUMMARY = re.compile(r"inner steps ([\d.]+) s of ([\d.]+) s of rounds \([\d]+%; outside them: ([^)]*)\)")
STEADY = re.compile(r"after the first round, in " + SUMMARY.pattern)
PART = re.compile(r"(\w+) ([\d.]+) s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_toml(args, model: dict, batch: int) -> str:
    data = f'path = "{args.data}"' if args.data else f"default_chars = {args.default_chars}"
    return f"""seed = 0
[model]
{chr(10).join(f"{k} = {v}" for k, v in model.items())}
[data]
{data}
shards = {args.workers}
[inner]
steps = {args.inner_steps}
batch_size = {batch}
warmup_steps = 10
[outer]
fragments = {args.fragments}
overlap_steps = {args.overlap_steps}
{"" if args.eager is None else f"eager = {str(args.eager).lower()}"}
[compression]
codec = "{args.codec}"
downlink = "{args.downlink}"
[rounds]
max_rounds = {args.rounds}
eval_every = {args.eval_every}
eval_batches = {args.eval_batches}
[coordinator]
min_workers = {args.workers}
quorum_fraction = 1.0
min_deadline_s = 600
max_deadline_s = 3600
worker_timeout_s = 600
heartbeat_s = 5
"""


def alone_tokens_per_s(args, model: dict, batch: int) -> float:
    """One process training alone on the device: tokens/s of TrainStep after a warm-up."""
    import numpy as np

    import engine
    from coop.replica import InnerConfig, Replica
    from engine.data import TokenDataset
    from engine.nn import GPTConfig

    vocab = 256
    data = TokenDataset(np.random.default_rng(0).integers(0, vocab, 1 << 20).astype(np.uint16))
    replica = Replica(GPTConfig(vocab_size=vocab, **model), data,
                      InnerConfig(batch_size=batch, block_size=model["block_size"], total_steps=10_000),
                      device=args.device)
    for _ in range(10):  # warm-up: the graph capture, cuBLASLt's heuristics
        replica.train_step()
    engine.stack([replica.train_step() for _ in range(2)]).numpy()
    steps = max(20, args.inner_steps)
    start = time.perf_counter()
    engine.stack([replica.train_step() for _ in range(steps)]).numpy()
    return steps * batch * model["block_size"] / (time.perf_counter() - start)


class GpuBusy:
    """The GPU's own busy fraction over the rounds: nvidia-smi's utilization.gpu (the share of time
    a kernel was running), sampled every 200 ms and timestamped here; None where nvidia-smi is absent."""

    def __init__(self):
        self.samples: list[tuple[float, float]] = []
        try:
            self.process = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "200"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self.process = None
            return
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            with contextlib.suppress(ValueError):
                self.samples.append((time.time(), float(line.strip())))

    def stop(self) -> "GpuBusy":
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
        return self

    def between(self, start: float, end: float) -> float | None:
        busy = [v for t, v in self.samples if start <= t <= end]
        return round(sum(busy) / len(busy) / 100, 3) if busy else None


def run_service(args, model: dict, batch: int, work: Path) -> dict:
    (work / "run.toml").write_text(run_toml(args, model, batch))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    logs = []

    def start(name: str, argv: list[str]) -> subprocess.Popen:
        log = open(work / f"{name}.log", "w")  # noqa: SIM115 (the process writes to it)
        logs.append(log)
        return subprocess.Popen([sys.executable, "-m", *argv], stdout=log, stderr=subprocess.STDOUT, env=env)

    coordinator = start("coordinator", ["coop.coordinator.cli", "serve", "--config", str(work / "run.toml"),
                                        "--state-dir", str(work / "state"), "--port", str(port)])
    workers = []
    try:
        started = time.perf_counter()
        while True:
            try:
                if httpx.get(url + "/v1/info", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if coordinator.poll() is not None or time.perf_counter() - started > 300:
                raise SystemExit(f"the coordinator did not start: {(work / 'coordinator.log').read_text()[-2000:]}")
            time.sleep(0.2)
        ready_s = time.perf_counter() - started
        link = (["--limit-rate", args.limit_rate] if args.limit_rate else []) + (
            ["--latency", args.latency] if args.latency else [])
        gpu = GpuBusy() if args.device.startswith("cuda") else None
        workers = [start(f"worker{i}", ["coop.worker_cli", "join", url, "--name", f"worker{i}", "--device",
                                        args.device, "--cache-dir", "none", "--quiet", *link])
                   for i in range(args.workers)]
        for i, worker in enumerate(workers):
            if worker.wait(timeout=args.timeout) != 0:
                raise SystemExit(f"worker{i} failed: {(work / f'worker{i}.log').read_text()[-2000:]}")
        status = httpx.get(url + "/v1/status", timeout=30).json()
        busy = gpu.stop() if gpu is not None else None
    finally:
        for process in [*workers, coordinator]:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
        for log in logs:
            log.close()
    rounds = [h for h in status["history"] if h.get("round") is not None]
    logs_text = [(work / f"worker{i}.log").read_text() for i in range(args.workers)]
    utilisation, outside = busy_of(logs_text, SUMMARY, len(rounds))
    steady, steady_outside = busy_of(logs_text, STEADY, len(rounds) - 1)
    wall = rounds[-1]["closed_at"] - (rounds[0]["closed_at"] - rounds[0]["duration_s"])
    tokens = sum(r["tokens"] for r in rounds)
    per_worker_rounds = max(1, args.workers * len(rounds))
    return {"coordinator_ready_s": round(ready_s, 2), "rounds": len(rounds), "wall_s": round(wall, 2),
            "round_s": round(wall / len(rounds), 3),
            "close_s": round(sum(r.get("close_s", 0.0) for r in rounds) / len(rounds), 3) if "close_s" in rounds[0]
            else None,
            "close_parts_s": {k: round(sum(r.get("close_parts_s", {}).get(k, 0.0) for r in rounds) / len(rounds), 3)
                              for k in rounds[0].get("close_parts_s", {})},
            "utilisation": [round(u, 3) for u in utilisation],
            "utilisation_mean": round(sum(utilisation) / len(utilisation), 3) if utilisation else None,
            "outside_s_per_round": {k: round(v, 3) for k, v in outside.items()},
            # after each worker's first round: its set-up, the full download and the wait for all to join behind it
            "steady_utilisation": [round(u, 3) for u in steady],
            "steady_utilisation_mean": round(sum(steady) / len(steady), 3) if steady else None,
            "steady_outside_s_per_round": {k: round(v, 3) for k, v in steady_outside.items()},
            "gpu_busy": busy.between(rounds[0]["closed_at"] - rounds[0]["duration_s"], rounds[-1]["closed_at"])
            if busy is not None else None,
            "tokens_per_s": round(tokens / wall, 1),
            "bytes_up_per_worker_round": round(status["totals"]["bytes_in"] / per_worker_rounds),
            "bytes_down_per_worker_round": round(status["totals"]["bytes_out"] / per_worker_rounds),
            "val_loss": [r.get("val_loss") for r in status["history"]][-1]}


def busy_of(logs: list[str], summary: re.Pattern, rounds: int) -> tuple[list[float], dict[str, float]]:
    """Each worker's share of time in inner steps (from its summary line, `summary`'s clause of it),
    and the seconds per round outside them by part, averaged over the workers."""
    utilisation, outside = [], {}
    for text in logs:
        match = summary.search(text)
        if match:
            utilisation.append(float(match.group(1)) / float(match.group(2)))
            parts = {name: float(seconds) for name, seconds in PART.findall(match.group(3))}
            # the rest: the pseudo-gradient, its encoding, loading merged weights, Python between the parts
            parts["other"] = float(match.group(2)) - float(match.group(1)) - sum(parts.values())
            for name, seconds in parts.items():  # per round of this worker, averaged over the workers
                outside[name] = outside.get(name, 0.0) + seconds / max(1, rounds) / len(logs)
    return utilisation, outside


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="m10", choices=sorted(MODELS))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--inner-steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--fragments", type=int, default=1)
    ap.add_argument("--codec", default="int8")
    ap.add_argument("--downlink", default="fp32", choices=["fp32", "codec"],
                    help="[compression] downlink: codec = each round's change in the run's codec")
    ap.add_argument("--overlap-steps", type=int, default=0,
                    help="[outer] overlap_steps: train on (up to this many steps) while the round closes")
    ap.add_argument("--eager", action=argparse.BooleanOptionalAction, default=None,
                    help="[outer] eager: the overlapped steps start from the eager outer step (coop.eager); "
                    "default: the run config's (eager for an overlap of at least a quarter of the round)")
    ap.add_argument("--limit-rate", help="each worker's link, e.g. 1Gbit or 100Mbit (coop-worker join --limit-rate)")
    ap.add_argument("--latency", help="each worker's added latency, e.g. 50ms (coop-worker join --latency)")
    ap.add_argument("--eval-every", type=int, default=1)
    ap.add_argument("--eval-batches", type=int, default=20)
    ap.add_argument("--data", help="a text file (default: the stdlib corpus, --default-chars characters)")
    ap.add_argument("--default-chars", type=int, default=1_000_000)
    ap.add_argument("--timeout", type=float, default=540)
    ap.add_argument("--no-alone", action="store_true", help="skip the lone-process reference")
    args = ap.parse_args(argv)
    model, batch = MODELS[args.model]
    alone = None if args.no_alone else alone_tokens_per_s(args, model, batch)
    with tempfile.TemporaryDirectory(prefix="coop-service-") as tmp:
        result = run_service(args, model, batch, Path(tmp))
    line = {"bench": "service", "model": args.model, "device": args.device, "workers": args.workers,
            "inner_steps": args.inner_steps, "fragments": args.fragments, "overlap_steps": args.overlap_steps,
            "eager": args.eager, "codec": args.codec, "downlink": args.downlink,
            "limit_rate": args.limit_rate, "latency": args.latency,
            "eval_every": args.eval_every, **result}
    if alone:
        line["alone_tokens_per_s"] = round(alone, 1)
        line["swarm_over_alone"] = round(result["tokens_per_s"] / alone, 3)
    print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
