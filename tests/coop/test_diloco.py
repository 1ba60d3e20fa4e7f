"""coop.diloco: pseudo-gradients, aggregation (streaming, clipped, trimmed), the outer optimizer."""

import numpy as np
import pytest

from coop.diloco import (
    Aggregator,
    aggregate,
    clip_by_global_norm,
    global_norm,
    pseudo_gradient,
    shapes_of,
)
from coop.outer import NesterovSGD, plain_averaging
from coop.wire import pack, unpack

SHAPES = {"wte.weight": (11, 4), "h.0.mlp.c_fc.bias": (16,), "scalar": ()}


def random_weights(seed: int, scale: float = 1.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: np.asarray(rng.standard_normal(shape) * scale, dtype=np.float32) for name, shape in SHAPES.items()}


def copy(weights):
    return {name: array.copy() for name, array in weights.items()}


# -- pseudo-gradients ----------------------------------------------------------------------------


def test_pseudo_gradient_is_global_minus_local_in_float32():
    global_weights, local = random_weights(0), random_weights(1)
    delta = pseudo_gradient(global_weights, local)
    for name in SHAPES:
        assert isinstance(delta[name], np.ndarray) and delta[name].dtype == np.float32
        assert delta[name].shape == SHAPES[name]
        np.testing.assert_array_equal(delta[name], global_weights[name] - local[name])


def test_pseudo_gradient_refuses_mismatched_tensors():
    global_weights = random_weights(0)
    local = random_weights(1)
    del local["scalar"]
    with pytest.raises(ValueError, match=r"missing \['scalar'\]"):
        pseudo_gradient(global_weights, local)
    local = random_weights(1)
    local["wte.weight"] = local["wte.weight"].T
    with pytest.raises(ValueError, match=r"shape \(4, 11\), expected \(11, 4\)"):
        pseudo_gradient(global_weights, local)


# -- aggregation ---------------------------------------------------------------------------------


def test_streaming_mean_is_weighted_by_tokens():
    updates = [random_weights(seed) for seed in range(5)]
    tokens = [1000, 3000, 500, 500, 2048]
    aggregator = Aggregator(SHAPES, rule="mean")  # the plain (streamed) mean; the default is robust
    for update, weight in zip(updates, tokens):
        aggregator.add(update, weight)
    result = aggregator.result()
    assert aggregator.count == 5 and aggregator.total_weight == sum(tokens)
    for name in SHAPES:
        expected = np.average(np.stack([u[name] for u in updates]).astype(np.float64), axis=0, weights=tokens)
        assert result[name].dtype == np.float32 and result[name].shape == SHAPES[name]
        np.testing.assert_allclose(result[name], expected, rtol=1e-5, atol=1e-6)


def test_streaming_mode_keeps_no_contribution():
    # O(model) memory: after add() the aggregator holds no reference to the update's arrays
    update = random_weights(0)
    aggregator = Aggregator(SHAPES, rule="mean")  # the streamed mode (the robust rules keep copies)
    aggregator.add(update, 1.0)
    before = aggregator.result()
    for array in update.values():
        array += 100.0
    after = aggregator.result()
    for name in SHAPES:
        np.testing.assert_array_equal(before[name], after[name])


def test_the_streamed_sums_kept_in_the_caller_s_buffer_give_the_same_mean_there(tmp_path):
    """keep_sum_in: the running sums in a buffer of the caller's (the coordinator's next weights),
    the mean computed there in place, bit for bit what the aggregator's own sums give; the buffer
    is then the caller's, and the next round's sums go into the next buffer given. A spooled
    vector (an fp32 upload left in its spool file) adds up to the same bits as the tensors."""
    from coop.diloco import PreparedUpdate
    from coop.spool import Spool

    size = sum(int(np.prod(s)) for s in SHAPES.values())
    rounds = [[random_weights(10 * r + i) for i in range(3)] for r in range(2)]
    own, caller = Aggregator(SHAPES, rule="mean"), Aggregator(SHAPES, rule="mean")
    spool = Spool(tmp_path)
    for updates in rounds:
        expected = {k: v.copy() for k, v in _mean_of(own, updates).items()}
        buffer = np.full(size, np.nan, np.float32)
        caller.keep_sum_in(buffer)
        for i, update in enumerate(updates):  # the middle one from the spool, as a spooled upload is added
            if i == 1:
                vector = spool.write(update[name] for name in SHAPES)
                caller.add_prepared(PreparedUpdate(vector, caller.prepare(update).norm), 1.0 + i)
            else:
                caller.add(update, 1.0 + i)
        with pytest.raises(ValueError, match="already hold this round"):
            caller.keep_sum_in(np.zeros(size, np.float32))
        result = caller.result(out=buffer)
        for name in SHAPES:
            np.testing.assert_array_equal(result[name], expected[name])
            assert np.shares_memory(result[name], buffer)
        caller.reset()
    with pytest.raises(ValueError, match="writable flat float32 array"):
        caller.keep_sum_in(np.zeros(size, np.float64))


@pytest.mark.parametrize("rule", ["filtered_mean", "trimmed_mean"])
def test_an_update_given_in_one_body_is_kept_where_it_lies_with_the_same_result(rule):
    """prepare(given=True) on the views of an upload's body: the robust rules keep the body's data
    as the contribution (no copy of the model per upload) and give the same bits as from copies;
    arrays of their own, or not in the model's order, are copied as before."""
    from coop.wire import pack_view, unpack

    updates = [random_weights(20 + i) for i in range(4)]
    results = []
    for given in (False, True):
        aggregator = Aggregator(SHAPES, rule=rule)
        for i, update in enumerate(updates):
            body = bytearray(pack_view(update, {"round": 0}))  # as a worker packs it
            views, _ = unpack(body, copy=False)
            prepared = aggregator.prepare(views, given=given)
            assert np.shares_memory(prepared.values, np.frombuffer(body, np.uint8)) == given
            aggregator.add_prepared(prepared, 1.0 + i)
        results.append(aggregator.result())
    for name in SHAPES:
        np.testing.assert_array_equal(results[1][name], results[0][name])
    aggregator = Aggregator(SHAPES, rule=rule)
    own = aggregator.prepare(updates[0], given=True)  # separate arrays: one vector of its own
    assert not any(np.shares_memory(own.values, a) for a in updates[0].values())
    reordered, _ = unpack(bytearray(pack_view(dict(reversed(list(updates[0].items()))), {})), copy=False)
    assert not np.shares_memory(aggregator.prepare(reordered, given=True).values, next(iter(reordered.values())))


def _mean_of(aggregator, updates):
    for i, update in enumerate(updates):
        aggregator.add(update, 1.0 + i)
    result = aggregator.result()
    aggregator.reset()
    return result


def test_refused_update_leaves_the_aggregator_unchanged():
    aggregator = Aggregator(SHAPES)
    aggregator.add(random_weights(0), 2.0)
    before = aggregator.result()
    bad = random_weights(1)
    bad["h.0.mlp.c_fc.bias"][3] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        aggregator.add(bad, 1.0)
    wrong = random_weights(1)
    wrong["extra"] = np.zeros(2, np.float32)
    with pytest.raises(ValueError, match="unexpected"):
        aggregator.add(wrong, 1.0)
    for weight in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="weight"):
            aggregator.add(random_weights(1), weight)
    assert aggregator.count == 1 and aggregator.total_weight == 2.0
    for name, array in aggregator.result().items():
        np.testing.assert_array_equal(array, before[name])


def test_result_without_contributions_is_an_error_and_reset_starts_a_new_round():
    aggregator = Aggregator(SHAPES)
    with pytest.raises(ValueError, match="no contributions"):
        aggregator.result()
    aggregator.add(random_weights(0), 1.0)
    aggregator.reset()
    assert aggregator.count == 0
    with pytest.raises(ValueError, match="no contributions"):
        aggregator.result()


def test_norm_clipping_bounds_each_contribution():
    small, huge = random_weights(0, scale=0.01), random_weights(1, scale=1000.0)
    max_norm = 1.0
    aggregator = Aggregator(SHAPES, max_norm=max_norm)
    assert aggregator.add(small, 1.0) == pytest.approx(global_norm(small))
    assert aggregator.add(huge, 1.0) == pytest.approx(global_norm(huge))
    clipped, norm = clip_by_global_norm(huge, max_norm)
    assert norm == pytest.approx(global_norm(huge))
    assert global_norm(clipped) == pytest.approx(max_norm, rel=1e-5)
    result = aggregator.result()
    for name in SHAPES:
        np.testing.assert_allclose(result[name], (small[name] + clipped[name]) / 2, rtol=1e-5, atol=1e-7)
    # the huge update moved the mean by at most max_norm * its weight share
    assert global_norm({n: result[n] - small[n] / 2 for n in SHAPES}) <= max_norm / 2 * (1 + 1e-5)


def test_clip_leaves_small_updates_alone():
    update = random_weights(0, scale=0.01)
    clipped, norm = clip_by_global_norm(update, 1e6)
    for name in SHAPES:
        np.testing.assert_array_equal(clipped[name], update[name])


def test_trimmed_mean_drops_extremes_per_coordinate():
    rng = np.random.default_rng(0)
    honest = [{"w": rng.normal(1.0, 0.1, 50).astype(np.float32)} for _ in range(8)]
    attacker = {"w": np.full(50, 1e6, np.float32)}
    attacker["w"][::2] = -1e6  # extreme on both sides, coordinate by coordinate
    updates = honest + [attacker]
    robust = aggregate(updates, rule="trimmed_mean", trim_fraction=0.2)  # floor(0.2 * 9) = 1 dropped at each end
    naive = aggregate(updates, rule="mean")
    assert np.abs(robust["w"] - 1.0).max() < 0.5
    assert np.abs(naive["w"]).max() > 1e4
    # matches a direct computation: sort each column, drop one at each end, average the rest
    stack = np.sort(np.stack([u["w"] for u in updates]).astype(np.float64), axis=0)[1:-1]
    np.testing.assert_allclose(robust["w"], stack.mean(axis=0), rtol=1e-6)


def test_trimmed_mean_uses_the_survivors_weights():
    updates = [{"w": np.array([v], np.float32)} for v in (0.0, 1.0, 2.0, 3.0, 100.0)]
    weights = [1.0, 1.0, 3.0, 1.0, 1.0]
    result = aggregate(updates, weights, rule="trimmed_mean", trim_fraction=0.2)  # drops 0.0 and 100.0
    assert result["w"][0] == pytest.approx((1.0 + 3 * 2.0 + 3.0) / 5)


def test_trimmed_mean_with_too_few_contributions_is_the_plain_mean():
    updates = [random_weights(seed) for seed in range(3)]
    trimmed = aggregate(updates, [1, 2, 3], rule="trimmed_mean", trim_fraction=0.3)  # floor(0.9) = 0: nothing trimmed
    plain = aggregate(updates, [1, 2, 3], rule="mean")
    for name in SHAPES:
        np.testing.assert_allclose(trimmed[name], plain[name], rtol=1e-6, atol=1e-7)


def test_aggregator_options_are_checked():
    with pytest.raises(ValueError, match="trim_fraction"):
        Aggregator(SHAPES, trim_fraction=0.5)
    with pytest.raises(ValueError, match="max_norm"):
        Aggregator(SHAPES, max_norm=0.0)
    with pytest.raises(ValueError, match="weights"):
        aggregate([random_weights(0)], [1.0, 2.0])


# -- outer optimizer -----------------------------------------------------------------------------


def reference_sgd(weights, grads_per_step, lr, momentum, nesterov):
    """torch.optim.SGD's update written out in float64."""
    w = {n: a.astype(np.float64) for n, a in weights.items()}
    buffers = {}
    for grads in grads_per_step:
        for name in w:
            g = grads[name].astype(np.float64)
            buffers[name] = g.copy() if name not in buffers else momentum * buffers[name] + g
            d = g + momentum * buffers[name] if nesterov else buffers[name]
            w[name] = w[name] - lr * d
    return w


@pytest.mark.parametrize("lr, momentum, nesterov", [(0.7, 0.9, True), (0.5, 0.8, False), (1.0, 0.0, False)])
def test_outer_step_matches_the_sgd_formula(lr, momentum, nesterov):
    weights = random_weights(0)
    grads = [random_weights(seed, scale=0.1) for seed in range(1, 6)]
    optimizer = NesterovSGD(lr=lr, momentum=momentum, nesterov=nesterov)
    state = copy(weights)
    for g in grads:
        optimizer.step(state, g)
    expected = reference_sgd(weights, grads, lr, momentum, nesterov)
    for name in SHAPES:
        assert state[name].dtype == np.float32 and state[name].shape == SHAPES[name]
        np.testing.assert_allclose(state[name], expected[name], rtol=1e-5, atol=1e-6)


def test_outer_step_matches_torch_where_available():
    torch = pytest.importorskip("torch")
    weights = random_weights(0)
    grads = [random_weights(seed, scale=0.1) for seed in range(1, 6)]
    params = [torch.nn.Parameter(torch.from_numpy(weights[n].copy())) for n in SHAPES]
    reference = torch.optim.SGD(params, lr=0.7, momentum=0.9, nesterov=True)
    ours = NesterovSGD()
    state = copy(weights)
    for g in grads:
        for p, name in zip(params, SHAPES):
            p.grad = torch.from_numpy(g[name].copy())
        reference.step()
        ours.step(state, g)
    for p, name in zip(params, SHAPES):
        np.testing.assert_allclose(state[name], p.detach().numpy(), rtol=1e-6, atol=1e-6)


def test_diloco_defaults_and_plain_averaging():
    optimizer = NesterovSGD()
    assert (optimizer.lr, optimizer.momentum, optimizer.nesterov) == (0.7, 0.9, True)
    global_weights = random_weights(0)
    locals_ = [random_weights(seed) for seed in range(1, 5)]
    averaged = aggregate([pseudo_gradient(global_weights, local) for local in locals_], rule="mean")
    plain_averaging().step(global_weights, averaged)
    for name in SHAPES:
        np.testing.assert_allclose(global_weights[name], np.mean([l[name] for l in locals_], axis=0), rtol=1e-5, atol=1e-6)


def test_k1_outer_sgd_with_lr1_equals_synchronous_averaged_gradient_sgd():
    """The exact algebra: with one inner SGD step (K=1), outer lr 1 and no momentum, averaging
    pseudo-gradients weighted by tokens is the data-parallel step on the averaged gradient."""
    rng = np.random.default_rng(0)
    dim, inner_lr = 8, 0.05
    true_w = rng.standard_normal(dim)
    tokens = [16, 32, 8, 24]  # per-worker batch sizes: unequal, so the weighting matters

    def gradient(w, x, y):  # mean-squared error of a linear model, mean over the batch
        return (2.0 / len(y)) * x.T @ (x @ w - y)

    diloco = {"w": np.zeros(dim, np.float32)}
    ddp = np.zeros(dim, np.float32)
    outer = plain_averaging()
    for _round in range(10):
        batches = []
        for n in tokens:
            x = rng.standard_normal((n, dim)).astype(np.float32)
            batches.append((x, (x @ true_w).astype(np.float32)))
        # DiLoCo: each worker takes one SGD step from the global weights, then the outer step
        aggregator = Aggregator(shapes_of(diloco), rule="mean")  # the plain weighted mean
        for (x, y), n in zip(batches, tokens):
            local = {"w": (diloco["w"] - inner_lr * gradient(diloco["w"], x, y)).astype(np.float32)}
            aggregator.add(pseudo_gradient(diloco, local), weight=n)
        outer.step(diloco, aggregator.result())
        # data parallel: one SGD step on the gradient of all tokens together
        x_all = np.concatenate([x for x, _ in batches])
        y_all = np.concatenate([y for _, y in batches])
        ddp = (ddp - inner_lr * gradient(ddp, x_all, y_all)).astype(np.float32)
        np.testing.assert_allclose(diloco["w"], ddp, rtol=1e-5, atol=1e-6)


def test_warmup_ramps_the_outer_lr_linearly():
    optimizer = NesterovSGD(lr=0.8, momentum=0.0, nesterov=False, warmup_steps=4)
    weights = {"w": np.zeros(1, np.float32)}
    lrs = []
    for _ in range(6):
        lrs.append(optimizer.current_lr())
        optimizer.step(weights, {"w": np.ones(1, np.float32)})
    np.testing.assert_allclose(lrs, [0.2, 0.4, 0.6, 0.8, 0.8, 0.8])
    np.testing.assert_allclose(weights["w"], [-sum(lrs)], rtol=1e-6)


def test_state_dict_round_trip_through_the_wire_continues_identically():
    grads = [random_weights(seed, scale=0.1) for seed in range(1, 7)]
    straight, straight_weights = NesterovSGD(warmup_steps=2), random_weights(0)
    for g in grads:
        straight.step(straight_weights, g)

    first, weights = NesterovSGD(warmup_steps=2), random_weights(0)
    for g in grads[:3]:
        first.step(weights, g)
    state = first.state_dict()
    # persisted without pickle: buffers as safetensors, scalars as JSON metadata
    buffers = state.pop("momentum_buffer")
    tensors, scalars = unpack(pack(buffers, state))
    resumed = NesterovSGD(lr=0.1, momentum=0.5)  # hyper-parameters come from the state
    resumed.load_state_dict({**scalars, "momentum_buffer": tensors})
    assert (resumed.lr, resumed.momentum, resumed.step_count, resumed.warmup_steps) == (0.7, 0.9, 3, 2)
    for g in grads[3:]:
        resumed.step(weights, g)
    for name in SHAPES:
        np.testing.assert_array_equal(weights[name], straight_weights[name])


def test_state_dict_is_a_copy():
    optimizer, weights = NesterovSGD(), random_weights(0)
    optimizer.step(weights, random_weights(1))
    state = optimizer.state_dict()
    state["momentum_buffer"]["scalar"] += 1.0
    assert optimizer.momentum_buffer["scalar"] != state["momentum_buffer"]["scalar"]


def test_load_state_dict_refuses_bad_state():
    optimizer = NesterovSGD()
    good = NesterovSGD().state_dict()
    with pytest.raises(ValueError, match="keys"):
        optimizer.load_state_dict({k: v for k, v in good.items() if k != "lr"})
    with pytest.raises(ValueError, match="finite float32"):
        optimizer.load_state_dict({**good, "momentum_buffer": {"w": np.zeros(2, np.float64)}})
    with pytest.raises(ValueError, match="momentum"):
        optimizer.load_state_dict({**good, "momentum": 1.5})


def test_outer_step_refuses_bad_input_without_touching_the_weights():
    optimizer, weights = NesterovSGD(), random_weights(0)
    before = copy(weights)
    bad = random_weights(1)
    bad["scalar"] = np.array(np.inf, np.float32)
    with pytest.raises(ValueError, match="NaN/inf"):
        optimizer.step(weights, bad)
    missing = random_weights(1)
    del missing["scalar"]
    with pytest.raises(ValueError, match="missing"):
        optimizer.step(weights, missing)
    as_float64 = {name: array.astype(np.float64) for name, array in weights.items()}
    with pytest.raises(TypeError, match="float32"):
        optimizer.step(as_float64, random_weights(1))
    for name in SHAPES:
        np.testing.assert_array_equal(weights[name], before[name])
    assert optimizer.step_count == 0 and optimizer.momentum_buffer == {}


def test_outer_optimizer_options_are_checked():
    with pytest.raises(ValueError, match="momentum"):
        NesterovSGD(momentum=1.0)
    with pytest.raises(ValueError, match="Nesterov"):
        NesterovSGD(momentum=0.0, nesterov=True)
    with pytest.raises(ValueError, match="lr"):
        NesterovSGD(lr=0.0)


def test_the_outer_step_into_out_equals_the_step_in_place_and_leaves_the_weights():
    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal((40, 30)).astype(np.float32), "b": rng.standard_normal(7).astype(np.float32)}
    grads = [{k: rng.standard_normal(v.shape).astype(np.float32) for k, v in weights.items()} for _ in range(3)]
    in_place, stepped = NesterovSGD(), NesterovSGD()
    current = {k: v.copy() for k, v in weights.items()}
    moved = {k: v.copy() for k, v in weights.items()}
    for grad in grads:
        in_place.step(moved, grad)
        out = {k: np.empty_like(v) for k, v in current.items()}
        before = {k: v.copy() for k, v in current.items()}
        stepped.step(current, grad, out=out)
        for k in weights:
            np.testing.assert_array_equal(current[k], before[k])  # untouched
        current = out
    for k in weights:
        np.testing.assert_array_equal(current[k], moved[k])
    with pytest.raises(TypeError, match="output 'w' must be a writable float32"):
        stepped.step(current, grads[0], out={"w": np.empty((40, 30), np.float64), "b": np.empty(7, np.float32)})
    with pytest.raises(ValueError):
        stepped.step(current, grads[0], out={"w": np.empty((40, 30), np.float32)})


def test_an_upload_s_checks_run_in_pieces_with_the_whole_tensors_answers(monkeypatch):
    # the bound, the norm and the copy into the aggregator's flat vector cut large tensors into pieces
    # for the pool's threads (coop.threads.pieces); the answers are those of the whole tensors
    import coop.threads
    from coop.contribution import ContributionError, check_arrays
    from coop.diloco import Aggregator, global_norm
    from coop.wire import spec_of

    monkeypatch.setattr(coop.threads, "PIECE", 1000)
    rng = np.random.default_rng(5)
    update = {"big": rng.standard_normal((301, 97)).astype(np.float32), "small": rng.standard_normal(3).astype(np.float32),
              "strided": rng.standard_normal((40, 60)).astype(np.float32)[:, ::2]}
    want = np.sqrt(sum(float(np.sum(a.astype(np.float64) ** 2)) for a in update.values()))
    assert abs(global_norm(update) - want) <= 1e-12 * want
    aggregator = Aggregator({n: a.shape for n, a in update.items()}, rule="median")
    flat = aggregator.prepare(update).values
    np.testing.assert_array_equal(flat, np.concatenate([a.reshape(-1) for a in update.values()]))
    spec = spec_of(update)
    check_arrays(update, spec, what="update")
    bad = dict(update, big=update["big"].copy())
    bad["big"][-1, -1] = 5e6  # in the last piece
    with pytest.raises(ContributionError, match="'big' has values up to 5e\\+06"):
        check_arrays(bad, spec, what="update")
