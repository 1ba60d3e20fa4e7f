"""Peers' keys and signatures (coop.gossip.identity, coop.gossip.payload): ids derive from keys,
keys persist in a file, and a signed message is refused when its body was changed, when it was
signed with another key, or when it names another peer than its signer (a spoofed id)."""
from __future__ import annotations

import hashlib
import stat

import numpy as np
import pytest

from coop.codec import get_codec
from coop.gossip.identity import Identity, card_bytes, card_is_valid, peer_id_of, verify
from coop.gossip.payload import (
    ForeignMessage,
    pack_state,
    pack_update,
    parse_state,
    parse_update,
    sign_tensors,
)
from coop.gossip.peer import load_identity
from coop.wire import TensorSpec, pack, unpack

SPEC = {"w": TensorSpec((2, 3), np.dtype(np.float32))}
ALICE, MALLORY = Identity.generate(), Identity.generate()


def _update(identity=ALICE, value=0.5):
    return pack_update("s", identity, 0, 10, 1.0, get_codec("fp32"), {"w": np.full((2, 3), value, np.float32)}, None)


def _parse(body):
    return parse_update(body, SPEC, swarm="s", round_index=0, max_bytes=1 << 20, require_global=False, max_tokens=100)


def test_peer_id_is_twelve_hex_of_the_key_hash():
    assert ALICE.peer_id == hashlib.sha256(bytes.fromhex(ALICE.public_key)).hexdigest()[:12]
    assert peer_id_of(ALICE.public_key) == ALICE.peer_id and len(ALICE.peer_id) == 12
    assert ALICE.peer_id != MALLORY.peer_id


def test_key_persists_in_a_private_file(tmp_path):
    path = tmp_path / "keys" / "peer.key"
    first = Identity.load_or_create(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert Identity.load_or_create(path).peer_id == first.peer_id  # the same id after a restart
    assert Identity.load_or_create(None).peer_id != first.peer_id  # no path: a fresh key
    assert load_identity(str(path), first.peer_id).peer_id == first.peer_id
    with pytest.raises(SystemExit, match="derived from its key"):
        load_identity(str(path), "aaaaaaaaaaaa")  # --peer-id may only confirm the key's id
    path.write_text("not a key")
    with pytest.raises(SystemExit, match="PEM"):
        Identity.load_or_create(path)


def test_signatures_bind_kind_key_and_bytes():
    signature = ALICE.sign("heartbeat", b"hello")
    assert verify(ALICE.public_key, "heartbeat", b"hello", signature)
    assert not verify(ALICE.public_key, "heartbeat", b"hellO", signature)  # tampered
    assert not verify(MALLORY.public_key, "heartbeat", b"hello", signature)  # wrong key
    assert not verify(ALICE.public_key, "leaverequest", b"hello", signature)  # another kind of message
    assert not verify("zz", "heartbeat", b"hello", signature) and not verify(ALICE.public_key, "heartbeat", b"x", "00")


def test_member_cards():
    url = "http://10.0.0.1:8500"
    good = ALICE.sign("member", card_bytes(ALICE.peer_id, url, ALICE.public_key))
    assert card_is_valid(ALICE.peer_id, url, ALICE.public_key, good)
    assert not card_is_valid(ALICE.peer_id, "http://evil:1", ALICE.public_key, good)  # moved
    forged = MALLORY.sign("member", card_bytes(ALICE.peer_id, url, MALLORY.public_key))
    assert not card_is_valid(ALICE.peer_id, url, MALLORY.public_key, forged)  # another's id


def test_a_signed_update_is_accepted():
    update = _parse(_update())
    assert update.peer_id == ALICE.peer_id and update.public_key == ALICE.public_key
    np.testing.assert_array_equal(update.pseudo_gradient["w"], 0.5)


def test_tampered_update_is_refused():
    tensors, meta = unpack(_update())
    tensors["delta/w"][0, 0] = 99.0  # a changed value
    with pytest.raises(ForeignMessage, match="signature"):
        _parse(pack(tensors, meta))
    tensors, meta = unpack(_update())
    with pytest.raises(ForeignMessage, match="signature"):
        _parse(pack(tensors, dict(meta, tokens=99)))  # a changed metadata field
    body = bytearray(_update())
    body[-1] ^= 1  # one bit of the body
    with pytest.raises(ForeignMessage, match="signature"):
        _parse(bytes(body))
    tensors, meta = unpack(_update())
    meta.pop("signature")
    with pytest.raises(ForeignMessage, match="not signed"):
        _parse(pack(tensors, meta))


def test_update_signed_with_another_key_is_refused():
    tensors, meta = unpack(_update())
    resigned = dict(meta, signature=MALLORY.sign("update", b"whatever"))
    with pytest.raises(ForeignMessage, match="signature"):
        _parse(pack(tensors, resigned))


def test_spoofed_sender_id_is_refused():
    tensors, meta = unpack(_update(MALLORY))
    meta = {k: v for k, v in meta.items() if k not in ("public_key", "signature")}
    spoofed = sign_tensors(MALLORY, "update", tensors, dict(meta, peer_id=ALICE.peer_id))  # validly signed, by Mallory
    with pytest.raises(ForeignMessage, match="only send under its own id"):
        _parse(pack(tensors, spoofed))
    with_alices_key = dict(spoofed, public_key=ALICE.public_key)  # claims Alice's key: the signature fails
    with pytest.raises(ForeignMessage, match="signature"):
        _parse(pack(tensors, with_alices_key))


def test_state_is_signed_by_the_peer_asked():
    weights = {"w": np.ones((2, 3), np.float32)}
    body = pack_state("s", ALICE, 4, weights, {"momentum_buffer": {}, "step_count": 1})
    round_index, got, _, _ = parse_state(body, SPEC, 1 << 20, public_key=ALICE.public_key)
    assert round_index == 4
    with pytest.raises(ForeignMessage):
        parse_state(body, SPEC, 1 << 20, public_key=MALLORY.public_key)
    tensors, meta = unpack(body)
    with pytest.raises(ForeignMessage):
        parse_state(pack(tensors, dict(meta, round=9)), SPEC, 1 << 20)
