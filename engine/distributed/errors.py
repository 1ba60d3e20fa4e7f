"""What engine.distributed raises: one base class, so `except DistributedError` catches them all."""
from __future__ import annotations


class DistributedError(RuntimeError):
    """A process group failed: a rank died, a collective timed out, the store went away."""


class DistributedTimeoutError(DistributedError):
    """A rank waited longer than the timeout for the others."""


class RankDiedError(DistributedError):
    """A rank of the group died (its connection to the store closed without leaving)."""

    def __init__(self, dead: dict[int, str], during: str = ""):
        self.dead = dict(dead)
        who = ", ".join(f"rank {r} ({how})" for r, how in sorted(self.dead.items()))
        super().__init__(f"{who} died{' while ' + during if during else ''}; the process group cannot go on "
                         "(the launcher ends the other ranks; start the run again)")
