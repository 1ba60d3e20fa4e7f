"""Process helpers for the peer-to-peer end-to-end tests: real peers as subprocesses on 127.0.0.1."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from coop.gossip.identity import Identity

REPO = Path(__file__).resolve().parents[2]

_PARENT = os.getpid()
try:  # Linux: a child can ask to be SIGKILLed when the process that started it dies
    import ctypes

    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    _prctl = None


def child_preexec() -> None:
    """`preexec_fn` of every process the e2e tests start.

    - SIGINT back to its default: a shell starts a background job (`pytest ... &`, nohup) with
      SIGINT ignored, the child inherits that, and Python then never raises KeyboardInterrupt: a
      test that sends SIGINT to play Ctrl-C would see a process that ignores it.
    - Killed with the test process (PR_SET_PDEATHSIG): no stray servers or peers even when pytest
      itself is killed (CI timeout, SIGTERM) before its fixtures' teardown runs.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if _prctl is not None and os.getpid() != _PARENT:
        _prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != _PARENT:  # the parent died before the call: nobody will kill us
            os._exit(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PeerProcess:
    """One `python -m coop.gossip.peer start|join ...` (or `-m coop.worker_cli join ...`) process with its log file.
    Its key is made here first (`--key`), so that the test knows its peer id (derived from the key) before it starts."""

    def __init__(self, name: str, args: list[str], log_dir: Path, token: str, module: str = "coop.gossip.peer"):
        key_path = log_dir / f"{name}.key"
        self.peer_id = Identity.load_or_create(key_path).peer_id
        self.name, self.port = name, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = token
        self.log_path = log_dir / f"{name}.log"
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        self._log = open(self.log_path, "w")  # noqa: SIM115 (the process writes to it until stop())
        self.process = subprocess.Popen([sys.executable, "-m", module, *args, "--port", str(self.port),
                                         "--token", token, "--key", str(key_path)], cwd=REPO, env=env,
                                        stdout=self._log, stderr=subprocess.STDOUT, preexec_fn=child_preexec)

    def status(self) -> dict[str, Any] | None:
        try:
            response = httpx.get(f"{self.url}/v1/status", timeout=5)
            return response.json() if response.status_code == 200 else None
        except httpx.HTTPError:
            return None

    def status_now(self, timeout: float = 30) -> dict[str, Any]:
        """The status, asked again while the peer is too busy to answer in time (status() is None)."""
        return wait_until(self.status, timeout, f"{self.name} to answer GET /v1/status", [self])

    def state(self) -> bytes:
        response = httpx.get(f"{self.url}/v1/state", headers={"Authorization": f"Bearer {self.token}"}, timeout=30)
        response.raise_for_status()
        return response.content

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.alive():
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return f"--- {self.name} ({self.log_path}) ---\n" + "\n".join(text[-lines:])


def wait_until(condition: Callable[[], Any], timeout: float, what: str, peers: list[PeerProcess] = (),
               interval: float = 0.25) -> Any:
    """Poll `condition` until it returns something truthy; on timeout fail with the peers' logs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        crashed = [p for p in peers if p.process.poll() not in (None, 0, -9)]  # -9: killed on purpose
        if crashed:
            logs = "\n".join(p.log_tail() for p in crashed)
            raise AssertionError(f"peer {crashed[0].name} exited with {crashed[0].process.poll()} while waiting "
                                 f"for {what}\n{logs}")
        value = condition()
        if value:
            return value
        time.sleep(interval)
    logs = "\n".join(p.log_tail() for p in peers)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{logs}")
