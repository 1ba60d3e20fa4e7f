"""The fused (flash-style) attention kernel against the CPU reference, forward and backward.

Tolerances (relative to the largest reference value): float32 with TF32 off (the kernel splits each
operand into two TF32 halves) 1e-5; float32 with TF32 on 5e-3; bfloat16 3e-2 (inputs rounded to
bf16 on both sides, probabilities rounded to bf16 before the P V product on the GPU only)."""
from __future__ import annotations

import numpy as np
import pytest

import engine
import engine.nn.functional as F
from engine.backends import cpu
from engine.backends import cuda as gpu


def _to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (round to nearest even), as uint16."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _from_bf16_bits(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32)


def _upload(a: np.ndarray, dtype):
    if dtype is engine.bfloat16:
        return gpu.astype(gpu.from_numpy(a.astype(np.float32)), engine.bfloat16)
    return gpu.from_numpy(a.astype(np.float32))


def _download(x) -> np.ndarray:
    return gpu.to_numpy(gpu.astype(x, engine.float32))


def _rel(got, want):
    return float(np.max(np.abs(got - want)) / max(1e-30, float(np.max(np.abs(want)))))


def _inputs(shape_q, shape_kv, dtype, seed):
    rng = np.random.default_rng(seed)
    arrs = [rng.standard_normal(s).astype(np.float32) for s in (shape_q, shape_kv, shape_kv, shape_q)]
    if dtype is engine.bfloat16:  # both sides see the same rounded inputs
        arrs = [_from_bf16_bits(_to_bf16_bits(a)).reshape(a.shape) for a in arrs]
    return arrs


@pytest.mark.parametrize("dtype,tf32,tol", [(engine.float32, False, 1e-5), (engine.float32, True, 5e-3),
                                            (engine.bfloat16, True, 3e-2)])
@pytest.mark.parametrize("T,S,D,causal", [(64, 64, 64, True), (100, 100, 32, True), (37, 130, 64, True),
                                          (130, 130, 128, False), (5, 5, 16, True), (70, 70, 80, True),
                                          (1, 9, 64, True), (256, 256, 64, True), (200, 333, 32, False),
                                          (300, 300, 128, True), (330, 400, 64, True), (129, 129, 64, False)])
def test_attention_matches_cpu(dtype, tf32, tol, T, S, D, causal):
    prev = engine.cuda.allow_tf32()
    engine.cuda.set_allow_tf32(tf32)
    try:
        q, k, v, g = _inputs((2, 3, T, D), (2, 3, S, D), dtype, seed=T + S + D)
        scale = 1.0 / np.sqrt(D)
        out_c, lse_c, _ = cpu.attention(q, k, v, causal, scale)
        dq_c, dk_c, dv_c = cpu.attention_backward(g, q, k, v, out_c, lse_c, causal, scale)
        Q, K, V, G = (_upload(a, dtype) for a in (q, k, v, g))
        out, lse, _ = gpu.attention(Q, K, V, causal, scale)
        assert out.dtype is dtype and lse.dtype is engine.float32
        assert _rel(_download(out), out_c) < tol
        lse_g = gpu.to_numpy(lse)
        finite = np.isfinite(lse_c)
        assert np.array_equal(np.isfinite(lse_g), finite)
        np.testing.assert_allclose(lse_g[finite], lse_c[finite], atol=tol * 10, rtol=tol)
        dq, dk, dv = gpu.attention_backward(G, Q, K, V, out, lse, causal, scale)
        for got, want, name in ((dq, dq_c, "dq"), (dk, dk_c, "dk"), (dv, dv_c, "dv")):
            assert got.dtype is dtype
            assert _rel(_download(got), want) < tol * 2, name
    finally:
        engine.cuda.set_allow_tf32(prev)


@pytest.mark.parametrize("dtype,tol", [(engine.float32, 1e-5), (engine.bfloat16, 3e-2)])
@pytest.mark.parametrize("causal", [True, False])
def test_attention_qkv_packed_matches_cpu(dtype, tol, causal, no_tf32):
    B, T, H, D = 2, 77, 4, 64
    rng = np.random.default_rng(3)
    qkv, g = (rng.standard_normal(s).astype(np.float32) for s in ((B, T, 3 * H * D), (B, T, H * D)))
    if dtype is engine.bfloat16:
        qkv, g = (_from_bf16_bits(_to_bf16_bits(a)).reshape(a.shape) for a in (qkv, g))
    scale = 1.0 / np.sqrt(D)
    out_c, lse_c, _ = cpu.attention_qkv(qkv, H, causal, scale)
    dqkv_c = cpu.attention_qkv_backward(g, qkv, out_c, lse_c, H, causal, scale)
    QKV, G = _upload(qkv, dtype), _upload(g, dtype)
    out, lse, _ = gpu.attention_qkv(QKV, H, causal, scale)
    assert out.shape == (B, T, H * D) and lse.shape == (B, H, T)
    assert _rel(_download(out), out_c) < tol
    dqkv = gpu.attention_qkv_backward(G, QKV, out, lse, H, causal, scale)
    assert dqkv.shape == (B, T, 3 * H * D)
    assert _rel(_download(dqkv), dqkv_c) < 2 * tol


@pytest.mark.parametrize("dtype,tol", [(engine.float32, 1e-5), (engine.bfloat16, 3e-2)])
@pytest.mark.parametrize("B,T,H,D,causal", [(2, 64, 4, 64, True), (3, 128, 2, 64, False), (2, 256, 3, 32, True),
                                            (2, 80, 2, 128, True), (1, 48, 5, 16, False), (2, 32, 2, 40, True)])
def test_attention_qkv_bias_grad_matches_column_sums(dtype, tol, B, T, H, D, causal, no_tf32):
    """The packed projection's bias gradient from the backward's own passes (dq's and dout's column
    sums, 0 for the keys) against the column sums of dqkv, on every kernel family (wgmma at D 64 and
    128 in bf16, the WMMA ones in float32), and dqkv the same as without it."""
    rng = np.random.default_rng(T + D)
    qkv, g = (rng.standard_normal(s).astype(np.float32) for s in ((B, T, 3 * H * D), (B, T, H * D)))
    if dtype is engine.bfloat16:
        qkv, g = (_from_bf16_bits(_to_bf16_bits(a)).reshape(a.shape) for a in (qkv, g))
    scale = 1.0 / np.sqrt(D)
    QKV, G = _upload(qkv, dtype), _upload(g, dtype)
    out, lse, _ = gpu.attention_qkv(QKV, H, causal, scale)
    plain = _download(gpu.attention_qkv_backward(G, QKV, out, lse, H, causal, scale))
    dqkv, db = gpu.attention_qkv_backward(G, QKV, out, lse, H, causal, scale, bias_grad=True)
    assert db is not None and db.dtype is engine.float32 and db.shape == (3 * H * D,)
    np.testing.assert_array_equal(_download(dqkv), plain)
    db = gpu.to_numpy(db)
    C = H * D
    want = plain.reshape(B * T, 3 * C).astype(np.float64).sum(axis=0)
    dq_tol = tol * np.abs(plain[..., :C]).sum(axis=(0, 1)).max()  # the rounding of the bf16 dq it sums
    np.testing.assert_allclose(db[:C], want[:C], atol=max(dq_tol, 1e-4), rtol=0, err_msg="db_q")
    np.testing.assert_array_equal(db[C:2 * C], 0.0)
    assert np.abs(want[C:2 * C]).max() < 2 * tol * np.abs(plain[..., C:2 * C]).sum(axis=(0, 1)).max() + 1e-3
    np.testing.assert_allclose(db[2 * C:], want[2 * C:], atol=tol * np.abs(g).sum(axis=(0, 1)).max() + 1e-4,
                               rtol=0, err_msg="db_v")
    cpu_out, cpu_lse, _ = cpu.attention_qkv(qkv, H, causal, scale)
    _, db_c = cpu.attention_qkv_backward(g, qkv, cpu_out, cpu_lse, H, causal, scale, bias_grad=True)
    assert _rel(db, db_c) < 2 * tol


def test_attention_qkv_bias_grad_declined_where_identities_fail():
    """Dropout (the identities fail) and T not a multiple of 16 (a block's rows span two heads) give no
    bias gradient; the caller sums dqkv."""
    B, T, H, D = 2, 40, 2, 32
    rng = np.random.default_rng(9)
    QKV = _upload(rng.standard_normal((B, T + 5, 3 * H * D)), engine.bfloat16)
    G = _upload(rng.standard_normal((B, T + 5, H * D)), engine.bfloat16)
    out, lse, _ = gpu.attention_qkv(QKV, H, True, 0.1)
    assert gpu.attention_qkv_backward(G, QKV, out, lse, H, True, 0.1, bias_grad=True)[1] is None
    QKV, G = _upload(rng.standard_normal((B, 48, 3 * H * D)), engine.bfloat16), _upload(
        rng.standard_normal((B, 48, H * D)), engine.bfloat16)
    out, lse, rng_key = gpu.attention_qkv(QKV, H, True, 0.1, dropout_p=0.2, seed=3)
    assert gpu.attention_qkv_backward(G, QKV, out, lse, H, True, 0.1, dropout_p=0.2, rng=rng_key,
                                      bias_grad=True)[1] is None


def test_projected_self_attention_matches_linear_then_attention():
    """F.projected_self_attention against F.self_attention(F.linear(...)) on the GPU under bf16 autocast
    (the GPT's path), the bias's float32 gradient included, and on the CPU in float64."""
    rng = np.random.default_rng(11)
    B, T, C, H = 2, 64, 128, 2
    arrays = [rng.standard_normal(s).astype(np.float32) * f for s, f in (((B, T, C), 1.0), ((3 * C, C), 0.1),
                                                                        ((3 * C,), 0.5), ((B, T, C), 1.0))]
    for dev, dt, tol in (("cuda", engine.bfloat16, 2e-2), ("cpu", engine.float64, 1e-10)):
        res = []
        for fused in (True, False):
            x, w, b = (engine.tensor(a, dtype=engine.float32 if dt is engine.bfloat16 else dt, device=dev,
                                     requires_grad=True) for a in arrays[:3])
            g = engine.tensor(arrays[3], device=dev)
            with engine.autocast("cuda", dtype=engine.bfloat16, enabled=dt is engine.bfloat16):
                y = (F.projected_self_attention(x, w, b, H) if fused else F.self_attention(F.linear(x, w, b), H))
            (y.float() * g).sum().backward()
            res.append([y.float().numpy(), x.grad.numpy(), w.grad.numpy(), b.grad.numpy()])
            assert b.grad.dtype is b.dtype
        for got, want, what in zip(res[0], res[1], ("out", "dx", "dw", "db")):
            assert _rel(got, want) < tol, (dev, what, _rel(got, want))


def test_attention_unfused_head_dim_falls_back(no_tf32):
    q, k, v, g = _inputs((2, 5, 4), (2, 7, 4), engine.float32, seed=0)  # D = 4: composite path
    out_c, lse_c, _ = cpu.attention(q, k, v, True, 0.5)
    out, lse, _ = gpu.attention(*(gpu.from_numpy(a) for a in (q, k, v)), True, 0.5)
    np.testing.assert_allclose(gpu.to_numpy(out), out_c, atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(gpu.to_numpy(lse), lse_c, atol=1e-5, rtol=1e-4)


def test_sdpa_and_self_attention_autograd_on_gpu(no_tf32):
    rng = np.random.default_rng(4)
    B, T, H, D = 2, 40, 2, 32
    qkv_np = rng.standard_normal((B, T, 3 * H * D)).astype(np.float32)
    res = {}
    for dev in ("cpu", "cuda"):
        qkv = engine.tensor(qkv_np, device=dev, requires_grad=True)
        y = F.self_attention(qkv, H)
        (y * y).sum().backward()
        res[dev] = (y.numpy(), qkv.grad.numpy())
    np.testing.assert_allclose(res["cuda"][0], res["cpu"][0], atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(res["cuda"][1], res["cpu"][1], atol=1e-4, rtol=1e-3)


def test_attention_keeps_no_scores_in_memory():
    # B*H = 8, T = 4096: a (T, T) float32 score matrix per head would be 512 MiB; q, k, v, out are 8 MiB each
    B, H, T, D = 1, 8, 4096, 64
    x = gpu.from_numpy(np.random.default_rng(5).standard_normal((B, H, T, D)).astype(np.float32))
    engine.cuda.synchronize()
    engine.cuda.reset_peak_memory_stats()
    base = engine.cuda.memory_allocated()
    out, lse, _ = gpu.attention(x, x, x, True, 0.125)
    dq, _, _ = gpu.attention_backward(out, x, x, x, out, lse, True, 0.125)
    engine.cuda.synchronize()
    assert engine.cuda.max_memory_allocated() - base < 64 * 2**20
    assert np.isfinite(gpu.to_numpy(dq)).all()
