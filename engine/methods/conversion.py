"""Tensor methods that convert: `.to(device, dtype)`, `.cuda()`, `.cpu()`, `.type()`, `.float()`, ...,
`copy_` (across devices and dtypes), and the dtype promotion of mixed-dtype operands."""
from __future__ import annotations

from .. import dtypes
from ..device import Device, as_device
from ..dtypes import DType
from ..autograd import is_grad_enabled
from ..ops.conversion import _Cast, _ToDevice
from ..tensor import Tensor, install_methods, tensor


@install_methods
class ConversionMethods:
    def to(self, device=None, dtype=None) -> "Tensor":
        """`t.to("cuda")`, `t.to("cpu")`, `t.to(engine.float32)`, or both."""
        if isinstance(device, DType) or (isinstance(device, str) and device in dtypes._BY_NAME):
            device, dtype = None, device
        out = self
        if dtype is not None:
            out = out.type(dtypes.as_dtype(dtype))
        if device is not None:
            target = as_device(device)
            if target != out.device:
                out = _ToDevice.apply(out, target=target)
        return out

    def cuda(self, index: int = 0) -> "Tensor":
        return self.to(Device("cuda", index))

    def cpu(self) -> "Tensor":
        return self.to("cpu")

    def type(self, dtype: DType) -> "Tensor":
        dtype = dtypes.as_dtype(dtype)
        if dtype == self.dtype:
            return self
        return _Cast.apply(self, dtype=dtype)

    def float(self) -> "Tensor":
        return self.type(dtypes.float32)

    def double(self) -> "Tensor":
        return self.type(dtypes.float64)

    def long(self) -> "Tensor":
        return self.type(dtypes.int64)

    def bool(self) -> "Tensor":
        return self.type(dtypes.bool_)

    def copy_(self, src) -> "Tensor":
        """Overwrite this tensor's values with `src`'s (same shape; copied across devices)."""
        if is_grad_enabled() and self.requires_grad and self.is_leaf:
            raise RuntimeError("copy_ into a leaf that requires grad; wrap the update in engine.no_grad()")
        src = src if isinstance(src, Tensor) else tensor(src, dtype=self.dtype)
        if src.shape != self.shape:
            raise ValueError(f"copy_: shape {src.shape} does not match destination shape {self.shape}")
        src = src.to(self.device).type(self.dtype)
        self._backend.copy_(self.data, src.data)
        return self


_CATEGORY = {dtypes.bool_: 0, dtypes.uint8: 1, dtypes.int32: 1, dtypes.int64: 1,
             dtypes.float16: 2, dtypes.bfloat16: 2, dtypes.float32: 2, dtypes.float64: 2}


def _promote(a: Tensor, b: Tensor, what) -> tuple:
    """Mixed bool/int/float promote up to the higher category; two widths of one category are an error."""
    da, db = a.dtype, b.dtype
    if da == db:
        return a, b
    ca, cb = _CATEGORY[da], _CATEGORY[db]
    if ca == cb:
        name = getattr(what, "__name__", what)
        raise TypeError(f"{str(name).lower()}: mixed dtypes {da} and {db}; convert one first, "
                        f"e.g. x.to(engine.{da.name}) or x.float()")
    return (a.type(db), b) if ca < cb else (a, b.type(da))
