"""DLPack on the CPU: `torch.from_dlpack(engine_tensor)` and `engine.from_dlpack(obj)` share memory and
give the same bits, bfloat16 included (numpy has no DLPack bf16, engine.backends.cpu.dlpack adds it),
for versioned (DLPack 1.x) and legacy capsules, strided and 0-d tensors. (CUDA DLPack: tests/cuda.)"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import engine

try:
    import torch
    import torch.utils.dlpack
except ImportError:  # the torch exchanges skip; engine <-> engine and numpy still run
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")
BF = engine.bfloat16


def torch_bits(t) -> np.ndarray:
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


class LegacyProducer:
    """A producer from before DLPack 1.0: __dlpack__ takes no max_version and hands a 'dltensor' capsule."""

    def __init__(self, tensor):
        self.tensor = tensor

    def __dlpack__(self, stream=None):
        return torch.utils.dlpack.to_dlpack(self.tensor)

    def __dlpack_device__(self):
        return self.tensor.__dlpack_device__()


class CapsuleProducer:
    """Hands out one given capsule (used or not), as a misbehaving producer might."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, **kwargs):
        return self.capsule

    def __dlpack_device__(self):
        return (1, 0)


def test_engine_to_engine_bf16_shares_memory():
    x = engine.randn(3, 4, dtype=BF)
    y = engine.from_dlpack(x)
    assert y.dtype == BF and y.shape == (3, 4)
    np.testing.assert_array_equal(y.numpy().view(np.uint16), x.numpy().view(np.uint16))
    y.data[1, 2] = 5.0  # the same memory: a write through one shows through the other
    assert x.numpy()[1, 2] == 5.0


def test_numpy_and_float32_round_trips_keep_shape_and_dtype():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = engine.from_dlpack(a)
    assert t.dtype == engine.float32 and t.tolist() == a.tolist()
    scalar = engine.tensor(2.5)
    assert np.from_dlpack(scalar).shape == ()  # a 0-d tensor stays 0-d
    assert engine.from_dlpack(engine.tensor([1, 2])).dtype == engine.int64


@needs_torch
@pytest.mark.parametrize("shape", [(3, 5), (), (2, 0, 4), (4, 3, 2)])
def test_torch_from_engine_bf16_same_bits_shared_memory(shape):
    x = engine.randn(*shape, dtype=BF)
    t = torch.from_dlpack(x)
    assert t.dtype == torch.bfloat16 and tuple(t.shape) == shape
    np.testing.assert_array_equal(torch_bits(t), x.numpy().view(np.uint16))
    if t.numel():
        t.view(-1)[0] = -3.25
        assert x.numpy().reshape(-1)[0] == -3.25


@needs_torch
def test_torch_from_engine_bf16_views_and_legacy_capsules():
    x = engine.randn(4, 6, dtype=BF)
    xt = x.transpose(0, 1)  # a strided view: exported as a contiguous copy
    np.testing.assert_array_equal(torch_bits(torch.from_dlpack(xt)), xt.numpy().view(np.uint16))
    legacy = x.__dlpack__()  # no max_version: a pre-1.0 'dltensor' capsule
    np.testing.assert_array_equal(torch_bits(torch.utils.dlpack.from_dlpack(legacy)), x.numpy().view(np.uint16))
    assert torch.from_dlpack(engine.randn(3)).dtype == torch.float32


@needs_torch
@pytest.mark.parametrize("make", [lambda t: t, lambda t: t.t(), lambda t: t[1:, ::2], LegacyProducer],
                         ids=["contiguous", "transposed", "sliced", "legacy"])
def test_engine_from_torch_bf16_same_bits_shared_memory(make):
    base = torch.randn(5, 6).to(torch.bfloat16)
    src = make(base)
    e = engine.from_dlpack(src)
    view = src.tensor if isinstance(src, LegacyProducer) else src
    assert e.dtype == BF and e.shape == tuple(view.shape)
    assert e.numpy().dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(e.numpy().view(np.uint16), torch_bits(view))
    view[0, 0] = 7.5
    assert e.numpy()[0, 0] == 7.5
    assert (e.float() * 2.0).numpy()[0, 0] == 15.0  # an ordinary engine tensor: ops run on it


@needs_torch
def test_engine_from_torch_other_dtypes_and_0d():
    for t in (torch.arange(6, dtype=torch.float32).reshape(2, 3), torch.tensor([1, -2], dtype=torch.int64),
              torch.tensor(1.5, dtype=torch.bfloat16)):
        e = engine.from_dlpack(t)
        assert e.shape == tuple(t.shape) and e.tolist() == t.tolist()


@needs_torch
def test_engine_from_dlpack_refuses_a_used_capsule():
    capsule = torch.utils.dlpack.to_dlpack(torch.ones(2, dtype=torch.bfloat16))
    torch.utils.dlpack.from_dlpack(capsule)  # consumed: renamed 'used_dltensor'
    with pytest.raises(ValueError, match="unconsumed DLPack capsule.*used_dltensor"):
        engine.from_dlpack(CapsuleProducer(capsule))
