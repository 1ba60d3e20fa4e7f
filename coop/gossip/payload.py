"""The binary messages of the gossip protocol (safetensors bytes via `coop.wire`, JSON metadata).

update  POST /v1/gossip/{round}   "delta/<array>" (the codec's arrays of the pseudo-gradient) and,
                                  with mix_weights, "global/<param>" float32 (the sender's global
                                  weights at the start of the round); metadata
                                  {"swarm", "peer_id", "round", "tokens", "loss", "codec": {...}}
state   GET  /v1/state            "global/<param>", "momentum/<param>" float32; metadata
                                  {"swarm", "peer_id", "round", "outer": {NesterovSGD scalars}}
data    GET  /v1/data             "tokens" (uint8/16/32); metadata {"tokenizer": <to_json()>}

`parse_update` / `parse_state` check everything against the receiver's model before returning;
anything wrong raises `WireError` (the server answers 4xx and changes nothing).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from coop.codec import Codec, Encoded, decode
from coop.wire import TensorSpec, WireError, check_metadata, check_tensors, pack, unpack

DELTA, GLOBAL, MOMENTUM = "delta/", "global/", "momentum/"


class MalformedMessage(WireError):
    """Bytes that are not a well-formed message at all (400), as opposed to a well-formed message
    whose contents do not fit the model (a plain WireError, 422)."""


class ForeignMessage(WireError):
    """A message from another swarm (403)."""


@dataclass
class Update:
    """A partner's contribution to one round, checked against the model."""

    peer_id: str
    round: int
    tokens: int
    loss: float | None
    pseudo_gradient: dict[str, np.ndarray]
    global_weights: dict[str, np.ndarray] | None


def pack_update(swarm: str, peer_id: str, round_index: int, tokens: int, loss: float | None, codec: Codec,
                pseudo_gradient: dict[str, np.ndarray], global_weights: dict[str, np.ndarray] | None) -> bytes:
    """Encode the pseudo-gradient with `codec`, then `pack_encoded`."""
    return pack_encoded(swarm, peer_id, round_index, tokens, loss, codec.encode(pseudo_gradient), global_weights)


def pack_encoded(swarm: str, peer_id: str, round_index: int, tokens: int, loss: float | None, encoded: Encoded,
                 global_weights: dict[str, np.ndarray] | None) -> bytes:
    """The update message of an already encoded pseudo-gradient (the round loop's codec encoded it)."""
    tensors = {DELTA + name: array for name, array in encoded.tensors.items()}
    if global_weights is not None:
        tensors.update({GLOBAL + name: np.asarray(array, dtype=np.float32) for name, array in global_weights.items()})
    metadata = {"swarm": swarm, "peer_id": peer_id, "round": round_index, "tokens": int(tokens),
                "loss": loss if loss is not None and math.isfinite(loss) else None, "codec": encoded.metadata}
    return pack(tensors, metadata)


def _split(tensors: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    return {name[len(prefix):]: array for name, array in tensors.items() if name.startswith(prefix)}


def parse_update(body: bytes, spec: dict[str, TensorSpec], *, swarm: str, round_index: int, max_bytes: int,
                 require_global: bool) -> Update:
    """Unpack and check one update (size, layout, metadata, codec arrays, names, shapes, dtypes, finite values)."""
    try:
        tensors, metadata = unpack(body, max_bytes=max_bytes)
        check_metadata(metadata, {"swarm": str, "peer_id": str, "round": int, "tokens": int, "codec": dict},
                       what="update metadata")
    except MalformedMessage:
        raise
    except WireError as error:
        raise MalformedMessage(str(error)) from error
    if metadata["swarm"] != swarm:
        raise ForeignMessage(f"update is for swarm {metadata['swarm']!r:.80}, this peer is in swarm {swarm!r}")
    if metadata["round"] != round_index:
        raise WireError(f"update metadata says round {metadata['round']} but it was posted to round {round_index}")
    if metadata["tokens"] <= 0:
        raise WireError(f"update metadata 'tokens' must be a positive int (tokens trained on), got {metadata['tokens']}")
    loss = metadata.get("loss")
    if loss is not None and not (isinstance(loss, (int, float)) and not isinstance(loss, bool) and math.isfinite(loss)):
        raise WireError(f"update metadata 'loss' must be a finite number or null, got {loss!r:.50}")
    unknown = sorted(n for n in tensors if not n.startswith((DELTA, GLOBAL)))
    if unknown:
        raise WireError(f"update has arrays {unknown[:5]} outside 'delta/' and 'global/'")
    shapes = {name: s.shape for name, s in spec.items()}
    delta = decode(_split(tensors, DELTA), metadata["codec"], expected_shapes=shapes)
    check_tensors(delta, spec, what="pseudo-gradient")
    global_weights = _split(tensors, GLOBAL) or None
    if require_global and global_weights is None:
        raise WireError("this swarm mixes weights (gossip.mix_weights): the update must carry 'global/<param>' arrays")
    if global_weights is not None:
        check_tensors(global_weights, spec, what="global weights")
    return Update(metadata["peer_id"], round_index, metadata["tokens"], None if loss is None else float(loss), delta,
                  global_weights)


def pack_state(swarm: str, peer_id: str, round_index: int, global_weights: dict[str, np.ndarray],
               outer_state: dict[str, Any]) -> bytes:
    outer = dict(outer_state)
    buffers = outer.pop("momentum_buffer")
    tensors = {GLOBAL + n: a for n, a in global_weights.items()}
    tensors.update({MOMENTUM + n: a for n, a in buffers.items()})
    return pack(tensors, {"swarm": swarm, "peer_id": peer_id, "round": round_index, "outer": outer})


def parse_state(body: bytes, spec: dict[str, TensorSpec], max_bytes: int) -> tuple[int, dict[str, np.ndarray], dict[str, Any], dict[str, Any]]:
    """-> (round, global weights, outer optimizer state for NesterovSGD.load_state_dict, metadata)."""
    tensors, metadata = unpack(body, max_bytes=max_bytes)
    check_metadata(metadata, {"swarm": str, "peer_id": str, "round": int, "outer": dict}, what="state metadata")
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
