"""The fused residual add + layer norm (F.add_layer_norm; csrc/cuda/layernorm/layernorm.cu with res / dres) on
the GPU, forward and backward, against the unfused path (x + r, then F.layer_norm) on the GPU and
against the CPU backend, for each layer-norm kernel: the 16-byte ones (C a multiple of 8 bf16 / 4
float32 values), the per-column ones, and the wide backward (C > 1024). With a residual bias (rb, the
projection's bias the transformer leaves to this op: its gradient is the column sums of ds, summed in
the layer norm's backward kernels) against the CPU backend, on each kernel too.

Tolerances: float32 atol 1e-5 + rtol 1e-4 (reductions); bf16 against the unfused GPU path 1e-2 of
the largest value (the fused backward rounds dx + dres once, the unfused one twice)."""
from __future__ import annotations

import numpy as np
import pytest

import engine
import engine.nn.functional as F

# (20001, C): many rows to each of the backward's groups of warps (and its two sets of row-sum slots)
SHAPES = [(4, 33, 768), (2, 16, 384), (3, 64), (5, 100), (7, 37), (2, 1030), (20001, 384), (20001, 768)]


def _leaf(a: np.ndarray, device: str, dtype):
    t = engine.tensor(a, device=device)
    if dtype is engine.bfloat16:
        t = t.type(dtype)
    t.requires_grad = True
    return t


def _run(x, r, w, b, gs, gh, fused: bool):
    """Both outputs and the gradients of x, r, w, b under sum(s gs) + sum(h gh)."""
    C = x.shape[-1]
    if fused:
        s, h = F.add_layer_norm(x, r, C, w, b)
    else:
        s = x + r
        h = F.layer_norm(s, C, w, b)
    ((s * gs).sum() + (h * gh).sum()).backward()
    return [t.float().numpy() for t in (s, h, x.grad, r.grad, w.grad, b.grad)]


def _inputs(shape, device, dtype, seed):
    rng = np.random.default_rng(seed)
    C = shape[-1]
    x, r, gs, gh = (rng.standard_normal(shape).astype(np.float32) for _ in range(4))
    w, b = rng.standard_normal(C).astype(np.float32), rng.standard_normal(C).astype(np.float32)
    leaves = [_leaf(a, device, dtype) for a in (x, r)] + [_leaf(a, device, None) for a in (w, b)]
    grads = [engine.tensor(a, device=device) for a in (gs, gh)]
    if dtype is engine.bfloat16:
        grads = [g.type(dtype) for g in grads]
    return leaves, grads


def _atol(name: str, want: np.ndarray, shape, atol: float) -> float:
    """dw, db and drb sum every row: over thousands of rows their float32 rounding grows with the largest
    sums, so there the tolerance is 1e-5 of the largest; elsewhere `atol`."""
    return 1e-5 * float(np.max(np.abs(want))) if name in ("dw", "db", "drb") and shape[0] > 1000 else atol


@pytest.mark.parametrize("shape", SHAPES, ids=[str(s[-1]) for s in SHAPES])
def test_float32_matches_cpu(shape):
    got = _run(*_inputs(shape, "cuda", engine.float32, 0)[0], *_inputs(shape, "cuda", engine.float32, 0)[1], True)
    want = _run(*_inputs(shape, "cpu", engine.float32, 0)[0], *_inputs(shape, "cpu", engine.float32, 0)[1], True)
    for g, w_, name in zip(got, want, ("s", "h", "dx", "dr", "dw", "db")):
        np.testing.assert_allclose(g, w_, atol=_atol(name, w_, shape, 1e-4), rtol=1e-4, err_msg=name)


@pytest.mark.parametrize("dtype", [engine.float32, engine.bfloat16], ids=["float32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=[str(s[-1]) for s in SHAPES])
def test_matches_the_unfused_path(shape, dtype):
    fused = _run(*_inputs(shape, "cuda", dtype, 1)[0], *_inputs(shape, "cuda", dtype, 1)[1], True)
    plain = _run(*_inputs(shape, "cuda", dtype, 1)[0], *_inputs(shape, "cuda", dtype, 1)[1], False)
    np.testing.assert_array_equal(fused[0], plain[0])  # the sum, rounded the same way
    for g, w_, name in zip(fused[1:], plain[1:], ("h", "dx", "dr", "dw", "db")):
        if dtype is engine.float32:
            np.testing.assert_allclose(g, w_, atol=_atol(name, w_, shape, 1e-5), rtol=1e-4, err_msg=name)
        else:
            assert np.max(np.abs(g - w_)) <= 1e-2 * np.max(np.abs(w_)), name


def test_one_output_unused():
    """Only h feeds the loss: the stream's gradient is None and dx = dr = the layer norm's alone;
    only s: dx = dr = ds and no weight gradients."""
    (x, r, w, b), (gs, gh) = _inputs((3, 64), "cuda", engine.float32, 2)
    s, h = F.add_layer_norm(x, r, 64, w, b)
    (h * gh).sum().backward()
    x2, r2 = (_leaf(t.detach().numpy(), "cuda", None) for t in (x, r))
    (F.layer_norm(x2 + r2, 64, w.detach(), b.detach()) * gh).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), x2.grad.numpy(), atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(r.grad.numpy(), x2.grad.numpy(), atol=1e-5, rtol=1e-4)
    (x, r, w, b), (gs, gh) = _inputs((3, 64), "cuda", engine.float32, 3)
    s, h = F.add_layer_norm(x, r, 64, w, b)
    (s * gs).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), gs.numpy())
    assert w.grad is None and b.grad is None


def test_gpt_block_uses_it_and_trains_the_same():
    """A GPT on the GPU: the fused block's loss and gradients against the same model with the block's
    residual add and ln_2 run as two ops."""
    from engine.nn.gpt import GPT, GPTConfig

    cfg = GPTConfig(block_size=16, vocab_size=50, n_layer=2, n_head=2, n_embd=64, dropout=0.0)
    engine.manual_seed(0)
    model = GPT(cfg).to("cuda")
    idx = engine.tensor(np.random.default_rng(0).integers(0, 50, (2, 16)), device="cuda")
    _, loss = model(idx, idx)
    loss.backward()
    fused = loss.item(), [p.grad.numpy().copy() for p in model.parameters()]
    model.zero_grad()
    blocks = model.transformer["h"]
    for blk in blocks:  # the unfused block: x + attn(ln_1(x)) with c_proj's bias in its GEMM, then ln_2 as its own op
        blk.ln_2.add_forward = lambda x, r, rb=None, ln=blk.ln_2: (lambda s: (s, ln(s)))(x + r if rb is None else x + r + rb)
        blk.attn.forward_bias_deferred = lambda h, cache=None, mask=None, attn=blk.attn: (attn(h, cache, mask), None)
        blk.mlp.forward_bias_deferred = lambda h, mlp=blk.mlp: (mlp(h), None)
    _, loss = model(idx, idx)
    loss.backward()
    assert abs(loss.item() - fused[0]) < 1e-5
    for a, b in zip((p.grad.numpy() for p in model.parameters()), fused[1]):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)


def _run_residual_bias(device: str, shape, dtype, seed: int, stream_grad: bool, weight_grads: bool = True):
    """s, h and the gradients of x, r, w, b, rb under sum(h gh) (+ sum(s gs) with stream_grad: the
    backward's dres), for add_layer_norm with a residual bias rb; w and b without gradients unless
    weight_grads (then the backward sums ds alone)."""
    (x, r, w, b), (gs, gh) = _inputs(shape, device, dtype, seed)
    rb = _leaf(np.random.default_rng(seed + 100).standard_normal(shape[-1]).astype(np.float32), device, None)
    if not weight_grads:
        w, b = w.detach(), b.detach()
    s, h = F.add_layer_norm(x, r, shape[-1], w, b, residual_bias=rb)
    loss = (h * gh).sum()
    if stream_grad:
        loss = loss + (s * gs).sum()
    loss.backward()
    return [None if t is None else t.float().numpy() for t in (s, h, x.grad, r.grad, w.grad, b.grad, rb.grad)]


@pytest.mark.parametrize("stream_grad", [True, False], ids=["dres", "no_dres"])
@pytest.mark.parametrize("dtype", [engine.float32, engine.bfloat16], ids=["float32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=[str(s[-1]) for s in SHAPES])
def test_residual_bias_matches_cpu(shape, dtype, stream_grad):
    got = _run_residual_bias("cuda", shape, dtype, 4, stream_grad)
    want = _run_residual_bias("cpu", shape, dtype, 4, stream_grad)
    np.testing.assert_array_equal(got[0], want[0])  # s = x + (r + rb), summed in float32, rounded once
    for g, w_, name in zip(got[1:], want[1:], ("h", "dx", "dr", "dw", "db", "drb")):
        if dtype is engine.float32:
            np.testing.assert_allclose(g, w_, atol=_atol(name, w_, shape, 1e-4), rtol=1e-4, err_msg=name)
        else:
            assert np.max(np.abs(g - w_)) <= 1e-2 * np.max(np.abs(w_)), name
    # rb's gradient is the column sums of r's (ds), summed before a bf16 ds is rounded
    ds = want[3].reshape(-1, shape[-1]).astype(np.float64)
    np.testing.assert_allclose(got[6], ds.sum(0), atol=2e-2 * np.max(np.abs(ds.sum(0))) if dtype is engine.bfloat16
                               else _atol("db", ds.sum(0), shape, 1e-4), rtol=1e-3)


@pytest.mark.parametrize("shape", [(4, 33, 768), (5, 100), (2, 1030)], ids=["group", "per_warp", "wide"])
def test_residual_bias_grad_without_weight_grads(shape):
    """Frozen layer-norm weights: the backward's kernels sum ds alone (no dw, db partials)."""
    got = _run_residual_bias("cuda", shape, engine.float32, 5, True, weight_grads=False)
    want = _run_residual_bias("cpu", shape, engine.float32, 5, True, weight_grads=False)
    assert got[4] is None and got[5] is None
    for i, name in ((2, "dx"), (3, "dr"), (6, "drb")):
        np.testing.assert_allclose(got[i], want[i], atol=1e-4, rtol=1e-4, err_msg=name)


def test_residual_bias_with_the_stream_only():
    """Only s feeds the loss (no layer-norm backward): rb's gradient is the column sums of the stream's."""
    for device in ("cuda", "cpu"):
        (x, r, w, b), (gs, gh) = _inputs((6, 64), device, engine.bfloat16, 6)
        rb = _leaf(np.linspace(-1, 1, 64).astype(np.float32), device, None)
        s, _ = F.add_layer_norm(x, r, 64, w, b, residual_bias=rb)
        (s * gs).sum().backward()
        assert rb.grad.dtype is engine.float32
        np.testing.assert_allclose(rb.grad.numpy(), gs.float().numpy().sum(0), rtol=1e-5, atol=1e-5)
