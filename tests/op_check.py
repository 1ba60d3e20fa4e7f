"""Gradient checking shared by the op tests: the same call on engine and on a reference.

`check_finite_differences` compares engine's backward with central differences in float64;
`check_against_torch` runs the same function on engine and PyTorch (float32) and compares the
forward output and every input's gradient."""
from __future__ import annotations

import numpy as np

import engine


def make_inputs(shapes, seed: int = 0, low: float = -2.0, high: float = 2.0):
    rng = np.random.default_rng(seed)
    return [rng.uniform(low, high, size=s) for s in shapes]


def _engine_grads(fn, arrays, dtype, device="cpu"):
    ts = [engine.tensor(a, dtype=dtype, device=device, requires_grad=True) for a in arrays]
    out = fn(*ts)
    # a fixed random weighting makes every output element matter to the scalar being differentiated
    w = np.random.default_rng(123).standard_normal(out.shape)
    (out * engine.tensor(w, dtype=dtype, device=device)).sum().backward()
    return out.numpy(), [None if t.grad is None else t.grad.numpy() for t in ts], w


def check_finite_differences(fn, shapes, seed=0, low=-2.0, high=2.0, eps=1e-6, atol=1e-6, rtol=1e-5, max_checks=40):
    """Engine float64 backward vs central differences of the same engine function."""
    arrays = make_inputs(shapes, seed, low, high)
    out, grads, w = _engine_grads(fn, arrays, engine.float64)
    rng = np.random.default_rng(seed + 1)

    def objective(arrs):
        with engine.no_grad():
            y = fn(*[engine.tensor(a, dtype=engine.float64) for a in arrs]).numpy()
        return float((y * w).sum())

    for i, a in enumerate(arrays):
        flat_idx = rng.choice(a.size, size=min(max_checks, a.size), replace=False)
        for j in flat_idx:
            plus = [x.copy() for x in arrays]
            minus = [x.copy() for x in arrays]
            plus[i].reshape(-1)[j] += eps
            minus[i].reshape(-1)[j] -= eps
            numeric = (objective(plus) - objective(minus)) / (2 * eps)
            analytic = grads[i].reshape(-1)[j]
            assert abs(numeric - analytic) <= atol + rtol * abs(numeric), (
                f"input {i} element {j}: finite differences {numeric}, backward {analytic}")


def check_against_torch(fn, torch_fn, shapes, seed=0, low=-2.0, high=2.0, atol=1e-5, rtol=1e-4, device="cpu"):
    """The same call on engine (float32, on `device`) and PyTorch CPU: outputs and gradients agree."""
    import torch

    arrays = [a.astype(np.float32) for a in make_inputs(shapes, seed, low, high)]
    out, grads, w = _engine_grads(fn, arrays, engine.float32, device)
    tt = [torch.tensor(a, requires_grad=True) for a in arrays]
    tout = torch_fn(*tt)
    (tout * torch.tensor(w, dtype=torch.float32)).sum().backward()
    np.testing.assert_allclose(out, tout.detach().numpy(), atol=atol, rtol=rtol, err_msg="forward")
    for i, (g, t) in enumerate(zip(grads, tt)):
        if t.grad is None:
            assert g is None or not np.any(g), f"input {i}: torch has no gradient, engine has one"
            continue
        np.testing.assert_allclose(g, t.grad.numpy(), atol=atol, rtol=rtol, err_msg=f"gradient of input {i}")


def _bf16_run(fn, arrays, w, make, backward):
    """fn on `arrays` made into tensors by `make`, weighted by w and differentiated: (out, grads) float64."""
    ts = [make(a) for a in arrays]
    out = fn(*ts)
    backward(out, ts, w)
    return [np.asarray(_float64(out))] + [None if t.grad is None else np.asarray(_float64(t.grad)) for t in ts]


def _float64(t):
    try:
        return t.detach().float().numpy().astype(np.float64)  # torch
    except AttributeError:
        return t.float().numpy().astype(np.float64)  # engine


def check_bf16_against_torch(fn, torch_fn, shapes, seed=0, low=-2.0, high=2.0, ulps=2.0, device="cpu"):
    """The same call on engine bf16 (on `device`), torch bf16 and torch float32, all on the same inputs
    rounded to bf16: forward and every gradient. The float32 run is the reference; engine's bf16 error
    (largest deviation over the largest reference value) must be within twice torch's bf16 error plus
    `ulps` bf16 rounding steps (2^-8 each), i.e. no worse than PyTorch's own bf16 by more than rounding."""
    import torch

    arrays = [a.astype(np.float32) for a in make_inputs(shapes, seed, low, high)]
    arrays = [torch.tensor(a).to(torch.bfloat16).float().numpy() for a in arrays]  # exactly representable in bf16
    w = np.random.default_rng(123).standard_normal(np.shape(fn(*[engine.tensor(a) for a in arrays]).numpy()))
    w = torch.tensor(w, dtype=torch.float32).to(torch.bfloat16).float().numpy()

    def engine_backward(out, ts, w):
        (out * engine.tensor(w, dtype=out.dtype, device=device)).sum().backward()

    def torch_backward(out, ts, w):
        (out * torch.tensor(w, dtype=out.dtype)).sum().backward()

    def torch_make(dtype):
        return lambda a: torch.tensor(a, dtype=dtype, requires_grad=True)

    got = _bf16_run(fn, arrays, w, lambda a: engine.tensor(a, dtype=engine.bfloat16, device=device,
                                                            requires_grad=True), engine_backward)
    theirs = _bf16_run(torch_fn, arrays, w, torch_make(torch.bfloat16), torch_backward)
    ref = _bf16_run(torch_fn, arrays, w, torch_make(torch.float32), torch_backward)
    for i, (g, t, r) in enumerate(zip(got, theirs, ref)):
        what = "forward" if i == 0 else f"gradient of input {i - 1}"
        if r is None:
            assert g is None or not np.any(g), f"{what}: torch has none, engine has one"
            continue
        scale = max(float(np.max(np.abs(r))), 1e-30)
        err, torch_err = float(np.max(np.abs(g - r))) / scale, float(np.max(np.abs(t - r))) / scale
        assert err <= 2.0 * torch_err + ulps * 2.0 ** -8, (
            f"{what}: engine bf16 is {err:.2e} (of the largest value) from float32, torch bf16 {torch_err:.2e}")
