"""Functions of several outputs (engine.autograd): one backward call with every output's gradient,
None for an output that fed nothing, and gradients through each output reaching the inputs."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.autograd import Function


class _SplitScale(Function):
    """x (N,) -> (2 x[:k], 3 x[k:]): two outputs; counts its backward calls."""
    calls = 0

    def forward(self, x, k: int = 2):
        self.k, self.n = k, len(x)
        return x[:k] * 2.0, x[k:] * 3.0

    def backward(self, grads):
        type(self).calls += 1
        g_a, g_b = grads
        parts = [g_a * 2.0 if g_a is not None else np.zeros(self.k, np.float32),
                 g_b * 3.0 if g_b is not None else np.zeros(self.n - self.k, np.float32)]
        return np.concatenate(parts)


def _split(x, k=2):
    return _SplitScale.apply(x, k=k)


@pytest.fixture(autouse=True)
def _count():
    _SplitScale.calls = 0


def _x():
    return engine.tensor(np.arange(5, dtype=np.float32), requires_grad=True)


def test_both_outputs_one_backward_call():
    x = _x()
    a, b = _split(x)
    (a.sum() * 10.0 + (b * b).sum()).backward()
    assert _SplitScale.calls == 1
    np.testing.assert_allclose(x.grad.numpy(), [20, 20, 3 * 2 * 6, 3 * 2 * 9, 3 * 2 * 12])


def test_an_output_used_twice_and_one_unused():
    x = _x()
    a, _ = _split(x)
    (a * a + a).sum().backward()  # the second output feeds nothing: its gradient is None
    assert _SplitScale.calls == 1
    np.testing.assert_allclose(x.grad.numpy(), [2 * (2 * 0 * 2 + 1), 2 * (2 * 2 * 1 + 1), 0, 0, 0])


def test_outputs_reached_through_different_paths():
    x = _x()
    a, b = _split(x, k=3)
    c, d = _split(b * 1.0, k=1)  # a multi-output op feeding another one
    (a.sum() + c.sum() * 2.0 + d.sum()).backward()
    assert _SplitScale.calls == 2
    np.testing.assert_allclose(x.grad.numpy(), [2, 2, 2, 3 * 2 * 2, 3 * 3])


def test_retain_graph_allows_a_second_backward():
    x = _x()
    a, b = _split(x)
    loss = a.sum() + b.sum()
    loss.backward(retain_graph=True)
    loss.backward()
    assert _SplitScale.calls == 2
    np.testing.assert_allclose(x.grad.numpy(), [4, 4, 6, 6, 6])


def test_no_grad_gives_plain_outputs():
    x = _x()
    with engine.no_grad():
        a, b = _split(x)
    assert not a.requires_grad and not b.requires_grad
