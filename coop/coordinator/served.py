"""What GET /v1/weights serves: the global weights, as views of the served body itself.

One copy of the model for both (coop.wire.lay_out), and nothing to pack when a round closes. Each
close computes the next round's weights into a new buffer, so a download still reading the last
round's body never sees it change. With the compressed downlink the body is the workers' view
instead (coop.coordinator.downlink), laid out the same way.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any

import numpy as np

from coop.threads import copy_all, parallel_map, pieces
from coop.wire import Laid, TensorSpec, lay_out


def weights_metadata(model_config: Any, round_number: int) -> dict[str, Any]:
    return {"round": round_number, "model": asdict(model_config)}


def lay_out_weights(specs: Mapping[str, TensorSpec], model_config: Any, round_number: int) -> Laid:
    """A new body for round `round_number`'s weights, the values still to be written into its views."""
    return lay_out(specs, weights_metadata(model_config, round_number))


def copy_into(target: dict[str, np.ndarray], source: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """target[n][...] = source[n] for every array of `target` (views of a laid-out body), on every core."""
    copy_all(target.values(), (np.asarray(source[n]) for n in target))
    return target


def body_of(laid: Laid, view: Laid | None) -> memoryview:
    """What GET /v1/weights serves for the round: the weights' own buffer, or with the compressed
    downlink its view's (coop.coordinator.downlink)."""
    return laid.body if view is None else view.body


class NextBody:
    """The next round's served body, laid out while the round runs: its pages touched in a thread
    (a fresh 498 MB buffer costs ~0.5 s of page faults at first touch) rather than in the close, and
    the streamed mean's running sums kept in it, so that the close computes the mean, then the new
    weights, where they are then served. The process holds three copies of the model: the weights
    served, the outer momentum, and this one."""

    def __init__(self, lay: Callable[[int], Laid]):
        self.lay = lay  # round -> a new body of the weights' layout
        self._round: int | None = None
        self._laying: asyncio.Task | None = None

    def prepare(self, round_number: int) -> None:
        """On the event loop: start laying out round `round_number`'s body (once the last is taken)."""
        if self._round != round_number:
            self._round = round_number
            self._laying = asyncio.create_task(asyncio.to_thread(self._lay_touched, round_number))

    async def get(self, round_number: int) -> Laid:
        """Round `round_number`'s body; the same one until the next prepare."""
        self.prepare(round_number)
        return await self._laying

    def _lay_touched(self, round_number: int) -> Laid:
        laid = self.lay(round_number)
        parts = pieces(laid.tensors.values())
        parallel_map(lambda part: part.fill(0), parts, sum(p.size for p in parts))
        return laid


def weights_answer(c: Any, token: str | None, if_none_match: str | None,
                   since: str) -> tuple[int, dict[str, str], bytes | memoryview]:
    """GET /v1/weights for coordinator `c`, on the API's port or the upload port: (status, headers,
    body). A worker's token, or with a run token that one (RequestError 401 otherwise); 304 when
    `if_none_match` names the open round; the change since round `since` where the compressed
    downlink has it; else the full weights. Counted as sent."""
    record = c.members.authenticate(token) if token else None
    if record is None:
        c.check_status_access(token)
    else:
        record.seen(c.clock())
    body, round_number = c.weights_body, c.machine.number
    etag = f'"r{round_number}"'
    headers = {"ETag": etag, "X-Coop-Round": str(round_number), "Cache-Control": "no-cache"}
    if if_none_match == etag:
        return 304, headers, b""
    delta = c.downlink.delta_for(int(since), round_number) if c.downlink and since.isdigit() else None
    if delta is not None:  # the worker holds the last round's view: just what changed (downlink.py)
        c.count_download(record, len(delta.body), "delta")
        return 200, {**headers, "X-Coop-Since": str(delta.since)}, delta.body
    c.count_download(record, len(body), "weights")
    return 200, headers, body
