"""Which device a command trains on: `--device auto` (the default of every command) resolved once,
and the one check every command makes of its --device before any work."""
from __future__ import annotations

import argparse
import re

import engine

DEVICE_HELP = "auto (cuda when this CUDA build of engine sees a GPU, else cpu), cpu, cuda or cuda:N (default: auto)"
_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


def device_problem(command: str, device: str) -> str | None:
    """Why `command` cannot run on `device`, as the one line to print; None when it can."""
    if device.startswith("cuda") and not engine.cuda.is_available():
        return f"{command}: --device {device} but CUDA is not available: {engine.cuda.unavailable_reason()}"
    return None


def resolve_device(device: str) -> str:
    """`auto` -> "cuda" when engine's CUDA backend sees a GPU, else "cpu"; "cpu", "cuda", "cuda:N" as
    given once checked. Raises ValueError (one line: what came, what is accepted, why not)."""
    if not isinstance(device, str) or not _DEVICE.fullmatch(device):
        raise ValueError(f"expected auto, cpu, cuda or cuda:N, got {device!r}")
    if device == "auto":
        return "cuda" if engine.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not engine.cuda.is_available():
            raise ValueError(f"CUDA is not available: {engine.cuda.unavailable_reason()}; use --device cpu "
                             "(or auto), or see the README's GPU quick start")
        index = int(device.partition(":")[2] or 0)
        if index >= engine.cuda.device_count():
            raise ValueError(f"there is no GPU {index}: this machine has {engine.cuda.device_count()}")
    return device


def describe_device(device: str) -> str:
    """The device as said once at a command's start: "cuda:0 (NVIDIA H200)", or "cpu" with why
    there is no GPU (engine's own reason: no CUDA build, no driver, no GPU)."""
    if device.startswith("cuda"):
        index = int(device.partition(":")[2] or 0)
        return f"cuda:{index} ({engine.cuda.get_device_name(index)})"
    if engine.cuda.is_available():
        return "cpu (a GPU is available: --device cuda)"
    return f"cpu (no GPU: {engine.cuda.unavailable_reason()})"


def device_arg(value: str) -> str:
    """argparse `type=` of --device: resolves `auto` at parse time (argparse converts a string
    default too), so that every caller of the parsed options gets a real device."""
    try:
        return resolve_device(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def spread_device(device: str, index: int) -> str:
    """Where replica `index` of a simulation runs: 'cuda' (no index) spreads the replicas round
    robin over every visible GPU (cuda:0, cuda:1, ...); any other device is used as given."""
    if device != "cuda" or not engine.cuda.is_available() or engine.cuda.device_count() < 2:
        return device
    return f"cuda:{index % engine.cuda.device_count()}"
