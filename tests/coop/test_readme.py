"""Every ```python block of README.md runs as written: in order, in one namespace (the README's
blocks continue one Python session), in an empty directory (they write files)."""
from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_the_readme_has_python_blocks():
    assert len(python_blocks(README.read_text(encoding="utf-8"))) >= 3


def test_every_python_block_of_the_readme_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__readme__"}
    for number, block in enumerate(python_blocks(README.read_text(encoding="utf-8")), 1):
        code = compile(block, f"README.md python block {number}", "exec")
        exec(code, namespace)  # noqa: S102 (the README's own code, run as a reader would)
    assert (tmp_path / "tokens.bin").is_file() and (tmp_path / "ckpt").exists()
    assert {"global_weights", "agg", "out"} <= set(namespace)


def test_the_docs_point_at_no_file_outside_the_project():
    root = README.parent
    for path in [README, *sorted((root / "docs").glob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        assert "../shared" not in text and "shared/" not in text, f"{path.name} points outside the project"
