"""`GET /v1/model`: the global model as one model file (coop.trained: safetensors tensors, the
model config and the tokenizer in its metadata), which `coop sample FILE` and
`coop export FILE OUT_DIR --format hf` read as it is.

It is made from the state directory's checkpoint (written atomically after every round), not from
the weights in memory, which the outer step changes in place while a round closes: the file is
always one round's weights. One body is kept, that of the last round asked for; building it (a
read of the checkpoint, one pack) runs in a thread, one at a time.
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

from coop.model_source import load_trained
from coop.trained import ModelSourceError, pack_model_file
from engine.checkpoint import CheckpointError

READ_ATTEMPTS = 3  # a read that meets the checkpoint's swap (rename, rename, remove) is tried again


class ModelDownload:
    def __init__(self, state_dir: Path):
        self.state_dir = Path(state_dir)
        self._lock = asyncio.Lock()
        self._cached: tuple[int, bytes] | None = None  # (round, model file)

    async def body(self, current_round: int) -> tuple[int, bytes]:
        """(round, the model file's bytes) of the weights after `current_round` rounds (or of the last
        checkpoint written, while a round is being saved)."""
        async with self._lock:
            if self._cached is None or self._cached[0] != current_round:
                self._cached = await asyncio.to_thread(self._build)
            return self._cached

    def _build(self) -> tuple[int, bytes]:
        for attempt in range(READ_ATTEMPTS):
            try:
                trained = load_trained(self.state_dir)
                break
            except (CheckpointError, ModelSourceError, FileNotFoundError):
                if attempt == READ_ATTEMPTS - 1:
                    raise
                time.sleep(0.2)
        return int(trained.round or 0), pack_model_file(trained)
