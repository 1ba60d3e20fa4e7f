"""bfloat16 on the CPU backend: factories, casts and `.to`, `.numpy()`, ops against PyTorch's bf16,
autocast("cpu"), and the errors a user meets.

Tolerances: casts bit for bit (round to nearest even); the elementwise ops both libraries compute as
one correctly rounded float32 operation rounded once to bf16 (add, sub, mul, div, maximum, sqrt, relu,
neg, scalar operands) bit for bit against torch bf16; transcendental ops, reductions, matmul, softmax
and layer norm within one bf16 step (bf16's spacing at the value) of torch's bf16; GELU within 2^-8
of the largest value (torch's bf16 GELU loses tiny negative outputs to cancellation); F.linear under
autocast within two bf16 steps of torch.autocast("cpu"), its float32 gradients within 1e-2 of the
largest value; the classifier under autocast, fused and unfused, within 2e-2 of float32 (the loss
relative, gradients of the largest value); a GPT under autocast("cpu"): loss within 2e-2 relative of
float32, every gradient at cosine > 0.99 (as tests/cuda/test_bf16.py on the GPU). test_ops.py runs
every op case in bf16 as well.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import engine
import engine.nn.functional as F
from engine.nn import GPT, GPTConfig

try:
    import torch
except ImportError:  # the torch comparisons skip; the rest runs
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")
BF = engine.bfloat16
rng = np.random.default_rng(0)


def rne_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns, rounding to nearest even, written out (the reference)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bits(t) -> np.ndarray:
    """The uint16 bit patterns of an engine or torch bf16 tensor."""
    if isinstance(t, engine.Tensor):
        assert t.dtype == BF, t.dtype
        return t.numpy().view(np.uint16)
    assert t.dtype == torch.bfloat16, t.dtype
    return t.view(torch.int16).numpy().view(np.uint16)


# ---- factories, casts, host data -------------------------------------------------------------------

def test_factories_make_bf16_tensors():
    engine.manual_seed(0)
    ref = engine.randn(3, 5)
    engine.manual_seed(0)
    x = engine.randn(3, 5, dtype=BF)
    assert x.dtype == BF and x.device.type == "cpu" and x.shape == (3, 5)
    np.testing.assert_array_equal(bits(x), rne_bits(ref.numpy()))  # the float32 draw, rounded
    for t in (engine.rand(4, dtype=BF), engine.zeros(2, 3, dtype=BF), engine.ones(2, dtype=BF),
              engine.empty(3, dtype=BF), engine.full((2,), 0.1, dtype=BF), engine.zeros_like(x),
              engine.full_like(x, 2.0), engine.arange(0, 4, 0.5, dtype=BF), engine.tensor([1, 2], dtype="bfloat16")):
        assert t.dtype == BF
    np.testing.assert_array_equal(bits(engine.full((2,), 0.1, dtype=BF)), rne_bits(np.full(2, 0.1, np.float32)))
    np.testing.assert_array_equal(engine.arange(0, 4, 0.5, dtype=BF).float().numpy(), np.arange(0, 4, 0.5))
    assert engine.ones(3, dtype=BF).sum().item() == 3.0


@pytest.mark.parametrize("n", [4096, 1001])
def test_to_bf16_rounds_to_nearest_even_and_back_is_exact(n):
    x = (rng.standard_normal(n) * np.exp(rng.uniform(-20, 20, n))).astype(np.float32)
    x[:6] = [0.0, -0.0, 1.00390625, 1.01171875, np.inf, -np.inf]  # ties: 1 + 2^-8 rounds down, 1 + 3 * 2^-8 up
    b = engine.tensor(x).to(BF)
    np.testing.assert_array_equal(bits(b), rne_bits(x))
    back = b.to(engine.float32)
    assert back.dtype == engine.float32
    np.testing.assert_array_equal(back.numpy().view(np.uint32), rne_bits(x).astype(np.uint32) << 16)
    np.testing.assert_array_equal(bits(back.to(BF)), bits(b))  # a second round trip changes nothing


def test_casts_between_bf16_and_other_dtypes():
    # float64 goes through float32, as the CUDA cast kernel and torch do: 1 + 2^-8 + 2^-30 is a tie in float32
    x64 = engine.tensor(np.array([1 + 2**-8 + 2**-30, 3.4e38, -2.5]))
    assert x64.dtype == engine.float64
    np.testing.assert_array_equal(x64.to(BF).float().numpy(), [1.0, np.inf, -2.5])
    np.testing.assert_array_equal(engine.tensor(np.array([1 + 2**-8 + 2**-30]), dtype=BF).float().numpy(), [1.0])
    y = engine.tensor([-2.75, 0.0, 3.5]).to(BF)
    assert y.to(engine.int64).tolist() == [-2, 0, 3] and y.to(engine.bool).tolist() == [True, False, True]
    assert engine.tensor([True, False]).to(BF).float().tolist() == [1.0, 0.0]
    assert engine.tensor([7, -3]).to(BF).float().tolist() == [7.0, -3.0]
    nan = engine.tensor([float("nan")]).to(BF)
    assert np.isnan(nan.float().item())


def test_numpy_and_host_data_are_ml_dtypes_bfloat16():
    x = engine.tensor([1.5, -0.1], dtype=BF)
    arr = x.numpy()
    assert arr.dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(arr.view(np.uint16), rne_bits(np.array([1.5, -0.1], np.float32)))
    for t in (engine.tensor(arr), engine.from_numpy(arr), engine.Tensor(arr)):
        assert t.dtype == BF
        np.testing.assert_array_equal(bits(t), arr.view(np.uint16))
    assert x[0].item() == 1.5 and isinstance(x[0].item(), float) and float(x[0]) == 1.5
    assert x.tolist() == [1.5, float(np.float32(-0.1).astype(ml_dtypes.bfloat16))]
    assert "dtype=engine.bfloat16" in repr(x)
    assert (x + arr).dtype == BF  # a bf16 numpy operand joins as bf16


def test_to_bf16_keeps_the_gradient_float32():
    x = engine.tensor([0.3, -1.7, 2.2], requires_grad=True)
    y = x.to(BF)
    assert y.dtype == BF and y.requires_grad
    (y * 3.0).sum().backward()
    assert x.grad.dtype == engine.float32 and x.grad.tolist() == [3.0, 3.0, 3.0]
    z = engine.randn(2, 3, dtype=BF, requires_grad=True)
    (z.float() * 2.0).sum().backward()
    assert z.grad.dtype == BF and z.grad.float().tolist() == [[2.0] * 3] * 2
    assert engine.randn(2).to("cpu", BF).dtype == BF


# ---- arithmetic: float32 inside, one rounding out --------------------------------------------------

def test_bf16_ops_accumulate_and_scale_in_float32():
    # a bf16 running sum stalls at 256 (256 + 1 rounds back to 256); float32 accumulation does not
    ones = engine.ones(1024, dtype=BF)
    assert ones.sum().item() == 1024.0 and ones.mean().item() == 1.0
    assert (ones.reshape(1, 1024) @ ones.reshape(1024, 1)).item() == 1024.0
    x = engine.randn(300, dtype=BF)
    xf = x.float().numpy()
    # the Python scalar joins in float32 (0.1f), not rounded to bf16 first (0.10009765625)
    np.testing.assert_array_equal(bits(x * 0.1), rne_bits(xf * np.float32(0.1)))
    np.testing.assert_array_equal(bits(F.gelu(x)), bits(F.gelu(x.float()).to(BF)))
    a, b = engine.randn(7, 33, dtype=BF), engine.randn(33, 5, dtype=BF)
    np.testing.assert_array_equal(bits(a @ b), rne_bits(a.float().numpy() @ b.float().numpy()))


def test_bf16_nn_ops_keep_float32_where_the_gpu_does():
    x = engine.randn(6, 8, dtype=BF, requires_grad=True)
    w, b = engine.randn(8, requires_grad=True), engine.randn(8, requires_grad=True)  # float32 affine, as on the GPU
    h = F.layer_norm(x, 8, w, b)
    assert h.dtype == BF
    loss = F.cross_entropy(h, engine.tensor([0, 1, 2, 3, 4, 5]))
    assert loss.dtype == engine.float32  # float32 losses from bf16 logits
    loss.backward()
    assert x.grad.dtype == BF and w.grad.dtype == engine.float32 and b.grad.dtype == engine.float32
    emb = engine.randn(10, 4, requires_grad=True)
    out = F.embedding(engine.tensor([1, 1, 3]), emb.to(BF))
    assert out.dtype == BF
    out.sum().backward()
    assert emb.grad.dtype == engine.float32 and emb.grad.numpy()[1].tolist() == [2.0] * 4
    q = engine.randn(1, 2, 5, 8, dtype=BF, requires_grad=True)
    att = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert att.dtype == BF
    att.sum().backward()
    assert q.grad.dtype == BF and np.isfinite(q.grad.float().numpy()).all()


BITWISE = {  # one correctly rounded float32 operation each, then one rounding: identical bits in torch
    "add": (lambda a, b: a + b, lambda a, b: a + b),
    "sub": (lambda a, b: a - b, lambda a, b: a - b),
    "mul": (lambda a, b: a * b, lambda a, b: a * b),
    "div": (lambda a, b: a / b, lambda a, b: a / b),
    "maximum": (lambda a, b: a.maximum(b), lambda a, b: torch.maximum(a, b)),
    "scalars": (lambda a, b: (2.0 - a) * 0.1 / 3.0, lambda a, b: (2.0 - a) * 0.1 / 3.0),
    "neg_relu": (lambda a, b: F.relu(-a), lambda a, b: torch.relu(-a)),
    "sqrt": (lambda a, b: b.sqrt(), lambda a, b: b.sqrt()),
}

ONE_STEP = {  # float32 libm or summation order may differ from torch's: within one bf16 step
    "exp": (lambda a, b: a.exp(), lambda a, b: a.exp()),
    "log": (lambda a, b: b.log(), lambda a, b: b.log()),
    "tanh": (lambda a, b: F.tanh(a), lambda a, b: torch.tanh(a)),
    "sigmoid": (lambda a, b: F.sigmoid(a), lambda a, b: torch.sigmoid(a)),
    "sum": (lambda a, b: a.sum(1), lambda a, b: a.sum(1)),
    "max": (lambda a, b: a.max(0), lambda a, b: a.amax(0)),
    "matmul": (lambda a, b: a @ a.transpose(0, 1), lambda a, b: a @ a.t()),
    "softmax": (lambda a, b: F.softmax(a, -1), lambda a, b: torch.softmax(a, -1)),
    "layer_norm": (lambda a, b: F.layer_norm(a, 96), lambda a, b: torch.nn.functional.layer_norm(a, (96,))),
}


def _pair():
    a = (rng.standard_normal((64, 96)) * 3).astype(np.float32)
    b = rng.uniform(0.5, 2.0, (96,)).astype(np.float32)
    return (engine.tensor(a, dtype=BF), engine.tensor(b, dtype=BF)), (torch.tensor(a).bfloat16(), torch.tensor(b).bfloat16())


@needs_torch
@pytest.mark.parametrize("name", sorted(BITWISE))
def test_bf16_elementwise_bit_for_bit_as_torch(name):
    fn, torch_fn = BITWISE[name]
    ours, theirs = _pair()
    np.testing.assert_array_equal(bits(fn(*ours)), bits(torch_fn(*theirs)))


@needs_torch
@pytest.mark.parametrize("name", sorted(ONE_STEP))
def test_bf16_ops_within_one_step_of_torch(name):
    fn, torch_fn = ONE_STEP[name]
    ours, theirs = _pair()
    got, want = fn(*ours).float().numpy(), torch_fn(*theirs).float().numpy()
    step = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(want), 2.0**-126))) - 7)  # bf16's spacing at each value
    assert np.all(np.abs(got - want) <= step), f"{np.sum(np.abs(got - want) > step)} values more than one bf16 step apart"


@needs_torch
def test_bf16_gelu_close_to_torch():
    ours, theirs = _pair()
    got = F.gelu(ours[0]).float().numpy()
    want = torch.nn.functional.gelu(theirs[0], approximate="tanh").float().numpy()
    assert np.max(np.abs(got - want)) <= 2.0**-8 * np.max(np.abs(want))


# ---- autocast on the CPU ---------------------------------------------------------------------------

@needs_torch
@pytest.mark.parametrize("activation", [None, "gelu"])
def test_linear_under_cpu_autocast_matches_torch_autocast(activation):
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((6, 5, 16), (24, 16), (24,)))
    g = rng.standard_normal((6, 5, 24)).astype(np.float32)
    ex, ew, eb = (engine.tensor(a, requires_grad=True) for a in (x, w, b))
    with engine.autocast("cpu"):
        y = F.linear(ex, ew, eb, activation=activation)
    assert y.dtype == BF
    (y * engine.tensor(g, dtype=BF)).sum().backward()
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ty = torch.nn.functional.linear(tx, tw, tb)
        ty = torch.nn.functional.gelu(ty, approximate="tanh") if activation else ty
    assert ty.dtype == torch.bfloat16
    (ty * torch.tensor(g).bfloat16()).sum().backward()
    got, want = y.float().numpy(), ty.detach().float().numpy()
    assert np.max(np.abs(got - want)) <= 2 * 2.0**-8 * np.max(np.abs(want))
    for name, ours, theirs in (("x", ex, tx), ("w", ew, tw), ("b", eb, tb)):
        assert ours.grad.dtype == engine.float32, name  # the master weights' gradients stay float32
        ref = theirs.grad.numpy()
        assert np.max(np.abs(ours.grad.numpy() - ref)) <= 1e-2 * np.max(np.abs(ref)), name


def test_fused_classifier_under_cpu_autocast_matches_unfused_and_float32():
    x, w = rng.standard_normal((12, 16)).astype(np.float32), rng.standard_normal((29, 16)).astype(np.float32)
    targets = engine.tensor(np.r_[rng.integers(0, 29, 11), -100])  # one row ignored
    runs = {}
    for name, autocast, loss_fn in (("fused", True, lambda a, b: F.linear_cross_entropy(a, b, targets)),
                                    ("unfused", True, lambda a, b: F.cross_entropy(F.linear(a, b), targets)),
                                    ("float32", False, lambda a, b: F.cross_entropy(F.linear(a, b), targets))):
        ex, ew = engine.tensor(x, requires_grad=True), engine.tensor(w, requires_grad=True)
        with engine.autocast("cpu", enabled=autocast):
            loss = loss_fn(ex, ew)
        loss.backward()
        assert loss.dtype == ex.grad.dtype == ew.grad.dtype == engine.float32, name
        runs[name] = (loss.item(), ex.grad.numpy(), ew.grad.numpy())
    for name in ("fused", "unfused"):
        loss, dx, dw = runs[name]
        ref_loss, ref_dx, ref_dw = runs["float32"]
        assert abs(loss - ref_loss) < 2e-2 * abs(ref_loss), (name, loss, ref_loss)
        assert np.max(np.abs(dx - ref_dx)) < 2e-2 * np.max(np.abs(ref_dx)), name
        assert np.max(np.abs(dw - ref_dw)) < 2e-2 * np.max(np.abs(ref_dw)), name


def _gpt_loss_and_grads(model, x, y, autocast: bool):
    model.zero_grad()
    with engine.autocast("cpu", enabled=autocast):
        logits, loss = model(x, y, return_logits=True)
    loss.backward()
    return loss, logits, {n: p.grad.numpy() for n, p in model.named_parameters()}


def test_gpt_under_cpu_autocast_matches_float32_and_trains():
    cfg = GPTConfig(vocab_size=29, block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.0)
    engine.manual_seed(0)
    model = GPT(cfg)
    data = np.random.default_rng(1).integers(0, 29, (4, 17))
    x, y = engine.tensor(data[:, :-1]), engine.tensor(data[:, 1:])
    l32, _, g32 = _gpt_loss_and_grads(model, x, y, False)
    l16, logits16, g16 = _gpt_loss_and_grads(model, x, y, True)
    assert l16.dtype == engine.float32 and logits16.dtype == BF
    assert abs(l16.item() - l32.item()) < 2e-2 * abs(l32.item()), (l16.item(), l32.item())
    for name, p in model.named_parameters():
        assert p.dtype == engine.float32 and p.grad.dtype == engine.float32, name
        a, b = g16[name].ravel().astype(np.float64), g32[name].ravel().astype(np.float64)
        cos = a @ b / max(1e-30, np.linalg.norm(a) * np.linalg.norm(b))
        assert cos > 0.99, (name, cos)
    opt = engine.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    first = None
    for _ in range(10):
        with engine.autocast("cpu"):
            _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
    assert loss.item() < 0.95 * first


# ---- errors ----------------------------------------------------------------------------------------

def test_errors_say_what_to_do():
    with pytest.raises(TypeError, match="no engine counterpart.*ml_dtypes.bfloat16"):
        engine.tensor(np.zeros(2, dtype=ml_dtypes.float8_e4m3fn))
    with pytest.raises(TypeError, match=r"mixed dtypes engine.bfloat16 and engine.float32.*\.float\(\)"):
        engine.randn(3, dtype=BF) + engine.randn(3)
    p = engine.nn.Parameter(engine.randn(4, dtype=BF))
    (p * 2.0).sum().backward()
    for opt in (engine.optim.AdamW([p], lr=0.1), engine.optim.SGD([p], lr=0.1, momentum=0.9)):
        with pytest.raises(TypeError, match="got bfloat16 ones; keep the parameters in float32.*autocast"):
            opt.step()
    np.testing.assert_array_equal(p.grad.float().numpy(), [2.0] * 4)  # nothing was changed
