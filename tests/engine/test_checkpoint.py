"""Checkpoints: round trips, RNG state, atomic replacement under crashes, clear errors."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors import safe_open

from engine import checkpoint
from engine.checkpoint import CheckpointError, CheckpointNotFoundError, load_checkpoint, save_checkpoint

REPO_ROOT = Path(__file__).resolve().parents[2]


class FakeTensor:
    """Anything with .numpy() and .shape is saved as a tensor leaf (engine.Tensor is one)."""

    def __init__(self, array: np.ndarray) -> None:
        self._array = array
        self.shape = array.shape

    def numpy(self) -> np.ndarray:
        return self._array


def sample_state(step: int = 7) -> dict[str, Any]:
    rng = np.random.default_rng(step)
    return {
        "model": {
            "h.0.attn.weight": FakeTensor(rng.standard_normal((4, 3)).astype(np.float32)),
            "h.0.attn.bias": rng.standard_normal(3).astype(np.float32),
            "wte": np.arange(12, dtype=np.float64).reshape(3, 4),
        },
        "optimizer": {
            "state": {0: {"step": 3, "exp_avg": np.ones(3, np.float32)}, 1: {"step": 3}},
            "param_groups": [{"lr": 3e-4, "betas": (0.9, 0.999), "params": [0, 1], "name": None}],
        },
        "step": step,
        "rng": rng.bit_generator.state,
        "misc": {
            "flags": np.array([True, False]),
            "scalar": np.array(2.5, dtype=np.float32),  # 0-d
            "empty": np.zeros((0, 4), dtype=np.int64),
            "tokens": np.arange(5, dtype=np.uint16),
            "np_scalar": np.float32(1.5),
            "big": 2**100,
            "nan": math.nan,
            "text": "héllo 日本",
        },
    }


def test_round_trip_nested_state(tmp_path: Path) -> None:
    state = sample_state()
    save_checkpoint(tmp_path / "ckpt", **state)
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["state.json", "tensors.safetensors"]
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]  # no temp directories left behind
    loaded = load_checkpoint(tmp_path / "ckpt")

    model = loaded["model"]
    assert isinstance(model["h.0.attn.weight"], np.ndarray)
    assert np.array_equal(model["h.0.attn.weight"], state["model"]["h.0.attn.weight"].numpy())
    assert model["h.0.attn.weight"].dtype == np.float32
    assert np.array_equal(model["wte"], state["model"]["wte"]) and model["wte"].dtype == np.float64
    opt = loaded["optimizer"]
    assert set(opt["state"]) == {0, 1}  # int keys survive JSON
    assert np.array_equal(opt["state"][0]["exp_avg"], np.ones(3, np.float32)) and opt["state"][1] == {"step": 3}
    assert opt["param_groups"][0]["betas"] == (0.9, 0.999)  # tuples stay tuples
    assert opt["param_groups"][0]["params"] == [0, 1] and opt["param_groups"][0]["name"] is None
    assert loaded["step"] == 7 and loaded["rng"] == state["rng"]
    misc = loaded["misc"]
    assert misc["flags"].dtype == np.bool_ and misc["flags"].tolist() == [True, False]
    assert misc["scalar"].shape == () and misc["scalar"] == np.float32(2.5)
    assert misc["empty"].shape == (0, 4) and misc["empty"].dtype == np.int64
    assert misc["tokens"].dtype == np.uint16
    assert misc["np_scalar"] == 1.5 and misc["big"] == 2**100 and math.isnan(misc["nan"])
    assert misc["text"] == "héllo 日本"


def test_files_hold_tensors_by_dotted_path_and_json_placeholders(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "ckpt", **sample_state())
    with safe_open(str(tmp_path / "ckpt" / "tensors.safetensors"), framework="numpy") as f:
        keys = set(f.keys())
    assert "model.h.0.attn.weight" in keys and "optimizer.state.0.exp_avg" in keys
    state_json = json.loads((tmp_path / "ckpt" / "state.json").read_text())
    assert state_json["state"]["model"]["wte"] == {"__tensor__": "model.wte"}
    assert state_json["state"]["step"] == 7


def test_rng_state_round_trip_continues_the_same_stream(tmp_path: Path) -> None:
    rng = np.random.default_rng(1234)
    rng.standard_normal(10)
    legacy = np.random.RandomState(5)
    save_checkpoint(
        tmp_path / "ckpt",
        rng=rng.bit_generator.state,
        mt=np.random.Generator(np.random.MT19937(3)).bit_generator.state,
        legacy=legacy.get_state(),
    )
    expected = rng.standard_normal(5)
    loaded = load_checkpoint(tmp_path / "ckpt")
    resumed = np.random.default_rng()
    resumed.bit_generator.state = loaded["rng"]
    assert np.array_equal(resumed.standard_normal(5), expected)
    mt = np.random.Generator(np.random.MT19937())
    mt.bit_generator.state = loaded["mt"]  # MT19937's state holds a uint32 array: a tensor leaf
    assert np.array_equal(mt.random(3), np.random.Generator(np.random.MT19937(3)).random(3))
    restored = np.random.RandomState()
    restored.set_state(loaded["legacy"])
    assert np.array_equal(restored.rand(3), legacy.rand(3))


def test_colliding_dotted_paths_stay_distinct(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "ckpt", a={"b.c": np.zeros(1), "b": {"c": np.ones(1)}})
    loaded = load_checkpoint(tmp_path / "ckpt")
    assert loaded["a"]["b.c"].tolist() == [0.0] and loaded["a"]["b"]["c"].tolist() == [1.0]


def test_engine_tensor_leaf(tmp_path: Path) -> None:
    engine = pytest.importorskip("engine")
    if not callable(getattr(engine, "tensor", None)):
        pytest.skip("engine.tensor is not available yet")
    t = engine.tensor([[1.0, 2.0], [3.0, 4.0]])
    save_checkpoint(tmp_path / "ckpt", w=t)
    assert np.array_equal(load_checkpoint(tmp_path / "ckpt")["w"], np.array([[1, 2], [3, 4]], np.float32))


def test_unsupported_values_are_refused_with_their_path(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"'model\.opt\.fn' is a builtin_function"):
        save_checkpoint(tmp_path / "ckpt", model={"opt": {"fn": len}})
    with pytest.raises(CheckpointError, match="dtype object"):
        save_checkpoint(tmp_path / "ckpt", x=np.array([object()]))
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "ckpt.tmp").exists()


def test_overwrite_replaces_the_previous_checkpoint(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "ckpt", step=1, w=np.zeros(3))
    save_checkpoint(tmp_path / "ckpt", step=2, w=np.ones(3))
    loaded = load_checkpoint(tmp_path / "ckpt")
    assert loaded["step"] == 2 and loaded["w"].tolist() == [1, 1, 1]
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


# ---- atomicity ----------------------------------------------------------------------------------


def test_crash_while_writing_tensors_keeps_the_previous(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ckpt"
    save_checkpoint(path, step=1, w=np.zeros(3))

    def crash_midway(tensors: dict[str, np.ndarray], filename: str, **kwargs: Any) -> None:
        Path(filename).write_bytes(b"\x00" * 10)  # a torn write
        raise OSError("simulated crash while writing tensors")

    monkeypatch.setattr("safetensors.numpy.save_file", crash_midway)
    with pytest.raises(OSError, match="simulated crash"):
        save_checkpoint(path, step=2, w=np.ones(3))
    monkeypatch.undo()
    assert load_checkpoint(path)["step"] == 1
    save_checkpoint(path, step=3, w=np.ones(3))  # cleans up the half-written temp directory
    assert load_checkpoint(path)["step"] == 3 and sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_crash_between_the_renames_keeps_the_previous(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ckpt"
    save_checkpoint(path, step=1, w=np.zeros(3))
    real_replace = os.replace

    def crash_on_swap(src: Any, dst: Any) -> None:
        if Path(src).name == "ckpt.tmp":
            raise OSError("simulated crash between renames")
        real_replace(src, dst)

    monkeypatch.setattr(checkpoint.os, "replace", crash_on_swap)
    with pytest.raises(OSError, match="simulated crash"):
        save_checkpoint(path, step=2, w=np.ones(3))
    monkeypatch.undo()
    assert not path.exists()  # the old one was moved aside, the new one not yet in place ...
    assert load_checkpoint(path)["step"] == 1  # ... and loading still finds the old one
    save_checkpoint(path, step=3, w=np.ones(3))
    assert load_checkpoint(path)["step"] == 3 and sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_crash_before_removing_the_old_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ckpt"
    save_checkpoint(path, step=1, w=np.zeros(3))

    def crash(*args: Any, **kwargs: Any) -> None:
        raise OSError("simulated crash before cleanup")

    monkeypatch.setattr(checkpoint.shutil, "rmtree", crash)
    with pytest.raises(OSError, match="simulated crash"):
        save_checkpoint(path, step=2, w=np.ones(3))
    monkeypatch.undo()
    assert load_checkpoint(path)["step"] == 2
    save_checkpoint(path, step=3, w=np.ones(3))
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


CHILD = """
import sys, numpy as np
from engine.checkpoint import save_checkpoint
path = sys.argv[1]
step = 0
while True:
    step += 1
    save_checkpoint(path, step=step, w=np.full(200_000, step, dtype=np.float32))
    print(step, flush=True)
"""


def test_sigkill_during_saves_leaves_a_loadable_checkpoint(tmp_path: Path) -> None:
    """A real crash: kill -9 a process that saves in a loop; what is on disk must load and be whole."""
    path = tmp_path / "ckpt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE, env=env, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "1"  # at least one save finished
        time.sleep(0.2)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    loaded = load_checkpoint(path)
    assert loaded["step"] >= 1 and np.all(loaded["w"] == loaded["step"])


# ---- errors -------------------------------------------------------------------------------------


def test_missing_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointNotFoundError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "nope")
    with pytest.raises(FileNotFoundError):  # callers may catch the built-in
        load_checkpoint(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="is not a checkpoint"):
        load_checkpoint(tmp_path / "empty")


def test_corrupt_tensor_file(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    save_checkpoint(path, w=np.arange(100, dtype=np.float32))
    tensors = path / "tensors.safetensors"
    raw = bytearray(tensors.read_bytes())
    raw[-1] ^= 0xFF
    tensors.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="corrupt.*sha256"):
        load_checkpoint(path)
    tensors.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(path, verify=False)  # the safetensors parser's error, wrapped
    tensors.unlink()
    with pytest.raises(CheckpointError, match="incomplete"):
        load_checkpoint(path)


def test_corrupt_state_file(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    save_checkpoint(path, w=np.zeros(2))
    (path / "state.json").write_text('{"format": "coop-checkpoint", "sta')
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_checkpoint(path)
    (path / "state.json").write_text('{"something": "else"}')
    with pytest.raises(CheckpointError, match="not a coop-checkpoint state file"):
        load_checkpoint(path)


def test_refuses_to_replace_something_that_is_not_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "precious.txt").write_text("keep me")
    with pytest.raises(CheckpointError, match="refusing to replace"):
        save_checkpoint(tmp_path / "data", step=1)
    assert (tmp_path / "data" / "precious.txt").read_text() == "keep me"
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="is a file"):
        save_checkpoint(tmp_path / "file", step=1)
    shutil.rmtree(tmp_path / "data")
