"""F.linear_cross_entropy (the fused classifier) on the CPU: loss and gradients against the unfused
F.linear + F.cross_entropy, finite differences and PyTorch; ignored rows, both reductions, an upstream
gradient other than 1, no-grad mode, and GPT.forward with and without return_logits."""
from __future__ import annotations

import numpy as np
import pytest

import engine
import engine.nn.functional as F
from engine.nn import GPT, GPTConfig
from op_check import check_against_torch, check_finite_differences

N, C, V = 12, 8, 13  # V not a multiple of anything in particular


def _targets(n=N, v=V, ignored=(1, 5), ignore_index=-100, seed=0):
    t = np.random.default_rng(seed).integers(0, v, n)
    t[list(ignored)] = ignore_index
    return engine.tensor(t)


def _fused(x, w, t, **kw):
    return F.linear_cross_entropy(x, w, t, **kw)


def _unfused(x, w, t, **kw):
    return F.cross_entropy(F.linear(x, w), t, **kw)


def _loss_and_grads(fn, x, w, t, upstream=1.0, dtype=engine.float32, **kw):
    xt = engine.tensor(x, dtype=dtype, requires_grad=True)
    wt = engine.tensor(w, dtype=dtype, requires_grad=True)
    loss = fn(xt, wt, t, **kw)
    (loss * upstream).backward()
    return loss.numpy(), xt.grad.numpy(), wt.grad.numpy()


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("upstream", [1.0, 3.0])
def test_matches_unfused_linear_and_cross_entropy(reduction, upstream):
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((N, C)), rng.standard_normal((V, C))
    t = _targets()
    got = _loss_and_grads(_fused, x, w, t, upstream, reduction=reduction)
    want = _loss_and_grads(_unfused, x, w, t, upstream, reduction=reduction)
    assert got[0].shape == () and got[0].dtype == np.float32
    for g, r, what in zip(got, want, ("loss", "dx", "dweight")):
        np.testing.assert_allclose(g, r, atol=1e-6, rtol=1e-5, err_msg=what)
    assert not got[1][[1, 5]].any()  # ignored rows: no gradient reaches their x


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_loss_backward_hands_over_the_gradients(reduction, monkeypatch):
    """loss.backward() straight on the fused loss (a gradient of exactly 1, once): dx and dweight are the
    forward's arrays, handed over unscaled; with retain_graph, or with a gradient passed, copies are
    scaled; each agrees with the unfused layers."""
    rng = np.random.default_rng(7)
    x, w = rng.standard_normal((N, C)), rng.standard_normal((V, C))
    t = _targets()
    want = _loss_and_grads(_unfused, x, w, t, reduction=reduction)
    scales = []
    from engine.backends import cpu
    monkeypatch.setattr(cpu, "scale", lambda a, f, _scale=cpu.scale: scales.append(a.shape) or _scale(a, f))
    for how in ("plain", "retain", "gradient"):
        scales.clear()
        xt, wt = (engine.tensor(a, dtype=engine.float32, requires_grad=True) for a in (x, w))
        loss = _fused(xt, wt, t, reduction=reduction)
        if how == "plain":
            loss.backward()
        elif how == "retain":  # twice: the first scales copies, the last hands over the arrays
            loss.backward(retain_graph=True)
            xt.grad = wt.grad = None
            loss.backward()
        else:
            loss.backward(engine.tensor(np.float32(2.0)))
        assert len(scales) == {"plain": 0, "retain": 2, "gradient": 2}[how], how
        k = 2.0 if how == "gradient" else 1.0
        np.testing.assert_allclose(xt.grad.numpy(), k * want[1], atol=1e-6, rtol=1e-5, err_msg=how)
        np.testing.assert_allclose(wt.grad.numpy(), k * want[2], atol=1e-6, rtol=1e-5, err_msg=how)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_gradients_match_finite_differences(reduction):
    t = _targets(n=6, v=7, ignored=(2,), ignore_index=-1)
    check_finite_differences(lambda x, w: F.linear_cross_entropy(x, w, t, ignore_index=-1, reduction=reduction),
                             [(6, 5), (7, 5)])


def test_matches_torch():
    torch = pytest.importorskip("torch")
    tn = _targets(ignore_index=-1).numpy()
    t, tt = engine.tensor(tn), torch.tensor(tn)
    check_against_torch(lambda x, w: F.linear_cross_entropy(x, w, t, ignore_index=-1),
                        lambda x, w: torch.nn.functional.cross_entropy(x @ w.T, tt, ignore_index=-1),
                        [(N, C), (V, C)])


def test_batched_input_and_float64():
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((3, 4, C)), rng.standard_normal((V, C))
    t = engine.tensor(rng.integers(0, V, (3, 4)))
    got = _loss_and_grads(_fused, x, w, t, dtype=engine.float64)
    want = _loss_and_grads(_unfused, x, w, t, dtype=engine.float64)
    assert got[0].dtype == np.float64 and got[1].shape == (3, 4, C)
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, atol=1e-12, rtol=1e-10)


def test_all_rows_ignored_gives_nan_loss_and_zero_gradients():
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((4, C)), rng.standard_normal((V, C))
    t = engine.tensor(np.full(4, -100))
    with np.errstate(divide="ignore", invalid="ignore"):  # the unfused path divides by 0
        loss, dx, dw = _loss_and_grads(_fused, x, w, t)
        ref = _loss_and_grads(_unfused, x, w, t)
    assert np.isnan(loss) and np.isnan(ref[0])  # 0 / 0, as in PyTorch
    assert not dx.any() and not dw.any()
    np.testing.assert_array_equal(dx, ref[1])


def test_only_the_inputs_that_require_grad_get_one():
    rng = np.random.default_rng(4)
    x = engine.tensor(rng.standard_normal((N, C)), dtype=engine.float32)  # a frozen input
    w = engine.tensor(rng.standard_normal((V, C)), dtype=engine.float32, requires_grad=True)
    t = _targets()
    F.linear_cross_entropy(x, w, t).backward()
    w_ref = engine.tensor(w.numpy(), requires_grad=True)
    _unfused(x, w_ref, t).backward()
    assert x.grad is None
    np.testing.assert_allclose(w.grad.numpy(), w_ref.grad.numpy(), atol=1e-6, rtol=1e-5)


def test_no_grad_mode_gives_the_loss_and_no_graph():
    rng = np.random.default_rng(5)
    x = engine.tensor(rng.standard_normal((N, C)), dtype=engine.float32, requires_grad=True)
    w = engine.tensor(rng.standard_normal((V, C)), dtype=engine.float32, requires_grad=True)
    t = _targets()
    with engine.no_grad():
        loss = F.linear_cross_entropy(x, w, t)
    assert not loss.requires_grad
    np.testing.assert_allclose(loss.numpy(), _unfused(x, w, t).numpy(), atol=1e-6, rtol=1e-5)


def test_rejects_bad_arguments():
    x, w = engine.zeros(4, C), engine.zeros(V, C)
    t = engine.tensor(np.zeros(4, np.int64))
    with pytest.raises(ValueError, match="reduction"):
        F.linear_cross_entropy(x, w, t, reduction="none")
    with pytest.raises(ValueError, match="do not fit"):
        F.linear_cross_entropy(x, engine.zeros(V, C + 1), t)
    with pytest.raises(ValueError, match="targets of shape"):
        F.linear_cross_entropy(x, w, engine.tensor(np.zeros(5, np.int64)))
    with pytest.raises(TypeError, match="int64"):
        F.linear_cross_entropy(x, w, t.type(engine.int32))
    with pytest.raises(IndexError, match="out of range"):
        F.linear_cross_entropy(x, w, engine.tensor(np.array([0, 1, V, 2])))


def test_gpt_forward_fused_and_with_logits_agree():
    cfg = GPTConfig(vocab_size=29, block_size=16, n_layer=2, n_head=2, n_embd=16, dropout=0.0)
    engine.manual_seed(0)
    model = GPT(cfg)
    rng = np.random.default_rng(6)
    x = engine.tensor(rng.integers(0, cfg.vocab_size, (3, 16)))
    yn = rng.integers(0, cfg.vocab_size, (3, 16))
    yn[0, :5] = -1  # GPT ignores targets of -1
    y = engine.tensor(yn)
    results = []
    for return_logits in (False, True):
        model.zero_grad()
        logits, loss = model(x, y, return_logits=return_logits)
        loss.backward()
        assert (logits is None) != return_logits
        results.append((loss.item(), {n: p.grad.numpy().copy() for n, p in model.named_parameters()}))
    (fused_loss, fused_grads), (loss, grads) = results
    assert abs(fused_loss - loss) < 1e-6
    for name, g in grads.items():  # the tied wte / lm_head weight gets both of its gradients either way
        np.testing.assert_allclose(fused_grads[name], g, atol=1e-7, rtol=1e-5, err_msg=name)
    logits, loss = model(x)
    assert loss is None and logits.shape == (3, 16, cfg.vocab_size)



def test_mean_under_bf16_autocast_counts_rows_exactly():
    """257 rows kept (bf16 would round the count to 256 or 258): the mean loss and its gradient under
    autocast are the sum's divided by 257 exactly."""
    rng = np.random.default_rng(9)
    n = 258
    x, w = rng.standard_normal((n, C)).astype(np.float32), rng.standard_normal((V, C)).astype(np.float32)
    t = _targets(n=n, ignored=(7,))
    results = {}
    for reduction in ("mean", "sum"):
        xt = engine.tensor(x, requires_grad=True)
        with engine.autocast("cpu", dtype=engine.bfloat16):
            loss = _fused(xt, engine.tensor(w), t, reduction=reduction)
        loss.backward()
        results[reduction] = loss.item(), xt.grad.float().numpy()
    np.testing.assert_allclose(results["mean"][0], results["sum"][0] / 257, rtol=1e-6)
    g_mean, g_sum = results["mean"][1], results["sum"][1]  # bf16 products: their ratio, fitted over all
    np.testing.assert_allclose(np.sum(g_mean * g_sum) / np.sum(g_sum * g_sum), 1 / 257, rtol=1e-3)
