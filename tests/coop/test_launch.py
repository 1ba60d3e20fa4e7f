"""coop.launch for real, on the CPU: `--gpus` refused where it cannot run (exit 2, one line),
`coop train --cpu-ranks 2` (two real rank processes, the "cpu" process group), a rank killed for
real ends the run with a clear error in bounded time, Ctrl-C to the launcher ends every rank."""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import engine
from coop.launch import parse_gpus

TRAIN = ["--max-steps", "20", "--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--block-size", "32",
         "--batch-size", "4", "--eval-every", "10", "--default-corpus-chars", "50000", "--sample-tokens", "0",
         "--quiet"]


def coop(*args: str, timeout: float = 300, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "coop.cli", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd)


def test_parse_gpus():
    assert parse_gpus("0,1") == [0, 1] and parse_gpus(" 3 ") == [3]
    for bad in ("", "0,", "a,b", "0,0", "-1"):
        with pytest.raises(ValueError, match="--gpus"):
            parse_gpus(bad)


@pytest.mark.parametrize("argv", [
    ["train", "--gpus", "0,1"],
    ["swarm", "start", "--gpus", "0"],
    ["-m", "coop.worker_cli", "join", "http://127.0.0.1:9", "--gpus", "0,1"],
])
def test_gpus_that_cannot_run_here_exit_2_with_one_line(argv, tmp_path):
    if argv[0] == "-m":
        out = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    else:
        out = coop(*argv, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    if not engine.cuda.is_available():
        assert "--gpus" in lines[0] and "CUDA is not available" in lines[0], lines[0]


@pytest.mark.parametrize("argv, message", [
    (["--gpus", "x"], "expected GPU indices"),
    (["--gpus", "0", "--cpu-ranks", "2"], "exclude each other"),
    (["--cpu-ranks", "1"], "expected 2 or more"),
    (["--gpus", "4096"], None),  # no machine has GPU 4096 (or no CUDA at all): refused either way
])
def test_bad_launch_options_exit_2(argv, message, tmp_path):
    out = coop("train", *argv, cwd=tmp_path)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    if message:
        assert message in out.stderr


def test_train_on_two_cpu_ranks(tmp_path):
    out = coop("train", "--cpu-ranks", "2", "--grad-accum", "2", "--out", str(tmp_path / "run"), *TRAIN, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:] + out.stdout[-3000:]
    assert "started 2 ranks on the CPU" in out.stderr
    assert "512 tokens per step" in out.stdout  # 4 x 32 x 2 micro-batches x 2 ranks: every rank's batch counts
    assert "done: 20 steps" in out.stdout and out.stdout.count("done:") == 1  # rank 0 alone reports
    assert (tmp_path / "run" / "checkpoint").exists() and (tmp_path / "run" / "metrics.jsonl").exists()


def _sigint_handled() -> None:
    # a test run in the background (`pytest &`) has SIGINT ignored, and a child would inherit that:
    # the launcher plays the terminal's foreground program here, which gets Ctrl-C
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def long_run(tmp_path):
    """A `coop train --cpu-ranks 2` that would run for hours; killed at the end whatever happens."""
    launcher, pids = start_long_run(tmp_path)
    yield launcher, pids
    for pid in [launcher.pid, *pids]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    launcher.wait(30)


def start_long_run(tmp_path) -> tuple[subprocess.Popen, list[int]]:
    launcher = subprocess.Popen([sys.executable, "-m", "coop.cli", "train", "--cpu-ranks", "2", "--out",
                                 str(tmp_path / "run"), *TRAIN[:-1], "--max-steps", "100000", "--eval-every", "0",
                                 "--checkpoint-every", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, cwd=tmp_path, preexec_fn=_sigint_handled)
    first = launcher.stderr.readline()
    match = re.search(r"pids (\d+), (\d+)", first)
    assert match, first
    pids = [int(match.group(1)), int(match.group(2))]
    deadline = time.monotonic() + 120
    while not (tmp_path / "run").exists():  # rank 0 made its output folder: both ranks are training
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.stderr.read()
        time.sleep(0.2)
    time.sleep(2.0)
    return launcher, pids


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone too (its parent reaps it)
        return f.read().split(")")[-1].split()[0] == "Z"


def test_a_killed_rank_ends_the_run_with_a_clear_error(long_run):
    launcher, (rank0, rank1) = long_run
    os.kill(rank1, signal.SIGKILL)
    killed = time.monotonic()
    _, err = launcher.communicate(timeout=120)
    assert time.monotonic() - killed < 60, "the launcher must notice a dead rank within seconds"
    assert launcher.returncode == 1, err
    # rank 0 may have seen rank 1 die through the store and exited first, so the launcher stops 1 or 0
    assert re.search(r"rank 1 was killed by SIGKILL; stopping the other [01] rank\(s\)", err), err
    assert gone(rank0) and gone(rank1)


def test_ctrl_c_ends_every_rank(long_run):
    launcher, pids = long_run
    launcher.send_signal(signal.SIGINT)
    _, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 130, err
    assert "interrupted; stopping 2 ranks" in err
    assert all(gone(pid) for pid in pids)


def test_simulated_replicas_spread_over_the_gpus_only_for_plain_cuda():
    from coop.devices import spread_device  # (the simulator's placement rule; no GPU needed to check it)
    assert spread_device("cpu", 3) == "cpu"
    assert spread_device("cuda:1", 5) == "cuda:1"
    n = engine.cuda.device_count() if engine.cuda.is_available() else 0
    expected = [f"cuda:{i % n}" for i in range(4)] if n > 1 else ["cuda"] * 4
    assert [spread_device("cuda", i) for i in range(4)] == expected
