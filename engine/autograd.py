"""Reverse-mode autograd: Function nodes and the backward pass.

An op is one `Function` subclass with `forward` and `backward` side by side (see `engine/ops/`).
`forward` receives raw backend arrays (and plain Python arguments) and returns a raw array;
`backward` receives the output's gradient as a raw array and returns one gradient (or None) per
Tensor argument, in order. `self.be` is the backend module of the op's device.
"""
from __future__ import annotations

import contextlib
import threading

from .tensor import Tensor, install_methods

_state = threading.local()


def is_grad_enabled() -> bool:
    return getattr(_state, "grad_enabled", True)


class _GradMode(contextlib.ContextDecorator):
    def __init__(self, enabled: bool):
        self.enabled = enabled

    def __enter__(self):
        self.prev = is_grad_enabled()
        _state.grad_enabled = self.enabled

    def __exit__(self, *exc):
        _state.grad_enabled = self.prev
        return False


def no_grad() -> _GradMode:
    """Context manager and decorator: ops inside record no graph (inference, optimizer updates)."""
    return _GradMode(False)


def enable_grad() -> _GradMode:
    return _GradMode(True)


class Function:
    """One differentiable op. Subclasses define forward(*arrays, **params) and backward(grad).

    forward may return a tuple of arrays: apply then returns a tuple of tensors, and backward gets a
    tuple of their gradients, once, with None for an output nothing downstream used."""

    be = None  # backend module, set per call
    parents: tuple = ()
    needs_input_grad: tuple = ()
    # Inputs (by position among the tensor arguments) whose gradient backward can add in place into one
    # that backward() already holds for that tensor from another path, such as a tied weight's (the
    # head's dweight, then the embedding's rows): backward() passes those as backward(g, into={i: array})
    # and takes back the same array for input i, with no zeroed buffer and no add after.
    grad_into: tuple = ()
    # True where every gradient backward returns is a new array of its own, which backward() may then
    # hand to a later op's grad_into (a gradient passed through, such as add's g, must not be).
    new_grads: bool = False
    # Set by backward() on the op that made the one-element tensor it runs from, when called without a
    # gradient and without retain_graph (loss.backward()): that op's backward then runs once, with a
    # gradient of exactly 1, and may hand over arrays it holds instead of scaled copies.
    unit_grad_once: bool = False

    def save_for_backward(self, *arrays) -> None:
        self.saved = arrays

    def inner(self, cls) -> "Function":
        """A `cls` op that this op runs inside itself (its forward and backward called directly, on this
        op's backend and device): a fused op made of existing ones."""
        op = cls()
        op.be, op.device = self.be, self.device
        return op

    @classmethod
    def apply(cls, *args, **params):
        tensors = [a for a in args if isinstance(a, Tensor)]
        device = tensors[0].device
        for t in tensors[1:]:
            if t.device != device:
                where = ", ".join(f"argument {i} on {a.device}" for i, a in enumerate(args) if isinstance(a, Tensor))
                raise RuntimeError(
                    f"{cls.__name__.lower()}: expected all tensors on one device, got {where}. "
                    "Move them with .to(device) first."
                )
        ctx = cls()
        ctx.be = tensors[0]._backend
        ctx.device = device
        raw = [a.data if isinstance(a, Tensor) else a for a in args]
        out = ctx.forward(*raw, **params)
        requires_grad = is_grad_enabled() and any(t.requires_grad for t in tensors)
        outs = out if isinstance(out, tuple) else (out,)
        results = tuple(Tensor._wrap(o, device, requires_grad) for o in outs)
        if requires_grad:
            ctx.parents = tuple(tensors)
            ctx.needs_input_grad = tuple(t.requires_grad for t in tensors)
            ctx.n_outputs = len(results)
            for i, r in enumerate(results):
                r._ctx, r._output_index = ctx, i
        return results if isinstance(out, tuple) else results[0]

    def forward(self, *args, **params):  # pragma: no cover - interface
        raise NotImplementedError

    def backward(self, grad, into=None):  # pragma: no cover - interface
        raise NotImplementedError


def _topological_order(root) -> list:
    order, seen = [], set()
    stack = [(root, False)]
    while stack:  # iterative DFS: deep graphs (long generation, many layers) never hit the recursion limit
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        if node._ctx is not None:
            for parent in node._ctx.parents:
                if parent.requires_grad and id(parent) not in seen:
                    stack.append((parent, False))
    return order


def backward(root, grad=None, retain_graph: bool = False) -> None:
    """Accumulate d(root)/d(leaf) into `.grad` of every leaf that requires grad."""
    if not root.requires_grad:
        raise RuntimeError("backward() on a tensor that does not require grad (no op on its path required grad)")
    unit = grad is None
    if unit:
        if root.numel() != 1:
            raise RuntimeError(f"backward() without a gradient needs a one-element tensor, got shape {root.shape}; "
                               "pass gradient=... for a non-scalar output")
        grad = root._backend.full(root.shape, 1.0, root.dtype, root.device.index)
    elif isinstance(grad, Tensor):
        grad = grad.data
    if root._ctx is not None and getattr(root._ctx, "n_outputs", 1) == 1:
        root._ctx.unit_grad_once = unit and not retain_graph
    grads = {id(root): grad}
    owned = set()  # ids of tensors whose gradient so far is backward()'s own array (an add's, a new_grads op's)
    order = _topological_order(root)
    # a Function of several outputs runs its backward once, after the last of its outputs in the graph
    waiting = {}  # id(ctx) -> [outputs still to come, their gradients so far]
    for node in order:
        ctx = node._ctx
        if ctx is not None and getattr(ctx, "n_outputs", 1) > 1:
            waiting.setdefault(id(ctx), [0, [None] * ctx.n_outputs])[0] += 1
    with no_grad():
        for node in reversed(order):
            g = grads.pop(id(node), None)
            owned.discard(id(node))
            ctx = node._ctx
            if ctx is not None and id(ctx) in waiting:
                entry = waiting[id(ctx)]
                entry[0] -= 1
                entry[1][node._output_index] = g
                if not retain_graph:
                    node._ctx = None
                if node._retains_grad and g is not None:
                    node._accumulate_grad(g)
                if entry[0] > 0 or all(x is None for x in entry[1]):
                    continue
                del waiting[id(ctx)]
                g = tuple(entry[1])
            elif g is None:
                continue
            elif ctx is None:  # a leaf: every path into it is summed already, so its .grad is final here
                node._accumulate_grad(g)
                for hook in getattr(node, "_post_accumulate_grad_hooks", ()):
                    hook(node)  # data parallel training starts reducing this gradient's bucket now
                continue
            elif node._retains_grad:
                node._accumulate_grad(g)
            into = None
            if ctx.grad_into:  # (most ops have none: no dict a node)
                into = {i: grads[id(ctx.parents[i])] for i in ctx.grad_into
                        if ctx.needs_input_grad[i] and id(ctx.parents[i]) in owned}
            parent_grads = ctx.backward(g, into=into) if into else ctx.backward(g)
            if not isinstance(parent_grads, tuple):
                parent_grads = (parent_grads,)
            for i, (parent, needs, pg) in enumerate(zip(ctx.parents, ctx.needs_input_grad, parent_grads)):
                if not needs or pg is None:
                    continue
                if tuple(pg.shape) != parent.shape:
                    raise RuntimeError(f"internal error: {type(ctx).__name__}.backward gave a gradient of shape "
                                       f"{tuple(pg.shape)} for an input of shape {parent.shape}")
                prev = grads.get(id(parent))
                if prev is None:
                    grads[id(parent)] = pg
                    if ctx.new_grads:
                        owned.add(id(parent))
                elif into and i in into and pg is into[i]:
                    into.pop(i)  # added in place; a second use of the same tensor by this op adds as usual
                else:
                    grads[id(parent)] = ctx.be.binary("add", prev, pg)
                    owned.add(id(parent))
            if not retain_graph:
                node._ctx = None


class _HookHandle:
    """What register_post_accumulate_grad_hook returns: remove() takes the hook off again."""

    def __init__(self, hooks: list, hook):
        self._hooks, self._hook = hooks, hook

    def remove(self) -> None:
        if self._hook in self._hooks:
            self._hooks.remove(self._hook)


@install_methods
class AutogradMethods:
    def backward(self, gradient=None, retain_graph: bool = False) -> None:
        backward(self, gradient, retain_graph)

    def register_post_accumulate_grad_hook(self, hook) -> _HookHandle:
        """Call hook(tensor) in every backward() once this leaf's .grad has its final value for that
        pass (PyTorch's name). DistributedDataParallel launches its gradient buckets from here."""
        if self._ctx is not None:
            raise RuntimeError("register_post_accumulate_grad_hook: only leaf tensors (parameters) accumulate "
                               "gradients; this tensor is the output of an op")
        hooks = self.__dict__.setdefault("_post_accumulate_grad_hooks", [])
        hooks.append(hook)
        return _HookHandle(hooks, hook)
