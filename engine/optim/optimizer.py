"""The Optimizer base: parameter groups, zero_grad, and state_dict / load_state_dict.

The layout mirrors `torch.optim.Optimizer`: `param_groups` is a list of dicts, each with a
`params` list and its own hyper-parameters; `state` maps a parameter to a dict of its state.
`state_dict()` has PyTorch's format, which is also JSON + safetensors friendly:

    {"state": {0: {"step": 3, "exp_avg": Tensor, ...}, ...},   # keyed by parameter index
     "param_groups": [{"lr": 0.001, ..., "params": [0, 1, 2]}, ...]}

Parameter indices count through the groups in order. The values are Tensors (the live state,
not copies, as in PyTorch) and Python scalars; `load_state_dict` copies from Tensors or numpy
arrays onto each parameter's device, and accepts the indices as ints or as strings (JSON keys).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from .. import autograd
from ..backends import cuda as cuda_backend
from ..dtypes import float32
from ..graphs import step as graph_capture
from ..factories import zeros_like
from ..tensor import Tensor
from ..tensor import tensor as _tensor
from .device_scalars import prepare, sync_lrs

ParamsT = Iterable[Tensor] | Iterable[dict[str, Any]]


class Optimizer:
    """Base class. Subclasses set `defaults` through `__init__`, list the names of their per-parameter
    state tensors in `state_tensor_names`, and implement `step()`."""

    state_tensor_names: tuple[str, ...] = ()

    def __init__(self, params: ParamsT, defaults: dict[str, Any]):
        self.defaults = dict(defaults)
        self.state: dict[Tensor, dict[str, Any]] = {}
        self.param_groups: list[dict[str, Any]] = []
        self._device_scalars: dict = {}  # GPU index -> device_scalars.DeviceScalars (lr, step on the GPU)
        self._captured_updates: list = []  # what a captured graph's replay advances (engine.graphs)
        if isinstance(params, Tensor):
            raise TypeError(
                f"{type(self).__name__}: params should be an iterable of Tensors or of dicts, got a single "
                "Tensor; pass [tensor] or model.parameters()"
            )
        groups = list(params)
        if not groups:
            raise ValueError(f"{type(self).__name__} got an empty parameter list; pass model.parameters()")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            hyper = ", ".join(f"{k}={v}" for k, v in group.items() if k != "params")
            lines.append(f"  group {i}: {len(group['params'])} params, {hyper}")
        return "\n".join(lines + [")"])

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group of parameters; hyper-parameters it does not name come from the defaults."""
        if not isinstance(param_group, dict) or "params" not in param_group:
            raise TypeError(f"a param group is a dict with a 'params' key, got {type(param_group).__name__}")
        params = param_group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        for i, p in enumerate(params):
            if not isinstance(p, Tensor):
                raise TypeError(
                    f"{type(self).__name__}: parameter {i} of a group is a {type(p).__name__}, expected a Tensor"
                )
            if not p.dtype.is_floating_point:
                raise TypeError(f"{type(self).__name__}: parameter {i} is {p.dtype}; only floating-point tensors can be optimized")
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if len({id(p) for p in params}) != len(params) or any(id(p) in seen for p in params):
            raise ValueError(
                f"{type(self).__name__}: a parameter appears twice (within a group or in two groups); "
                "give each parameter to exactly one group"
            )
        group = dict(param_group, params=params)
        for name, value in self.defaults.items():
            group.setdefault(name, value)
        unknown = set(group) - set(self.defaults) - {"params", "initial_lr"}
        if unknown:
            raise TypeError(
                f"{type(self).__name__}: unknown hyper-parameter(s) {sorted(unknown)} in a param group; "
                f"expected some of {sorted(self.defaults)}"
            )
        self._check_group(group)
        self.param_groups.append(group)

    def _check_group(self, group: dict[str, Any]) -> None:
        """Validate a group's hyper-parameters (subclasses raise ValueError with what is wrong)."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the gradients: set them to None (the default, like PyTorch) or fill them with zeros."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    be = p.grad._backend
                    be.copy_(p.grad.data, be.full(p.grad.shape, 0.0, p.grad.dtype, p.grad.device.index))

    def step(self, closure: Callable[[], Any] | None = None):  # pragma: no cover - interface
        raise NotImplementedError

    def _closure_loss(self, closure):
        if closure is None:
            return None
        with autograd.enable_grad():
            return closure()

    # ---- state dicts ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """{"state": {index: {name: Tensor | scalar}}, "param_groups": [{hyper..., "params": [indices]}]}."""
        index_of: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            start = len(index_of)
            for i, p in enumerate(group["params"]):
                index_of[id(p)] = start + i
            packed = {k: (list(v) if isinstance(v, tuple) else v) for k, v in group.items() if k != "params"}
            packed["params"] = list(range(start, start + len(group["params"])))
            groups.append(packed)
        state = {index_of[id(p)]: dict(s) for p, s in self.state.items() if id(p) in index_of and s}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load what `state_dict()` gave (or its JSON + safetensors round trip). The hyper-parameters
        of the saved groups replace the current ones; state tensors are copied onto each parameter's
        device and dtype. Raises ValueError, naming the group or parameter, on any mismatch."""
        name = type(self).__name__
        if not isinstance(state_dict, dict) or "param_groups" not in state_dict or "state" not in state_dict:
            raise ValueError(f"{name}.load_state_dict expects a dict with 'state' and 'param_groups', as state_dict() gives")
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                f"{name}.load_state_dict: the saved state has {len(saved_groups)} param group(s), this optimizer "
                f"has {len(self.param_groups)}; build the optimizer with the same groups as the one that was saved"
            )
        params_by_index: dict[int, Tensor] = {}
        for g, (group, saved) in enumerate(zip(self.param_groups, saved_groups)):
            indices = list(saved["params"])
            if len(indices) != len(group["params"]):
                raise ValueError(
                    f"{name}.load_state_dict: param group {g} was saved with {len(indices)} parameter(s), this "
                    f"optimizer's group {g} has {len(group['params'])}; the model or its grouping differs"
                )
            for index, p in zip(indices, group["params"]):
                params_by_index[int(index)] = p

        new_state: dict[Tensor, dict[str, Any]] = {}
        for key, saved_param_state in state_dict["state"].items():
            index = int(key)
            if index not in params_by_index:
                raise ValueError(
                    f"{name}.load_state_dict: state for parameter {index}, but the saved groups only list "
                    f"parameters {sorted(params_by_index)}"
                )
            p = params_by_index[index]
            new_state[p] = {
                k: self._load_state_value(k, v, p, index) for k, v in saved_param_state.items() if v is not None
            }

        for group, saved in zip(self.param_groups, saved_groups):
            for k, v in saved.items():
                if k != "params":
                    group[k] = tuple(v) if isinstance(v, list) else v
        self.state = new_state
        for ds in self._device_scalars.values():
            ds.known = False  # the next step uploads the loaded lr and step counts

    # ---- CUDA graphs (engine/graphs/) ------------------------------------------------------------

    def _graph_capture(self):
        """Tell engine.graphs that this optimizer steps now; returns the capture under way, or None."""
        return graph_capture._note_optimizer(self)

    def _sync_device_lrs(self) -> None:
        """Before a replay: the device's lrs become the groups' current ones (a schedule moved them)."""
        sync_lrs(self)

    def _capture_snapshot(self) -> tuple:
        """What a failed capture must undo: step counts, state entries, gradients, lr/step mirrors."""
        params = [p for g in self.param_groups for p in g["params"]]
        steps = {p: s.get("step") for p, s in self.state.items()}
        grads = {p: p.grad for p in params}
        scalars = {d: ds.snapshot() for d, ds in self._device_scalars.items()}
        return steps, grads, scalars

    def _capture_restore(self, snap: tuple) -> None:
        steps, grads, scalars = snap
        for p in [p for p in self.state if p not in steps]:
            del self.state[p]
        for p, step in steps.items():
            if step is not None:
                self.state[p]["step"] = step
        for p, g in grads.items():
            p.grad = g
        for d, ds_snap in scalars.items():
            if d in self._device_scalars:
                self._device_scalars[d].restore(ds_snap)
        self._captured_updates = []

    def _prepare_device_scalars(self, plans: list, capture, track_steps: bool) -> dict:
        """One device_scalars.prepare per GPU for the buckets of `plans` that update on the device."""
        updates: dict = {}
        for gi, group, device, step, _params, on_device in plans:
            if on_device:
                updates.setdefault(device.index, {})[gi] = (group["lr"], step if track_steps else None)
        return {d: prepare(self, d, u, capture is not None) for d, u in updates.items()}

    def _note_captured_update(self, ds, group_index: int, params: list, counts_steps: bool) -> None:
        self._captured_updates.append((ds, group_index, params, counts_steps))

    def _advance_after_replay(self) -> None:
        """A replay of a captured step ran one update on the GPU: count it on the host too."""
        for ds, gi, params, counts_steps in self._captured_updates:
            if counts_steps:
                ds.host[1, gi] += 1
                for p in params:
                    self.state[p]["step"] += 1

    def _load_state_value(self, key: str, value: Any, p: Tensor, index: int) -> Any:
        if key not in self.state_tensor_names:  # a scalar such as "step": 0-d arrays become Python numbers
            if isinstance(value, Tensor | np.ndarray | np.generic):
                value = value.item()
            return value
        if isinstance(value, Tensor):
            shape = value.shape
        elif isinstance(value, np.ndarray):
            shape = tuple(value.shape)
        else:
            raise TypeError(
                f"{type(self).__name__}.load_state_dict: state {key!r} of parameter {index} is a "
                f"{type(value).__name__}, expected a Tensor or numpy array"
            )
        if shape != p.shape:
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: state {key!r} of parameter {index} has shape {shape}, "
                f"the parameter has shape {p.shape}; the checkpoint belongs to a model of another shape"
            )
        if isinstance(value, Tensor) and value.device == p.device and value.dtype == p.dtype:
            out = zeros_like(p)  # copy on the device: no host round trip, and no aliasing with the source
            out._backend.copy_(out.data, value.data)
            return out
        host = value.numpy() if isinstance(value, Tensor) else value
        return _tensor(host, dtype=p.dtype, device=p.device)


def grads_of(params: list[Tensor], who: str) -> list[Tensor]:
    """The gradients of `params` (all with a grad), checked to sit on their parameter's device."""
    grads = []
    for p in params:
        g = p.grad
        if g.device != p.device:
            raise RuntimeError(
                f"{who}: a parameter on {p.device} has its gradient on {g.device}; keep both on one device"
            )
        if g.shape != p.shape:
            raise RuntimeError(f"{who}: a parameter of shape {p.shape} has a gradient of shape {g.shape}")
        grads.append(g)
    return grads


def _all_float32(params: list[Tensor]) -> bool:
    """float32 parameters and gradients, and an engine._C with the device-scalar launchers."""
    return cuda_backend.has_device_scalar_kernels() and all(
        p.data.dtype is float32 and p.grad.data.dtype is float32 for p in params)


def _refuse_host_scalars(optimizer: Optimizer, device, capture) -> None:
    """The host-scalar update path bakes lr and step into the kernel: refuse it inside a capture."""
    if capture is not None and device.type == "cuda":
        raise RuntimeError(
            f"{type(optimizer).__name__}: this update (parameters of one group at different step counts, or not "
            "float32) passes lr/step as kernel parameters, which a CUDA graph would freeze; it cannot be captured")
