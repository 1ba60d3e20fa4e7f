"""The Tensor methods that run ops, installed on Tensor as these modules load (see
`engine.tensor.install_methods`): conversion (to, type, copy_), arithmetic (operators, math,
where, matmul), reductions, shape (reshape, indexing, cat, stack)."""
from __future__ import annotations

from . import arithmetic, conversion, reductions, shape  # noqa: F401 - importing them installs the methods
