"""`--gpus 0,1`: one command, one process per GPU, data parallel inside one worker.

The command the user typed becomes the launcher: it hosts the ranks' store (engine.distributed's
TCPStore on 127.0.0.1, with a fresh token), starts the same command once per GPU as a child
process (`python -m MODULE ARGV`, CUDA_VISIBLE_DEVICES set to that GPU, COOP_RANK etc. in its
environment), and watches them:

- every child exits 0: the launcher exits 0;
- a child dies or fails: the launcher says which rank (and GPU) and how, stops the others
  (SIGTERM, which the commands treat like Ctrl-C: a worker leaves its run cleanly; SIGKILL after
  a grace period) and exits 1; the ranks still running also see it through the process group
  (RankDiedError from the store, the NCCL watchdog's abort) if they get there first;
- Ctrl-C (or SIGTERM) to the launcher: SIGINT to every rank, SIGKILL after the grace period, 130.

Children run in their own session, so a Ctrl-C at the terminal reaches only the launcher, which
passes exactly one SIGINT on. In a child, `current_rank()` returns the rank's place (rank, world
size, device) and `init_rank_group()` joins the process group; rank 0 does the talking (to the
coordinator or the peers) and the others follow it (coop.data_parallel).

`--cpu-ranks N` runs N ranks on the CPU with the "cpu" backend instead: slower than one process,
it exists so that everything above the process group is exercised without a GPU (the tests).
"""
from __future__ import annotations

import argparse
import ctypes
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import engine
import engine.distributed as dist

RANK_ENV, WORLD_ENV, STORE_ENV, TOKEN_ENV, BACKEND_ENV, GPU_ENV = (
    "COOP_RANK", "COOP_WORLD_SIZE", "COOP_STORE", "COOP_STORE_TOKEN", "COOP_DIST_BACKEND", "COOP_GPU")
GRACE_S = 20.0  # how long stopped ranks get to leave cleanly before SIGKILL


def add_gpus_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("several GPUs in one process group (data parallel)")
    group.add_argument("--gpus", default=None, metavar="LIST",
                       help="train on these GPUs at once, e.g. 0,1: one process per GPU, gradients averaged over "
                            "NCCL every step; needs a CUDA build of engine with NCCL")
    group.add_argument("--cpu-ranks", type=int, default=0, metavar="N",
                       help="N processes on the CPU instead (the 'cpu' process group; for testing the "
                            "multi-process path without a GPU, slower than one process)")


def parse_gpus(text: str) -> list[int]:
    """'0,1' -> [0, 1]; ValueError (with what is expected) for anything else."""
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or not all(p.isdigit() for p in parts):
        raise ValueError(f"--gpus {text!r}: expected GPU indices separated by commas, e.g. --gpus 0,1")
    gpus = [int(p) for p in parts]
    if len(set(gpus)) != len(gpus):
        raise ValueError(f"--gpus {text!r}: a GPU is named twice")
    return gpus


def launch_problem(command: str, args: argparse.Namespace) -> str | None:
    """Why `--gpus` / `--cpu-ranks` cannot run here, as the one line to print; None when they can."""
    gpus, cpu_ranks = getattr(args, "gpus", None), int(getattr(args, "cpu_ranks", 0) or 0)
    if gpus is not None and cpu_ranks:
        return f"{command}: --gpus and --cpu-ranks exclude each other; give one"
    if cpu_ranks < 0 or cpu_ranks == 1:
        return f"{command}: --cpu-ranks {cpu_ranks}: expected 2 or more (one process needs no process group)"
    if gpus is None:
        return None
    try:
        wanted = parse_gpus(gpus)
    except ValueError as error:
        return f"{command}: {error}"
    if not engine.cuda.is_available():
        return f"{command}: --gpus {gpus} but CUDA is not available: {engine.cuda.unavailable_reason()}"
    if not dist.is_nccl_available():
        return f"{command}: --gpus {gpus} needs NCCL: {dist.nccl_unavailable_reason()}"
    have = engine.cuda.device_count()
    if max(wanted) >= have:
        return (f"{command}: --gpus {gpus} names GPU {max(wanted)}, but this machine has {have} "
                f"(0 to {have - 1}); name only GPUs that exist")
    return None


def wants_launch(args: argparse.Namespace) -> bool:
    """True in the launcher (the command the user typed with --gpus / --cpu-ranks), False in a rank."""
    return (getattr(args, "gpus", None) is not None or bool(getattr(args, "cpu_ranks", 0))) and RANK_ENV not in os.environ


@dataclass
class RankPlace:
    rank: int
    world_size: int
    backend: str  # "nccl" or "cpu"
    device: str  # what this rank trains on: "cuda" (its one visible GPU) or "cpu"
    gpu: str  # the GPU's index on the machine ("" on the CPU), for messages


def current_rank() -> RankPlace | None:
    """This process's place when the launcher started it, None otherwise."""
    if RANK_ENV not in os.environ:
        return None
    backend = os.environ.get(BACKEND_ENV, "cpu")
    return RankPlace(int(os.environ[RANK_ENV]), int(os.environ[WORLD_ENV]), backend,
                     "cuda" if backend == "nccl" else "cpu", os.environ.get(GPU_ENV, ""))


def init_rank_group(place: RankPlace, timeout: float = dist.DEFAULT_TIMEOUT) -> dist.ProcessGroup:
    """Join the launcher's process group (in a rank, before any model is built)."""
    host, _, port = os.environ[STORE_ENV].rpartition(":")
    store = dist.TCPStore(host, int(port), os.environ[TOKEN_ENV], timeout=timeout)
    return dist.init_process_group(place.backend, place.rank, place.world_size, store, timeout=timeout,
                                   device="cuda:0" if place.backend == "nccl" else None)


def launch(command: str, module: str, argv: list[str], args: argparse.Namespace, out=sys.stderr) -> int:
    """Run `python -m module *argv` once per rank and watch them (see the module's docstring)."""
    gpus = parse_gpus(args.gpus) if getattr(args, "gpus", None) is not None else []
    world = len(gpus) or int(args.cpu_ranks)
    token = secrets.token_hex(16)
    store = dist.TCPStore("127.0.0.1", 0, token, is_server=True)
    children: list[subprocess.Popen] = []
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        for rank in range(world):
            env = dict(os.environ)  # (NCCL_* settings, NVLink multicast off where set, pass through)
            env.update({RANK_ENV: str(rank), WORLD_ENV: str(world), STORE_ENV: store.address, TOKEN_ENV: token,
                        BACKEND_ENV: "nccl" if gpus else "cpu"})
            if gpus:
                env.update({"CUDA_VISIBLE_DEVICES": str(gpus[rank]), GPU_ENV: str(gpus[rank])})
            children.append(subprocess.Popen([sys.executable, "-m", module, *argv], env=env, start_new_session=True,
                                             preexec_fn=_rank_signals))
        where = f"GPUs {','.join(map(str, gpus))}" if gpus else "the CPU"
        print(f"{command}: started {world} ranks on {where}, pids {', '.join(str(c.pid) for c in children)} "
              "(rank 0 speaks for them)", file=out, flush=True)
        return _watch(command, children, gpus, out)
    except KeyboardInterrupt:
        print(f"\n{command}: interrupted; stopping {len(children)} ranks", file=out, flush=True)
        _stop(children, signal.SIGINT)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        _stop(children, signal.SIGTERM)
        store.close()


def _sigterm_as_interrupt(signum, frame):
    raise KeyboardInterrupt


try:
    _libc = ctypes.CDLL(None, use_errno=True)
except OSError:  # not Linux: the ranks then notice a dead launcher through the store instead
    _libc = None


def _rank_signals() -> None:
    """In each rank before it starts: SIGINT handled (a launcher started in the background has it
    ignored, and the ranks would inherit that), and SIGTERM when the launcher dies
    (PR_SET_PDEATHSIG), so that no rank outlives it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if _libc is not None:
        _libc.prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG = 1


def _how(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _watch(command: str, children: list[subprocess.Popen], gpus: list[int], out) -> int:
    while True:
        codes = [c.poll() for c in children]
        # a rank killed by a signal is the cause; the ones that exited with an error saw it die
        failed = sorted(((code >= 0, rank, code) for rank, code in enumerate(codes) if code not in (None, 0)))
        if failed:
            _, rank, code = failed[0]
            where = f" (GPU {gpus[rank]})" if gpus else ""
            running = sum(code is None for code in codes)
            print(f"{command}: rank {rank}{where} {_how(code)}; stopping the other {running} rank(s)",
                  file=out, flush=True)
            _stop(children, signal.SIGTERM)
            return 130 if code in (130, -signal.SIGINT) else 1
        if all(code == 0 for code in codes):
            return 0
        time.sleep(0.1)


def _stop(children: list[subprocess.Popen], sig: int) -> None:
    """Send `sig` to every child still running, wait up to GRACE_S, then SIGKILL what is left."""
    alive = [c for c in children if c.poll() is None]
    for c in alive:
        try:
            c.send_signal(sig)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + GRACE_S
    for c in alive:
        try:
            c.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            c.kill()
            c.wait()


__all__ = ["RankPlace", "add_gpus_options", "current_rank", "init_rank_group", "launch", "launch_problem",
           "parse_gpus", "wants_launch"]
