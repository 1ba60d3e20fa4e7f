"""The "nccl" backend: collectives of engine CUDA tensors through NCCL (engine._C's NcclComm,
csrc/cuda/nccl/), one process per GPU.

- Rank 0 makes NCCL's unique id and puts it in the store; the others read it there.
- async_op=False queues the collective on engine's stream, in order with every op: no host wait.
  async_op=True queues it on the communicator's side stream (it overlaps with the compute queued
  after it); Work.wait() makes engine's stream wait for it. Both can be captured in a CUDA graph.
- A watchdog thread asks the store every `watch_interval` seconds whether a rank died and the
  communicator whether a collective is past the timeout or failed; either way it aborts the
  communicator (ncclCommAbort: kernels waiting for a dead peer return) and the next call raises
  a DistributedError that says which rank or what. Nothing waits forever.
"""
from __future__ import annotations

import threading

from .._native import native
from ..backends.cuda import runtime
from ..backends.cuda.arrays import _CODE
from ..tensor import Tensor
from .errors import DistributedError, RankDiedError
from .group import REDUCE_OPS, ProcessGroup, Work, check_op
from .store import TCPStore


def nccl_unavailable_reason() -> str:
    """'' when this build of engine._C has the NCCL process group, else why not."""
    if native is None:
        from .._native import import_error  # only on this path: the reason the extension is missing
        return import_error
    info = native.build_info()
    if not info.get("nccl_built"):
        return f"engine was built without NCCL: {info.get('nccl_reason') or 'an older build (rebuild with pip install -e .)'}"
    return ""


class ProcessGroupNCCL(ProcessGroup):
    backend = "nccl"

    def __init__(self, store: TCPStore, rank: int, world_size: int, timeout: float, name: str, device: int,
                 watch_interval: float = 0.5):
        reason = nccl_unavailable_reason()
        if reason:
            raise DistributedError(f"init_process_group('nccl'): {reason}")
        super().__init__(store, rank, world_size, timeout, name)
        self.device = int(device)
        key = f"{self.prefix}nccl_unique_id"
        if rank == 0:
            store.set(key, native.nccl_unique_id())
        unique_id = store.get(key, timeout)
        try:
            self.comm = native.NcclComm(self.device, unique_id, world_size, rank, timeout)
        except RuntimeError as error:
            raise DistributedError(str(error)) from None
        self._failure = ""
        self._stop = threading.Event()
        self._watch_store = store.clone()
        self._watchdog = threading.Thread(target=self._watch, args=(watch_interval,), name=f"nccl-watchdog-{rank}",
                                          daemon=True)
        self._watchdog.start()

    # -- the watchdog --

    def _watch(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                dead = self._watch_store.dead_ranks()
            except DistributedError as error:  # the store's host (the launcher) is gone
                self._abort(str(error))
                return
            if dead:
                self._abort(str(RankDiedError(dead)))
                return
            failure = self.comm.check()
            if failure:
                self._failure = failure
                return

    def _abort(self, why: str) -> None:
        self._failure = why
        self.comm.abort(why)

    def _raise_if_failed(self, what: str) -> None:
        self._check_usable(what)
        failure = self._failure or self.comm.failure()
        if failure:
            raise DistributedError(f"{what}: the NCCL process group was aborted: {failure}")

    # -- collectives --

    def _array(self, what: str, tensor: Tensor):
        self._check_tensor(what, tensor)
        if tensor.device.type != "cuda" or tensor.device.index != self.device:
            raise ValueError(f"{what}: the nccl backend of this rank works on cuda:{self.device} tensors, this one "
                             f"is on {tensor.device}")
        return tensor.data

    def _call(self, what: str, fn, *args) -> None:
        self._raise_if_failed(what)
        try:
            fn(*args)
        except RuntimeError as error:
            raise DistributedError(f"{what}: {self._failure or error}") from None

    def all_reduce(self, tensor: Tensor, op: str = "sum", async_op: bool = False) -> Work | None:
        op = check_op(op)
        arr = self._array("all_reduce", tensor)
        if arr.size:
            self._call("all_reduce", self.comm.all_reduce, arr.ptr, arr.size, _CODE[arr.dtype], REDUCE_OPS.index(op),
                       bool(async_op))
        return Work(self.comm.join) if async_op else None

    def broadcast(self, tensor: Tensor, src: int = 0, async_op: bool = False) -> Work | None:
        if not 0 <= src < self.world_size:
            raise ValueError(f"broadcast: src {src} is not a rank of world size {self.world_size}")
        arr = self._array("broadcast", tensor)
        if arr.size:
            self._call("broadcast", self.comm.broadcast, arr.ptr, arr.size, _CODE[arr.dtype], int(src),
                       bool(async_op))
        return Work(self.comm.join) if async_op else None

    def destroy(self) -> None:
        if self._destroyed:
            return
        try:  # queued collectives finish first, the watchdog still on guard (a dead peer aborts them)
            if not (self._failure or self.comm.failure()):
                runtime.synchronize(self.device)
        finally:
            self._stop.set()
            self._watchdog.join(5.0)
        try:
            if not (self._failure or self.comm.failure()):
                self.comm.destroy()  # nothing is in flight now: finalize returns at once
        except RuntimeError as error:
            raise DistributedError(f"destroy_process_group: {error}") from None
        finally:
            self._watch_store.close()
            super().destroy()
