"""The one check every command makes of its --device before any work."""
from __future__ import annotations

import engine


def device_problem(command: str, device: str) -> str | None:
    """Why `command` cannot run on `device`, as the one line to print; None when it can."""
    if device.startswith("cuda") and not engine.cuda.is_available():
        return f"{command}: --device {device} but CUDA is not available: {engine.cuda.unavailable_reason()}"
    return None
