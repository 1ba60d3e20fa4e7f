"""The checkpoint of each closed round, written off the round's critical path.

A round's close publishes the next round's weights first and then writes the state directory in a
thread while the workers already train: the 0.5-1.5 s a 124M-parameter checkpoint takes (safetensors,
fsync, rename) is spent beside the inner steps, not between them. The next close waits for that
write before its outer step changes the arrays being written, so one write is in flight at most.
A SIGKILL during the write leaves the previous checkpoint (engine.checkpoint swaps atomically): a
restart then resumes one round earlier, and the workers' updates for the lost round are refused
as stale and sent again for the round the restarted coordinator opens.
"""
from __future__ import annotations

import asyncio
import copy
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from .state import save_round

log = logging.getLogger("coop.coordinator")


class Checkpointer:
    def __init__(self, state_dir: Path):
        self.state_dir = state_dir
        self._writing: asyncio.Task | None = None
        self.last_seconds = 0.0  # how long the last write took
        self.saved_round: int | None = None  # the round the state directory resumes at

    def start(self, round_number: int, weights: dict[str, np.ndarray], outer: Any,
              history: list[dict[str, Any]], config: dict[str, Any]) -> None:
        """Begin writing the state that resumes at `round_number`. The arrays (weights, the outer
        optimizer's buffers) are written as they are, no copy: the caller awaits `written()` before
        changing them. The history is copied now, since val reports keep editing its records."""
        history = copy.deepcopy(history)
        self._writing = asyncio.create_task(asyncio.to_thread(
            self._write, round_number, dict(weights), outer, history, config))

    def _write(self, round_number: int, weights, outer, history, config) -> None:
        started = time.perf_counter()
        try:
            save_round(self.state_dir, round_number=round_number, weights=weights,
                       outer_state=outer.state_dict(copy=False), history=history, config=config)
        except OSError as error:  # the step is taken in memory; the next round's save will retry
            log.error("could not write the state directory for round %d (%s); a restart now would resume earlier",
                      round_number, error)
            return
        self.last_seconds = time.perf_counter() - started
        self.saved_round = round_number

    async def written(self) -> None:
        """Wait for the write in flight, if any."""
        if self._writing is not None:
            writing, self._writing = self._writing, None
            await writing
