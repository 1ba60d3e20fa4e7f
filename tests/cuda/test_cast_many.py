"""astype_many on the GPU (csrc/cuda/copy/cast.cu, f32_to_bf16_many_kernel): many float32 arrays cast
to bf16 in one launch per 64, bit for bit as astype (round to nearest even), whatever their sizes
(a tail shorter than the kernel's 8-element groups) and alignment (views at odd offsets), and a GPT
step under autocast on the GPU the same with the one cast as with a cast per weight."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.backends import cuda as gpu

def _bits(x) -> np.ndarray:
    return gpu.to_numpy(x).view(np.uint16)

@pytest.mark.parametrize("sizes", [[1], [7, 8, 9], [768, 2304, 3 * 768 * 768, 65 * 384], list(range(1, 140)),
                                   [1000003, 5, 0, 17]])
def test_matches_astype_bit_for_bit(sizes):
    rng = np.random.default_rng(len(sizes))
    xs = [gpu.from_numpy((rng.standard_normal(n) * 10 ** rng.uniform(-30, 30, n)).astype(np.float32)) for n in sizes]
    outs = gpu.astype_many(xs, engine.bfloat16)
    assert len(outs) == len(xs)
    for x, y in zip(xs, outs):
        assert y.dtype is engine.bfloat16 and y.shape == x.shape
        np.testing.assert_array_equal(_bits(y), _bits(gpu.astype(x, engine.bfloat16)))

def test_views_at_odd_offsets():
    """Views that start 4, 8 or 12 bytes into a buffer: no 16-byte access, the same values."""
    base = gpu.from_numpy(np.random.default_rng(0).standard_normal(4099).astype(np.float32))
    views = [gpu.getitem(base, (slice(k, 4099 - k),)) for k in (1, 2, 3, 5)]
    for x, y in zip(views, gpu.astype_many(views, engine.bfloat16)):
        np.testing.assert_array_equal(_bits(y), _bits(gpu.astype(x, engine.bfloat16)))

def test_other_casts_and_arrays_already_of_the_dtype():
    x32 = gpu.from_numpy(np.arange(10, dtype=np.float32))
    xbf = gpu.astype(x32, engine.bfloat16)
    same, = gpu.astype_many([xbf], engine.bfloat16)
    assert same is xbf
    back = gpu.astype_many([xbf, x32], engine.float32)  # not the float32 -> bf16 kernel: astype each
    np.testing.assert_array_equal(gpu.to_numpy(back[0]), np.arange(10, dtype=np.float32))
    assert back[1] is x32

def test_gpt_step_on_the_gpu_the_same_with_one_cast():
    from engine.autocast import cast_weights
    from engine.nn import GPT, GPTConfig

    engine.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, block_size=32, n_layer=2, n_head=2, n_embd=64, dropout=0.0)).to("cuda")
    rng = np.random.default_rng(0)
    idx, tgt = (engine.tensor(rng.integers(0, 50, (4, 32)), device="cuda") for _ in range(2))
    results = []
    for scoped in (True, False):
        model.zero_grad(set_to_none=True)
        with engine.autocast("cuda", dtype=engine.bfloat16):
            if scoped:
                _, loss = model(idx, tgt)
            else:
                with cast_weights([]):  # an open, empty scope: each op casts its own weight
                    _, loss = model(idx, tgt)
        loss.backward()
        results.append((float(loss.item()), [p.grad.numpy() for p in model.parameters()]))
    assert results[0][0] == results[1][0]
    for a, b in zip(results[0][1], results[1][1]):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6 * max(1.0, float(np.abs(b).max())))
