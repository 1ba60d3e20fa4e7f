"""DistributedDataParallel: one model replica per process, gradients averaged across the ranks.

    model = DistributedDataParallel(GPT(config).to("cuda"))   # after init_process_group
    loss = model(x, y)[1]; loss.backward()                   # gradients averaged when it returns
    optimizer.step()                                          # the same update on every rank

- At wrap time every parameter and buffer is broadcast from rank 0: all ranks start alike.
- Gradients are reduced in buckets of ~`bucket_cap_mb` (parameters in reverse order, roughly the
  order backward produces their gradients). A hook on each parameter (engine.autograd's post-
  accumulate-grad hook, run once a leaf's .grad is final in the backward pass) copies the gradient
  into its bucket's flat buffer; when a bucket is full it is all-reduced (avg) at once, while the
  backward goes on: with "nccl" on the communicator's side stream, so communication overlaps the
  rest of the backward on the GPU. Buckets are launched in index order on every rank (the
  collectives must match). When the last bucket is launched, engine's stream waits for the side
  stream and every parameter's .grad becomes a view of its averaged slice of the bucket.
- No host synchronisation anywhere: the whole step, collectives included, can be captured in a
  CUDA graph (coop.training.TrainStep does). The buffers are made once, at wrap time, so their
  addresses stay fixed across replays.
- `no_sync()`: backward passes inside it only accumulate locally (gradient accumulation); the
  first backward outside it reduces the sum.
- Every parameter that requires grad must receive a gradient in every synchronised backward
  (no `find_unused_parameters`): the next forward raises if one did not, naming it.
- bf16 autocast changes nothing here: parameters and their gradients stay float32.
"""
from __future__ import annotations

import contextlib

from .. import distributed as dist
from ..autograd import no_grad
from ..factories import zeros
from ..tensor import Tensor
from .module import Module


class _Bucket:
    """Parameters whose gradients are reduced together: one flat buffer (numel,), their offsets."""

    def __init__(self, params: list, device, dtype):
        self.params = params
        self.offsets, total = [], 0
        for p in params:
            self.offsets.append(total)
            total += p.numel()
        self.flat = zeros((total,), dtype=dtype, device=device)
        be = self.flat._backend
        # (numel,) -> one view per parameter, shaped like it
        self.views = [be.reshape(be.getitem(self.flat.data, (slice(o, o + p.numel()),)), p.shape)
                      for p, o in zip(params, self.offsets)]
        self.ready = 0

    @property
    def nbytes(self) -> int:
        return self.flat.numel() * self.flat.dtype.itemsize


class DistributedDataParallel(Module):
    """`module` replicated over the ranks of `process_group` (the default group when None)."""

    def __init__(self, module: Module, process_group=None, bucket_cap_mb: float = 25.0,
                 broadcast_parameters: bool = True):
        super().__init__()
        self.module = module
        self.process_group = process_group or dist.get_group()
        self.bucket_cap_bytes = int(bucket_cap_mb * (1 << 20))
        params = [p for p in module.parameters() if p.requires_grad]
        if not params:
            raise ValueError("DistributedDataParallel: the module has no parameter that requires grad")
        if broadcast_parameters:
            self._broadcast_from_rank0(module)
        self.buckets = self._make_buckets(params)
        self._where = {}  # id(param) -> (bucket index, index in the bucket)
        for b, bucket in enumerate(self.buckets):
            for i, p in enumerate(bucket.params):
                self._where[id(p)] = (b, i)
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_ready) for p in params]
        self._sync = True
        self._next_bucket = 0  # the next bucket to launch in this backward
        self._works: list = []

    def _broadcast_from_rank0(self, module: Module) -> None:
        with no_grad():
            for t in list(module.parameters()) + [b for _, b in module.named_buffers() if b is not None]:
                self.process_group.broadcast(t, 0)

    def _make_buckets(self, params: list) -> list[_Bucket]:
        """Reverse parameter order (backward's order, roughly), split at the cap and by device/dtype."""
        buckets, current, size = [], [], 0
        for p in reversed(params):
            nbytes = p.numel() * p.dtype.itemsize
            if current and (size + nbytes > self.bucket_cap_bytes or p.dtype != current[0].dtype
                            or p.device != current[0].device):
                buckets.append(_Bucket(current, current[0].device, current[0].dtype))
                current, size = [], 0
            current.append(p)
            size += nbytes
        if current:
            buckets.append(_Bucket(current, current[0].device, current[0].dtype))
        return buckets

    # -- the backward's side --

    def _grad_ready(self, param: Tensor) -> None:
        if not self._sync:
            return
        b, i = self._where[id(param)]
        bucket = self.buckets[b]
        be = bucket.flat._backend
        be.copy_(bucket.views[i], param.grad.data)
        bucket.ready += 1
        while self._next_bucket < len(self.buckets) and \
                self.buckets[self._next_bucket].ready == len(self.buckets[self._next_bucket].params):
            ready = self.buckets[self._next_bucket]
            self._works.append(self.process_group.all_reduce(ready.flat, "avg", async_op=True))
            self._next_bucket += 1
        if self._next_bucket == len(self.buckets):
            self._finish()

    def _finish(self) -> None:
        """Every bucket launched: order what follows behind them, and point .grad at the averages."""
        for work in self._works:
            work.wait()
        for bucket in self.buckets:
            for p, view in zip(bucket.params, bucket.views):
                p.grad = Tensor._wrap(view, p.device)
            bucket.ready = 0
        self._works, self._next_bucket = [], 0

    def _unreduced(self) -> list[str]:
        names = {id(p): n for n, p in self.module.named_parameters()}
        return [names.get(id(p), "?") for bucket in self.buckets if bucket.ready for p in bucket.params]

    # -- the module's side --

    def forward(self, *args, **kwargs):
        if self._next_bucket or any(bucket.ready for bucket in self.buckets):
            partly = self._unreduced()
            for bucket in self.buckets:
                bucket.ready = 0
            self._works, self._next_bucket = [], 0
            raise RuntimeError(f"DistributedDataParallel: the last backward did not give every parameter a gradient "
                               f"(buckets with {', '.join(partly[:5])} waited for the others), so nothing was averaged; "
                               "every parameter that requires grad must take part in the loss")
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients locally, without communication."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    def remove_hooks(self) -> None:
        """Take the gradient hooks off the module's parameters (the module is then used alone again)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    def state_dict(self):
        return self.module.state_dict()

    def load_state_dict(self, state_dict, strict: bool = True):
        return self.module.load_state_dict(state_dict, strict)

    def __getattr__(self, name: str):
        # attributes of the wrapped model (config, optimizer_groups, generate) read through, as
        # code written for the bare model expects; only called when normal lookup failed
        module = self.__dict__.get("module")
        if module is None:
            raise AttributeError(name)
        return getattr(module, name)


__all__ = ["DistributedDataParallel"]
