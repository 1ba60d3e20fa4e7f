"""Progress in an 80-column terminal: the line a worker, a peer or `coop train` draws is cut to the
terminal's width (it never wraps, so every redraw overwrites the last one instead of leaving a
broken line), keeps its ETA, and moves within a round (inner steps, tokens/s); written to a file
it is plain lines, one per round, with no carriage return or control sequence."""
from __future__ import annotations

import io
import os
import sys
import threading

import pytest
from terminal import ANSI, drain, progress_draws, run_in_terminal, set_window, width

from coop.progress import Progress
from conftest import REPO, Coordinator, Worker, child_env, run_config, wait_until

pytestmark = pytest.mark.e2e

COLUMNS = 80
LONG = "loss 2.3456  train 12,345 tok/s  update 0.52 MB  up 101.0 MB  down 202.0 MB  members 12 group 3/4"


def assert_fits(draws: list[str], columns: int = COLUMNS) -> None:
    assert draws, "no progress line was drawn"
    too_wide = [d for d in draws if width(d) > columns]
    assert not too_wide, f"{len(too_wide)} of {len(draws)} progress lines wider than {columns}: {too_wide[0]!r}"


def test_the_progress_line_is_cut_to_the_terminal_and_keeps_its_eta():
    master, slave = os.openpty()
    set_window(slave, COLUMNS)
    stream = open(slave, "w", encoding="utf-8")  # noqa: SIM115 (closed below)
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.append(drain(master, lambda: stream.closed, 30)))
    reader.start()
    progress = Progress(total=40, unit="round", steps_per_point=50, stream=stream)
    progress.bar.mininterval = 0  # every call draws (a real run draws at most 4 times a second)
    for point in range(3):
        for _ in range(50):
            progress.step(tokens=2048)
        progress.update(point + 1, f"round {point}  {LONG}", tokens=50 * 2048)
        progress.note(f"round {point}: val loss 2.1")
    progress.close()
    stream.close()
    reader.join()
    os.close(master)
    draws = progress_draws(b"".join(chunks).decode())
    assert_fits(draws)
    assert any("round 0/40" in d and "step 25/50" in d and "tok/s" in d for d in draws)  # within the round
    assert all(" ETA " in d for d in draws)
    assert "round 3/40" in draws[-1]


def test_written_to_a_file_it_is_plain_lines():
    out = io.StringIO()
    progress = Progress(total=4, unit="round", steps_per_point=3, stream=out, interval_s=0)
    for point in range(2):
        for _ in range(3):
            progress.step(tokens=100)
        progress.update(point + 1, f"round {point}  loss 2.0", tokens=300)
    progress.note("done")
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and not ANSI.search(out.getvalue())
    assert lines[0].startswith("[0/4] round 0: step 1/3") and lines[3].startswith("[1/4] round 0  loss 2.0")
    assert "ETA" in lines[3] and lines[-1] == "done"
    quiet = io.StringIO()
    Progress(total=4, stream=quiet, quiet=True).update(1, "x")
    assert quiet.getvalue() == ""


# rounds long enough (~0.5-1 s of steps on an idle core) that a within-round draw comes after
# tqdm's 0.25 s between draws, however fast the machine; both workers in every round (with a quorum
# of one, a worker slowed by a loaded machine can see both rounds close without it and log none)
PROGRESS_RUN = run_config(model={"n_layer": 1, "n_head": 2, "n_embd": 64, "block_size": 64},
                          inner={"steps": 200, "batch_size": 16}, rounds={"max_rounds": 2, "eval_every": 1},
                          coordinator={"min_workers": 2})


def test_a_worker_in_an_80_column_terminal_draws_lines_that_fit(tmp_path, procs):
    coordinator = procs(Coordinator(tmp_path, PROGRESS_RUN))
    on_file = procs(Worker(tmp_path, coordinator, "bob"))  # the same run, written to a log file
    argv = [sys.executable, "-m", "coop.worker_cli", "join", coordinator.url, "--name", "alice", "--cache-dir",
            "none", "--token", coordinator.token]
    status, output = run_in_terminal(argv, COLUMNS, timeout=240, env=child_env(), cwd=REPO)
    assert status == 0, output[-3000:]
    draws = progress_draws(output)
    assert_fits(draws)
    assert any("step " in d and "/200" in d and "tok/s" in d for d in draws), draws  # moving within a round
    assert "coop-worker: done" in output and output.count("coop-worker: device") == 1
    assert on_file.wait(120) == 0
    log = on_file.output()
    assert "\r" not in log and not ANSI.search(log)
    rounds = [line.split()[0] for line in log.splitlines() if line.startswith("[") and "] round " in line]
    assert rounds and rounds[-1] == "[2/2]", log[-3000:]
    wait_until(lambda: coordinator.status()["round"] >= 2, 30, "the run to end", [coordinator.log])


def test_a_peer_in_an_80_column_terminal_draws_lines_that_fit(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text("seed = 0\n[model]\nn_layer = 1\nn_head = 2\nn_embd = 64\nblock_size = 64\n"
                      "[data]\ndefault_chars = 100000\n[inner]\nsteps = 200\nbatch_size = 16\nwarmup_steps = 0\n"
                      "[compression]\ncodec = \"fp32\"\n[rounds]\nmax_rounds = 2\neval_batches = 2\n")
    argv = [sys.executable, "-m", "coop.cli", "swarm", "start", "--config", str(config), "--port", "0"]
    status, output = run_in_terminal(argv, COLUMNS, timeout=240, env=child_env(), cwd=REPO)
    assert status == 0, output[-3000:]
    draws = progress_draws(output)
    assert_fits(draws)
    assert any("step " in d and "/200" in d for d in draws), draws  # moving within a round
    assert "finished at round 2" in output


def test_coop_train_in_an_80_column_terminal_draws_lines_that_fit(tmp_path):
    argv = [sys.executable, "-m", "coop.cli", "train", "--out", str(tmp_path / "run"), "--max-steps", "30",
            "--log-every", "1", "--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32",
            "--eval-every", "10", "--eval-batches", "1", "--sample-tokens", "0", "--default-corpus-chars", "30000"]
    status, output = run_in_terminal(argv, COLUMNS, timeout=240, env=child_env(), cwd=REPO)
    assert status == 0, output[-3000:]
    draws = progress_draws(output)
    assert_fits(draws)
    assert "step 30/30" in draws[-1] and "val loss" in output


def test_coop_simulate_in_an_80_column_terminal_leaves_one_line_per_run(tmp_path):
    argv = [sys.executable, "-m", "coop.cli", "simulate", "--default-corpus-chars", "30000", "--n-layer", "1",
            "--n-head", "2", "--n-embd", "16", "--block-size", "16", "--batch-size", "2", "--replicas", "2",
            "--inner-steps", "2", "--rounds", "3", "--eval-batches", "1", "--compression", "fp32", "int8",
            "--baseline", "ddp", "--no-plot", "--out", str(tmp_path / "sim")]
    status, output = run_in_terminal(argv, COLUMNS, timeout=240, env=child_env(), cwd=REPO)
    assert status == 0, output[-3000:]
    draws = progress_draws(output)
    assert_fits(draws)
    finished = [line for line in ANSI.sub("", output).replace("\r", "\n").splitlines() if "round 3/3" in line]
    for run in ("diloco-fp32", "diloco-int8", "ddp"):
        assert any(f"ETA 00:00, {run}:" in line for line in finished), finished
