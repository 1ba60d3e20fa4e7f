"""CUDA graphs: record GPU work once, replay it with one launch (also `engine.cuda.graphs`).

step.py holds CapturedStep (a whole training step) and the capture state; block.py compile_block
(one module as a forward graph and a backward graph).

On a small model most of a training step's time is Python deciding which kernel to launch next.
A CUDA graph records the kernels one call queues (stream capture) and replays all of them with one
launch, so that cost is paid once.

    step = engine.cuda.graphs.CapturedStep(train_step)    # train_step(x, y) -> loss
    for x, y in batches:                                  # numpy arrays, CPU or GPU tensors
        scheduler.step()                                  # lr changes reach the graph
        loss = step(x, y)                                 # warm-up, capture, then replays

    block = engine.cuda.graphs.compile_block(model.mlp)   # one autograd node, its own fwd/bwd graphs
    y = block(x)                                          # x on the GPU or the CPU

What makes a replay compute what an eager step computes:
- inputs are copied into static device buffers before each replay; outputs are copied out of
  static buffers (the step's function sees the static buffers, on the GPU);
- the optimizers read lr and step count from device memory (engine/optim/device_scalars.py):
  set `group["lr"]` (or step a scheduler) *outside* the captured function; each replay uploads
  the new lr and counts its step on the device;
- the graph's memory comes from a private pool that eager code never reuses while the graph lives
  (csrc/cuda/runtime.h); warm-up calls run eagerly, the last one in that pool, so the capture finds
  its blocks there and lazily made things (optimizer state, cuBLASLt plans, masks) exist before it;
- random kernels (dropout) mix a device-side epoch into their seed, and every replay advances it:
  each replay draws new masks.

What cannot be captured: anything that reads or writes host memory or waits for the GPU inside
the step (`.item()`, `.numpy()`, `print(loss)`, `engine.tensor(host_data, device="cuda")`), or
anything that creates state inside it. Then the capture is abandoned, the step's host-side effects
are undone, and it runs eagerly from then on, with a GraphCaptureWarning that says why. Without
CUDA every call runs eagerly (one warning). Python side effects of the function (counters,
logging) happen once, at capture: only the GPU work is replayed.
"""
from __future__ import annotations

from .block import CompiledBlock, compile_block
from .step import CapturedStep, GraphCaptureWarning, graph_step, is_capturing

__all__ = ["CapturedStep", "graph_step", "CompiledBlock", "compile_block", "GraphCaptureWarning", "is_capturing"]
