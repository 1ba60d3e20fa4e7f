"""DiLoCo's algebra: pseudo-gradients and their aggregation (the outer optimizer: coop.outer).

One round, whatever the transport (simulation, HTTP coordinator, gossip):

    delta_i = pseudo_gradient(global_weights, local_weights_i)     # on each worker, after K inner steps
    aggregator.add(delta_i, weight=tokens_i)                       # as each update arrives
    outer.step(global_weights, aggregator.result())                # moves the global weights in place

Weights are dicts of float32 numpy arrays keyed by parameter name (a model's state_dict as numpy).
Nothing here knows about HTTP, codecs or the engine.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import robust as robust_ops
from .robust import Flat
from .spool import MemoryBudget, Spool, SpooledVector
from .threads import copy_all, parallel_map, pieces
from .wire import flat_view

Weights = Mapping[str, np.ndarray]
Shapes = Mapping[str, tuple[int, ...]]

_CHUNK = 1 << 16  # elements per step of the weighted sum: its scratch buffer (256 KB in fp32) stays in cache


def check_same_tensors(expected: Shapes, got: Weights, what: str) -> None:
    """Raise ValueError unless `got` has exactly the names and shapes of `expected`."""
    if set(got) != set(expected):
        missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
        raise ValueError(f"{what}: tensor names differ from the model's: missing {missing[:8]}, unexpected {extra[:8]}")
    for name, shape in expected.items():
        if tuple(np.shape(got[name])) != tuple(shape):
            raise ValueError(f"{what}: tensor {name!r} has shape {tuple(np.shape(got[name]))}, expected {tuple(shape)}")


def shapes_of(weights: Weights) -> dict[str, tuple[int, ...]]:
    """Name -> shape, e.g. of the global weights (what every update must match)."""
    return {name: tuple(array.shape) for name, array in weights.items()}


def pseudo_gradient(global_weights: Weights, local_weights: Weights) -> dict[str, np.ndarray]:
    """global - local, per tensor, in float32: the direction the replica's K inner steps moved,
    with the sign of a gradient (so the outer optimizer descends along it)."""
    check_same_tensors(shapes_of(global_weights), local_weights, "local weights")

    def difference(name: str) -> np.ndarray:  # asarray around: numpy turns 0-d results into scalars
        theta = np.asarray(global_weights[name], dtype=np.float32)
        return np.asarray(theta - np.asarray(local_weights[name], dtype=np.float32))

    names = list(global_weights)  # the tensors on every core (0.5 s of one core at 124M)
    return dict(zip(names, parallel_map(difference, names, sum(np.size(w) for w in global_weights.values()))))


def global_norm(update: Weights) -> float:
    """L2 norm over all tensors together, accumulated in float64 (no overflow for any float32).
    einsum converts to float64 in its own small buffers as it goes, so no float64 copy of the
    update is ever made (a 124M-parameter update would need a 1 GB one)."""
    parts = pieces(np.asarray(array) for array in update.values())  # views unless an array is not contiguous
    squares = parallel_map(lambda p: float(np.einsum("i,i->", p, p, dtype=np.float64)), parts,
                           sum(p.size for p in parts))  # on every core; summed in the pieces' order
    return math.sqrt(sum(squares))


def clip_by_global_norm(update: Weights, max_norm: float) -> tuple[dict[str, np.ndarray], float]:
    """Scale the whole update down so that its global L2 norm is at most `max_norm`.
    Returns (clipped update, norm before clipping); an update within bounds is returned as is."""
    norm = global_norm(update)
    if norm <= max_norm:
        return dict(update), norm
    factor = np.float32(max_norm / norm)
    return {name: np.asarray(array * factor, dtype=np.float32) for name, array in update.items()}, norm


# ----------------------------------------------------------------------------------------------
# Aggregation.

RULES = ("mean", "trimmed_mean", "median", "centered_clip", "filtered_mean")
# filtered_mean: contributions whose cosine to the coordinate-wise median is below this fraction of
# the round's median cosine (or not positive) are left out, the rest averaged
AGREEMENT_FRACTION = 0.5
DEFAULT_RULE = "filtered_mean"  # the defaults, chosen by measurement: docs/results.md, "Robust aggregation"
DEFAULT_TRIM_FRACTION = 0.25
DEFAULT_CLIP_FACTOR = 2.0
DEFAULT_MIN_CONTRIBUTIONS = 3


@dataclass(frozen=True)
class PreparedUpdate:
    """An update Aggregator.prepare checked: its values (the tensors, or for the robust rules one
    flat float32 copy) and its global L2 norm."""

    values: Any
    norm: float


class Aggregator:
    """The round's aggregate of pseudo-gradients, robust by default.

    Each contribution is weighted by the tokens its replica processed (`add(update, weight=tokens)`),
    so a replica that trained on more data counts more. The `rule`:

    - `"median"`: coordinate-wise weighted median.
    - `"trimmed_mean"` (`trim_fraction`, default 0.25): coordinate-wise trimmed mean. For each
      coordinate, the floor(trim_fraction * N) largest and as many smallest values among the N
      contributions are dropped and the rest averaged with their weights (with fewer than
      1 / trim_fraction contributions nothing is trimmed).
    - `"centered_clip"`: CenteredClip (coop.robust) from the coordinate-wise median.
    - `"filtered_mean"` (default): the weighted mean of the contributions that point the way the
      coordinate-wise median does (cosine >= AGREEMENT_FRACTION x the round's median cosine, and
      > 0; `coop.robust.agreeing`): a sign-flipped or noise update is left out entirely, and the
      rest keep the mean's full step (a median shrinks it). `self.left_out` lists who was dropped.
    - `"mean"`: the plain weighted mean, streamed (see memory).

    Norm clipping, before the rule: each contribution's global L2 norm is clipped to the bound
    min(`max_norm`, `clip_factor` x the median norm of the round's contributions). With the
    streamed `"mean"` the round's median is not known as updates arrive, so the adaptive bound is
    `clip_factor` x the median norm of the last round that had `min_contributions` (none in the
    first round). `clip_factor` None (or 0) and `max_norm` None: no clipping.

    With fewer than `min_contributions` (default 3) contributions a round is not robust: it is
    the plain weighted mean, clipped to `max_norm` only (a median of two norms bounds nothing).

    Memory: `"mean"` keeps one float32 (or `dtype`) running sum per tensor, O(model), so the HTTP
    coordinator can aggregate any number of workers. **The robust rules keep every contribution**:
    N float32 copies of the model, in RAM, or with a `spool` (coop.spool) in RAM while they fit
    its `budget` and on disk past it, where the process's memory stays O(model) (the close reads
    the N rows of one chunk of coordinates at a time); `result()` adds the (size,) result and per thread one (N, chunk) stack (CenteredClip
    loads the spooled contributions whole and makes three float64 copies of the model). `add`
    validates the whole update before touching any state: a refused update
    leaves the aggregator as it was.
    """

    def __init__(self, shapes: Shapes, *, rule: str = DEFAULT_RULE, trim_fraction: float = DEFAULT_TRIM_FRACTION,
                 clip_factor: float | None = DEFAULT_CLIP_FACTOR, max_norm: float | None = None,
                 min_contributions: int = DEFAULT_MIN_CONTRIBUTIONS, dtype: Any = np.float32,
                 spool: Spool | None = None, budget: MemoryBudget | None = None):
        if rule not in RULES:
            raise ValueError(f"rule must be one of {', '.join(RULES)}, got {rule!r}")
        if max_norm is not None and not (math.isfinite(max_norm) and max_norm > 0):
            raise ValueError(f"max_norm must be a positive finite number or None, got {max_norm!r}")
        if clip_factor is not None and not (math.isfinite(clip_factor) and clip_factor >= 0):
            raise ValueError(f"clip_factor must be a finite number >= 0 or None, got {clip_factor!r}")
        if not 0.0 <= trim_fraction < 0.5:
            raise ValueError(f"trim_fraction must be in [0, 0.5), got {trim_fraction!r}")
        if not (isinstance(min_contributions, int) and min_contributions >= 1):
            raise ValueError(f"min_contributions must be an integer >= 1, got {min_contributions!r}")
        self.shapes = {name: tuple(shape) for name, shape in shapes.items()}
        self.rule = rule
        self.max_norm = max_norm
        self.clip_factor = clip_factor or None
        self.trim_fraction = float(trim_fraction)
        self.min_contributions = min_contributions
        self.dtype = np.dtype(dtype)
        self.spool = None if self.streaming else spool  # the robust rules' contributions on disk (coop.spool)
        self.budget = budget  # with a spool: the contributions that fit it stay in RAM (None: none do)
        self._lock = threading.Lock()  # prepare runs in several threads at once
        # name -> sum of weight * update (streaming mode), views of one flat vector: the aggregator's
        # own, kept from round to round, or the caller's (keep_sum_in). The round's first add
        # overwrites it: fresh arrays cost a page fault per 4 KiB on their first touch (1.3 s for a
        # 124M model), under the server's lock, while every other upload waits
        self._sum: dict[str, np.ndarray] | None = None
        self._sum_flat: np.ndarray | None = None
        self.reference_norm: float | None = None  # "mean": the median norm of the last full round
        self.reset()

    @property
    def streaming(self) -> bool:
        return self.rule == "mean"

    def reset(self) -> None:
        """Forget all contributions (start of a new round). The streamed mean's adaptive bound
        carries over: the median norm of the round just ended, if it had enough contributions."""
        if getattr(self, "count", 0) >= self.min_contributions:
            self.reference_norm = float(np.median(self.norms))
        for values, _ in getattr(self, "_kept", []):
            if isinstance(values, SpooledVector):
                values.close()  # its disk space back now, not when the garbage collector gets to it
        if getattr(self, "_ram_used", 0) and self.budget is not None:
            self.budget.release(self._ram_used)
        self.count = 0
        self.total_weight = 0.0
        self.norms: list[float] = []  # each contribution's norm before clipping, for logging
        self.clip_bound: float | None = None  # the bound the last result() (or add, streamed) applied
        self._sum_fresh = True  # the running sums (streaming) hold nothing of this round yet
        self._kept: list[tuple[Flat, float]] = []  # (update as one flat float32 vector, weight) (robust rules)
        self._ram_used = 0  # bytes of the budget this round's contributions hold (prepared ones included)
        self.left_out: list[int] = []  # filtered_mean: indices (in order of add) left out by the last result()

    def keep_sum_in(self, flat: np.ndarray) -> None:
        """Streamed mean: keep this round's running sums in `flat`, a writable contiguous float32
        array of all the tensors in order (the coordinator passes the next round's weights buffer,
        which `result(out=flat)` then turns into the mean in place, and the outer step into the new
        weights: no copy of the model of the aggregator's own). Only before the round's first add."""
        if not self.streaming:
            return
        size = sum(math.prod(shape) for shape in self.shapes.values())
        if not (flat.dtype == self.dtype == np.float32 and flat.shape == (size,) and flat.flags.writeable
                and flat.flags.c_contiguous):
            raise ValueError(f"the running sums need a writable flat float32 array of {size} elements, "
                             f"got {flat.dtype} {flat.shape}")
        if self._sum_flat is not None and flat.ctypes.data == self._sum_flat.ctypes.data:
            return  # there already
        if not self._sum_fresh:
            raise ValueError("the running sums already hold this round's contributions; move them before the first add")
        self._sum_flat, self._sum = flat, self._unflatten(flat)

    def add(self, update: Weights, weight: float = 1.0) -> float:
        """Count one contribution with the given weight (tokens processed). Returns its global
        L2 norm before clipping. Raises ValueError (state unchanged) on wrong names or shapes,
        non-finite values, or a weight that is not a positive finite number."""
        return self.add_prepared(self.prepare(update), weight)

    def prepare(self, update: Weights, given: bool = False) -> PreparedUpdate:
        """The checks and the copy `add` makes, without touching the aggregator: a server runs
        this for each upload in its own thread, beside the others, and only `add_prepared` under
        its lock. Raises ValueError on wrong names or shapes or non-finite values. `given`: the
        arrays are the aggregator's to keep (views of an upload's body that nothing changes), so
        where they lie back to back in one buffer, in the model's order, the robust rules keep
        them there rather than copy them (in RAM, within the budget)."""
        check_same_tensors(self.shapes, update, "update")
        norm = global_norm(update)  # also the finiteness check: any NaN/inf makes the norm non-finite
        if not math.isfinite(norm):
            raise ValueError("update has NaN/inf values (or overflows float64 norm); the replica diverged, refusing it")
        return PreparedUpdate(update if self.streaming else self._flatten(update, given), norm)

    def add_prepared(self, prepared: PreparedUpdate, weight: float = 1.0) -> float:
        """Count a contribution `prepare` checked (see `add`)."""
        if not (isinstance(weight, (int, float, np.integer, np.floating)) and math.isfinite(weight) and weight > 0):
            raise ValueError(f"weight must be a positive finite number (tokens processed), got {weight!r}")
        norm = prepared.norm
        if self.streaming:
            bound = self._bound(self.reference_norm)
            self.clip_bound = bound
            clip = bound / norm if bound is not None and norm > bound else None
            if self._sum is None:
                self._sum_flat = np.empty(sum(math.prod(shape) for shape in self.shapes.values()), self.dtype)
                self._sum = self._unflatten(self._sum_flat)
            self._accumulate(prepared.values, weight, clip)
            if isinstance(prepared.values, SpooledVector):
                prepared.values.close()  # counted: its disk space back now
        else:
            self._kept.append((prepared.values, float(weight)))
        self.count += 1
        self.total_weight += float(weight)
        self.norms.append(norm)
        return norm

    def _bound(self, median_norm: float | None) -> float | None:
        """min(max_norm, clip_factor x median_norm), either part absent when not given."""
        bounds = [b for b in (self.max_norm, None if self.clip_factor is None or median_norm is None
                                               else self.clip_factor * median_norm) if b is not None]
        return min(bounds) if bounds else None

    def _accumulate(self, update: Weights | SpooledVector, weight: float, clip: float | None) -> None:
        """running sum += weight * (update, times `clip` if given), one cache-sized chunk at a
        time through a small scratch buffer: the same float operations, in the same order, as
        `total += np.float32(update * clip) * weight`, without temporaries the size of a tensor.
        `update`: the tensors, or a spooled upload's flat vector (read a chunk at a time)."""
        scratch = np.empty(_CHUNK, dtype=self.dtype)
        read = np.empty(_CHUNK, dtype=np.float32) if isinstance(update, SpooledVector) else None
        weight = self.dtype.type(weight)
        offset = 0
        for name, total in self._sum.items():
            target = total.reshape(-1)  # a view: the running sums are contiguous
            source = None if read is not None else np.asarray(update[name]).reshape(-1)  # a view if contiguous
            for start in range(0, target.size, _CHUNK):
                stop = min(start + _CHUNK, target.size)
                part = scratch[: stop - start]
                values = source[start:stop] if read is None else update.read_into(offset + start, read[: stop - start])
                if clip is None:
                    np.multiply(values, weight, out=part, dtype=self.dtype)
                else:
                    np.multiply(values, np.float32(clip), out=part, dtype=np.float32)
                    np.multiply(part, weight, out=part)
                if self._sum_fresh:  # the round's first: 0 + part, written over last round's sums
                    target[start:stop] = part
                else:
                    np.add(target[start:stop], part, out=target[start:stop])
            offset += target.size
        self._sum_fresh = False

    def result(self, out: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """The aggregated pseudo-gradient (float32 arrays). With `out`, a flat float32 array of
        all the tensors in order, it is computed there and the arrays returned are views of it
        (the coordinator passes the next round's weights buffer, which the outer step then
        overwrites in place: no separate copy of the model). Raises ValueError if nothing was added."""
        if self.count == 0:
            raise ValueError("no contributions were added this round; nothing to aggregate (skip the outer step)")
        size = sum(math.prod(shape) for shape in self.shapes.values())
        if out is not None and not (out.dtype == np.float32 and out.shape == (size,) and out.flags.writeable):
            raise ValueError(f"out must be a writable flat float32 array of {size} elements, got {out.dtype} {out.shape}")
        if self.streaming:
            assert self._sum is not None
            views = self._unflatten(np.empty(size, np.float32) if out is None else out)  # out may be the sums
            parallel_map(lambda name: np.divide(self._sum[name], self.total_weight, out=views[name],
                                                casting="same_kind"), list(views), size)
            if out is not None and out.ctypes.data == self._sum_flat.ctypes.data:
                self._sum = self._sum_flat = None  # the caller's now: the next round's sums go elsewhere
            return views
        return self._robust_result(out)

    def _flatten(self, update: Weights, given: bool = False) -> Flat:
        """The update's tensors, in the model's order, as one float32 vector (a copy, unless they are
        `given` and lie so already), in memory or in the spool. The coordinate-wise rules then run
        over chunks of it in parallel threads, whatever the tensors' sizes."""
        size = sum(math.prod(shape) for shape in self.shapes.values())
        if self.spool is not None:
            in_ram = self.budget is not None and self.budget.reserve(4 * size)
            if not in_ram:
                return self.spool.write(np.asarray(update[name]) for name in self.shapes)
            with self._lock:
                self._ram_used += 4 * size
        flat = flat_view([np.asarray(update[name]) for name in self.shapes]) if given else None
        if flat is not None and flat.dtype == np.float32 and flat.flags.aligned:
            return flat  # where it lies: its buffer (an upload's body) now lives as long as the round keeps it
        flat = np.empty(size, dtype=np.float32)
        copy_all(self._unflatten(flat).values(), (np.asarray(update[name]) for name in self.shapes))  # every core
        return flat

    def _unflatten(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """Views of a flat vector as the model's tensors."""
        out, offset = {}, 0
        for name, shape in self.shapes.items():
            size = math.prod(shape)
            out[name] = flat[offset : offset + size].reshape(shape)
            offset += size
        return out

    def _robust_result(self, out: np.ndarray | None) -> dict[str, np.ndarray]:
        n = len(self._kept)
        robust = n >= self.min_contributions
        bound = self._bound(float(np.median(self.norms))) if robust else self.max_norm
        self.clip_bound = bound
        scales = np.array([1.0 if bound is None or norm <= bound else bound / norm for norm in self.norms], np.float32)
        weights = np.array([w for _, w in self._kept], dtype=np.float64)  # (N,)
        if robust and self.rule == "centered_clip":
            whole = [u if isinstance(u, np.ndarray) else u.load() for u, _ in self._kept]  # (it needs whole vectors)
            clipped = [self._unflatten(u * s if s != 1 else u) for u, s in zip(whole, scales)]
            start = robust_ops.over_chunks(lambda stack: robust_ops.weighted_median(stack, weights),
                                           [u for u, _ in self._kept], scales)
            centre = robust_ops.centered_clip(clipped, weights, self._unflatten(start))
            views = self._unflatten(np.empty(start.size, np.float32) if out is None else out)
            for name, view in views.items():
                view[...] = centre[name]
            return views
        if robust and self.rule == "filtered_mean":
            return self._unflatten(self._filtered_mean(scales, weights, out))
        cut = int(math.floor(self.trim_fraction * n))
        if not robust:
            rule = lambda stack: robust_ops.weighted_mean(stack, weights)  # noqa: E731
        elif self.rule == "median":
            rule = lambda stack: robust_ops.weighted_median(stack, weights)  # noqa: E731
        else:
            rule = lambda stack: robust_ops.trimmed_mean(stack, weights, cut)  # noqa: E731
        return self._unflatten(robust_ops.over_chunks(rule, [u for u, _ in self._kept], scales, out=out))

    def _filtered_mean(self, scales: np.ndarray, weights: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        """The cosine of each clipped contribution to the coordinate-wise median, then the weighted
        mean of those that agree (coop.robust.agreeing). The median is the unweighted one: a member
        that claims many tokens cannot pull the reference its way (its weight counts only in the
        mean, once it agrees). The median, the dot products and the mean run over chunks of coordinates
        on every core (coop.robust.median_dots). With the native kernels the mean of everyone is made
        in the same pass, so when nobody is left out (the common case) every contribution is read
        once (from disk, for a spooled one); only when someone is, a second pass sums the others."""
        n = len(self._kept)
        flats = [u for u, _ in self._kept]

        def coefficients(kept: np.ndarray) -> np.ndarray:  # the clipped contributions' share of the mean
            return scales[kept].astype(np.float64) * weights[kept] / weights[kept].sum()

        sums, mean_of_all = robust_ops.median_dots(flats, scales, coefficients(np.arange(n)), out)
        dots, reference_norm2 = sums[:n], float(sums[n])
        norms2 = (scales.astype(np.float64) * np.array(self.norms)) ** 2
        cosines = dots / np.sqrt(np.maximum(norms2 * reference_norm2, 1e-300))
        kept = robust_ops.agreeing(cosines, AGREEMENT_FRACTION)
        self.left_out = sorted(set(range(n)) - set(kept.tolist()))
        if mean_of_all is not None and not self.left_out:
            return mean_of_all  # the same bits as the pass below: the same sum, in the same order
        return robust_ops.weighted_sum([flats[i] for i in kept], coefficients(kept),
                                       out=mean_of_all if out is None else out)


def aggregate(
    updates: Iterable[Weights],
    weights: Iterable[float] | None = None,
    *,
    rule: str = DEFAULT_RULE,
    trim_fraction: float = DEFAULT_TRIM_FRACTION,
    clip_factor: float | None = DEFAULT_CLIP_FACTOR,
    max_norm: float | None = None,
    min_contributions: int = DEFAULT_MIN_CONTRIBUTIONS,
) -> dict[str, np.ndarray]:
    """Aggregate a list of updates at once (the simulation's and the gossip merge's convenience
    over `Aggregator`), robust by default as the Aggregator is; rule="mean" for the plain mean."""
    updates = list(updates)
    if not updates:
        raise ValueError("aggregate() needs at least one update")
    weights = [1.0] * len(updates) if weights is None else list(weights)
    if len(weights) != len(updates):
        raise ValueError(f"got {len(updates)} updates but {len(weights)} weights")
    aggregator = Aggregator(shapes_of(updates[0]), rule=rule, trim_fraction=trim_fraction, clip_factor=clip_factor,
                            max_norm=max_norm, min_contributions=min_contributions)
    for update, weight in zip(updates, weights):
        aggregator.add(update, weight)
    return aggregator.result()
