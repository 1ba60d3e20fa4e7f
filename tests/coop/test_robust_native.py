"""The CPU kernels of the close (csrc/cpu/robust.cpp, reached from coop.robust): median_dots against a
float64 reference computed from the same float32 scaled values, weighted_sum_into bit for bit what
the numpy fallback gives, the Aggregator's result the same with the kernels and without them (every
rule, in RAM and spooled, someone left out or not), and bad arguments refused with a clear error."""
from __future__ import annotations

import numpy as np
import pytest

from coop import robust
from coop.diloco import RULES, Aggregator
from coop.spool import Spool

pytestmark = pytest.mark.skipif(not robust.native_kernels(),
                                reason="engine._C without the CPU kernels of the close (median_dots, weighted_sum_into): "
                                       "build it with `pip install -e .`")
native = robust.native
LENGTHS = (0, 1, 7, 255, 256, 257, 1001)  # empty, shorter than a block, a block and a bit, odd


def scaled_and_median(stack: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(N, n) float32 -> the scaled values and their median, in float32 as the numpy fallback makes
    them, then as float64."""
    x = stack * scales[:, None]  # float32, as the kernel scales
    ordered = np.sort(x, axis=0)
    n = x.shape[0]
    m = ordered[n // 2] if n % 2 else np.float32(0.5) * (ordered[n // 2 - 1] + ordered[n // 2])
    return x.astype(np.float64), m.astype(np.float64)


def reference(stack: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """(N + 1,): x_i . m, then m . m, summed in float64 (each product of two float32 is exact)."""
    x, m = scaled_and_median(stack, scales)
    return np.append(x @ m, m @ m)


def bound(stack: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """How far two float64 sums of the same n products may differ: n ulps of the sum of |products|."""
    x, m = scaled_and_median(stack, scales)
    return 2.3e-16 * (stack.shape[1] + 1) * np.append(np.abs(x) @ np.abs(m), m @ m) + 1e-300


@pytest.mark.parametrize("n_rows", list(range(1, 13)) + [17, 33, 300])  # 300: past the sorting network
def test_median_dots_match_a_float64_reference(n_rows):
    rng = np.random.default_rng(n_rows)
    for length in LENGTHS:
        stack = rng.standard_normal((n_rows, length)).astype(np.float32)
        scales = rng.uniform(0.1, 1.0, n_rows).astype(np.float32)
        scales[0] = 1.0
        got = native.median_dots(list(stack), scales)
        assert got.dtype == np.float64 and got.shape == (n_rows + 1,)
        np.testing.assert_array_less(np.abs(got - reference(stack, scales)), bound(stack, scales),
                                     err_msg=f"N {n_rows}, length {length}")


@pytest.mark.parametrize("n_rows", list(range(1, 13)) + [16, 20])
def test_the_median_of_ties_and_of_every_zero_one_input_is_exact(n_rows):
    """Small integers with many ties: every sum is exact, so any wrong median shows. Then, by the 0-1
    principle, every 0/1 input (one per coordinate, times a random positive weight so that errors
    cannot cancel across coordinates) checks the sorting network itself."""
    rng = np.random.default_rng(100 + n_rows)
    ties = rng.integers(-2, 3, size=(n_rows, 999)).astype(np.float32)
    np.testing.assert_array_equal(native.median_dots(list(ties), np.ones(n_rows, np.float32)),
                                  reference(ties, np.ones(n_rows, np.float32)))
    count = 1 << min(n_rows, 12)
    bits = ((np.arange(count)[None, :] >> np.arange(n_rows)[:, None]) & 1).astype(np.float32)
    if n_rows > 12:  # 2^16 inputs would be slow to check: random 0/1 columns instead
        bits = rng.integers(0, 2, size=(n_rows, 4096)).astype(np.float32)
    zero_one = bits * rng.uniform(1.0, 2.0, bits.shape[1]).astype(np.float32)
    scales = np.ones(n_rows, np.float32)
    np.testing.assert_allclose(native.median_dots(list(zero_one), scales), reference(zero_one, scales), rtol=1e-12)


@pytest.mark.parametrize("n_rows", list(range(1, 13)) + [20])
def test_weighted_sums_are_the_bits_of_the_numpy_fallback(n_rows, monkeypatch):
    rng = np.random.default_rng(200 + n_rows)
    for length in LENGTHS:
        flats = [(rng.standard_normal(length) * 10.0 ** rng.integers(-3, 4)).astype(np.float32) for _ in range(n_rows)]
        coefficients = rng.standard_normal(n_rows) / n_rows
        fast = robust.weighted_sum(flats, coefficients)
        fused = np.full(length, np.nan, np.float32)
        native.median_dots(flats, np.ones(n_rows, np.float32), coefficients, fused)
        with monkeypatch.context() as m:
            m.setattr(robust, "native", None)
            assert not robust.native_kernels()
            slow = robust.weighted_sum(flats, coefficients)
        np.testing.assert_array_equal(fast, slow, err_msg=f"N {n_rows}, length {length}")
        np.testing.assert_array_equal(fused, slow, err_msg=f"fused: N {n_rows}, length {length}")


SHAPES = {"wte": (300, 64), "ln.w": (64,), "proj": (64, 97)}  # 25_472 coordinates


def updates(n: int, seed: int, away: bool):
    rng = np.random.default_rng(seed)
    common = {name: rng.standard_normal(shape) for name, shape in SHAPES.items()}
    out = [{name: (c + rng.standard_normal(c.shape)).astype(np.float32) for name, c in common.items()} for _ in range(n)]
    out[-1] = {name: 3 * a for name, a in out[-1].items()}  # a long one: clipped (scale != 1)
    if away:
        out[1] = {name: -3 * a for name, a in out[1].items()}  # one that points away: filtered_mean leaves it out
    return out


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("spooled", [False, True])
@pytest.mark.parametrize("away", [False, True])
def test_the_aggregators_result_is_the_same_with_and_without_the_kernels(tmp_path, monkeypatch, rule, spooled, away):
    monkeypatch.setattr(robust, "NATIVE_CHUNK", 4096)  # several chunks, the last one short
    results = []
    for kernels in (True, False):
        with monkeypatch.context() as m:
            if not kernels:
                m.setattr(robust, "native", None)
            spool = Spool(tmp_path / f"spool-{kernels}") if spooled else None
            aggregator = Aggregator(SHAPES, rule=rule, spool=spool)
            for i, update in enumerate(updates(7, seed=3, away=away)):
                aggregator.add(update, weight=1.0 + i)
            out = np.full(25_472, np.nan, np.float32)
            result = aggregator.result(out=out)
            results.append(({name: a.copy() for name, a in result.items()}, aggregator.left_out, aggregator.clip_bound))
            aggregator.reset()
    (fast, left_fast, bound_fast), (slow, left_slow, bound_slow) = results
    assert left_fast == left_slow and bound_fast == bound_slow
    if rule == "filtered_mean":
        assert left_fast == ([1] if away else [])
    for name in SHAPES:
        np.testing.assert_array_equal(fast[name], slow[name], err_msg=f"{rule}: {name}")


def test_bad_arguments_are_refused_with_what_was_expected():
    row, scales = np.ones(10, np.float32), np.ones(2, np.float32)
    cases = [
        (lambda: native.median_dots([], np.ones(0, np.float32)), "at least one row"),
        (lambda: native.median_dots([row, row.astype(np.float64)], scales), "row 1 must be float32, got float64"),
        (lambda: native.median_dots([row, [1.0] * 10], scales), "row 1 must be a numpy float32 array"),
        (lambda: native.median_dots([row, np.ones((2, 5), np.float32)], scales), "row 1 must be 1-D, got 2-D"),
        (lambda: native.median_dots([row, np.ones(20, np.float32)[::2]], scales), "row 1 must be C-contiguous"),
        (lambda: native.median_dots([row, row[:9]], scales), "row 1 has 9 elements, expected 10"),
        (lambda: native.median_dots([row, row], np.ones(3, np.float32)), "scales has 3 elements, expected 2"),
        (lambda: native.median_dots([row, row], np.ones(2)), "scales must be float32, got float64"),
        (lambda: native.median_dots([row, row], scales, np.ones(2)), "coefficients and out come together"),
        (lambda: native.median_dots([row, row], scales, np.ones(2), np.empty(9, np.float32)),
         "out has 9 elements, expected 10"),
        (lambda: native.weighted_sum_into([row, row], np.ones(2, np.float32), np.empty(10, np.float32)),
         "coefficients must be float64, got float32"),
        (lambda: native.weighted_sum_into([row, row], np.ones(2), np.empty(10, np.float32)[None]), "out must be 1-D"),
    ]
    read_only = np.empty(10, np.float32)
    read_only.flags.writeable = False
    cases.append((lambda: native.weighted_sum_into([row], np.ones(1), read_only), "out is read-only"))
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    with pytest.raises(ValueError, match="^weighted_sum_into: "):  # the op's name first
        native.weighted_sum_into([], np.ones(0), np.empty(0, np.float32))
