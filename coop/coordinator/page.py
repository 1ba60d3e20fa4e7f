"""The coordinator's status page at `/` (the frame and the charts are shared with the peers:
`coop.statuspage`, `coop.charts`).

`render_page(status, full=...)`: with `full` the whole page; without it (a server with a token,
asked without it: `coop.pageaccess`) the run's figures only: round, phase, losses, the number of
workers, bytes, the charts and the rounds table, and no worker's name, id, device or address, nor
the data's path on the coordinator.
"""
from __future__ import annotations

import html
from typing import Any

from coop.charts import bytes_chart, count_chart, loss_chart, seconds_chart
from coop.statuspage import access_note, cards, fmt, fmt_bytes, page, table


def _series(history: list[dict[str, Any]], key: str) -> list[tuple[float, float]]:
    return [(h["outer_steps"], h[key]) for h in history if h.get(key) is not None]


def charts(history: list[dict[str, Any]]) -> str:
    """The four charts over the rounds: loss, bytes received, duration, updates."""
    rounds = [h for h in history if h.get("round") is not None]
    return "".join([
        "<div class='charts'>",
        loss_chart("loss", {"val (global model)": _series(history, "val_loss"),
                            "train (workers' local)": _series(rounds, "train_loss")}),
        bytes_chart("bytes received per round", {"updates": _series(rounds, "bytes_in")}),
        seconds_chart("round duration", {"seconds": _series(rounds, "duration_s")}),
        count_chart("updates per round", {"contributors": _series(rounds, "contributors"),
                                          "active": _series(rounds, "active")}),
        "</div>",
    ])


def _cards(status: dict[str, Any]) -> str:
    val = status.get("val_loss")  # the newest weights the workers evaluated
    totals = status["totals"]
    items: list[tuple[str, Any]] = [
        ("round", f"{status['round']} / {status['max_rounds']}"),
        ("phase", "done" if status["done"] else status["phase"]),
        ("val loss", f"{val['loss']:.4f} (weights of round {val['round']}, {val['reports']} reports)" if val else None),
        ("reports", f"{len(status['reports'])} (quorum {status['quorum']})"),
        ("active workers", status["active_workers"]),
        ("workers known", len(status["workers"])),
    ]
    if not status["done"]:  # a finished run has no open round: no deadline to show
        items += [("open for", f"{status['open_for_s']:.0f} s"), ("deadline", f"{status['deadline_s']:.0f} s")]
    items += [
        ("received", fmt_bytes(totals["bytes_in"])),
        ("sent", fmt_bytes(totals["bytes_out"])),
        ("updates", f"{totals['updates_accepted']} ok / {totals['updates_rejected']} refused"),
    ]
    return cards(items)


def _workers(workers: list[dict[str, Any]]) -> str:
    if not workers:
        return "<p class='muted'>No worker has joined yet: <code>coop-worker join URL</code></p>"
    rows = []
    for w in workers:
        state = "left" if w["left"] else ("active" if w["active"] else "silent")
        cls = "on" if state == "active" else "off"
        if w.get("stale_in_a_row", 0) >= 2:  # refused as stale again and again: starved by the deadline
            state, cls = f"{state}, {w['stale_in_a_row']} late in a row", "off"
        rows.append([html.escape(w["id"]), html.escape(w["name"]), html.escape(w["device"]),
                     f"<span class='{cls}'>{state}</span>", str(w["shard"]), str(w["joined_round"]), str(w["rounds"]),
                     str(w["rejected"]), f"{w['tokens']:,}", fmt(w["tokens_per_s"], 0), fmt(w["last_loss"]),
                     fmt_bytes(w["bytes_up"]), fmt_bytes(w["bytes_down"]), f"{w['seen_s_ago']:.0f} s ago"])
    return table(["id", "name", "device", "state", "shard", "joined at round", "updates", "refused", "tokens",
                  "tokens/s", "last loss", "up", "down", "seen"], rows)


def _rounds(history: list[dict[str, Any]]) -> str:
    rounds = [h for h in history if h.get("round") is not None]
    if not rounds:
        return "<p class='muted'>No round has closed yet.</p>"
    rows = [[str(h["round"]), str(h["contributors"]), f"{h['tokens']:,}", fmt(h.get("train_loss")),
             fmt(h.get("val_loss")), fmt(h.get("pseudo_grad_norm")), fmt(h.get("outer_lr"), 3),
             fmt_bytes(h.get("bytes_in")), f"{h['duration_s']:.1f} s", html.escape(h["reason"])]
            for h in reversed(rounds[-12:])]
    return table(["round", "updates", "tokens", "train loss", "val loss", "|Δ|", "outer lr", "received", "duration",
                  "closed because"], rows)


def render_page(status: dict[str, Any], full: bool = True, protected: bool = False) -> str:
    """The page of `status` (Coordinator.status()). `full`: with the workers and the data's path;
    `protected`: the server has a token (the page then says how to log in, or out)."""
    model, data = status["model"], status["data"]
    where = f"data {html.escape(str(data['path']))} " if full else "data "
    subtitle = (f"v{html.escape(status['version'])} · up {status['uptime_s']:.0f} s · GPT {model['n_layer']}x"
                f"{model['n_embd']} ({model['parameters'] / 1e6:.2f}M parameters, vocab {model['vocab_size']}) · "
                f"K = {status['inner_steps']} · codec {html.escape(status['compression']['codec'])} · {where}"
                f"({data['train_tokens']:,} train tokens in {data['shards']} shards)")
    body = [access_note(protected, full), _cards(status), "<h2>Training</h2>", charts(status["history"])]
    if full:
        body += ["<h2>Workers</h2>", _workers(status["workers"])]
    body += ["<h2>Recent rounds</h2>", _rounds(status["history"])]
    return page(f"coop · round {status['round']}", "coop coordinator", subtitle, body,
                [("JSON", "/v1/status"), ("metrics", "/metrics"), ("API", "/docs")])
