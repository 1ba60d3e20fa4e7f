"""CapturedStep: a whole training step recorded once as a CUDA graph and replayed (see the package's
docstring), and what the rest of engine asks while a capture is under way: whether one is
(is_capturing), the optimizers that step inside it, how to undo a failed one; the static-buffer
helpers that compile_block (block.py) shares."""
from __future__ import annotations

import functools
import warnings

import numpy as np

from .. import dtypes
from .. import random as engine_random
from ..backends import cuda as cb
from ..backends.cuda import capture, runtime
from ..device import Device
from ..factories import zeros
from ..tensor import Tensor, tensor


class GraphCaptureWarning(UserWarning):
    """A function meant to run as a CUDA graph runs eagerly instead (the message says why)."""


# ---- what the rest of engine asks while a capture is under way ----------------------------------

_capture = None  # the _CaptureContext of the capture under way (one at a time)
_recording = None  # list of the optimizers that stepped during a CapturedStep warm-up


def is_capturing() -> bool:
    """True while engine is recording a CUDA graph (ops queue work but nothing runs)."""
    return _capture is not None


def _note_optimizer(opt):
    """Called by Optimizer.step: returns the capture context when one is under way, else None."""
    if _capture is not None:
        _capture.note_optimizer(opt)
        return _capture
    if _recording is not None and all(o is not opt for o in _recording):
        _recording.append(opt)
    return None


class _CaptureContext:
    """One capture attempt: the optimizers stepped inside it, and how to undo its host-side effects."""

    def __init__(self, known_optimizers=()):
        self.optimizers: list = []
        self.snapshots: list = []
        self.rng_state = engine_random.get_rng_state()
        for opt in known_optimizers:  # before the step runs: their gradients too
            self.note_optimizer(opt)

    def note_optimizer(self, opt) -> None:
        if any(o is opt for o in self.optimizers):
            return
        self.snapshots.append((opt, opt._capture_snapshot()))
        opt._captured_updates = []
        self.optimizers.append(opt)

    def rollback(self) -> None:
        for opt, snap in self.snapshots:
            opt._capture_restore(snap)
        engine_random.set_rng_state(self.rng_state)


def capture_unavailable() -> str | None:
    """Why no CUDA graph can be captured in this process, or None when one can."""
    if not runtime.is_available():
        return f"CUDA is not available ({runtime.unavailable_reason()})"
    if not capture.graphs_built():
        return "this build of engine._C has no CUDA graph support (rebuild it: pip install -e .)"
    return None


def _warn(what: str, reason: str) -> None:
    warnings.warn(f"engine.graphs: {what} runs eagerly: {reason}", GraphCaptureWarning, stacklevel=3)


def _name_of(fn) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def _device_copy(x, device: int):
    """A fresh device array holding x's values (outputs leave the static buffers this way)."""
    return cb.device_copy(x, device)


def _copy_into(static: Tensor, x, what: str) -> None:
    """static (a GPU tensor) <- x (a tensor on any device, or a numpy array) of the same shape."""
    dev = static.device.index
    s = static.data
    if isinstance(x, Tensor):
        if x.shape != static.shape:
            raise ValueError(f"{what} has shape {x.shape}, the graph was captured for {static.shape}; "
                             "shapes are fixed per graph (make one per shape)")
        if x.device.type == "cuda":
            if x.device.index != dev:
                raise RuntimeError(f"{what} is on {x.device}, the graph runs on cuda:{dev}")
            if x.dtype != static.dtype:
                raise TypeError(f"{what} is {x.dtype}, the graph was captured for {static.dtype}")
            cb.copy_(s, x.data)  # (nothing to do when x is the static buffer itself)
            return
        x = x.data
    arr = np.asarray(x)
    if arr.shape != static.shape:
        raise ValueError(f"{what} has shape {arr.shape}, the graph was captured for {static.shape}; "
                         "shapes are fixed per graph (make one per shape)")
    want = static.dtype.numpy
    if want is None:
        raise TypeError(f"{what}: host data cannot go into a {static.dtype} buffer; pass a GPU tensor")
    if arr.dtype != want:
        if not np.can_cast(arr.dtype, want, "same_kind"):
            raise TypeError(f"{what} is {arr.dtype}, the graph was captured for {static.dtype}")
        arr = arr.astype(want)
    arr = np.ascontiguousarray(arr)
    cb.copy_from_numpy_(s, arr)


def _static_like(x, device: int) -> Tensor | None:
    """An empty GPU buffer for an input like x (a Tensor or array); None for anything else."""
    if isinstance(x, Tensor):
        return zeros(x.shape, dtype=x.dtype, device=Device("cuda", device))
    if isinstance(x, np.ndarray):
        return zeros(x.shape, dtype=dtypes.from_numpy(x.dtype), device=Device("cuda", device))
    return None


def _flatten(out) -> tuple[list, object]:
    """Outputs -> (their GPU tensors, a spec to rebuild the structure). Tuples, lists and dicts nest."""
    tensors: list = []

    def spec_of(o):
        if isinstance(o, Tensor):
            tensors.append(o)
            return ("t", len(tensors) - 1)
        if isinstance(o, (tuple, list)):
            return ("seq", type(o), [spec_of(v) for v in o])
        if isinstance(o, dict):
            return ("dict", [(k, spec_of(v)) for k, v in o.items()])
        return ("const", o)

    return tensors, spec_of(out)


def _rebuild(spec, tensors: list):
    kind = spec[0]
    if kind == "t":
        return tensors[spec[1]]
    if kind == "seq":
        return spec[1](_rebuild(s, tensors) for s in spec[2])
    if kind == "dict":
        return {k: _rebuild(s, tensors) for k, s in spec[1]}
    return spec[1]


# ---- a whole training step ----------------------------------------------------------------------

class CapturedStep:
    """`step_fn(*inputs)` run as one CUDA graph: forward, backward, clipping, optimizer update.

    The first `warmup` calls run eagerly (real steps: they create optimizer state, plans and
    caches; the last one fills the graph's private memory pool); the next call captures the step
    and replays it, and every later call only copies the inputs in and replays.

    - Inputs: tensors (any device) and numpy arrays are copied into static GPU buffers, which
      `step_fn` receives; other arguments are passed as they are and must not change.
    - Outputs: Tensors in what `step_fn` returns (nested tuples, lists, dicts) come back as fresh
      copies (`clone_outputs=False` returns the static buffers, overwritten by the next replay).
    - Learning rate: set `group["lr"]` or step a scheduler outside `step_fn`; each replay sends
      the optimizers' current lrs to the device (their step counts advance on the device).
    - After `optimizer.load_state_dict(...)` or a change of the model's parameters (not their
      values), call `reset()`: the graph holds the old buffers' addresses.

    Where capture is impossible (no CUDA, a host sync or host data inside the step, ...) every call
    runs `step_fn` eagerly, after one GraphCaptureWarning; `fallback_reason` says why.
    """

    def __init__(self, step_fn, *example_inputs, warmup: int = 2, device=None, clone_outputs: bool = True,
                 enabled: bool = True):
        self.step_fn = step_fn
        self.warmup = max(1, int(warmup))
        self.clone_outputs = clone_outputs
        self.calls = 0  # eager warm-up calls + replays (+ eager calls after a fallback)
        self.replays = 0
        self.fallback_reason: str | None = None
        self.device_index: int | None = None
        self._graph = None
        self._pool = None
        self._statics: list | None = None  # per argument: a static GPU Tensor, or None (passed as is)
        self._consts: list = []
        self._out_tensors: list = []
        self._out_spec = None
        self._optimizers: list = []
        self._gpu_work = False
        functools.update_wrapper(self, step_fn, updated=())
        if not enabled:
            self.fallback_reason = "disabled (enabled=False)"
            return
        reason = capture_unavailable()
        if reason is not None:
            self._fall_back(reason)
            return
        self.device_index = runtime._index(device)
        if example_inputs:
            self._make_statics(example_inputs)

    # -- public state --

    @property
    def captured(self) -> bool:
        """True once the step runs as a graph."""
        return self._graph is not None

    def memory_stats(self) -> dict:
        """The private pool's reserved/cached bytes and cudaMallocs during capture (0 after warm-up)."""
        return dict(self._pool.stats()) if self._pool is not None else {}

    def reset(self) -> None:
        """Forget the graph: the next call runs one eager warm-up step, then captures again."""
        self._graph = None
        self._pool = None
        self._out_tensors, self._out_spec = [], None
        if self.fallback_reason is None:
            self.calls = min(self.calls, self.warmup - 1)

    # -- calling --

    def __call__(self, *inputs):
        if self.fallback_reason is not None:
            return self._eager(inputs)
        args = self._stage(inputs)
        if self._graph is not None:
            self._replay()
            return self._outputs()
        if self.calls < self.warmup:
            return self._warm_up(args)
        return self._capture(args)

    def _eager(self, inputs):
        self.calls += 1
        if self._statics is not None and self.device_index is not None:
            return self.step_fn(*self._stage(inputs))  # as warm-up and capture saw them: on the GPU
        return self.step_fn(*[tensor(x) if isinstance(x, np.ndarray) else x for x in inputs])

    def _fall_back(self, reason: str) -> None:
        self.fallback_reason = reason
        self._graph = None
        self._pool = None
        _warn(f"CapturedStep({_name_of(self.step_fn)})", reason)

    def _make_statics(self, inputs) -> None:
        self._statics = [_static_like(x, self.device_index) for x in inputs]
        self._consts = [None if s is not None else x for s, x in zip(self._statics, inputs)]

    def _stage(self, inputs) -> list:
        if self._statics is None:
            self._make_statics(inputs)
        if len(inputs) != len(self._statics):
            raise TypeError(f"CapturedStep({_name_of(self.step_fn)}): called with {len(inputs)} arguments, "
                            f"made for {len(self._statics)}")
        args = []
        for i, (x, s) in enumerate(zip(inputs, self._statics)):
            if s is None:
                if self._graph is not None and x is not self._consts[i] and x != self._consts[i]:
                    raise ValueError(f"CapturedStep: argument {i} ({x!r}) differs from the value captured "
                                     f"({self._consts[i]!r}); pass changing values as tensors or arrays")
                args.append(x)
            else:
                _copy_into(s, x, f"CapturedStep argument {i}")
                args.append(s)
        return args

    def _warm_up(self, args):
        global _recording
        dev = self.device_index
        last = self.calls == self.warmup - 1
        if last and self._pool is None:
            self._pool = capture.graph_pool(dev)
        before = capture.alloc_count(dev)
        _recording = list(self._optimizers)
        if last:
            self._pool.activate()
        try:
            out = self.step_fn(*args)
        finally:
            if last:
                self._pool.deactivate()
            self._optimizers, _recording = _recording, None
        self._gpu_work = self._gpu_work or capture.alloc_count(dev) != before
        self.calls += 1
        return out

    def _capture(self, args):
        global _capture
        if not self._gpu_work:
            self._fall_back("the warm-up steps queued no GPU work (are the model and the optimizer on the GPU?)")
            return self._eager_after_fallback(args)
        for opt in self._optimizers:
            opt._sync_device_lrs()
        ctx = _CaptureContext(self._optimizers)
        graph = capture.cuda_graph(self.device_index, self._pool)
        _capture = ctx
        try:
            graph.begin()
            try:
                out = self.step_fn(*args)
            except BaseException:
                graph.abort()
                raise
            graph.end()
        except Exception as e:  # noqa: BLE001 - any failure means: run it eagerly instead
            _capture = None
            graph.abort()  # (a no-op unless the failure left the stream capturing)
            ctx.rollback()
            self._fall_back(f"capture failed: {type(e).__name__}: {e}")
            return self._eager_after_fallback(args)
        finally:
            _capture = None
        self._graph = graph
        self._optimizers = ctx.optimizers
        self._out_tensors, self._out_spec = _flatten(out)
        self._out_tensors = [t.detach() for t in self._out_tensors]  # drop the recorded autograd graph
        for opt in self._optimizers:
            opt._sync_device_lrs()
        graph.replay()  # this call's step (capture only recorded it); host counters already moved
        self.replays += 1
        self.calls += 1
        return self._outputs()

    def _eager_after_fallback(self, args):
        self.calls += 1
        return self.step_fn(*args)

    def _replay(self) -> None:
        for opt in self._optimizers:
            opt._sync_device_lrs()
        self._graph.replay()
        for opt in self._optimizers:
            opt._advance_after_replay()
        self.replays += 1
        self.calls += 1

    def _outputs(self):
        tensors = self._out_tensors
        if self.clone_outputs:
            tensors = [Tensor._wrap(_device_copy(t.data, t.device.index), t.device) if t.device.type == "cuda"
                       else t for t in tensors]
        else:
            tensors = [t.detach() for t in tensors]
        return _rebuild(self._out_spec, tensors)


def graph_step(fn=None, *, warmup: int = 2, device=None, clone_outputs: bool = True, enabled: bool = True):
    """Decorator form of CapturedStep: `@engine.cuda.graph_step` over a training step function."""
    if fn is None:
        return lambda f: CapturedStep(f, warmup=warmup, device=device, clone_outputs=clone_outputs, enabled=enabled)
    return CapturedStep(fn, warmup=warmup, device=device, clone_outputs=clone_outputs, enabled=enabled)

