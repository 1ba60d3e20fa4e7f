"""Prometheus metrics of one coordinator (its own registry, so several can live in one process),
with the process metrics and the build info of every coop server (`coop.exposition`).
Counters are declared without `_total` (prometheus_client appends it)."""
from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from coop.exposition import CONTENT_TYPE, render, server_registry


class CoordinatorMetrics:
    content_type = CONTENT_TYPE

    def __init__(self) -> None:
        self.registry = server_registry()
        r = self.registry
        self.round = Gauge("coop_round", "The open round (= outer steps taken)", registry=r)
        self.workers_active = Gauge("coop_workers_active", "Workers seen within the worker timeout", registry=r)
        self.workers_joined = Counter("coop_workers_joined", "Workers that joined", registry=r)
        self.joins_refused = Counter("coop_joins_refused", "Joins refused, by reason (rate, full)", ["reason"],
                                     registry=r)
        self.reports = Gauge("coop_round_reports", "Updates accepted for the open round", registry=r)
        # result: accepted, or why refused: stale, invalid, too_large, busy, timeout, aborted
        self.updates = Counter("coop_updates", "Update uploads by result", ["result"], registry=r)
        self.bytes_in = Counter("coop_received_bytes", "Update body bytes received", registry=r)
        self.bytes_out = Counter("coop_sent_bytes", "Bytes sent, by what (weights, delta, shard, val)", ["what"],
                                 registry=r)
        self.tokens = Counter("coop_tokens", "Tokens trained on in accepted updates", registry=r)
        self.train_loss = Gauge("coop_train_loss", "Token-weighted mean local loss of the last closed round", registry=r)
        self.val_loss = Gauge("coop_val_loss", "Val loss of the newest global weights the workers evaluated "
                              "(token-weighted mean of their reports; NaN before the first)", registry=r)
        self.eval_reports = Counter("coop_eval_reports", "Val loss reports from workers, by result (accepted, refused)",
                                    ["result"], registry=r)
        self.round_seconds = Histogram("coop_round_duration_seconds", "From a round's opening to its close", registry=r,
                                       buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600))
        self.aggregate_seconds = Histogram("coop_aggregate_seconds",
                                           "A round's close: aggregation, outer step, packing the weights "
                                           "(the checkpoint is written after)",
                                           registry=r, buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60))

    def render(self) -> bytes:
        return render(self.registry)
