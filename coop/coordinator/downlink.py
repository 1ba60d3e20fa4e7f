"""The compressed downlink ([compression] downlink = "codec"): what changed, in the run's codec.

The coordinator keeps the exact global weights G (the outer steps') and the view V that every
worker holds (what the downloads gave them). After each round's outer step it encodes G - V for
the tensors the round changed and adds the decoded result to V; a worker holding the previous
round's view downloads just that (`GET /v1/weights?since=r`), anyone else the full view. Encoding
G - V rather than the step is the error feedback: what one round's quantisation lost is part of
the next round's difference, so V never drifts from G by more than one round's quantisation
error. Every `snapshot_every` rounds V becomes G exactly (a full download for everyone), and a
restarted coordinator starts from V = G.

V lives in the body that `GET /v1/weights` serves (coop.wire.lay_out, a new one each round): the
close computes the next view into it, and nothing is packed for the full download.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..codec import Codec, get_codec
from ..threads import parallel_map
from ..wire import Laid, pack
from .served import copy_into


@dataclass
class Delta:
    since: int  # the round whose view it applies to
    round: int  # the round whose view it makes
    body: bytes  # the encoded difference (safetensors; metadata: the codec's, round, since)


def downlink_codec(name: str, options: dict) -> Codec:
    """The run's codec without its own error feedback: G - V carries it already."""
    try:
        return get_codec(name, **options, error_feedback=False)
    except ValueError:  # a codec without error feedback (fp32, fp16, bf16, int8)
        return get_codec(name, **options)


class Downlink:
    def __init__(self, codec_name: str, options: dict, weights: dict[str, np.ndarray], snapshot_every: int,
                 lay: Callable[[int], Laid], round_number: int):
        self.codec = downlink_codec(codec_name, options)
        self.snapshot_every = snapshot_every
        self.lay = lay  # round -> a new served body of the weights' layout (values still to be written)
        self.laid = lay(round_number)  # V, as views of the body served for the full download
        copy_into(self.laid.tensors, weights)
        self.delta: Delta | None = None

    @property
    def view(self) -> dict[str, np.ndarray]:
        return self.laid.tensors

    def after_step(self, weights: dict[str, np.ndarray], names: list[str], next_round: int) -> None:
        """After the outer step that makes round `next_round`'s weights (in a thread, before the
        new round opens): move the view into a new body (a download may still read the last), and
        keep the difference for workers of the last round."""
        new = self.lay(next_round)
        if self.snapshot_every and next_round % self.snapshot_every == 0:
            copy_into(new.tensors, weights)
            self.laid, self.delta = new, None
            return
        view, size = self.view, sum(weights[n].size for n in names)  # the differences on every core
        changes = parallel_map(lambda n: weights[n] - view[n], names, size)
        encoded = self.codec.encode(dict(zip(names, changes)))
        decoded = self.codec.decode(encoded.tensors, encoded.metadata)
        parallel_map(lambda n: np.add(view[n], decoded[n], out=new.tensors[n]), names, size)
        copy_into({n: a for n, a in new.tensors.items() if n not in decoded}, view)  # the tensors this round left alone
        self.laid = new
        meta = {**encoded.metadata, "round": next_round, "since": next_round - 1}
        self.delta = Delta(next_round - 1, next_round, pack(encoded.tensors, meta))

    def delta_for(self, since: int, current_round: int) -> Delta | None:
        """The difference from round `since`'s view to the current one, if that is what we have."""
        delta = self.delta
        if delta is not None and delta.since == since and delta.round == current_round:
            return delta
        return None
