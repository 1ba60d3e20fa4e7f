"""A peer's identity: an Ed25519 key pair, the peer id derived from it, and the signatures.

    peer id   = the first 12 hex digits of sha256(the 32 raw bytes of the public key)
    signature = Ed25519 over b"coop/<kind>/v1\\n" + what is signed (`sign`, `verify`)

What is signed, and how receivers check it, is in docs/p2p.md (Identity and signatures). A key
lives in a file (PEM, PKCS#8, mode 0600) when the peer is given `--key PATH`, so that it keeps its
id across restarts; otherwise a fresh one is made at start. Pure: no network, no peer state.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

PEER_ID_DIGITS = 12
PUBLIC_KEY_PATTERN = r"^[0-9a-f]{64}$"  # 32 bytes, hex
SIGNATURE_PATTERN = r"^[0-9a-f]{128}$"  # 64 bytes, hex
_PUBLIC_KEY = re.compile(PUBLIC_KEY_PATTERN)
_SIGNATURE = re.compile(SIGNATURE_PATTERN)


def peer_id_of(public_key: str) -> str:
    """The peer id that belongs to a public key (hex): 12 hex digits of its sha256."""
    return hashlib.sha256(bytes.fromhex(public_key)).hexdigest()[:PEER_ID_DIGITS]


def _message(kind: str, data: bytes) -> bytes:
    # the kind keeps a signature of one message from passing for another (a heartbeat for a leave)
    return b"coop/" + kind.encode() + b"/v1\n" + data


class Identity:
    """One peer's key pair. `peer_id` and `public_key` (hex) are what others learn."""

    def __init__(self, private_key: Ed25519PrivateKey):
        self._private = private_key
        raw = private_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.public_key = raw.hex()
        self.peer_id = peer_id_of(self.public_key)

    @classmethod
    def generate(cls) -> Identity:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def load_or_create(cls, path: str | os.PathLike | None) -> Identity:
        """The key in `path` (made there, private to this user, if the file does not exist);
        with no path, a fresh key that lives as long as the process."""
        if path is None:
            return cls.generate()
        path = Path(path)
        if path.exists():
            try:
                key = serialization.load_pem_private_key(path.read_bytes(), password=None)
            except (ValueError, TypeError) as error:
                raise SystemExit(f"{path}: not a PEM Ed25519 private key ({error}); move it away to make a new one") from None
            if not isinstance(key, Ed25519PrivateKey):
                raise SystemExit(f"{path}: holds a {type(key).__name__}, a peer's key must be Ed25519")
            return cls(key)
        identity = cls.generate()
        pem = identity._private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption())
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(pem)
        return identity

    def sign(self, kind: str, data: bytes) -> str:
        """The hex signature of `data` as a message of `kind` ("update", "heartbeat", ...)."""
        return self._private.sign(_message(kind, data)).hex()


def verify(public_key: str, kind: str, data: bytes, signature: str) -> bool:
    """Whether `signature` (hex) is `public_key`'s (hex) signature of `data` as a `kind` message."""
    if not (isinstance(public_key, str) and _PUBLIC_KEY.match(public_key)
            and isinstance(signature, str) and _SIGNATURE.match(signature)):
        return False
    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_key)).verify(bytes.fromhex(signature),
                                                                              _message(kind, data))
    except (InvalidSignature, ValueError):
        return False
    return True


def card_bytes(peer_id: str, url: str, public_key: str) -> bytes:
    """What a member card signs: who the peer is and where it is reached."""
    return f"{peer_id}\n{url}\n{public_key}".encode()


@functools.lru_cache(maxsize=4096)  # the same cards come back in every heartbeat's member list
def card_is_valid(peer_id: str, url: str, public_key: str, signature: str) -> bool:
    """A member card holds when the id is the key's and the key signed (id, url)."""
    return (isinstance(public_key, str) and bool(_PUBLIC_KEY.match(public_key)) and peer_id_of(public_key) == peer_id
            and verify(public_key, "member", card_bytes(peer_id, url, public_key), signature))
