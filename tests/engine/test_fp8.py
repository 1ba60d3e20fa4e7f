"""FP8 on the CPU backend (engine/backends/cpu/fp8.py, the reference of the GPU's kernels) and
engine.fp8's opt-in FP8 linear layers.

The casts are checked against the formats' definitions written out here: every finite code decodes to
sign x 2^(e - bias) x (1 + m / 2^M) (subnormals 2^(1 - bias) x m / 2^M), every such value casts to
itself, midpoints round to the even code, what lies past the largest finite value saturates and NaN
stays NaN. Delayed scaling is checked step by step (the first cast's own amax, then the maximum of a
16-cast history). The FP8 GEMM within bf16's rounding of the float64 product of the dequantised
operands (its float32 result unrounded). A linear layer in FP8 within FP8's precision of bf16 (4e-2 of
the norm through E4M3 only, 8e-2 through E5M2), its bias gradient bit for bit bf16's (the same sums of
the same bf16 dy); the classifier's gradient cast at its fixed scale, and F.linear_cross_entropy in FP8
within FP8's precision of bf16; a small GPT trained in FP8 ends within 2% of the way bf16's loss came
down (from ln V, a uniform guess).
"""
from __future__ import annotations

import copy
import warnings

import ml_dtypes
import numpy as np
import pytest

import engine
import engine.fp8
import engine.nn.functional as F
from engine.backends.cpu import fp8 as c8
from engine.nn import GPT, GPTConfig, Linear

rng = np.random.default_rng(0)
# (format, exponent bias, mantissa bits, largest finite value)
FORMATS = [("e4m3", 7, 3, 448.0), ("e5m2", 15, 2, 57344.0)]


def decode(code: int, bias: int, mbits: int) -> float:
    """An FP8 code's value from its bits (E4M3's 0x7F/0xFF and E5M2's exponent 31 are not finite)."""
    sign = -1.0 if code & 0x80 else 1.0
    e, m = (code >> mbits) & ((1 << (7 - mbits)) - 1), code & ((1 << mbits) - 1)
    if e == 0:
        return sign * 2.0 ** (1 - bias) * m / 2 ** mbits
    return sign * 2.0 ** (e - bias) * (1 + m / 2 ** mbits)


def finite_codes(fmt: str) -> list:
    codes = range(256)
    if fmt == "e4m3":
        return [c for c in codes if c & 0x7F != 0x7F]
    return [c for c in codes if (c >> 2) & 0x1F != 0x1F]


def cast_unscaled(x: np.ndarray, fmt: str) -> np.ndarray:
    meta = c8.fp8_meta(None)  # scale 1
    q, _, inv = c8.fp8_cast(x.astype(np.float32), fmt, meta, current=False)
    assert inv[0] == 1.0
    return q


@pytest.mark.parametrize("fmt,bias,mbits,fmax", FORMATS)
def test_every_code_decodes_as_the_format_defines_and_casts_back_to_itself(fmt, bias, mbits, fmax):
    codes = np.array(finite_codes(fmt), np.uint8)
    want = np.array([decode(int(c), bias, mbits) for c in codes])
    np.testing.assert_array_equal(c8.fp8_values(codes, fmt), want)
    assert want.max() == fmax
    back = cast_unscaled(want, fmt)
    ok = want != 0  # +0 and -0 both cast to their own code
    np.testing.assert_array_equal(back[ok], codes[ok])


@pytest.mark.parametrize("fmt,bias,mbits,fmax", FORMATS)
def test_midpoints_round_to_even_and_the_range_saturates(fmt, bias, mbits, fmax):
    pos = sorted(c for c in finite_codes(fmt) if c < 0x80)  # codes of +values, increasing with the value
    vals = [decode(c, bias, mbits) for c in pos]
    mid = np.array([(a + b) / 2 for a, b in zip(vals, vals[1:])])
    got = cast_unscaled(mid, fmt)
    even = np.array([lo if lo % 2 == 0 else hi for lo, hi in zip(pos, pos[1:])], np.uint8)
    np.testing.assert_array_equal(got, even)
    big = cast_unscaled(np.array([fmax * 1.01, 1e30, np.inf, -np.inf]), fmt)
    np.testing.assert_array_equal(c8.fp8_values(big, fmt), [fmax, fmax, fmax, -fmax])
    assert np.isnan(c8.fp8_values(cast_unscaled(np.array([np.nan]), fmt), fmt)[0])


def test_delayed_scaling_takes_the_first_casts_own_amax_then_the_history_maximum():
    meta = c8.fp8_meta(None)
    x = np.full((4, 4), 2.0, np.float32)
    q, _, inv = c8.fp8_cast(x, "e4m3", meta, current=True)  # a fresh meta: scaled by this tensor's amax
    np.testing.assert_allclose(inv[0], 2.0 / 448.0, rtol=1e-7)
    assert (c8.fp8_values(q, "e4m3") == 448.0).all()
    assert meta[0] == np.float32(448.0) / np.float32(2.0) and meta[4] == 2.0
    q, _, inv = c8.fp8_cast(x * 4, "e4m3", meta, current=False)  # scaled by the history: saturates once
    assert inv[0] == np.float32(1) / np.float32(224.0) and (c8.fp8_values(q, "e4m3") == 448.0).all()
    assert meta[0] == np.float32(448.0) / np.float32(8.0), "the next scale follows the new maximum"
    for _ in range(15):  # the 8.0 stays for 16 casts in all, then leaves the history
        c8.fp8_cast(x, "e4m3", meta, current=False)
    assert meta[0] == np.float32(448.0) / np.float32(8.0)
    c8.fp8_cast(x, "e4m3", meta, current=False)
    assert meta[0] == np.float32(448.0) / np.float32(2.0)
    before = meta.copy()
    c8.fp8_cast(np.full((2, 2), np.inf, np.float32), "e4m3", meta, current=False)
    np.testing.assert_array_equal(meta, before)  # a non-finite amax leaves the scaling as it was
    zeros = c8.fp8_meta(None)
    c8.fp8_cast(np.zeros((3, 3), np.float32), "e5m2", zeros, current=True)
    assert zeros[0] == 1.0  # nothing to scale by yet


def test_the_transposed_cast_is_the_transpose_and_bf16_input_casts_as_its_float32_value():
    x = rng.standard_normal((24, 40)).astype(np.float32)
    q, qt, _ = c8.fp8_cast(x, "e4m3", c8.fp8_meta(None), current=True, transpose=True)
    np.testing.assert_array_equal(qt, q.T)
    xb = x.astype(ml_dtypes.bfloat16)
    q1, _, _ = c8.fp8_cast(xb, "e5m2", c8.fp8_meta(None), current=True)
    q2, _, _ = c8.fp8_cast(xb.astype(np.float32), "e5m2", c8.fp8_meta(None), current=True)
    np.testing.assert_array_equal(q1, q2)


@pytest.mark.parametrize("activation", [None, "gelu"])
def test_the_fp8_gemm_is_the_dequantised_product_rounded_once_to_bf16(activation):
    a = rng.standard_normal((32, 48)).astype(np.float32)
    b = rng.standard_normal((16, 48)).astype(np.float32)
    bias = rng.standard_normal(16).astype(np.float32)
    qa, _, ia = c8.fp8_cast(a, "e5m2", c8.fp8_meta(None), current=True)
    qb, _, ib = c8.fp8_cast(b, "e4m3", c8.fp8_meta(None), current=True)
    out, pre = c8.matmul_fp8(qa, "e5m2", ia, qb, "e4m3", ib, bias.astype(ml_dtypes.bfloat16), activation)
    want = (c8.fp8_values(qa, "e5m2").astype(np.float64) * ia[0]) @ (c8.fp8_values(qb, "e4m3") * ib[0]).T
    want = want + bias.astype(ml_dtypes.bfloat16).astype(np.float64)
    if activation:
        np.testing.assert_allclose(pre.astype(np.float32), want, rtol=2 ** -8, atol=1e-6)
        want = 0.5 * want * (1 + np.tanh(np.sqrt(2 / np.pi) * (want + 0.044715 * want ** 3)))
    else:
        assert pre is None
    np.testing.assert_allclose(out.astype(np.float32), want, rtol=2 ** -8, atol=1e-5)
    if activation is None:
        out32, _ = c8.matmul_fp8(qa, "e5m2", ia, qb, "e4m3", ib, out_dtype=engine.float32)
        assert out32.dtype == np.float32
        np.testing.assert_allclose(out32, want - bias.astype(ml_dtypes.bfloat16).astype(np.float64), rtol=1e-5,
                                   atol=1e-5)
        with pytest.raises(ValueError, match="float32"):
            c8.matmul_fp8(qa, "e5m2", ia, qb, "e4m3", ib, bias, out_dtype=engine.float32)
    with pytest.raises(ValueError, match="E4M3"):
        c8.matmul_fp8(qa, "e5m2", ia, qa, "e5m2", ia)


def _linear_pair(activation):
    """A linear layer's output and gradients under autocast("cpu"), in FP8 and in bf16, same weights."""
    engine.manual_seed(0)
    layer = Linear(64, 96)
    x = rng.standard_normal((3, 10, 64)).astype(np.float32)
    g = rng.standard_normal((3, 10, 96)).astype(np.float32)
    results = []
    for fp8 in (True, False):
        engine.fp8.enable(layer, fp8)
        for p in layer.parameters():
            p.grad = None
        xt = engine.tensor(x, requires_grad=True)
        with engine.autocast("cpu"):
            y = F.linear(xt, layer.weight, layer.bias, activation=activation, fp8=layer.fp8)
        (y.float() * engine.tensor(g)).sum().backward()
        results.append([y.float().numpy(), xt.grad.numpy(), layer.weight.grad.numpy(), layer.bias.grad.numpy()])
    return results


@pytest.mark.parametrize("activation", [None, "gelu"])
def test_an_fp8_linear_layer_is_bf16_within_fp8_precision(activation):
    (y8, dx8, dw8, db8), (y, dx, dw, db) = _linear_pair(activation)
    # E4M3 rounds to 1/16 of a binade (x, w: about 3% RMS), E5M2 to 1/8 (the gradient: about 5%)
    for got, want, what, tol in [(y8, y, "y", 4e-2), (dx8, dx, "dx", 8e-2), (dw8, dw, "dw", 8e-2), (db8, db, "db", 4e-2)]:
        err = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert err < tol, f"{what}: off by {err:.3g} of its norm"
        assert got.dtype == want.dtype
    assert np.abs(y8 - y).max() > 0, "the forward did run in FP8"
    if activation is None:  # db sums the same bf16 dy; dw = dy^T x ran in FP8, on the transposed copies
        np.testing.assert_array_equal(db8, db)
        assert not np.array_equal(dw8, dw)


def test_the_classifier_gradient_is_cast_to_e5m2_at_its_fixed_scale():
    logits = (rng.standard_normal((6, 40)) * 3).astype(ml_dtypes.bfloat16)
    targets = np.array([0, 5, -1, 39, 7, 7])
    losses, codes, inv = c8.cross_entropy_with_grad_fp8_(logits, targets, -1)  # logits -> dlogits, in place
    np.testing.assert_array_equal(codes, cast_unscaled(logits.astype(np.float32) * 32768.0, "e5m2"))
    assert inv[0] == 2.0 ** -15 and losses[2] == 0 and (codes[2] == 0).all()
    back = c8.fp8_values(codes, "e5m2") * inv[0]
    np.testing.assert_allclose(back, logits.astype(np.float32), rtol=2 ** -3, atol=2 ** -31)


@pytest.mark.parametrize("need", [(True, True), (True, False), (False, True)])
def test_the_classifier_in_fp8_is_bf16_within_fp8_precision(need):
    x = rng.standard_normal((40, 64)).astype(np.float32)
    w = (rng.standard_normal((96, 64)) * 0.2).astype(np.float32)
    targets = engine.tensor(rng.integers(0, 96, 40))
    results = []
    for fp8 in (engine.fp8.Fp8State(), None):
        xt, wt = engine.tensor(x, requires_grad=need[0]), engine.tensor(w, requires_grad=need[1])
        with engine.autocast("cpu"):
            loss = F.linear_cross_entropy(xt.type(engine.bfloat16), wt, targets, fp8=fp8)
        loss.backward()
        results.append([loss.item()] + [t.grad.float().numpy() if t.grad is not None else None for t in (xt, wt)])
        if fp8 is not None:
            assert set(key[0] for key in fp8._metas) == {"x", "w"}
    (l8, dx8, dw8), (l, dx, dw) = results
    assert abs(l8 - l) < 1e-2 * l
    for got, want, what in [(dx8, dx, "dx"), (dw8, dw, "dw")]:
        assert (got is None) == (want is None), what
        if want is not None:
            err = np.linalg.norm(got - want) / np.linalg.norm(want)
            assert err < 8e-2, f"{what}: off by {err:.3g} of its norm"


def test_enable_reaches_every_linear_layer_and_the_state_is_neither_saved_nor_shared():
    model = GPT(GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=32))
    assert not engine.fp8.is_enabled(model)
    assert engine.fp8.enable(model) == 2 * 4 + 1  # qkv, proj, fc, proj per block; the head
    assert engine.fp8.is_enabled(model)
    assert set(model.state_dict()) == set(GPT(model.config).state_dict())
    idx = engine.tensor(rng.integers(0, 32, (2, 16)))
    with engine.autocast("cpu"):
        model(idx, idx)
    layer = next(m for m in model.modules() if isinstance(m, Linear) and m.fp8 is not None and m.fp8._metas)
    replica = copy.deepcopy(model)
    twin = next(m for m in replica.modules() if isinstance(m, Linear) and m.fp8 is not None)
    assert twin.fp8 is not layer.fp8 and not twin.fp8._metas, "a copied model has scales of its own"
    assert engine.fp8.enable(model, False) == 9 and not engine.fp8.is_enabled(model)


def test_a_backend_without_an_fp8_gemm_warns_once_and_runs_bf16(monkeypatch):
    # what a GPU before Hopper does: cuBLASLt offers no FP8 GEMM, the backend's matmul_fp8 says None
    import engine.backends.cpu as cpu_backend
    monkeypatch.setattr(cpu_backend, "matmul_fp8", lambda *args, **kwargs: None)
    layer = Linear(16, 8)
    x = engine.tensor(rng.standard_normal((4, 16)).astype(np.float32))
    with engine.autocast("cpu"):
        want = layer(x).float().numpy()
        engine.fp8.enable(layer)
        with pytest.warns(RuntimeWarning, match="no FP8 GEMM .* runs in bf16"):
            got = layer(x).float().numpy()
        np.testing.assert_array_equal(got, want)
        assert layer.fp8.unavailable
        metas = {k: v.copy() for k, v in layer.fp8._metas.items()}
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once: no second warning, and no casts any more
            np.testing.assert_array_equal(layer(x).float().numpy(), want)
        assert all(np.array_equal(metas[k], v) for k, v in layer.fp8._metas.items())
    layer.fp8.reset()
    assert not layer.fp8.unavailable


def test_outside_autocast_an_fp8_layer_computes_as_without_it():
    layer = Linear(16, 8)
    x = engine.tensor(rng.standard_normal((4, 16)).astype(np.float32))
    want = layer(x).numpy()
    engine.fp8.enable(layer)
    np.testing.assert_array_equal(layer(x).numpy(), want)
    assert not layer.fp8._metas


@pytest.mark.slow
def test_a_small_gpt_trains_in_fp8_about_as_well_as_in_bf16():
    text = "row, row, row your boat, gently down the stream. merrily, merrily, life is but a dream. "
    vocab = sorted(set(text))
    data = np.array([vocab.index(c) for c in text * 4])
    finals = {}
    for fp8 in (False, True):
        engine.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=len(vocab), block_size=32, n_layer=2, n_head=2, n_embd=64))
        engine.fp8.enable(model, fp8)
        opt = engine.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
        batches = np.random.default_rng(1)
        losses = []
        for _ in range(60):
            starts = batches.integers(0, len(data) - 33, 8)
            x = engine.tensor(np.stack([data[s:s + 32] for s in starts]))
            y = engine.tensor(np.stack([data[s + 1:s + 33] for s in starts]))
            with engine.autocast("cpu"):
                _, loss = model(x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        finals[fp8] = np.mean(losses[-10:])
    assert finals[True] < 0.6 * np.log(len(vocab)), f"FP8 did not learn: {finals}"
    drop = np.log(len(vocab)) - finals[False]  # from a uniform guess to bf16's final loss
    assert abs(finals[True] - finals[False]) < 0.02 * drop, finals
