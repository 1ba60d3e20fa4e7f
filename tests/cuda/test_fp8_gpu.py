"""FP8 on the GPU (csrc/cuda/fp8/ and cuBLASLt's FP8 GEMM) against the CPU backend's numpy reference
(engine/backends/cpu/fp8.py, itself tested against the formats' definitions in tests/engine/test_fp8.py).

The casts bit for bit: the codes, the inverse scale and the whole meta (scale and amax history) after
every cast of a sequence, for both formats, float32 and bf16 inputs, vectorised, unaligned and odd-sized
tensors, with and without the transposed copy; and the E5M2 codes (and their transpose) that the
bias-gradient kernel writes of its gradient, after the GELU backward or without it. The FP8 GEMM within
bf16's rounding (2^-7 relative, plus 1e-3 of the largest value for the order of the float32 sums) of the
reference on the same codes. The classifier kernel's E5M2 gradient codes as the reference's (a code at
most one step off: its exp is the SFU's). A linear layer and the classifier under autocast, forward and
backward, within 2e-2 of the norm of the CPU backend's FP8 run on the same inputs; a captured training
step with FP8 bit for bit the eager step; a GPT trained in FP8 within 2% of the way bf16's loss came
down.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import engine
import engine.fp8
import engine.nn.functional as F
from engine.backends import cuda as gpu
from engine.backends.cpu import fp8 as c8
from engine.graphs import CapturedStep
from engine.nn import GPT, GPTConfig, Linear, Module
from engine.optim import AdamW

rng = np.random.default_rng(0)


def _fp8_gemm_available() -> bool:
    a = gpu.from_numpy(np.zeros((16, 16), np.uint8))
    one = gpu.from_numpy(np.ones(1, np.float32))
    return gpu.matmul_fp8(a, "e4m3", one, a, "e4m3", one) is not None


needs_fp8 = pytest.mark.skipif(not (engine.cuda.is_available() and _fp8_gemm_available()),
                               reason="needs a GPU whose cuBLASLt has an FP8 GEMM (Hopper or later)")


def _values(shape, scale=1.0, dtype=np.float32):
    x = (rng.standard_normal(shape) * scale).astype(np.float32)
    return x.astype(ml_dtypes.bfloat16) if dtype == "bf16" else x


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, "bf16"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("shape", [(64, 96), (33, 17), (1, 5), (300, 128), (256, 192)])
def test_casts_and_their_scaling_are_bit_for_bit_the_reference(shape, fmt, dtype, transpose):
    dmeta, hmeta = gpu.fp8_meta(gpu.from_numpy(np.zeros(1, np.float32))), c8.fp8_meta(None)
    for i, scale in enumerate([3.0, 0.01, 50.0, 1.0, 1e4 if fmt == "e5m2" else 400.0, 0.5]):
        x = _values(shape, scale, dtype)
        got = gpu.fp8_cast(gpu.from_numpy(x), fmt, dmeta, current=i == 0, transpose=transpose)
        want = c8.fp8_cast(x, fmt, hmeta, current=i == 0, transpose=transpose)
        np.testing.assert_array_equal(gpu.to_numpy(got[0]), want[0], err_msg=f"cast {i}: codes")
        if transpose:
            np.testing.assert_array_equal(gpu.to_numpy(got[1]), want[1], err_msg=f"cast {i}: transposed codes")
        else:
            assert got[1] is None
        np.testing.assert_array_equal(gpu.to_numpy(got[2]), want[2], err_msg=f"cast {i}: inverse scale")
        np.testing.assert_array_equal(gpu.to_numpy(dmeta), hmeta, err_msg=f"cast {i}: meta")


def test_an_unaligned_view_casts_as_its_values():
    base = gpu.from_numpy(_values((4099,), 2.0))
    view = gpu.getitem(base, (slice(3, 4099),))  # 3 elements in: not 16-byte aligned
    got = gpu.fp8_cast(view, "e4m3", gpu.fp8_meta(base), current=True)
    want = c8.fp8_cast(gpu.to_numpy(view), "e4m3", c8.fp8_meta(None), current=True)
    np.testing.assert_array_equal(gpu.to_numpy(got[0]), want[0])


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("gelu", [True, False])
@pytest.mark.parametrize("N,O", [(96, 256), (80, 264), (4096, 64), (90, 256)])  # partial groups, strips
def test_the_bias_kernel_writes_its_gradients_e5m2_codes_as_a_cast_would(N, O, gelu, transposed):
    pre = gpu.from_numpy(_values((N, O), 1.0, "bf16")) if gelu else None
    dmeta, hmeta = gpu.fp8_meta(gpu.from_numpy(np.zeros(1, np.float32))), c8.fp8_meta(None)
    for step, scale in enumerate([1e-3, 5e-2, 2e-3]):
        g = gpu.from_numpy(_values((N, O), scale, "bf16"))
        plain_db, plain_dpre, _ = gpu._bias_grad(g, pre, engine.float32)
        d = gpu.to_numpy(plain_dpre if gelu else g)  # the values the codes are of
        if step == 0:  # a history first: the fused cast scales by it
            gpu.fp8_cast(gpu.from_numpy(d), "e5m2", dmeta, current=True)
            c8.fp8_cast(d, "e5m2", hmeta, current=True)
            continue
        db, dpre, cast = gpu._bias_grad(g, pre, engine.float32, dmeta, transposed)
        if transposed and N % 16:  # no transposed codes of a ragged K for the FP8 GEMM: the kernel declines
            assert (db, dpre, cast) == (None, None, None)
            return
        want = c8.fp8_cast(d, "e5m2", hmeta, current=False, transpose=transposed)
        np.testing.assert_array_equal(gpu.to_numpy(cast[0]), want[0], err_msg=f"step {step}: codes")
        if transposed:
            np.testing.assert_array_equal(gpu.to_numpy(cast[2]), want[1], err_msg=f"step {step}: transposed")
        else:
            assert cast[2] is None
        np.testing.assert_array_equal(gpu.to_numpy(cast[1]), want[2], err_msg=f"step {step}: inverse scale")
        np.testing.assert_array_equal(gpu.to_numpy(dmeta), hmeta, err_msg=f"step {step}: meta")
        # the codes change nothing else: the bias sums (in another order), and dpre unless the codes
        # replace it
        np.testing.assert_allclose(gpu.to_numpy(db), gpu.to_numpy(plain_db), rtol=1e-5,
                                   atol=1e-6 * np.abs(gpu.to_numpy(plain_db)).max())
        if gelu and transposed:
            assert dpre is None
        elif gelu:
            np.testing.assert_array_equal(gpu.to_numpy(dpre), gpu.to_numpy(plain_dpre))


@needs_fp8
@pytest.mark.parametrize("fast_accum", [False, True])
@pytest.mark.parametrize("epilogue", [None, "bias", "gelu", "gelu_bias"])
@pytest.mark.parametrize("formats", [("e4m3", "e4m3"), ("e5m2", "e4m3"), ("e4m3", "e5m2")])
def test_the_fp8_gemm_matches_the_reference(formats, epilogue, fast_accum):
    M, N, K = 160, 96, 256
    (fa, fb), act = formats, ("gelu" if epilogue and "gelu" in epilogue else None)
    a, _, ia = c8.fp8_cast(_values((M, K), 2.0), fa, c8.fp8_meta(None), current=True)
    b, _, ib = c8.fp8_cast(_values((N, K), 0.1), fb, c8.fp8_meta(None), current=True)
    bias = _values((N,), 1.0, "bf16") if epilogue and "bias" in epilogue else None
    want_out, want_pre = c8.matmul_fp8(a, fa, ia, b, fb, ib, bias, act)
    d = [gpu.from_numpy(v) if v is not None else None for v in (a, ia, b, ib, bias)]
    out, pre = gpu.matmul_fp8(d[0], fa, d[1], d[2], fb, d[3], d[4], act, fast_accum=fast_accum)

    def close(got, want, what):
        want = want.astype(np.float32)
        np.testing.assert_allclose(gpu.to_numpy(got).astype(np.float32), want, rtol=2 ** -7,
                                   atol=1e-3 * np.abs(want).max(), err_msg=what)

    close(out, want_out, "out")
    if act:
        close(pre, want_pre, "pre-activation")
    else:
        assert pre is None
    with pytest.raises(ValueError, match="E4M3"):
        gpu.matmul_fp8(d[0], "e5m2", d[1], d[0], "e5m2", d[1])
    if epilogue is None:  # the weight gradient's form: float32 out, not rounded
        got32, _ = gpu.matmul_fp8(d[0], fa, d[1], d[2], fb, d[3], out_dtype=engine.float32, fast_accum=fast_accum)
        want32, _ = c8.matmul_fp8(a, fa, ia, b, fb, ib, out_dtype=engine.float32)
        np.testing.assert_allclose(gpu.to_numpy(got32), want32, rtol=1e-4, atol=1e-3 * np.abs(want32).max())


@needs_fp8
@pytest.mark.parametrize("activation", [None, "gelu"])
def test_an_fp8_linear_layer_matches_the_cpu_backend_forward_and_backward(activation):
    x = _values((4, 48, 128), 1.0)
    g = _values((4, 48, 256), 1.0)
    results = []
    for device in ("cpu", "cuda"):
        engine.manual_seed(0)
        layer = Linear(128, 256).to(device)
        engine.fp8.enable(layer)
        xt = engine.tensor(x, device=device, requires_grad=True)
        outs = []
        for _ in range(3):  # the first step scales by its own amax, the later ones by the history
            for p in layer.parameters():
                p.grad = None
            xt.grad = None
            with engine.autocast(device):
                y = F.linear(xt, layer.weight, layer.bias, activation=activation, fp8=layer.fp8)
            (y.float() * engine.tensor(g, device=device)).sum().backward()
            outs.append([y.float().numpy(), xt.grad.float().numpy(), layer.weight.grad.numpy(),
                         layer.bias.grad.numpy()])
        results.append(outs)
    for step, (want, got) in enumerate(zip(*results)):
        for name, w, o in zip(("y", "dx", "dw", "db"), want, got):
            err = np.linalg.norm(o - w) / np.linalg.norm(w)
            assert err < 2e-2, f"step {step}, {name}: off by {err:.3g} of its norm"


# 250: rows not 16-byte aligned, the kernel's scalar path; 32776: rows staged in shared memory
@pytest.mark.parametrize("V", [256, 250, 32776])
def test_the_classifier_kernel_writes_the_gradients_e5m2_codes_as_the_reference(V):
    logits = _values((37, V), 4.0, "bf16")
    targets = rng.integers(0, V, 37)
    targets[3] = -1
    got = gpu.cross_entropy_with_grad_fp8_(gpu.from_numpy(logits), gpu.from_numpy(targets), -1)
    want = c8.cross_entropy_with_grad_fp8_(logits.copy(), targets, -1)
    np.testing.assert_allclose(gpu.to_numpy(got[0]), want[0], rtol=1e-5, atol=1e-5)
    # the kernel's exp is the SFU's: a code may sit one step from the reference's
    diff = np.abs(c8.fp8_values(gpu.to_numpy(got[1]), "e5m2") - c8.fp8_values(want[1], "e5m2"))
    assert (diff <= 0.25 * np.abs(c8.fp8_values(want[1], "e5m2")) + 2 ** -16).all()
    assert (gpu.to_numpy(got[1]) == want[1]).mean() > 0.99
    assert gpu.to_numpy(got[2])[0] == want[2][0] == 2.0 ** -15


@needs_fp8
def test_the_fp8_classifier_matches_the_cpu_backend():
    x = _values((64, 128), 1.0)
    w = _values((320, 128), 0.1)
    targets = rng.integers(0, 320, 64)
    results = []
    for device in ("cpu", "cuda"):
        state = engine.fp8.Fp8State()
        steps = []
        for _ in range(2):
            xt = engine.tensor(x, device=device, requires_grad=True)
            wt = engine.tensor(w, device=device, requires_grad=True)
            with engine.autocast(device):
                loss = F.linear_cross_entropy(xt.type(engine.bfloat16), wt, engine.tensor(targets, device=device),
                                              fp8=state)
            loss.backward()
            steps.append([np.array([loss.item()]), xt.grad.numpy(), wt.grad.numpy()])
        results.append(steps)
    for step, (want, got) in enumerate(zip(*results)):
        for name, w_, o in zip(("loss", "dx", "dw"), want, got):
            err = np.linalg.norm(o - w_) / np.linalg.norm(w_)
            assert err < 2e-2, f"step {step}, {name}: off by {err:.3g} of its norm"


class _MLP(Module):
    def __init__(self, d=64, h=128):
        super().__init__()
        self.fc = Linear(d, h)
        self.proj = Linear(h, d)

    def forward(self, x):
        return self.proj(F.linear(x, self.fc.weight, self.fc.bias, activation="gelu", fp8=self.fc.fp8))


@needs_fp8
def test_a_captured_fp8_step_is_bit_for_bit_the_eager_step():
    data = [(_values((32, 64)), _values((32, 64))) for _ in range(6)]
    runs = []
    for use_graph in (False, True):
        engine.manual_seed(0)
        model = _MLP().to("cuda")
        engine.fp8.enable(model)
        opt = AdamW(model.parameters(), lr=1e-3)

        def step(x, y, model=model, opt=opt):
            opt.zero_grad()
            with engine.autocast("cuda"):
                d = model(x).float() - y
            loss = (d * d).mean()
            loss.backward()
            opt.step()
            return loss

        run = CapturedStep(step, warmup=1) if use_graph else step
        losses = []
        for x, y in data:
            args = (x, y) if use_graph else (engine.tensor(x, device="cuda"), engine.tensor(y, device="cuda"))
            losses.append(float(run(*args).numpy()))
        if use_graph:
            assert run.captured and run.replays == len(data) - 1
        runs.append((losses, [p.numpy() for p in model.parameters()],
                     [gpu.to_numpy(m) for m in model.fc.fp8._metas.values()]))
    (l0, w0, m0), (l1, w1, m1) = runs
    assert l0 == l1
    for a, b in zip(w0, w1):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(m0, m1):  # the replays updated the scales on the device as the eager steps did
        np.testing.assert_array_equal(a, b)
    assert m1[0][5] > 0, "the history holds more than the first cast"


@needs_fp8
@pytest.mark.slow
def test_a_gpt_trains_in_fp8_about_as_well_as_in_bf16():
    cfg = GPTConfig(vocab_size=65, block_size=64, n_layer=2, n_head=4, n_embd=128, dropout=0.0)
    tokens = [1, 2]
    while len(tokens) < 4096:  # a learnable sequence: each token follows from the last two
        tokens.append((tokens[-1] + tokens[-2]) % 65)
    tokens = np.array(tokens)
    finals = {}
    for fp8 in (False, True):
        engine.manual_seed(0)
        model = GPT(cfg).to("cuda")
        engine.fp8.enable(model, fp8)
        opt = AdamW(model.optimizer_groups(0.1), lr=3e-3)
        batches = np.random.default_rng(1)
        losses = []
        for _ in range(80):
            s = batches.integers(0, len(tokens) - 65, 16)
            x = engine.tensor(np.stack([tokens[i:i + 64] for i in s]), device="cuda")
            y = engine.tensor(np.stack([tokens[i + 1:i + 65] for i in s]), device="cuda")
            with engine.autocast("cuda"):
                _, loss = model(x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.numpy()))
        finals[fp8] = np.mean(losses[-10:])
    drop = np.log(65) - finals[False]
    assert drop > 0.5, f"bf16 did not learn: {finals}"
    assert abs(finals[True] - finals[False]) < 0.02 * drop, finals



@needs_fp8
def test_coop_trains_with_precision_fp8_in_a_captured_step():
    from coop.training import TrainStep, autocast_for

    engine.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=65, block_size=32, n_layer=2, n_head=2, n_embd=64)).to("cuda")
    opt = AdamW(model.optimizer_groups(0.1), lr=1e-3)
    step = TrainStep(model, opt, device="cuda", lr=1e-3, min_lr=1e-4, warmup_steps=2, total_steps=20,
                     precision="fp8")
    assert engine.fp8.is_enabled(model)
    batch = np.random.default_rng(0).integers(0, 65, (4, 33))
    losses = [float(step(batch[:, :-1], batch[:, 1:]).numpy()) for _ in range(8)]
    assert step.captured is not None and step.captured.captured
    assert np.isfinite(losses).all() and losses[-1] < losses[0]
    with pytest.raises(ValueError, match="needs a CUDA device"):
        autocast_for("cpu", "fp8")
