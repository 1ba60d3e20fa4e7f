"""engine.autocast.cast_weights: a model's float32 weights cast to bf16 once at the start of its forward
(one backend call, one kernel on the GPU), the forward's ops taking those copies, and nothing kept
past the forward: a weight changed afterwards is cast afresh by the next forward.

Equality is exact: the same float32 -> bf16 rounding happens once up front instead of op by op."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.autocast import cast_weights, weight_cast
from engine.backends import cpu
from engine.nn import GPT, GPTConfig


def _model(seed: int = 0) -> GPT:
    engine.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=37, block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.0, bias=True))


def _batch(seed: int = 1):
    rng = np.random.default_rng(seed)
    return (engine.tensor(rng.integers(0, 37, (3, 16))), engine.tensor(rng.integers(0, 37, (3, 16))))


def _loss_and_grads(model, idx, tgt, scoped: bool):
    """The bf16 loss and float32 gradients of one step; scoped=False runs the forward with the one-cast
    scope switched off (each op casts its own weight, as before)."""
    for p in model.parameters():
        p.grad = None
    with engine.autocast("cpu", dtype=engine.bfloat16):
        if scoped:
            _, loss = model(idx, tgt)
        else:
            with _casts_off():
                _, loss = model(idx, tgt)
    loss.backward()
    return float(loss.item()), {n: p.grad.numpy().copy() for n, p in model.named_parameters()}


class _casts_off:
    """A cast_weights scope already open with nothing in it: the model's own scope then does nothing."""

    def __enter__(self):
        self.cm = cast_weights([])
        self.cm.__enter__()

    def __exit__(self, *exc):
        return self.cm.__exit__(*exc)


def test_gpt_forward_casts_its_weights_in_one_call(monkeypatch):
    model, (idx, tgt) = _model(), _batch()
    calls = {"many": [], "single": 0}
    real_many, real_astype = cpu.astype_many, cpu.astype

    def many(xs, dtype):
        calls["many"].append(len(xs))
        return real_many(xs, dtype)

    def single(x, dtype):
        if x.dtype == np.float32 and x.ndim in (1, 2) and dtype is engine.bfloat16:
            calls["single"] += 1
        return real_astype(x, dtype)

    monkeypatch.setattr(cpu, "astype_many", many)
    monkeypatch.setattr(cpu, "astype", single)
    with engine.autocast("cpu", dtype=engine.bfloat16):
        model(idx, tgt)
    linears = [m for m in model.modules() if isinstance(m, engine.nn.Linear)]
    distinct = {id(p) for m in linears for p in (m.weight, m.bias) if p is not None}
    assert calls["many"] == [len(distinct)]  # every GEMM weight and bias once, the tied head weight once
    # the embeddings' outputs (wte, wpe lookups) are cast as activations; no weight is cast on its own
    assert calls["single"] <= 2


def test_one_cast_gives_the_same_step_as_casting_op_by_op():
    model, (idx, tgt) = _model(), _batch()
    loss_a, grads_a = _loss_and_grads(model, idx, tgt, scoped=True)
    loss_b, grads_b = _loss_and_grads(model, idx, tgt, scoped=False)
    assert loss_a == loss_b
    for name in grads_a:
        np.testing.assert_array_equal(grads_a[name], grads_b[name], err_msg=name)


def test_a_weight_changed_after_the_forward_is_cast_afresh():
    """The copies end with the forward: after an optimizer step the next forward sees the new weights."""
    model, (idx, tgt) = _model(), _batch()
    opt = engine.optim.AdamW(model.parameters(), lr=1e-2)
    _loss_and_grads(model, idx, tgt, scoped=True)
    opt.step()
    after_step_scoped, _ = _loss_and_grads(model, idx, tgt, scoped=True)
    after_step_unscoped, _ = _loss_and_grads(model, idx, tgt, scoped=False)
    assert after_step_scoped == after_step_unscoped


def test_weight_cast_outside_a_scope_casts_now_and_inside_returns_the_copy():
    w = engine.randn(4, 8)
    fresh = weight_cast(cpu, w.data, engine.bfloat16)
    assert cpu.dtype_of(fresh) is engine.bfloat16
    with engine.autocast("cpu", dtype=engine.bfloat16), cast_weights([w]):
        a = weight_cast(cpu, w.data, engine.bfloat16)
        b = weight_cast(cpu, w.data, engine.bfloat16)
        assert a is b
        np.testing.assert_array_equal(a.view(np.uint16), fresh.view(np.uint16))
    assert weight_cast(cpu, w.data, engine.bfloat16) is not a  # the scope's copy is gone


def test_without_autocast_the_scope_casts_nothing(monkeypatch):
    monkeypatch.setattr(cpu, "astype_many", lambda xs, dtype: pytest.fail("cast without autocast"))
    model, (idx, tgt) = _model(), _batch()
    _, loss = model(idx, tgt)
    assert loss.dtype == engine.float32
