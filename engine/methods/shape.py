"""Tensor's shape methods (reshape / view, flatten, permute, transpose, unsqueeze, squeeze, expand,
split, chunk, indexing) and the functions over several tensors: cat / concat, stack, split."""
from __future__ import annotations

import numpy as np

from ..ops import movement as M
from ..tensor import Tensor, install_methods


@install_methods
class ShapeMethods:
    def reshape(self, *shape):
        shape = _shape_arg(shape)
        shape = _infer_shape(shape, self.numel(), self.shape)
        if shape == self.shape:
            return self
        return M.Reshape.apply(self, shape=shape)

    view = reshape

    def flatten(self, start_dim: int = 0, end_dim: int = -1):
        s = self.shape
        if not s:
            return self.reshape(1)
        start, end = start_dim % len(s), end_dim % len(s)
        return self.reshape(s[:start] + (-1,) + s[end + 1:])

    def permute(self, *dims):
        dims = tuple(d % self.ndim for d in _shape_arg(dims))
        if sorted(dims) != list(range(self.ndim)):
            raise ValueError(f"permute: {dims} is not a permutation of the {self.ndim} dims of shape {self.shape}")
        if dims == tuple(range(self.ndim)):
            return self
        return M.Permute.apply(self, dims=dims)

    def transpose(self, dim0: int, dim1: int):
        dims = list(range(self.ndim))
        dims[dim0], dims[dim1] = dims[dim1], dims[dim0]
        return self.permute(*dims)

    @property
    def T(self):
        return self.permute(*reversed(range(self.ndim)))

    def unsqueeze(self, dim: int):
        dim = dim % (self.ndim + 1)
        return self.reshape(self.shape[:dim] + (1,) + self.shape[dim:])

    def squeeze(self, dim=None):
        if dim is None:
            return self.reshape(tuple(n for n in self.shape if n != 1))
        dim = dim % self.ndim
        if self.shape[dim] != 1:
            return self
        return self.reshape(self.shape[:dim] + self.shape[dim + 1:])

    def expand(self, *shape):
        shape = _shape_arg(shape)
        lead = len(shape) - self.ndim
        shape = tuple(self.shape[i - lead] if n == -1 else n for i, n in enumerate(shape))
        if shape == self.shape:
            return self
        return M.Expand.apply(self, shape=shape)

    def split(self, split_size, dim: int = 0):
        dim = dim % self.ndim
        n = self.shape[dim]
        if isinstance(split_size, int):
            sizes = [min(split_size, n - s) for s in range(0, n, split_size)]
        else:
            sizes = list(split_size)
            if sum(sizes) != n:
                raise ValueError(f"split: sizes {sizes} add up to {sum(sizes)}, but dim {dim} has size {n}")
        out, start = [], 0
        for size in sizes:
            index = (slice(None),) * dim + (slice(start, start + size),)
            out.append(self[index])
            start += size
        return tuple(out)

    def chunk(self, chunks: int, dim: int = 0):
        n = self.shape[dim % self.ndim]
        return self.split(-(-n // chunks), dim)

    def __getitem__(self, index):
        if not isinstance(index, tuple):
            index = (index,)
        for i in index:
            if not (i is None or i is Ellipsis or isinstance(i, (int, slice, np.integer))):
                raise TypeError(
                    f"indexing with {type(i).__name__} is not supported: use ints, slices, None and ..., "
                    "or F.embedding / gather-style ops for index tensors"
                )
        index = tuple(int(i) if isinstance(i, np.integer) else i for i in index)
        _check_index(index, self.shape)
        return M.GetItem.apply(self, index=index)


def _shape_arg(shape) -> tuple:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    return tuple(int(n) for n in shape)


def _infer_shape(shape: tuple, numel: int, old: tuple) -> tuple:
    if shape.count(-1) > 1:
        raise ValueError(f"reshape: only one dim can be -1, got {shape}")
    if -1 in shape:
        known = int(np.prod([n for n in shape if n != -1], dtype=np.int64))
        if known == 0 or numel % known:
            raise ValueError(f"reshape: cannot reshape {old} ({numel} elements) into {shape}")
        shape = tuple(numel // known if n == -1 else n for n in shape)
    if int(np.prod(shape, dtype=np.int64)) != numel:
        raise ValueError(f"reshape: cannot reshape {old} ({numel} elements) into {shape}")
    return shape


def _check_index(index: tuple, shape: tuple) -> None:
    dim = 0
    n_real = sum(1 for i in index if i is not None and i is not Ellipsis)
    if n_real > len(shape):
        raise IndexError(f"too many indices ({n_real}) for a tensor of shape {shape}")
    for i in index:
        if i is Ellipsis:
            dim += len(shape) - n_real
            continue
        if i is None:
            continue
        if isinstance(i, int) and not -shape[dim] <= i < shape[dim]:
            raise IndexError(f"index {i} is out of range for dim {dim} of size {shape[dim]} (shape {shape})")
        dim += 1


def cat(tensors, dim: int = 0) -> Tensor:
    tensors = list(tensors)
    if not tensors:
        raise ValueError("cat: needs at least one tensor")
    ndim = tensors[0].ndim
    dim = dim % ndim
    for i, t in enumerate(tensors):
        if t.ndim != ndim or t.shape[:dim] + t.shape[dim + 1:] != tensors[0].shape[:dim] + tensors[0].shape[dim + 1:]:
            raise ValueError(f"cat: tensor {i} has shape {t.shape}, which does not match {tensors[0].shape} outside dim {dim}")
        if t.dtype != tensors[0].dtype:
            raise TypeError(f"cat: tensor {i} is {t.dtype}, tensor 0 is {tensors[0].dtype}")
    if len(tensors) == 1:
        return tensors[0]
    return M.Concat.apply(*tensors, axis=dim)


concat = cat


def stack(tensors, dim: int = 0) -> Tensor:
    tensors = list(tensors)
    if not tensors:
        raise ValueError("stack: needs at least one tensor")
    dim = dim % (tensors[0].ndim + 1)
    return cat([t.unsqueeze(dim) for t in tensors], dim)


def split(t: Tensor, split_size, dim: int = 0):
    return t.split(split_size, dim)
