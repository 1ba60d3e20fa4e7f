"""The CUDA backend: the primitive op set of `cpu/`, over `CudaArray`s in GPU memory.

Every function here has the signature and meaning of its namesake in `cpu/` (the reference).
The work is done by engine._C (csrc/cuda/; engine/_native.py loads it): kernels queued on one
stream per device, memory from a caching allocator. Nothing here waits for the GPU except
`to_numpy` (and what calls it).

A `CudaArray` is always C-contiguous: reshape and leading-axis slices are views sharing the
buffer (as numpy's are); permute, broadcast_to and general slicing copy through one strided-copy
kernel. Shapes, strides and broadcasting are worked out here in Python, with small caches, so the
C++ side stays a thin layer of kernel launches.

One module per op family, as in cpu/: arrays (CudaArray, allocation, DLPack), layout (shapes and
strides), creation (transfers, full, astype, copy_), elementwise, reduce, movement, matmul, fp8 (FP8 casts and GEMM), nn
(layer norm, softmax, cross-entropy, embedding), attention, random, optim (multi-tensor updates);
runtime (devices, stream, memory) and capture (CUDA graphs) serve engine.cuda and engine.graphs.
This package is the backend module: `backend_for(device)` returns it.
"""
from __future__ import annotations

from .arrays import _CODE, Array, CudaArray, from_dlpack, synchronize, to_dlpack
from .attention import (attention, attention_backward, attention_dropout_mask, attention_qkv, attention_qkv_backward,
                        attention_wgmma_backward, attention_wgmma_built, attention_wgmma_forward,
                        attention_wgmma_forward_kernel, attention_wgmma_backward_kernel, BACKWARD_KERNELS,
                        FORWARD_KERNELS)
from .creation import (arange, astype, astype_many, contiguous, copy_, copy_from_numpy_, device_copy, dtype_of,
                       from_numpy, full, to_numpy)
from .elementwise import binary, gelu_backward, relu_backward, scale, unary, where
from .fp8 import cross_entropy_with_grad_fp8_, fp8_cast, fp8_meta, matmul_fp8
from .matmul import _bias_grad, linear, linear_backward, matmul, weight_grad
from .movement import broadcast_to, concat, getitem, getitem_backward, permute, reshape
from .nn import (add_layer_norm, add_layer_norm_backward, cross_entropy, cross_entropy_backward,
                 cross_entropy_with_grad_, embedding, embedding_backward, embedding_positions,
                 embedding_positions_backward, layer_norm, layer_norm_backward, log_softmax,
                 log_softmax_backward, softmax, softmax_backward)
from .optim import (adamw_, adamw_device_, has_device_scalar_kernels, optim_step_advance, scale_, sgd_, sgd_device_,
                    sum_of_squares)
from .random import dropout_mask, random_normal, random_uniform
from .reduce import argmax, max, sum  # noqa: A004 - the primitives' names

name = "cuda"
