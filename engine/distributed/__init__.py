"""engine.distributed: process groups and collectives (the `torch.distributed` counterparts).

    store = TCPStore("127.0.0.1", port, token)            # one process hosts it (is_server=True)
    init_process_group("nccl", rank=r, world_size=n, store=store)   # or "cpu"
    all_reduce(tensor, op="avg")                          # in place, every rank the same result
    broadcast(tensor, src=0); barrier()
    destroy_process_group()

Backends: "nccl" (engine CUDA tensors, one process per GPU; needs a build of engine._C with NCCL,
`is_nccl_available()` says whether and why not) and "cpu" (numpy-backed CPU tensors between local
processes through the store: the path that tests everything above it without a GPU). Errors are
DistributedError: a rank that died (RankDiedError, named), a timeout (DistributedTimeoutError),
the store gone. `engine.nn.parallel.DistributedDataParallel` builds data parallel training on it.
"""
from __future__ import annotations

from ..device import Device
from ..tensor import Tensor
from .cpu_backend import ProcessGroupCPU
from .errors import DistributedError, DistributedTimeoutError, RankDiedError
from .group import REDUCE_OPS, ProcessGroup, ReduceOp, Work
from .nccl_backend import ProcessGroupNCCL, nccl_unavailable_reason
from .store import TCPStore

BACKENDS = ("cpu", "nccl")
DEFAULT_TIMEOUT = 600.0  # seconds a rank waits for the others in one collective (PyTorch's default too)

_group: ProcessGroup | None = None


def is_available() -> bool:
    """True: the "cpu" backend is always there."""
    return True


def is_nccl_available() -> bool:
    """Whether the "nccl" backend is built into engine._C (nccl_unavailable_reason() says why not)."""
    return not nccl_unavailable_reason()


def init_process_group(backend: str, rank: int, world_size: int, store: TCPStore, *,
                       timeout: float = DEFAULT_TIMEOUT, device=None, group_name: str = "pg") -> ProcessGroup:
    """Join the default process group: this process is `rank` of `world_size`, meeting the others
    through `store`. For "nccl", `device` is this rank's GPU ('cuda:i', i, or None: engine's current
    device). Returns the group (also reachable through the module's functions)."""
    global _group
    if _group is not None:
        raise DistributedError("init_process_group: a process group is already initialised in this process "
                               "(call destroy_process_group() first)")
    if backend not in BACKENDS:
        raise ValueError(f"init_process_group: backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "cpu":
        _group = ProcessGroupCPU(store, rank, world_size, timeout, group_name)
    else:
        _group = ProcessGroupNCCL(store, rank, world_size, timeout, group_name, _device_index(device))
    return _group


def _device_index(device) -> int:
    if device is None:
        from ..backends.cuda import runtime  # only for "nccl": the current CUDA device
        return runtime.current_device()
    if isinstance(device, int):
        return device
    d = Device(device) if not isinstance(device, Device) else device
    if d.type != "cuda":
        raise ValueError(f"init_process_group('nccl'): device must be a CUDA device, got {device!r}")
    return d.index


def is_initialized() -> bool:
    return _group is not None


def get_group() -> ProcessGroup:
    if _group is None:
        raise DistributedError("no process group: call engine.distributed.init_process_group(...) first")
    return _group


def get_rank() -> int:
    """This process's rank (0 without a process group, as a single process is rank 0 of 1)."""
    return _group.rank if _group is not None else 0


def get_world_size() -> int:
    return _group.world_size if _group is not None else 1


def get_backend() -> str:
    return get_group().backend


def all_reduce(tensor: Tensor, op: str = ReduceOp.SUM, group: ProcessGroup | None = None,
               async_op: bool = False) -> Work | None:
    """tensor <- op over every rank's tensor, in place (sum, avg, max, min)."""
    return (group or get_group()).all_reduce(tensor, op, async_op)


def broadcast(tensor: Tensor, src: int = 0, group: ProcessGroup | None = None, async_op: bool = False) -> Work | None:
    """tensor <- rank `src`'s tensor, in place."""
    return (group or get_group()).broadcast(tensor, src, async_op)


def barrier(group: ProcessGroup | None = None) -> None:
    (group or get_group()).barrier()


def destroy_process_group() -> None:
    """Leave the default group cleanly (the other ranks do not see this rank as dead)."""
    global _group
    group, _group = _group, None
    if group is not None:
        group.destroy()


__all__ = ["BACKENDS", "DEFAULT_TIMEOUT", "DistributedError", "DistributedTimeoutError", "ProcessGroup",
           "ProcessGroupCPU", "ProcessGroupNCCL", "REDUCE_OPS", "RankDiedError", "ReduceOp", "TCPStore", "Work",
           "all_reduce", "barrier", "broadcast", "destroy_process_group", "get_backend", "get_group", "get_rank",
           "get_world_size", "init_process_group", "is_available", "is_initialized", "is_nccl_available",
           "nccl_unavailable_reason"]
