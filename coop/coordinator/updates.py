"""Checking an update that came over the network, before it may touch any state.

Every refusal is a RequestError with the HTTP status to answer: 400 for a body that is not a
well-formed update message, 413 for one too large, 422 for a well-formed message that is not an
update of this model (names, shapes, dtypes, codec, token count, non-finite or out-of-range
values). The rules on the update itself are `coop.contribution`'s, the same a peer applies.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from coop.codec import codec_of
from coop.codec.base import recorded_shapes
from coop.contribution import MAX_ABS_VALUE, ContributionError, check_loss, check_tokens, decode_pseudo_gradient
from coop.diloco import Aggregator, PreparedUpdate
from coop.spool import SpooledBody, SpooledVector, available_memory
from coop.wire import TensorSpec, WireError, check_metadata, dtype_of_tag, header_length, parse_header, unpack


log = logging.getLogger("coop.coordinator")


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
    check_update_metadata(meta, round_number, codec=codec, max_tokens=max_tokens)
    try:
        update = decode_pseudo_gradient(tensors, meta, spec, what="update", copy=False)  # fp32: views of body
    except ContributionError as error:
        raise RequestError(422, str(error)) from None
    del tensors
    return update, meta


def decode_upload(body: bytes | bytearray | SpooledBody, round_number: int, aggregator: Aggregator, *,
                  spec: Mapping[str, TensorSpec], codec: str, max_tokens: int, max_bytes: int) -> tuple[PreparedUpdate, dict]:
    """An upload (in memory, or spooled) -> the checked update, prepared for `aggregator`, and its
    metadata. An fp32 update that came through the spool stays there: checked a chunk at a time,
    kept as its body's file (the robust rules) or added up from it (the streamed mean). RequestError 400 or 422."""
    if isinstance(body, SpooledBody) and codec == "fp32":
        vector, norm, meta = check_spooled_fp32_update(body, round_number, spec=spec, max_tokens=max_tokens,
                                                       max_bytes=max_bytes)
        return PreparedUpdate(vector, norm), meta
    if isinstance(body, SpooledBody):
        body = body.read()  # back in memory for the decode only (upload_slots bound how many at once)
    update, meta = check_update(body, round_number, shapes=aggregator.shapes, spec=spec, codec=codec,
                                max_tokens=max_tokens, max_bytes=max_bytes)
    try:  # fp32: views of the body, which the robust rules keep as it is (nothing changes it once received)
        return aggregator.prepare(update, given=True), meta
    except ValueError as error:  # the aggregator's own checks
        raise RequestError(422, f"update refused: {error}") from None


def check_update_metadata(meta: Mapping[str, Any], round_number: int, *, codec: str, max_tokens: int) -> None:
    """The update's metadata: round, codec, tokens and loss. RequestError 400 or 422."""
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
    except ContributionError as error:
        raise RequestError(422, str(error)) from None


CHECK_CHUNK = 1 << 22  # float32 values read at a time from a spooled body (16 MB)


def check_spooled_fp32_update(body: SpooledBody, round_number: int, *, spec: Mapping[str, TensorSpec],
                              max_tokens: int, max_bytes: int) -> tuple[SpooledVector, float, dict[str, Any]]:
    """An fp32 upload checked where it lies, in its spool file, a chunk at a time: the same checks
    as `check_update` and the aggregator's (layout, metadata, names, dtypes, shapes, finite, the
    MAX_ABS_VALUE bound, a finite norm), with the same statuses, but without the body in memory.
    Returns (the body file itself as the update's flat vector, in the model's order; its global L2
    norm; the metadata). The file then belongs to the vector."""
    try:
        prefix = body.read_range(0, min(8, body.size))
        length = header_length(prefix, body.size, max_bytes)
        header, meta, base = parse_header(body.read_range(0, 8 + length), body.size, max_bytes)
    except WireError as error:
        raise RequestError(400, f"malformed update body: {error}") from None
    check_update_metadata(meta, round_number, codec="fp32", max_tokens=max_tokens)
    try:
        # what the fp32 codec checks as it decodes (Codec.decode): its options, the recorded shapes, the arrays
        codec_of(meta)
        recorded_shapes(meta, {name: s.shape for name, s in spec.items()})
        if set(header) != set(spec):
            missing, extra = sorted(set(spec) - set(header)), sorted(set(header) - set(spec))
            raise WireError(f"fp32 update: arrays missing {missing[:8]}, unexpected {extra[:8]}")
        for name, wanted in spec.items():
            entry = header[name]
            if entry["dtype"] != "F32" or tuple(entry["shape"]) != tuple(wanted.shape):
                raise WireError(f"tensor {name!r}: expected float32 array of shape {tuple(wanted.shape)}, "
                                f"got {dtype_of_tag(entry['dtype'])} {tuple(entry['shape'])}")
    except WireError as error:
        raise RequestError(422, str(error)) from None
    segments, position, total = [], 0, 0.0
    buffer = np.empty(CHECK_CHUNK, dtype=np.float32)
    for name in spec:  # the model's order: the flat vector the aggregator expects
        begin, end = header[name]["data_offsets"]
        count = (end - begin) // 4
        segments.append((position, base + begin, count))
        for start in range(0, count, CHECK_CHUNK):
            part = body.read_into(base + begin + 4 * start, buffer[: min(CHECK_CHUNK, count - start)])
            if not np.isfinite(part).all():
                raise RequestError(422, f"update: tensor {name!r} has non-finite values (NaN/inf); "
                                        "the sender's training diverged")
            largest = max(float(part.max()), -float(part.min())) if part.size else 0.0
            if largest > MAX_ABS_VALUE:
                raise RequestError(422, f"update: tensor {name!r} has values up to {largest:.3g} in magnitude, "
                                        f"beyond the bound of {MAX_ABS_VALUE:g} that no honest update comes near")
            total += float(np.einsum("i,i->", part, part, dtype=np.float64))
        position += count
    norm = math.sqrt(total)
    if not math.isfinite(norm):
        raise RequestError(422, "update refused: update has NaN/inf values (or overflows float64 norm); "
                                "the replica diverged, refusing it")
    return body.as_vector(segments, position), norm, meta


def default_update_limit(n_params: int, n_tensors: int) -> int:
    """Largest honest update: fp32 values (the largest codec except topk with ratio near 1, which
    sends 8 bytes per kept value) plus the safetensors header, with some slack."""
    return 8 * n_params + 512 * n_tensors + 65536


def ram_budget_bytes(megabytes: float | None) -> int:
    """[coordinator] ram_for_updates_mb in bytes; None: half the memory available now."""
    if megabytes is not None:
        return int(megabytes * 1e6)
    available = available_memory()
    return available // 2 if available is not None else 1 << 30


def spool_full(error: OSError) -> RequestError:
    log.error("could not spool an upload (%s); free disk space in the state directory's spool/, "
              "or raise [coordinator] ram_for_updates_mb", error)
    return RequestError(503, f"the coordinator could not store this update ({error.strerror or error}); "
                             "send it again later", headers={"Retry-After": "10"})
