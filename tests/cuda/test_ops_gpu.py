"""Every op of tests/engine/test_ops.py (forward and backward through autograd) on the GPU, against
the same call on the CPU backend. float32, TF32 off; atol 1e-5 + rtol 1e-4."""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

import engine
import engine.nn.functional as F
from op_check import _engine_grads, make_inputs

_spec = importlib.util.spec_from_file_location(
    "engine_op_cases", os.path.join(os.path.dirname(__file__), "..", "engine", "test_ops.py"))
_cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_cases)
CASES = _cases.CASES


def _compare(fn, arrays, atol=1e-5, rtol=1e-4):
    out_c, grads_c, _ = _engine_grads(fn, arrays, engine.float32, "cpu")
    out_g, grads_g, _ = _engine_grads(fn, arrays, engine.float32, "cuda")
    np.testing.assert_allclose(out_g, out_c, atol=atol, rtol=rtol, err_msg="forward")
    for i, (gg, gc) in enumerate(zip(grads_g, grads_c)):
        assert (gg is None) == (gc is None), f"input {i}: gradient on one device only"
        if gc is not None:
            np.testing.assert_allclose(gg, gc, atol=atol, rtol=rtol, err_msg=f"gradient of input {i}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_matches_cpu(name, no_tf32):
    fn, _, shapes, rng = CASES[name]
    low, high = rng or (-2.0, 2.0)
    arrays = [a.astype(np.float32) for a in make_inputs(shapes, 0, low, high)]
    _compare(fn, arrays)


@pytest.mark.parametrize("ignore_index", [-100, 2])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_matches_cpu(ignore_index, reduction):
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((6, 5)).astype(np.float32)
    targets = rng.integers(0, 5, 6)
    targets[[1, 4]] = ignore_index
    outs = {}
    for dev in ("cpu", "cuda"):
        t = engine.tensor(targets, device=dev)
        outs[dev] = _engine_grads(lambda x: F.cross_entropy(x, t, ignore_index=ignore_index,
                                                             reduction=reduction).reshape(-1), [logits],
                                  engine.float32, dev)
    np.testing.assert_allclose(outs["cuda"][0], outs["cpu"][0], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(outs["cuda"][1][0], outs["cpu"][1][0], atol=1e-6, rtol=1e-5)


def test_embedding_matches_cpu():
    idx_np = np.array([[0, 2, 2], [1, 2, 0]])
    w = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
    res = {}
    for dev in ("cpu", "cuda"):
        idx = engine.tensor(idx_np, device=dev)
        res[dev] = _engine_grads(lambda w_: F.embedding(idx, w_), [w], engine.float32, dev)
    np.testing.assert_allclose(res["cuda"][0], res["cpu"][0])
    np.testing.assert_allclose(res["cuda"][1][0], res["cpu"][1][0], atol=1e-6)


@pytest.mark.parametrize("autocast", [False, True])
def test_embedding_with_positions_matches_cpu(autocast):
    """The token + position embedding kernel (float32 tables into float32, or bf16 under autocast: the sum
    rounded once) and its backward (one cast, scatter-add, the batch's sum for the positions), against
    the CPU backend; B 3, T 5 from position 2 of 9, C 260 (more than a block's threads)."""
    r = np.random.default_rng(2)
    idx_np = r.integers(0, 7, (3, 5))
    idx_np[0, :2] = 4  # a token seen twice
    w, p, g = (r.standard_normal(s).astype(np.float32) for s in ((7, 260), (9, 260), (3, 5, 260)))
    res = {}
    for dev in ("cpu", "cuda"):
        idx = engine.tensor(idx_np, device=dev)
        wt, pt = (engine.tensor(a, device=dev, requires_grad=True) for a in (w, p))
        with engine.autocast(dev, dtype=engine.bfloat16, enabled=autocast):
            out = F.embedding_with_positions(idx, wt, pt, 2)
        assert out.dtype is (engine.bfloat16 if autocast else engine.float32)
        (out.float() * engine.tensor(g, device=dev)).sum().backward()
        res[dev] = (out.float().numpy(), wt.grad.numpy(), pt.grad.numpy())
    for got, want in zip(res["cuda"], res["cpu"]):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(res["cuda"][2][:2], 0.0)


def test_dropout_on_gpu_is_seeded_and_inverted():
    x = engine.ones(300, 200, device="cuda", requires_grad=True)
    engine.manual_seed(7)
    y = F.dropout(x, 0.3, training=True)
    kept = y.numpy() != 0
    assert abs(kept.mean() - 0.7) < 0.01
    np.testing.assert_allclose(y.numpy()[kept], 1 / 0.7, rtol=1e-6)
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy() != 0, kept)
    engine.manual_seed(7)
    np.testing.assert_array_equal(F.dropout(x, 0.3).numpy(), y.numpy())


def test_mixed_devices_raise_naming_both():
    a = engine.ones(3, device="cuda")
    b = engine.ones(3)
    with pytest.raises(RuntimeError, match="cpu"):
        _ = a + b


def test_tensor_methods_on_gpu():
    t = engine.arange(12, device="cuda").reshape(3, 4)
    assert t.device == engine.device("cuda:0") and t.is_cuda
    assert t.sum().item() == 66 and t.max().item() == 11
    assert t.argmax(-1).tolist() == [3, 3, 3]
    f = t.float()
    np.testing.assert_allclose(f.mean(1).numpy(), [1.5, 5.5, 9.5])
    np.testing.assert_array_equal((t > 5).numpy(), np.arange(12).reshape(3, 4) > 5)
    np.testing.assert_array_equal(t.T.numpy(), np.arange(12).reshape(3, 4).T)
    np.testing.assert_array_equal(t.to("cpu").numpy(), np.arange(12).reshape(3, 4))
    z = engine.zeros(2, 3, device="cuda")
    z.fill_(4.0)
    assert z.sum().item() == 24.0
    assert engine.randn(5, device="cuda").device.type == "cuda"
