"""The Linear layer's fused GEMM epilogues (bias, GELU with the pre-activation kept) and its bias
gradient (engine's column-sum kernel, fused with the GELU backward; cuBLASLt's BGRADB epilogue where
the kernel does not apply) against the unfused ops, forward and backward, float32 and bf16.

float32 runs with TF32 off and is compared with the CPU backend's unfused reference at rtol 1e-4 and
an atol of 2e-6 of the largest value (dw and db sum hundreds of rows, in another order than numpy); bf16 is compared with float32 on bf16-rounded inputs at 2e-2 of the largest value."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.backends import cpu
from engine.backends import cuda as gpu
from engine._native import native as _C
from engine.backends.cuda import _CODE
from engine.backends.cuda.elementwise import gelu_backward
from engine.backends.cuda.matmul import _EPI_BGRAD, _EPI_BIAS, _EPI_DGELU, _EPI_GELU_BIAS, _dx_through_gelu

BF = engine.bfloat16
rng = np.random.default_rng(0)

# (N, I, O): rows, in features, out features; O % 8 == 0 so cuBLASLt's GELU epilogue applies
SHAPES = [(64, 32, 48), (300, 96, 128), (1, 16, 8)]


def _inputs(N, I, O):
    x = rng.standard_normal((N, I)).astype(np.float32)
    w = (rng.standard_normal((O, I)) / np.sqrt(I)).astype(np.float32)
    b = rng.standard_normal(O).astype(np.float32)
    g = rng.standard_normal((N, O)).astype(np.float32)
    return x, w, b, g


def _unfused_reference(x, w, b, g, activation):
    """The CPU backend's ops one by one: matmul, add, gelu; gelu_backward, matmuls, column sum."""
    pre = cpu.matmul(x, w, transpose_b=True)
    if b is not None:
        pre = cpu.binary("add", pre, b)
    out = cpu.unary("gelu", pre) if activation else pre
    gp = cpu.gelu_backward(pre, g) if activation else g
    return out, pre, cpu.matmul(gp, w), cpu.matmul(gp, x, transpose_a=True), gp.sum(0)


def _dev(*arrays):
    return [gpu.from_numpy(a) if a is not None else None for a in arrays]


@pytest.mark.parametrize("activation", [None, "gelu"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", SHAPES)
def test_linear_float32_matches_unfused(shape, bias, activation, no_tf32):
    x, w, b, g = _inputs(*shape)
    b = b if bias else None
    want_out, want_pre, want_dx, want_dw, want_db = _unfused_reference(x, w, b, g, activation)
    xd, wd, bd, gd = _dev(x, w, b, g)
    out, pre = gpu.linear(xd, wd, bd, activation)

    def close(got, want, what):
        np.testing.assert_allclose(gpu.to_numpy(got), want, rtol=1e-4, atol=2e-6 * np.max(np.abs(want)), err_msg=what)

    close(out, want_out, "forward")
    if activation:
        close(pre, want_pre, "pre-activation")
    dx, dw, db = gpu.linear_backward(gd, xd, wd, pre, activation, (True, True, bias))
    close(dx, want_dx, "dx")
    close(dw, want_dw, "dw")
    if bias:
        close(db, want_db, "db")
    else:
        assert db is None


@pytest.mark.parametrize("activation", [None, "gelu"])
def test_linear_bf16_matches_float32(activation):
    x, w, b, g = _inputs(256, 64, 192)
    xb, wb, bb, gb = (gpu.astype(a, BF) for a in _dev(x, w, b, g))
    xr, wr, br, gr = (gpu.to_numpy(gpu.astype(a, engine.float32)) for a in (xb, wb, bb, gb))
    want = _unfused_reference(xr, wr, br, gr, activation)
    out, pre = gpu.linear(xb, wb, bb, activation)
    dx, dw, db = gpu.linear_backward(gb, xb, wb, pre, activation, (True, True, True))
    assert out.dtype is BF and dx.dtype is BF and dw.dtype is BF and db.dtype is BF
    for got, ref, what in zip((out, dx, dw, db), (want[0], want[2], want[3], want[4]), ("out", "dx", "dw", "db")):
        got = gpu.to_numpy(gpu.astype(got, engine.float32))
        err = np.max(np.abs(got - ref)) / max(1e-6, np.max(np.abs(ref)))
        assert err < 2e-2, f"{what}: max error {err:.2e} of the largest value"


@pytest.mark.parametrize("dtype", [engine.float32, BF])
def test_epilogues_are_offered_for_gpt_shapes(dtype):
    """cuBLASLt runs each epilogue fused at a GPT's shapes (else linear() would silently fall back)."""
    N, I, O = 512, 384, 1536
    x, w = gpu.full((N, I), 0.5, dtype), gpu.full((O, I), 0.25, dtype)
    out, pre, bias, g = (gpu.full(s, 0.0, dtype) for s in ((N, O), (N, O), (O,), (N, O)))
    dev, code = x.device, _CODE[dtype]
    for epi in (1, 2, 4):  # bias, gelu + bias, gelu
        assert _C.matmul_epilogue(dev, code, epi, out.ptr, x.ptr, w.ptr, N, O, I, False, True, bias.ptr, pre.ptr), epi
    dw = gpu.full((O, I), 0.0, dtype)
    assert _C.matmul_epilogue(dev, code, 3, dw.ptr, g.ptr, x.ptr, O, I, N, True, False, bias.ptr, 0)


def test_linear_gelu_through_autograd_matches_composite(no_tf32):
    """F.linear(activation="gelu") and gelu(linear()) give the same gradients on the GPU (float32:
    engine's GELU kernel after the bias epilogue, so the same arithmetic)."""
    import engine.nn.functional as F

    x, w, b, _ = _inputs(96, 32, 64)
    grads = []
    for fused in (True, False):
        xs = [engine.tensor(a, device="cuda", requires_grad=True) for a in (x, w, b)]
        y = F.linear(*xs, activation="gelu") if fused else F.gelu(F.linear(*xs))
        (y * y).sum().backward()
        grads.append([t.grad.numpy() for t in xs])
    for got, want in zip(*grads):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)


def test_bf16_gelu_epilogue_within_bf16_rounding():
    """In bf16 the GELU is cuBLASLt's: within bf16 rounding of engine's float32 GELU of the same pre."""
    x, w, b, _ = _inputs(128, 64, 256)
    xb, wb, bb = (gpu.astype(a, BF) for a in _dev(x, w, b))
    out, pre = gpu.linear(xb, wb, bb, "gelu")
    want = cpu.unary("gelu", gpu.to_numpy(gpu.astype(pre, engine.float32)))
    got = gpu.to_numpy(gpu.astype(out, engine.float32))
    np.testing.assert_allclose(got, want, rtol=8e-3, atol=1e-3)



# (N, O): rows summed (chunked over blocks: many, a few, fewer than a block's 8 row lanes) and widths
# (one partial column strip; several strips)
BIAS_GRAD_SHAPES = [(5000, 768), (300, 136), (3, 64), (1, 8)]


@pytest.mark.parametrize("gelu", [False, True])
@pytest.mark.parametrize("shape", BIAS_GRAD_SHAPES)
@pytest.mark.parametrize("dtype", [engine.float32, BF])
def test_bias_grad_kernel_matches_column_sums(dtype, shape, gelu):
    """db = column sums of g (after the GELU backward when fused), summed in float32: against float64
    numpy on the same (bf16-rounded) inputs; dpre against engine's GELU backward kernel."""
    N, O = shape
    g = gpu.astype(gpu.from_numpy(rng.standard_normal((N, O)).astype(np.float32)), dtype)
    pre = gpu.astype(gpu.from_numpy(rng.standard_normal((N, O)).astype(np.float32)), dtype) if gelu else None
    db, dpre, _ = gpu._bias_grad(g, pre)
    assert db is not None and db.dtype is dtype and db.shape == (O,)
    if gelu:
        want_dpre = gpu.gelu_backward(pre, g)  # engine's unfused kernel, same dtype
        tol = 1e-6 if dtype is engine.float32 else 1e-2
        np.testing.assert_allclose(gpu.to_numpy(gpu.astype(dpre, engine.float32)),
                                   gpu.to_numpy(gpu.astype(want_dpre, engine.float32)), rtol=tol, atol=tol)
        summed = gpu.to_numpy(gpu.astype(want_dpre, engine.float32)).astype(np.float64)
    else:
        assert dpre is None
        summed = gpu.to_numpy(gpu.astype(g, engine.float32)).astype(np.float64)
    want = summed.sum(0)
    got = gpu.to_numpy(gpu.astype(db, engine.float32))
    # float32 sums; bf16: the result rounded to bf16, and the fused sums use the unrounded dpre
    tol = (1e-5 if dtype is engine.float32 else 1e-2) * max(1.0, np.max(np.abs(want)))
    np.testing.assert_allclose(got, want, atol=tol, rtol=1e-5 if dtype is engine.float32 else 1e-2)


def test_bias_grad_falls_back_on_odd_widths(no_tf32):
    """A bf16 width that is not a multiple of 8 (16 bytes) is refused by the kernel; linear_backward
    then takes cuBLASLt's BGRADB epilogue or the column sum, with the same result."""
    N, I, O = 40, 16, 12
    g = gpu.astype(gpu.from_numpy(rng.standard_normal((N, O)).astype(np.float32)), BF)
    assert gpu._bias_grad(g) == (None, None, None)
    x, w, _, _ = _inputs(N, I, O)
    xb, wb = (gpu.astype(a, BF) for a in _dev(x, w))
    _, _, db = gpu.linear_backward(g, xb, wb, None, None, (False, True, True))
    want = gpu.to_numpy(gpu.astype(g, engine.float32)).astype(np.float64).sum(0)
    np.testing.assert_allclose(gpu.to_numpy(gpu.astype(db, engine.float32)), want, rtol=1e-2, atol=1e-2)


def _f32(x) -> np.ndarray:
    return gpu.to_numpy(gpu.astype(x, engine.float32))


@pytest.mark.parametrize("N,I,H", [(256, 64, 256), (64, 32, 96), (37, 16, 40)])
def test_dgelu_epilogue_matches_gelu_backward(N, I, H):
    """The MLP's second layer's dx through cuBLASLt's DGELU epilogue (gelu'(pre) * (g @ w), bf16)
    against the plain GEMM then engine's GELU backward, within bf16's rounding of the one result."""
    g = gpu.astype(gpu.from_numpy(rng.standard_normal((N, I)).astype(np.float32)), BF)
    w = gpu.astype(gpu.from_numpy((rng.standard_normal((I, H)) / np.sqrt(I)).astype(np.float32)), BF)
    pre = gpu.astype(gpu.from_numpy(rng.standard_normal((N, H)).astype(np.float32) * 2.0), BF)
    want = _f32(gelu_backward(pre, gpu.matmul(g, w)))
    got = _f32(_dx_through_gelu(g, w, pre))
    assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()


@pytest.mark.parametrize("bias", [True, False])
def test_mlp_op_matches_two_linears(bias):
    """F.mlp (the GELU's backward in the second layer's dx GEMM) against F.linear twice, under bf16
    autocast on the GPU, forward and every gradient (float32 for the master weights)."""
    import engine.nn.functional as F

    r = np.random.default_rng(5)
    shapes = [(4, 64, 96), (384, 96), (384,), (96, 384), (96,)]
    arrays = [r.standard_normal(s).astype(np.float32) * (0.1 if len(s) == 2 else 1.0) for s in shapes]
    res = []
    for fused in (True, False):
        ts = [engine.tensor(a, device="cuda", requires_grad=True) for a in arrays]
        x, w1, b1, w2, b2 = ts if bias else (ts[0], ts[1], None, ts[3], None)
        with engine.autocast("cuda", dtype=BF):
            y = F.mlp(x, w1, b1, w2, b2) if fused else F.linear(F.linear(x, w1, b1, activation="gelu"), w2, b2)
        (y.float() ** 2).sum().backward()
        res.append([y.float().numpy()] + [t.grad.numpy() for t in (x, w1, b1, w2, b2) if t is not None])
        assert all(t.grad.dtype is engine.float32 for t in (w1, w2))
    for i, (got, want) in enumerate(zip(*res)):
        assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max(), i


# (epilogue, M, N, K) for the autotuning tests: new shapes (a plan's first call is the one that tunes),
# large enough that cuBLASLt offers several algorithms
_TUNED = [(_EPI_BIAS, 1024, 512, 384), (_EPI_GELU_BIAS, 1000, 520, 392), (_EPI_BGRAD, 392, 520, 1000),
          (_EPI_DGELU, 1016, 528, 400)]


@pytest.mark.parametrize("epilogue,M,N,K", _TUNED)
def test_autotuned_plan_writes_what_its_later_calls_do(epilogue, M, N, K):
    """A plan's first call times each of cuBLASLt's candidate algorithms on the call's own operands
    (ENGINE_MATMUL_AUTOTUNE, epilogue plans by default) before running the fastest: c, the bias
    gradient (BGRAD) and the pre-activation (GELU_BIAS) it leaves are bit for bit what the same call
    writes again, and within bf16 rounding of the unfused ops (test_dgelu_epilogue_matches_gelu_backward
    and the tests above)."""
    r = np.random.default_rng(epilogue)

    def dev(*shape, fill=None):
        x = np.full(shape, fill, np.float32) if fill is not None else r.standard_normal(shape).astype(np.float32)
        return gpu.astype(gpu.from_numpy(x), BF)

    bgrad, dgelu = epilogue == _EPI_BGRAD, epilogue == _EPI_DGELU
    if bgrad:  # c (M, N) = a^T b, a (K, M), b (K, N); the bias gradient (M,) the row sums of a^T, written
        a, b, ta, tb = dev(K, M), dev(K, N), True, False
    else:  # c (M, N) = a (M, K) b^T with b (N, K); DGELU: a (M, K) b with b (K, N)
        a, b, ta, tb = dev(M, K), (dev(K, N) if dgelu else dev(N, K)), False, not dgelu
    bias = None if bgrad else dev(N)
    aux = dev(M, N) if epilogue in (_EPI_GELU_BIAS, _EPI_DGELU) else None  # written by GELU_BIAS, read by DGELU

    def call():
        c, db = dev(M, N, fill=np.nan), dev(M, fill=np.nan)
        assert _C.matmul_epilogue(0, _CODE[BF], epilogue, c.ptr, a.ptr, b.ptr, M, N, K, ta, tb,
                                  db.ptr if bgrad else bias.ptr, aux.ptr if aux is not None else 0)
        return [_f32(c)] + ([_f32(db)] if bgrad else [_f32(aux)] if epilogue == _EPI_GELU_BIAS else [])

    first, second = call(), call()
    for x, y in zip(first, second):
        assert np.isfinite(x).all()
        np.testing.assert_array_equal(x, y)


def test_autotune_log_names_each_tuned_plan():
    """ENGINE_MATMUL_AUTOTUNE_LOG=1 prints a tuned plan's shape and timings; ENGINE_MATMUL_AUTOTUNE=0
    tunes nothing (the heuristic's first choice), so prints nothing."""
    import os
    import subprocess
    import sys

    script = ("import numpy as np, engine; from engine.backends import cuda as gpu; "
              "from engine.backends.cuda.matmul import _dx_through_gelu; BF = engine.bfloat16; "
              "d = lambda *s: gpu.astype(gpu.from_numpy(np.ones(s, np.float32)), BF); "
              "_dx_through_gelu(d(2048, 768), d(768, 3072), d(2048, 3072)); gpu.synchronize()")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    logs = {}
    for mode in ("epilogue", "0"):
        env = dict(os.environ, ENGINE_MATMUL_AUTOTUNE=mode, ENGINE_MATMUL_AUTOTUNE_LOG="1", PYTHONPATH=root)
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        logs[mode] = out.stderr
    assert "engine matmul autotune M=2048 N=3072 K=768" in logs["epilogue"] and "epilogue=5" in logs["epilogue"]
    assert "autotune" not in logs["0"]


def test_autotune_rejects_an_unknown_setting():
    """A value other than 0, 1 or epilogue (a user's guess such as "off") is an error naming the choices,
    raised by the first matmul, never a silent fallback to the default."""
    import os
    import subprocess
    import sys

    script = ("import numpy as np, engine; from engine.backends import cuda as gpu; "
              "a = gpu.from_numpy(np.ones((64, 64), np.float32)); gpu.matmul(a, a); gpu.synchronize()")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, ENGINE_MATMUL_AUTOTUNE="off", PYTHONPATH=root)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "ValueError: ENGINE_MATMUL_AUTOTUNE='off' is not a setting: use 0" in out.stderr, out.stderr
