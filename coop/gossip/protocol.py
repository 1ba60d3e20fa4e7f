"""The JSON messages peers exchange (pydantic models; every HTTP body is validated by one).
Binary messages (updates, state, data) are in `coop.gossip.payload`; docs/p2p.md has the whole protocol."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from coop.gossip.identity import PUBLIC_KEY_PATTERN, SIGNATURE_PATTERN, card_is_valid

PROTOCOL_VERSION = 2  # 2: peer ids derived from Ed25519 keys, signed messages (docs/p2p.md)
# A peer id is the first 12 hex digits of sha256(its public key) (coop.gossip.identity); the
# groups are drawn over the sorted ids.
PEER_ID_PATTERN = r"^[0-9a-f]{12}$"
URL_PATTERN = r"^https?://[^\s/]{1,255}(/[^\s]{0,255})?$"
MAX_MEMBERS = 1024
# Every JSON body (join, heartbeat, leave) fits in this; a member list of MAX_MEMBERS is ~400 KB.
MAX_JSON_BYTES = 1 << 20


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Card(_Message):
    """Who a peer is and where it is reached, signed by the peer itself: any peer can pass a card
    on (a member list) and its receiver still knows that the id, the key and the url belong together."""

    peer_id: str = Field(pattern=PEER_ID_PATTERN)
    url: str = Field(pattern=URL_PATTERN, description="where the other peers reach it")
    public_key: str = Field(pattern=PUBLIC_KEY_PATTERN, description="Ed25519 public key, hex; the id is its sha256")
    card: str = Field(pattern=SIGNATURE_PATTERN, description="the peer's signature of (peer_id, url, public_key)")

    @model_validator(mode="after")
    def _card_holds(self):
        if not card_is_valid(self.peer_id, self.url, self.public_key, self.card):
            raise ValueError(f"member card of {self.peer_id!r}: the id is not its key's, or the key did not sign "
                             "(id, url, key)")
        return self


class Member(_Card):
    """One peer as the others know it."""

    active_from: int = Field(ge=0, description="first round in which it is put in groups")
    round: int = Field(ge=0, description="its round when last heard of (informative)")


class PeerInfo(_Message):
    """GET /v1/info (no token needed): what this URL is. `coop-worker join URL` reads `kind`."""

    kind: Literal["peer"] = "peer"
    version: str
    protocol: int = PROTOCOL_VERSION
    swarm: str
    peer_id: str
    round: int
    ready: bool


class JoinRequest(_Card):
    protocol: int = PROTOCOL_VERSION


class JoinReply(_Message):
    swarm: str
    peer_id: str = Field(description="the peer that answered")
    round: int
    active_from: int = Field(description="the newcomer's first round in groups")
    config: dict[str, Any] = Field(description="the swarm's run config (coop.runconfig.RunConfig)")
    members: list[Member]


class Heartbeat(_Message):
    """POST /v1/heartbeat: I am alive, here is who I know. The reply is the receiver's own Heartbeat."""

    swarm: str = Field(max_length=64)
    peer_id: str = Field(pattern=PEER_ID_PATTERN)
    url: str = Field(pattern=URL_PATTERN)
    round: int = Field(ge=0)
    members: list[Member] = Field(max_length=MAX_MEMBERS)
    signature: str = Field(pattern=SIGNATURE_PATTERN, description="the sender's, of signed_bytes(this heartbeat)")


class LeaveRequest(_Message):
    swarm: str = Field(max_length=64)
    peer_id: str = Field(pattern=PEER_ID_PATTERN)
    signature: str = Field(pattern=SIGNATURE_PATTERN, description="the leaving peer's, of signed_bytes(this request)")


def signed_bytes(message: BaseModel) -> bytes:
    """What a signed JSON message's `signature` covers: its JSON without the signature, as pydantic
    writes it (the same bytes on both sides: the receiver re-serializes the model it validated)."""
    return message.model_dump_json(exclude={"signature"}).encode()


class UpdateAccepted(_Message):
    """200 reply to POST /v1/gossip/{round}."""

    accepted: Literal[True] = True
    round: int = Field(description="the round the update was filed under")
    receiver_round: int = Field(description="the receiver's current round")


class RoundRecord(_Message):
    round: int
    loss: float | None
    val_loss: float | None = None
    consensus_distance: float | None = None
    partners: list[str] = Field(default_factory=list, description="peers sent to")
    received_from: list[str] = Field(default_factory=list, description="peers whose update was averaged in")
    seconds: float = 0.0
    bytes_sent: int = Field(0, description="the peer's bytes sent so far, at the end of this round")
    bytes_received: int = Field(0, description="the peer's bytes received so far, at the end of this round")


class Status(_Message):
    """GET /v1/status (no token needed): what a person or a test wants to see."""

    kind: Literal["peer"] = "peer"
    swarm: str
    peer_id: str
    url: str
    phase: str = Field(description="starting, waiting, training, exchanging, done")
    round: int
    rounds: int
    members: list[Member]
    consensus_distance: float | None = Field(description="spread of the last group's global weights before mixing")
    loss: float | None
    val_loss: float | None
    initial_val_loss: float | None = Field(description="val loss of the weights this peer started from")
    updates_accepted: int
    updates_refused: int = Field(description="partners' updates that failed a check (docs/p2p.md)")
    updates_late: int = Field(0, description="updates turned away on their timing alone: round closed or too far "
                                             "ahead here, a duplicate, or a full inbox")
    bytes_sent: int
    bytes_received: int
    tokens_per_second: float
    history: list[RoundRecord]
