"""Tensor's reductions: sum, mean, var, max / amax, min, argmax."""
from __future__ import annotations

import numpy as np

from ..ops import reduce as R
from ..tensor import Tensor, install_methods
from . import arithmetic  # noqa: F401 - mean, var and min use the operators it installs


@install_methods
class ReductionMethods:
    def sum(self, dim=None, keepdim: bool = False):
        return R.Sum.apply(self, axes=_axes(dim, self.ndim), keepdim=keepdim)

    def mean(self, dim=None, keepdim: bool = False):
        axes = _axes(dim, self.ndim)
        count = int(np.prod([self.shape[a] for a in axes], dtype=np.int64))
        return self.sum(axes, keepdim) * (1.0 / max(count, 1))

    def var(self, dim=None, keepdim: bool = False, unbiased: bool = True):
        axes = _axes(dim, self.ndim)
        count = int(np.prod([self.shape[a] for a in axes], dtype=np.int64))
        centered = self - self.mean(axes, keepdim=True)
        return (centered * centered).sum(axes, keepdim) * (1.0 / max(count - int(unbiased), 1))

    def max(self, dim=None, keepdim: bool = False):
        return R.Max.apply(self, axes=_axes(dim, self.ndim), keepdim=keepdim)

    def amax(self, dim=None, keepdim: bool = False):
        return self.max(dim, keepdim)

    def min(self, dim=None, keepdim: bool = False):
        return -((-self).max(dim, keepdim))

    def argmax(self, dim: int = -1):
        return Tensor._wrap(self._backend.argmax(self.data, dim % self.ndim), self.device)


def _axes(dim, ndim: int) -> tuple:
    if dim is None:
        return tuple(range(ndim))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    for d in dims:
        if not -ndim <= d < max(ndim, 1):
            raise IndexError(f"dim {d} is out of range for a tensor with {ndim} dims")
    return tuple(sorted(d % max(ndim, 1) for d in dims))
