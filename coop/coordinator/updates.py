"""Checking an update that came over the network, before it may touch any state.

Every refusal is a RequestError with the HTTP status to answer: 400 for a body that is not a
well-formed update message, 413 for one too large, 422 for a well-formed message that is not an
update of this model (names, shapes, dtypes, codec, token count, non-finite or out-of-range
values). The rules on the update itself are `coop.contribution`'s, the same a peer applies.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from coop.contribution import ContributionError, check_loss, check_tokens, decode_pseudo_gradient
from coop.wire import TensorSpec, WireError, check_metadata, unpack


class RequestError(Exception):
    """A request refused with an HTTP status and a message that says what to do."""

    def __init__(self, status: int, message: str, **extra: Any):
        super().__init__(message)
        self.status, self.message, self.extra = status, message, extra


def check_update(body: bytes | bytearray, round_number: int, *, shapes: Mapping[str, tuple[int, ...]],
                 spec: Mapping[str, TensorSpec], codec: str, max_tokens: int,
                 max_bytes: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Bytes -> the decoded, checked float32 update and its metadata. Raises RequestError 400
    (malformed) or 422 (well-formed but not an update of this model). Pure: touches no state."""
    try:
        tensors, meta = unpack(body, max_bytes, copy=False)  # read-only views into body: no copies
    except WireError as error:
        raise RequestError(400, f"malformed update body: {error}") from None
    try:
        check_metadata(meta, {"round": int, "tokens": int, "codec": str}, what="update metadata")
    except WireError as error:
        raise RequestError(400, str(error)) from None
    if meta["round"] != round_number:
        raise RequestError(400, f"update metadata says round {meta['round']} but was sent to round {round_number}")
    if meta["codec"] != codec:
        raise RequestError(422, f"update encoded with codec {meta['codec']!r:.40}, this run uses {codec!r}")
    try:
        check_tokens(meta["tokens"], max_tokens)
        check_loss(meta.get("loss"))
        update = decode_pseudo_gradient(tensors, meta, spec, what="update", copy=False)  # fp32: views of body
    except ContributionError as error:
        raise RequestError(422, str(error)) from None
    del tensors
    return update, meta


def default_update_limit(n_params: int, n_tensors: int) -> int:
    """Largest honest update: fp32 values (the largest codec except topk with ratio near 1, which
    sends 8 bytes per kept value) plus the safetensors header, with some slack."""
    return 8 * n_params + 512 * n_tensors + 65536
