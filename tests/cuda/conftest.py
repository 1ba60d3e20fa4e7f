"""tests/cuda: everything here needs a GPU and a CUDA build of engine; marked `cuda`, skipped otherwise.

Tolerances used throughout, unless a test says otherwise: float32 elementwise ops atol 1e-6 +
rtol 1e-5; reductions, normalisations and softmax atol 1e-5 + rtol 1e-4; matmuls with TF32 switched
off as CPU float32 (atol 1e-5 + rtol 1e-4), and with TF32 on rtol 5e-3."""
import os

import pytest

import engine.cuda

_HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_collection_modifyitems(config, items):
    skip = None
    if not engine.cuda.is_available():
        skip = pytest.mark.skip(reason=f"needs a GPU: {engine.cuda.unavailable_reason()}")
    for item in items:
        if str(item.fspath).startswith(_HERE):
            item.add_marker(pytest.mark.cuda)
            if skip is not None:
                item.add_marker(skip)


def _tf32_set_to(allow: bool):
    prev = engine.cuda.allow_tf32()
    engine.cuda.set_allow_tf32(allow)
    yield
    engine.cuda.set_allow_tf32(prev)


@pytest.fixture
def no_tf32():
    """Full float32 matmuls while a test compares against the CPU backend."""
    yield from _tf32_set_to(False)


@pytest.fixture
def tf32():
    """TF32 matmuls on (the fused float32 dropout attention; with TF32 off the unfused path runs)."""
    yield from _tf32_set_to(True)
