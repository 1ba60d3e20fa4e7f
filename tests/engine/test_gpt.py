"""GPT: loss and every gradient against a PyTorch GPT-2 with the same weights; overfitting; generation."""
from __future__ import annotations

import math

import numpy as np
import pytest

import engine
from engine.nn import GPT, GPTConfig

TINY = GPTConfig(vocab_size=29, block_size=16, n_layer=2, n_head=2, n_embd=16, dropout=0.0, bias=True)


def torch_gpt(config: GPTConfig):
    """A minimal PyTorch GPT-2 (nanoGPT's structure and parameter names)."""
    torch = pytest.importorskip("torch")
    nn, TF = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            C = config.n_embd
            self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.attn = nn.Module()
            self.attn.c_attn, self.attn.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.mlp = nn.Module()
            self.mlp.c_fc, self.mlp.c_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            B, T, C = x.shape
            H = config.n_head
            q, k, v = self.attn.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            y = TF.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
            x = x + self.attn.c_proj(y)
            return x + self.mlp.c_proj(TF.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = nn.ModuleDict(dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd), wpe=nn.Embedding(config.block_size, config.n_embd),
                h=nn.ModuleList(Block() for _ in range(config.n_layer)), ln_f=nn.LayerNorm(config.n_embd)))
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
            self.lm_head.weight = self.transformer.wte.weight

        def forward(self, idx, targets):
            T = idx.shape[1]
            x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(T))
            for block in self.transformer.h:
                x = block(x)
            logits = self.lm_head(self.transformer.ln_f(x))
            return logits, TF.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    return torch, Model()


def test_loss_and_every_gradient_match_pytorch():
    engine.manual_seed(0)
    model = GPT(TINY)
    torch, ref = torch_gpt(TINY)
    ref.load_state_dict({k: torch.tensor(v.numpy()) for k, v in model.state_dict().items()})
    rng = np.random.default_rng(0)
    x = rng.integers(0, TINY.vocab_size, (3, TINY.block_size))
    y = rng.integers(0, TINY.vocab_size, (3, TINY.block_size))

    logits, loss = model(engine.tensor(x), engine.tensor(y), return_logits=True)
    loss.backward()
    ref_logits, ref_loss = ref(torch.tensor(x), torch.tensor(y))
    ref_loss.backward()

    assert abs(loss.item() - ref_loss.item()) < 1e-5
    np.testing.assert_allclose(logits.numpy(), ref_logits.detach().numpy(), atol=1e-5)
    ref_params = dict(ref.named_parameters())
    names = [n for n, _ in model.named_parameters()]
    assert sorted(names) == sorted(ref_params)
    for name, p in model.named_parameters():  # tolerance: float32 through 2 layers, atol 2e-6 + rtol 1e-4
        np.testing.assert_allclose(p.grad.numpy(), ref_params[name].grad.numpy(), atol=2e-6, rtol=1e-4, err_msg=name)


def test_initialisation_follows_gpt2():
    engine.manual_seed(0)
    cfg = GPTConfig(vocab_size=100, block_size=32, n_layer=4, n_head=4, n_embd=64)
    model = GPT(cfg)
    sd = model.state_dict()
    assert sd["lm_head.weight"] is not None
    assert model.lm_head.weight is model.transformer["wte"].weight  # tied
    assert abs(sd["transformer.h.0.mlp.c_fc.weight"].numpy().std() - 0.02) < 0.002
    resid_std = 0.02 / math.sqrt(2 * cfg.n_layer)
    assert abs(sd["transformer.h.0.mlp.c_proj.weight"].numpy().std() - resid_std) < 0.15 * resid_std
    assert not sd["transformer.h.1.attn.c_attn.bias"].numpy().any()
    n_params = model.num_parameters()
    assert n_params == sum(int(np.prod(p.shape)) for p in model.parameters())


def test_overfits_a_short_refrain():
    text = "row, row, row your boat, gently down the stream. "
    vocab = sorted(set(text))
    data = np.array([vocab.index(c) for c in text * 4])
    engine.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=len(vocab), block_size=32, n_layer=2, n_head=2, n_embd=48))
    opt = engine.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    rng = np.random.default_rng(0)
    for step in range(300):
        starts = rng.integers(0, len(data) - 33, 8)
        x = engine.tensor(np.stack([data[s:s + 32] for s in starts]))
        y = engine.tensor(np.stack([data[s + 1:s + 33] for s in starts]))
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.05:
            break
    assert loss.item() < 0.05, f"train loss {loss.item():.3f} after {step + 1} steps"


def test_generate_with_and_without_kv_cache_agree():
    engine.manual_seed(3)
    model = GPT(TINY)
    prompt = engine.tensor([[1, 2, 3], [4, 5, 6]])
    # past block_size too, where both paths slide the window
    for kwargs in (dict(temperature=0.0), dict(temperature=0.9, top_k=10), dict(temperature=1.0, top_p=0.8)):
        a = model.generate(prompt, 20, use_cache=True, generator=np.random.default_rng(1), **kwargs)
        b = model.generate(prompt, 20, use_cache=False, generator=np.random.default_rng(1), **kwargs)
        assert a.shape == (2, 23)
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert model.training  # generate() restores the mode


def test_dropout_only_in_training():
    engine.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=1, n_embd=8, dropout=0.5))
    x = engine.tensor([[1, 2, 3, 4]])
    model.eval()
    a, _ = model(x)
    b, _ = model(x)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    model.train()
    c, _ = model(x)
    assert not np.allclose(a.numpy(), c.numpy())


def test_bad_inputs_get_clear_errors():
    model = GPT(TINY)
    with pytest.raises(IndexError, match="out of range"):
        model(engine.tensor([[0, TINY.vocab_size]]))
    with pytest.raises(ValueError, match="block_size"):
        model(engine.zeros(1, TINY.block_size + 1, dtype=engine.int64))
    with pytest.raises(ValueError, match="do not fit"):
        engine.randn(2, 3) @ engine.randn(4, 5)
    with pytest.raises(TypeError, match="mixed dtypes"):
        engine.randn(2) + engine.randn(2, dtype=engine.float64)
    with pytest.raises(ValueError, match="do not broadcast"):
        engine.randn(2, 3) + engine.randn(4)
    other = GPT(GPTConfig(vocab_size=29, block_size=16, n_layer=2, n_head=2, n_embd=32))
    with pytest.raises(ValueError, match="transformer.wte.weight"):
        model.load_state_dict(other.state_dict())
    with pytest.raises(KeyError, match="missing keys"):
        model.load_state_dict({})


@pytest.mark.parametrize("fused_ops", [False, True])
def test_the_blocks_with_their_adds_fused_equal_the_blocks_one_by_one(fused_ops, monkeypatch):
    """GPT runs its blocks with each block's last residual add inside the next layer norm's op
    (TransformerBlock.pending_forward) and the projections' biases added there too (left out of their
    linear layers): the same loss and gradients as x + attn(ln_1(x)), x + mlp(ln_2(x)) op by op. With
    fused_ops, at this width too, the MLP as one op (F.mlp; the attention's F.projected_self_attention
    is the GPU's)."""
    from engine.nn import transformer

    for gate in ("FUSED_ATTENTION_MIN_WIDTH", "FUSED_MLP_MIN_WIDTH"):
        monkeypatch.setattr(transformer, gate, 0 if fused_ops else 1 << 30)
    engine.manual_seed(0)
    model = GPT(TINY)
    rng = np.random.default_rng(1)
    x, y = (engine.tensor(rng.integers(0, TINY.vocab_size, (2, TINY.block_size))) for _ in range(2))

    def one_by_one(idx):
        tr = model.transformer
        h = tr["wte"](idx) + tr["wpe"](engine.arange(0, idx.shape[1]))
        for block in tr["h"]:
            h = h + block.attn(block.ln_1(h))
            h = h + block.mlp(block.ln_2(h))
        return tr["ln_f"](h)

    grads = []
    for hidden in (model._hidden, one_by_one):
        model.zero_grad()
        h = hidden(x)
        loss = engine.nn.functional.linear_cross_entropy(h.reshape(-1, TINY.n_embd), model.lm_head.weight,
                                                         y.reshape(-1))
        loss.backward()
        grads.append((loss.item(), {n: p.grad.numpy().copy() for n, p in model.named_parameters()}))
    (fused_loss, fused), (loss, plain) = grads
    assert abs(fused_loss - loss) < 1e-6
    for name in plain:
        np.testing.assert_allclose(fused[name], plain[name], atol=1e-7, rtol=1e-5, err_msg=name)


def test_a_projection_bias_waits_only_where_nothing_comes_between():
    """project_bias_deferred leaves the bias to the next op where out + bias is the layer's output;
    with dropout at work after the layer, an FP8 layer, no bias, or a forward of the layer's own
    class, the layer keeps it."""
    from engine.nn.layers import Dropout, Linear
    from engine.nn.transformer import add_deferred, project_bias_deferred

    engine.manual_seed(0)
    lin, x = Linear(8, 4), engine.randn(3, 8)
    out, bias = project_bias_deferred(lin, Dropout(0.1).eval(), x)
    assert bias is lin.bias
    np.testing.assert_allclose(add_deferred(engine.zeros(3, 4), (out, bias)).numpy(), lin(x).numpy(), rtol=1e-6)
    assert project_bias_deferred(lin, Dropout(0.1).train(), x)[1] is None
    assert project_bias_deferred(Linear(8, 4, bias=False), Dropout(0.0), x)[1] is None
    class Doubled(Linear):  # a forward of its own, which F.linear on the weight would skip
        def forward(self, x):
            return super().forward(x) * 2.0

    doubled = Doubled(8, 4)
    out, bias = project_bias_deferred(doubled, Dropout(0.0), x)
    assert bias is None
    np.testing.assert_allclose(out.numpy(), 2.0 * (x.numpy() @ doubled.weight.numpy().T + doubled.bias.numpy()),
                               rtol=1e-5, atol=1e-6)
    lin.fp8 = object()  # an FP8 layer: its bias pass also writes the gradient's FP8 codes
    assert project_bias_deferred(lin, Dropout(0.0), x)[1] is None


def test_add_layer_norm_checks_the_residual_bias_shape():
    x = engine.randn(2, 6)
    with pytest.raises(ValueError, match="residual_bias must have shape"):
        engine.nn.functional.add_layer_norm(x, x, 6, residual_bias=engine.zeros(5))
