"""The extension module engine._C: built, importable, and honest about its CUDA part."""
import os
import shutil
import subprocess
import sys

import pytest

cuda = pytest.importorskip("engine.cuda")


def test_build_info_fields():
    info = cuda.build_info()
    for key in ("version", "compiler", "cuda_built", "cuda_reason", "cublaslt_path"):
        assert key in info, f"build_info() lacks {key!r}: {info}"
    assert info["version"], f"engine._C did not import: {info['cuda_reason']}"
    if info["cuda_built"]:
        assert info["cublaslt_path"], "a CUDA build must name the cuBLASLt it links"
    else:
        assert info["cuda_reason"], "a CPU-only build must say why CUDA was not built"


def test_cuda_api_without_gpu_never_raises():
    # every query answers on a machine without GPU, driver or CUDA build
    assert isinstance(cuda.is_available(), bool)
    assert cuda.device_count() >= 0
    cuda.synchronize()
    assert cuda.memory_allocated() >= 0 and cuda.max_memory_allocated() >= 0
    cuda.empty_cache()
    cuda.manual_seed(0)
    if not cuda.is_available():
        assert cuda.unavailable_reason()


@pytest.mark.skipif(shutil.which("nvcc") is None or os.environ.get("ENGINE_EXPECT_CUDA_BUILD") != "1",
                    reason="only where nvcc exists and the CI asks for a CUDA build")
def test_cuda_sources_were_compiled():
    info = cuda.build_info()
    assert info["cuda_built"], f"nvcc is on PATH but the CUDA backend was not built: {info['cuda_reason']}"


def test_python_m_engine_prints_build():
    out = subprocess.run([sys.executable, "-m", "engine"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "CUDA backend" in out.stdout
