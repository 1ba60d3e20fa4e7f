"""Eager overlap: the outer step a replica takes alone while the round's merge is on its way.

With overlap a replica goes on training after it has sent its pseudo-gradient g_i, and the merge
(the mean g over the replicas, then the outer Nesterov step) reaches it some inner steps later.
Those steps used to start from the replica's own end of round, local = anchor - g_i. But the
merge moves the weights much further than that: with lr 0.7 and momentum 0.9 it is

    anchor - lr * ((1 + mu) * g + mu^2 * b)        (b: the outer momentum buffer before the step)

and b, an average of ~1 / (1 - mu) rounds of updates, is most of the move. So the steps of the
overlap were taken far from where the model was going, and the merge then jumped away from them.

Eager updates (Kale, Douillard, Donchev 2025: "Eager updates for overlapped communication and
computation in DiLoCo") take the outer step at once with the replica's own pseudo-gradient standing
in for the mean: the steps of the overlap start from

    guess = anchor - lr * ((1 + mu) * g_i + mu^2 * b)

and when the merge arrives the progress made since the guess is kept on top of it, exactly as
before (local <- global + (local - guess)): nothing is counted twice, only the starting point moved.

The replica has no momentum buffer of its own; it reads it off the merges it receives. Each merge
moved the global weights by before - after = lr * ((1 + mu) * g + mu^2 * b) (Nesterov; without it,
lr * (mu * b + g)), which gives the mean g, and then b <- mu * b + g. A replica that joins late
starts with b = 0; the error of the estimate shrinks by mu / (1 + mu) (~0.47) with every merge it
sees, so a few rounds after joining it holds the merge side's buffer to float32 rounding (or, with
a compressed downlink, to the codec's rounding of the weights it is sent).
"""
from __future__ import annotations

from collections.abc import Callable

import engine

from .outer import NesterovSGD


EAGER_FROM = 0.25  # of a round's inner steps: a shorter overlap starts from the round's end by default


def eager_by_default(overlap_steps: int, round_steps: int) -> bool:
    """Whether an overlap of `overlap_steps` starts from the eager step when the run does not say.
    The eager step has a fixed cost (two jumps a round) where the round's end has one that grows
    with the steps; they cross between 10% and 30% of the round (docs/scaling.md)."""
    return overlap_steps > 0 and overlap_steps >= EAGER_FROM * round_steps


class EagerOuter:
    """The merge side's outer step, as far as a replica can know it: `lr_of_round(r)` is the lr of
    the merge that closes round r, `momentum` and `nesterov` its optimizer's. Device tensors in,
    device tensors out (the replica keeps its anchor and weights there)."""

    def __init__(self, lr_of_round: Callable[[int], float], momentum: float, nesterov: bool):
        self.lr_of_round, self.momentum, self.nesterov = lr_of_round, float(momentum), bool(nesterov)
        self.buffer: dict[str, engine.Tensor] = {}  # the outer momentum buffer, read off the merges seen

    @classmethod
    def of(cls, outer: NesterovSGD, round_of_first_step: int = 0, rounds_per_step: int = 1) -> EagerOuter:
        """The eager step of `outer`'s schedule, its step t closing round round_of_first_step + t * rounds_per_step
        (streaming DiLoCo with its own optimizer per fragment steps each one every P rounds)."""
        schedule = NesterovSGD(outer.lr, outer.momentum, outer.nesterov, outer.warmup_steps, outer.decay_steps,
                               outer.min_lr_factor)

        def lr_of_round(round_index: int) -> float:
            schedule.step_count = max(0, (round_index - round_of_first_step) // rounds_per_step)
            return schedule.current_lr()
        return cls(lr_of_round, outer.momentum, outer.nesterov)

    def observe(self, name: str, before: engine.Tensor, after: engine.Tensor, round_index: int) -> None:
        """The merge of `round_index` moved tensor `name` of the global weights from `before` to
        `after`: the momentum buffer follows it."""
        if self.momentum == 0:
            return
        mu, lr = self.momentum, self.lr_of_round(round_index)
        with engine.no_grad():
            moved = (before - after) * (1.0 / lr)  # (1 + mu) g + mu^2 b (Nesterov), g + mu b (heavy ball)
            buffer = self.buffer.get(name)
            if self.nesterov:
                mean = moved if buffer is None else moved - buffer * (mu * mu)
                mean = mean * (1.0 / (1.0 + mu))
            else:
                mean = moved if buffer is None else moved - buffer * mu
            self.buffer[name] = mean if buffer is None else buffer * mu + mean

    def guess(self, name: str, anchor: engine.Tensor, local: engine.Tensor, round_index: int) -> engine.Tensor:
        """Where the merge of `round_index` would put tensor `name` if every replica's pseudo-gradient
        were this one's, anchor - local."""
        mu, lr = self.momentum, self.lr_of_round(round_index)
        with engine.no_grad():
            own = anchor - local
            buffer = self.buffer.get(name)
            if mu == 0:
                return anchor - own * lr
            buffer = own if buffer is None else buffer * mu + own
            direction = own + buffer * mu if self.nesterov else buffer
            return anchor - direction * lr

    def forget(self) -> None:
        """The replica lost the thread of the merges (it missed one, or rejoined): b starts from 0."""
        self.buffer = {}
