"""F.linear under engine.autocast with float32 master weights: the weight and bias go into the Linear
op themselves (no cast node in the graph); the op casts them to bf16 once for its GEMM, and the
backward writes dw and db in float32 directly (the weight gradient's GEMM with a float32 output, the
bias-gradient kernel's float32 sums) while dx stays bf16.

Inputs: x and the output's gradient are bf16 values; the weight and bias float32. Compared with
- the old formulation (weight.type(bf16), bias.type(bf16), the op in bf16, the gradients cast back to
  float32): within bf16 rounding, 2e-2 of the largest value;
- a float64 reference on the bf16-rounded x, weight and gradient: within 2e-2 of the largest value;
  without an activation, dw and db within 1e-4 of it (float32 sums of exact bf16 products), which a
  bf16 dw or db cast to float32 (rounding ~2e-3 of the largest value) does not reach.
"""
from __future__ import annotations

import numpy as np
import pytest

import engine
import engine.nn.functional as F
from engine.backends import cpu
from engine._native import native
from engine.backends import cuda as gpu
from engine.ops.matmul import Linear

BF = engine.bfloat16
F32 = engine.float32

# x shape (..., I), O: GPT-like widths; several rows dims; widths that are not a multiple of 8 (the
# bias-gradient kernel and cuBLASLt's GELU epilogue refuse them: BGRADB or the unfused ops run) and an
# odd in-feature count
SHAPES = [((64, 32), 48), ((4, 75, 96), 128), ((1, 16), 8), ((40, 24), 12), ((3, 11, 17), 20)]


def _round_bf16(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to bf16 (as float32), through the GPU's cast."""
    return gpu.to_numpy(gpu.astype(gpu.astype(gpu.from_numpy(np.asarray(a, np.float32)), BF), F32))


def _inputs(x_shape, O, seed=0):
    r = np.random.default_rng(seed)
    I = x_shape[-1]
    x = _round_bf16(r.standard_normal(x_shape))
    w = (r.standard_normal((O, I)) / np.sqrt(I)).astype(np.float32)
    b = r.standard_normal(O).astype(np.float32)
    g = _round_bf16(r.standard_normal(x_shape[:-1] + (O,)))
    return x, w, b, g


def _leaves(x, w, b):
    """x a bf16 leaf (the activation), w and b float32 leaves (the master weights), all requiring grad."""
    xt = engine.tensor(x, device="cuda").type(BF).detach().requires_grad_()
    wt = engine.tensor(w, device="cuda", requires_grad=True)
    bt = engine.tensor(b, device="cuda", requires_grad=True) if b is not None else None
    return xt, wt, bt


def _autocast(x, w, b, g, activation):
    """-> (out, dx, dw, db) of F.linear under autocast (the new path); db None without a bias."""
    xt, wt, bt = _leaves(x, w, b)
    with engine.autocast("cuda", dtype=BF):
        y = F.linear(xt, wt, bt, activation=activation)
    y.backward(engine.tensor(g, device="cuda").type(BF))
    return y, xt.grad, wt.grad, (bt.grad if bt is not None else None)


def _old_formulation(x, w, b, g, activation):
    """The same through explicit casts: weight.type(bf16) (and bias), the op on bf16, the gradients
    coming back through the casts' backward."""
    xt, wt, bt = _leaves(x, w, b)
    with engine.autocast("cuda", dtype=BF):
        args = (xt, wt.type(BF)) + ((bt.type(BF),) if bt is not None else ())
        y = Linear.apply(*args, activation=activation)
    y.backward(engine.tensor(g, device="cuda").type(BF))
    return y, xt.grad, wt.grad, (bt.grad if bt is not None else None)


def _reference(x, w, b, g, activation):
    """float64 on the bf16-rounded x, weight (what the GEMM reads) and gradient: (out, dx, dw, db)."""
    I, O = x.shape[-1], w.shape[0]
    x2, g2 = x.reshape(-1, I).astype(np.float64), g.reshape(-1, O).astype(np.float64)
    wr = _round_bf16(w).astype(np.float64)
    pre = x2 @ wr.T + (b.astype(np.float64) if b is not None else 0.0)
    out, gp = pre, g2
    if activation:
        out = cpu.unary("gelu", pre)
        gp = cpu.gelu_backward(pre, g2)
    return (out.reshape(x.shape[:-1] + (O,)), (gp @ wr).reshape(x.shape), gp.T @ x2,
            gp.sum(0) if b is not None else None)


def _err(got, want) -> float:
    """Max error as a fraction of the largest reference value."""
    got = got.numpy() if isinstance(got, engine.Tensor) else got
    got = np.asarray(got, np.float64)
    return float(np.max(np.abs(got - want))) / max(1e-6, float(np.max(np.abs(want))))


def _as_f32(t: engine.Tensor) -> np.ndarray:
    return t.float().numpy()


@pytest.mark.parametrize("activation", [None, "gelu"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("x_shape,O", SHAPES)
def test_autocast_linear_gradients_float32_and_as_before(x_shape, O, bias, activation):
    x, w, b, g = _inputs(x_shape, O)
    b = b if bias else None
    y, dx, dw, db = _autocast(x, w, b, g, activation)
    y_old, dx_old, dw_old, db_old = _old_formulation(x, w, b, g, activation)
    ref = _reference(x, w, b, g, activation)

    assert y.dtype is BF and y.shape == x_shape[:-1] + (O,)
    assert dx.dtype is BF and dw.dtype is F32 and dw.shape == w.shape
    assert dw_old.dtype is F32  # the old formulation's cast brought its bf16 dw back to float32
    pairs = [("out", _as_f32(y), _as_f32(y_old), ref[0]), ("dx", _as_f32(dx), _as_f32(dx_old), ref[1]),
             ("dw", dw.numpy(), dw_old.numpy(), ref[2])]
    if bias:
        assert db.dtype is F32 and db.shape == (O,)
        pairs.append(("db", db.numpy(), db_old.numpy(), ref[3]))
    for what, got, old, want in pairs:
        assert _err(got, old) < 2e-2, f"{what}: {_err(got, old):.2e} from the old formulation"
        assert _err(got, want) < 2e-2, f"{what}: {_err(got, want):.2e} from float64"


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("x_shape,O", [((64, 32), 48), ((4, 75, 96), 128), ((3, 11, 17), 24)])
def test_autocast_weight_gradients_written_in_float32(x_shape, O, bias):
    """dw = g^T x and db = column sums of g, with g and x exact bf16 values: float32 accumulation
    written as float32 is within 1e-4 of float64; a bf16 result cast to float32 is not."""
    x, w, b, g = _inputs(x_shape, O, seed=1)
    b = b if bias else None
    _, _, dw, db = _autocast(x, w, b, g, None)
    _, _, want_dw, want_db = _reference(x, w, b, g, None)
    assert _err(dw, want_dw) < 1e-4, f"dw: {_err(dw, want_dw):.2e} from float64 (bf16-rounded?)"
    if bias:
        assert _err(db, want_db) < 1e-4, f"db: {_err(db, want_db):.2e} from float64 (bf16-rounded?)"


@pytest.mark.parametrize("activation", [None, "gelu"])
@pytest.mark.parametrize("bias", [True, False])
def test_autocast_linear_takes_the_master_weights_without_casts(bias, activation):
    """The Linear node's parents are the float32 weight and bias themselves (no cast node whose
    backward would run a bf16 -> float32 kernel); the output is bf16 as before."""
    x, w, b, _ = _inputs((16, 32), 64)
    xt, wt, bt = _leaves(x, w, b if bias else None)
    with engine.autocast("cuda", dtype=BF):
        y = F.linear(xt, wt, bt, activation=activation)
    assert y.dtype is BF
    assert y._ctx is not None and isinstance(y._ctx, Linear)
    assert y._ctx.parents[0] is xt and y._ctx.parents[1] is wt
    if bias:
        assert y._ctx.parents[2] is bt
    assert wt.dtype is F32 and (bt is None or bt.dtype is F32)  # the master weights are untouched


def test_autocast_linear_float32_input_and_no_grad():
    """A float32 input is cast to bf16 (its gradient comes back float32); under no_grad the forward
    alone runs and gives the same bf16 output."""
    x, w, b, g = _inputs((32, 40), 24)
    xt = engine.tensor(x, device="cuda", requires_grad=True)
    wt = engine.tensor(w, device="cuda", requires_grad=True)
    bt = engine.tensor(b, device="cuda", requires_grad=True)
    with engine.autocast("cuda", dtype=BF):
        y = F.linear(xt, wt, bt)
        with engine.no_grad():
            y_inference = F.linear(xt, wt, bt)
    y.backward(engine.tensor(g, device="cuda").type(BF))
    assert y.dtype is BF and y_inference.dtype is BF
    np.testing.assert_array_equal(_as_f32(y), _as_f32(y_inference))
    assert xt.grad.dtype is F32 and wt.grad.dtype is F32 and bt.grad.dtype is F32
    _, want_dx, want_dw, want_db = _reference(x, w, b, g, None)
    for what, got, want in (("dx", xt.grad, want_dx), ("dw", wt.grad, want_dw), ("db", bt.grad, want_db)):
        assert _err(got, want) < 2e-2, f"{what}: {_err(got, want):.2e}"


def test_bf16_weights_under_autocast_unchanged():
    """bf16 weights (a model converted to bf16) take the plain path: bf16 gradients, as before."""
    x, w, b, g = _inputs((32, 64), 48)
    xt = engine.tensor(x, device="cuda").type(BF).detach()
    wt = engine.tensor(w, device="cuda").type(BF).detach().requires_grad_()
    bt = engine.tensor(b, device="cuda").type(BF).detach().requires_grad_()
    with engine.autocast("cuda", dtype=BF):
        y = F.linear(xt, wt, bt)
    y.backward(engine.tensor(g, device="cuda").type(BF))
    assert y.dtype is BF and wt.grad.dtype is BF and bt.grad.dtype is BF


def test_float32_linear_outside_autocast_unchanged(no_tf32):
    """Outside autocast nothing is cast: float32 output and gradients, as the CPU backend's."""
    x, w, b, g = _inputs((4, 10, 32), 40)
    grads = {}
    for device in ("cpu", "cuda"):
        xt, wt, bt = (engine.tensor(a, device=device, requires_grad=True) for a in (x, w, b))
        y = F.linear(xt, wt, bt, activation="gelu")
        assert y.dtype is F32
        y.backward(engine.tensor(g, device=device))
        grads[device] = [y.numpy()] + [t.grad.numpy() for t in (xt, wt, bt)]
        assert all(t.grad.dtype is F32 for t in (xt, wt, bt))
    for got, want in zip(grads["cuda"], grads["cpu"]):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(1.0, np.max(np.abs(want))))


# ---- the backend pieces ---------------------------------------------------------------------------

@pytest.mark.parametrize("activation", [None, "gelu"])
@pytest.mark.parametrize("O", [48, 12])  # 12: not a multiple of 8, the column-sum kernel refuses it
def test_linear_backward_param_dtype_float32(O, activation):
    """gpu.linear_backward with param_dtype float32 on bf16 operands: float32 dw and db, bf16 dx."""
    N, I = 96, 40
    r = np.random.default_rng(2)
    x = gpu.astype(gpu.from_numpy(r.standard_normal((N, I)).astype(np.float32)), BF)
    w = gpu.astype(gpu.from_numpy((r.standard_normal((O, I)) / np.sqrt(I)).astype(np.float32)), BF)
    b = gpu.astype(gpu.from_numpy(r.standard_normal(O).astype(np.float32)), BF)
    g = gpu.astype(gpu.from_numpy(r.standard_normal((N, O)).astype(np.float32)), BF)
    out, pre = gpu.linear(x, w, b, activation)
    assert out.dtype is BF and (pre is None or pre.dtype is BF)
    dx, dw, db = gpu.linear_backward(g, x, w, pre, activation, (True, True, True), param_dtype=F32)
    assert dx.dtype is BF and dw.dtype is F32 and db.dtype is F32
    xr, wr, gr = (gpu.to_numpy(gpu.astype(a, F32)).astype(np.float64) for a in (x, w, g))
    pre_r = xr @ wr.T + gpu.to_numpy(gpu.astype(b, F32))
    gp = cpu.gelu_backward(pre_r, gr) if activation else gr
    for what, got, want in (("dx", gpu.to_numpy(gpu.astype(dx, F32)), gp @ wr), ("dw", gpu.to_numpy(dw), gp.T @ xr),
                            ("db", gpu.to_numpy(db), gp.sum(0))):
        assert _err(got, want) < 2e-2, f"{what}: {_err(got, want):.2e}"
    # the old dtypes without param_dtype
    _, dw16, db16 = gpu.linear_backward(g, x, w, pre, activation, (False, True, True))
    assert dw16.dtype is BF and db16.dtype is BF


@pytest.mark.parametrize("gelu", [False, True])
@pytest.mark.parametrize("shape", [(5000, 768), (300, 136), (3, 64)])
def test_bias_grad_kernel_writes_float32(shape, gelu):
    """bf16 g, float32 db: the float32 column sums themselves (within 1e-5 of float64), not rounded
    to bf16."""
    N, O = shape
    r = np.random.default_rng(3)
    g = gpu.astype(gpu.from_numpy(r.standard_normal((N, O)).astype(np.float32)), BF)
    pre = gpu.astype(gpu.from_numpy(r.standard_normal((N, O)).astype(np.float32)), BF) if gelu else None
    db, dpre, _ = gpu._bias_grad(g, pre, F32)
    assert db is not None and db.dtype is F32 and db.shape == (O,)
    gr = gpu.to_numpy(gpu.astype(g, F32)).astype(np.float64)
    if gelu:
        assert dpre.dtype is BF
        want = cpu.gelu_backward(gpu.to_numpy(gpu.astype(pre, F32)).astype(np.float64), gr).sum(0)
        tol = 1e-4  # float32 GELU derivative against float64
    else:
        assert dpre is None
        want = gr.sum(0)
        tol = 1e-5
    assert _err(gpu.to_numpy(db), want) < tol, f"db: {_err(gpu.to_numpy(db), want):.2e} from float64"


def test_float32_out_gemm_refuses_other_dtypes():
    """out_dtype float32 is for bf16 operands only: a float32 GEMM asked for a bf16 output raises."""
    a = gpu.from_numpy(np.ones((4, 8), np.float32))
    c = gpu.from_numpy(np.zeros((4, 4), np.float32))
    with pytest.raises(Exception, match="cannot write"):
        native.matmul(a.device, gpu._CODE[F32], c.ptr, a.ptr, a.ptr, 1, 4, 4, 8, False, True, 0, 0, 0,
                      out_dtype=gpu._CODE[BF])
