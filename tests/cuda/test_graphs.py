"""CUDA graphs (engine/graphs/): a captured training step against eager steps, dropout across
replays, compiled blocks as autograd nodes (GPU and CPU tensors), and the eager fallback.

Equality: an MLP step has no atomics anywhere (matmuls, GELU, reductions, AdamW), so its captured
replays must give bit-identical weights to eager steps. A GPT step has atomic adds (embedding and
layer-norm backward, attention's dQ), so even two eager runs differ in the last bits: there the check
is float32 tolerance (losses, and all but 1e-4 of the weights after 6 AdamW steps, to atol 1e-6 +
rtol 1e-5)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import engine
import engine.nn.functional as F
from engine.graphs import CapturedStep, GraphCaptureWarning, compile_block  # also engine.cuda.graphs
from engine.nn import GPT, GPTConfig, Linear, Module
from engine.optim import AdamW, clip_grad_norm_, warmup_cosine_lr


class MLP(Module):
    def __init__(self, d=32, h=64):
        super().__init__()
        self.fc = Linear(d, h)
        self.proj = Linear(h, d)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x)))


def _mlp_setup(seed=0):
    engine.manual_seed(seed)
    model = MLP().to("cuda")
    groups = [{"params": [model.fc.weight, model.proj.weight], "weight_decay": 0.1},
              {"params": [model.fc.bias, model.proj.bias], "weight_decay": 0.0}]
    return model, AdamW(groups, lr=1e-3, betas=(0.9, 0.95))


def _mlp_step(model, opt):
    def step(x, y):
        opt.zero_grad()
        d = model(x) - y
        loss = (d * d).mean()
        loss.backward()
        clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        return loss
    return step


def _lr(i):
    return warmup_cosine_lr(i, 1e-2, 2, 8, 1e-3)  # changes every step


def _weights(model):
    return [p.numpy().copy() for p in model.parameters()]


def test_captured_step_is_bit_identical_to_eager_mlp():
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((16, 32)).astype(np.float32), rng.standard_normal((16, 32)).astype(np.float32))
            for _ in range(8)]
    eager_model, eager_opt = _mlp_setup()
    graph_model, graph_opt = _mlp_setup()
    eager_step = _mlp_step(eager_model, eager_opt)
    captured = CapturedStep(_mlp_step(graph_model, graph_opt), warmup=2)
    for i, (x, y) in enumerate(data):
        for opt in (eager_opt, graph_opt):
            for g in opt.param_groups:
                g["lr"] = _lr(i)
        le = eager_step(engine.tensor(x, device="cuda"), engine.tensor(y, device="cuda"))
        lg = captured(x, y)  # numpy in: copied into the static buffers
        assert le.numpy() == lg.numpy(), f"step {i}: loss {le.numpy()} vs {lg.numpy()}"
        for a, b in zip(_weights(eager_model), _weights(graph_model)):
            assert np.array_equal(a, b), f"step {i}: max diff {np.abs(a - b).max()}"
    assert captured.captured and captured.replays == len(data) - 2
    assert captured.memory_stats()["mallocs_in_capture"] <= 2  # the warm-up step filled the pool (nearly)
    steps = {s["step"] for s in graph_opt.state.values()}
    assert steps == {len(data)}  # the host-side counts follow the replays (state_dict is right)


def test_captured_gpt_step_matches_eager_within_fp32():
    cfg = GPTConfig(vocab_size=65, block_size=32, n_layer=2, n_head=4, n_embd=64, dropout=0.0, bias=True)
    rng = np.random.default_rng(1)
    batches = [(rng.integers(0, 65, (4, 32)), rng.integers(0, 65, (4, 32))) for _ in range(6)]
    runs = []
    for use_graph in (False, True):
        engine.manual_seed(0)
        model = GPT(cfg).to("cuda")
        opt = AdamW(model.optimizer_groups(0.1), lr=1e-3, betas=(0.9, 0.95))

        def step(x, y, model=model, opt=opt):
            _, loss = model(x, y)
            opt.zero_grad()
            loss.backward()
            clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            return loss

        run = CapturedStep(step) if use_graph else step
        losses = []
        for i, (x, y) in enumerate(batches):
            for g in opt.param_groups:
                g["lr"] = _lr(i)
            args = (x, y) if use_graph else (engine.tensor(x, device="cuda"), engine.tensor(y, device="cuda"))
            losses.append(float(run(*args).numpy()))
        if use_graph:
            assert run.captured
        runs.append((losses, _weights(model)))
    (l0, w0), (l1, w1) = runs
    np.testing.assert_allclose(l1, l0, rtol=1e-5, atol=1e-6)
    # The atomics in the embedding, layer-norm and attention backward make even two eager runs differ
    # in the last bits, and AdamW's normalisation turns that into visible differences of elements whose
    # gradient is ~0. So the trajectories are compared as a whole: the graph run must land where the
    # eager run did, to within 2% of how far the six steps moved the weights (measured: 0.5 to 1.02%;
    # a wrong lr, a step count off by one or a stale input would be off by tens of percent).
    engine.manual_seed(0)
    w_init = _weights(GPT(cfg))
    moved = np.sqrt(sum(((a - i) ** 2).sum() for a, i in zip(w0, w_init)))
    apart = np.sqrt(sum(((b - a) ** 2).sum() for a, b in zip(w0, w1)))
    assert apart < 0.02 * moved, f"graph run is {apart:.3g} from the eager run, which moved {moved:.3g}"


def test_dropout_masks_differ_between_replays():
    def drop(x):
        return F.dropout(x, 0.5, True)

    step = CapturedStep(drop, warmup=1)
    x = np.ones((64, 64), np.float32)
    outs = [step(x).numpy() for _ in range(5)]  # 1 eager, 1 capture + replay, 3 replays
    assert step.captured
    for o in outs:
        assert set(np.unique(o)) <= {0.0, 2.0}
        assert 0.4 < (o == 0).mean() < 0.6
    for i in range(1, 5):
        for j in range(i + 1, 5):
            assert not np.array_equal(outs[i], outs[j]), f"replays {i} and {j} drew the same mask"


def _block_reference(module, x_np, gy_np, device):
    x = engine.tensor(x_np, device=device, requires_grad=True)
    for p in module.parameters():
        p.grad = None
    y = module(x)
    (y * engine.tensor(gy_np, device=device)).sum().backward()
    return y.numpy(), x.grad.numpy(), [p.grad.numpy() for p in module.parameters()]


def _block_run(block, module, x_np, gy_np, device):
    x = engine.tensor(x_np, device=device, requires_grad=True)
    for p in module.parameters():
        p.grad = None
    y = block(x)
    assert y.device == x.device
    (y * engine.tensor(gy_np, device=device)).sum().backward()
    return y.numpy(), x.grad.numpy(), [p.grad.numpy() for p in module.parameters()]


@pytest.mark.parametrize("where", ["cuda", "cpu_inputs", "cpu_module"])
def test_compiled_block_matches_eager(where, no_tf32):
    engine.manual_seed(3)
    module = MLP()
    if where != "cpu_module":
        module.to("cuda")
    device = "cuda" if where == "cuda" else "cpu"
    block = compile_block(module)
    rng = np.random.default_rng(2)
    for _ in range(3):  # the first call captures; later ones replay with new inputs
        x = rng.standard_normal((4, 8, 32)).astype(np.float32)
        gy = rng.standard_normal((4, 8, 32)).astype(np.float32)
        got = _block_run(block, module, x, gy, device)
        ref = _block_reference(module, x.copy(), gy, "cuda" if where == "cpu_inputs" else device)
        np.testing.assert_allclose(got[0], ref[0], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got[1], ref[1], rtol=1e-4, atol=1e-5)
        for a, b in zip(got[2], ref[2]):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert len(block._graphs) == 1 and next(iter(block._graphs.values())) is not None


def test_fallback_warns_and_still_trains():
    rng = np.random.default_rng(4)
    data = [(rng.standard_normal((16, 32)).astype(np.float32), rng.standard_normal((16, 32)).astype(np.float32))
            for _ in range(5)]
    eager_model, eager_opt = _mlp_setup()
    graph_model, graph_opt = _mlp_setup()
    eager_step = _mlp_step(eager_model, eager_opt)
    inner = _mlp_step(graph_model, graph_opt)
    seen = []

    def step_with_sync(x, y):
        loss = inner(x, y)
        seen.append(loss.item())  # a host sync: cannot be captured
        return loss

    captured = CapturedStep(step_with_sync, warmup=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x, y in data:
            eager_step(engine.tensor(x, device="cuda"), engine.tensor(y, device="cuda"))
            captured(x, y)
    msgs = [str(w.message) for w in caught if issubclass(w.category, GraphCaptureWarning)]
    assert len(msgs) == 1 and "runs eagerly" in msgs[0] and "capture" in msgs[0], msgs
    assert not captured.captured and captured.fallback_reason
    assert len(seen) >= len(data)
    for a, b in zip(_weights(eager_model), _weights(graph_model)):
        assert np.array_equal(a, b)  # the failed capture left no trace: same as eager
    assert {s["step"] for s in graph_opt.state.values()} == {len(data)}


def test_host_copy_inside_capture_is_refused_with_a_message():
    def bad(x):
        return x + engine.tensor(np.ones(4, np.float32), device="cuda")  # host data baked in: refused

    step = CapturedStep(bad, warmup=1)
    x = np.zeros(4, np.float32)
    step(x)
    with pytest.warns(GraphCaptureWarning, match="host-to-device copy"):
        out = step(x)
    np.testing.assert_array_equal(out.numpy(), np.ones(4, np.float32))


def _captured(fn):
    """fn() recorded into a CUDA graph of device 0 (the backend's own capture), not yet replayed."""
    from engine.backends.cuda.capture import cuda_graph, graph_pool
    graph = cuda_graph(0, graph_pool(0))
    graph.begin()
    try:
        out = fn()
    except BaseException:
        graph.abort()
        raise
    graph.end()
    return graph, out


def test_memset_nodes_run_as_kernel_nodes():
    """A memset captured on the stream (cuBLASLt queues one before each Hopper coop GEMM) is replaced by
    a kernel node (CudaGraph.memsets_replaced) that sets the same bytes, in order with the kernels
    around it: 32-bit, 16-bit rows with a pitch, and 8-bit, issued through the driver API."""
    import ctypes

    from engine._native import native
    from engine.backends import cuda as gpu
    cu = ctypes.CDLL("libcuda.so.1")
    stream = ctypes.c_void_p(native.stream_handle(0))
    base = np.arange(4096, dtype=np.float32)
    x = gpu.from_numpy(base)

    def record():
        y = gpu.binary("add", x, x)  # before the memsets: reads x as it was
        assert cu.cuMemsetD32Async(ctypes.c_uint64(x.ptr + 4 * 100), ctypes.c_uint(0x3F800000), ctypes.c_size_t(500),
                                   stream) == 0  # x[100:600] = 1.0
        # rows 8..11 of x as (., 256) float32: their first 64 halves (32 floats) set to 0x4000 each
        assert cu.cuMemsetD2D16Async(ctypes.c_uint64(x.ptr + 4 * 256 * 8), ctypes.c_size_t(4 * 256),
                                     ctypes.c_ushort(0x4000), ctypes.c_size_t(64), ctypes.c_size_t(4), stream) == 0
        assert cu.cuMemsetD8Async(ctypes.c_uint64(x.ptr + 4 * 4000), ctypes.c_ubyte(0), ctypes.c_size_t(40),
                                  stream) == 0  # x[4000:4010] = 0
        z = gpu.binary("add", x, x)  # after them: reads what they set
        return y, z

    graph, (y, z) = _captured(record)
    assert graph.memsets_replaced == 3
    native.copy_device(x.ptr, gpu.from_numpy(base).ptr, base.nbytes, 0)  # capture ran nothing: x as before
    graph.replay()
    want = base.copy()
    want[100:600] = 1.0
    rows = want.reshape(-1, 256)
    rows[8:12, :32] = np.frombuffer(np.full(64, 0x4000, np.uint16).tobytes(), np.float32)
    want[4000:4010] = 0.0
    np.testing.assert_array_equal(gpu.to_numpy(x), want)
    np.testing.assert_array_equal(gpu.to_numpy(y), 2 * base)
    np.testing.assert_array_equal(gpu.to_numpy(z), 2 * want)


def _bf16(rng, *shape):
    from engine.backends import cuda as gpu
    return gpu.astype(gpu.from_numpy(rng.standard_normal(shape).astype(np.float32)), engine.bfloat16)


def test_captured_gemms_replay_bit_for_bit():
    """GPT-2's projection shapes in bf16: every replay's products are the eager ones of that replay's
    inputs, bit for bit. On Hopper cuBLASLt picks coop kernels here, each zeroing a counter in its
    workspace first: in a capture each GEMM has a workspace of its own, and the graph's first node does
    all the zeroing (memsets_hoisted), so no memset node is left (memsets_replaced == 0). A counter not
    zeroed before a replay would hang that replay or garble its products."""
    from engine._native import native
    from engine.backends import cuda as gpu
    rng = np.random.default_rng(0)
    shapes = [(4096, 768, 2304), (4096, 3072, 768), (4096, 768, 3072)]
    ins = [(_bf16(rng, m, k), _bf16(rng, n, k)) for m, k, n in shapes]
    graph, outs = _captured(lambda: [gpu.matmul(a, b, transpose_b=True) for a, b in ins])
    assert graph.memsets_replaced == 0
    if engine.cuda.get_device_capability() == (9, 0):
        assert graph.memsets_hoisted >= 1
    for _ in range(4):  # new operands in place, then a replay
        for (a, b), (m, k, n) in zip(ins, shapes):
            for x, new in ((a, _bf16(rng, m, k)), (b, _bf16(rng, n, k))):
                native.copy_device(x.ptr, new.ptr, 2 * new.size, 0)
        eager = [gpu.to_numpy(gpu.astype(gpu.matmul(a, b, transpose_b=True), engine.float32)) for a, b in ins]
        graph.replay()
        for got, want in zip(outs, eager):
            np.testing.assert_array_equal(gpu.to_numpy(gpu.astype(got, engine.float32)), want)


def test_graphs_hold_their_gemm_workspaces_apart():
    """Two graphs alive together each zero their own GEMMs' workspaces and replay interleaved, bit for
    bit; a graph captured after one is destroyed reuses its workspaces and replays correctly too; an
    aborted capture gives back what it took."""
    from engine.backends import cuda as gpu
    rng = np.random.default_rng(1)
    a, b = _bf16(rng, 4096, 768), _bf16(rng, 3072, 768)
    c, d = _bf16(rng, 4096, 3072), _bf16(rng, 768, 3072)
    want_ab = gpu.to_numpy(gpu.astype(gpu.matmul(a, b, transpose_b=True), engine.float32))
    want_cd = gpu.to_numpy(gpu.astype(gpu.matmul(c, d, transpose_b=True), engine.float32))
    g1, out1 = _captured(lambda: gpu.matmul(a, b, transpose_b=True))
    g2, out2 = _captured(lambda: gpu.matmul(c, d, transpose_b=True))
    for _ in range(3):
        g1.replay()
        g2.replay()
    np.testing.assert_array_equal(gpu.to_numpy(gpu.astype(out1, engine.float32)), want_ab)
    np.testing.assert_array_equal(gpu.to_numpy(gpu.astype(out2, engine.float32)), want_cd)

    def fail():
        gpu.matmul(a, b, transpose_b=True)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        _captured(fail)
    del g1, out1
    g3, out3 = _captured(lambda: [gpu.matmul(a, b, transpose_b=True), gpu.matmul(a, b, transpose_b=True)])
    for _ in range(3):
        g3.replay()
        g2.replay()
    for o in out3:
        np.testing.assert_array_equal(gpu.to_numpy(gpu.astype(o, engine.float32)), want_ab)
    np.testing.assert_array_equal(gpu.to_numpy(gpu.astype(out2, engine.float32)), want_cd)
