"""The in-process transport: N replicas of one process meeting at a merge (`coop simulate`).

Each replica's `InProcessTransport` hands its contribution to the round's shared merge, which
decodes it as a receiver would (bytes counted exactly); once every replica taking part has
trained, the simulator closes the round and the merge makes the next round's weights. Two merges
(topologies): `star`, one global model and the outer optimizer, as the HTTP coordinator does;
`gossip`, coop.gossip.merge's rule, as the peers do.

Streaming (--fragments P, coop.streaming): round r merges fragment r mod P only, with that
fragment's own outer optimizer (and aggregator); a replica loads the fragment merged last round
and trains the rest on. With --overlap-steps the merge is applied that many steps into the next
round (the replica's `apply_after`): the simulator computes it at the round's close, as a real
merge would be computed while the replicas go on training.
"""
from __future__ import annotations

import importlib

import numpy as np

from ..diloco import Weights, shapes_of
from ..round import Contribution, RoundStart
from ..streaming import fragments, round_start
from .config import codec_for
from .setup import Setup, copy_weights, outer_optimizer


class Inbox:
    """The contributions of the open round: decoded updates, tokens and encoded bytes by replica."""

    def __init__(self) -> None:
        self.updates: dict[int, dict[str, np.ndarray]] = {}
        self.tokens: dict[int, int] = {}
        self.sent: dict[int, int] = {}

    def add(self, replica: int, contribution: Contribution) -> None:
        self.updates[replica] = contribution.decoded()
        self.tokens[replica] = contribution.tokens
        self.sent[replica] = contribution.nbytes


class InProcessTransport:
    """Replica `index`'s side of the in-process exchange: it trains round `topology.round` from
    `topology.base_for(index)`, on the simulator's one inner schedule, and files its update.
    A replica that did not file the last round's update (it missed the round, joined late or
    diverged) starts afresh from the global weights (`reset`): it did not see every merge."""

    def __init__(self, topology, index: int, round_steps: int, overlap_steps: int = 0):
        self.topology, self.index, self.round_steps, self.overlap_steps = topology, index, round_steps, overlap_steps
        self.filed: int | None = None  # the last round whose update this replica filed

    def begin(self) -> RoundStart:
        r = self.topology.round
        continuing = self.filed == r - 1
        return round_start(r, self.topology.base_for(self.index), self.topology.parts, continuing,
                           inner_step=r * self.round_steps, apply_after=self.overlap_steps if continuing else 0)

    def exchange(self, round_index: int, contribution: Contribution | None) -> str:
        if contribution is None:  # NaN/inf: the replica diverged; its update must not count
            self.filed = None
            return "diverged"
        self.topology.inbox.add(self.index, contribution)
        self.filed = round_index
        return "filed"


def fragment_parts(setup: Setup) -> list[list[str]]:
    return fragments(setup.initial, setup.cfg.fragments)


def fragment_bytes(weights: Weights, names: list[str]) -> int:
    return sum(4 * weights[n].size for n in names)


class StarTopology:
    """Everyone averages into one global model: aggregate (robust by default: cfg.aggregator),
    one outer step, then every replica receives the result (the HTTP coordinator's merge).
    With a lossy `downlink` codec the coordinator sends the outer update through it and applies
    the decoded update itself too, so coordinator and replicas keep identical weights."""

    name = "star"

    def __init__(self, setup: Setup, initial: Weights | None = None, first_round: int = 0):
        cfg = setup.cfg
        self.cfg, self.fp32_bytes = cfg, setup.fp32_bytes
        self.global_weights = copy_weights(setup.initial if initial is None else initial)
        self.parts = fragment_parts(setup)
        self.outers = [outer_optimizer(cfg) for _ in self.parts]  # one per fragment
        self.downlink = None if cfg.downlink == "fp32" else codec_for(cfg, cfg.downlink)
        # one per fragment for the run, as the coordinator keeps one
        self.aggregators = [cfg.aggregator(shapes_of({n: self.global_weights[n] for n in part})) for part in self.parts]
        self.refused: list[str] = []
        self.round, self.inbox = first_round, Inbox()

    def base_for(self, replica: int) -> dict[str, np.ndarray]:
        return self.global_weights

    def eval_weights(self) -> Weights:
        return self.global_weights

    def consensus_distance(self) -> float:
        return 0.0  # one model

    def merge(self, round_index: int, updates: dict[int, Weights], tokens: dict[int, int],
              sent: dict[int, int]) -> tuple[dict[int, int], dict[int, int]]:
        """Returns (bytes sent, bytes received) per replica for this merge."""
        f = round_index % len(self.parts)
        aggregator, outer = self.aggregators[f], self.outers[f]
        target = {n: self.global_weights[n] for n in self.parts[f]}  # views: the outer step moves them in place
        aggregator.reset()  # the streamed mean's adaptive bound carries over from the last round
        for i, update in updates.items():
            try:
                aggregator.add(update, weight=tokens[i] if self.cfg.weight_by == "tokens" else 1.0)
            except ValueError as error:  # a diverged replica: leave it out, keep the global weights clean
                self.refused.append(f"round {round_index} replica {i}: {error}")
        if aggregator.count == 0:
            return sent, {i: 0 for i in updates}
        before = copy_weights(target) if self.downlink else None
        outer.step(target, aggregator.result())
        received = fragment_bytes(target, list(target))
        if self.downlink is not None:
            step = {n: before[n] - w for n, w in target.items()}
            encoded = self.downlink.encode(step)
            decoded = self.downlink.decode(encoded.tensors, encoded.metadata)
            for n, w in target.items():
                np.subtract(before[n], decoded[n], out=w)
            received = encoded.nbytes
        return sent, {i: received for i in updates}


class GossipTopology:
    """No global model: each replica (peer) keeps its own copy of the global weights and its own
    outer optimizer. A round is `coop.gossip.merge.gossip_round` (the rule the real peers follow):
    random disjoint groups of `--gossip-group-size` drawn with `round_rng(seed, round)`, each
    replica averages its group's pseudo-gradients (and, with `--gossip-mix`, its group's weights),
    then takes its own outer step. With a group size >= N it is exactly the star merge.
    Bytes: to each partner, the encoded pseudo-gradient (plus the fp32 weights when mixing).
    The evaluated model is the mean of the copies of the replicas that have joined."""

    name = "gossip"

    def __init__(self, setup: Setup, initial: Weights | None = None, first_round: int = 0):
        self.gossip = gossip_module()
        self.cfg, self.fp32_bytes = setup.cfg, setup.fp32_bytes
        n = setup.cfg.replicas
        self.bases = {i: copy_weights(setup.initial if initial is None else initial) for i in range(n)}
        self.parts = fragment_parts(setup)
        self.outers = {i: [outer_optimizer(setup.cfg) for _ in self.parts] for i in range(n)}  # per fragment
        self.joined = {i for i in range(n) if setup.cfg.join_rounds().get(i, 0) <= first_round}
        self.refused: list[str] = []
        self.round, self.inbox = first_round, Inbox()

    def base_for(self, replica: int) -> dict[str, np.ndarray]:
        if replica not in self.joined:  # a new peer fetches the weights of one that is already in
            self.bases[replica] = copy_weights(self.bases[min(self.joined)])
            self.joined.add(replica)
        return self.bases[replica]

    def eval_weights(self) -> Weights:
        copies = [self.bases[i] for i in sorted(self.joined)]
        return {n: np.mean([b[n] for b in copies], axis=0, dtype=np.float64).astype(np.float32) for n in copies[0]}

    def consensus_distance(self) -> float:
        """How far the joined replicas' copies of the global weights are from their mean."""
        return self.gossip.consensus_distance([self.bases[i] for i in sorted(self.joined)])

    def merge(self, round_index, updates, tokens, sent):
        ids = sorted(updates)  # the active replicas in index order, as the rule says
        size, mix = self.cfg.gossip_group_size, self.cfg.gossip_mix
        f = round_index % len(self.parts)
        part = self.parts[f]
        targets = {i: {n: self.bases[i][n] for n in part} for i in ids}  # views, moved in place
        groups = self.gossip.gossip_groups(len(ids), size, self.gossip.round_rng(self.cfg.seed, round_index)) \
            if len(ids) > 1 else [[0]]
        averaged = self.gossip.gossip_round([updates[i] for i in ids], [float(tokens[i]) for i in ids], size,
                                            self.gossip.round_rng(self.cfg.seed, round_index),
                                            [targets[i] for i in ids] if mix else None)
        for i, update in zip(ids, averaged):
            self.outers[i][f].step(targets[i], update)
        mixed_bytes = fragment_bytes(self.bases[ids[0]], part) if mix else 0
        message = {i: sent[i] + mixed_bytes for i in ids}
        bytes_sent, bytes_received = {}, {}
        for group in groups:
            members = [ids[k] for k in group]
            for i in members:
                bytes_sent[i] = (len(members) - 1) * message[i]
                bytes_received[i] = sum(message[j] for j in members if j != i)
        return bytes_sent, bytes_received


TOPOLOGIES = {"star": StarTopology, "gossip": GossipTopology}


def close_round(topology) -> tuple[dict[int, int], dict[int, int]] | None:
    """Merge the open round's contributions (None if there were none) and open the next round.
    Returns (bytes sent, bytes received) per replica that contributed."""
    inbox, topology.inbox = topology.inbox, Inbox()
    round_index = topology.round
    topology.round += 1
    if not inbox.updates:
        return None
    return topology.merge(round_index, inbox.updates, inbox.tokens, inbox.sent)


def gossip_module():
    """coop.gossip.merge, loaded when a run asks for --topology gossip: a coop without peer mode
    (no coop.gossip) still simulates the star, and says what is missing otherwise."""
    try:
        return importlib.import_module("coop.gossip.merge")
    except ImportError as error:
        raise SystemExit(f"coop simulate: --topology gossip needs coop.gossip.merge (gossip_round, gossip_groups, "
                         f"round_rng), which is not available here ({error}); use --topology star") from None
