"""What GET /v1/weights serves: the global weights, as views of the served body itself.

One copy of the model for both (coop.wire.lay_out), and nothing to pack when a round closes. Each
close computes the next round's weights into a new buffer, so a download still reading the last
round's body never sees it change. With the compressed downlink the body is the workers' view
instead (coop.coordinator.downlink), laid out the same way.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import numpy as np

from coop.threads import copy_all
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
