"""Every op, forward and backward: against finite differences (float64) and against PyTorch (float32,
and bfloat16 on the CPU).

Each case is one call written twice, once for engine and once for torch, on the same inputs.
Tolerances: finite differences atol 1e-6 + rtol 1e-5 (float64); torch atol 1e-5 + rtol 1e-4 (float32)
unless a case says otherwise; bf16: engine's and torch's bf16 runs against torch float32 on the same
bf16 inputs, engine's error within twice torch's plus two bf16 steps (2^-8) of the largest value."""
from __future__ import annotations

import numpy as np
import pytest

import engine
import engine.nn.functional as F
from op_check import check_against_torch, check_bf16_against_torch, check_finite_differences

try:
    import torch
    import torch.nn.functional as TF
except ImportError:  # the torch comparisons skip; finite differences still run
    torch = TF = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


def _causal_torch(q, k, v):
    return TF.scaled_dot_product_attention(q, k, v, is_causal=True)


def _projected_torch(x, w, b, n_head=2, causal=True):
    B, T, _ = x.shape
    qkv = TF.linear(x, w, b).reshape(B, T, 3, n_head, -1).permute(2, 0, 3, 1, 4)  # (3, B, H, T, D)
    y = TF.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=causal)
    return y.permute(0, 2, 1, 3).reshape(B, T, -1)


_EMB_IDX = engine.tensor(np.array([[0, 3, 3], [4, 1, 0]]))  # (B, T) tokens, one seen twice, for the embedding case

# name: (engine fn, torch fn, input shapes, input range)
CASES = {
    "add_broadcast": (lambda a, b: a + b, lambda a, b: a + b, [(3, 4), (4,)], None),
    "sub_broadcast": (lambda a, b: a - b, lambda a, b: a - b, [(2, 1, 4), (3, 1)], None),
    "mul_broadcast": (lambda a, b: a * b, lambda a, b: a * b, [(2, 3, 4), (1, 3, 1)], None),
    "div": (lambda a, b: a / b, lambda a, b: a / b, [(3, 4), (3, 4)], (0.5, 2.0)),
    "scalar_ops": (lambda a: (2.0 - a) * 3.0 / 1.5 + 1.0 - 0.5 / (a + 3.0), lambda a: (2.0 - a) * 3.0 / 1.5 + 1.0 - 0.5 / (a + 3.0), [(5,)], None),
    "pow_scalar": (lambda a: a ** 3, lambda a: a ** 3, [(3, 4)], None),
    "pow_tensor": (lambda a, b: a ** b, lambda a, b: a ** b, [(3, 4), (3, 4)], (0.5, 2.0)),
    "rpow": (lambda a: 2.0 ** a, lambda a: 2.0 ** a, [(6,)], None),
    "neg": (lambda a: -a, lambda a: -a, [(3, 4)], None),
    "relu": (F.relu, TF.relu if TF else None, [(4, 5)], None),
    "gelu_tanh": (F.gelu, (lambda a: TF.gelu(a, approximate="tanh")) if TF else None, [(4, 5)], (-4.0, 4.0)),
    "sigmoid": (F.sigmoid, torch.sigmoid if torch else None, [(4, 5)], (-6.0, 6.0)),
    "tanh": (F.tanh, torch.tanh if torch else None, [(4, 5)], None),
    "exp": (lambda a: a.exp(), lambda a: a.exp(), [(4, 5)], None),
    "log": (lambda a: a.log(), lambda a: a.log(), [(4, 5)], (0.1, 3.0)),
    "abs": (lambda a: a.abs(), lambda a: a.abs(), [(4, 5)], None),
    "sqrt": (lambda a: a.sqrt(), lambda a: a.sqrt(), [(4, 5)], (0.1, 3.0)),
    "maximum": (lambda a, b: a.maximum(b), lambda a, b: torch.maximum(a, b), [(4, 5), (5,)], None),
    "sum_all": (lambda a: a.sum(), lambda a: a.sum(), [(3, 4, 5)], None),
    "sum_axes_keepdim": (lambda a: a.sum((0, 2), keepdim=True), lambda a: a.sum((0, 2), keepdim=True), [(3, 4, 5)], None),
    "mean_axis": (lambda a: a.mean(1), lambda a: a.mean(1), [(3, 4, 5)], None),
    "mean_neg_axis_keepdim": (lambda a: a.mean(-1, keepdim=True), lambda a: a.mean(-1, keepdim=True), [(3, 4, 5)], None),
    "max_axis": (lambda a: a.max(1), lambda a: a.amax(1), [(3, 4, 5)], None),
    "max_keepdim": (lambda a: a.max(-1, keepdim=True), lambda a: a.amax(-1, keepdim=True), [(3, 4, 5)], None),
    "var": (lambda a: a.var(-1), lambda a: a.var(-1), [(3, 6)], None),
    "matmul_2d": (lambda a, b: a @ b, lambda a, b: a @ b, [(3, 4), (4, 5)], None),
    "matmul_batched": (lambda a, b: a @ b, lambda a, b: a @ b, [(2, 3, 4), (2, 4, 5)], None),
    "matmul_broadcast": (lambda a, b: a @ b, lambda a, b: a @ b, [(2, 1, 3, 4), (3, 4, 2)], None),
    "matmul_vector": (lambda a, b: a @ b, lambda a, b: a @ b, [(3, 4), (4,)], None),
    "linear": (lambda x, w, b: F.linear(x, w, b), TF.linear if TF else None, [(2, 3, 4), (5, 4), (5,)], None),
    "linear_no_bias": (lambda x, w: F.linear(x, w), TF.linear if TF else None, [(2, 3, 4), (5, 4)], None),
    "linear_gelu": (lambda x, w, b: F.linear(x, w, b, activation="gelu"),
                    (lambda x, w, b: TF.gelu(TF.linear(x, w, b), approximate="tanh")) if TF else None,
                    [(2, 3, 4), (8, 4), (8,)], None),
    "linear_gelu_no_bias": (lambda x, w: F.linear(x, w, activation="gelu"),
                            (lambda x, w: TF.gelu(TF.linear(x, w), approximate="tanh")) if TF else None,
                            [(3, 4), (8, 4)], None),
    "reshape_permute": (lambda a: a.reshape(4, 6).transpose(0, 1).reshape(2, 12).permute(1, 0),
                        lambda a: a.reshape(4, 6).transpose(0, 1).reshape(2, 12).permute(1, 0), [(2, 3, 4)], None),
    "getitem_slices": (lambda a: a[:, 1:3, ::2] * a[0, -1, None, ::2], lambda a: a[:, 1:3, ::2] * a[0, -1, None, ::2], [(3, 4, 5)], None),
    "getitem_ellipsis": (lambda a: a[..., -1], lambda a: a[..., -1], [(3, 4, 5)], None),
    "expand": (lambda a: a.expand(3, 4, 5) * 2.0, lambda a: a.expand(3, 4, 5) * 2.0, [(4, 1)], None),
    "cat": (lambda a, b: engine.cat([a, b, a], 1), lambda a, b: torch.cat([a, b, a], 1), [(2, 3, 4), (2, 1, 4)], None),
    "stack": (lambda a, b: engine.stack([a, b], -1), lambda a, b: torch.stack([a, b], -1), [(2, 3), (2, 3)], None),
    "split": (lambda a: engine.cat([p * (i + 1.0) for i, p in enumerate(a.split([1, 3, 2], 1))], 1),
              lambda a: torch.cat([p * (i + 1.0) for i, p in enumerate(a.split([1, 3, 2], 1))], 1), [(2, 6, 3)], None),
    "chunk": (lambda a: a.chunk(2, -1)[1] - a.chunk(2, -1)[0], lambda a: a.chunk(2, -1)[1] - a.chunk(2, -1)[0], [(3, 6)], None),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, 6, w, b), lambda x, w, b: TF.layer_norm(x, (6,), w, b), [(2, 3, 6), (6,), (6,)], None),
    "layer_norm_no_affine": (lambda x: F.layer_norm(x, 6), lambda x: TF.layer_norm(x, (6,)), [(4, 6)], None),
    # add_layer_norm's two outputs, both used; then only the normalised one, then only the sum
    "add_layer_norm": (lambda x, r, w, b: (lambda s, h: s * 0.5 + h * h)(*F.add_layer_norm(x, r, 6, w, b)),
                       lambda x, r, w, b: (lambda s: s * 0.5 + TF.layer_norm(s, (6,), w, b) ** 2)(x + r),
                       [(2, 3, 6), (2, 3, 6), (6,), (6,)], None),
    # with the residual bias (a projection's bias left to the layer norm's op): both outputs, then the sum only
    "add_layer_norm_residual_bias": (
        lambda x, r, w, b, rb: (lambda s, h: s * 0.5 + h * h)(*F.add_layer_norm(x, r, 6, w, b, residual_bias=rb)),
        lambda x, r, w, b, rb: (lambda s: s * 0.5 + TF.layer_norm(s, (6,), w, b) ** 2)(x + (r + rb)),
        [(2, 3, 6), (2, 3, 6), (6,), (6,), (6,)], None),
    "add_layer_norm_residual_bias_sum_only": (lambda x, r, rb: F.add_layer_norm(x, r, 6, residual_bias=rb)[0] * 3.0,
                                              lambda x, r, rb: (x + (r + rb)) * 3.0, [(4, 6), (4, 6), (6,)], None),
    "add_layer_norm_out_only": (lambda x, r: F.add_layer_norm(x, r, 6)[1] ** 2,
                                lambda x, r: TF.layer_norm(x + r, (6,)) ** 2, [(4, 6), (4, 6)], None),
    "add_layer_norm_sum_only": (lambda x, r: F.add_layer_norm(x, r, 6)[0] * 3.0, lambda x, r: (x + r) * 3.0,
                                [(4, 6), (4, 6)], None),
    "softmax_last": (lambda a: F.softmax(a, -1), lambda a: TF.softmax(a, -1), [(3, 4, 5)], None),
    "softmax_axis1": (lambda a: F.softmax(a, 1), lambda a: TF.softmax(a, 1), [(3, 4, 5)], None),
    "log_softmax_last": (lambda a: F.log_softmax(a, -1), lambda a: TF.log_softmax(a, -1), [(3, 7)], None),
    "log_softmax_axis0": (lambda a: F.log_softmax(a, 0), lambda a: TF.log_softmax(a, 0), [(3, 4, 2)], None),
    "where": (lambda a, b: engine.where(a > 0, a, b), lambda a, b: torch.where(a > 0, a, b), [(3, 4), (4,)], None),
    "masked_fill": (lambda a: a.masked_fill(a < 0, 0.5) * a, lambda a: a.masked_fill(a < 0, 0.5) * a, [(3, 4)], None),
    "sdpa_causal": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), _causal_torch,
                    [(2, 2, 5, 4), (2, 2, 5, 4), (2, 2, 5, 3)], None),
    "embedding_with_positions": (lambda w, p: F.embedding_with_positions(_EMB_IDX.to(w.device), w, p, 1),
                                 (lambda w, p: w[torch.tensor(_EMB_IDX.numpy())] + p[1:4]) if torch else None,
                                 [(5, 4), (6, 4)], None),
    "mlp": (lambda x, w1, b1, w2, b2: F.mlp(x, w1, b1, w2, b2),
            (lambda x, w1, b1, w2, b2: TF.linear(TF.gelu(TF.linear(x, w1, b1), approximate="tanh"), w2, b2))
            if TF else None, [(2, 3, 4), (8, 4), (8,), (5, 8), (5,)], None),
    "mlp_no_biases": (lambda x, w1, w2: F.mlp(x, w1, None, w2),
                      (lambda x, w1, w2: TF.linear(TF.gelu(TF.linear(x, w1), approximate="tanh"), w2)) if TF else None,
                      [(3, 4), (8, 4), (5, 8)], None),
    # T 16: on the GPU the bias's gradient from the attention's kernels; T 5: from the Linear's pass
    "projected_self_attention": (lambda x, w, b: F.projected_self_attention(x, w, b, 2), _projected_torch,
                                 [(2, 16, 6), (24, 6), (24,)], (-1.0, 1.0)),
    "projected_self_attention_t5_full": (lambda x, w, b: F.projected_self_attention(x, w, b, 2, is_causal=False),
                                         (lambda x, w, b: _projected_torch(x, w, b, causal=False)) if TF else None,
                                         [(2, 5, 6), (24, 6), (24,)], (-1.0, 1.0)),
    "sdpa_float_mask": (lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                        (lambda q, k, v, m: TF.scaled_dot_product_attention(q, k, v, attn_mask=m)) if TF else None,
                        [(2, 3, 4), (2, 5, 4), (2, 5, 4), (3, 5)], None),
}

IDS = sorted(CASES)


@pytest.mark.parametrize("name", IDS)
def test_finite_differences(name):
    fn, _, shapes, rng = CASES[name]
    low, high = rng or (-2.0, 2.0)
    check_finite_differences(fn, shapes, low=low, high=high)


@needs_torch
@pytest.mark.parametrize("name", IDS)
def test_against_torch(name):
    fn, torch_fn, shapes, rng = CASES[name]
    low, high = rng or (-2.0, 2.0)
    check_against_torch(fn, torch_fn, shapes, low=low, high=high)


@needs_torch
@pytest.mark.parametrize("name", IDS)
def test_bf16_against_torch(name):
    fn, torch_fn, shapes, rng = CASES[name]
    low, high = rng or (-2.0, 2.0)
    check_bf16_against_torch(fn, torch_fn, shapes, low=low, high=high)


# ---- ops with integer inputs -----------------------------------------------------------------------

def _ce_case(ignore_index):
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((6, 5))
    targets = rng.integers(0, 5, 6)
    targets[[1, 4]] = ignore_index
    return logits, targets


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_finite_differences(reduction):
    logits, targets = _ce_case(-100)
    t = engine.tensor(targets)
    check_finite_differences(lambda x: F.cross_entropy(x, t, ignore_index=-100, reduction=reduction).reshape(-1),
                             [logits.shape])


@needs_torch
@pytest.mark.parametrize("ignore_index", [-100, 2])
def test_cross_entropy_against_torch(ignore_index):
    logits, targets = _ce_case(ignore_index)
    t = engine.tensor(targets)
    tt = torch.tensor(targets)
    check_against_torch(lambda x: F.cross_entropy(x, t, ignore_index=ignore_index).reshape(1),
                        lambda x: TF.cross_entropy(x, tt, ignore_index=ignore_index).reshape(1), [logits.shape])


def test_cross_entropy_all_rows_of_3d_logits():
    logits = engine.randn(2, 3, 4, requires_grad=True)
    targets = engine.tensor([[0, 1, 2], [3, 0, 1]])
    loss = F.cross_entropy(logits, targets)
    flat = F.cross_entropy(logits.reshape(6, 4), targets.reshape(6))
    assert abs(loss.item() - flat.item()) < 1e-6


def test_embedding_scatter_add_backward():
    idx = engine.tensor([[0, 2, 2], [1, 2, 0]])
    check_finite_differences(lambda w: F.embedding(idx, w), [(4, 3)])
    if torch is not None:
        tidx = torch.tensor(idx.numpy())
        check_against_torch(lambda w: F.embedding(idx, w), lambda w: TF.embedding(tidx, w), [(4, 3)])


def test_embedding_indices_out_of_range_are_named():
    w, p = engine.zeros(4, 3), engine.zeros(6, 3)
    for bad, named in (([[0, 4]], "index 4"), ([[-1, 2]], "index -1")):
        idx = engine.tensor(bad)
        with pytest.raises(IndexError, match=f"embedding: {named} is out of range for 4 embeddings"):
            F.embedding(idx, w)
        with pytest.raises(IndexError, match=f"embedding_with_positions: {named} is out of range"):
            F.embedding_with_positions(idx, w, p)
    with pytest.raises(ValueError, match="positions 5..6 are out of range for 6 positions"):
        F.embedding_with_positions(engine.tensor([[0, 1]]), w, p, start=5)


def test_dropout_inverted_and_seeded():
    x = engine.ones(200, 100, requires_grad=True)
    engine.manual_seed(7)
    y = F.dropout(x, 0.3, training=True)
    kept = y.numpy() != 0
    assert abs(kept.mean() - 0.7) < 0.02
    np.testing.assert_allclose(y.numpy()[kept], 1 / 0.7, rtol=1e-6)  # survivors scaled by 1/(1-p)
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy() != 0, kept)  # the gradient flows through the same mask
    engine.manual_seed(7)
    np.testing.assert_array_equal(F.dropout(x, 0.3).numpy(), y.numpy())  # same seed, same mask
    assert F.dropout(x, 0.3, training=False) is x


def test_sdpa_dropout_zeroes_attention_weights():
    q = engine.randn(1, 1, 8, 4)
    engine.manual_seed(1)
    out = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5, is_causal=True)
    assert out.shape == (1, 1, 8, 4) and np.isfinite(out.numpy()).all()


def test_causal_mask_with_cached_keys():
    # 2 new queries after 3 cached keys: query 0 sees keys 0..3, query 1 sees all 5
    m = F.causal_mask(2, 5).numpy()
    np.testing.assert_array_equal(m, [[0, 0, 0, 0, 1], [0, 0, 0, 0, 0]])


def test_bool_mask_sdpa_matches_torch():
    if torch is None:
        pytest.skip("torch is not installed")
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 3, 4)).astype(np.float32) for _ in range(3))
    mask = rng.random((3, 3)) > 0.3
    mask[:, 0] = True
    ours = F.scaled_dot_product_attention(engine.tensor(q), engine.tensor(k), engine.tensor(v),
                                          attn_mask=engine.tensor(mask))
    ref = TF.scaled_dot_product_attention(torch.tensor(q), torch.tensor(k), torch.tensor(v),
                                          attn_mask=torch.tensor(mask))
    np.testing.assert_allclose(ours.numpy(), ref.numpy(), atol=1e-5)


# ---- fused attention (the CPU reference of engine/backends: attention, attention_qkv) ----------------

def _attention_composite(q, k, v, causal):
    """The unfused path, written out: scores, bottom-right causal mask, softmax, weighted sum."""
    T, S = q.shape[-2], k.shape[-2]
    s = (q @ k.transpose(-2, -1)) * (1.0 / np.sqrt(q.shape[-1]))
    if causal:
        s = engine.where(F.causal_mask(T, S), float("-inf"), s)
    return F.softmax(s, -1) @ v


@pytest.mark.parametrize("T,S,causal", [(5, 5, True), (3, 7, True), (6, 6, False), (1, 4, True)])
def test_fused_attention_matches_composite(T, S, causal):
    rng = np.random.default_rng(T * 10 + S)
    arrays = [rng.standard_normal(s) for s in ((2, 3, T, 8), (2, 3, S, 8), (2, 3, S, 8))]
    w = rng.standard_normal((2, 3, T, 8))
    results = []
    for fn in (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
               lambda q, k, v: _attention_composite(q, k, v, causal)):
        ts = [engine.tensor(a, dtype=engine.float64, requires_grad=True) for a in arrays]
        out = fn(*ts)
        (out * engine.tensor(w, dtype=engine.float64)).sum().backward()
        results.append([out.numpy()] + [t.grad.numpy() for t in ts])
    fused_ctx = F.scaled_dot_product_attention(*[engine.tensor(a) for a in arrays], is_causal=causal)
    assert fused_ctx.shape == (2, 3, T, 8)
    for got, want, what in zip(results[0], results[1], ("out", "dq", "dk", "dv")):
        np.testing.assert_allclose(got, want, atol=1e-12, rtol=1e-10, err_msg=what)


def test_fused_attention_finite_differences():
    check_finite_differences(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                             [(2, 4, 6), (2, 5, 6), (2, 5, 6)])


def test_attention_lse_and_fully_hidden_rows():
    from engine.backends import cpu

    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((4, 4), (2, 4), (2, 4)))
    out, lse, _ = cpu.attention(q, k, v, True, 0.5)  # T=4 > S=2: the first two queries see no key
    s = (q @ k.T) * 0.5
    assert np.all(np.isneginf(lse[:2])) and np.all(out[:2] == 0)
    np.testing.assert_allclose(lse[2], np.log(np.exp(s[2, :1]).sum()), rtol=1e-6)
    np.testing.assert_allclose(lse[3], np.log(np.exp(s[3]).sum()), rtol=1e-6)
    dq, dk, dv = cpu.attention_backward(np.ones_like(out), q, k, v, out, lse, True, 0.5)
    assert np.all(np.isfinite(dq)) and np.all(dq[:2] == 0)


@pytest.mark.parametrize("causal", [True, False])
def test_self_attention_qkv_matches_split_heads(causal):
    rng = np.random.default_rng(2)
    B, T, H, D = 2, 5, 3, 4
    qkv_np = rng.standard_normal((B, T, 3 * H * D))
    w = rng.standard_normal((B, T, H * D))
    got, want = [], []
    for out_list, fused in ((got, True), (want, False)):
        qkv = engine.tensor(qkv_np, dtype=engine.float64, requires_grad=True)
        if fused:
            y = F.self_attention(qkv, H, is_causal=causal)
        else:
            heads = qkv.reshape(B, T, 3, H, D).permute(2, 0, 3, 1, 4)
            y = _attention_composite(heads[0], heads[1], heads[2], causal).permute(0, 2, 1, 3).reshape(B, T, H * D)
        (y * engine.tensor(w, dtype=engine.float64)).sum().backward()
        out_list += [y.numpy(), qkv.grad.numpy()]
    np.testing.assert_allclose(got[0], want[0], atol=1e-12, rtol=1e-10, err_msg="out")
    np.testing.assert_allclose(got[1], want[1], atol=1e-12, rtol=1e-10, err_msg="dqkv")


@needs_torch
def test_fused_attention_matches_torch():
    check_against_torch(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                        _causal_torch, [(2, 3, 6, 8), (2, 3, 6, 8), (2, 3, 6, 8)])


def test_autocast_per_device_type_cuda_leaves_cpu_alone():
    with pytest.raises(ValueError, match="'cuda' or 'cpu'"):
        engine.autocast("mps")
    with pytest.raises(ValueError, match="bfloat16"):
        engine.autocast("cpu", dtype=engine.float16)
    x = engine.randn(2, 3)
    lin = engine.nn.Linear(3, 4)
    assert not engine.is_autocast_enabled() and not engine.is_autocast_enabled("cpu")
    with engine.autocast("cuda", dtype=engine.bfloat16):
        assert engine.get_autocast_dtype("cuda") == engine.bfloat16 and engine.get_autocast_dtype("cpu") is None
        y = lin(x)  # CPU tensors: float32 as before
    assert y.dtype == engine.float32 and not engine.is_autocast_enabled()
    with engine.autocast("cpu"):
        assert engine.get_autocast_dtype("cpu") == engine.bfloat16 and not engine.is_autocast_enabled("cuda")
        assert lin(x).dtype == engine.bfloat16
        with engine.autocast("cpu", enabled=False):
            assert lin(x).dtype == engine.float32
    assert not engine.is_autocast_enabled("cpu")


@pytest.mark.parametrize("frozen", [0, 1, 2])
def test_fused_ops_with_a_frozen_input(frozen):
    """F.projected_self_attention and F.mlp where one input takes no gradient (a frozen weight or
    bias): the others' gradients as the unfused layers give them, and none for it."""
    rng = np.random.default_rng(7)
    arrays = [rng.standard_normal(s) * f for s, f in (((2, 16, 6), 1.0), ((24, 6), 0.3), ((24,), 0.5))]
    mlp_arrays = [rng.standard_normal(s) * f for s, f in (((3, 6), 1.0), ((8, 6), 0.3), ((8,), 0.5), ((5, 8), 0.3))]
    cases = [(arrays, lambda x, w, b: F.projected_self_attention(x, w, b, 2),
              lambda x, w, b: F.self_attention(F.linear(x, w, b), 2)),
             (mlp_arrays, lambda x, w1, b1, w2: F.mlp(x, w1, b1, w2),
              lambda x, w1, b1, w2: F.linear(F.gelu(F.linear(x, w1, b1)), w2))]
    for inputs, fused, plain in cases:
        res = []
        for fn in (fused, plain):
            ts = [engine.tensor(a, dtype=engine.float64, requires_grad=i != frozen) for i, a in enumerate(inputs)]
            (fn(*ts) ** 2).sum().backward()
            res.append([None if t.grad is None else t.grad.numpy() for t in ts])
        assert res[0][frozen] is None
        for got, want in zip(*res):
            if want is not None:
                np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
