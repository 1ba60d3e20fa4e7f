"""engine.cuda.graphs without a usable GPU: every API falls back to eager execution with one
GraphCaptureWarning and computes exactly what the eager code computes."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import engine
import engine.nn.functional as F
from engine.cuda import graphs
from engine.nn import Linear, Module
from engine.optim import AdamW, clip_grad_norm_

pytestmark = pytest.mark.skipif(engine.cuda.is_available(), reason="checks the fallback without a GPU")


class MLP(Module):
    def __init__(self):
        super().__init__()
        self.fc = Linear(8, 16)
        self.proj = Linear(16, 8)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x)))


def _setup():
    engine.manual_seed(0)
    model = MLP()
    return model, AdamW(model.parameters(), lr=1e-2)


def _step_fn(model, opt):
    def step(x, y):
        opt.zero_grad()
        d = model(x) - y
        loss = (d * d).mean()
        loss.backward()
        clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss
    return step


def _data(n=4):
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((4, 8)).astype(np.float32), rng.standard_normal((4, 8)).astype(np.float32))
            for _ in range(n)]


def test_names_are_reachable_from_engine_cuda():
    assert engine.cuda.graphs is graphs
    assert engine.cuda.CapturedStep is graphs.CapturedStep
    assert engine.cuda.compile_block is graphs.compile_block
    assert not graphs.is_capturing()
    assert not engine.cuda.is_current_stream_capturing()


def test_captured_step_falls_back_with_one_warning_and_trains_as_eager():
    eager_model, eager_opt = _setup()
    model, opt = _setup()
    eager = _step_fn(eager_model, eager_opt)
    with pytest.warns(graphs.GraphCaptureWarning, match="CUDA is not available") as caught:
        step = graphs.CapturedStep(_step_fn(model, opt))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no further warnings
        for x, y in _data():
            le = eager(engine.tensor(x), engine.tensor(y))
            lg = step(x, y)  # numpy arrays become CPU tensors
            assert le.numpy() == lg.numpy()
    assert len([w for w in caught if issubclass(w.category, graphs.GraphCaptureWarning)]) == 1
    assert not step.captured and "CUDA" in step.fallback_reason
    for a, b in zip(eager_model.parameters(), model.parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_graph_step_decorator_and_disabled_step_run_eagerly():
    model, opt = _setup()
    with pytest.warns(graphs.GraphCaptureWarning):
        step = engine.cuda.graph_step(_step_fn(model, opt))
    x, y = _data(1)[0]
    assert np.isfinite(step(engine.tensor(x), engine.tensor(y)).numpy())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        off = graphs.CapturedStep(lambda t: t * 2.0, enabled=False)  # explicitly off: silent
        np.testing.assert_array_equal(off(engine.tensor(x)).numpy(), x * 2.0)


def test_compiled_block_falls_back_and_matches_forward_and_backward():
    engine.manual_seed(1)
    module = MLP()
    with pytest.warns(graphs.GraphCaptureWarning, match="compile_block"):
        block = graphs.compile_block(module)
    rng = np.random.default_rng(1)
    x_np = rng.standard_normal((3, 8)).astype(np.float32)
    results = []
    for fn in (module, block):
        for p in module.parameters():
            p.grad = None
        x = engine.tensor(x_np, requires_grad=True)
        y = fn(x)
        (y * y).sum().backward()
        results.append((y.numpy(), x.grad.numpy(), [p.grad.numpy() for p in module.parameters()]))
    (y0, gx0, gp0), (y1, gx1, gp1) = results
    np.testing.assert_array_equal(y0, y1)
    np.testing.assert_array_equal(gx0, gx1)
    for a, b in zip(gp0, gp1):
        np.testing.assert_array_equal(a, b)
