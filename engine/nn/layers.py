"""Basic layers: Linear, LayerNorm, Embedding, Dropout, GELU, ReLU."""
from __future__ import annotations

from .. import dtypes
from ..factories import ones, zeros
from ..tensor import Tensor
from . import functional as F
from . import init
from .module import Module, Parameter


class Linear(Module):
    """y = x W^T + b.  x (..., in_features) -> (..., out_features). fp8: None, or the layer's FP8 scaling
    (engine.fp8.enable(model) sets it; not a parameter, not saved)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(zeros(out_features, in_features, device=device))
        init.kaiming_uniform_linear_(self.weight)
        self.bias = Parameter(zeros(out_features, device=device)) if bias else None
        if bias:
            init.uniform_(self.bias, -(in_features ** -0.5), in_features ** -0.5)
        self.fp8 = None

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias, fp8=self.fp8)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class LayerNorm(Module):
    """Normalise over the last dim, then scale and shift.  (..., C) -> (..., C)."""

    def __init__(self, normalized_shape: int, eps: float = 1e-5, bias: bool = True, device=None):
        super().__init__()
        self.normalized_shape, self.eps = normalized_shape, eps
        self.weight = Parameter(ones(normalized_shape, device=device))
        self.bias = Parameter(zeros(normalized_shape, device=device)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def add_forward(self, x: Tensor, residual: Tensor, residual_bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(x + residual (+ residual_bias), this layer norm of it), in one op (F.add_layer_norm)."""
        return F.add_layer_norm(x, residual, self.normalized_shape, self.weight, self.bias, self.eps, residual_bias)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class Embedding(Module):
    """A lookup table: idx (...) int64 -> (..., embedding_dim)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, device=None):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = Parameter(zeros(num_embeddings, embedding_dim, device=device))
        init.normal_(self.weight, 0.0, 1.0)

    def forward(self, idx: Tensor) -> Tensor:
        return F.embedding(idx, self.weight)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class Dropout(Module):
    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: p must be in [0, 1], got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class GELU(Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(x)


class ReLU(Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.relu(x)


__all__ = ["Linear", "LayerNorm", "Embedding", "Dropout", "GELU", "ReLU", "dtypes"]
