"""ProcessGroup: what both backends share: rank and world size, the store, the collectives'
argument checks, the store barrier, and Work (what an async collective returns)."""
from __future__ import annotations

from ..tensor import Tensor
from .errors import DistributedError
from .store import TCPStore

REDUCE_OPS = ("sum", "avg", "max", "min")


class ReduceOp:
    """PyTorch's names for the reductions; plain strings work as well ("sum", "avg", ...)."""

    SUM, AVG, MAX, MIN = REDUCE_OPS


def check_op(op) -> str:
    name = str(getattr(op, "value", op)).lower()
    if name not in REDUCE_OPS:
        raise ValueError(f"all_reduce: op must be one of {', '.join(REDUCE_OPS)}, got {op!r}")
    return name


class Work:
    """An async collective (async_op=True). wait() orders what comes after it behind the
    collective: on the CPU it is already done; on a GPU engine's stream waits (no host wait)."""

    def __init__(self, wait=None):
        self._wait = wait

    def wait(self) -> None:
        if self._wait is not None:
            self._wait()
            self._wait = None

    def is_completed(self) -> bool:
        return self._wait is None


class ProcessGroup:
    """One rank's view of a group of `world_size` processes that call the same collectives in the
    same order. Subclasses: ProcessGroupCPU (cpu_backend.py), ProcessGroupNCCL (nccl_backend.py)."""

    backend = ""

    def __init__(self, store: TCPStore, rank: int, world_size: int, timeout: float, name: str):
        if not 0 <= rank < world_size:
            raise ValueError(f"init_process_group: rank {rank} of world size {world_size}; expected 0 <= rank < "
                             "world_size")
        self.store, self.rank, self.world_size, self.timeout = store, rank, world_size, float(timeout)
        self.prefix = f"{name}/"
        self._seq = 0  # collectives called so far: every rank numbers them alike
        self._destroyed = False
        store.register(rank)

    def _next_key(self, kind: str) -> str:
        self._seq += 1
        return f"{self.prefix}{kind}{self._seq}"

    def _check_usable(self, what: str) -> None:
        if self._destroyed:
            raise DistributedError(f"{what}: the process group was destroyed (destroy_process_group)")

    def _check_tensor(self, what: str, tensor) -> None:
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{what}: expected an engine Tensor, got {type(tensor).__name__}")

    # -- collectives: the backends' --

    def all_reduce(self, tensor: Tensor, op: str = "sum", async_op: bool = False) -> Work | None:
        raise NotImplementedError

    def broadcast(self, tensor: Tensor, src: int = 0, async_op: bool = False) -> Work | None:
        raise NotImplementedError

    def barrier(self) -> None:
        """Every rank has reached this call (through the store: it waits for no device work)."""
        self._check_usable("barrier")
        key = self._next_key("barrier")
        if self.store.add(f"{key}/arrived") == self.world_size:
            self.store.set(f"{key}/go", b"1")
        self.store.get(f"{key}/go", self.timeout)
        if self.store.add(f"{key}/left") == self.world_size:
            for part in ("arrived", "go", "left"):
                self.store.delete(f"{key}/{part}")

    def destroy(self) -> None:
        """Leave the group cleanly (the store does not count this rank as dead)."""
        if self._destroyed:
            return
        self._destroyed = True
        try:
            self.store.leave()
        except DistributedError:
            pass  # the store's host is gone already: nothing to tell it
