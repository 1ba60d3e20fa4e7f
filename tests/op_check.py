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
