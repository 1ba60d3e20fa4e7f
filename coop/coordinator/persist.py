"""The checkpoint of each closed round, written off the round's critical path.

A round's close publishes the next round's weights first and then writes the state directory in a
thread while the workers already train: the 1-3 s a 124M-parameter checkpoint takes (safetensors,
fsync, hash, rename) is spent beside the inner steps, not between them. The next close waits only
until that write has read the arrays its outer step changes (the momentum; the weights written are
the served ones, which no step touches): the fsync, the hash and the renames go on beside it, and
the next write starts once they are done, so the writes stay one at a time and in order. A SIGKILL
during a write leaves the previous checkpoint (engine.checkpoint swaps atomically): a restart then
resumes a round or two earlier, and the workers' updates for the lost rounds are refused as stale
and sent again for the round the restarted coordinator opens.
"""
from __future__ import annotations

import asyncio
import copy
import logging
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from .state import save_round

log = logging.getLogger("coop.coordinator")


class Checkpointer:
    def __init__(self, state_dir: Path):
        self.state_dir = state_dir
        self._writing: asyncio.Task | None = None  # the last write started (each waits for the one before)
        self._read: threading.Event | None = None  # set once that write has read its arrays
        self.last_seconds = 0.0  # how long the last write took
        self.saved_round: int | None = None  # the round the state directory resumes at

    def start(self, round_number: int, weights: dict[str, np.ndarray], outer: Any,
              history: list[dict[str, Any]], config: dict[str, Any]) -> None:
        """Begin writing the state that resumes at `round_number`, once the write before it is done.
        The arrays (weights, the outer optimizer's buffers) are written as they are, no copy: the
        caller awaits `arrays_read()` before changing them. The history is copied now, since val
        reports keep editing its records."""
        history = copy.deepcopy(history)
        before, read = self._writing, threading.Event()
        self._read = read
        self._writing = asyncio.create_task(self._after(before, read, round_number, dict(weights), outer, history,
                                                        config))

    async def _after(self, before: asyncio.Task | None, read: threading.Event, *state) -> None:
        if before is not None:
            await before
        await asyncio.to_thread(self._write, read, *state)

    def _write(self, read: threading.Event, round_number: int, weights: dict, outer, history, config) -> None:
        def arrays_read() -> None:  # the weights let go (the last round's buffer, once nothing serves it), the close told
            weights.clear()
            read.set()

        started = time.perf_counter()
        try:
            save_round(self.state_dir, round_number=round_number, weights=weights,
                       outer_state=outer.state_dict(copy=False), history=history, config=config,
                       tensors_written=arrays_read)
        except OSError as error:  # the step is taken in memory; the next round's save will retry
            log.error("could not write the state directory for round %d (%s); a restart now would resume earlier",
                      round_number, error)
            return
        except Exception:  # never let one write stop the ones after it
            log.exception("the state directory for round %d was not written", round_number)
            return
        finally:
            read.set()
        self.last_seconds = time.perf_counter() - started
        self.saved_round = round_number

    async def arrays_read(self) -> None:
        """Wait until the last write has read its arrays (the caller may change them then)."""
        if self._read is not None and not self._read.is_set():
            await asyncio.to_thread(self._read.wait)

    async def written(self) -> None:
        """Wait for every write in flight, to the end."""
        if self._writing is not None:
            writing, self._writing = self._writing, None
            await writing
