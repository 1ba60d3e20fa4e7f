"""What `coop simulate` leaves behind: metrics as JSONL, a PNG plot and a summary table.

One JSON object per line and per evaluation point, every run of an invocation in one file:

    {"run": "diloco-int8", "round": 3, "step": 150, "tokens": 1228800, "train_loss": 2.41,
     "val_loss": 2.45, "bytes_sent": 3290112, "bytes_received": 9830400,
     "bytes_sent_by_replica": [...], "bytes_received_by_replica": [...], "taking_part": [0, 1, 3],
     "wall_s": 41.2}

`tokens` counts every replica's tokens (the budget the baselines match); `step` counts inner
steps of one replica; bytes are cumulative per replica (`bytes_sent` / `bytes_received` are those
of the busiest replica, the link that limits a round). The plot and the table are rebuilt from
these records only, so `coop simulate --report metrics.jsonl` redraws them from several runs.
"""
from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable
from pathlib import Path

from ..progress import Progress, format_duration


class RunLog:
    """One run's bookkeeping: cumulative bytes per replica (the run adds to `sent` / `received`),
    one record per evaluation point (kept, appended to the JSONL file), and the progress line."""

    def __init__(self, name: str, replicas: int, total: int, jsonl: Path | None = None, quiet: bool = False):
        self.name, self.jsonl = name, jsonl
        self.sent, self.received = [0] * replicas, [0] * replicas
        self.tokens, self.records, self.start = 0, [], time.perf_counter()
        self.progress = Progress(total=total, quiet=quiet, unit="round")

    def point(self, done: int, step: int, train_loss: float, val_loss: float | None, tokens: int,
              taking_part: list[int], consensus_distance: float | None = None) -> dict:
        """Log round (or point) `done`: `tokens` processed since the last point, by `taking_part`;
        for DiLoCo runs also how far the replicas' copies of the global weights are apart."""
        self.tokens += tokens
        record = {"run": self.name, "round": done, "step": step, "tokens": self.tokens,
                  "train_loss": round(train_loss, 6) if math.isfinite(train_loss) else None,  # None: nobody trained
                  "val_loss": None if val_loss is None else round(val_loss, 6),  # None: not evaluated here
                  "bytes_sent": max(self.sent), "bytes_received": max(self.received),
                  "bytes_sent_by_replica": list(self.sent), "bytes_received_by_replica": list(self.received),
                  "taking_part": list(taking_part), "wall_s": round(time.perf_counter() - self.start, 3)}
        if consensus_distance is not None:
            record["consensus_distance"] = round(consensus_distance, 6)
        self.records.append(record)
        if self.jsonl:
            append_jsonl(self.jsonl, record)
        val = "-" if val_loss is None else f"{val_loss:.4f}"
        self.progress.update(done, f"{self.name}: train {train_loss:.4f} val {val} "
                             f"replicas {len(taking_part)} sent {human_bytes(record['bytes_sent'])} "
                             f"recv {human_bytes(record['bytes_received'])}", tokens=tokens)
        return record


def append_jsonl(path: str | os.PathLike[str], record: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def read_jsonl(paths: Iterable[str | os.PathLike[str]]) -> list[dict]:
    records = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            records.extend(json.loads(line) for line in f if line.strip())
    return records


def by_run(records: Iterable[dict]) -> dict[str, list[dict]]:
    """Run name -> its records in order (a later record of the same run and step replaces an earlier one)."""
    runs: dict[str, dict[int, dict]] = {}
    for record in records:
        runs.setdefault(record["run"], {})[record["step"]] = record
    return {name: [points[s] for s in sorted(points)] for name, points in runs.items()}


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1000
    return f"{n} B"  # unreachable


def summary_rows(records: Iterable[dict], reference: str = "ddp") -> list[dict]:
    """One row per run (its last record), compared with the `reference` run when present."""
    runs = by_run(records)
    ref = runs[reference][-1] if reference in runs else None
    rows = []
    for name, points in runs.items():
        last = points[-1]
        total = last["bytes_sent"] + last["bytes_received"]
        row = {"run": name, "tokens": last["tokens"], "steps": last["step"], "val_loss": last["val_loss"],
               "train_loss": last["train_loss"], "bytes_sent": last["bytes_sent"],
               "bytes_received": last["bytes_received"], "bytes_total": total, "wall_s": last["wall_s"]}
        if ref is not None:
            row["val_vs_ref"] = last["val_loss"] / ref["val_loss"] - 1.0
            ref_total = ref["bytes_sent"] + ref["bytes_received"]
            row["bytes_ratio"] = ref_total / total if total else math.inf
        rows.append(row)
    return rows


def format_table(rows: list[dict], reference: str = "ddp") -> str:
    """A Markdown table (readable in a terminal too)."""
    has_ref = any("val_vs_ref" in r for r in rows)
    head = ["run", "tokens", "steps", "val loss", "train loss", "sent / replica", "received / replica"]
    if has_ref:
        head += [f"val vs {reference}", f"fewer bytes than {reference}"]
    head.append("wall")
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    for r in rows:
        train = "-" if r["train_loss"] is None else f"{r['train_loss']:.4f}"
        cells = [r["run"], f"{r['tokens']:,}", str(r["steps"]), f"{r['val_loss']:.4f}", train,
                 human_bytes(r["bytes_sent"]), human_bytes(r["bytes_received"])]
        if has_ref:
            ratio = r.get("bytes_ratio")
            cells += [f"{100 * r['val_vs_ref']:+.2f}%" if "val_vs_ref" in r else "",
                      "" if ratio is None else ("no bytes" if math.isinf(ratio) else f"{ratio:.1f}x")]
        cells.append(format_duration(r["wall_s"]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_plot(records: Iterable[dict], path: str | os.PathLike[str], title: str = "") -> Path:
    """Two panels: val loss against tokens (all replicas together), and against bytes
    communicated per replica (sent + received, log x; runs that send nothing are left out)."""
    try:
        import matplotlib  # imported here: slow to import, optional (coop[plot]), and only the plot needs it
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(f"the plot needs matplotlib: pip install 'coop[plot]' ({error})",
                                  name=error.name) from None

    matplotlib.use("Agg")  # no display needed; never opens a window
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    runs = by_run(records)
    fig, (ax_tokens, ax_bytes) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, points in runs.items():
        points = [p for p in points if p["val_loss"] is not None]  # --eval-every: points without one
        tokens = [p["tokens"] for p in points]
        val = [p["val_loss"] for p in points]
        (line,) = ax_tokens.plot(tokens, val, marker=".", label=name)
        sent = [(p["bytes_sent"] + p["bytes_received"], p["val_loss"]) for p in points]
        sent = [(b, v) for b, v in sent if b > 0]
        if sent:
            ax_bytes.plot(*zip(*sent), marker=".", color=line.get_color(), label=name)
    ax_tokens.set_xlabel("tokens (all replicas)")
    ax_tokens.set_ylabel("val loss")
    ax_tokens.set_title("val loss vs tokens")
    ax_bytes.set_xscale("log")
    ax_bytes.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: human_bytes(x)))
    ax_bytes.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax_bytes.set_xlabel("bytes sent + received per replica (log)")
    ax_bytes.set_title("val loss vs communication")
    for ax in (ax_tokens, ax_bytes):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def finish(records: list[dict], out: Path, plot: bool, log=print, title: str = "") -> None:
    """Log the summary table; write the plot as OUT/plot.png."""
    if not records:
        return
    log("\n" + format_table(summary_rows(records)))
    if plot:
        try:
            log(f"plot: {write_plot(records, out / 'plot.png', title)}")
        except ModuleNotFoundError as error:
            if error.name != "matplotlib":
                raise
            log("plot: not written, matplotlib is not installed: pip install 'coop[plot]' (the table above and "
                "metrics.jsonl are written; `coop simulate --report` draws the plot later)")
