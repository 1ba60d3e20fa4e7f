"""Who is in the run: workers, their secret tokens (kept only as SHA-256 digests, compared in
constant time), their data shards, and what they have done. Persisted as JSON by state.py."""
from __future__ import annotations

import hashlib
import hmac
import math
import secrets
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from coop.contribution import gpus_of_device_label


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The token of an `Authorization: Bearer TOKEN` header (headers keyed in lower case), or None."""
    scheme, _, value = headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def tokens_equal(given: str, expected: str) -> bool:
    """Constant-time comparison of two tokens (hmac.compare_digest on their UTF-8 bytes)."""
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


@dataclass
class WorkerRecord:
    id: str
    token_digest: str  # sha256 of the secret part of the worker's token
    name: str
    device: str
    shard: int
    joined_at: float
    joined_round: int
    last_seen: float
    left: bool = False
    # False for a record restored after a restart until the worker is heard from again: a round
    # never waits for a worker that died with the old process
    confirmed: bool = True
    rounds: int = 0  # accepted updates
    tokens: int = 0  # tokens trained on, over accepted updates
    rejected: int = 0
    stale_in_a_row: int = 0  # updates refused as stale since the last accepted one (a starved worker)
    bytes_up: int = 0
    bytes_down: int = 0
    first_update_round: int | None = None
    last_round: int | None = None
    last_loss: float | None = None
    tokens_per_s: float | None = None  # of the worker's last round (tokens / training seconds)
    uploads_via: str | None = None  # where its last accepted update came in: "upload port" or "api"
    history: list[float] = field(default_factory=list)  # recent local losses, for the page

    @property
    def gpus(self) -> int:
        """GPUs training this worker's replica together (`--gpus`: it joined as 'cuda xG')."""
        return gpus_of_device_label(self.device)

    def public(self, now: float, timeout_s: float) -> dict[str, Any]:
        """What the status endpoint and page show (no token digest)."""
        out = {k: v for k, v in asdict(self).items() if k not in ("token_digest", "history")}
        out["active"] = self.is_active(now, timeout_s)
        out["seen_s_ago"] = round(max(0.0, now - self.last_seen), 1)
        return out

    def count_update(self, round_number: int, tokens: int, nbytes: int, meta: dict[str, Any]) -> None:
        """An update of this worker's was accepted for round `round_number` (`meta`: its metadata)."""
        self.rounds += 1
        self.stale_in_a_row = 0
        self.tokens += tokens
        self.bytes_up += nbytes
        self.last_round = round_number
        self.last_loss = loss = meta.get("loss")
        if self.first_update_round is None:
            self.first_update_round = round_number
        train_seconds = meta.get("train_seconds")
        if isinstance(train_seconds, (int, float)) and not isinstance(train_seconds, bool) and train_seconds > 0:
            self.tokens_per_s = tokens / train_seconds
        if loss is not None:
            self.history = (self.history + [float(loss)])[-50:]

    def is_active(self, now: float, timeout_s: float) -> bool:
        return self.confirmed and self.is_recent(now, timeout_s)

    def is_recent(self, now: float, timeout_s: float) -> bool:
        """Heard from within the timeout (before or after a restart), and not gone."""
        return not self.left and now - self.last_seen <= timeout_s

    def seen(self, now: float) -> None:
        self.last_seen = now
        self.confirmed = True


class Members:
    """The worker registry. Worker tokens have the form "<worker id>.<secret>"."""

    def __init__(self, shard_count: int):
        self.shard_count = shard_count
        self.workers: dict[str, WorkerRecord] = {}
        self.next_index = 0

    def join(self, name: str, device: str, now: float, round_number: int,
             timeout_s: float = float("inf")) -> tuple[WorkerRecord, str]:
        """A new worker: returns its record and its token (shown once, never stored in clear)."""
        worker_id = f"w{self.next_index}"
        self.next_index += 1
        secret = secrets.token_urlsafe(32)
        record = WorkerRecord(id=worker_id, token_digest=digest(secret), name=name[:64], device=device[:32],
                              shard=self._least_used_shard(now, timeout_s), joined_at=now, joined_round=round_number,
                              last_seen=now)
        self.workers[worker_id] = record
        return record, f"{worker_id}.{secret}"

    def _least_used_shard(self, now: float, timeout_s: float) -> int:
        """Hand out the shard fewest active workers are on (ties: the lowest index), so that the
        shards stay evenly covered as workers come and go."""
        use = [0] * self.shard_count
        for w in self.workers.values():
            if w.is_active(now, timeout_s):
                use[w.shard] += 1
        return min(range(self.shard_count), key=lambda i: (use[i], i))

    def authenticate(self, token: str) -> WorkerRecord | None:
        """The worker this token belongs to, or None. Constant time in the secret."""
        worker_id, dot, secret = token.partition(".")
        record = self.workers.get(worker_id) if dot else None
        # compare against a dummy digest when the id is unknown, so both paths do the same work
        expected = record.token_digest if record is not None else digest("")
        ok = tokens_equal(digest(secret), expected)
        return record if ok and record is not None and not record.left else None

    def active(self, now: float, timeout_s: float) -> set[str]:
        return {w.id for w in self.workers.values() if w.is_active(now, timeout_s)}

    def prune(self, now: float, timeout_s: float, keep: set[str] = frozenset(), room_for: int | None = None) -> list[str]:
        """Forget records of workers that are gone (left, or not seen for `timeout_s`) and never
        had an update accepted (a join flood leaves only these). With
        `room_for`, also the longest-unseen inactive records until at most `room_for` remain.
        Records in `keep` (the open round's reporters) stay. Returns the ids dropped."""
        gone = [w for w in self.workers.values() if w.id not in keep and not w.is_recent(now, timeout_s)]
        dropped = [w.id for w in gone if w.rounds == 0]
        if room_for is not None:
            rest = sorted((w for w in gone if w.id not in dropped), key=lambda w: w.last_seen)
            excess = len(self.workers) - len(dropped) - room_for
            dropped += [w.id for w in rest[:max(0, excess)]]
        for worker_id in dropped:
            del self.workers[worker_id]
        return dropped

    def to_json(self) -> dict[str, Any]:
        return {"next_index": self.next_index, "shard_count": self.shard_count,
                "workers": [asdict(w) for w in self.workers.values()]}

    @classmethod
    def from_json(cls, raw: dict[str, Any], now: float) -> Members:
        members = cls(int(raw["shard_count"]))
        members.next_index = int(raw["next_index"])
        for item in raw["workers"]:
            record = WorkerRecord(**item)
            # unconfirmed until it is heard from: not counted active (no round waits for it), yet
            # kept for a timeout from its last contact, and its token still valid
            record.confirmed = False
            record.last_seen = min(record.last_seen, now)
            members.workers[record.id] = record
        return members


class JoinRateLimiter:
    """A token bucket per client address: a burst of `per_minute` joins, then `per_minute` a minute.
    At most `max_clients` addresses are remembered (the fullest buckets are forgotten first: a
    forgotten address starts full, which is where it was anyway)."""

    def __init__(self, per_minute: float, max_clients: int = 10_000):
        self.rate, self.burst, self.max_clients = per_minute / 60.0, max(1.0, per_minute), max_clients
        self.buckets: dict[str, tuple[float, float]] = {}  # address -> (tokens, at)

    def retry_after(self, address: str, now: float) -> float:
        """0 when a join from `address` may go ahead now (and counts it), else the seconds to wait."""
        tokens, at = self.buckets.get(address, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        if tokens < 1.0:
            self.buckets[address] = (tokens, now)
            return (1.0 - tokens) / self.rate
        self.buckets[address] = (tokens - 1.0, now)
        if len(self.buckets) > self.max_clients:
            self._forget(now)
        return 0.0

    def _forget(self, now: float) -> None:
        def level(item):
            tokens, at = item[1]
            return min(self.burst, tokens + (now - at) * self.rate)
        keep = sorted(self.buckets.items(), key=level)[: self.max_clients // 2]
        self.buckets = dict(keep)


def retry_after_header(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))
