"""The binary messages of the gossip protocol (safetensors bytes via `coop.wire`, JSON metadata).

update  POST /v1/gossip/{round}   "delta/<array>" (the codec's arrays of the pseudo-gradient) and,
                                  with mix_weights, "global/<param>" float32 (the sender's global
                                  weights at the start of the round); metadata
                                  {"swarm", "peer_id", "round", "tokens", "loss", "codec": {...},
                                   "public_key", "signature"}
state   GET  /v1/state            "global/<param>", "momentum/<param>" float32; metadata
                                  {"swarm", "peer_id", "round", "outer": {NesterovSGD scalars},
                                   "public_key", "signature"}
data    GET  /v1/data             "tokens" (uint8/16/32); metadata {"tokenizer": <to_json()>}

Updates and states are signed by their sender (`sign_tensors`): the signature covers the metadata
(canonical JSON, without the signature) and every array (name, dtype, shape, bytes), so nothing
in the message can change without it failing. `parse_update` / `parse_state` check the signature,
that the id is the key's, and everything against the receiver's model (`coop.contribution`)
before returning; anything wrong raises `WireError` (the server answers 4xx and changes nothing).
"""
from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from coop.codec import Codec, Encoded
from coop.contribution import check_arrays, check_loss, check_tokens, decode_pseudo_gradient
from coop.gossip.identity import Identity, peer_id_of, verify
from coop.wire import TensorSpec, WireError, check_metadata, check_tensors, pack, unpack

DELTA, GLOBAL, MOMENTUM = "delta/", "global/", "momentum/"


class MalformedMessage(WireError):
    """Bytes that are not a well-formed message at all (400), as opposed to a well-formed message
    whose contents do not fit the model (a plain WireError, 422)."""


class ForeignMessage(WireError):
    """A message from another swarm, or not signed by the peer it names (403)."""


@dataclass
class Update:
    """A partner's contribution to one round, checked against the model."""

    peer_id: str
    round: int
    tokens: int
    loss: float | None
    pseudo_gradient: dict[str, np.ndarray]
    global_weights: dict[str, np.ndarray] | None
    public_key: str = ""  # the key that signed it (its id is peer_id)


def content_digest(tensors: Mapping[str, np.ndarray], metadata: Mapping[str, Any]) -> bytes:
    """sha256 over the metadata (sorted-key JSON, without "signature") and every array in name
    order (name, little-endian dtype, shape, then its bytes): what a binary message's signature signs."""
    digest = hashlib.sha256()
    meta = {key: value for key, value in metadata.items() if key != "signature"}
    digest.update(json.dumps(meta, sort_keys=True, separators=(",", ":"), allow_nan=False).encode() + b"\n")
    for name in sorted(tensors):
        array = np.asarray(tensors[name])
        array = np.asarray(array, dtype=array.dtype.newbyteorder("<"), order="C")  # no copy when it already is
        digest.update(json.dumps([name, array.dtype.str, list(array.shape)]).encode() + b"\n")
        digest.update(array.reshape(-1).view(np.uint8))
    return digest.digest()


def sign_tensors(identity: Identity, kind: str, tensors: Mapping[str, np.ndarray],
                 metadata: Mapping[str, Any]) -> dict[str, Any]:
    """`metadata` with the signer's "public_key" and its "signature" of (tensors, metadata)."""
    signed = dict(metadata, public_key=identity.public_key)
    return dict(signed, signature=identity.sign(kind, content_digest(tensors, signed)))


def check_signed(kind: str, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, Any]) -> str:
    """Raise ForeignMessage unless the message is signed by the key it carries and its
    "peer_id" is that key's id; returns the public key."""
    key, signature = metadata.get("public_key"), metadata.get("signature")
    if not isinstance(key, str) or not isinstance(signature, str):
        raise ForeignMessage(f"{kind} message is not signed: metadata needs 'public_key' and 'signature' (hex Ed25519)")
    if not verify(key, kind, content_digest(tensors, metadata), signature):
        raise ForeignMessage(f"{kind} message: the signature does not match its contents and key "
                             "(changed on the way, or signed with another key)")
    if peer_id_of(key) != metadata.get("peer_id"):
        raise ForeignMessage(f"{kind} message says it is from {metadata.get('peer_id')!r:.40} but is signed by the "
                             f"key of peer {peer_id_of(key)}: a peer may only send under its own id")
    return key


def pack_update(swarm: str, identity: Identity, round_index: int, tokens: int, loss: float | None, codec: Codec,
                pseudo_gradient: dict[str, np.ndarray], global_weights: dict[str, np.ndarray] | None) -> bytes:
    """Encode the pseudo-gradient with `codec`, then `pack_encoded`."""
    return pack_encoded(swarm, identity, round_index, tokens, loss, codec.encode(pseudo_gradient), global_weights)


def pack_encoded(swarm: str, identity: Identity, round_index: int, tokens: int, loss: float | None, encoded: Encoded,
                 global_weights: dict[str, np.ndarray] | None) -> bytes:
    """The signed update message of an already encoded pseudo-gradient (the round loop's codec encoded it)."""
    tensors = {DELTA + name: array for name, array in encoded.tensors.items()}
    if global_weights is not None:
        tensors.update({GLOBAL + name: np.asarray(array, dtype=np.float32) for name, array in global_weights.items()})
    metadata = {"swarm": swarm, "peer_id": identity.peer_id, "round": round_index, "tokens": int(tokens),
                "loss": loss if loss is not None and math.isfinite(loss) else None, "codec": encoded.metadata}
    return pack(tensors, sign_tensors(identity, "update", tensors, metadata))


def _split(tensors: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    return {name[len(prefix):]: array for name, array in tensors.items() if name.startswith(prefix)}


def parse_update(body: bytes, spec: dict[str, TensorSpec], *, swarm: str, round_index: int, max_bytes: int,
                 require_global: bool, max_tokens: int) -> Update:
    """Unpack and check one update: size, layout, metadata (400); swarm, signature, id (403);
    round, tokens, loss, codec arrays, names, shapes, dtypes, finite bounded values (422)."""
    try:
        tensors, metadata = unpack(body, max_bytes=max_bytes, copy=False)  # read-only views: nothing copied
        check_metadata(metadata, {"swarm": str, "peer_id": str, "round": int, "tokens": int, "codec": dict},
                       what="update metadata")
    except MalformedMessage:
        raise
    except WireError as error:
        raise MalformedMessage(str(error)) from error
    if metadata["swarm"] != swarm:
        raise ForeignMessage(f"update is for swarm {metadata['swarm']!r:.80}, this peer is in swarm {swarm!r}")
    public_key = check_signed("update", tensors, metadata)
    if metadata["round"] != round_index:
        raise WireError(f"update metadata says round {metadata['round']} but it was posted to round {round_index}")
    tokens = check_tokens(metadata["tokens"], max_tokens)
    loss = check_loss(metadata.get("loss"))
    unknown = sorted(n for n in tensors if not n.startswith((DELTA, GLOBAL)))
    if unknown:
        raise WireError(f"update has arrays {unknown[:5]} outside 'delta/' and 'global/'")
    delta = decode_pseudo_gradient(_split(tensors, DELTA), metadata["codec"], spec)
    global_weights = _split(tensors, GLOBAL) or None
    if require_global and global_weights is None:
        raise WireError("this swarm mixes weights (gossip.mix_weights): the update must carry 'global/<param>' arrays")
    if global_weights is not None:
        check_arrays(global_weights, spec, what="global weights")
    return Update(metadata["peer_id"], round_index, tokens, loss, delta, global_weights, public_key)


def pack_state(swarm: str, identity: Identity, round_index: int, global_weights: dict[str, np.ndarray],
               outer_state: dict[str, Any]) -> bytes:
    outer = dict(outer_state)
    buffers = outer.pop("momentum_buffer")
    tensors = {GLOBAL + n: a for n, a in global_weights.items()}
    tensors.update({MOMENTUM + n: a for n, a in buffers.items()})
    metadata = {"swarm": swarm, "peer_id": identity.peer_id, "round": round_index, "outer": outer}
    return pack(tensors, sign_tensors(identity, "state", tensors, metadata))


def parse_state(body: bytes, spec: dict[str, TensorSpec], max_bytes: int,
                public_key: str | None = None) -> tuple[int, dict[str, np.ndarray], dict[str, Any], dict[str, Any]]:
    """-> (round, global weights, outer optimizer state for NesterovSGD.load_state_dict, metadata).
    Signed by the peer it names; with `public_key`, by that key (the peer we joined through)."""
    tensors, metadata = unpack(body, max_bytes=max_bytes)
    check_metadata(metadata, {"swarm": str, "peer_id": str, "round": int, "outer": dict}, what="state metadata")
    key = check_signed("state", tensors, metadata)
    if public_key is not None and key != public_key:
        raise ForeignMessage(f"state signed by peer {metadata['peer_id']!r:.40}, not by the peer it was asked of")
    global_weights = _split(tensors, GLOBAL)
    check_tensors(global_weights, spec, what="global weights")
    momentum = _split(tensors, MOMENTUM)
    if momentum:  # empty before the first outer step
        check_tensors(momentum, spec, what="momentum buffers")
    outer = dict(metadata["outer"], momentum_buffer=momentum)
    return metadata["round"], global_weights, outer, metadata


def update_limit(codec: Codec, shapes: dict[str, tuple[int, ...]], mix_weights: bool) -> int:
    """Largest update message a peer accepts: the exact payload (encoded pseudo-gradient, plus the
    fp32 global weights when mixing) plus room for the safetensors header and metadata."""
    payload = codec.payload_nbytes(shapes)
    if mix_weights:
        payload += sum(4 * math.prod(s) for s in shapes.values())
    return payload + 512 * 4 * len(shapes) + (1 << 16)


def pack_data(tokens: np.ndarray, tokenizer_json: str) -> bytes:
    return pack({"tokens": tokens}, {"tokenizer": tokenizer_json})


def parse_data(body: bytes, max_bytes: int) -> tuple[np.ndarray, str]:
    tensors, metadata = unpack(body, max_bytes=max_bytes)
    check_metadata(metadata, {"tokenizer": str}, what="data metadata")
    tokens = tensors.get("tokens")
    if set(tensors) != {"tokens"} or tokens is None or tokens.ndim != 1 or tokens.dtype.kind != "u":
        raise WireError("data message must hold one 1-D unsigned 'tokens' array")
    return tokens, metadata["tokenizer"]
