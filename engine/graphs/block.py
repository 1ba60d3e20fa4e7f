"""compile_block: a module (or function) run as two CUDA graphs, one for its forward pass and one
for its backward pass, which the autograd of an otherwise ordinary model sees as a single node.

    mlp = engine.cuda.graphs.compile_block(model.mlp)   # model.mlp's parameters on the GPU or CPU
    y = mlp(x)                                          # x (B, T, C) on the GPU or on the CPU
    y.sum().backward()                                  # x.grad and the parameters' .grad filled

A call copies the inputs into the graph's static input buffers (uploading them when they are CPU
tensors; parameters that live on the CPU are uploaded to GPU copies too), replays the forward
graph and hands back a copy of the output on the inputs' device. In backward the output's
gradient is copied in, the backward graph replayed, and the gradients of the inputs and of the
parameters copied out: returned to the autograd for tensors on the inputs' device, accumulated
into `.grad` directly for parameters elsewhere.

One pair of graphs is captured per input signature (shapes, dtypes, device, the module's
`training` flag), after one eager warm-up forward + backward in the graphs' private pool. The
static activations live between a forward and its backward, so a call made while an earlier
call's backward is still pending runs eagerly (correct, just not replayed). Inside a CapturedStep
capture, or where capture fails or CUDA is missing, the block runs eagerly (with a
GraphCaptureWarning for the last two).
"""
from __future__ import annotations

import weakref

import numpy as np

from .. import autograd
from ..backends import backend_for
from ..backends import cuda as cb
from ..backends.cuda import capture, runtime
from ..device import Device
from ..factories import full_like, zeros_like
from ..tensor import Tensor
from . import step as graphs

_MISSING = object()


def _export(arr, device: Device, cuda_index: int):
    """A fresh copy of a static device array, on `device` (GPU copy or host numpy)."""
    if device.type == "cuda":
        return graphs._device_copy(arr, cuda_index)
    return np.asarray(cb.to_numpy(arr))


class _BlockNode(autograd.Function):
    """The autograd node of one call of a compiled block: its backward replays the backward graph."""

    graph = None
    n_inputs = 0
    same_params: tuple = ()
    other_params: tuple = ()

    def backward(self, grad):
        g = self.graph
        g.load_output_grad(grad, self.device)
        g.bwd.replay()
        g.pending = None
        out = []
        for i in range(self.n_inputs):
            arr = g.in_grads[i]
            out.append(_export(arr, self.device, g.dev) if self.needs_input_grad[i] and arr is not None else None)
        for j in self.same_params:
            arr = g.param_grads[j]
            out.append(_export(arr, self.device, g.dev) if arr is not None else None)
        for j in self.other_params:  # not parents (another device): accumulate here
            p, arr = g.params[j], g.param_grads[j]
            if p.requires_grad and arr is not None:
                p._accumulate_grad(_export(arr, p.device, g.dev))
        return tuple(out)


class _BlockGraph:
    """The forward and backward graphs of one input signature, and their static buffers."""

    def __init__(self, block: "CompiledBlock", inputs: tuple):
        self.dev = dev = block.device_index
        gpu = Device("cuda", dev)
        self.pool = capture.graph_pool(dev)
        self.params = block.params
        self.pending = None  # weakref to the node whose backward has not run yet
        self.static_in = []
        for i, x in enumerate(inputs):
            s = graphs._static_like(x, dev)
            graphs._copy_into(s, x, f"compile_block input {i}")
            if s.dtype.is_floating_point:
                s.requires_grad_(True)
            self.static_in.append(s)
        self.buffers = block.buffers
        self.mirrors = []  # (parameter or buffer, its GPU copy) for those that live on the CPU
        for p in self.params + self.buffers:
            if p.device != gpu:
                if p.device.type == "cuda":
                    raise RuntimeError(f"compile_block: a parameter is on {p.device}, the block runs on cuda:{dev}")
                self.mirrors.append((p, cb.from_numpy(np.ascontiguousarray(p.numpy()), dev)))
        saved = self._swap_in(gpu)
        ctx = graphs._CaptureContext()  # no optimizer may step inside
        try:
            # warm-up: plans, caches and the pool's blocks, before anything is recorded
            self.pool.activate()
            try:
                with autograd.enable_grad():
                    out = block.fn(*self.static_in)
                    if not isinstance(out, Tensor):
                        raise TypeError(f"compile_block: the block must return one Tensor, got {type(out).__name__}")
                    if out.requires_grad:
                        out.backward(full_like(out, 1.0))
            finally:
                self.pool.deactivate()
            self._clear_grads()
            del out
            self.fwd = capture.cuda_graph(dev, self.pool)
            graphs._capture = ctx
            self.fwd.begin()
            try:
                with autograd.enable_grad():
                    out = block.fn(*self.static_in)
            except BaseException:
                self.fwd.abort()
                raise
            self.fwd.end()
            self.out = out.detach()
            self.needs_backward = out.requires_grad
            self.bwd = None
            self.in_grads = [None] * len(self.static_in)
            self.param_grads = [None] * len(self.params)
            if self.needs_backward:
                graphs._capture = None
                self.gout = zeros_like(out)  # allocated outside the captures: eager code fills it
                graphs._capture = ctx
                self.bwd = capture.cuda_graph(dev, self.pool)
                self.bwd.begin()
                try:
                    autograd.backward(out, self.gout)
                except BaseException:
                    self.bwd.abort()
                    raise
                self.bwd.end()
                self.in_grads = [s.grad.data if s.grad is not None else None for s in self.static_in]
                self.param_grads = [p.grad.data if p.grad is not None else None for p in self.params]
        finally:
            graphs._capture = None
            self._swap_out(saved)

    def _swap_in(self, gpu: Device) -> list:
        saved = [(p, p.data, p.device, p.grad) for p in self.params + self.buffers]
        for p in self.params:
            p.grad = None
        for p, mirror in self.mirrors:
            p.data, p.device = mirror, gpu
        return saved

    def _swap_out(self, saved: list) -> None:
        for p, data, device, grad in saved:
            p.data, p.device, p.grad = data, device, grad
        for s in self.static_in:
            s.grad = None

    def _clear_grads(self) -> None:
        for s in self.static_in:
            s.grad = None
        for p in self.params:
            p.grad = None

    def busy(self) -> bool:
        return self.pending is not None and self.pending() is not None

    def load_output_grad(self, grad, device: Device) -> None:
        dst = self.gout.data
        if device.type == "cuda":
            if grad.dtype is not dst.dtype:
                grad = cb.astype(grad, dst.dtype)
            cb.copy_(dst, grad)
        else:
            arr = np.ascontiguousarray(np.broadcast_to(grad, dst.shape), dtype=dst.dtype.numpy)
            cb.copy_from_numpy_(dst, arr)

    def run(self, inputs: tuple) -> Tensor:
        for i, (s, x) in enumerate(zip(self.static_in, inputs)):
            graphs._copy_into(s, x, f"compile_block input {i}")
        for p, mirror in self.mirrors:  # CPU parameters (and buffers) may have changed since the last call
            host = np.ascontiguousarray(p.data, dtype=mirror.dtype.numpy)
            cb.copy_from_numpy_(mirror, host)
        self.fwd.replay()
        where = inputs[0].device
        out = Tensor._wrap(_export(self.out.data, where, self.dev), where)
        requires_grad = autograd.is_grad_enabled() and self.needs_backward and (
            any(x.requires_grad for x in inputs) or any(p.requires_grad for p in self.params))
        if requires_grad:
            node = _BlockNode()
            node.graph = self
            node.be, node.device = backend_for(where), where
            node.n_inputs = len(inputs)
            node.same_params = tuple(j for j, p in enumerate(self.params) if p.device == where)
            node.other_params = tuple(j for j, p in enumerate(self.params) if p.device != where)
            node.parents = tuple(inputs) + tuple(self.params[j] for j in node.same_params)
            node.needs_input_grad = tuple(t.requires_grad for t in node.parents)
            out.requires_grad = True
            out._ctx = node
            self.pending = weakref.ref(node)
        return out


class CompiledBlock:
    """A module or function of tensors run as captured forward and backward CUDA graphs, seen by the
    autograd as one node. Make one with `compile_block`."""

    def __init__(self, fn, *, params=None, device=None, enabled: bool = True):
        self.fn = fn
        if params is None:
            params = list(fn.parameters()) if hasattr(fn, "parameters") else []
        self.params = list(params)
        ids = {id(p) for p in self.params}
        self.buffers = [b for _, b in fn.named_buffers() if b is not None and id(b) not in ids] \
            if hasattr(fn, "named_buffers") else []
        self.device_index: int | None = None
        self.fallback_reason: str | None = None
        self._graphs: dict = {}
        self._warned_busy = False
        if not enabled:
            self.fallback_reason = "disabled (enabled=False)"
            return
        reason = graphs.capture_unavailable()
        if reason is not None:
            self._fall_back(reason)
            return
        self.device_index = runtime._index(device)

    def _fall_back(self, reason: str) -> None:
        self.fallback_reason = reason
        graphs._warn(f"compile_block({graphs._name_of(self.fn)})", reason)

    def __call__(self, *inputs):
        if self.fallback_reason is not None:
            return self._eager(inputs)
        if not inputs or not all(isinstance(x, Tensor) for x in inputs):
            raise TypeError("compile_block: call the block with tensors only (one or more)")
        if len({x.device for x in inputs}) != 1:
            raise RuntimeError(f"compile_block: inputs on several devices ({sorted({str(x.device) for x in inputs})})")
        if graphs.is_capturing() or capture.capturing(self.device_index):
            return self._eager(inputs)  # inside an outer capture: its kernels join that graph
        key = (tuple((x.shape, x.dtype.name, str(x.device)) for x in inputs), getattr(self.fn, "training", None))
        graph = self._graphs.get(key, _MISSING)
        if graph is _MISSING:
            try:
                graph = _BlockGraph(self, inputs)
            except Exception as e:  # noqa: BLE001 - any failure means: run it eagerly instead
                graph = None
                graphs._warn(f"compile_block({graphs._name_of(self.fn)}) for inputs {[x.shape for x in inputs]}",
                                f"capture failed: {type(e).__name__}: {e}")
            self._graphs[key] = graph
        if graph is None:
            return self._eager(inputs)
        if graph.busy():
            if not self._warned_busy:
                self._warned_busy = True
                graphs._warn(f"compile_block({graphs._name_of(self.fn)}) called again before the backward "
                                "of its previous call", "that call (and any like it) runs eagerly")
            return self._eager(inputs)
        return graph.run(inputs)

    def _eager(self, inputs):
        """The block as written, on its parameters' device; the output back on the inputs' device."""
        tensors = [x for x in inputs if isinstance(x, Tensor)]
        if not tensors:
            return self.fn(*inputs)
        where = tensors[0].device
        home = self.params[0].device if self.params else where
        if home == where:
            return self.fn(*inputs)
        out = self.fn(*[x.to(home) if isinstance(x, Tensor) else x for x in inputs])
        return out.to(where) if isinstance(out, Tensor) else out


def compile_block(fn, *, params=None, device=None, enabled: bool = True) -> CompiledBlock:
    """`fn` (a Module, or a function of tensors whose parameters are given in `params`) as a
    CompiledBlock: captured forward and backward graphs, one autograd node, callable with GPU or
    CPU tensors."""
    return CompiledBlock(fn, params=params, device=device, enabled=enabled)
