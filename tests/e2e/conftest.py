"""Helpers for end-to-end tests: real coordinator and worker processes on 127.0.0.1.

Every process started through the `procs` fixture is killed at the end of its test, whatever
happens. Logs go to files in the test's tmp_path and are printed when a wait times out.
"""
from __future__ import annotations

import copy
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
import yaml
from p2p_helpers import child_preexec

REPO = Path(__file__).resolve().parents[2]

# A tiny GPT and short rounds: the whole e2e file must stay within a few minutes on 2 cores.
TINY_RUN: dict[str, Any] = {
    "seed": 0,
    "model": {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 32},
    "data": {"path": "default", "default_chars": 150_000, "shards": 4, "val_fraction": 0.1},
    "inner": {"steps": 4, "batch_size": 8, "lr": 3e-3, "min_lr": 3e-3, "warmup_steps": 0},
    "outer": {"lr": 0.7, "momentum": 0.9},
    "compression": {"codec": "fp32"},
    "rounds": {"max_rounds": 8, "eval_every": 1, "eval_batches": 4},
    "coordinator": {"min_workers": 1, "quorum_fraction": 0.5, "min_deadline_s": 0.5, "max_deadline_s": 3.0,
                    "worker_timeout_s": 2.0, "heartbeat_s": 0.4},
}


def run_config(**sections: dict[str, Any]) -> dict[str, Any]:
    """TINY_RUN with some sections' keys overridden: run_config(rounds={"max_rounds": 3})."""
    config = copy.deepcopy(TINY_RUN)
    for name, values in sections.items():
        if isinstance(values, dict):
            config.setdefault(name, {}).update(values)
        else:
            config[name] = values
    return config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""), PYTHONUNBUFFERED="1",
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("COOP_TOKEN", None)
    return env


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, logs: list[Path] = (), interval=0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except (httpx.TransportError, httpx.HTTPStatusError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name} ---\n{p.read_text(errors='replace')[-3000:]}" for p in logs if p.exists())
            pytest.fail(f"timed out after {timeout}s waiting for {what}\n{tails}")
        time.sleep(interval)


class Process:
    def __init__(self, args: list[str], log: Path):
        self.args, self.log = args, log
        self.popen: subprocess.Popen | None = None

    def start(self) -> Process:
        if getattr(self, "log_file", None):  # started again (a restart): the log goes on
            self.log_file.close()
        self.log_file = open(self.log, "ab")
        self.popen = subprocess.Popen([sys.executable, *self.args], stdout=self.log_file, stderr=subprocess.STDOUT,
                                      env=child_env(), cwd=REPO, preexec_fn=child_preexec)
        return self

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive():
            self.popen.send_signal(sig)
            self.popen.wait(timeout=30)

    def wait(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.log.name}: still running after {timeout}s\n{self.output()[-3000:]}")

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


class Coordinator(Process):
    def __init__(self, tmp_path: Path, config: dict[str, Any], token: str | None = "run-secret", name: str = "coordinator"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = token
        self.state_dir = tmp_path / "state"
        self.config_path = tmp_path / "run.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        args = ["-m", "coop.coordinator.cli", "serve", "--config", str(self.config_path), "--state-dir",
                str(self.state_dir), "--port", str(self.port)]
        if token:
            args += ["--token", token]
        super().__init__(args, tmp_path / f"{name}.log")

    def start(self) -> Coordinator:
        super().start()
        wait_until(lambda: self._up(), 60, "the coordinator to answer /v1/info", [self.log])
        return self

    def _up(self) -> bool:
        if not self.alive():
            pytest.fail(f"the coordinator exited with {self.popen.returncode}:\n{self.output()[-3000:]}")
        return httpx.get(self.url + "/v1/info", timeout=2).status_code == 200

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def status(self) -> dict[str, Any]:
        response = httpx.get(self.url + "/v1/status", headers=self.headers(), timeout=10)
        response.raise_for_status()
        return response.json()

    def wait_status(self, predicate: Callable[[dict], bool], timeout: float, what: str, logs: list[Path] = ()) -> dict:
        def check():
            status = self.status()
            return status if predicate(status) else None

        return wait_until(check, timeout, what, [self.log, *logs])


class Worker(Process):
    def __init__(self, tmp_path: Path, coordinator: Coordinator, name: str, *extra: str):
        args = ["-m", "coop.worker_cli", "join", coordinator.url, "--name", name, "--cache-dir", "none",
                "--retry-for", "60", *extra]
        if coordinator.token:
            args += ["--token", coordinator.token]
        super().__init__(args, tmp_path / f"{name}.log")


@pytest.fixture
def procs():
    """Track started processes; SIGKILL whatever is still running at the end of the test."""
    started: list[Process] = []

    def track(process: Process) -> Process:
        started.append(process)
        return process.start()

    yield track
    for process in started:  # SIGKILL them all first, then reap: one that will not die does not spare the rest
        if process.alive():
            process.popen.send_signal(signal.SIGKILL)
    for process in started:
        try:
            if process.popen is not None:
                process.popen.wait(timeout=30)
        finally:
            if getattr(process, "log_file", None):
                process.log_file.close()
