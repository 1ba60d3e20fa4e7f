"""The gossip merge: who exchanges with whom each round, and what each peer averages.

Pure functions on numpy dicts, shared by `coop simulate --topology gossip` and the real peers
(`coop.gossip.peer`), so that a result found in simulation carries over to a swarm.

The rule, one round r among n replicas (peers):

1. **Groups.** The replicas active in round r are put in a fixed order (index order in the
   simulation; peers sorted by peer id in a swarm) and cut into random *disjoint* groups:
   ``perm = rng.permutation(n)``, then consecutive chunks of ``group_size`` of ``perm``. A last
   chunk of one replica is folded into the chunk before it (nobody is left alone when n > 1), so
   groups have ``group_size`` members, or ``group_size + 1`` for the last one. In a swarm the rng
   is ``round_rng(swarm_seed, r)``: every peer with the same member view computes the same groups
   without talking to anyone.
2. **Pseudo-gradients.** Each replica's averaged pseudo-gradient is the token-weighted mean of the
   pseudo-gradients of its group (its own included): ``sum_k w_k delta_k / sum_k w_k``.
3. **Global weights (mixing).** Averaging pseudo-gradients alone does not pull the replicas'
   copies of the global weights together: two groups apply different averages and the copies
   random-walk apart. So each replica's copy of the global weights is also replaced by the plain
   mean of its group's copies (``mix_global_weights``) before the outer step. Replicas of one
   group then start the outer step from the same weights (their momentum buffers are their own,
   so they differ again after it); consensus spreads across groups because the groups are
   redrawn every round (with 4 replicas in pairs, the same pairing can repeat for several rounds:
   see docs/results.md). Peers do this when the swarm config says ``mix_weights = true`` (the
   default); pass ``global_weights`` to `gossip_round` to simulate it.
4. **Outer step.** Each replica applies its own `NesterovSGD` (its own momentum buffer) to its own
   copy of the global weights with its averaged pseudo-gradient.

With ``group_size >= n`` everyone is in one group: that is exactly the star (coordinator) merge.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from coop.diloco import aggregate
from coop.outer import NesterovSGD

Weights = Mapping[str, np.ndarray]


def round_rng(swarm_seed: int, round_index: int) -> np.random.Generator:
    """The rng that draws round `round_index`'s groups in a swarm: the same on every peer."""
    return np.random.default_rng([int(swarm_seed), int(round_index)])


def gossip_groups(n: int, group_size: int, rng: np.random.Generator) -> list[list[int]]:
    """Random disjoint groups of indices 0..n-1 (rule 1 above). Consumes one `rng.permutation(n)`."""
    if n < 1:
        raise ValueError(f"need at least one replica, got n={n}")
    if group_size < 2:
        raise ValueError(f"group_size must be >= 2 (a peer and at least one partner), got {group_size}")
    perm = [int(i) for i in rng.permutation(n)]
    groups = [perm[start : start + group_size] for start in range(0, n, group_size)]
    if len(groups) > 1 and len(groups[-1]) == 1:
        groups[-2].extend(groups.pop())
    return groups


def group_of(groups: Sequence[Sequence[int]], index: int) -> list[int]:
    """The group (list of indices) that `index` belongs to."""
    for group in groups:
        if index in group:
            return list(group)
    raise ValueError(f"replica {index} is in no group")


def partners_of(members: Sequence[str], me: str, group_size: int, rng: np.random.Generator) -> list[str]:
    """A peer's partners for one round: the other members of its group when `members` (peer ids,
    any order; sorted here) are grouped by `gossip_groups`. Empty when `me` is not a member."""
    ordered = sorted(members)
    if me not in ordered:
        return []
    if len(ordered) == 1:
        return []
    groups = gossip_groups(len(ordered), group_size, rng)
    return [ordered[i] for i in group_of(groups, ordered.index(me)) if ordered[i] != me]


def mix_global_weights(global_weights: list[dict[str, np.ndarray]], groups: Sequence[Sequence[int]]) -> None:
    """Rule 3: replace each replica's global weights, in place, by the plain mean over its group."""
    for group in groups:
        if len(group) < 2:
            continue
        mean = {name: np.mean([global_weights[i][name] for i in group], axis=0, dtype=np.float64).astype(np.float32)
                for name in global_weights[group[0]]}
        for i in group:
            for name, array in global_weights[i].items():
                array[...] = mean[name]


def gossip_round(
    pseudo_grads: list[dict[str, np.ndarray]],
    weights: list[float],
    group_size: int,
    rng: np.random.Generator,
    global_weights: list[dict[str, np.ndarray]] | None = None,
) -> list[dict[str, np.ndarray]]:
    """One gossip merge among len(pseudo_grads) replicas: for each replica, the weighted mean
    (weights = tokens processed) of the pseudo-gradients of its group (rule 2), in index order.

    With `global_weights` (one dict of writable float32 arrays per replica) the replicas' copies of
    the global weights are also mixed in place within each group (rule 3), as real peers do with
    ``mix_weights = true``. The caller then takes one outer step per replica (rule 4).
    """
    n = len(pseudo_grads)
    if len(weights) != n:
        raise ValueError(f"got {n} pseudo-gradients but {len(weights)} weights")
    if global_weights is not None and len(global_weights) != n:
        raise ValueError(f"got {n} pseudo-gradients but {len(global_weights)} global weight copies")
    groups = gossip_groups(n, group_size, rng) if n > 1 else [[0]]
    averaged: list[dict[str, np.ndarray] | None] = [None] * n
    for group in groups:
        mean = aggregate([pseudo_grads[i] for i in group], [weights[i] for i in group])
        for i in group:
            # each replica gets its own copy: callers may modify them independently
            averaged[i] = {name: array.copy() for name, array in mean.items()}
    if global_weights is not None:
        mix_global_weights(global_weights, groups)
    return averaged  # type: ignore[return-value]


def merge_group(
    own_update: Weights,
    own_tokens: float,
    own_weights: Weights,
    others: Sequence[tuple[Weights, float, Weights | None]],
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], float | None]:
    """One peer's merge with the updates its group sent it (rules 2 and 3), before its outer step.

    `others` holds (pseudo-gradient, tokens, their global weights or None) per partner. Returns
    (the token-weighted mean pseudo-gradient, the peer's new copy of the global weights: the
    mean of the group's copies where partners sent theirs, else its own copied, and the group's
    consensus distance, or None when no partner sent its weights)."""
    averaged = aggregate([own_update] + [u for u, _, _ in others], [own_tokens] + [t for _, t, _ in others])
    new_weights = {name: np.array(a, dtype=np.float32) for name, a in own_weights.items()}
    copies = [w for _, _, w in others if w is not None]
    if not copies:
        return averaged, new_weights, None
    group = [own_weights] + copies
    for name, array in new_weights.items():
        array[...] = np.mean([w[name] for w in group], axis=0, dtype=np.float64)
    return averaged, new_weights, consensus_distance(group)


def _finite(weights: Weights) -> bool:
    return all(np.isfinite(array).all() for array in weights.values())


def _usable(update: Weights, tokens: float, weights: Weights | None) -> str | None:
    """Why a partner's contribution cannot be averaged on its own, or None when it can."""
    if not (isinstance(tokens, (int, float)) and math.isfinite(tokens) and tokens > 0):
        return f"its token count {tokens!r:.40} is not a positive number"
    if not _finite(update):
        return "its pseudo-gradient has NaN/inf values"
    if weights is not None and not _finite(weights):
        return "its global weights have NaN/inf values"
    return None


def _merged(own_update: Weights, own_tokens: float, own_weights: Weights,
            others: Sequence[tuple[Weights, float, Weights | None]]):
    """merge_group, or None when its result is not finite (an overflow only the mean shows)."""
    try:
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is found below, and logged by the caller
            averaged, new_weights, cd = merge_group(own_update, own_tokens, own_weights, others)
    except (ValueError, FloatingPointError):
        return None
    if not (_finite(averaged) and _finite(new_weights)):
        return None
    return averaged, new_weights, cd


def merge_and_step(
    outer: NesterovSGD,
    own_update: Weights,
    own_tokens: float,
    own_weights: Weights,
    others: Sequence[tuple[Weights, float, Weights | None]],
    names: Sequence[str],
    log: Callable[[str], None],
) -> tuple[dict[str, np.ndarray], float | None, list[int]]:
    """A peer's whole merge: `merge_group`, then its outer step. Nothing a partner sent can make it
    fail or lose the round: a contribution that is not finite, or that makes the group's mean
    non-finite, is dropped (one `log` line each, `names[i]` saying whose) and the merge happens
    with the rest; with none left, with the peer's own update alone; should even the outer step
    fail, the peer keeps its weights for this round. Every receiver checked the updates already
    (`coop.contribution`): this is the last line, for what only the merge shows.

    Returns (the new copy of the global weights, the group's consensus distance or None, the
    indices in `others` that were averaged in). `own_weights` is never modified."""
    kept = []
    for i, (update, tokens, weights) in enumerate(others):
        reason = _usable(update, tokens, weights)
        if reason is None:
            kept.append(i)
        else:
            log(f"dropped the update of {names[i]} from the merge: {reason}")
    while True:
        merged = _merged(own_update, own_tokens, own_weights, [others[i] for i in kept])
        if merged is not None or not kept:
            break
        # who breaks it: each contribution merged with our own alone; if none does alone, all go
        bad = [i for i in kept if _merged(own_update, own_tokens, own_weights, [others[i]]) is None] or list(kept)
        for i in bad:
            log(f"dropped the update of {names[i]} from the merge: the group's mean with it is not finite")
        kept = [i for i in kept if i not in bad]
    unchanged = {name: np.array(a, dtype=np.float32) for name, a in own_weights.items()}
    if merged is None:
        log("the merge is not finite even with our own update alone; keeping our weights for this round")
        return unchanged, None, []
    averaged, new_weights, cd = merged
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            outer.step(new_weights, averaged)
    except ValueError as error:
        log(f"outer step refused ({error}); keeping our weights for this round")
        return unchanged, cd, kept
    if not _finite(new_weights):  # an overflow in the step itself: undo it, forget the spoilt momentum
        for name in [n for n, b in outer.momentum_buffer.items() if not np.isfinite(b).all()]:
            del outer.momentum_buffer[name]
        log("the outer step overflowed; keeping our weights for this round")
        return unchanged, cd, kept
    return new_weights, cd, kept


def consensus_distance(global_weights_list: Sequence[Weights]) -> float:
    """How far the replicas' copies of the global weights are from their mean:
    sqrt(mean_i ||theta_i - mean_j theta_j||^2), over all tensors (float64). 0 when they agree."""
    n = len(global_weights_list)
    if n == 0:
        raise ValueError("consensus_distance needs at least one set of weights")
    total = 0.0
    for name in global_weights_list[0]:
        stack = np.stack([np.asarray(w[name], dtype=np.float64) for w in global_weights_list])  # (n, ...)
        total += float(((stack - stack.mean(axis=0)) ** 2).sum())
    return math.sqrt(total / n)


def distance(a: Weights, b: Weights) -> float:
    """||a - b|| over all tensors (float64): what a peer reports against one partner's weights."""
    total = 0.0
    for name, array in a.items():
        diff = np.asarray(array, dtype=np.float64) - np.asarray(b[name], dtype=np.float64)
        total += float(np.dot(diff.reshape(-1), diff.reshape(-1)))
    return math.sqrt(total)


def exchange_bytes_per_replica(update_bytes: int, weight_bytes: int, group_size: int, mix_weights: bool = True) -> int:
    """Bytes one replica sends in one round: one message to each of its group_size - 1 partners,
    each carrying the encoded pseudo-gradient (and the fp32 global weights when mixing)."""
    return (group_size - 1) * (update_bytes + (weight_bytes if mix_weights else 0))
