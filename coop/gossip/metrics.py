"""Prometheus metrics of one peer (GET /metrics), read from its state when scraped: the figures of
its status, under the coordinator's names where they mean the same (`coop_round`,
`coop_train_loss`, `coop_val_loss`, `coop_received_bytes_total`, `coop_sent_bytes_total`,
`coop_updates_total{result}`), plus the process metrics and build info of every coop server
(`coop.exposition`). A value not measured yet (a loss before the first round) is NaN."""
from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from coop.exposition import CONTENT_TYPE, render, server_registry
from coop.gossip.node import PeerState

PHASES = ("starting", "waiting", "training", "exchanging", "done", "stopped")


def _value(x: float | None) -> float:
    return math.nan if x is None else float(x)


class PeerCollector:
    """Collects from a `coop.gossip.node.PeerState` (under its lock) at every scrape."""

    def __init__(self, node: PeerState) -> None:
        self.node = node

    def collect(self) -> Iterator[Metric]:
        node = self.node
        with node.cond:
            members = len(node.membership.members) if node.membership else 0
            last = node.history[-1] if node.history else None
            figures = (node.round, node.phase, members, node.last_loss, node.last_val, node.last_cd,
                       node.updates_accepted, node.updates_refused, node.updates_late, node.bytes_received,
                       node.bytes_sent, node.tokens_per_second, last.seconds if last else None)
        (round_index, phase, members, loss, val, cd, accepted, refused, late, received, sent, tokens_per_s,
         seconds) = figures
        yield GaugeMetricFamily("coop_round", "The peer's round (= outer steps it took)", value=round_index)
        state = GaugeMetricFamily("coop_peer_phase", "1 for the peer's phase, 0 for the others", labels=["phase"])
        for name in PHASES:
            state.add_metric([name], 1.0 if name == phase else 0.0)
        yield state
        yield GaugeMetricFamily("coop_members", "Members of the swarm this peer knows, itself included", value=members)
        yield GaugeMetricFamily("coop_train_loss", "Mean local loss of the peer's last round", value=_value(loss))
        yield GaugeMetricFamily("coop_val_loss", "Val loss of the peer's global weights, last evaluated",
                                value=_value(val))
        yield GaugeMetricFamily("coop_consensus_distance", "Spread of the last group's global weights before "
                                "mixing (docs/p2p.md)", value=_value(cd))
        updates = CounterMetricFamily("coop_updates", "Partners' updates received, by result", labels=["result"])
        updates.add_metric(["accepted"], accepted)
        updates.add_metric(["refused"], refused)
        updates.add_metric(["late"], late)
        yield updates
        yield CounterMetricFamily("coop_received_bytes", "Bytes received: partners' updates, and the state and data "
                                  "fetched at join", value=received)
        yield CounterMetricFamily("coop_sent_bytes", "Bytes sent: updates pushed to partners, state and data "
                                  "served to newcomers", value=sent)
        yield GaugeMetricFamily("coop_train_tokens_per_second", "Training throughput of the last round",
                                value=tokens_per_s)
        yield GaugeMetricFamily("coop_last_round_duration_seconds", "Wall time of the peer's last round",
                                value=_value(seconds))


class PeerMetrics:
    content_type = CONTENT_TYPE

    def __init__(self, node: PeerState) -> None:
        self.registry = server_registry()
        self.registry.register(PeerCollector(node))  # no describe(): nothing is read until a scrape

    def render(self) -> bytes:
        return render(self.registry)
