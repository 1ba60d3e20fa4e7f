"""Devices: 'cpu', 'cuda', 'cuda:1'. A Device is what a tensor lives on and picks its backend."""
from __future__ import annotations


class Device:
    __slots__ = ("type", "index")

    def __init__(self, spec: "str | Device" = "cpu", index: int | None = None):
        if isinstance(spec, Device):
            self.type, self.index = spec.type, spec.index
            return
        if not isinstance(spec, str):
            raise TypeError(f"a device is a string like 'cpu' or 'cuda:0', got {spec!r}")
        kind, _, idx = spec.partition(":")
        if kind not in ("cpu", "cuda"):
            raise ValueError(f"unknown device {spec!r}; expected 'cpu', 'cuda' or 'cuda:N'")
        if idx:
            if not idx.isdigit():
                raise ValueError(f"bad device index in {spec!r}; expected e.g. 'cuda:0'")
            index = int(idx)
        if kind == "cpu":
            index = None
        elif index is None:
            index = 0
        self.type, self.index = kind, index

    def __eq__(self, other) -> bool:
        if isinstance(other, str):
            other = Device(other)
        return isinstance(other, Device) and self.type == other.type and self.index == other.index

    def __hash__(self) -> int:
        return hash((self.type, self.index))

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __repr__(self) -> str:
        return f"device('{self}')"


CPU = Device("cpu")
_default = CPU


def as_device(d) -> Device:
    if d is None:
        return _default
    return d if isinstance(d, Device) else Device(d)


def set_default_device(d) -> None:
    """Where factories (`engine.zeros`, `engine.randn`, ...) put tensors when no `device=` is given."""
    global _default
    _default = Device(d)


def get_default_device() -> Device:
    return _default
