"""F.linear_cross_entropy (the fused classifier) on the GPU: its kernel and scale against the CPU
backend; loss and gradients against the unfused F.linear + F.cross_entropy in float32 (TF32 off) and
under bf16 autocast; GPT.forward with and without return_logits; and inside a captured CUDA graph.

Vocabulary sizes: multiples of 8 take the 16-byte kernels (bf16 and float32), 67 and 515 the scalar
ones, 3001 and 4096 the 512-thread blocks. Tolerances: float32 atol 1e-5 + rtol 1e-4 (matmuls as on
the CPU); bf16 within 2e-2 of the largest value (8 significant bits; the fused and unfused paths
round the logits' gradient at different scales), as in test_bf16.py."""
from __future__ import annotations

import numpy as np
import pytest

import engine
import engine.nn.functional as F
from engine.backends import cpu
from engine.backends import cuda as gpu
from engine.graphs import CapturedStep
from engine.nn import GPT, GPTConfig, Linear, Module
from engine.optim import AdamW

BF = engine.bfloat16


def _close_bf16(got, want, rtol=2e-2, what=""):
    scale = max(1e-6, float(np.max(np.abs(want))))
    err = float(np.max(np.abs(np.asarray(got, np.float64) - want))) / scale
    assert err < rtol, f"{what}: max error {err:.2e} of the largest value"


def _data(N, C, V, ignored=(1, 4), seed=0, ignore_index=-100):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, C)).astype(np.float32)
    w = (rng.standard_normal((V, C)) * 0.5).astype(np.float32)
    t = rng.integers(0, V, N)
    t[list(ignored)] = ignore_index
    return x, w, t


def _loss_and_grads(fn, x, w, t, device, upstream=1.0, autocast=False, **kw):
    xt = engine.tensor(x, device=device, requires_grad=True)
    wt = engine.tensor(w, device=device, requires_grad=True)
    with engine.autocast("cuda", enabled=autocast):
        loss = fn(xt, wt, engine.tensor(t, device=device), **kw)
    (loss * upstream).backward()
    assert loss.dtype == engine.float32 and xt.grad.dtype == engine.float32 and wt.grad.dtype == engine.float32
    return loss.numpy(), xt.grad.numpy(), wt.grad.numpy()


def _fused(x, w, t, **kw):
    return F.linear_cross_entropy(x, w, t, **kw)


def _unfused(x, w, t, **kw):
    return F.cross_entropy(F.linear(x, w), t, **kw)


@pytest.mark.parametrize("dtype", [engine.float32, BF])
# rows of 64000 bytes up to 113 KB are copied into shared memory whole, two rows a block (24584 float32,
# 32776 and 50304, GPT-2's padded vocabulary, in bf16); shorter rows and longer ones (50304 float32,
# 65536) take the two-pass kernel
@pytest.mark.parametrize("V", [64, 67, 515, 4096, 4104, 8200, 24584, 32776, 50304, 65536])
@pytest.mark.parametrize("grad_scale", [None, 1 / 7])
def test_kernel_matches_cpu(dtype, V, grad_scale):
    """cross_entropy_with_grad_: losses, and the logits overwritten by softmax - onehot (0 on ignored rows),
    times grad_scale (the mean's 1 / rows kept, read on the device) where given."""
    _, _, t = _data(9, 1, V, ignored=(2,), ignore_index=-1)
    logits = (np.random.default_rng(1).standard_normal((9, V)) * 3).astype(np.float32)
    buf = gpu.astype(gpu.from_numpy(logits), dtype)
    ref = gpu.to_numpy(gpu.astype(buf, engine.float32))  # the values the kernel sees
    scale = None if grad_scale is None else np.array(grad_scale, np.float32)
    losses = gpu.cross_entropy_with_grad_(buf, gpu.from_numpy(t), -1,
                                          None if scale is None else gpu.from_numpy(scale))
    want_grad = ref.copy()
    want_losses = cpu.cross_entropy_with_grad_(want_grad, t, -1, scale)
    assert losses.dtype is engine.float32 and buf.dtype is dtype
    np.testing.assert_allclose(gpu.to_numpy(losses), want_losses, atol=1e-5, rtol=1e-4)
    got_grad = gpu.to_numpy(gpu.astype(buf, engine.float32))
    assert not got_grad[2].any()
    if dtype is BF:
        _close_bf16(got_grad, want_grad, rtol=1e-2, what="dlogits")
    else:
        np.testing.assert_allclose(got_grad, want_grad, atol=1e-5, rtol=1e-4)


# a warp a row; the two-pass kernel; rows staged in shared memory (float32, bf16)
@pytest.mark.parametrize("V, dtype", [(16, engine.float32), (50304, engine.float32), (24584, engine.float32),
                                      (50304, BF)])
def test_kernel_out_of_range_target_gives_nan(V, dtype):
    buf = gpu.astype(gpu.from_numpy(np.zeros((3, V), np.float32)), dtype)
    losses = gpu.to_numpy(gpu.cross_entropy_with_grad_(buf, gpu.from_numpy(np.array([3, V, -2])), -100))
    assert np.isfinite(losses[0]) and np.isnan(losses[1]) and np.isnan(losses[2])


@pytest.mark.parametrize("dtype", [engine.float32, BF])
def test_kernel_with_masked_logits_matches_cpu(dtype):
    """-inf logits (a masked vocabulary) add nothing, also where a thread's whole share of the row is
    masked (its running max is -inf); the gradient there is 0 (or -1 at the target)."""
    V, N = 50304, 6
    logits = (np.random.default_rng(3).standard_normal((N, V)) * 3).astype(np.float32)
    logits[:, :20000] = -np.inf  # the first blocks' shares, whole
    logits[:, 30000::7] = -np.inf
    t = np.array([20000, 25000, 40000, 50303, 20001, 30001])  # 30001 is not masked (30000 + 7 k only)
    buf = gpu.astype(gpu.from_numpy(logits), dtype)
    ref = gpu.to_numpy(gpu.astype(buf, engine.float32))
    losses = gpu.to_numpy(gpu.cross_entropy_with_grad_(buf, gpu.from_numpy(t), -100))
    want_grad = ref.copy()
    want_losses = cpu.cross_entropy_with_grad_(want_grad, t, -100)
    np.testing.assert_allclose(losses, want_losses, atol=1e-5, rtol=1e-4)
    got = gpu.to_numpy(gpu.astype(buf, engine.float32))
    assert np.isfinite(got).all() and not got[:, :20000].any()
    np.testing.assert_allclose(got, want_grad, atol=1e-2 if dtype is BF else 1e-5, rtol=1e-4)


def test_kernel_many_rows():
    """Many rows a block (700 rows: each buffer of a block's two refilled several times), some ignored."""
    V, N = 50304, 700
    rng = np.random.default_rng(4)
    t = rng.integers(0, V, N)
    t[::50] = -100
    buf = gpu.astype(gpu.from_numpy((rng.standard_normal((N, V)) * 2).astype(np.float32)), BF)
    want_grad = gpu.to_numpy(gpu.astype(buf, engine.float32))
    want = cpu.cross_entropy_with_grad_(want_grad, t, -100)
    got = gpu.to_numpy(gpu.cross_entropy_with_grad_(buf, gpu.from_numpy(t), -100))
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    _close_bf16(gpu.to_numpy(gpu.astype(buf, engine.float32)), want_grad, rtol=1e-2, what="dlogits")


@pytest.mark.parametrize("dtype", [engine.float32, BF])
@pytest.mark.parametrize("n", [4096, 1003])  # 16-byte chunks; the scalar kernel
def test_scale_by_a_device_scalar(dtype, n):
    x = gpu.astype(gpu.from_numpy(np.random.default_rng(2).standard_normal(n).astype(np.float32)), dtype)
    factor = gpu.from_numpy(np.array(1 / 3, np.float32))
    out = gpu.scale(x, factor)
    assert out.dtype is dtype and out.shape == (n,)
    want = gpu.to_numpy(gpu.astype(x, engine.float32)) * np.float32(1 / 3)
    if dtype is BF:  # float32 arithmetic, one rounding to bf16
        np.testing.assert_allclose(gpu.to_numpy(gpu.astype(out, engine.float32)), want, rtol=2 ** -8, atol=0)
    else:
        np.testing.assert_array_equal(gpu.to_numpy(out), want)


@pytest.mark.parametrize("V", [64, 67, 3001])
@pytest.mark.parametrize("reduction,upstream", [("mean", 1.0), ("mean", 3.0), ("sum", 0.5)])
def test_float32_matches_unfused_and_cpu(no_tf32, V, reduction, upstream):
    x, w, t = _data(24, 32, V)
    got = _loss_and_grads(_fused, x, w, t, "cuda", upstream, reduction=reduction)
    for ref_fn, device in ((_unfused, "cuda"), (_fused, "cpu")):
        want = _loss_and_grads(ref_fn, x, w, t, device, upstream, reduction=reduction)
        for g, r, what in zip(got, want, ("loss", "dx", "dweight")):
            np.testing.assert_allclose(g, r, atol=1e-5, rtol=1e-4, err_msg=f"{what} vs {ref_fn.__name__} {device}")
    assert not got[1][[1, 4]].any()


@pytest.mark.parametrize("V", [515, 1024, 4096])
@pytest.mark.parametrize("reduction,upstream", [("mean", 1.0), ("sum", 3.0)])
def test_autocast_bf16_matches_unfused_and_float32(V, reduction, upstream):
    x, w, t = _data(48, 64, V)
    got = _loss_and_grads(_fused, x, w, t, "cuda", upstream, autocast=True, reduction=reduction)
    unfused = _loss_and_grads(_unfused, x, w, t, "cuda", upstream, autocast=True, reduction=reduction)
    exact = _loss_and_grads(_fused, x, w, t, "cpu", upstream, reduction=reduction)
    for want, rtol in ((unfused, 2e-2), (exact, 3e-2)):
        assert abs(got[0] - want[0]) < 1e-2 * abs(want[0]), (got[0], want[0])
        _close_bf16(got[1], want[1], rtol, "dx")
        _close_bf16(got[2], want[2], rtol, "dweight")
    assert not got[1][[1, 4]].any()


def test_no_grad_and_frozen_inputs():
    x, w, t = _data(16, 32, 67)
    xt, wt = engine.tensor(x, device="cuda"), engine.tensor(w, device="cuda", requires_grad=True)
    tt = engine.tensor(t, device="cuda")
    with engine.no_grad():
        loss = F.linear_cross_entropy(xt, wt, tt)
    assert not loss.requires_grad
    np.testing.assert_allclose(loss.numpy(), _unfused(xt, wt, tt).numpy(), rtol=5e-3)
    F.linear_cross_entropy(xt, wt, tt).backward()  # x needs no gradient: only dweight is made
    assert xt.grad is None and wt.grad.shape == (67, 32)


@pytest.mark.parametrize("autocast", [False, True])
def test_gpt_forward_fused_and_with_logits_agree(no_tf32, autocast):
    cfg = GPTConfig(vocab_size=67, block_size=32, n_layer=2, n_head=4, n_embd=64, dropout=0.0)
    engine.manual_seed(0)
    model = GPT(cfg).to("cuda")
    rng = np.random.default_rng(3)
    x = engine.tensor(rng.integers(0, 67, (4, 32)), device="cuda")
    yn = rng.integers(0, 67, (4, 32))
    yn[1, 10:] = -1  # ignored by GPT
    y = engine.tensor(yn, device="cuda")
    results = []
    for return_logits in (False, True):
        model.zero_grad()
        with engine.autocast("cuda", enabled=autocast):
            logits, loss = model(x, y, return_logits=return_logits)
        loss.backward()
        assert (logits is None) != return_logits
        results.append((loss.item(), {n: p.grad.numpy() for n, p in model.named_parameters()}))
    (fused_loss, fused_grads), (loss, grads) = results
    if not autocast:
        assert abs(fused_loss - loss) < 1e-5
        for name in grads:
            np.testing.assert_allclose(fused_grads[name], grads[name], atol=1e-5, rtol=1e-3, err_msg=name)
        return
    assert abs(fused_loss - loss) < 1e-2 * abs(loss)
    for name in grads:
        a, b = fused_grads[name].ravel().astype(np.float64), grads[name].ravel().astype(np.float64)
        assert a @ b / max(1e-30, np.linalg.norm(a) * np.linalg.norm(b)) > 0.99, name


class _Head(Module):
    """A projection and a classifier weight: the end of a language model."""

    def __init__(self, C=32, V=67):
        super().__init__()
        self.proj = Linear(C, C)
        self.classifier = Linear(C, V, bias=False)

    def forward(self, x, y):
        return F.linear_cross_entropy(F.gelu(self.proj(x)), self.classifier.weight, y, ignore_index=-1)


@pytest.mark.parametrize("autocast", [False, True])
# a warp a row; 24584: rows staged in shared memory in float32, two passes in bf16; 32776: the reverse
@pytest.mark.parametrize("V", [67, 24584, 32776])
def test_captured_step_matches_eager(autocast, V):
    rng = np.random.default_rng(4)
    batches = []
    for _ in range(5):
        y = rng.integers(0, V, 24)
        y[:3] = -1
        batches.append((rng.standard_normal((24, 32)).astype(np.float32), y))
    runs = []
    for use_graph in (False, True):
        engine.manual_seed(0)
        model = _Head(V=V).to("cuda")
        opt = AdamW(model.parameters(), lr=1e-2)

        def step(x, y, model=model, opt=opt):
            opt.zero_grad()
            with engine.autocast("cuda", enabled=autocast):
                loss = model(x, y)
            loss.backward()
            opt.step()
            return loss

        run = CapturedStep(step) if use_graph else step
        losses = []
        for x, y in batches:
            args = (x, y) if use_graph else (engine.tensor(x, device="cuda"), engine.tensor(y, device="cuda"))
            losses.append(float(run(*args).numpy()))
        if use_graph:
            assert run.captured and run.replays == len(batches) - 2
        runs.append((losses, [p.numpy().copy() for p in model.parameters()]))
    (l0, w0), (l1, w1) = runs
    np.testing.assert_allclose(l1, l0, rtol=1e-5, atol=1e-6)
    for a, b in zip(w0, w1):  # no atomics anywhere in the step: replays compute what eager steps do
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)

