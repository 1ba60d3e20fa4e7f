"""Robust means of N contributions, the numerical kernels behind `coop.diloco.Aggregator`.

Each coordinate-wise rule takes a stack (N, size) of one tensor's contributions and their weights
(N,) and returns (size,) in float64; `centered_clip` works on whole updates (its distances are
global L2 norms). Nothing here validates: the Aggregator has checked names, shapes and finiteness.

    weighted_mean    sum_i w_i x_i / sum_i w_i
    trimmed_mean     per coordinate, drop the `cut` smallest and `cut` largest values, weighted mean of the rest
    weighted_median  per coordinate, the weighted median (the mean of the lower and upper one)
    centered_clip    v <- v + sum_i w_i clip_tau(x_i - v) / sum_i w_i, from the coordinate-wise median
                     (Karimireddy, He, Jaggi 2021; hivemind's CenteredClip)
    agreeing         which contributions point the way the coordinate-wise median does (cosine),
                     for the direction-filtered mean

The close's two heaviest passes, `median_dots` (the filtered mean's median and dot products) and
`weighted_sum`, run in engine._C's CPU kernels where it has them (csrc/cpu/robust.cpp: they hold no
GIL, so the pool's threads really run side by side), else in numpy, the fallback, with the same
weighted_sum bits.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from engine._native import native  # engine._C, or None: its CPU kernels of the close (median_dots, weighted_sum_into)

from .spool import SpooledVector
from .threads import parallel_map

Flat = np.ndarray | SpooledVector  # one contribution as a flat float32 vector, in memory or spooled (coop.spool)

CHUNK = 1 << 15  # coordinates per task of over_chunks: an (N, CHUNK) float32 stack (N x 128 KB) stays in the cache
NATIVE_CHUNK = 1 << 16  # coordinates per call of the native kernels (bench/robust_close.py: 1 << 14 .. 1 << 20 alike)
SPOOLED_STACK = 4 << 20  # bytes of spooled rows read per call at least: fewer, larger reads (1.7x faster for 4 rows)


def native_chunk_of(flats: Sequence[Flat]) -> int:
    """Coordinates per call of the native kernels: NATIVE_CHUNK in memory; for spooled rows, as many
    as fill SPOOLED_STACK (a thread's stack of them stays a few MB)."""
    spooled = sum(not isinstance(flat, np.ndarray) for flat in flats)
    return max(NATIVE_CHUNK, SPOOLED_STACK // (4 * spooled)) if spooled else NATIVE_CHUNK


def native_kernels() -> bool:
    """Whether engine._C has the CPU kernels of the close (absent where it is not built, or older)."""
    return getattr(native, "median_dots", None) is not None and getattr(native, "weighted_sum_into", None) is not None


def rows(flats: Sequence[Flat], start: int, stop: int) -> np.ndarray:
    """The (N, stop - start) float32 stack of N flat contributions' coordinates [start, stop): each
    row copied from an in-memory vector, or read straight into place from a spooled one."""
    stack = np.empty((len(flats), stop - start), dtype=np.float32)
    for row, flat in zip(stack, flats):
        if isinstance(flat, np.ndarray):
            row[:] = flat[start:stop]
        else:
            flat.read_into(start, row)
    return stack


def row_views(flats: Sequence[Flat], start: int, stop: int) -> list[np.ndarray]:
    """The N rows of coordinates [start, stop) for the native kernels: views of the in-memory
    vectors (nothing copied), the spooled ones read into one stack of their own."""
    spooled = [flat for flat in flats if not isinstance(flat, np.ndarray)]
    read = iter(rows(spooled, start, stop)) if spooled else iter(())
    return [flat[start:stop] if isinstance(flat, np.ndarray) else next(read) for flat in flats]


def over_chunks(rule: Callable[[np.ndarray], np.ndarray], flats: Sequence[Flat], scales: np.ndarray,
                reduce: bool = False, out: np.ndarray | None = None) -> np.ndarray:
    """Apply a coordinate-wise `rule` ((N, chunk) float32 stack -> (chunk,)) to N flat contributions,
    each scaled by its `scales` entry (norm clipping), one chunk of coordinates at a time on every
    core. Returns the (size,) float32 result (in `out` if given); with `reduce`, the rule returns a
    fixed-size vector per chunk (partial sums) and their sum (float64) is returned instead."""
    size = flats[0].size
    clipped = bool(np.any(scales != 1))

    def one(start: int) -> np.ndarray:
        stack = rows(flats, start, min(start + CHUNK, size))  # (N, chunk) float32, a copy
        if clipped:
            stack *= scales[:, None]
        return rule(stack)

    if reduce:
        parts = parallel_map(one, range(0, size, CHUNK), size * len(flats))
        return np.sum([np.asarray(p, dtype=np.float64) for p in parts], axis=0)
    out = np.empty(size, dtype=np.float32) if out is None else out

    def into_out(start: int) -> None:  # each chunk's result where it belongs, as soon as it is made
        part = one(start)
        out[start : start + part.size] = part

    parallel_map(into_out, range(0, size, CHUNK), size * len(flats))
    return out


def weighted_sum(flats: Sequence[Flat], coefficients: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """sum_i c_i x_i over N flat float32 vectors (into `out` if given), one chunk of coordinates at
    a time on every core (no (N, size) stack is made). Accumulated in float64 and rounded once, so
    the order of the contributions does not change the float32 result (a gossip group and the star
    merge agree); the native kernel and numpy give the same bits."""
    size = flats[0].size
    out = np.empty(size, dtype=np.float32) if out is None else out
    coefficients = np.ascontiguousarray(coefficients, dtype=np.float64)
    if native_kernels() and out.flags.c_contiguous:
        step = native_chunk_of(flats)

        def native_chunk(start: int) -> None:
            stop = min(start + step, size)
            native.weighted_sum_into(row_views(flats, start, stop), coefficients, out[start:stop])

        parallel_map(native_chunk, range(0, size, step), size * len(flats))
        return out

    def one(start: int) -> None:
        stop = min(start + CHUNK, size)
        acc = np.zeros(stop - start, dtype=np.float64)
        row = np.empty(stop - start, dtype=np.float32)
        for flat, c in zip(flats, coefficients):
            if isinstance(flat, np.ndarray):
                acc += flat[start:stop] * c
            else:
                acc += flat.read_into(start, row) * c
        out[start:stop] = acc

    parallel_map(one, range(0, size, CHUNK), size * len(flats))
    return out


def median_dots(flats: Sequence[Flat], scales: np.ndarray, coefficients: np.ndarray | None = None,
                out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """With x_i = scales[i] * flats[i] (float32, the clipped contributions) and m their coordinate-wise
    median: (x_i . m for each i, then m . m), (N + 1,) float64, and the weighted sum of the flats with
    `coefficients` (into `out` if given) where it comes in the same pass for free (the native kernel:
    every contribution read once), else None. The median of a chunk is used where it is made, never
    kept whole; numpy sums the dots in float32 within a chunk (the filter needs only the cosines'
    order of magnitude), the native kernel in float64."""
    size, n = flats[0].size, len(flats)
    if not native_kernels():
        return over_chunks(_dots_with_median, flats, scales, reduce=True), None
    scales = np.ascontiguousarray(scales, dtype=np.float32)
    fused = coefficients is not None and (out is None or out.flags.c_contiguous)
    if fused:
        coefficients = np.ascontiguousarray(coefficients, dtype=np.float64)
        out = np.empty(size, dtype=np.float32) if out is None else out

    step = native_chunk_of(flats)

    def native_chunk(start: int) -> np.ndarray:
        stop = min(start + step, size)
        rows_of_chunk = row_views(flats, start, stop)
        if fused:
            return native.median_dots(rows_of_chunk, scales, coefficients, out[start:stop])
        return native.median_dots(rows_of_chunk, scales)

    parts = parallel_map(native_chunk, range(0, size, step), size * n)
    return np.sum(parts, axis=0) if parts else np.zeros(n + 1), out if fused else None


def _dots_with_median(stack: np.ndarray) -> np.ndarray:
    """(N, chunk) clipped -> (N + 1,): x_i . m, m . m in float32, the numpy fallback of median_dots
    (einsum's own loop: BLAS in a pool thread would start threads of its own)."""
    m = median(stack)
    return np.append(np.einsum("ns,s->n", stack, m), np.einsum("s,s->", m, m))


def weighted_mean(stack: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """stack (N, size), weights (N,) -> (size,) float64."""
    return np.einsum("n,ns->s", weights, stack, dtype=np.float64) / weights.sum()


def trimmed_mean(stack: np.ndarray, weights: np.ndarray, cut: int) -> np.ndarray:
    """Per coordinate: sort the N values, drop `cut` at each end, weighted mean of the survivors
    (each keeps its own contribution's weight). cut 0 is the weighted mean."""
    n = stack.shape[0]
    if cut == 0:
        return weighted_mean(stack, weights)
    order = np.argsort(stack, axis=0, kind="stable")[cut : n - cut]  # (N - 2cut, size)
    kept_values = np.take_along_axis(stack, order, axis=0).astype(np.float64)
    kept_weights = weights[order]  # (N - 2cut, size): each survivor's weight
    return (kept_values * kept_weights).sum(axis=0) / kept_weights.sum(axis=0)


def median(stack: np.ndarray) -> np.ndarray:
    """stack (N, size) -> (size,) in its dtype: per coordinate the median (the mean of the two middle
    values when N is even). Up to 8 rows an odd-even transposition network of elementwise
    minimum / maximum (ten times faster than a sort along the short axis), else that sort."""
    n = stack.shape[0]
    if n <= 8:
        ordered = list(stack)
        for sweep in range(n):
            for i in range(sweep % 2, n - 1, 2):
                ordered[i], ordered[i + 1] = np.minimum(ordered[i], ordered[i + 1]), np.maximum(ordered[i], ordered[i + 1])
    else:
        ordered = np.sort(stack, axis=0)
    if n % 2:
        return ordered[n // 2]
    return 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])


def weighted_median(stack: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Per coordinate, the mean of the lower and the upper weighted median: with equal weights the
    ordinary median (the mean of the two middle values when N is even)."""
    order = np.argsort(stack, axis=0, kind="stable")  # (N, size)
    values = np.take_along_axis(stack, order, axis=0).astype(np.float64)
    cum = np.cumsum(weights[order], axis=0)  # (N, size), ascending
    half = 0.5 * float(weights.sum())
    tol = 1e-12 * half
    lower = np.argmax(cum >= half - tol, axis=0)  # first index whose cumulative weight reaches half
    upper = np.argmax(cum > half + tol, axis=0)  # first index past half (== lower unless a tie at half)
    upper = np.where(np.abs(cum[lower, np.arange(cum.shape[1])] - half) <= tol, upper, lower)
    columns = np.arange(stack.shape[1])
    return 0.5 * (values[lower, columns] + values[upper, columns])


def _distance(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> float:
    total = 0.0
    for name, x in a.items():
        d = (np.asarray(x, np.float64) - b[name]).reshape(-1)
        total += float(d @ d)
    return math.sqrt(total)


def centered_clip(updates: Sequence[Mapping[str, np.ndarray]], weights: np.ndarray,
                  start: Mapping[str, np.ndarray], iterations: int = 5) -> dict[str, np.ndarray]:
    """CenteredClip from `start` (float64 arrays): each iteration moves the centre v by the weighted
    mean of (x_i - v) clipped to norm tau, with tau the median distance of the contributions from
    `start` (so at least half of them are never clipped in the first iteration). One
    contribution moves v by at most tau * its weight share per iteration, whatever it sent."""
    v = {name: np.array(a, dtype=np.float64) for name, a in start.items()}
    tau = float(np.median([_distance(u, v) for u in updates]))
    if tau == 0.0:
        return v  # at least half of the contributions sit on the start: it is the answer
    total = float(weights.sum())
    for _ in range(iterations):
        dists = [_distance(u, v) for u in updates]
        coefs = [w / total * (1.0 if d <= tau else tau / d) for w, d in zip(weights, dists)]
        for name, centre in v.items():
            step = np.zeros_like(centre)
            for u, c in zip(updates, coefs):
                step += c * (np.asarray(u[name], np.float64) - centre)
            centre += step
    return v


def agreeing(cosines: np.ndarray, fraction: float) -> np.ndarray:
    """Indices of the contributions whose cosine to the robust reference is positive and at least
    `fraction` x the median cosine of the round: an update that points away from what the round
    agrees on (a flipped sign, noise, another objective) is left out whatever its norm. Never
    empty: with none passing, the one that agrees best."""
    threshold = max(0.0, fraction * float(np.median(cosines)))
    kept = np.flatnonzero(cosines >= threshold) if threshold > 0 else np.flatnonzero(cosines > 0)
    return kept if kept.size else np.array([int(np.argmax(cosines))])
