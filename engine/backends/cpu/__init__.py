"""The CPU backend: the primitive op set, over numpy arrays.

This package is the reference definition of the primitive op set. Every backend (this one and
`engine.backends.cuda`) implements exactly these functions with the same signatures and meaning;
autograd and everything above it only ever call these. Arrays are the backend's raw arrays
(`np.ndarray` here), never Tensors. "scalar" means a Python int/float.

Conventions:
- Binary ops take two arrays of the same dtype (broadcasting like numpy), or an array and a scalar
  on either side; the result keeps the array's dtype (comparisons give bool).
- Functions that end in `_` update their first argument(s) in place; nothing else does.
- Axis arguments are normalised (non-negative, sorted tuple) by the caller.

One module per op family, as in cuda/: creation (transfers, full, astype, copy_, the dropout
mask), elementwise, reduce, movement, matmul, fp8 (FP8 casts and GEMM), nn (layer norm, softmax, cross-entropy, embedding),
attention, optim (multi-tensor updates), dlpack (exchange with other libraries); bf16 says how
every family treats bfloat16 arrays (float32 arithmetic, rounded as the CUDA kernels round). This
package is the backend module: `backend_for(device)` returns it, and ops look its functions up here
at call time.
"""
from __future__ import annotations

from .attention import (attention, attention_backward, attention_dropout_mask, attention_qkv,
                        attention_qkv_backward)
from .creation import (Array, arange, astype, astype_many, contiguous, copy_, dropout_mask, dtype_of, from_numpy, full,
                       to_numpy)
from .dlpack import from_dlpack, to_dlpack
from .elementwise import binary, gelu_backward, relu_backward, scale, unary, where
from .malloc import keep_freed_arrays_in_the_heap
from .fp8 import cross_entropy_with_grad_fp8_, fp8_cast, fp8_meta, matmul_fp8
from .matmul import linear, linear_backward, matmul, weight_grad
from .movement import broadcast_to, concat, getitem, getitem_backward, permute, reshape
from .nn import (add_layer_norm, add_layer_norm_backward, cross_entropy, cross_entropy_backward,
                 cross_entropy_with_grad_, embedding, embedding_backward, embedding_positions,
                 embedding_positions_backward, layer_norm, layer_norm_backward, log_softmax,
                 log_softmax_backward, softmax, softmax_backward)
from .optim import adamw_, scale_, sgd_, sum_of_squares
from .reduce import argmax, max, sum  # noqa: A004 - the primitives' names

name = "cpu"

keep_freed_arrays_in_the_heap()
