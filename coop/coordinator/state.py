"""The coordinator's state directory, written so that a SIGKILL at any moment leaves it readable:

    state_dir/
      checkpoint/     global weights, outer optimizer state, round number, metrics history and the
                      run config (engine.checkpoint: safetensors + JSON, written to a temp directory,
                      fsynced and renamed; a reader falls back to the previous one mid-swap)
      members.json    workers and their token digests (temp file + fsync + rename, on every join/leave
                      and after every round)
      evals.json      the workers' val loss reports per weights (coop.coordinator.evaluation): they
                      come between checkpoints, the final model's after the last one (temp file +
                      fsync + rename, at most once a tick)
      data/           the tokenized corpus (coop.coordinator.data)

The checkpoint is written after every round, so a restarted coordinator loses at most the round
in flight. No pickle anywhere. The directory is private (0700, its files 0600): members.json holds
token digests, the checkpoint the model.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.checkpoint import CheckpointNotFoundError, load_checkpoint, write_checkpoint

STATE_FORMAT = "coop-coordinator-state"
STATE_VERSION = 1


@dataclass
class SavedRun:
    round: int  # the round to run next (= completed rounds)
    weights: dict[str, np.ndarray]
    outer_state: dict[str, Any]
    history: list[dict[str, Any]]
    config: dict[str, Any]
    members: dict[str, Any] | None
    evals: dict[str, Any] | None = None


def checkpoint_dir(state_dir: Path) -> Path:
    return state_dir / "checkpoint"


def members_path(state_dir: Path) -> Path:
    return state_dir / "members.json"


def evals_path(state_dir: Path) -> Path:
    return state_dir / "evals.json"


PRIVATE_DIR, PRIVATE_FILE = 0o700, 0o600


def make_private_dir(path: Path) -> None:
    """Create `path` (and its parents) readable by this user only; an existing one is made so."""
    path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
    os.chmod(path, PRIVATE_DIR)


def make_private_tree(path: Path) -> None:
    """0700 for `path` and the directories under it, 0600 for the files (what another writer,
    engine.checkpoint, created with the process's umask)."""
    if not path.exists():
        return
    os.chmod(path, PRIVATE_DIR)
    for root, dirs, files in os.walk(path):
        for name in dirs:
            os.chmod(os.path.join(root, name), PRIVATE_DIR)
        for name in files:
            os.chmod(os.path.join(root, name), PRIVATE_FILE)


def write_json_atomic(path: Path, obj: Any) -> None:
    """temp file + fsync + rename + fsync of the directory: the old or the new file, never half of one.
    The file is created 0600."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    os.fchmod(fd, PRIVATE_FILE)  # an old temp file left by a crash keeps its mode otherwise
    with open(fd, "w", encoding="utf-8") as f:
        json.dump(obj, f, allow_nan=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    try:
        fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_round(state_dir: Path, *, round_number: int, weights: dict[str, np.ndarray], outer_state: dict[str, Any],
               history: list[dict[str, Any]], config: dict[str, Any],
               tensors_written: Callable[[], None] | None = None) -> None:
    """Persist everything a restart needs after `round_number - 1` closed (or 0: the initial state).
    `tensors_written`: called once the arrays are read (engine.checkpoint.write_checkpoint); the
    `weights` dict itself is then what holds them here."""
    write_checkpoint(checkpoint_dir(state_dir), {"format": STATE_FORMAT, "version": STATE_VERSION, "round": round_number,
                                                 "weights": weights, "outer": outer_state, "history": history,
                                                 "config": config}, tensors_written)
    make_private_tree(checkpoint_dir(state_dir))


def save_members(state_dir: Path, members: dict[str, Any]) -> None:
    write_json_atomic(members_path(state_dir), members)


def save_evals(state_dir: Path, evals: dict[str, Any]) -> None:
    write_json_atomic(evals_path(state_dir), evals)


def load_run(state_dir: Path) -> SavedRun | None:
    """The saved run in `state_dir`, or None if there is none yet. Raises ValueError on a state
    directory written by something else."""
    try:
        state = load_checkpoint(checkpoint_dir(state_dir))
    except CheckpointNotFoundError:
        return None
    if state.get("format") != STATE_FORMAT:
        raise ValueError(f"{checkpoint_dir(state_dir)} is not a coop coordinator state; use another --state-dir")
    if int(state.get("version", 0)) > STATE_VERSION:
        raise ValueError(f"{state_dir} was written by a newer coop (state version {state['version']}); upgrade coop")
    members = None
    path = members_path(state_dir)
    if path.is_file():
        members = json.loads(path.read_text(encoding="utf-8"))
    evals = None
    if evals_path(state_dir).is_file():
        evals = json.loads(evals_path(state_dir).read_text(encoding="utf-8"))
    weights = {name: np.array(array, dtype=np.float32) for name, array in state["weights"].items()}
    outer = dict(state["outer"])
    outer["momentum_buffer"] = {k: np.array(v, dtype=np.float32) for k, v in outer.get("momentum_buffer", {}).items()}
    return SavedRun(round=int(state["round"]), weights=weights, outer_state=outer, history=list(state["history"]),
                    config=dict(state["config"]), members=members, evals=evals)
