"""Module and Parameter: the containers that layers and models are built from, as in PyTorch."""
from __future__ import annotations

from collections import OrderedDict
from typing import Iterator

import numpy as np

from ..autograd import no_grad
from ..device import as_device
from ..tensor import Tensor, tensor


class Parameter(Tensor):
    """A tensor that is a module's learnable weight: requires_grad, listed by parameters()."""

    def __init__(self, data: Tensor, requires_grad: bool = True):
        src = data if isinstance(data, Tensor) else tensor(data)
        self.__dict__.update(Tensor._wrap(src.data, src.device).__dict__)
        self.requires_grad = requires_grad

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()


class Module:
    """Base class of layers and models: register Parameters and sub-Modules as attributes."""

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "training", True)

    def __setattr__(self, name: str, value) -> None:
        if "_parameters" not in self.__dict__:
            raise RuntimeError(f"{type(self).__name__}: call super().__init__() before assigning attributes")
        for store in (self._parameters, self._modules, self._buffers):
            store.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        object.__setattr__(self, name, value)

    def register_buffer(self, name: str, value: Tensor | None) -> None:
        """A tensor that moves with the module and is saved in state_dict, but is not trained."""
        object.__setattr__(self, name, value)
        self._buffers[name] = value

    def forward(self, *args, **kwargs):  # pragma: no cover - interface
        raise NotImplementedError(f"{type(self).__name__} has no forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # ---- traversal ------------------------------------------------------------------------------

    def named_modules(self, prefix: str = "", memo: set | None = None) -> Iterator[tuple[str, "Module"]]:
        memo = set() if memo is None else memo
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, child in self._modules.items():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name, memo)

    def modules(self) -> Iterator["Module"]:
        for _, m in self.named_modules():
            yield m

    def children(self) -> Iterator["Module"]:
        return iter(self._modules.values())

    def named_parameters(self, prefix: str = "", remove_duplicate: bool = True) -> Iterator[tuple[str, Parameter]]:
        """(name, parameter) pairs; a shared (tied) parameter is listed once, under its first name."""
        seen = set()
        for mod_name, mod in self.named_modules(prefix):
            for name, p in mod._parameters.items():
                if p is None or (remove_duplicate and id(p) in seen):
                    continue
                seen.add(id(p))
                yield (f"{mod_name}.{name}" if mod_name else name), p

    def parameters(self) -> Iterator[Parameter]:
        for _, p in self.named_parameters():
            yield p

    def named_buffers(self) -> Iterator[tuple[str, Tensor]]:
        for mod_name, mod in self.named_modules():
            for name, b in mod._buffers.items():
                if b is not None:
                    yield (f"{mod_name}.{name}" if mod_name else name), b

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # ---- modes, gradients, devices --------------------------------------------------------------

    def train(self, mode: bool = True) -> "Module":
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters():
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad.zero_()

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def to(self, device=None, dtype=None) -> "Module":
        """Move every parameter and buffer in place (optimizers holding them see the move)."""
        seen = set()
        for m in self.modules():
            for store in (m._parameters, m._buffers):
                for name, t in store.items():
                    if t is None or id(t) in seen:
                        continue
                    seen.add(id(t))
                    if dtype is not None and not t.dtype.is_floating_point:
                        moved = t.to(device)
                    else:
                        moved = t.detach().to(device, dtype)
                    t.data, t.device = moved.data, moved.device
                    if t.grad is not None:
                        g = t.grad.to(device, dtype)
                        t.grad = Tensor._wrap(g.data, g.device)
        return self

    def cuda(self, index: int = 0) -> "Module":
        return self.to(f"cuda:{index}")

    def cpu(self) -> "Module":
        return self.to("cpu")

    @property
    def device(self):
        for p in self.parameters():
            return p.device
        return as_device(None)

    def apply(self, fn) -> "Module":
        for m in self.modules():
            fn(m)
        return self

    # ---- state ----------------------------------------------------------------------------------

    def state_dict(self) -> "OrderedDict[str, Tensor]":
        """name -> tensor (detached) for every parameter and buffer; tied weights under every name."""
        out = OrderedDict()
        for mod_name, mod in self.named_modules():
            for store in (mod._parameters, mod._buffers):
                for name, t in store.items():
                    if t is not None:
                        out[f"{mod_name}.{name}" if mod_name else name] = t.detach()
        return out

    def load_state_dict(self, state_dict, strict: bool = True):
        """Copy tensors (engine Tensors or numpy arrays) into this module's parameters and buffers.

        strict: every key must match. A shape mismatch is always an error that names the tensor.
        Returns (missing_keys, unexpected_keys)."""
        own = self.state_dict()
        targets = {}
        for mod_name, mod in self.named_modules():
            for store in (mod._parameters, mod._buffers):
                for name, t in store.items():
                    if t is not None:
                        targets[f"{mod_name}.{name}" if mod_name else name] = t
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        if strict and (missing or unexpected):
            parts = []
            if missing:
                parts.append(f"missing keys: {', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''}")
            if unexpected:
                parts.append(f"unexpected keys: {', '.join(unexpected[:10])}{' ...' if len(unexpected) > 10 else ''}")
            raise KeyError(f"load_state_dict into {type(self).__name__}: " + "; ".join(parts) +
                           " (pass strict=False to load the keys that match)")
        for key, value in state_dict.items():
            if key not in targets:
                continue
            dst = targets[key]
            shape = tuple(value.shape)
            if shape != dst.shape:
                raise ValueError(f"load_state_dict: tensor '{key}' has shape {shape} in the checkpoint but "
                                 f"{dst.shape} in the model; the checkpoint was made for a different model config")
            with no_grad():
                src = value if isinstance(value, Tensor) else tensor(np.asarray(value), dtype=dst.dtype)
                dst.copy_(src)
        return missing, unexpected

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, child in self._modules.items():
            child_repr = repr(child).replace("\n", "\n  ")
            lines.append(f"  ({name}): {child_repr}")
        return "\n".join(lines) + (")" if len(lines) == 1 else "\n)")

    def extra_repr(self) -> str:
        return ""


class ModuleList(Module):
    def __init__(self, modules=()):
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, module: Module) -> "ModuleList":
        setattr(self, str(len(self._modules)), module)
        return self

    def __getitem__(self, i: int) -> Module:
        return list(self._modules.values())[i]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())


class ModuleDict(Module):
    def __init__(self, modules: dict | None = None):
        super().__init__()
        for k, m in (modules or {}).items():
            setattr(self, k, m)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __contains__(self, key: str) -> bool:
        return key in self._modules

    def keys(self):
        return self._modules.keys()

    def items(self):
        return self._modules.items()


class Sequential(ModuleList):
    def __init__(self, *modules: Module):
        super().__init__(modules)

    def forward(self, x):
        for m in self:
            x = m(x)
        return x
