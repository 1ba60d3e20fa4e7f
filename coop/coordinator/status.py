"""The coordinator's state as JSON (GET /v1/status): the round, the members, totals and history."""
from __future__ import annotations

from dataclasses import asdict
from typing import Any

from coop import __version__

from .evaluation import latest_val

def status_of(c: Any) -> dict[str, Any]:
    """`c`: the coop.coordinator.service.Coordinator (not imported: it imports this)."""
    now = c.clock()
    timeout = c.config.coordinator.worker_timeout_s
    current = c.machine.round
    active = c.members.active(now, timeout)
    return {
        "kind": "coordinator",
        "version": __version__,
        "uptime_s": round(now - c.started_at, 1),
        "round": current.number,
        "phase": current.phase.value,
        "done": c.machine.done,
        "max_rounds": c.config.rounds.max_rounds,
        "open_for_s": round(now - current.opened_at, 1),
        "deadline_s": round(current.deadline_s, 2),
        "reports": sorted(current.reports),
        "active_workers": len(active),
        "quorum": c.machine.quorum(len(active)),
        "model": {**asdict(c.model_config), "parameters": c.n_params},
        "data": c.data.describe(),
        "compression": c.config.compression.model_dump(),
        "inner_steps": c.config.inner.inner_steps,
        "totals": dict(c.totals),
        "workers": [w.public(now, timeout) for w in c.members.workers.values()],
        "val_loss": latest_val(c.history),
        # the round a restart resumes at (written after each close, beside the next round) and its write's time
        "checkpoint": {"resumes_at": c.checkpointer.saved_round, "write_s": round(c.checkpointer.last_seconds, 3)},
        "history": c.history,
    }
