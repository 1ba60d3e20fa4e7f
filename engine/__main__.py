"""python -m engine: what engine._C was built with and which GPUs it sees."""
from __future__ import annotations

import platform
import sys

from . import cuda, distributed


def main() -> int:
    info = cuda.build_info()
    print(f"engine {info.get('version')}  (python {platform.python_version()}, {sys.platform})")
    print(f"  compiler:      {info.get('compiler')}")
    if info.get("cuda_built"):
        print(f"  CUDA backend:  built (nvcc {info.get('cuda_version')}, archs sm_{info.get('cuda_archs')})")
        print(f"  cuBLASLt:      {info.get('cublaslt_path')}")
    else:
        print(f"  CUDA backend:  not built: {info.get('cuda_reason')}")
    if info.get("nccl_built"):
        print(f"  NCCL:          {info.get('nccl_path')} (engine.distributed 'nccl' backend)")
    else:
        print(f"  NCCL:          not built: {distributed.nccl_unavailable_reason()}")
    if cuda.is_available():
        print(f"  devices:       {cuda.device_count()}")
        for i in range(cuda.device_count()):
            p = cuda.get_device_properties(i)
            print(f"    cuda:{i}  {p['name']}  sm_{p['major']}{p['minor']}  "
                  f"{p['total_memory'] / 2**30:.1f} GiB  {p['multi_processor_count']} SMs")
    else:
        print(f"  devices:       none usable ({cuda.unavailable_reason()}); ops run on the CPU backend")
    return 0


if __name__ == "__main__":
    sys.exit(main())
