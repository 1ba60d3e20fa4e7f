"""Learning rates and step counts kept on the GPU, so that one captured CUDA graph of a training
step serves the whole schedule (engine/graphs/).

On a GPU, an optimizer's update kernels read `lr` and `step` from device memory instead of taking
them as kernel parameters (which a captured graph would freeze at their capture-time values):

    array (2, G) float32 on the device:  row 0 = lr of each param group, row 1 = its step count

`host` mirrors what the device holds once the queued work has run. Before each update the
optimizer makes the device agree with its groups: a new lr is one tiny host->device copy, the
usual +1 of the step count one tiny kernel (which a captured graph records, so each replay counts
its own step). Eager steps take the same path, which is what makes a replayed step compute exactly
what an eager step computes. Step counts are exact in float32 up to 2^24 steps.
"""
from __future__ import annotations

import numpy as np

from ..backends import cuda as cuda_backend
from ..dtypes import float32

_MAX_GROUPS = 64  # the step-advance kernel takes a 64-bit mask of groups


class DeviceScalars:
    """[lr, step] of every param group of one optimizer on one GPU."""

    __slots__ = ("array", "host", "known", "device", "n_groups")

    def __init__(self, n_groups: int, device_index: int):
        self.device = device_index
        self.n_groups = n_groups
        self.array = cuda_backend.full((2, n_groups), 0.0, float32, device_index)
        self.host = np.zeros((2, n_groups), np.float32)
        self.known = False  # the mirror is only right after the first upload

    def lr_ptr(self, group_index: int) -> int:
        return self.array.ptr + 4 * group_index

    def step_ptr(self, group_index: int) -> int:
        return self.array.ptr + 4 * (self.n_groups + group_index)

    def upload(self, row: int) -> None:
        """Copy one row of the mirror (0: lrs, 1: steps) to the device, queued on its stream."""
        src = np.ascontiguousarray(self.host[row])
        cuda_backend.copy_from_numpy_(cuda_backend.getitem(self.array, (row,)), src)  # (G,) view of row `row`

    def snapshot(self) -> tuple:
        return self.host.copy(), self.known

    def restore(self, snap: tuple) -> None:
        self.host[...] = snap[0]
        self.known = snap[1]


def prepare(optimizer, device_index: int, updates: dict[int, tuple[float, int | None]], capturing: bool) -> DeviceScalars:
    """Make the device hold lr (and, unless None, the new step count) of each group in `updates`
    ({group index: (lr, step)}) before the update kernels that read them are queued.

    While a capture is under way nothing may be uploaded: an lr that differs is left for the
    replay to upload (CapturedStep does, before each launch), and the step count may only advance
    by one, through the recorded kernel."""
    table = optimizer._device_scalars
    n_groups = len(optimizer.param_groups)
    ds = table.get(device_index)
    if ds is None or ds.n_groups != n_groups:
        if capturing:
            raise RuntimeError(
                f"{type(optimizer).__name__}: its device-side lr/step table would be created inside a CUDA graph "
                "capture; take at least one eager step before capturing (CapturedStep's warm-up does)")
        if n_groups > _MAX_GROUPS:
            raise ValueError(f"{type(optimizer).__name__}: at most {_MAX_GROUPS} param groups on a GPU, got {n_groups}")
        ds = table[device_index] = DeviceScalars(n_groups, device_index)

    first = not ds.known
    if first:
        ds.host[0] = [g["lr"] for g in optimizer.param_groups]
    lr_dirty = first
    step_upload = first
    step_mask = 0
    for gi, (lr, step) in updates.items():
        if not capturing and ds.host[0, gi] != np.float32(lr):
            ds.host[0, gi] = lr
            lr_dirty = True
        if step is None:
            continue
        held = ds.host[1, gi]
        if not first and held + 1 == step:
            step_mask |= 1 << gi
        elif first or held != step:
            step_upload = True
        ds.host[1, gi] = step
    if capturing and step_upload:
        raise RuntimeError(
            f"{type(optimizer).__name__}: a param group's step count jumps inside a CUDA graph capture (only +1 per "
            "step can be recorded); take an eager step after loading a state dict, before capturing")
    if lr_dirty:
        ds.upload(0)
    if step_upload:
        ds.upload(1)  # holds the new counts of the advancing groups too: no kernel
    elif step_mask:
        cuda_backend.optim_step_advance(device_index, ds.step_ptr(0), step_mask)
    ds.known = True
    return ds


def sync_lrs(optimizer) -> None:
    """Upload every group's current lr where the device holds another (before a graph replay)."""
    for ds in optimizer._device_scalars.values():
        if not ds.known or ds.n_groups != len(optimizer.param_groups):
            continue
        lrs = np.array([g["lr"] for g in optimizer.param_groups], dtype=np.float32)
        if not np.array_equal(lrs, ds.host[0]):
            ds.host[0] = lrs
            ds.upload(0)
