"""coop.training's weights_of / load_weights on a GPU: one flat copy each way, the same numbers as
the CPU model's, a wrong shape refused, and a captured train step still valid after a load."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from coop.training import TrainStep, load_weights, make_optimizer, weights_of
from engine.nn import GPT, GPTConfig

CFG = GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.0)


def test_weights_round_trip_through_the_gpu():
    engine.manual_seed(0)
    cpu = GPT(CFG)
    gpu = GPT(CFG).to("cuda")
    expected = weights_of(cpu)
    load_weights(gpu, expected)
    got = weights_of(gpu)
    assert list(got) == list(expected)
    for name, array in expected.items():
        assert got[name].dtype == np.float32 and got[name].shape == array.shape
        np.testing.assert_array_equal(got[name], array)
    partial = {name: np.full_like(array, 0.5) for name, array in list(expected.items())[:2]}
    load_weights(gpu, partial, partial=True)
    after = weights_of(gpu)
    assert all(np.all(after[n] == 0.5) for n in partial)
    rest = [n for n in expected if n not in partial]
    assert all(np.array_equal(after[n], expected[n]) for n in rest)


def test_a_wrong_shape_is_refused_before_anything_is_copied():
    gpu = GPT(CFG).to("cuda")
    before = weights_of(gpu)
    bad = dict(before)
    name = next(n for n, a in before.items() if a.ndim == 2)
    bad[name] = before[name].T.copy()  # same size, other shape
    with pytest.raises(ValueError, match="shape"):
        load_weights(gpu, bad)
    assert all(np.array_equal(weights_of(gpu)[n], a) for n, a in before.items())


def test_a_captured_step_trains_on_loaded_weights():
    # the graph replays on the parameters' storage: a load copies into it, so the next step starts from it
    engine.manual_seed(0)
    model = GPT(CFG).to("cuda")
    step = TrainStep(model, make_optimizer(model, "sgd", 0.0, 0.0), device="cuda", lr=0.0, min_lr=0.0,
                     warmup_steps=1, total_steps=10, precision="fp32", grad_clip=0.0, graph=True)
    rng = np.random.default_rng(0)
    x = engine.tensor(rng.integers(0, 50, (2, 16)), device="cuda")
    y = engine.tensor(rng.integers(0, 50, (2, 16)), device="cuda")
    for _ in range(3):
        step(x, y)  # captured by now
    loaded = {n: np.zeros_like(a) for n, a in weights_of(model).items()}
    load_weights(model, loaded)
    step(x, y)  # lr 0: the weights stay what was loaded
    assert all(np.all(a == 0) for a in weights_of(model).values())
