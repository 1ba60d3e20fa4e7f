"""The embedded default corpus: the running Python's standard library source, no download needed."""

from __future__ import annotations

import functools
import os
import sysconfig
from pathlib import Path

DEFAULT_CORPUS_CHARS = 4_000_000
# Tests are repetitive boilerplate and site-packages differs from machine to machine.
SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})


def stdlib_source_files() -> list[Path]:
    """The .py files of the standard library, in a deterministic (sorted relative path) order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS)
        files.extend(Path(dirpath) / name for name in sorted(filenames) if name.endswith(".py"))
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


@functools.lru_cache(maxsize=4)
def default_corpus(max_chars: int = DEFAULT_CORPUS_CHARS) -> str:
    """Concatenated standard-library source, cut at a line end to at most `max_chars` characters.

    The same Python version gives the same text on every machine.
    """
    if max_chars <= 0:
        raise ValueError(f"default_corpus: max_chars must be positive, got {max_chars}")
    pieces: list[str] = []
    total = 0
    for path in stdlib_source_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # a few stdlib files are not utf-8 or not readable; they are not needed
        if not text.endswith("\n"):
            text += "\n"
        pieces.append(text)
        total += len(text)
        if total >= max_chars:
            break
    corpus = "".join(pieces)
    if len(corpus) > max_chars:
        cut = corpus.rfind("\n", 0, max_chars)
        corpus = corpus[: cut + 1] if cut >= 0 else corpus[:max_chars]
    if not corpus:
        raise RuntimeError(
            f"default_corpus: found no readable .py files under {sysconfig.get_paths()['stdlib']}; "
            "pass a corpus of your own instead"
        )
    return corpus
