"""engine.cuda and the runtime under the backend: devices, memory, errors, DLPack."""
from __future__ import annotations

import numpy as np
import pytest

import engine
import engine.cuda as cuda
from engine.backends import cuda as gpu


def test_devices_and_build():
    assert cuda.is_available() and cuda.device_count() >= 1
    info = cuda.build_info()
    assert info["cuda_built"] and info["cublaslt_path"]
    props = cuda.get_device_properties(0)
    assert props["total_memory"] > 0 and props["major"] >= 7
    assert isinstance(cuda.get_device_name(), str)
    assert engine.device("cuda:1").index == 1 and engine.device("cuda").index == 0


def test_caching_allocator_reuses_blocks():
    cuda.synchronize()
    base = cuda.memory_allocated()
    x = engine.zeros(1024, 1024, device="cuda")
    assert cuda.memory_allocated() >= base + 4 * 2**20
    reserved = cuda.memory_reserved()
    del x
    assert cuda.memory_allocated() == base
    y = engine.zeros(1024, 1024, device="cuda")  # served from the cache: no new reservation
    assert cuda.memory_reserved() == reserved
    assert cuda.max_memory_allocated() >= cuda.memory_allocated()
    del y
    cuda.empty_cache()
    assert cuda.memory_reserved() <= reserved


def test_training_ops_do_not_malloc_after_warmup():
    from engine._native import native as _C
    x = engine.randn(64, 128, device="cuda", requires_grad=True)
    w = engine.randn(128, 128, device="cuda", requires_grad=True)

    def step():
        loss = ((x @ w).relu() ** 2).mean()
        loss.backward()
        x.grad = w.grad = None

    step()
    step()
    before = _C.mem_stats(0)["num_mallocs"]
    for _ in range(5):
        step()
    assert _C.mem_stats(0)["num_mallocs"] == before


def test_cuda_error_names_op_and_cuda_text():
    from engine._native import native as _C
    with pytest.raises(RuntimeError, match=r"set_device.*CUDA error cudaErrorInvalidDevice"):
        _C.synchronize(1000)
    # the device is still usable afterwards
    assert engine.ones(3, device="cuda").sum().item() == 3.0


def test_unsupported_dtype_is_a_clear_error():
    x = engine.ones(4, 4, dtype=engine.int64, device="cuda")
    with pytest.raises(TypeError, match="matmul"):
        gpu.matmul(x.data, x.data)


def test_dlpack_with_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    t = engine.arange(6, device="cuda").float().reshape(2, 3)
    tt = torch.from_dlpack(t)
    assert tt.device.type == "cuda" and tt.shape == (2, 3)
    assert tt.data_ptr() == t.data.ptr  # no copy
    tt.mul_(2)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(t.numpy(), np.arange(6).reshape(2, 3) * 2)
    src = torch.arange(12, device="cuda", dtype=torch.float32).reshape(3, 4)
    e = engine.from_dlpack(src)
    assert e.device.type == "cuda" and e.shape == (3, 4) and e.data.ptr == src.data_ptr()
    np.testing.assert_array_equal(e.numpy(), src.cpu().numpy())
    e2 = engine.from_dlpack(src.t())  # non-contiguous: copied
    np.testing.assert_array_equal(e2.numpy(), src.t().cpu().numpy())
    del tt, e


def test_second_device_when_present():
    if cuda.device_count() < 2:
        pytest.skip("one GPU")
    a = engine.randn(8, 8, device="cuda:1")
    b = (a @ a).sum()
    assert b.device == engine.device("cuda:1")
    np.testing.assert_allclose(b.item(), (a.numpy() @ a.numpy()).sum(), rtol=1e-2)
    with pytest.raises(RuntimeError):
        _ = a + engine.randn(8, 8, device="cuda:0")
