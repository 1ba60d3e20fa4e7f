"""Modules: parameters, state_dict, modes, devices, and the transformer layers against references."""
from __future__ import annotations

import numpy as np
import pytest

import engine
import engine.nn as nn
import engine.nn.functional as F
from op_check import check_finite_differences


def test_parameters_state_dict_and_strict_loading():
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.LayerNorm(8), nn.Linear(8, 2, bias=False))
    names = [n for n, _ in model.named_parameters()]
    assert names == ["0.weight", "0.bias", "2.weight", "2.bias", "3.weight"]
    sd = model.state_dict()
    other = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.LayerNorm(8), nn.Linear(8, 2, bias=False))
    other.load_state_dict({k: v.numpy() for k, v in sd.items()})
    x = engine.randn(3, 4)
    np.testing.assert_array_equal(model(x).numpy(), other(x).numpy())
    missing, unexpected = other.load_state_dict({"0.weight": sd["0.weight"], "extra": sd["0.bias"]}, strict=False)
    assert "0.bias" in missing and unexpected == ["extra"]
    with pytest.raises(KeyError, match="unexpected keys: extra"):
        other.load_state_dict({**sd, "extra": sd["0.bias"]})


def test_train_eval_zero_grad_and_requires_grad():
    model = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))
    assert model.training and model[1].training
    model.eval()
    assert not model[1].training
    model(engine.randn(2, 3)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    model.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    with engine.no_grad():
        y = model(engine.randn(2, 3))
    assert not y.requires_grad


def test_module_to_moves_in_place_so_optimizers_keep_their_parameters():
    model = nn.Linear(2, 2)
    opt = engine.optim.SGD(model.parameters(), lr=0.1)
    weight = model.weight
    model.to("cpu", engine.float64)
    assert model.weight is weight and weight.dtype == engine.float64
    assert opt.param_groups[0]["params"][0] is weight


def test_tied_parameters_are_listed_once():
    a = nn.Linear(3, 3)
    b = nn.Linear(3, 3)
    b.weight = a.weight
    holder = nn.ModuleList([a, b])
    assert len(list(holder.parameters())) == 3  # a.weight, a.bias, b.bias
    assert set(holder.state_dict()) == {"0.weight", "0.bias", "1.weight", "1.bias"}


def test_sinusoidal_encoding_values():
    pe = nn.SinusoidalPositionalEncoding(10, 6)
    table = pe(engine.arange(10)).numpy()
    pos, i = 3, 1  # feature 2i = sin(pos / 10000^(2i/d)), 2i+1 = cos(...)
    angle = pos / 10000 ** (2 * i / 6)
    np.testing.assert_allclose(table[pos, 2 * i], np.sin(angle), rtol=1e-6)
    np.testing.assert_allclose(table[pos, 2 * i + 1], np.cos(angle), rtol=1e-6)
    assert not list(pe.parameters())  # fixed, not trained


def test_multi_head_attention_is_causal_and_differentiable():
    engine.manual_seed(0)
    attn = nn.MultiHeadAttention(8, 2)
    x = engine.randn(1, 5, 8)
    full = attn(x).numpy()
    prefix = attn(x[:, :3]).numpy()
    np.testing.assert_allclose(full[:, :3], prefix, atol=1e-6)  # no position sees the future
    attn.to("cpu", engine.float64)
    check_finite_differences(lambda t: attn(t), [(1, 4, 8)])


def test_transformer_block_and_encoder_shapes_and_gradients():
    engine.manual_seed(0)
    enc = nn.TransformerEncoder(n_layer=2, n_embd=8, n_head=2, final_norm=True).to("cpu", engine.float64)
    check_finite_differences(lambda t: enc(t), [(2, 3, 8)], max_checks=10)
    lm = nn.TransformerLM(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8, positional="sinusoidal")
    idx = engine.tensor([[1, 2, 3, 4]])
    logits, loss = lm(idx, idx)
    assert logits.shape == (1, 4, 11)
    loss.backward()
    assert lm.head.weight.grad is not None and lm.tok_emb.weight.grad is not None


def test_kv_cache_attention_matches_full_attention():
    engine.manual_seed(1)
    attn = nn.MultiHeadAttention(8, 2).eval()
    x = engine.randn(2, 6, 8)
    full = attn(x).numpy()
    cache = nn.KVCache()
    steps = [attn(x[:, :4], cache)] + [attn(x[:, t:t + 1], cache) for t in (4, 5)]
    np.testing.assert_allclose(engine.cat(steps, 1).numpy(), full, atol=1e-5)


def test_tensor_basics():
    t = engine.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    assert t.dtype == engine.float32 and t.shape == (2, 2) and t.device == "cpu"
    assert engine.tensor([1, 2]).dtype == engine.int64
    assert (t[1, 0]).item() == 3.0
    u = t.detach()
    assert not u.requires_grad
    (t * t).sum().backward()
    np.testing.assert_array_equal(t.grad.numpy(), 2 * t.numpy())
    with pytest.raises(TypeError, match="floating-point"):
        engine.tensor([1, 2], requires_grad=True)
    with pytest.raises(IndexError, match="out of range"):
        t[2]
    with pytest.raises(ValueError, match="cannot reshape"):
        t.reshape(3, 2)
    assert F.softmax(t, 0).shape == (2, 2)
    assert engine.zeros(2, 3, dtype=engine.int64).dtype == engine.int64
    np.testing.assert_array_equal(engine.arange(4).numpy(), [0, 1, 2, 3])
