"""Attention dropout inside the fused kernels (csrc/cuda/attention/), forward and backward.

What is checked:
- the mask kernel (attention_dropout_mask) draws exactly the CPU reference's mask for a seed;
- the fused forward applies exactly that mask (one-hot values make the output show it), and the
  backward's dV uses it too;
- fused dropout attention (float32 with TF32, bfloat16; D = 32/64/128; causal and not; T, S not
  multiples of 64), and the packed attention_qkv, against the composite
  softmax(q k^T scale, causal) * Z @ v with that mask (engine autograd, float64, on the CPU);
  float32 with TF32 off takes the unfused path (no precise dropout kernel), with the same mask;
- dropout_p = 0 is the kernel without dropout, bit for bit;
- CUDA graphs: every replay of a CapturedStep, and of a compile_block's separate forward and
  backward graphs, draws a new mask, and the backward uses the mask its forward drew.

Tolerances (relative to the largest reference value, as in tests/cuda/test_attention.py): float32
with TF32 5e-3, bfloat16 3e-2, float32 with TF32 off 1e-5; gradients twice that."""
from __future__ import annotations

import math

import numpy as np
import pytest

import engine
import engine.nn.functional as F
from engine.backends import cpu
from engine.backends import cuda as gpu
from engine.graphs import CapturedStep, compile_block
from engine.nn.transformer import MultiHeadAttention

P = 0.2  # drop probability of the comparisons: Z = 1.25


def _round_bf16(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (nearest even), as float32."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32).reshape(a.shape)


def _upload(a: np.ndarray, dtype):
    x = gpu.from_numpy(np.ascontiguousarray(a, dtype=np.float32))
    return gpu.astype(x, engine.bfloat16) if dtype is engine.bfloat16 else x


def _download(x) -> np.ndarray:
    return gpu.to_numpy(gpu.astype(x, engine.float32))


def _rel(got, want) -> float:
    return float(np.max(np.abs(got - want)) / max(1e-30, float(np.max(np.abs(want)))))


def _key(rng) -> int:
    return int(gpu.to_numpy(rng).view(np.uint64)[0])


def _inputs(shapes, dtype, seed):
    rng = np.random.default_rng(seed)
    arrs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    return [_round_bf16(a) for a in arrs] if dtype is engine.bfloat16 else arrs


def _reference(q, k, v, g, z, causal, scale):
    """out, dq, dk, dv of softmax(q k^T scale, causal) * z @ v: engine autograd, float64, CPU."""
    ts = [engine.tensor(a, dtype=engine.float64, requires_grad=True) for a in (q, k, v)]
    T, S = q.shape[-2], k.shape[-2]
    s = (ts[0] @ ts[1].transpose(-2, -1)) * scale
    if causal:
        s = engine.where(F.causal_mask(T, S), float("-inf"), s)
    out = (F.softmax(s, -1) * engine.tensor(z, dtype=engine.float64)) @ ts[2]
    (out * engine.tensor(g, dtype=engine.float64)).sum().backward()
    return [out.numpy()] + [t.grad.numpy() for t in ts]


def _reference_qkv(qkv, g, z, n_head, causal):
    """y, dqkv of the packed self-attention with mask z (B, H, T, T): split heads, _reference's math."""
    B, T, C3 = qkv.shape
    C = C3 // 3
    D = C // n_head
    t = engine.tensor(qkv, dtype=engine.float64, requires_grad=True)
    heads = t.reshape(B, T, 3, n_head, D).permute(2, 0, 3, 1, 4)  # (3, B, H, T, D)
    s = (heads[0] @ heads[1].transpose(-2, -1)) * (1.0 / math.sqrt(D))
    if causal:
        s = engine.where(F.causal_mask(T, T), float("-inf"), s)
    y = ((F.softmax(s, -1) * engine.tensor(z, dtype=engine.float64)) @ heads[2]).permute(0, 2, 1, 3).reshape(B, T, C)
    (y * engine.tensor(g, dtype=engine.float64)).sum().backward()
    return y.numpy(), t.grad.numpy()


# ---- the mask ------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(6, 37, 130), (2, 200, 77), (1, 1, 5)])
@pytest.mark.parametrize("p,seed", [(0.1, 3), (0.5, 0x123456789ABCDEF0), (0.2, 2**62 - 1)])
def test_gpu_mask_equals_cpu_mask(shape, p, seed):
    got = gpu.to_numpy(gpu.attention_dropout_mask(shape, p, seed))
    want = cpu.attention_dropout_mask(shape, p, seed)
    assert got.dtype == np.float32 and got.shape == shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [engine.float32, engine.bfloat16])
@pytest.mark.parametrize("D,causal", [(32, True), (64, False), (128, True), (128, False)])
def test_fused_kernels_apply_exactly_the_mask(dtype, D, causal, tf32):
    # q = 0 makes every visible probability 1 / (number visible); v = I (S = D keys, key j -> e_j)
    # makes out[t, j] = P[t, j] Z[t, j]: the output shows the forward's mask element by element
    BH, T, S, seed = 3, 100, D, 77 + D
    rng = np.random.default_rng(D)
    q = np.zeros((BH, T, D), np.float32)
    k = rng.standard_normal((BH, S, D)).astype(np.float32)
    v = np.broadcast_to(np.eye(S, D, dtype=np.float32), (BH, S, D)).copy()
    g = rng.standard_normal((BH, T, D)).astype(np.float32)
    if dtype is engine.bfloat16:
        k, g = _round_bf16(k), _round_bf16(g)
    z = gpu.to_numpy(gpu.attention_dropout_mask((BH, T, S), P, seed))
    t, j = np.arange(T)[:, None], np.arange(S)[None, :]
    visible = (j <= t + (S - T)) if causal else np.ones((T, S), bool)
    n_visible = visible.sum(axis=1)  # (T,)
    Q, K, V, G = (_upload(a, dtype) for a in (q, k, v, g))
    out, lse, key = gpu.attention(Q, K, V, causal, 1.0 / math.sqrt(D), dropout_p=P, seed=seed)
    assert _key(key) == seed  # outside a capture the key is the seed
    shown = _download(out)[..., :S] * np.maximum(n_visible, 1)[:, None]  # = Z where visible
    np.testing.assert_allclose(np.where(visible, shown, 0), np.where(visible, z, 0), atol=0.02)
    # the backward: dV = (P Z)^T dO with the same Z
    dq, dk, dv = gpu.attention_backward(G, Q, K, V, out, lse, causal, 1.0 / math.sqrt(D), dropout_p=P, rng=key)
    pz = np.where(visible, z, 0) / np.maximum(n_visible, 1)[:, None]  # (BH, T, S)
    want_dv = np.einsum("bts,btd->bsd", pz.astype(np.float64), g.astype(np.float64))
    assert _rel(_download(dv), want_dv) < (3e-2 if dtype is engine.bfloat16 else 5e-3)


# ---- against the composite path ------------------------------------------------------------------

@pytest.mark.parametrize("dtype,tf32_on,tol", [(engine.float32, True, 5e-3), (engine.bfloat16, True, 3e-2),
                                               (engine.float32, False, 1e-5)])
@pytest.mark.parametrize("D", [32, 64, 128])
@pytest.mark.parametrize("T,S,causal", [(100, 100, True), (37, 130, True), (130, 130, False), (77, 77, True)])
def test_fused_dropout_matches_composite(dtype, tf32_on, tol, D, T, S, causal):
    prev = engine.cuda.allow_tf32()
    engine.cuda.set_allow_tf32(tf32_on)
    try:
        B, H, seed = 2, 3, 1000 + T + S + D
        q, k, v, g = _inputs(((B, H, T, D), (B, H, S, D), (B, H, S, D), (B, H, T, D)), dtype, seed)
        scale = 1.0 / math.sqrt(D)
        z = gpu.to_numpy(gpu.attention_dropout_mask((B * H, T, S), P, seed)).reshape(B, H, T, S)
        out_r, dq_r, dk_r, dv_r = _reference(q, k, v, g, z, causal, scale)
        _, lse_r, _ = cpu.attention(q, k, v, causal, scale)  # the undropped log-sum-exp
        Q, K, V, G = (_upload(a, dtype) for a in (q, k, v, g))
        out, lse, key = gpu.attention(Q, K, V, causal, scale, dropout_p=P, seed=seed)
        assert out.dtype is dtype and key is not None and _key(key) == seed
        assert _rel(_download(out), out_r) < tol
        np.testing.assert_allclose(gpu.to_numpy(lse), lse_r, atol=tol * 10, rtol=tol)
        dq, dk, dv = gpu.attention_backward(G, Q, K, V, out, lse, causal, scale, dropout_p=P, rng=key)
        for got, want, name in ((dq, dq_r, "dq"), (dk, dk_r, "dk"), (dv, dv_r, "dv")):
            assert got.dtype is dtype
            assert _rel(_download(got), want) < tol * 2, name
    finally:
        engine.cuda.set_allow_tf32(prev)


@pytest.mark.parametrize("dtype,tf32_on,tol", [(engine.float32, True, 5e-3), (engine.bfloat16, True, 3e-2),
                                               (engine.float32, False, 1e-5)])
@pytest.mark.parametrize("causal", [True, False])
def test_qkv_dropout_matches_composite(dtype, tf32_on, tol, causal):
    prev = engine.cuda.allow_tf32()
    engine.cuda.set_allow_tf32(tf32_on)
    try:
        B, T, H, D, seed = 2, 77, 4, 64, 31
        qkv, g = _inputs(((B, T, 3 * H * D), (B, T, H * D)), dtype, seed)
        z = gpu.to_numpy(gpu.attention_dropout_mask((B * H, T, T), P, seed)).reshape(B, H, T, T)  # head b * H + h
        y_r, dqkv_r = _reference_qkv(qkv, g, z, H, causal)
        QKV, G = _upload(qkv, dtype), _upload(g, dtype)
        scale = 1.0 / math.sqrt(D)
        out, lse, key = gpu.attention_qkv(QKV, H, causal, scale, dropout_p=P, seed=seed)
        assert out.shape == (B, T, H * D) and lse.shape == (B, H, T) and _key(key) == seed
        assert _rel(_download(out), y_r) < tol
        dqkv = gpu.attention_qkv_backward(G, QKV, out, lse, H, causal, scale, dropout_p=P, rng=key)
        assert _rel(_download(dqkv), dqkv_r) < 2 * tol
    finally:
        engine.cuda.set_allow_tf32(prev)


def test_unfused_head_dim_with_dropout(no_tf32):  # the composite path's matmuls in full float32
    # D = 4: the composite path, with the kernels' mask
    B, H, T, S, D, seed = 2, 2, 9, 13, 4, 5
    q, k, v, g = _inputs(((B, H, T, D), (B, H, S, D), (B, H, S, D), (B, H, T, D)), engine.float32, seed)
    z = cpu.attention_dropout_mask((B * H, T, S), P, seed).reshape(B, H, T, S)
    out_r, dq_r, dk_r, dv_r = _reference(q, k, v, g, z, True, 0.5)
    Q, K, V, G = (gpu.from_numpy(a) for a in (q, k, v, g))
    out, lse, key = gpu.attention(Q, K, V, True, 0.5, dropout_p=P, seed=seed)
    assert _key(key) == seed
    np.testing.assert_allclose(gpu.to_numpy(out), out_r, atol=1e-5, rtol=1e-4)
    grads = gpu.attention_backward(G, Q, K, V, out, lse, True, 0.5, dropout_p=P, rng=key)
    for got, want in zip(grads, (dq_r, dk_r, dv_r)):
        np.testing.assert_allclose(gpu.to_numpy(got), want, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("dtype", [engine.float32, engine.bfloat16])
def test_p_zero_is_the_kernel_without_dropout(dtype, tf32):
    q, k, v, g = _inputs(((2, 3, 70, 64),) * 4, dtype, 9)
    Q, K, V, G = (_upload(a, dtype) for a in (q, k, v, g))
    out0, lse0, key0 = gpu.attention(Q, K, V, True, 0.125)
    out1, lse1, key1 = gpu.attention(Q, K, V, True, 0.125, dropout_p=0.0, seed=123)
    assert key0 is None and key1 is None
    np.testing.assert_array_equal(_download(out0), _download(out1))
    np.testing.assert_array_equal(gpu.to_numpy(lse0), gpu.to_numpy(lse1))
    g0 = gpu.attention_backward(G, Q, K, V, out0, lse0, True, 0.125)
    g1 = gpu.attention_backward(G, Q, K, V, out1, lse1, True, 0.125, dropout_p=0.0, rng=None)
    for a, b in zip(g0, g1):  # dQ's atomics may order differently: equal to float32 rounding
        np.testing.assert_allclose(_download(a), _download(b), atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="needs the rng"):
        gpu.attention_backward(G, Q, K, V, out0, lse0, True, 0.125, dropout_p=0.3)


# ---- through autograd, and CUDA graphs -----------------------------------------------------------

def _one_hot_qkv(B, T, H, D, seed):
    """qkv (B, T, 3C): q = 0, k random, v[t, h] = e_t (T <= D). Causal self-attention of it gives
    y[b, t, h D + j] = Z[b, h, t, j] / (t + 1) for j <= t: the output shows the mask."""
    C = H * D
    qkv = np.zeros((B, T, 3 * C), np.float32)
    qkv[:, :, C:2 * C] = np.random.default_rng(seed).standard_normal((B, T, C))
    for h in range(H):
        qkv[:, np.arange(T), 2 * C + h * D + np.arange(T)] = 1.0
    return qkv


def _shown_mask(y, B, T, H, D, p):
    """Z (B, H, T, T) read back from the output of _one_hot_qkv's attention (0 above the diagonal)."""
    z = y.reshape(B, T, H, D)[..., :T].transpose(0, 2, 1, 3) * (np.arange(T)[:, None] + 1.0)
    scale = 1.0 / (1.0 - p)
    clean = np.where(z > 0.5 * scale, scale, 0.0)
    np.testing.assert_allclose(z, clean, atol=0.02 * scale)  # every entry is 0 or 1 / (1 - p)
    return clean


_LOWER = np.tril(np.ones((50, 50), bool))  # the visible (query, key) pairs of T = 50


def test_self_attention_draws_the_seeded_mask(tf32):
    B, T, H, D, p = 2, 50, 2, 64, 0.5
    x = engine.tensor(_one_hot_qkv(B, T, H, D, 0), device="cuda")
    engine.manual_seed(11)
    seed = engine.random.next_seed()
    engine.manual_seed(11)
    y = F.self_attention(x, H, dropout_p=p)  # draws its seed from the engine generator: `seed`
    z = _shown_mask(y.numpy(), B, T, H, D, p)
    want = cpu.attention_dropout_mask((B * H, T, T), p, seed).reshape(B, H, T, T)
    np.testing.assert_array_equal(z[..., _LOWER], want[..., _LOWER])


def test_captured_step_draws_a_new_mask_every_replay(tf32):
    B, T, H, D, p = 1, 50, 2, 64, 0.5
    qkv_np = _one_hot_qkv(B, T, H, D, 0)
    g_np = np.random.default_rng(1).standard_normal((B, T, H * D)).astype(np.float32)
    qkv = engine.tensor(qkv_np, device="cuda", requires_grad=True)

    def step(g):
        qkv.grad = None
        y = F.self_attention(qkv, H, dropout_p=p)
        (y * g).sum().backward()
        return y, qkv.grad

    captured = CapturedStep(step, warmup=1)
    masks = []
    for _ in range(5):  # 1 eager, 1 capture + replay, 3 replays
        y, dqkv = captured(g_np)
        z = _shown_mask(y.numpy(), B, T, H, D, p)
        assert 0.4 < (z[..., _LOWER] == 0).mean() < 0.6
        y_r, dqkv_r = _reference_qkv(qkv_np, g_np, z, H, True)  # the backward follows the forward's mask
        assert _rel(y.numpy(), y_r) < 1e-2
        assert _rel(dqkv.numpy(), dqkv_r) < 1e-2
        masks.append(z[..., _LOWER])
    assert captured.captured
    for i in range(5):
        for j in range(i + 1, 5):
            assert not np.array_equal(masks[i], masks[j]), f"calls {i} and {j} drew the same mask"


def test_compiled_block_backward_graph_uses_its_forwards_mask(tf32):
    # forward and backward are separate graphs, each advancing the rng epoch when replayed: the
    # backward must read the key the forward wrote, not derive its own
    B, T, H, D, p = 1, 50, 2, 64, 0.5
    qkv_np = _one_hot_qkv(B, T, H, D, 2)
    g_np = np.random.default_rng(3).standard_normal((B, T, H * D)).astype(np.float32)

    def attend(x):
        return F.self_attention(x, H, dropout_p=p)

    block = compile_block(attend)
    masks = []
    for _ in range(4):
        x = engine.tensor(qkv_np, device="cuda", requires_grad=True)
        y = block(x)
        (y * engine.tensor(g_np, device="cuda")).sum().backward()
        z = _shown_mask(y.numpy(), B, T, H, D, p)
        y_r, dx_r = _reference_qkv(qkv_np, g_np, z, H, True)
        assert _rel(y.numpy(), y_r) < 1e-2
        assert _rel(x.grad.numpy(), dx_r) < 1e-2
        masks.append(z[..., _LOWER])
    assert len(block._graphs) == 1 and next(iter(block._graphs.values())) is not None  # replayed, not eager
    for i in range(4):
        for j in range(i + 1, 4):
            assert not np.array_equal(masks[i], masks[j]), f"calls {i} and {j} drew the same mask"


def test_multihead_attention_uses_fused_dropout_in_training(tf32):
    engine.manual_seed(0)
    mha = MultiHeadAttention(64, 4, dropout=0.3).to("cuda")
    x = engine.tensor(np.random.default_rng(4).standard_normal((2, 40, 64)).astype(np.float32), device="cuda",
                      requires_grad=True)
    a, b = mha(x), mha(x)
    assert not np.allclose(a.numpy(), b.numpy())  # a new mask each call
    a.sum().backward()
    assert np.isfinite(x.grad.numpy()).all()
    assert all(np.isfinite(p.grad.numpy()).all() for p in mha.parameters())
    mha.eval()
    np.testing.assert_array_equal(mha(x).numpy(), mha(x).numpy())
