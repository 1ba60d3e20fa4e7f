"""The JSON messages peers exchange (pydantic models; every HTTP body is validated by one).
Binary messages (updates, state, data) are in `coop.gossip.payload`; docs/p2p.md has the whole protocol."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

PROTOCOL_VERSION = 1
# Peer ids are chosen by each peer (12 random hex digits); the groups are drawn over the sorted ids.
PEER_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
URL_PATTERN = r"^https?://[^\s/]{1,255}(/[^\s]{0,255})?$"
MAX_MEMBERS = 1024
# Every JSON body (join, heartbeat, leave) fits in this; a member list of MAX_MEMBERS is ~400 KB.
MAX_JSON_BYTES = 1 << 20


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Member(_Message):
    """One peer as the others know it."""

    peer_id: str = Field(pattern=PEER_ID_PATTERN)
    url: str = Field(pattern=URL_PATTERN, description="where the other peers reach it")
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


class JoinRequest(_Message):
    peer_id: str = Field(pattern=PEER_ID_PATTERN)
    url: str = Field(pattern=URL_PATTERN)
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


class LeaveRequest(_Message):
    swarm: str = Field(max_length=64)
    peer_id: str = Field(pattern=PEER_ID_PATTERN)


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
    updates_refused: int
    bytes_sent: int
    bytes_received: int
    tokens_per_second: float
    history: list[RoundRecord]
