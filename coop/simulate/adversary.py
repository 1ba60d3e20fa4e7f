"""Adversarial replicas for `coop simulate --adversaries N --attack KIND --attack-scale S`.

An adversary trains honestly (so its update has the honest one's statistics), then replaces the
pseudo-gradient it returns by the attack before the round loop encodes it: what it sends is what
any receiver decodes. The attacks, with g the honest pseudo-gradient and s the scale:

    signflip   -s * g
    noise      gaussian noise of global L2 norm s * |g| (the honest update is dropped)
    scale      s * g
"""
from __future__ import annotations

import numpy as np

from ..diloco import Weights, global_norm
from ..replica import Replica, RoundResult

ATTACKS = ("signflip", "noise", "scale")


def attack(kind: str, update: Weights, scale: float, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The update an adversary sends instead of its honest `update`."""
    if kind == "signflip":
        return {name: np.asarray(-scale * np.asarray(a, np.float32), dtype=np.float32) for name, a in update.items()}
    if kind == "scale":
        return {name: np.asarray(scale * np.asarray(a, np.float32), dtype=np.float32) for name, a in update.items()}
    if kind == "noise":
        noise = {name: rng.standard_normal(np.shape(a)).astype(np.float32) for name, a in update.items()}
        factor = np.float32(scale * global_norm(update) / max(global_norm(noise), 1e-30))
        return {name: np.asarray(a * factor, dtype=np.float32) for name, a in noise.items()}
    raise ValueError(f"unknown attack {kind!r}; expected one of {', '.join(ATTACKS)}")


class AdversarialReplica(Replica):
    """A replica that trains as the others do and sends `attack(kind, honest update, scale)`."""

    def __init__(self, *args, attack: str, attack_scale: float, attack_seed: int, **kwargs):
        super().__init__(*args, **kwargs)
        if attack not in ATTACKS:
            raise ValueError(f"unknown attack {attack!r}; expected one of {', '.join(ATTACKS)}")
        self.attack, self.attack_scale = attack, float(attack_scale)
        self.attack_rng = np.random.default_rng(attack_seed)

    def run_round(self, global_weights: dict[str, np.ndarray], inner_steps: int, **options) -> RoundResult:
        result = super().run_round(global_weights, inner_steps, **options)
        result.pseudo_gradient = attack(self.attack, result.pseudo_gradient, self.attack_scale, self.attack_rng)
        return result
