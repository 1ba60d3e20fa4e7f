"""Attention dropout of the fused attention op, on the CPU reference (engine/backends/cpu/attention.py):

- the numpy Philox4x32-10 (engine/backends/philox.py) against Random123's known answers and a
  scalar re-implementation, and the keep rule's counter / 16-bit lane layout (the CUDA kernels
  follow the same rule: tests/cuda/test_attention_dropout_gpu.py checks they agree element for element);
- the mask: keep fraction, values, determinism per seed;
- dropout attention forward and backward against the composite softmax(q k^T scale) * Z @ v with
  the materialised mask Z (float64, to 1e-12), finite differences, and PyTorch when installed.
"""
from __future__ import annotations

import numpy as np
import pytest

import engine
import engine.nn.functional as F
from engine.backends import cpu
from engine.backends.philox import attention_keep, dropout_threshold, keep_scale, philox4x32_10
from engine.ops.attention import Attention, AttentionQKV
from op_check import check_finite_differences

try:
    import torch
except ImportError:
    torch = None

_M = 0xFFFFFFFF


def _philox_scalar(counter, key):
    """Philox4x32-10 on Python ints: the algorithm as written in Salmon et al. / Random123."""
    c = list(counter)
    k0, k1 = key & _M, key >> 32
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k0, p1 & _M, (p0 >> 32) ^ c[3] ^ k1, p0 & _M]
        k0, k1 = (k0 + 0x9E3779B9) & _M, (k1 + 0xBB67AE85) & _M
    return c


@pytest.mark.parametrize("counter,key,expected", [
    ((0, 0, 0, 0), 0, (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((_M, _M, _M, _M), _M | (_M << 32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), 0xA4093822 | (0x299F31D0 << 32),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])
def test_philox_known_answers(counter, key, expected):
    got = tuple(int(x) for x in philox4x32_10(counter, key))
    assert got == expected
    assert tuple(_philox_scalar(counter, key)) == expected


def test_philox_vectorised_matches_scalar():
    rng = np.random.default_rng(0)
    counters = rng.integers(0, 2**32, size=(4, 50), dtype=np.uint64).astype(np.uint32)
    key = int(rng.integers(0, 2**63))
    words = philox4x32_10(tuple(counters), key)
    for i in range(50):
        assert [int(w[i]) for w in words] == _philox_scalar([int(c[i]) for c in counters], key)


def test_keep_rule_layout():
    # element (bh, qi, kj): counter (kj // 8, qi, bh, 0xA77E); lane kj % 8 = half (kj % 2) of word (kj % 8) // 2
    key, p = 0x0123456789ABCDEF, 0.3
    BH, T, S = 3, 5, 21  # S not a multiple of 8: the last group is cut
    keep = attention_keep(key, BH, T, S, p)
    thr = dropout_threshold(p)
    for bh, qi, kj in [(0, 0, 0), (2, 4, 20), (1, 3, 9), (1, 2, 15), (0, 1, 16)]:
        word = _philox_scalar([kj // 8, qi, bh, 0xA77E], key)[(kj % 8) // 2]
        lane = (word >> (16 * (kj % 2))) & 0xFFFF
        assert keep[bh, qi, kj] == (lane >= thr), (bh, qi, kj)


def test_threshold_and_scale():
    assert dropout_threshold(0.0) == 0 and dropout_threshold(0.5) == 32768
    assert dropout_threshold(0.1) == 6554  # round(6553.6)
    assert dropout_threshold(1.0 - 1e-9) == 65535  # clamped: never drops everything
    assert keep_scale(0.2) == np.float32(1.0) / np.float32(0.8)
    assert keep_scale(0.2).dtype == np.float32


def test_mask_keep_fraction_values_and_seeds():
    p = 0.3
    z = cpu.attention_dropout_mask((6, 64, 100), p, seed=5)
    assert z.shape == (6, 64, 100) and z.dtype == np.float32
    assert set(np.unique(z)) == {np.float32(0.0), keep_scale(p)}
    assert abs((z != 0).mean() - (1 - p)) < 0.015  # 38400 draws: the std of the fraction is 0.0023
    np.testing.assert_array_equal(z, cpu.attention_dropout_mask((6, 64, 100), p, seed=5))
    other = cpu.attention_dropout_mask((6, 64, 100), p, seed=6)
    assert 0.3 < (other != z).mean() < 0.5  # independent masks differ in 2 p (1 - p) = 42% of places
    # the mask of an element does not depend on the shape it is drawn in (counters are positions)
    np.testing.assert_array_equal(cpu.attention_dropout_mask((2, 10, 13), p, 5), z[:2, :10, :13])
    assert np.all(cpu.attention_dropout_mask((2, 3, 4), 0.0, 5) == 1.0)


def _composite(q, k, v, causal, scale, z):
    """softmax(q k^T scale, causal) * Z @ v with engine's ops (autograd through every step)."""
    T, S = q.shape[-2], k.shape[-2]
    s = (q @ k.transpose(-2, -1)) * scale
    if causal:
        s = engine.where(F.causal_mask(T, S), float("-inf"), s)
    return (F.softmax(s, -1) * z) @ v


@pytest.mark.parametrize("T,S,causal", [(5, 5, True), (3, 11, True), (7, 9, False), (1, 4, True)])
def test_dropout_attention_matches_composite_with_mask(T, S, causal):
    rng = np.random.default_rng(T * 10 + S)
    B, H, D, p, seed = 2, 3, 8, 0.4, 1234
    arrays = [rng.standard_normal(s) for s in ((B, H, T, D), (B, H, S, D), (B, H, S, D))]
    w = engine.tensor(rng.standard_normal((B, H, T, D)), dtype=engine.float64)
    z = engine.tensor(cpu.attention_dropout_mask((B * H, T, S), p, seed).reshape(B, H, T, S), dtype=engine.float64)
    scale = 1.0 / np.sqrt(D)
    results = []
    for fn in (lambda q, k, v: Attention.apply(q, k, v, causal=causal, scale=scale, dropout_p=p, seed=seed),
               lambda q, k, v: _composite(q, k, v, causal, scale, z)):
        ts = [engine.tensor(a, dtype=engine.float64, requires_grad=True) for a in arrays]
        out = fn(*ts)
        (out * w).sum().backward()
        results.append([out.numpy()] + [t.grad.numpy() for t in ts])
    for got, want, what in zip(results[0], results[1], ("out", "dq", "dk", "dv")):
        np.testing.assert_allclose(got, want, atol=1e-12, rtol=1e-10, err_msg=what)
    # and the dropout did something: without it the output differs
    plain = Attention.apply(*[engine.tensor(a, dtype=engine.float64) for a in arrays], causal=causal, scale=scale)
    assert not np.allclose(plain.numpy(), results[0][0])


def test_dropout_attention_keeps_the_undropped_lse():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 6, 4)) for _ in range(3))
    out0, lse0, rng0 = cpu.attention(q, k, v, True, 0.5)
    out1, lse1, key = cpu.attention(q, k, v, True, 0.5, dropout_p=0.5, seed=99)
    assert rng0 is None and key.dtype == np.uint64 and int(key[0]) == 99
    np.testing.assert_array_equal(lse0, lse1)
    assert not np.allclose(out0, out1)
    out2, lse2, none = cpu.attention(q, k, v, True, 0.5, dropout_p=0.0, seed=99)
    assert none is None
    np.testing.assert_array_equal(out2, out0)
    with pytest.raises(ValueError, match="needs the rng"):
        cpu.attention_backward(out1, q, k, v, out1, lse1, True, 0.5, dropout_p=0.5)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        cpu.attention(q, k, v, True, 0.5, dropout_p=1.0)


def test_dropout_attention_finite_differences():
    check_finite_differences(
        lambda q, k, v: Attention.apply(q, k, v, causal=True, scale=0.4, dropout_p=0.3, seed=7),
        [(2, 4, 6), (2, 5, 6), (2, 5, 6)])


def test_dropout_self_attention_qkv_matches_split_heads():
    # the packed op's heads are b * H + h in the mask, as the split-heads (B, H, T, D) view's are
    rng = np.random.default_rng(2)
    B, T, H, D, p, seed = 2, 6, 3, 4, 0.25, 42
    qkv_np = rng.standard_normal((B, T, 3 * H * D))
    w = engine.tensor(rng.standard_normal((B, T, H * D)), dtype=engine.float64)
    z = engine.tensor(cpu.attention_dropout_mask((B * H, T, T), p, seed).reshape(B, H, T, T), dtype=engine.float64)
    scale = 1.0 / np.sqrt(D)
    got, want = [], []
    for out_list, fused in ((got, True), (want, False)):
        qkv = engine.tensor(qkv_np, dtype=engine.float64, requires_grad=True)
        if fused:
            y = AttentionQKV.apply(qkv, n_head=H, causal=True, scale=scale, dropout_p=p, seed=seed)
        else:
            heads = qkv.reshape(B, T, 3, H, D).permute(2, 0, 3, 1, 4)
            y = _composite(heads[0], heads[1], heads[2], True, scale, z).permute(0, 2, 1, 3).reshape(B, T, H * D)
        (y * w).sum().backward()
        out_list += [y.numpy(), qkv.grad.numpy()]
    np.testing.assert_allclose(got[0], want[0], atol=1e-12, rtol=1e-10, err_msg="out")
    np.testing.assert_allclose(got[1], want[1], atol=1e-12, rtol=1e-10, err_msg="dqkv")


def test_functional_dropout_is_seeded_from_the_engine_generator():
    rng = np.random.default_rng(4)
    q, k, v = (engine.tensor(rng.standard_normal((1, 2, 8, 4)).astype(np.float32)) for _ in range(3))
    engine.manual_seed(3)
    a = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5, is_causal=True)
    engine.manual_seed(3)
    seed = engine.random.next_seed()
    b = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5, is_causal=True)  # the next seed: another mask
    engine.manual_seed(3)
    c = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5, is_causal=True)
    np.testing.assert_array_equal(a.numpy(), c.numpy())
    assert not np.allclose(a.numpy(), b.numpy())
    z = engine.tensor(cpu.attention_dropout_mask((2, 8, 8), 0.5, seed).reshape(1, 2, 8, 8))
    np.testing.assert_allclose(a.numpy(), _composite(q, k, v, True, 0.5, z).numpy(), atol=1e-6, rtol=1e-5)
    qkv = engine.tensor(rng.standard_normal((2, 8, 24)).astype(np.float32), requires_grad=True)
    y = F.self_attention(qkv, 2, dropout_p=0.5)
    y.sum().backward()
    assert np.isfinite(qkv.grad.numpy()).all()
    with pytest.raises(ValueError, match="dropout_p"):
        F.self_attention(qkv, 2, dropout_p=1.0)


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("causal", [True, False])
def test_dropout_attention_matches_torch_with_the_same_mask(causal):
    rng = np.random.default_rng(5)
    B, H, T, S, D, p, seed = 2, 2, 6, 7, 8, 0.3, 77
    arrays = [rng.standard_normal(s).astype(np.float32) for s in ((B, H, T, D), (B, H, S, D), (B, H, S, D))]
    w = rng.standard_normal((B, H, T, D)).astype(np.float32)
    z = cpu.attention_dropout_mask((B * H, T, S), p, seed).reshape(B, H, T, S)
    scale = 1.0 / np.sqrt(D)
    ts = [engine.tensor(a, requires_grad=True) for a in arrays]
    out = Attention.apply(*ts, causal=causal, scale=scale, dropout_p=p, seed=seed)
    (out * engine.tensor(w)).sum().backward()
    tt = [torch.tensor(a, requires_grad=True) for a in arrays]
    s = (tt[0] @ tt[1].transpose(-2, -1)) * scale
    if causal:
        s = s.masked_fill(torch.ones(T, S, dtype=torch.bool).triu(S - T + 1), float("-inf"))
    tout = (torch.softmax(s, -1) * torch.tensor(z)) @ tt[2]
    (tout * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), atol=1e-5, rtol=1e-4)
    for t, r in zip(ts, tt):
        np.testing.assert_allclose(t.grad.numpy(), r.grad.numpy(), atol=1e-5, rtol=1e-4)
