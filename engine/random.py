"""The engine's random number generator: seeds weight init, random factories and dropout."""
from __future__ import annotations

import numpy as np

_generator = np.random.default_rng(0)


def manual_seed(seed: int) -> None:
    """Seed every random draw of the engine (weights, `randn`, dropout masks) for a reproducible run."""
    global _generator
    _generator = np.random.default_rng(seed)


def default_generator() -> np.random.Generator:
    return _generator


def next_seed() -> int:
    """A fresh seed for an on-device random kernel (dropout), drawn from the engine's generator."""
    return int(_generator.integers(0, 2**62))


def get_rng_state() -> dict:
    """The generator's state as plain JSON-able data (for checkpoints)."""
    return _generator.bit_generator.state


def set_rng_state(state: dict) -> None:
    global _generator
    gen = np.random.default_rng()
    gen.bit_generator.state = state
    _generator = gen
