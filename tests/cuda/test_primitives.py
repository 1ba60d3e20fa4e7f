"""Every primitive of the CUDA backend against the CPU backend (the reference), on the same inputs.

Tolerances: see conftest.py; a test that needs looser ones says so."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.backends import cpu
from engine.backends import cuda as gpu

F32 = engine.float32


def G(a):
    return gpu.from_numpy(np.asarray(a))


def H(x):
    return gpu.to_numpy(x)


def close(g, c, atol=1e-6, rtol=1e-5, what=""):
    got = H(g)
    want = np.asarray(c)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    if want.dtype == np.bool_ or want.dtype.kind in "iu":
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, atol=atol, rtol=rtol, err_msg=what)


rng = np.random.default_rng(0)


def randn(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# ---- transfer, creation, dtypes ---------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int64, np.int32, np.uint8, np.bool_])
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 5, 2)])
def test_roundtrip(dtype, shape):
    a = (rng.standard_normal(shape) * 10).astype(dtype)
    x = G(a)
    assert x.shape == shape and gpu.dtype_of(x) == cpu.dtype_of(a)
    np.testing.assert_array_equal(H(x), a)


@pytest.mark.parametrize("dtype", [engine.float32, engine.float64, engine.int64, engine.int32, engine.bool_])
@pytest.mark.parametrize("value", [0, 1, -3, 2.5, float("inf")])
def test_full(dtype, value):
    if not dtype.is_floating_point and value in (2.5, float("inf")):
        return
    close(gpu.full((3, 4), value, dtype), cpu.full((3, 4), value, dtype))


@pytest.mark.parametrize("args", [(0, 10, 1, engine.int64), (3, -7, -2, engine.int64), (0.0, 1.0, 0.1, engine.float32),
                                  (5, 5, 1, engine.int64), (-2.5, 3.0, 0.75, engine.float64)])
def test_arange(args):
    close(gpu.arange(*args), cpu.arange(*args), atol=1e-6)


@pytest.mark.parametrize("src", [np.float32, np.float64, np.float16, np.int64, np.int32, np.uint8, np.bool_])
@pytest.mark.parametrize("dst", [engine.float32, engine.float64, engine.float16, engine.int64, engine.int32,
                                 engine.uint8, engine.bool_])
def test_astype(src, dst):
    a = np.concatenate([rng.uniform(0, 5, 20), [0.0, 1.0, 2.0]]).astype(src)
    close(gpu.astype(G(a), dst), cpu.astype(a, dst), atol=1e-3, rtol=1e-3)


def test_copy_and_contiguous():
    a, b = randn(4, 5), randn(4, 5)
    x = G(a)
    gpu.copy_(x, G(b))
    close(x, b)
    gpu.copy_(x, G(randn(5).astype(np.float64)[None, :] * 0 + 2.0))  # broadcast + dtype conversion
    close(x, np.full((4, 5), 2.0, np.float32))
    assert gpu.contiguous(x) is x


# ---- elementwise ------------------------------------------------------------------------------

BINARY = ["add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge"]
SHAPES = [((5, 7), (5, 7)), ((3, 1, 4), (2, 4)), ((), (3,)), ((4, 1), (1, 5)), ((2, 3, 4, 5, 6), (1, 3, 1, 5, 1)),
          ((1000, 300), (300,))]


def _operands(op, dtype, sa, sb):
    if np.dtype(dtype).kind == "f":
        a = rng.uniform(0.5, 2.0, sa) if op == "pow" else rng.standard_normal(sa) * 2
        b = rng.uniform(-2, 2, sb) if op == "pow" else rng.standard_normal(sb) * 2
        if op == "div":
            b = np.where(np.abs(b) < 0.1, 0.5, b)
        if op in ("eq", "ne", "le", "ge"):  # make some equal
            b = np.round(b)
            a = np.round(a)
    else:
        a = rng.integers(-5, 6, sa)
        b = rng.integers(1, 4, sb) if op in ("div", "pow") else rng.integers(-5, 6, sb)
        if op == "pow":
            a = rng.integers(-3, 4, sa)
    return np.asarray(a).astype(dtype), np.asarray(b).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32])
@pytest.mark.parametrize("op", BINARY)
def test_binary(op, dtype):
    for sa, sb in SHAPES:
        a, b = _operands(op, dtype, sa, sb)
        close(gpu.binary(op, G(a), G(b)), cpu.binary(op, a, b), atol=1e-6, rtol=1e-5, what=f"{op} {sa} {sb}")
        if op not in ("pow", "div"):
            close(gpu.binary(op, G(b), G(a)), cpu.binary(op, b, a), what=f"{op} {sb} {sa}")
    a, _ = _operands(op, dtype, (6, 5), (1,))
    s = 2 if np.dtype(dtype).kind in "iu" else 1.5
    close(gpu.binary(op, G(a), s), cpu.binary(op, a, s), what=f"{op} array-scalar")
    if op != "pow" or np.dtype(dtype).kind == "f":
        lhs = a if op != "div" else np.where(a == 0, 1, a).astype(dtype)
        close(gpu.binary(op, s, G(lhs)), cpu.binary(op, s, lhs), what=f"{op} scalar-array")


def test_binary_bool_and_mixed_scalar():
    m = rng.random((4, 5)) > 0.5
    close(gpu.binary("eq", G(m), 0), cpu.binary("eq", m, 0))
    close(gpu.binary("ne", G(m), G(~m)), cpu.binary("ne", m, ~m))
    i = rng.integers(-5, 6, (7,)).astype(np.int64)
    close(gpu.binary("mul", G(i), 0.5), cpu.binary("mul", i, 0.5))  # numpy: float math, then back to int
    close(gpu.binary("ne", G(i), -100), cpu.binary("ne", i, -100))


UNARY = ["neg", "exp", "log", "abs", "sqrt", "tanh", "sign", "sigmoid", "relu", "gelu"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", UNARY)
def test_unary(op, dtype):
    a = (rng.uniform(0.1, 4, (37, 29)) if op in ("log", "sqrt") else rng.standard_normal((37, 29)) * 3).astype(dtype)
    a[0, :3] = [0.0, -0.0, 20.0] if op not in ("log", "sqrt") else [1.0, 2.0, 3.0]
    close(gpu.unary(op, G(a)), cpu.unary(op, a), atol=1e-6, rtol=2e-6 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("op", ["neg", "abs", "sign", "relu"])
def test_unary_int(op):
    a = rng.integers(-9, 10, (50,)).astype(np.int64)
    close(gpu.unary(op, G(a)), cpu.unary(op, a))


@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_activation_backward(act):
    # gelu' has 1 - tanh^2 with tanh near -1 for x << 0: float32 cancellation on both sides gives
    # absolute differences up to ~3e-6 between two correct float32 implementations, hence atol 5e-6
    x, g = randn(300, 77) * 3, randn(300, 77)
    fn_g, fn_c = getattr(gpu, f"{act}_backward"), getattr(cpu, f"{act}_backward")
    close(fn_g(G(x), G(g)), fn_c(x, g), atol=5e-6, rtol=1e-5)


def test_where():
    cond = rng.random((3, 4, 5)) > 0.4
    a, b = randn(4, 5), randn(3, 1, 5)
    close(gpu.where(G(cond), G(a), G(b)), cpu.where(cond, a, b))
    close(gpu.where(G(cond), G(a), -np.inf), cpu.where(cond, a, -np.inf))
    close(gpu.where(G(cond[0]), 0.0, G(a)), cpu.where(cond[0], 0.0, a))
    ints = rng.integers(0, 9, (4, 5))
    close(gpu.where(G(cond[1]), G(ints), 7), cpu.where(cond[1], ints, 7))
    causal = np.triu(np.ones((8, 8), bool), 1)
    s = randn(2, 3, 8, 8)
    close(gpu.where(G(causal), float("-inf"), G(s)), cpu.where(causal, float("-inf"), s))


# ---- reductions -------------------------------------------------------------------------------

REDUCE_CASES = [((7,), (0,)), ((5, 6), (0,)), ((5, 6), (1,)), ((5, 6), (0, 1)), ((3, 4, 5), (0,)), ((3, 4, 5), (1,)),
                ((3, 4, 5), (2,)), ((3, 4, 5), (0, 1)), ((3, 4, 5), (1, 2)), ((3, 4, 5), (0, 2)),
                ((3, 4, 5), (0, 1, 2)), ((1, 5, 1), (0, 2)), ((2, 3, 4, 5), (0, 2)), ((2, 3, 4, 5), (1, 3)),
                ((4096, 3000), (0,)), ((4096, 3000), (1,)), ((4096, 3000), (0, 1)), ((2, 1000000), (1,)),
                ((100000, 8), (0,)), ((16, 1024, 768), (0, 1)), ((64, 300), (1,)), ((3, 2000), (1,))]


@pytest.mark.parametrize("shape,axes", REDUCE_CASES)
@pytest.mark.parametrize("keepdim", [False, True])
def test_sum_max(shape, axes, keepdim):
    a = randn(*shape)
    n = np.prod([shape[i] for i in axes])
    close(gpu.sum(G(a), axes, keepdim), cpu.sum(a, axes, keepdim), atol=1e-5 * np.sqrt(n), rtol=1e-4, what="sum")
    close(gpu.max(G(a), axes, keepdim), cpu.max(a, axes, keepdim), what="max")


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.float64])
def test_sum_max_other_dtypes(dtype):
    a = rng.integers(-100, 100, (33, 17, 5)).astype(dtype)
    for axes in [(0,), (1,), (2,), (0, 2), (0, 1, 2)]:
        close(gpu.sum(G(a), axes, False), cpu.sum(a, axes, False), atol=1e-9)
        close(gpu.max(G(a), axes, True), cpu.max(a, axes, True))


def test_argmax():
    a = randn(4, 50304)
    close(gpu.argmax(G(a), 1), cpu.argmax(a, 1))
    b = randn(3, 4, 5)
    for axis in range(3):
        close(gpu.argmax(G(b), axis), cpu.argmax(b, axis))


# ---- movement ---------------------------------------------------------------------------------

def test_reshape_is_a_view():
    a = randn(4, 6)
    x = G(a)
    y = gpu.reshape(x, (-1, 3))
    assert y.shape == (8, 3) and y.ptr == x.ptr
    close(y, a.reshape(-1, 3))


@pytest.mark.parametrize("shape,dims", [((3, 4), (1, 0)), ((2, 3, 4), (0, 2, 1)), ((2, 3, 4), (2, 0, 1)),
                                        ((64, 300, 200), (0, 2, 1)), ((300, 200), (1, 0)),
                                        ((2, 5, 3, 4, 6), (2, 0, 3, 1, 4)), ((4, 16, 3, 6, 8), (2, 0, 3, 1, 4))])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, np.float16])
def test_permute(shape, dims, dtype):
    a = (rng.standard_normal(shape) * 4).astype(dtype)
    close(gpu.permute(G(a), dims), cpu.permute(a, dims).copy())


def test_broadcast_to():
    a = randn(4, 1, 3)
    close(gpu.broadcast_to(G(a), (2, 4, 5, 3)), cpu.broadcast_to(a, (2, 4, 5, 3)).copy())
    close(gpu.broadcast_to(G(np.float32(3.0)), (2, 2)), np.full((2, 2), 3.0, np.float32))


INDICES = [(0,), (-1,), (slice(1, 3),), (slice(None), 2), (slice(None, None, 2), slice(1, None)),
           (Ellipsis, -1), (None, 1, Ellipsis, None), (slice(None, None, -1),), (1, slice(3, 0, -2), 2),
           (slice(None), slice(None), slice(1, 4)), (slice(5, 9),)]


@pytest.mark.parametrize("index", INDICES, ids=[str(i) for i in range(len(INDICES))])
def test_getitem_and_backward(index):
    a = randn(4, 5, 6)
    out_c = cpu.getitem(a, index)
    close(gpu.getitem(G(a), index), np.ascontiguousarray(out_c))
    g = randn(*out_c.shape)
    close(gpu.getitem_backward(G(g), index, a.shape), cpu.getitem_backward(g, index, a.shape))


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_concat(axis):
    shapes = [(2, 3, 4), (2, 3, 4), (2, 3, 4)]
    shapes = [tuple(n + i if d == axis % 3 else n for d, n in enumerate(s)) for i, s in enumerate(shapes)]
    xs = [randn(*s) for s in shapes]
    close(gpu.concat([G(x) for x in xs], axis), cpu.concat(xs, axis))
    ints = [rng.integers(0, 9, s) for s in shapes]
    close(gpu.concat([G(x) for x in ints], axis), cpu.concat(ints, axis))


# ---- matmul -----------------------------------------------------------------------------------

MATMUL = [((3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)), ((2, 1, 3, 4), (3, 4, 2)), ((5, 3, 4), (4, 6)),
          ((3, 4), (2, 4, 6)), ((4,), (4, 5)), ((3, 4), (4,)), ((257, 513), (513, 129)), ((8, 64, 32), (8, 32, 64))]


@pytest.mark.parametrize("sa,sb", MATMUL)
@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
def test_matmul(sa, sb, ta, tb, no_tf32):
    if (ta and len(sa) < 2) or (tb and len(sb) < 2):
        return
    a, b = randn(*sa), randn(*sb)
    if ta:
        a = np.ascontiguousarray(np.swapaxes(a, -1, -2))
    if tb:
        b = np.ascontiguousarray(np.swapaxes(b, -1, -2))
    close(gpu.matmul(G(a), G(b), ta, tb), cpu.matmul(a, b, ta, tb), atol=1e-4, rtol=1e-4)


def test_matmul_float64_and_tf32():
    a, b = randn(64, 128, dtype=np.float64), randn(128, 32, dtype=np.float64)
    close(gpu.matmul(G(a), G(b)), cpu.matmul(a, b), atol=1e-12, rtol=1e-12)
    a, b = randn(512, 768), randn(768, 256)
    assert engine.cuda.allow_tf32()  # the default, as PyTorch's benchmark setting
    close(gpu.matmul(G(a), G(b)), cpu.matmul(a, b), atol=0.1, rtol=5e-3)


# ---- normalisation, softmax, losses -----------------------------------------------------------

# 16-byte kernels: 384 (3 chunks of 4 per lane), 200 (2), 36 (1), 512 (4); columns per lane: 6, 768,
# 1000; 1600: the wide kernel
@pytest.mark.parametrize("shape", [(4, 6), (64, 768), (3, 5, 384), (2, 1000), (600, 200), (9, 1600), (7, 36),
                                   (5, 512)])
@pytest.mark.parametrize("affine", ["both", "weight", "none"])
def test_layer_norm(shape, affine):
    C = shape[-1]
    x = randn(*shape) * 2 + 0.5
    w = randn(C) if affine != "none" else None
    b = randn(C) if affine == "both" else None
    outs_g = gpu.layer_norm(G(x), None if w is None else G(w), None if b is None else G(b), 1e-5)
    outs_c = cpu.layer_norm(x, w, b, 1e-5)
    for og, oc, name in zip(outs_g, outs_c, ["out", "mean", "rstd"]):
        close(og, oc, atol=1e-5, rtol=1e-4, what=name)
    g = randn(*shape)
    for need in (True, False):
        dg = gpu.layer_norm_backward(G(g), G(x), None if w is None else G(w), outs_g[1], outs_g[2], need)
        dc = cpu.layer_norm_backward(g, x, w, outs_c[1], outs_c[2], need)
        for a_, b_, name in zip(dg, dc, ["dx", "dweight", "dbias"]):
            assert (a_ is None) == (b_ is None), name
            if a_ is not None:
                close(a_, b_, atol=1e-4, rtol=1e-4, what=name)


@pytest.mark.parametrize("L", [5, 64, 256, 1000, 3000, 50304])
def test_softmax_family(L):
    x = randn(7, L) * 3
    x[0, : L // 2] = -np.inf  # masked entries, as causal attention
    g = randn(7, L)
    for fwd, bwd in (("softmax", "softmax_backward"), ("log_softmax", "log_softmax_backward")):
        yg, yc = getattr(gpu, fwd)(G(x)), getattr(cpu, fwd)(x)
        close(yg, yc, atol=1e-5, rtol=1e-4, what=fwd)
        if fwd == "log_softmax":
            yc = np.where(np.isinf(yc), -1e30, yc).astype(np.float32)  # -inf * 0 would be NaN in both
            yg = G(yc)
        close(getattr(gpu, bwd)(yg, G(g)), getattr(cpu, bwd)(yc, g), atol=1e-5, rtol=1e-4, what=bwd)


@pytest.mark.parametrize("N,V", [(6, 5), (64, 65), (8, 50304), (300, 1000)])
@pytest.mark.parametrize("ignore_index", [-100, -1])
def test_cross_entropy(N, V, ignore_index):
    logits = randn(N, V) * 2
    targets = rng.integers(0, V, N).astype(np.int64)
    targets[::3] = ignore_index
    lg, lseg = gpu.cross_entropy(G(logits), G(targets), ignore_index)
    lc, lsec = cpu.cross_entropy(logits, targets, ignore_index)
    close(lg, lc, atol=1e-5, rtol=1e-5, what="losses")
    close(lseg, lsec, atol=1e-5, rtol=1e-5, what="lse")
    g = randn(N)
    close(gpu.cross_entropy_backward(G(logits), G(targets), lseg, G(g), ignore_index),
          cpu.cross_entropy_backward(logits, targets, lsec, g, ignore_index), atol=1e-6, rtol=1e-4, what="dlogits")


@pytest.mark.parametrize("V,C", [(65, 384), (50304, 64), (1024, 768), (7, 3)])
def test_embedding(V, C):
    w = randn(V, C)
    idx = rng.integers(0, V, (16, 33)).astype(np.int64)
    idx[0, :5] = 3  # repeated tokens: their gradients add up
    close(gpu.embedding(G(w), G(idx)), cpu.embedding(w, idx))
    g = randn(16, 33, C)
    close(gpu.embedding_backward(G(g), G(idx), V), cpu.embedding_backward(g, idx, V), atol=1e-5, rtol=1e-5)
    base = randn(V, C)  # into: the rows added to a gradient already there, in place
    into = G(base)
    assert gpu.embedding_backward(G(g), G(idx), V, into) is into
    close(into, base + cpu.embedding_backward(g, idx, V), atol=1e-5, rtol=1e-5, what="into")
    gb = gpu.astype(G(g), engine.bfloat16)  # a bf16 gradient, read without a cast
    close(gpu.embedding_backward(gb, G(idx), V), cpu.embedding_backward(H(gpu.astype(gb, F32)), idx, V),
          atol=1e-5, rtol=1e-5, what="bf16")
    wrong = G(randn(V, C + 1))  # an array that does not fit is left alone: a new gradient comes back
    assert gpu.embedding_backward(G(g), G(idx), V, wrong) is not wrong


@pytest.mark.parametrize("V,C,T,start", [(65, 384, 33, 0), (50304, 64, 16, 5), (7, 260, 9, 3)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_embedding_positions_backward(V, C, T, start, dtype):
    """The token rows scatter-added (into a gradient already there, or a new one) and the positions'
    rows summed over the batch, zeros outside start..start+T-1, from a float32 or bf16 gradient."""
    P = start + T + 4
    idx = rng.integers(0, V, (6, T)).astype(np.int64)
    idx[0, :4] = 2
    g = gpu.astype(G(randn(6, T, C)), getattr(engine, dtype))
    g32 = H(gpu.astype(g, F32))
    want_w, want_p = cpu.embedding_positions_backward(g32, idx, V, P, start)
    dw, dp = gpu.embedding_positions_backward(g, G(idx), V, P, start)
    close(dw, want_w, atol=1e-5, rtol=1e-5, what="dweight")
    close(dp, want_p, atol=1e-5, rtol=1e-5, what="dpos")
    base = randn(V, C)
    into = G(base)
    dw, _ = gpu.embedding_positions_backward(g, G(idx), V, P, start, into)
    assert dw is into
    close(into, base + want_w, atol=1e-5, rtol=1e-5, what="into")


def test_dropout_mask():
    m = H(gpu.dropout_mask((1000, 1000), 0.3, 1234, engine.float32))
    kept = m != 0
    assert abs(kept.mean() - 0.7) < 0.005
    np.testing.assert_allclose(m[kept], 1 / 0.7, rtol=1e-6)
    np.testing.assert_array_equal(H(gpu.dropout_mask((1000, 1000), 0.3, 1234, engine.float32)), m)
    assert (H(gpu.dropout_mask((1000, 1000), 0.3, 1235, engine.float32)) != m).any()
    z = H(gpu.random_normal((100000,), 5))
    assert abs(z.mean()) < 0.02 and abs(z.std() - 1) < 0.02


# ---- optimizers -------------------------------------------------------------------------------

def _param_set(n=70):
    shapes = [(int(rng.integers(1, 300)),) if i % 3 else (int(rng.integers(1, 40)), int(rng.integers(1, 40)))
              for i in range(n)]
    return shapes


def test_adamw_many_tensors():
    shapes = _param_set()
    ps = [randn(*s) for s in shapes]
    ms = [np.zeros(s, np.float32) for s in shapes]
    vs = [np.zeros(s, np.float32) for s in shapes]
    gp, gm, gv = [G(p) for p in ps], [G(m) for m in ms], [G(v) for v in vs]
    for step in range(1, 4):
        grads = [randn(*s) for s in shapes]
        kw = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, step=step)
        cpu.adamw_(ps, grads, ms, vs, **kw)
        gpu.adamw_(gp, [G(g) for g in grads], gm, gv, **kw)
    for a, b in zip(gp, ps):
        close(a, b, atol=1e-6, rtol=1e-5)
    for a, b in zip(gv, vs):
        close(a, b, atol=1e-7, rtol=1e-5)


def test_adamw_tensors_across_chunks_and_unaligned():
    """A launch's blocks take 16384 elements of the concatenated tensors each and walk them tensor by
    tensor (float4 where a piece's rows are 16-byte aligned): sizes that split across blocks at odd
    offsets, empty and one-element tensors, and views that start 4 bytes into a buffer, on the host-lr
    and the device-lr kernels, against the CPU reference."""
    sizes = [16384 * 2 + 5, 3, 0, 40001, 1, 16383, 70000, 7]
    buffers = [randn(n + 1) for n in sizes]
    ps = [b[1:] for b in buffers]  # the CPU side of the views
    ms = [np.zeros(n, np.float32) for n in sizes]
    vs = [np.zeros(n, np.float32) for n in sizes]
    parents = [G(b) for b in buffers]
    gp = [gpu.getitem(x, (slice(1, None),)) for x in parents]  # views 4 bytes into their buffers
    gm, gv = [G(m) for m in ms], [G(v) for v in vs]
    lr, step = G(np.array([1e-2], np.float32)), G(np.array([0.0], np.float32))
    for k in range(1, 4):
        grads = [randn(n) for n in sizes]
        kw = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, step=k)
        cpu.adamw_(ps, grads, ms, vs, **kw)
        if k % 2:
            gpu.adamw_(gp, [G(g) for g in grads], gm, gv, **kw)
        else:
            gpu.copy_from_numpy_(step, np.array([float(k)], np.float32))
            gpu.adamw_device_(gp, [G(g) for g in grads], gm, gv, lr.ptr, step.ptr, beta1=0.9, beta2=0.95, eps=1e-8,
                              weight_decay=0.1)
    for a, b in zip(gp, ps):
        close(a, b, atol=1e-6, rtol=1e-5)
    for a, b in zip(gm, ms):
        close(a, b, atol=1e-7, rtol=1e-5)
    for a, b in zip(gv, vs):
        close(a, b, atol=1e-7, rtol=1e-5)
    for b, parent in zip(buffers, parents):  # the element before each view is untouched
        assert H(parent)[0] == b[0]


@pytest.mark.parametrize("momentum,nesterov,wd", [(0.0, False, 0.0), (0.9, False, 0.01), (0.9, True, 0.0)])
def test_sgd_many_tensors(momentum, nesterov, wd):
    shapes = _param_set()
    ps = [randn(*s) for s in shapes]
    bufs = [np.zeros(s, np.float32) for s in shapes] if momentum else [None] * len(shapes)
    gp = [G(p) for p in ps]
    gb = [G(b) for b in bufs] if momentum else [None] * len(shapes)
    for step in range(3):
        grads = [randn(*s) for s in shapes]
        kw = dict(lr=0.1, momentum=momentum, dampening=0.0, nesterov=nesterov, weight_decay=wd, first_step=step == 0)
        cpu.sgd_(ps, grads, bufs, **kw)
        gpu.sgd_(gp, [G(g) for g in grads], gb, **kw)
    for a, b in zip(gp, ps):
        close(a, b, atol=1e-6, rtol=1e-5)


def test_sgd_norm_and_scale_across_chunks():
    """SGD, the sum of squares and the scale walk their blocks' elements tensor by tensor too: sizes that
    split across blocks at odd offsets, an empty tensor, views 4 bytes into their buffers."""
    sizes = [8192 * 2 + 5, 3, 0, 40001, 1, 16383, 7]
    buffers = [randn(n + 1) for n in sizes]
    ps = [b[1:] for b in buffers]
    bufs = [np.zeros(n, np.float32) for n in sizes]
    gp = [gpu.getitem(G(b), (slice(1, None),)) for b in buffers]
    gb = [G(b) for b in bufs]
    for step in range(3):
        grads = [randn(n) for n in sizes]
        kw = dict(lr=0.1, momentum=0.9, dampening=0.0, nesterov=True, weight_decay=0.01, first_step=step == 0)
        cpu.sgd_(ps, grads, bufs, **kw)
        gpu.sgd_(gp, [G(g) for g in grads], gb, **kw)
    for a, b in zip(gp, ps):
        close(a, b, atol=1e-6, rtol=1e-5)
    close(gpu.sum_of_squares(gp), cpu.sum_of_squares(ps), atol=1e-2, rtol=1e-5)
    f = np.array(0.37, dtype=np.float32)
    cpu.scale_(ps, f)
    gpu.scale_(gp, G(f))
    for a, b in zip(gp, ps):
        close(a, b)


def test_sum_of_squares_and_scale():
    xs = [randn(*s) for s in _param_set(100)]
    gx = [G(x) for x in xs]
    close(gpu.sum_of_squares(gx), cpu.sum_of_squares(xs), atol=1e-3, rtol=1e-5)
    f = np.array(0.37, dtype=np.float32)
    cpu.scale_(xs, f)
    gpu.scale_(gx, G(f))
    for a, b in zip(gx, xs):
        close(a, b)
    assert H(gpu.sum_of_squares([])).item() == 0.0


def test_unaligned_views_and_tails():
    # views that start mid-vector and lengths that are not multiples of 4 take the scalar paths
    a, b = randn(103), randn(103)
    for start in (1, 2, 3, 4):
        va, vb = gpu.getitem(G(a), (slice(start, None),)), gpu.getitem(G(b), (slice(None, 103 - start),))
        ca, cb = a[start:], b[:103 - start]
        close(gpu.binary("mul", va, vb), ca * cb)
        close(gpu.binary("sub", 1.5, va), 1.5 - ca)
        close(gpu.binary("gt", va, vb), ca > cb)
        close(gpu.unary("exp", va), np.exp(ca), rtol=2e-6)
        close(gpu.gelu_backward(va, vb), cpu.gelu_backward(ca, cb), atol=5e-6)
        m = ca > 0
        close(gpu.where(G(m), va, 0.0), np.where(m, ca, 0.0).astype(np.float32))
    m2 = randn(6, 8)
    v2 = gpu.getitem(G(m2), (slice(1, None),))  # rows 1..5: 32-byte offset, still aligned
    close(gpu.binary("add", v2, G(np.ones(8, np.float32))), m2[1:] + 1)
    close(gpu.permute(v2, (1, 0)), m2[1:].T.copy())
