"""The one validation of a contribution (coop.contribution), through both of its callers: the HTTP
coordinator's `check_update` and a peer's `parse_update` refuse the same bad updates, for the
same reasons; and the peer's merge drops what still fails there (coop.gossip.merge.merge_and_step)."""
from __future__ import annotations

import numpy as np
import pytest

from coop.codec import get_codec
from coop.contribution import MAX_ABS_VALUE, ContributionError, check_arrays, check_tokens, max_tokens_of
from coop.coordinator.updates import RequestError, check_update
from coop.diloco import aggregate
from coop.outer import NesterovSGD
from coop.gossip.identity import Identity
from coop.gossip.merge import merge_and_step
from coop.gossip.payload import parse_update, sign_tensors
from coop.runconfig import RunConfig
from coop.wire import TensorSpec, WireError, pack

SPEC = {"w": TensorSpec((4, 3), np.dtype(np.float32)), "b": TensorSpec((3,), np.dtype(np.float32))}
CONFIG = RunConfig.model_validate({"inner": {"steps": 5, "batch_size": 4}, "model": {"block_size": 16}})
MAX_TOKENS = max_tokens_of(CONFIG)
SENDER = Identity.generate()


def delta(value=0.01):
    return {n: np.full(s.shape, value, np.float32) for n, s in SPEC.items()}


def fp32(update):
    """What the fp32 codec sends for `update`, NaN or not (its encoder refuses NaN: a hostile sender does not)."""
    encoded = get_codec("fp32").encode({n: np.zeros_like(a) for n, a in update.items()})
    assert set(encoded.tensors) == set(update)
    return dict(update), encoded.metadata


def to_coordinator(update, tokens):
    """The coordinator's check of an update body -> None, or the status it refuses with."""
    tensors, codec_meta = fp32(update)
    body = pack(tensors, {**codec_meta, "round": 0, "tokens": tokens, "loss": 1.0})
    try:
        check_update(body, 0, shapes={n: s.shape for n, s in SPEC.items()}, spec=SPEC, codec="fp32",
                     max_tokens=MAX_TOKENS, max_bytes=1 << 20)
    except RequestError as error:
        return error.status, error.message
    return None


def to_peer(update, tokens, weights="ok"):
    weights = delta(1.0) if weights == "ok" else weights
    arrays, codec_meta = fp32(update)
    tensors = {"delta/" + n: a for n, a in arrays.items()} | {"global/" + n: a for n, a in weights.items()}
    meta = {"swarm": "swarm", "peer_id": SENDER.peer_id, "round": 0, "tokens": tokens, "loss": 1.0, "codec": codec_meta}
    body = pack(tensors, sign_tensors(SENDER, "update", tensors, meta))
    try:
        parse_update(body, SPEC, swarm="swarm", round_index=0, max_bytes=1 << 20, require_global=True,
                     max_tokens=MAX_TOKENS)
    except WireError as error:
        return 422, str(error)
    return None


def test_max_tokens_is_k_b_t():
    assert MAX_TOKENS == 5 * 4 * 16
    assert check_tokens(MAX_TOKENS, MAX_TOKENS) == MAX_TOKENS
    for bad in (0, -1, MAX_TOKENS + 1, 10**12, True, 1.5, "7"):
        with pytest.raises(ContributionError, match="tokens"):
            check_tokens(bad, MAX_TOKENS)


@pytest.mark.parametrize("send", [to_coordinator, to_peer], ids=["coordinator", "peer"])
def test_both_modes_refuse_the_same_updates(send):
    assert send(delta(), 100) is None
    huge = delta(1e30)
    nan = delta()
    nan["w"][1, 1] = np.nan
    cases = [(huge, 100, "beyond the bound"), (delta(2 * MAX_ABS_VALUE), 100, "beyond the bound"),
             (nan, 100, "non-finite"), (delta(), 10**12, "tokens"), (delta(), 0, "tokens"),
             ({"w": np.zeros((4, 3), np.float32)}, 100, "b")]
    for update, tokens, words in cases:
        refusal = send(update, tokens)
        assert refusal is not None and refusal[0] == 422, (words, refusal)
        assert words in refusal[1], (words, refusal)


def test_peer_refuses_out_of_range_global_weights():
    assert to_peer(delta(), 100, weights=delta(1e30))[1].startswith("global weights")


def test_check_arrays_reads_only():
    arrays = delta(3.0)
    check_arrays(arrays, SPEC, what="x")
    with pytest.raises(ContributionError, match="dtype"):
        check_arrays({n: a.astype(np.float64) for n, a in arrays.items()}, SPEC, what="x")


# ---------------------------------------------------------------------------------------------
# The merge: the last line, for what the receivers' checks cannot see.

def _others(*values, tokens=100.0):
    return [(delta(v), tokens, delta(1.0)) for v in values]


def test_a_contribution_whose_plain_mean_overflows_cannot_break_the_merge():
    lines = []
    outer = NesterovSGD(lr=1.0, momentum=0.0, nesterov=False)
    own, own_weights = delta(0.01), delta(1.0)
    # finite alone, inf in a plain weighted mean (1e9 tokens x 3e38); the default merge clips it to
    # the round's norm bound first, and should the mean still overflow, drops it
    others = [(delta(3e38), 1e9, delta(1.0))]
    weights, cd, kept = merge_and_step(outer, own, 100.0, own_weights, others, ["bad"], lines.append)
    assert all(np.isfinite(a).all() for a in weights.values())
    assert kept in ([0], []) and (kept or any("bad" in line and "not finite" in line for line in lines))
    np.testing.assert_array_equal(own_weights["w"], 1.0)  # never modified
    with np.errstate(over="ignore", invalid="ignore"):
        plain = aggregate([own, others[0][0]], [100.0, 1e9], rule="mean", clip_factor=None)
    assert not all(np.isfinite(a).all() for a in plain.values())  # what the merge had to survive


def test_merge_drops_non_finite_and_falls_back_to_its_own_update():
    lines = []
    outer = NesterovSGD(lr=1.0, momentum=0.0, nesterov=False)
    bad = delta()
    bad["b"][0] = np.inf
    own_weights = delta(1.0)
    weights, cd, kept = merge_and_step(outer, delta(0.01), 100.0, own_weights, [(bad, 100.0, None)], ["x"],
                                       lines.append)
    assert kept == [] and cd is None and "x" in lines[0]
    np.testing.assert_allclose(weights["w"], 0.99, rtol=1e-6)  # the outer step with our own update alone
    np.testing.assert_array_equal(own_weights["w"], 1.0)  # never modified


def test_merge_never_raises_and_keeps_the_weights_when_the_step_overflows():
    lines = []
    outer = NesterovSGD(lr=0.7, momentum=0.9)
    own_weights = {n: np.full(s.shape, 3e38, np.float32) for n, s in SPEC.items()}
    weights, _, _ = merge_and_step(outer, delta(-3e38), 100.0, own_weights, [], [], lines.append)
    assert all(np.isfinite(a).all() for a in weights.values()) and lines
    np.testing.assert_array_equal(weights["w"], own_weights["w"])
    assert all(np.isfinite(b).all() for b in outer.momentum_buffer.values())
