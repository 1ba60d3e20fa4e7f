"""GPT on the GPU: a training step (loss and every gradient, then AdamW) matching the CPU step,
generation with the KV cache, clipping, and checkpoints moving between GPU and CPU.

TF32 is switched off for the comparisons; tolerances: loss atol 1e-5, gradients atol 1e-5 + rtol
1e-3 (float32 through 2 layers, summed in different orders on each device), parameters after the
AdamW step atol 1e-5."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.nn import GPT, GPTConfig

SMALL = GPTConfig(vocab_size=65, block_size=32, n_layer=2, n_head=4, n_embd=64, dropout=0.0, bias=True)


def _batch(cfg, B=4, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, cfg.vocab_size, (B, cfg.block_size)), rng.integers(0, cfg.vocab_size, (B, cfg.block_size))


def _pair(cfg):
    engine.manual_seed(0)
    cpu_model = GPT(cfg)
    gpu_model = GPT(cfg)
    gpu_model.load_state_dict(cpu_model.state_dict())
    gpu_model.to("cuda")
    return cpu_model, gpu_model


def test_training_step_matches_cpu(no_tf32):
    cpu_model, gpu_model = _pair(SMALL)
    x, y = _batch(SMALL)
    results = {}
    for dev, model in (("cpu", cpu_model), ("cuda", gpu_model)):
        opt = engine.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
        logits, loss = model(engine.tensor(x, device=dev), engine.tensor(y, device=dev), return_logits=True)
        opt.zero_grad()
        loss.backward()
        grads = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}  # CPU .numpy() aliases
        norm = engine.optim.clip_grad_norm_(model.parameters(), 1.0)
        assert norm.device.type == dev
        opt.step()
        results[dev] = (loss.item(), logits.numpy(), grads, norm.item(),
                        {n: p.numpy().copy() for n, p in model.named_parameters()})
    (lc, logc, gc, nc, pc), (lg, logg, gg, ng, pg) = results["cpu"], results["cuda"]
    assert abs(lc - lg) < 1e-5, (lc, lg)
    np.testing.assert_allclose(logg, logc, atol=1e-4, rtol=1e-4)
    assert sorted(gc) == sorted(gg)
    for name in gc:
        np.testing.assert_allclose(gg[name], gc[name], atol=1e-5, rtol=1e-3, err_msg=name)
    assert abs(nc - ng) < 1e-4 * max(1.0, nc)
    for name in pc:
        np.testing.assert_allclose(pg[name], pc[name], atol=1e-5, rtol=1e-4, err_msg=name)


def test_training_reduces_loss_on_gpu():
    engine.manual_seed(0)
    cfg = GPTConfig(vocab_size=16, block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.1)
    model = GPT(cfg).to("cuda")
    opt = engine.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    seq = np.tile(np.arange(16), 4)
    x = engine.tensor(np.stack([seq[i:i + 16] for i in range(8)]), device="cuda")
    y = engine.tensor(np.stack([seq[i + 1:i + 17] for i in range(8)]), device="cuda")
    first = None
    for _ in range(60):
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = first if first is not None else loss.item()
    assert loss.item() < 0.5 * first


def test_generate_with_kv_cache_on_gpu(no_tf32):
    cpu_model, gpu_model = _pair(SMALL)
    prompt = np.array([[1, 2, 3], [4, 5, 6]])
    a = gpu_model.generate(engine.tensor(prompt, device="cuda"), 40, temperature=0.0, use_cache=True)
    b = gpu_model.generate(engine.tensor(prompt, device="cuda"), 40, temperature=0.0, use_cache=False)
    c = cpu_model.generate(engine.tensor(prompt), 40, temperature=0.0, use_cache=True)
    assert a.device.type == "cuda" and a.shape == (2, 43)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_array_equal(a.numpy(), c.numpy())
    s = gpu_model.generate(engine.tensor(prompt, device="cuda"), 10, temperature=0.8, top_k=5,
                           generator=np.random.default_rng(0))
    assert s.shape == (2, 13) and (s.numpy() < SMALL.vocab_size).all()


def test_checkpoint_gpu_to_cpu_and_back(tmp_path):
    from engine.checkpoint import load_checkpoint, save_checkpoint

    engine.manual_seed(1)
    model = GPT(SMALL).to("cuda")
    opt = engine.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = _batch(SMALL)
    _, loss = model(engine.tensor(x, device="cuda"), engine.tensor(y, device="cuda"))
    loss.backward()
    opt.step()
    save_checkpoint(tmp_path / "ckpt", model=model.state_dict(), optimizer=opt.state_dict(), step=1)
    state = load_checkpoint(tmp_path / "ckpt")
    cpu_model = GPT(SMALL)
    cpu_model.load_state_dict(state["model"])
    for (n, p), (_, q) in zip(model.named_parameters(), cpu_model.named_parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=n)
    back = GPT(SMALL).to("cuda")
    back.load_state_dict(cpu_model.state_dict())
    for (n, p), (_, q) in zip(model.named_parameters(), back.named_parameters()):
        assert q.device.type == "cuda"
        np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=n)
    opt2 = engine.optim.AdamW(back.parameters(), lr=1e-3)
    opt2.load_state_dict(state["optimizer"])
    _, loss2 = back(engine.tensor(x, device="cuda"), engine.tensor(y, device="cuda"))
    loss2.backward()
    opt2.step()  # the loaded moments live where the parameters are


def test_sgd_and_clip_on_gpu_match_cpu(no_tf32):
    cpu_model, gpu_model = _pair(GPTConfig(vocab_size=20, block_size=8, n_layer=1, n_head=2, n_embd=16))
    x, y = _batch(cpu_model.config, B=2, seed=3)
    out = {}
    for dev, model in (("cpu", cpu_model), ("cuda", gpu_model)):
        opt = engine.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)
        for _ in range(2):
            _, loss = model(engine.tensor(x, device=dev), engine.tensor(y, device=dev))
            opt.zero_grad()
            loss.backward()
            engine.optim.clip_grad_norm_(model.parameters(), 0.05)
            opt.step()
        out[dev] = {n: p.numpy().copy() for n, p in model.named_parameters()}
    for n in out["cpu"]:
        np.testing.assert_allclose(out["cuda"][n], out["cpu"][n], atol=1e-5, rtol=1e-4, err_msg=n)
