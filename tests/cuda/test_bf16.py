"""bf16 mixed precision on the GPU: the bf16 kernels against float32, and a small GPT trained under
engine.autocast against the same GPT in float32.

Tolerances: bf16 has 8 significant bits (relative rounding 2^-9 = 2e-3 per value); kernels that
read bf16 and compute in float32 are compared at rtol 2e-2 after rounding the inputs on both sides;
the GPT loss within 2e-2 relative of float32, gradients with cosine similarity above 0.99."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.backends import cpu
from engine.backends import cuda as gpu
from engine.nn import GPT, GPTConfig

BF = engine.bfloat16
rng = np.random.default_rng(0)


def bf(a):
    """float32 numpy -> bf16 device array (and the rounded float32 values, for the reference)."""
    x = gpu.astype(gpu.from_numpy(np.asarray(a, dtype=np.float32)), BF)
    return x, gpu.to_numpy(gpu.astype(x, engine.float32))


def f32(x):
    return gpu.to_numpy(gpu.astype(x, engine.float32))


def close(got, want, rtol=2e-2, what=""):
    scale = max(1e-6, float(np.max(np.abs(want))))
    err = float(np.max(np.abs(np.asarray(got, np.float64) - want))) / scale
    assert err < rtol, f"{what}: max error {err:.2e} of the largest value"


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "maximum"])
def test_binary_bf16(op):
    a, ar = bf(rng.standard_normal((37, 64)))
    b, br = bf(rng.uniform(0.5, 2.0, (64,)))
    out = gpu.binary(op, a, b)
    assert out.dtype is BF and out.shape == (37, 64)
    close(f32(out), cpu.binary(op, ar, br), what=op)
    close(f32(gpu.binary(op, a, 1.5)), cpu.binary(op, ar, np.float32(1.5)), what=op + " scalar")
    c, cr = bf(rng.standard_normal((37, 64)))
    close(f32(gpu.binary(op, a, c)) if op != "div" else f32(gpu.binary(op, a, gpu.binary("add", c, 10.0))),
          cpu.binary(op, ar, cr) if op != "div" else cpu.binary(op, ar, cr + 10.0), what=op + " same shape")
    assert np.array_equal(gpu.to_numpy(gpu.binary("gt", a, c)), ar > cr)


@pytest.mark.parametrize("op", ["gelu", "relu", "exp", "tanh", "neg"])
def test_unary_bf16(op):
    x, xr = bf(rng.standard_normal(1001))
    close(f32(gpu.unary(op, x)), cpu.unary(op, xr), what=op)


@pytest.mark.parametrize("n", [4096, 1000, 13])  # 8 per thread; 8 per thread; the scalar kernel (n % 8 != 0)
def test_cast_float32_bf16_round_to_nearest_even(n):
    """float32 -> bf16 rounds to nearest even, bit for bit, and bf16 -> float32 is exact, on both the
    vectorised kernels and the scalar one."""
    x = (rng.standard_normal(n) * np.exp(rng.uniform(-20, 20, n))).astype(np.float32)
    x[:4] = [0.0, -0.0, 1.00390625, 1.01171875]  # ties: 1 + 2^-8 rounds down to 1, 1 + 3 * 2^-8 up
    u = x.view(np.uint32).astype(np.uint64)
    want_bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    b = gpu.astype(gpu.from_numpy(x), BF)
    back = gpu.to_numpy(gpu.astype(b, engine.float32))
    np.testing.assert_array_equal(back.view(np.uint32), want_bits.astype(np.uint32) << 16)


def test_gelu_backward_and_sum_bf16():
    x, xr = bf(rng.standard_normal((64, 96)))
    g, gr = bf(rng.standard_normal((64, 96)))
    close(f32(gpu.gelu_backward(x, g)), cpu.gelu_backward(xr, gr), what="gelu_backward")
    close(f32(gpu.sum(x, (0,), False)), xr.sum(axis=0), rtol=3e-2, what="sum axis 0")
    close(f32(gpu.sum(x, (1,), True)), xr.sum(axis=1, keepdims=True), rtol=3e-2, what="sum axis 1")


def test_matmul_bf16():
    a, ar = bf(rng.standard_normal((70, 48)))
    b, br = bf(rng.standard_normal((80, 48)))
    out = gpu.matmul(a, b, transpose_b=True)
    assert out.dtype is BF
    close(f32(out), ar @ br.T, what="matmul")


# 16-byte chunks a row: 48, 96, 128, 25 (2, 3, 4, 1 warps to a row in the backward); 36: per column.
# 20001 rows: many to each of the backward's groups of warps
@pytest.mark.parametrize("N", [33, 20001])
@pytest.mark.parametrize("C", [384, 768, 1024, 200, 36])
def test_layer_norm_bf16(C, N):
    x, xr = bf(rng.standard_normal((N, C)) * 3 + 1)
    w, b = rng.standard_normal(C).astype(np.float32), rng.standard_normal(C).astype(np.float32)
    out, mean, rstd = gpu.layer_norm(x, gpu.from_numpy(w), gpu.from_numpy(b), 1e-5)
    ref, rmean, rrstd = cpu.layer_norm(xr, w, b, 1e-5)
    assert out.dtype is BF and mean.dtype is engine.float32
    close(f32(out), ref, what="layer_norm")
    np.testing.assert_allclose(gpu.to_numpy(rstd), rrstd, rtol=1e-4)
    g, gr = bf(rng.standard_normal((N, C)))
    dx, dw, db = gpu.layer_norm_backward(g, x, gpu.from_numpy(w), mean, rstd)
    rdx, rdw, rdb = cpu.layer_norm_backward(gr, xr, w, rmean, rrstd)
    assert dx.dtype is BF and dw.dtype is engine.float32
    close(f32(dx), rdx, what="dx")
    close(gpu.to_numpy(dw), rdw, rtol=1e-3, what="dw")
    close(gpu.to_numpy(db), rdb, rtol=1e-3, what="db")


@pytest.mark.parametrize("V", [65, 1024])  # 1024: rows read 16 bytes at a time
def test_cross_entropy_bf16(V):
    logits, lr = bf(rng.standard_normal((50, V)) * 3)
    t = rng.integers(0, V, 50)
    t[3] = -1
    tg = gpu.from_numpy(t)
    losses, lse = gpu.cross_entropy(logits, tg, -1)
    rl, rlse = cpu.cross_entropy(lr, t, -1)
    assert losses.dtype is engine.float32
    np.testing.assert_allclose(gpu.to_numpy(losses), rl, atol=1e-4, rtol=1e-4)
    g = gpu.from_numpy(np.full(50, 0.02, np.float32))
    d = gpu.cross_entropy_backward(logits, tg, lse, g, -1)
    assert d.dtype is BF
    close(f32(d), cpu.cross_entropy_backward(lr, t, rlse, np.full(50, 0.02, np.float32), -1), what="dlogits")


def _gpt_loss_and_grads(model, x, y, autocast: bool):
    model.zero_grad()
    with engine.autocast("cuda", dtype=BF, enabled=autocast):
        logits, loss = model(x, y, return_logits=True)
    loss.backward()
    return loss, logits, {n: p.grad.numpy() for n, p in model.named_parameters()}


@pytest.mark.parametrize("n_embd,n_head", [(128, 4), (96, 2)])  # head dims 32 (fused) and 48 (fused, padded)
def test_gpt_autocast_bf16_matches_float32(n_embd, n_head):
    cfg = GPTConfig(vocab_size=65, block_size=64, n_layer=2, n_head=n_head, n_embd=n_embd, dropout=0.0)
    engine.manual_seed(0)
    model = GPT(cfg).to("cuda")
    data = np.random.default_rng(1).integers(0, 65, (8, 65))
    x, y = engine.tensor(data[:, :-1], device="cuda"), engine.tensor(data[:, 1:], device="cuda")
    l32, _, g32 = _gpt_loss_and_grads(model, x, y, False)
    l16, logits16, g16 = _gpt_loss_and_grads(model, x, y, True)
    assert l16.dtype == engine.float32 and logits16.dtype == BF
    assert abs(l16.item() - l32.item()) < 2e-2 * abs(l32.item()), (l16.item(), l32.item())
    for name, p in model.named_parameters():
        assert p.dtype == engine.float32 and p.grad.dtype == engine.float32, name
        a, b = g16[name].ravel().astype(np.float64), g32[name].ravel().astype(np.float64)
        cos = a @ b / max(1e-30, np.linalg.norm(a) * np.linalg.norm(b))
        assert cos > 0.99, (name, cos)
    # and it trains: a few AdamW steps under autocast lower the loss
    opt = engine.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    first = None
    for _ in range(15):
        with engine.autocast("cuda"):
            _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
    assert loss.item() < 0.95 * first
