"""What every contribution (one sender's update to one round) must satisfy where it is received.

One set of rules for both modes: the HTTP coordinator (`coop.coordinator.updates.check_update`)
and a peer (`coop.gossip.payload.parse_update`) both call these, after unpacking the message and
before the update may touch any state. Every refusal is a `ContributionError` (a `WireError`,
answered with 422): the message was well formed but is not an honest update of this model.

- `tokens`: an int in [1, K x B x T] (inner steps x batch size x block size of the run config):
  no replica trains on more tokens in one round, and the weight of an update in the mean is its
  token count, so an inflated claim would outweigh everyone else. A worker whose replica trains
  data parallel on G GPUs (`coop-worker join --gpus`, joined with the device label 'cuda xG')
  takes G batches a step: the coordinator allows it G x K x B x T (`gpus_of_device_label`).
- `loss`: a finite number or null.
- arrays: exactly the model's tensor names, shapes and dtypes (after the codec's decode, checked
  before anything of the claimed size is allocated), finite, and no value beyond MAX_ABS_VALUE.
  A GPT's weights and their change over one round are many orders of magnitude smaller; values
  near float32's range (1e30) exist only to overflow the mean. What a finite, in-range update can
  still do to the model is the aggregator's part (`coop.diloco.Aggregator`: norm bounds, robust
  means), and the merge drops whatever still fails there (`coop.gossip.merge.merge_and_step`).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from coop.codec import decode
from coop.threads import parallel_map, pieces
from coop.runconfig import RunConfig
from coop.wire import TensorSpec, WireError, check_tensors

# |value| above this in a pseudo-gradient or a copy of the global weights is refused (see above)
MAX_ABS_VALUE = 1e6


class ContributionError(WireError):
    """A well-formed message whose update this run refuses (422)."""


def max_tokens_of(config: RunConfig) -> int:
    """K x B x T (K / P with P fragments): the most tokens one replica trains on in one round."""
    return config.round_steps * config.inner.batch_size * config.model.block_size


MAX_GPUS_PER_WORKER = 16


def gpus_of_device_label(label: str) -> int:
    """G from a worker's device label 'cuda xG' (1 for any other label), at most MAX_GPUS_PER_WORKER."""
    kind, _, count = str(label).rpartition(" x")
    if not kind or not count.isdigit():
        return 1
    return max(1, min(int(count), MAX_GPUS_PER_WORKER))


def check_tokens(tokens: Any, max_tokens: int) -> int:
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= max_tokens:
        raise ContributionError(f"update claims {tokens!r:.40} tokens; a round of this run is an int from 1 to "
                                f"{max_tokens} ([inner] steps x batch_size x block_size)")
    return tokens


def check_loss(loss: Any) -> float | None:
    if loss is None:
        return None
    if isinstance(loss, bool) or not isinstance(loss, (int, float)) or not math.isfinite(loss):
        raise ContributionError(f"update metadata 'loss' must be a finite number or null, got {loss!r:.50}")
    return float(loss)


def check_arrays(arrays: Mapping[str, np.ndarray], spec: Mapping[str, TensorSpec], *, what: str,
                 max_abs: float = MAX_ABS_VALUE) -> None:
    """Names, shapes, dtypes as the model's; finite; no |value| above `max_abs`. Reads only."""
    try:
        check_tensors(arrays, spec, what=what)
    except ContributionError:
        raise
    except WireError as error:
        raise ContributionError(str(error)) from None
    def largest(part: np.ndarray) -> float:  # no |part| temporary
        return max(float(part.max()), -float(part.min())) if part.size else 0.0

    work = [(name, part) for name, array in arrays.items() for part in pieces([np.asarray(array)])]
    values = parallel_map(lambda item: largest(item[1]), work, sum(part.size for _, part in work))  # every core
    for (name, _), value in zip(work, values):
        if value > max_abs:
            raise ContributionError(f"{what}: tensor {name!r} has values up to {value:.3g} in magnitude, "
                                    f"beyond the bound of {max_abs:g} that no honest update comes near")


def decode_pseudo_gradient(arrays: Mapping[str, np.ndarray], codec_metadata: Mapping[str, Any],
                           spec: Mapping[str, TensorSpec], *, what: str = "pseudo-gradient",
                           copy: bool = True) -> dict[str, np.ndarray]:
    """The codec's arrays -> the checked float32 pseudo-gradient (the codec refuses, before
    allocating, shapes other than the model's). `copy=False`: fp32 arrays come back as they are."""
    try:
        update = decode(dict(arrays), dict(codec_metadata), expected_shapes={n: s.shape for n, s in spec.items()},
                        copy=copy)
    except WireError as error:
        raise ContributionError(str(error)) from None
    check_arrays(update, spec, what=what)
    return update
