"""Streaming DiLoCo's fragments (arXiv 2501.18512): the model split into P parts that are
synchronised in turn, so that each round sends 1/P of the model and the peak bandwidth falls by P.

With a sync period of H inner steps per fragment, a round is H / P inner steps and round r merges
fragment r mod P: every fragment still trains H steps between two of its merges, the fragments'
merges are staggered by H / P steps. Fragments are strided over the transformer's blocks (block i
belongs to fragment i mod P, which the paper found better than contiguous slices); the embeddings
go with fragment 0 and the rest (the final layer norm) with the last fragment. Which fragment a
tensor is in depends on its name only, never on the order names come in: a worker and its
coordinator agree whatever order their weights are listed in. P = 1 is plain DiLoCo.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import numpy as np

from .round import RoundStart

BLOCK = re.compile(r"(?:^|\.)h\.(\d+)\.")
EMBEDDING = re.compile(r"(?:^|\.)(wte|wpe|embed\w*)(?:\.|$)")


def fragments(names: Iterable[str], count: int) -> list[list[str]]:
    """The tensor names of each of `count` fragments, every name in exactly one, none empty."""
    names = list(names)
    if count < 1:
        raise ValueError(f"fragments must be at least 1, got {count}")
    blocks = sorted({int(m.group(1)) for n in names if (m := BLOCK.search(n))})
    if count > max(1, len(blocks)):
        raise ValueError(f"{count} fragments for a model of {len(blocks)} blocks: at most one fragment per block")
    parts: list[list[str]] = [[] for _ in range(count)]
    for name in names:
        match = BLOCK.search(name)
        if match:
            parts[blocks.index(int(match.group(1))) % count].append(name)
        else:  # the embeddings: fragment 0; the rest (the final norm): the last
            parts[0 if EMBEDDING.search(name) else count - 1].append(name)
    return parts


def fragment_of_round(round_index: int, count: int) -> int:
    """Which fragment round `round_index` merges."""
    return round_index % count


def round_start(round_index: int, weights: dict[str, np.ndarray], parts: list[list[str]], continuing: bool,
                **options: Any) -> RoundStart:
    """Round r's start for one replica, the same in every transport. Plain DiLoCo (one part): load
    everything. With P fragments: load the fragment round r - 1 merged and send fragment r mod P.
    A replica that is not `continuing` (its update was not in round r - 1's merge: it missed the
    round, joined late, diverged or was refused) starts afresh from all of `weights`."""
    p = len(parts)
    return RoundStart(round_index, weights, merged=parts[(round_index - 1) % p] if p > 1 and continuing else None,
                      send=parts[round_index % p] if p > 1 else None, reset=not continuing, **options)
