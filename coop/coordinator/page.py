"""The status page at `/`: server-rendered HTML with inline SVG charts, no JavaScript, no build step.
It refreshes itself every few seconds."""
from __future__ import annotations

import html
import time
from typing import Any

COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c"]


def _num(value: Any, digits: int = 4) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else html.escape(str(value))


def _bytes(n: float | None) -> str:
    if n is None:
        return "–"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def _tick(value: float) -> str:
    return f"{value:.3g}"


def line_chart(title: str, series: dict[str, list[tuple[float, float]]], width: int = 460, height: int = 220,
               y_label: str = "") -> str:
    """An SVG line chart of one or more (x, y) series sharing the axes."""
    points = [p for values in series.values() for p in values]
    left, right, top, bottom = 52, 12, 28, 30
    parts = [f'<svg viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
             f'aria-label="{html.escape(title)}">',
             f'<text x="{left}" y="16" class="title">{html.escape(title)}</text>']
    if not points:
        parts.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" class="muted">no data yet</text></svg>')
        return "".join(parts)
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        y0, y1 = y0 - abs(y0) * 0.1 - 1e-9, y1 + abs(y1) * 0.1 + 1e-9
    pad = (y1 - y0) * 0.05
    y0, y1 = y0 - pad, y1 + pad
    plot_w, plot_h = width - left - right, height - top - bottom

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * plot_w

    def sy(y: float) -> float:
        return top + (1 - (y - y0) / (y1 - y0)) * plot_h

    parts.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" class="frame"/>')
    for i in range(5):  # horizontal grid lines with labels
        y = y0 + (y1 - y0) * i / 4
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" class="grid"/>'
                     f'<text x="{left - 4}" y="{sy(y) + 4:.1f}" text-anchor="end" class="axis">{_tick(y)}</text>')
    for x in (x0, (x0 + x1) / 2, x1):
        parts.append(f'<text x="{sx(x):.1f}" y="{height - 12}" text-anchor="middle" class="axis">{_tick(x)}</text>')
    parts.append(f'<text x="{left + plot_w / 2}" y="{height - 1}" text-anchor="middle" class="axis">round</text>')
    if y_label:
        parts.append(f'<text x="10" y="{top + plot_h / 2}" transform="rotate(-90 10 {top + plot_h / 2})" '
                     f'text-anchor="middle" class="axis">{html.escape(y_label)}</text>')
    for i, (name, values) in enumerate(series.items()):
        color = COLORS[i % len(COLORS)]
        if not values:
            continue
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in values)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        if len(values) <= 60:
            parts.extend(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{color}"/>' for x, y in values)
        parts.append(f'<text x="{left + plot_w - 4}" y="{top + 14 + 14 * i}" text-anchor="end" fill="{color}" '
                     f'class="legend">{html.escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _series(history: list[dict[str, Any]], key: str, scale: float = 1.0) -> list[tuple[float, float]]:
    return [(h["outer_steps"], h[key] * scale) for h in history if h.get(key) is not None]


STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#111;background:#fafafa}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:24px 0 8px}
.muted{color:#6b7280;fill:#6b7280} .cards{display:flex;gap:12px;flex-wrap:wrap}
.card{background:#fff;border:1px solid #e5e7eb;border-radius:8px;padding:10px 14px;min-width:110px}
.card b{display:block;font-size:18px} .charts{display:flex;gap:16px;flex-wrap:wrap}
svg{background:#fff;border:1px solid #e5e7eb;border-radius:8px} .title{font-weight:600;font-size:13px}
.axis{font-size:10px;fill:#6b7280} .legend{font-size:11px} .frame{fill:none;stroke:#d1d5db}
.grid{stroke:#f3f4f6} table{border-collapse:collapse;background:#fff}
td,th{border:1px solid #e5e7eb;padding:4px 8px;text-align:right} th{background:#f3f4f6}
td:first-child,th:first-child{text-align:left} .on{color:#16a34a} .off{color:#9ca3af}
"""


def render_page(status: dict[str, Any]) -> str:
    history = [h for h in status["history"]]
    rounds = [h for h in history if h.get("round") is not None]
    model, data = status["model"], status["data"]
    phase = "done" if status["done"] else status["phase"]
    val = status.get("val_loss")  # the newest weights the workers evaluated
    cards = [
        ("round", f"{status['round']} / {status['max_rounds']}"),
        ("phase", phase),
        ("val loss", f"{val['loss']:.4f} (weights of round {val['round']}, {val['reports']} reports)" if val else None),
        ("reports", f"{len(status['reports'])} (quorum {status['quorum']})"),
        ("active workers", status["active_workers"]),
        ("open for", f"{status['open_for_s']:.0f} s"),
        ("deadline", f"{status['deadline_s']:.0f} s"),
        ("received", _bytes(status["totals"]["bytes_in"])),
        ("sent", _bytes(status["totals"]["bytes_out"])),
        ("updates", f"{status['totals']['updates_accepted']} ok / {status['totals']['updates_rejected']} refused"),
    ]
    out = [f"<!doctype html><html><head><meta charset='utf-8'><meta http-equiv='refresh' content='5'>"
           f"<title>coop · round {status['round']}</title><style>{STYLE}</style></head><body>",
           f"<h1>coop coordinator</h1><div class='muted'>v{html.escape(status['version'])} · up "
           f"{status['uptime_s']:.0f} s · GPT {model['n_layer']}x{model['n_embd']} "
           f"({model['parameters'] / 1e6:.2f}M parameters, vocab {model['vocab_size']}) · "
           f"K = {status['inner_steps']} · codec {html.escape(status['compression']['codec'])} · data "
           f"{html.escape(str(data['path']))} ({data['train_tokens']:,} train tokens in {data['shards']} shards) · "
           f"{time.strftime('%Y-%m-%d %H:%M:%S')}</div>",
           "<div class='cards'>"]
    out += [f"<div class='card'><span class='muted'>{html.escape(k)}</span><b>{_num(v)}</b></div>" for k, v in cards]
    out.append("</div><h2>Training</h2><div class='charts'>")
    out.append(line_chart("loss", {"val (global model)": _series(history, "val_loss"),
                                    "train (workers' local)": _series(rounds, "train_loss")}, y_label="loss"))
    out.append(line_chart("bytes received per round", {"MB": _series(rounds, "bytes_in", 1e-6)}, y_label="MB"))
    out.append(line_chart("round duration", {"seconds": _series(rounds, "duration_s")}, y_label="s"))
    out.append(line_chart("updates per round", {"contributors": _series(rounds, "contributors"),
                                                 "active": _series(rounds, "active")}))
    out.append("</div><h2>Workers</h2>")
    workers = status["workers"]
    if workers:
        out.append("<table><tr><th>id</th><th>name</th><th>device</th><th>state</th><th>shard</th><th>joined at round</th>"
                   "<th>updates</th><th>refused</th><th>tokens</th><th>tokens/s</th><th>last loss</th><th>up</th>"
                   "<th>down</th><th>seen</th></tr>")
        for w in workers:
            state = "left" if w["left"] else ("active" if w["active"] else "silent")
            cls = "on" if state == "active" else "off"
            if w.get("stale_in_a_row", 0) >= 2:  # refused as stale again and again: starved by the deadline
                state, cls = f"{state}, {w['stale_in_a_row']} late in a row", "off"
            out.append(f"<tr><td>{html.escape(w['id'])}</td><td>{html.escape(w['name'])}</td>"
                       f"<td>{html.escape(w['device'])}</td><td class='{cls}'>{state}</td><td>{w['shard']}</td>"
                       f"<td>{w['joined_round']}</td><td>{w['rounds']}</td><td>{w['rejected']}</td>"
                       f"<td>{w['tokens']:,}</td><td>{_num(w['tokens_per_s'], 0)}</td><td>{_num(w['last_loss'])}</td>"
                       f"<td>{_bytes(w['bytes_up'])}</td><td>{_bytes(w['bytes_down'])}</td>"
                       f"<td>{w['seen_s_ago']:.0f} s ago</td></tr>")
        out.append("</table>")
    else:
        out.append("<p class='muted'>No worker has joined yet: <code>coop-worker join URL</code></p>")
    out.append("<h2>Recent rounds</h2>")
    if rounds:
        out.append("<table><tr><th>round</th><th>updates</th><th>tokens</th><th>train loss</th><th>val loss</th>"
                   "<th>|Δ|</th><th>outer lr</th><th>received</th><th>duration</th><th>closed because</th></tr>")
        for h in reversed(rounds[-12:]):
            out.append(f"<tr><td>{h['round']}</td><td>{h['contributors']}</td><td>{h['tokens']:,}</td>"
                       f"<td>{_num(h.get('train_loss'))}</td><td>{_num(h.get('val_loss'))}</td>"
                       f"<td>{_num(h.get('pseudo_grad_norm'))}</td><td>{_num(h.get('outer_lr'), 3)}</td>"
                       f"<td>{_bytes(h.get('bytes_in'))}</td><td>{h['duration_s']:.1f} s</td>"
                       f"<td>{html.escape(h['reason'])}</td></tr>")
        out.append("</table>")
    else:
        out.append("<p class='muted'>No round has closed yet.</p>")
    out.append("<p class='muted'>JSON: <a href='/v1/status'>/v1/status</a> · metrics: <a href='/metrics'>/metrics</a>"
               " · API: <a href='/docs'>/docs</a></p></body></html>")
    return "".join(out)
