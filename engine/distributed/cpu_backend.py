"""The "cpu" backend (PyTorch's gloo counterpart, kept small): collectives of CPU (numpy-backed)
tensors between local processes, through the store.

all_reduce: every rank puts its bytes under the collective's key, reads every other rank's, and
reduces them in rank order (rank 0's first), so every rank computes the same floating-point sum
and ends with bit-identical values. That moves world_size x the tensor through the store per rank:
fine for tests and for small models, not a fast path (GPUs use "nccl"). A rank that dies makes
the others' next read fail at once (RankDiedError); a rank that stops calling makes it time out.
"""
from __future__ import annotations

import numpy as np

from ..tensor import Tensor
from .group import ProcessGroup, Work, check_op


class ProcessGroupCPU(ProcessGroup):
    backend = "cpu"

    def _array(self, what: str, tensor: Tensor) -> np.ndarray:
        self._check_tensor(what, tensor)
        if tensor.device.type != "cpu":
            raise ValueError(f"{what}: the cpu backend works on CPU tensors, this one is on {tensor.device}; "
                             "use backend='nccl' for GPU tensors")
        arr = tensor.data
        if not (arr.flags.c_contiguous and arr.flags.writeable):
            raise ValueError(f"{what}: needs a contiguous, writeable tensor (it is updated in place)")
        return arr

    def _cleanup(self, key: str, parts: list[str], readers: int) -> None:
        """The last of `readers` to finish reading deletes the collective's keys."""
        if self.store.add(f"{key}/read") == readers:
            for part in parts + ["read"]:
                self.store.delete(f"{key}/{part}")

    def _received(self, key: str, sender: int, like: np.ndarray) -> np.ndarray:
        body = self.store.get(key, self.timeout)
        if len(body) != like.nbytes:
            raise ValueError(f"rank {sender} sent {len(body)} bytes, this rank's tensor has {like.nbytes} (shape "
                             f"{like.shape}, {like.dtype}): every rank must pass the same shape and dtype")
        return np.frombuffer(body, dtype=like.dtype).reshape(like.shape)

    def all_reduce(self, tensor: Tensor, op: str = "sum", async_op: bool = False) -> Work | None:
        op = check_op(op)
        self._check_usable("all_reduce")
        arr = self._array("all_reduce", tensor)
        key = self._next_key("all_reduce")
        self.store.set(f"{key}/{self.rank}", arr.tobytes())
        total = None
        for r in range(self.world_size):  # rank order on every rank: the same sum everywhere
            part = arr.copy() if r == self.rank else self._received(f"{key}/{r}", r, arr)
            if total is None:
                total = part.copy()
            elif op in ("sum", "avg"):
                total += part
            elif op == "max":
                np.maximum(total, part, out=total)
            else:
                np.minimum(total, part, out=total)
        if op == "avg":
            total = total / self.world_size if arr.dtype.kind != "f" else total / arr.dtype.type(self.world_size)
        np.copyto(arr, total.astype(arr.dtype, copy=False))
        self._cleanup(key, [str(r) for r in range(self.world_size)], self.world_size)
        return Work() if async_op else None

    def broadcast(self, tensor: Tensor, src: int = 0, async_op: bool = False) -> Work | None:
        self._check_usable("broadcast")
        if not 0 <= src < self.world_size:
            raise ValueError(f"broadcast: src {src} is not a rank of world size {self.world_size}")
        arr = self._array("broadcast", tensor)
        key = self._next_key("broadcast")
        if self.rank == src:
            self.store.set(f"{key}/value", arr.tobytes())
        else:
            np.copyto(arr, self._received(f"{key}/value", src, arr))
        self._cleanup(key, ["value"], self.world_size)
        return Work() if async_op else None
