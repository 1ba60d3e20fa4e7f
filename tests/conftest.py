"""Shared test set-up: the helpers in tests/ (op_check) importable from every test folder, and one
line per kind of skip at the end of a run (why the GPU tests and the PyTorch comparisons did not run),
printed above pytest's own final line, which stays as it is (CI reads it)."""
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

_GPU_PREFIX = "needs a GPU: "  # the reason tests/cuda/conftest.py gives its skips
_TORCH_MISSING = ("torch is not installed", "could not import 'torch'")


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


def _skip_kind(report, reason: str) -> str:
    """"gpu", "torch" or "other" for one skipped test."""
    if "cuda" in getattr(report, "keywords", {}) or reason.startswith(_GPU_PREFIX):
        return "gpu"
    if any(text in reason for text in _TORCH_MISSING):
        return "torch"
    return "other"


def _reasons(counter: collections.Counter) -> str:
    if len(counter) == 1:
        return next(iter(counter))
    return "; ".join(f"{n} {reason}" for reason, n in counter.most_common())


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """'skipped N GPU tests: <why>', 'skipped N PyTorch comparison tests: <why>', 'skipped N other tests:
    <why>', each only where there are some; `pytest -rs` still lists every skip."""
    kinds = {"gpu": collections.Counter(), "torch": collections.Counter(), "other": collections.Counter()}
    for report in terminalreporter.stats.get("skipped", []):
        reason = _skip_reason(report)
        kind = _skip_kind(report, reason)
        if kind == "gpu":
            reason = reason.removeprefix(_GPU_PREFIX)
        elif kind == "torch":
            reason = "torch not installed (pip install torch==2.13.0 installs a CPU build)"
        kinds[kind][reason] += 1
    names = {"gpu": "GPU test", "torch": "PyTorch comparison test", "other": "other test"}
    for kind, counter in kinds.items():
        total = sum(counter.values())
        if total:
            plural = "s" if total != 1 else ""
            terminalreporter.write_line(f"skipped {total} {names[kind]}{plural}: {_reasons(counter)}", yellow=True)
