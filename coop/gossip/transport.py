"""The gossip transport: a peer's rounds (coop.round.Transport) over the other peers.

    begin:    the peer's own round and its own copy of the global weights
    exchange: send the encoded pseudo-gradient to this round's group, wait for theirs, merge
              and take the outer step on the peer's copy (coop.gossip.merge.merge_and_step:
              a contribution that still fails there is dropped, never the round)

There is no coordinator: every peer is its own merge, so a peer's outer optimizer lives here,
on the training side, next to its copy of the global weights.
"""
from __future__ import annotations

import time

import httpx

from coop.gossip.merge import merge_and_step, partners_of, round_rng
from coop.gossip.node import PeerState
from coop.gossip.payload import pack_encoded
from coop.gossip.protocol import Member
from coop.round import Contribution, RoundStart
from coop.streaming import round_start
from coop.wire import upload_chunks

RETRY_SECONDS = 0.25  # between attempts to deliver an update to a partner that is behind


def exchange_state(round_index: int, sent: set[str], received: set[str], member_rounds: dict[str, int],
                   push_results: dict[str, str]) -> tuple[dict[str, int], list[str]]:
    """Where an exchange stands with each partner we sent to -> (past, pending).

    past: partner -> its round, for partners that by their heartbeats merged this round without
    us: they skipped it after falling behind, or closed it before our update came. Only once our
    push to it has ended other than accepted: a partner that took our update merged it, and its own
    update to us is on its way; and while our push is in flight its heartbeat can already show the
    next round (it merged ours, and its update to us was still on the wire).
    pending: partners we still wait for: still being sent to, or that took ours and have not sent
    theirs. A partner that left the members is neither."""
    past = {pid: member_rounds[pid] for pid in sent
            if pid in member_rounds and member_rounds[pid] > round_index and pid not in received
            and push_results.get(pid) not in (None, "accepted")}
    pending = sorted(pid for pid in sent if pid not in received and pid in member_rounds and pid not in past
                     and push_results.get(pid) in (None, "accepted"))
    return past, pending


class GossipTransport:
    """Streaming (P fragments, coop.streaming): round r exchanges and merges fragment r mod P only;
    the replica loads the fragment its last merge changed, or starts afresh from the whole copy
    when it skipped a round (it fell behind, or its update diverged)."""

    def __init__(self, node: PeerState):
        self.node = node
        self.merged_round: int | None = None  # the last round this peer merged and went on from

    def begin(self) -> RoundStart | None:
        """None once the run's last round is done or the peer is stopping."""
        node = self.node
        with node.cond:
            if node.stopping.is_set() or node.round >= node.config.rounds.max_rounds:
                return None
            node.phase = "training"
            return round_start(node.round, node.global_weights, node.parts or [list(node.global_weights)],
                               self.merged_round == node.round - 1)

    def exchange(self, round_index: int, contribution: Contribution | None):
        """-> (partners sent to, peers whose updates were averaged in, consensus distance, next round)."""
        node = self.node
        if contribution is not None:
            return self._exchange(round_index, contribution)
        # our update diverged (NaN/inf): nothing to send; our partners go on without us after their
        # exchange timeout, and we start the next round from our unchanged copy of the global weights
        node.log(f"round {round_index}: our update has NaN/inf values; not sent, skipping the round")
        with node.cond:
            node.round = round_index + 1
            node.membership.set_my_round(node.round)
        return [], [], None, round_index + 1

    def _push_once(self, member: Member, round_index: int, body: bytes) -> tuple[str, int | None]:
        """One attempt to deliver our update -> (outcome, the receiver's round if it said).
        Outcomes: accepted; stale (the receiver is past this round); retry (it is behind, does not
        know us yet, or is busy); refused (anything else: it will not take it); failed (unreachable)."""
        node = self.node
        try:
            with node._client() as client:
                response = client.post(f"{member.url}/v1/gossip/{round_index}", content=upload_chunks(body),
                                       headers={"content-type": "application/octet-stream",
                                                "content-length": str(len(body))})
        except httpx.HTTPError as error:
            node.log(f"update to {member.peer_id} failed: {type(error).__name__}: {error}")
            return "failed", None
        if response.status_code == 200:
            return "accepted", None
        try:
            their_round = response.json().get("round")
        except (ValueError, AttributeError):
            their_round = None
        their_round = their_round if isinstance(their_round, int) else None
        if response.status_code == 409 and their_round is not None:
            if their_round > round_index:
                return "stale", their_round
            if their_round < round_index:
                return "retry", their_round  # it is behind: wait until it files this round
            return "accepted", their_round  # a duplicate: an earlier attempt got through
        if response.status_code in (403, 503):
            return "retry", their_round  # it has not heard of us yet (heartbeats spread members), or is busy
        node.log(f"update to {member.peer_id} refused ({response.status_code}): {response.text[:300]}")
        return "refused", their_round

    def _push(self, member: Member, round_index: int, body: bytes, deadline: float) -> None:
        """Deliver our update to one partner, retrying every RETRY_SECONDS while it is behind or
        does not know us yet, until the exchange's deadline; records the outcome. The retries go
        on after our own merge of the round: a partner that is behind has not merged it yet, and
        it waits for our update once it has taken its own to us."""
        node = self.node
        while True:
            outcome, their_round = self._push_once(member, round_index, body)
            if outcome != "retry":
                break
            with node.cond:
                if (member.peer_id not in node.membership.members
                        or node.stopping.is_set() or time.monotonic() + RETRY_SECONDS > deadline):
                    break
            time.sleep(RETRY_SECONDS)
        with node.cond:
            if node.exchange_round == round_index:
                node.push_results[member.peer_id] = outcome
                if their_round is not None:
                    node.push_rounds[member.peer_id] = their_round
            if outcome == "accepted":
                node.bytes_sent += len(body)
                node.membership.heard_from(member.peer_id)
            node.cond.notify_all()

    def _exchange(self, round_index: int, contribution: Contribution):
        """Send our update to our group, wait for theirs (or the timeout), and merge. Returns
        (partners sent to, updates averaged in, consensus distance, next round)."""
        node = self.node
        gossip = node.config.gossip
        with node.cond:
            node.phase = "exchanging"
            active = node.membership.active(round_index)
            partners = partners_of(active, node.peer_id, gossip.group_size, round_rng(node.config.seed, round_index))
            node.exchange_round = round_index
            node.push_results, node.push_rounds = {}, {}
            full_weights = node.global_weights
            own_weights = {n: full_weights[n] for n in node.round_spec(round_index)}  # this round's tensors
        body = pack_encoded(node.swarm, node.identity, round_index, contribution.tokens, contribution.loss,
                            contribution.encoded, own_weights if gossip.mix_weights else None)
        deadline = time.monotonic() + gossip.exchange_timeout_s
        sent: set[str] = set()
        with node.cond:
            while True:
                # our group, plus anyone who sent us an update for this round (their view of the
                # members differs from ours): the exchange stays symmetric
                wanted = (set(partners) | node.inbox.senders(round_index)) - sent - {node.peer_id}
                for pid in sorted(wanted):
                    member = node.membership.members.get(pid)
                    if member is not None:
                        sent.add(pid)
                        node.pool.submit(self._push, member, round_index, body, deadline)
                past, pending = exchange_state(round_index, sent, node.inbox.senders(round_index),
                                               {pid: m.round for pid, m in node.membership.members.items()},
                                               node.push_results)
                remaining = deadline - time.monotonic()
                if not pending or remaining <= 0 or node.stopping.is_set():
                    break
                node.cond.wait(min(remaining, 0.5))
            updates = node.inbox.close(round_index)
            next_round = max([round_index + 1, *past.values()] + [r for p, r in node.push_rounds.items()
                                                                   if node.push_results.get(p) == "stale"])
            if next_round > round_index + 1:
                node.inbox.close(next_round - 1)
            node.exchange_round = -1
        if pending:
            node.log(f"round {round_index}: no update from {sorted(pending)} within {gossip.exchange_timeout_s:g}s; "
                     "going on without")

        # merge (rules 2 and 3 of coop.gossip.merge): our update as our partners decode it, so that
        # the whole group averages the same numbers; then the outer step on our own copy. Whatever
        # fails in it is dropped with a log line: no partner can stop this process or lose the round.
        # Under the lock: GET /v1/state reads the outer optimizer's momentum, which the step changes.
        own_update = contribution.decoded()
        with node.cond:
            new_weights, cd, kept = merge_and_step(
                node.outer, own_update, contribution.tokens, own_weights,
                [(u.pseudo_gradient, u.tokens, u.global_weights) for u in updates], [u.peer_id for u in updates],
                lambda message: node.log(f"round {round_index}: {message}"))
            node.global_weights = {**full_weights, **new_weights}  # a new dict: readers hold the old one
            node.round = next_round
            self.merged_round = round_index if next_round == round_index + 1 else None
            node.membership.set_my_round(next_round)
        return sorted(sent), [updates[i].peer_id for i in kept], cd, next_round
