"""Gradients added in place (engine.autograd, Function.grad_into / new_grads): a tied weight's embedding
rows go straight into the gradient the head made for it, and nothing backward() does not own is written.
Each case is checked against the same graph with the tensor split into two leaves (the sum of their
gradients is the tied tensor's)."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.nn import functional as F
from engine.ops import nn as N

V, C = 11, 6


@pytest.fixture
def into_calls(monkeypatch):
    """The `into` each embedding backward got: {} where it made its own gradient."""
    calls = []
    for op in (N.Embedding, N.EmbeddingPositions):
        def spy(self, g, into=None, _orig=op.backward):
            calls.append(dict(into or {}))
            return _orig(self, g, into)
        monkeypatch.setattr(op, "backward", spy)
    return calls


def _data(seed=0):
    r = np.random.default_rng(seed)
    idx = r.integers(0, V, (2, 5))
    idx[0, :3] = 4  # a token seen three times
    return (r.standard_normal((V, C)), r.standard_normal((16, C)), idx,
            r.integers(0, V, (10,)), r.standard_normal((2, 5, C)))


def _tied_lm(w_emb, w_head, pos, idx, targets, mix):
    """A language model's shape: embeddings in, a mixing matmul, the fused classifier on w_head."""
    x = F.embedding_with_positions(engine.tensor(idx), w_emb, pos, 3)  # (2, 5, C)
    h = (x * engine.tensor(mix)).reshape(10, C)
    return F.linear_cross_entropy(h, w_head, engine.tensor(targets))


def _leaves(*arrays):
    return [engine.tensor(a, requires_grad=True) for a in arrays]


def test_tied_embedding_adds_into_the_head_gradient(into_calls):
    w0, p0, idx, targets, mix = _data()
    w, pos = _leaves(w0, p0)
    _tied_lm(w, w, pos, idx, targets, mix).backward()
    assert len(into_calls) == 1 and set(into_calls[0]) == {0}  # the head's dweight was lent, and taken
    wa, wb, pos2 = _leaves(w0, w0, p0)
    _tied_lm(wa, wb, pos2, idx, targets, mix).backward()
    np.testing.assert_allclose(w.grad.numpy(), wa.grad.numpy() + wb.grad.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(pos.grad.numpy(), pos2.grad.numpy(), rtol=1e-12)
    # and the head's gradient alone is what it was: the embedding rows went only into the tied sum
    assert not np.allclose(wb.grad.numpy(), w.grad.numpy())


def test_plain_embedding_adds_into_the_head_gradient(into_calls):
    w0, _, idx, targets, mix = _data(1)

    def lm(w_emb, w_head):
        h = (F.embedding(engine.tensor(idx), w_emb) * engine.tensor(mix)).reshape(10, C)
        return F.linear_cross_entropy(h, w_head, engine.tensor(targets))

    w, = _leaves(w0)
    lm(w, w).backward()
    assert set(into_calls[0]) == {0}
    wa, wb = _leaves(w0, w0)
    lm(wa, wb).backward()
    np.testing.assert_allclose(w.grad.numpy(), wa.grad.numpy() + wb.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_a_gradient_passed_through_is_never_written(into_calls):
    """w + c: add's backward gives the one array g to both, so w's gradient there is not backward()'s to
    lend; the embedding makes its own and c's gradient stays g."""
    w0, _, idx, _, _ = _data(2)
    r = np.random.default_rng(3)
    c0, k = r.standard_normal((V, C)), r.standard_normal((V, C))
    w, c = _leaves(w0, c0)
    loss = ((w + c) * engine.tensor(k)).sum() + (F.embedding(engine.tensor(idx), w) ** 2).sum()
    loss.backward()
    assert into_calls == [{}]
    np.testing.assert_array_equal(c.grad.numpy(), k)
    rows = np.zeros((V, C))
    np.add.at(rows, idx.reshape(-1), 2 * w0[idx.reshape(-1)])
    np.testing.assert_allclose(w.grad.numpy(), k + rows, rtol=1e-12)


def test_an_added_gradient_is_lent_and_a_second_use_in_the_op_adds():
    """Three paths into w: the add of the first two is backward()'s own array, lent to the embedding; the
    positions table is w too (input 1, not lent), so its rows are added after."""
    w0, _, idx, targets, mix = _data(4)
    scale = np.random.default_rng(5).standard_normal((V, C))

    def lm(w1, w2, w3, w4):
        x = F.embedding_with_positions(engine.tensor(idx), w1, w2, 0)  # V positions >= 5
        h = (x * engine.tensor(mix)).reshape(10, C)
        return F.linear_cross_entropy(h, w3, engine.tensor(targets)) + (w4 * engine.tensor(scale)).sum()

    w, = _leaves(w0)
    lm(w, w, w, w).backward()
    parts = _leaves(w0, w0, w0, w0)
    lm(*parts).backward()
    np.testing.assert_allclose(w.grad.numpy(), sum(p.grad.numpy() for p in parts), rtol=1e-12, atol=1e-12)


def test_retain_graph_twice_gives_the_same_gradient():
    w0, p0, idx, targets, mix = _data(6)
    w, pos = _leaves(w0, p0)
    loss = _tied_lm(w, w, pos, idx, targets, mix)
    loss.backward(retain_graph=True)
    first = w.grad.numpy().copy()
    w.grad = None
    loss.backward()
    np.testing.assert_allclose(w.grad.numpy(), first, rtol=1e-12)


@pytest.mark.parametrize("op", [lambda a, b: a + b, lambda a, b: a * b, lambda a, b: a - b])
def test_a_tensor_used_twice_by_one_op_gets_both_gradients(op):
    """add's backward may hand the one array g to both inputs: both are added, never taken as one."""
    w0 = np.random.default_rng(7).standard_normal((V, C))
    w, = _leaves(w0)
    op(w, w).sum().backward()
    a, b = _leaves(w0, w0)
    op(a, b).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), a.grad.numpy() + b.grad.numpy(), rtol=1e-12)
