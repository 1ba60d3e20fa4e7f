"""The end of a pytest run says in one line per kind why tests were skipped (tests/conftest.py), above
pytest's own final line, which keeps its format (CI reads it). Each case runs pytest for real in a
subprocess on some of this project's tests; torch is made unimportable there by `sys.modules`."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import engine.cuda

ROOT = Path(__file__).resolve().parents[1]
FINAL_LINE = re.compile(r"^(\d+ passed, )?(\d+) skipped(, \d+ deselected)? in [\d.]+s( \([\d:]+\))?$")


def run_pytest(args: list[str], hide_torch: bool = False) -> list[str]:
    """pytest's output lines for `args` (-q, no cache), run in a fresh interpreter from the project root."""
    prelude = "import sys; sys.modules['torch'] = None; " if hide_torch else "import sys; "
    code = prelude + f"import pytest; sys.exit(pytest.main({['-q', '-p', 'no:cacheprovider'] + args!r}))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [line for line in proc.stdout.splitlines() if line.strip()]


def test_torch_skips_are_summed_up_in_one_line():
    lines = run_pytest(["tests/engine/test_ops.py", "-k", "against_torch and (add_broadcast or matmul_2d)"],
                       hide_torch=True)
    final = FINAL_LINE.match(lines[-1])
    assert final, lines[-1]
    skipped = int(final.group(2))
    assert skipped == 4  # two cases x (float32, bf16)
    summary = [line for line in lines if line.startswith("skipped ")]
    assert summary == [f"skipped {skipped} PyTorch comparison tests: torch not installed "
                       "(pip install torch==2.13.0 installs a CPU build)"], lines


@pytest.mark.skipif(engine.cuda.is_available(), reason="checks the summary where the GPU tests skip")
def test_gpu_skips_are_summed_up_with_the_reason():
    lines = run_pytest(["tests/cuda/test_runtime.py", "tests/cuda/test_bf16.py"])
    final = FINAL_LINE.match(lines[-1])
    assert final, lines[-1]
    summary = [line for line in lines if line.startswith("skipped ")]
    assert summary == [f"skipped {final.group(2)} GPU tests: {engine.cuda.unavailable_reason()}"], lines
    assert lines[-2] == summary[0]  # the summary sits just above pytest's own line


def test_no_summary_line_without_skips():
    lines = run_pytest(["tests/engine/test_ops.py", "-k", "finite_differences and add_broadcast"], hide_torch=True)
    assert re.match(r"^1 passed, \d+ deselected in [\d.]+s$", lines[-1]), lines[-1]
    assert not [line for line in lines if line.startswith("skipped ")]
