"""A peer's status page at `/`: its round, losses, consensus distance, bytes and members, with the
coordinator's frame and charts (`coop.statuspage`, `coop.charts`).

`render_peer_page(status, full=...)`: with `full` the whole page; without it (a swarm with a token,
asked without it: `coop.pageaccess`) the figures only, and no peer's id or address.
"""
from __future__ import annotations

import html

from coop import __version__
from coop.charts import bytes_chart, count_chart, line_chart, loss_chart, seconds_chart
from coop.gossip.protocol import RoundRecord, Status
from coop.statuspage import access_note, cards, fmt, fmt_bytes, page, table


def _per_round_bytes(history: list[RoundRecord], key: str) -> list[tuple[float, float]]:
    """What each round moved: the differences of the running totals the records keep."""
    out, before = [], None
    for h in history:
        total = getattr(h, key)
        if before is not None:
            out.append((h.round, max(total - before, 0)))
        before = total
    return out


def charts(history: list[RoundRecord]) -> str:
    return "".join([
        "<div class='charts'>",
        loss_chart("loss", {"train (local)": [(h.round, h.loss) for h in history if h.loss is not None],
                            "val (after the merge)": [(h.round, h.val_loss) for h in history if h.val_loss is not None]}),
        line_chart("consensus distance", {"group spread": [(h.round, h.consensus_distance) for h in history
                                                           if h.consensus_distance is not None]},
                   kind="distance", y_label="distance", include_zero=True),
        bytes_chart("bytes per round", {"sent": _per_round_bytes(history, "bytes_sent"),
                                        "received": _per_round_bytes(history, "bytes_received")}),
        seconds_chart("round duration", {"seconds": [(h.round, h.seconds) for h in history]}),
        count_chart("group per round", {"averaged": [(h.round, 1 + len(h.received_from)) for h in history],
                                        "sent to": [(h.round, len(h.partners)) for h in history]}),
        "</div>",
    ])


def _members(status: Status) -> str:
    rows = [[html.escape(m.peer_id) + (" (this peer)" if m.peer_id == status.peer_id else ""), html.escape(m.url),
             str(m.active_from), str(m.round)] for m in status.members]
    return table(["peer", "url", "in groups from round", "round when last heard of"], rows)


def _rounds(history: list[RoundRecord], full: bool) -> str:
    if not history:
        return "<p class='muted'>No round done yet.</p>"

    def peers(ids: list[str]) -> str:
        return html.escape(", ".join(ids)) if full else str(len(ids))

    rows = [[str(h.round), fmt(h.loss), fmt(h.val_loss), fmt(h.consensus_distance), peers(h.partners),
             peers(h.received_from), f"{h.seconds:.1f} s"] for h in reversed(history[-12:])]
    return table(["round", "loss", "val loss", "consensus distance", "sent to", "averaged in", "duration"], rows)


def render_peer_page(status: Status, full: bool = True, protected: bool = False) -> str:
    """The page of `status` (PeerState.status()). `full`: with the members and the partners' ids;
    `protected`: the swarm has a token (the page then says how to log in, or out)."""
    who = f"peer {html.escape(status.peer_id)} at {html.escape(status.url)} · swarm {html.escape(status.swarm)}"
    history = status.history
    items = [
        ("round", f"{status.round} / {status.rounds}"),
        ("phase", status.phase),
        ("loss", status.loss),
        ("val loss", f"{fmt(status.initial_val_loss)} → {fmt(status.val_loss)}" if status.val_loss is not None else None),
        ("consensus distance", status.consensus_distance),
        ("members", len(status.members)),
        ("tokens/s", f"{status.tokens_per_second:,.0f}"),
        ("sent", fmt_bytes(status.bytes_sent)),
        ("received", fmt_bytes(status.bytes_received)),
        ("updates", f"{status.updates_accepted} ok / {status.updates_refused} refused / {status.updates_late} late"),
    ]
    body = [access_note(protected, full), cards(items), "<h2>Training</h2>", charts(history)]
    if full:
        body += ["<h2>Members</h2>", _members(status)]
    body += ["<h2>Recent rounds</h2>", _rounds(history, full)]
    return page(f"coop peer · round {status.round}", "coop peer", f"v{__version__}" + (f" · {who}" if full else ""),
                body, [("JSON", "/v1/status"), ("metrics", "/metrics"), ("API", "/docs")])
