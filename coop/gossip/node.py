"""A peer's shared state and what its HTTP routes call (`coop.gossip.server` -> `PeerState`).

Every handler checks the message completely before it takes the lock and changes anything, so a
refused message leaves nothing behind but a counter (`updates_refused` for one that failed a check,
`updates_late` for one turned away on its timing alone) and a log line. The training side (setup,
heartbeats, exchange, the loop) is `coop.gossip.peer.PeerNode`, a subclass.
"""
from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np

from coop import __version__
from coop.codec import Codec
from coop.contribution import max_tokens_of
from coop.outer import NesterovSGD
from coop.gossip.identity import Identity, card_bytes, verify
from coop.gossip.inbox import Inbox, InboxRefusal
from coop.gossip.membership import Membership
from coop.gossip.payload import (
    ForeignMessage,
    MalformedMessage,
    pack_state,
    parse_update,
    update_limit,
)
from coop.gossip.protocol import (
    Heartbeat,
    JoinReply,
    JoinRequest,
    LeaveRequest,
    Member,
    PeerInfo,
    RoundRecord,
    Status,
    UpdateAccepted,
    signed_bytes,
)
from coop.replica import Replica
from coop.runconfig import RunConfig
from coop.streaming import fragment_of_round
from coop.throttle import Link
from coop.wire import WireError
from engine.data import TokenDataset


class PeerError(Exception):
    """A refusal with an HTTP status; `round` is the refusing peer's current round when it matters."""

    def __init__(self, status: int, detail: str, round_index: int | None = None):
        super().__init__(detail)
        self.status, self.detail, self.round = status, detail, round_index


class RefusalLog:
    """One log line per refused or turned-away update, at most one a second: a flood of bad requests
    cannot flood the log (the lines held back are counted in the next one)."""

    def __init__(self, log, interval_s: float = 1.0):
        self.log, self.interval_s = log, interval_s
        self.last = -interval_s
        self.held_back = 0
        self.lock = threading.Lock()

    def note(self, line: str) -> None:
        with self.lock:
            now = time.monotonic()
            if now - self.last < self.interval_s:
                self.held_back += 1
                return
            held, self.held_back, self.last = self.held_back, 0, now
        self.log(line[:400] + (f" (and {held} more since the last such line)" if held else ""))


class PeerState:
    """One peer's state, guarded by `cond`; the server's routes call the `handle_*` methods."""

    def __init__(self, *, token: str | None, advertise: str, device: str = "cpu", quiet: bool = False,
                 identity: Identity | None = None, log=None, link: Link | None = None):
        self.identity = identity or Identity.generate()
        self.peer_id = self.identity.peer_id  # derived from the public key: nobody else can send under it
        self.token = token or None
        self.advertise = advertise.rstrip("/")
        self.device = device
        self.quiet = quiet
        self.link = link  # --limit-rate / --latency: this peer's own transfers go through it (coop.throttle)
        self._log = log or (lambda message: print(message, file=sys.stderr, flush=True))
        self.cond = threading.Condition()
        self.stopping = threading.Event()
        self.ready = False
        self.phase = "starting"
        self.swarm = ""
        self.config: RunConfig | None = None
        self.round = 0
        self.membership: Membership | None = None
        self.inbox = Inbox()
        self.global_weights: dict[str, np.ndarray] = {}
        self.outer: NesterovSGD | None = None
        self.spec: dict = {}
        self.parts: list[list[str]] = []  # streaming DiLoCo: round r exchanges parts[r mod P] (coop.streaming)
        self.replica: Replica | None = None
        self.codec: Codec | None = None  # ours, kept across rounds: top-k's error feedback carries its residual
        self.val_data: TokenDataset | None = None
        self.data_message = b""
        # push results of the round being exchanged: peer id -> "accepted" / "stale" / "failed" / "refused"
        self.push_results: dict[str, str] = {}
        self.push_rounds: dict[str, int] = {}  # peer id -> receiver's round from a 409
        self.exchange_round = -1
        self.history: list[RoundRecord] = []
        self.last_cd: float | None = None
        self.last_loss: float | None = None
        self.last_val: float | None = None
        self.initial_val: float | None = None
        self.tokens_per_second = 0.0
        self.updates_accepted = self.updates_refused = 0
        self.updates_late = 0  # turned away on timing alone: round closed or too far ahead, a duplicate, inbox full
        self._refusal_log = RefusalLog(self.log)
        self.bytes_sent = self.bytes_received = 0
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="peer-push")
        self.heartbeat_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="peer-heartbeat")
        self.heartbeat_thread: threading.Thread | None = None

    def round_spec(self, round_index: int) -> dict:
        """The tensors an update of round `round_index` carries: the whole model, or its fragment."""
        if len(self.parts) <= 1:
            return self.spec
        return {n: self.spec[n] for n in self.parts[fragment_of_round(round_index, len(self.parts))]}

    def _client(self, timeout: float | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        t = timeout if timeout is not None else (self.config.gossip.request_timeout_s if self.config else 30.0)
        return httpx.Client(headers=headers, timeout=t, transport=self.link.transport() if self.link else None)

    def log(self, message: str) -> None:
        if not self.quiet:
            self._log(f"peer {self.peer_id}: {message}")

    # ------------------------------------------------------------------------------------------
    # What the server's routes call.

    def _require_ready(self) -> None:
        if not self.ready:
            raise PeerError(503, "this peer is still starting; retry in a few seconds")

    def count_refused(self, status: int, detail: str, sender: str | None = None) -> None:
        with self.cond:
            self.updates_refused += 1
        self._refusal_log.note(f"refused an update{f' from {sender}' if sender else ''} ({status}): {detail}")

    def _count_late(self, refusal: InboxRefusal, sender: str | None = None) -> None:
        """An update turned away on its timing alone (under the lock): a slow or early partner, not a bad one."""
        self.updates_late += 1
        self._refusal_log.note(f"turned away an update{f' from {sender}' if sender else ''} ({refusal.status}): "
                               f"{refusal.detail}")

    def member_card(self, active_from: int, round_index: int) -> Member:
        """This peer as a member, its card signed with its own key."""
        card = self.identity.sign("member", card_bytes(self.peer_id, self.advertise, self.identity.public_key))
        return Member(peer_id=self.peer_id, url=self.advertise, public_key=self.identity.public_key, card=card,
                      active_from=active_from, round=round_index)

    def sign_message(self, message):
        """A JSON message (Heartbeat, LeaveRequest) with this peer's signature."""
        return message.model_copy(update={"signature": self.identity.sign(type(message).__name__.lower(),
                                                                         signed_bytes(message))})

    def _check_known_key(self, peer_id: str, public_key: str) -> None:
        """403 when we know `peer_id` under another key (ids are 48-bit: the first key learned is kept)."""
        known = self.membership.members.get(peer_id)
        if known is not None and known.public_key != public_key:
            raise PeerError(403, f"peer {peer_id} is known here with another public key; a peer may only use its own id")

    def update_limit(self) -> int:
        self._require_ready()
        return update_limit(self.config.codec(), {n: s.shape for n, s in self.spec.items()}, self.config.gossip.mix_weights)

    def info(self) -> PeerInfo:
        return PeerInfo(version=__version__, swarm=self.swarm, peer_id=self.peer_id, round=self.round, ready=self.ready)

    def handle_join(self, request: JoinRequest) -> JoinReply:
        self._require_ready()
        self._require_running()
        with self.cond:
            # in groups from the next round: this round's groups may already be drawn elsewhere
            active_from = self.round if self.phase in ("starting", "waiting") else self.round + 1
            self._check_known_key(request.peer_id, request.public_key)
            known = self.membership.members.get(request.peer_id)
            if known is not None and known.url == request.url:
                active_from = known.active_from  # a retried join: the same answer
            # the request's card (id, url, key) is signed by the newcomer: checked when it was parsed
            member = Member(peer_id=request.peer_id, url=request.url, public_key=request.public_key, card=request.card,
                            active_from=active_from, round=self.round)
            self.membership.add(member)
            self.cond.notify_all()
            self.log(f"{request.peer_id} joined from {request.url} (in groups from round {active_from})")
            return JoinReply(swarm=self.swarm, peer_id=self.peer_id, round=self.round, active_from=active_from,
                             config=self.config.model_dump(), members=self.membership.listing())

    def _check_swarm(self, swarm: str) -> None:
        if swarm != self.swarm:
            raise PeerError(403, f"message for swarm {swarm!r:.70}, this peer is in swarm {self.swarm!r}")

    def handle_heartbeat(self, heartbeat: Heartbeat) -> Heartbeat:
        self._require_ready()
        self._check_swarm(heartbeat.swarm)
        with self.cond:
            sender = next((m for m in heartbeat.members if m.peer_id == heartbeat.peer_id), None)
            if sender is None or sender.url != heartbeat.url:
                raise PeerError(422, "a heartbeat's member list must include its sender with the sender's url")
            self._check_known_key(sender.peer_id, sender.public_key)
            if not verify(sender.public_key, "heartbeat", signed_bytes(heartbeat), heartbeat.signature):
                raise PeerError(403, f"heartbeat of {heartbeat.peer_id} is not signed by its key")
            self.membership.add(sender.model_copy(update={"round": heartbeat.round}))
            new = self.membership.merge(heartbeat.members)
            for pid in new:
                self.log(f"learned of member {pid} from {heartbeat.peer_id}")
            self.cond.notify_all()
            return self._heartbeat_message()

    def _heartbeat_message(self) -> Heartbeat:
        return self.sign_message(Heartbeat(swarm=self.swarm, peer_id=self.peer_id, url=self.advertise, round=self.round,
                                           members=self.membership.listing(), signature="0" * 128))

    def handle_leave(self, request: LeaveRequest) -> None:
        self._require_ready()
        self._check_swarm(request.swarm)
        with self.cond:
            known = self.membership.members.get(request.peer_id)
            if known is not None and not verify(known.public_key, "leaverequest", signed_bytes(request),
                                                request.signature):
                raise PeerError(403, f"leave of {request.peer_id} is not signed by its key")
            if self.membership.remove(request.peer_id):
                self.log(f"{request.peer_id} left")
            self.cond.notify_all()

    def state_body(self) -> bytes:
        self._require_ready()
        with self.cond:
            weights = {n: a.copy() for n, a in self.global_weights.items()}
            outer, round_index = self.outer.state_dict(), self.round
        body = pack_state(self.swarm, self.identity, round_index, weights, outer)
        with self.cond:
            self.bytes_sent += len(body)
        return body

    def data_body(self) -> bytes:
        self._require_ready()
        with self.cond:
            self.bytes_sent += len(self.data_message)
        return self.data_message

    def _require_running(self) -> None:
        if self.phase in ("done", "stopped"):
            raise PeerError(410, f"this peer has {'finished its rounds' if self.phase == 'done' else 'stopped'} "
                                 "and left the swarm; talk to another peer")

    def precheck_update(self, round_index: int) -> None:
        """Refuse before reading the body what can be refused on the round alone."""
        self._require_ready()
        self._require_running()
        with self.cond:
            try:
                self.inbox.check_round(round_index)
            except InboxRefusal as refusal:
                self._count_late(refusal)
                raise PeerError(refusal.status, refusal.detail, self.inbox.current_round) from None

    def receive_update(self, round_index: int, body: bytes) -> UpdateAccepted:
        """Check a partner's update completely, then file it; any refusal changes nothing but a counter."""
        try:
            update = parse_update(body, self.round_spec(round_index), swarm=self.swarm, round_index=round_index,
                                  max_bytes=self.update_limit(), require_global=self.config.gossip.mix_weights,
                                  max_tokens=max_tokens_of(self.config))
        except (MalformedMessage, ForeignMessage, WireError) as error:
            status = 400 if isinstance(error, MalformedMessage) else 403 if isinstance(error, ForeignMessage) else 422
            self.count_refused(status, str(error))
            raise PeerError(status, str(error)) from None
        with self.cond:
            try:
                self._require_running()
                if update.peer_id not in self.membership.members or update.peer_id == self.peer_id:
                    raise PeerError(403, f"update from {update.peer_id!r:.70}, not a member of this peer's swarm view; "
                                         "join the swarm first (POST /v1/join)")
                self._check_known_key(update.peer_id, update.public_key)
            except PeerError as error:
                self.updates_refused += 1
                self._refusal_log.note(f"refused an update from {update.peer_id:.70} ({error.status}): {error.detail}")
                raise
            try:
                self.inbox.add(update)
            except InboxRefusal as refusal:
                self._count_late(refusal, update.peer_id)
                raise PeerError(refusal.status, refusal.detail, self.inbox.current_round) from None
            self.membership.heard_from(update.peer_id, round_index)
            self.updates_accepted += 1
            self.bytes_received += len(body)
            self.cond.notify_all()
            return UpdateAccepted(round=round_index, receiver_round=self.inbox.current_round)

    def status(self) -> Status:
        with self.cond:
            members = self.membership.listing() if self.membership else []
            return Status(swarm=self.swarm, peer_id=self.peer_id, url=self.advertise, phase=self.phase,
                          round=self.round, rounds=self.config.rounds.max_rounds if self.config else 0, members=members,
                          consensus_distance=self.last_cd, loss=self.last_loss, val_loss=self.last_val,
                          initial_val_loss=self.initial_val,
                          updates_accepted=self.updates_accepted, updates_refused=self.updates_refused,
                          updates_late=self.updates_late,
                          bytes_sent=self.bytes_sent, bytes_received=self.bytes_received,
                          tokens_per_second=self.tokens_per_second, history=list(self.history))
