"""The one check every command makes of its --device before any work."""
from __future__ import annotations

import engine


def device_problem(command: str, device: str) -> str | None:
    """Why `command` cannot run on `device`, as the one line to print; None when it can."""
    if device.startswith("cuda") and not engine.cuda.is_available():
        return f"{command}: --device {device} but CUDA is not available: {engine.cuda.unavailable_reason()}"
    return None


def spread_device(device: str, index: int) -> str:
    """Where replica `index` of a simulation runs: 'cuda' (no index) spreads the replicas round
    robin over every visible GPU (cuda:0, cuda:1, ...); any other device is used as given."""
    if device != "cuda" or not engine.cuda.is_available() or engine.cuda.device_count() < 2:
        return device
    return f"cuda:{index % engine.cuda.device_count()}"
