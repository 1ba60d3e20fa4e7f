"""The Hopper attention kernels (csrc/cuda/attention/attention_wgmma.cu, wgmma, head dims 32, 64 and 128),
forward and backward, against the CPU reference and against the kernels they replace (mma.sync; at
head dim 128 the backward's are the WMMA ones).
Tolerance as test_attention.py's bf16: 3e-2 of the largest reference value (inputs rounded to bf16
on both sides, probabilities rounded to bf16 before the products on the GPU only)."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

import engine
from engine.backends import cpu
from engine.backends import cuda as gpu

TOL = 3e-2


def _bf16(a: np.ndarray):
    """a (float32) on the GPU as bf16, and the rounded values back as float32 (both sides' inputs)."""
    x = gpu.astype(gpu.from_numpy(np.ascontiguousarray(a, dtype=np.float32)), engine.bfloat16)
    return x, _download(x)


def _download(x) -> np.ndarray:
    return gpu.to_numpy(gpu.astype(x, engine.float32))


def _rel(got, want) -> float:
    return float(np.max(np.abs(got - want)) / max(1e-30, float(np.max(np.abs(want)))))


def _inputs(shape_q, shape_kv, seed):
    """(q, k, v, dout) as bf16 GPU arrays and as their float32 values."""
    rng = np.random.default_rng(seed)
    pairs = [_bf16(rng.standard_normal(s)) for s in (shape_q, shape_kv, shape_kv, shape_q)]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _hopper() -> bool:
    return engine.cuda.is_available() and engine.cuda.get_device_capability() == (9, 0)


@contextlib.contextmanager
def _kernels(wgmma: bool):
    """bf16 attention on the wgmma kernels, or (False) on the mma.sync ones."""
    prev = gpu.attention_wgmma_forward(wgmma), gpu.attention_wgmma_backward(wgmma)
    try:
        yield
    finally:
        gpu.attention_wgmma_forward(prev[0])
        gpu.attention_wgmma_backward(prev[1])


KERNELS = [pytest.param(True, id="wgmma"), pytest.param(False, id="mma")]


@contextlib.contextmanager
def _choice(choose, kernel: int):
    """Run with `choose(kernel)` (attention_wgmma_forward_kernel or _backward_kernel), then put back
    the previous choice."""
    prev = choose(kernel)
    try:
        yield
    finally:
        choose(prev)


def _forward_kernel(kernel: int):
    return _choice(gpu.attention_wgmma_forward_kernel, kernel)


def _backward_kernel(kernel: int):
    return _choice(gpu.attention_wgmma_backward_kernel, kernel)


# the warp-specialised kernels' shapes: partial tiles, T != S, T > S, a single query, causal blocks
# whose consumers see different numbers of tiles, 1024 tokens
WS_SHAPES = [(2, 3, 128, 128, True), (1, 2, 37, 130, True), (1, 1, 1, 9, True), (1, 3, 330, 400, True),
             (1, 2, 200, 333, False), (1, 2, 130, 70, True), (1, 2, 448, 448, True), (2, 2, 1024, 1024, True),
             (1, 2, 600, 700, True), (1, 2, 700, 650, False),  # these two: query tiles that end at T
             (1, 2, 192, 256, True)]  # query tiles of 128 that a block's second 64 keys skip, then see


@pytest.mark.parametrize("choose", [gpu.attention_wgmma_forward_kernel, gpu.attention_wgmma_backward_kernel],
                         ids=["forward", "backward"])
def test_an_unknown_kernel_is_refused(choose):
    with pytest.raises(ValueError, match="not one of"):
        choose(99)


def test_default_build_has_the_hopper_kernel():
    if not _hopper():
        pytest.skip("needs a compute capability 9.0 GPU (H100 / H200)")
    assert gpu.attention_wgmma_built(), \
        "engine._C was built without sm_90a (ENGINE_CUDA_ARCHS); the attention forward falls back to mma.sync"


def _check_against_cpu(wgmma, B, H, T, S, D, causal):
    (Q, K, V, G), (q, k, v, g) = _inputs((B, H, T, D), (B, H, S, D), seed=T + 7 * S + D)
    scale = D ** -0.5
    out_c, lse_c, _ = cpu.attention(q, k, v, causal, scale)
    with _kernels(wgmma):
        out, lse, _ = gpu.attention(Q, K, V, causal, scale)
        dq, dk, dv = gpu.attention_backward(G, Q, K, V, out, lse, causal, scale)
    assert out.dtype is engine.bfloat16
    assert _rel(_download(out), out_c) < TOL
    lse_g = gpu.to_numpy(lse)
    finite = np.isfinite(lse_c)  # a query that sees no key (T > S, causal) has lse -inf and output 0
    assert np.array_equal(np.isfinite(lse_g), finite)
    np.testing.assert_allclose(lse_g[finite], lse_c[finite], atol=TOL * 10, rtol=TOL)
    assert np.all(_download(out)[~finite] == 0)
    dq_c, dk_c, dv_c = cpu.attention_backward(g, q, k, v, out_c, lse_c, causal, scale)
    for got, want, name in ((dq, dq_c, "dq"), (dk, dk_c, "dk"), (dv, dv_c, "dv")):
        assert _rel(_download(got), want) < TOL * 2, name


@pytest.mark.parametrize("wgmma", KERNELS)
@pytest.mark.parametrize("B,H,T,S,causal", [(2, 3, 64, 64, True), (2, 3, 128, 128, True), (1, 2, 37, 130, True),
                                            (1, 1, 1, 9, True), (2, 2, 256, 256, True), (1, 3, 330, 400, True),
                                            (2, 2, 129, 129, False), (1, 2, 200, 333, False), (1, 2, 130, 70, True),
                                            (3, 4, 1024, 1024, True)])
def test_matches_cpu(wgmma, B, H, T, S, causal):
    _check_against_cpu(wgmma, B, H, T, S, 64, causal)


@pytest.mark.parametrize("wgmma", KERNELS)
@pytest.mark.parametrize("D", [32, 128])
@pytest.mark.parametrize("B,H,T,S,causal", [(2, 3, 128, 128, True), (1, 2, 37, 130, True), (1, 1, 1, 9, True),
                                            (1, 3, 330, 400, True), (1, 2, 200, 333, False), (1, 2, 130, 70, True),
                                            (2, 2, 1024, 1024, True)])
def test_other_head_dims_match_cpu(wgmma, D, B, H, T, S, causal):
    """Head dim 128 is two panels of 64 columns in every tile (and dQ a panel at a time); 32 is half
    a panel (n32 products). Partial tiles, T != S and T > S as for 64."""
    _check_against_cpu(wgmma, B, H, T, S, D, causal)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("D", [32, 64, 128])
def test_matches_the_mma_kernels(causal, D):
    """Same inputs through the wgmma and the mma.sync kernels (at head dim 128 the backward's fallback
    is the WMMA kernel): they differ only in accumulation order (and the backward's dQ, by atomics, in
    summation order), so they agree far tighter than either does with the float32 reference."""
    (Q, K, V, G), _ = _inputs((2, 6, 512, D), (2, 6, 512, D), seed=11)
    res = {}
    for name in ("mma", "wgmma"):
        with _kernels(name == "wgmma"):
            out, lse, _ = gpu.attention(Q, K, V, causal, D ** -0.5)
            grads = gpu.attention_backward(G, Q, K, V, out, lse, causal, D ** -0.5)
        res[name] = [_download(x) for x in (out, *grads)] + [gpu.to_numpy(lse)]
    assert not np.array_equal(res["wgmma"][0], res["mma"][0]), "the same kernel ran twice"
    for i, what in enumerate(("out", "dq", "dk", "dv")):
        assert _rel(res["wgmma"][i], res["mma"][i]) < 1e-2, what
    np.testing.assert_allclose(res["wgmma"][4], res["mma"][4], atol=1e-4, rtol=1e-5)


def _packed_qkv(D, *choices, backward=True):
    """Causal attention of a packed (B, T, 3 H D) projection (and its backward) on the GPU under the
    context managers `choices`, and on the CPU: ((out, lse, dqkv), (out, lse, dqkv)) as float32 numpy
    arrays, dqkv None without `backward`."""
    B, T, H = 2, 200, 4
    rng = np.random.default_rng(5)
    (QKV, qkv), (G, g) = _bf16(rng.standard_normal((B, T, 3 * H * D))), _bf16(rng.standard_normal((B, T, H * D)))
    scale = D ** -0.5
    out_c, lse_c, _ = cpu.attention_qkv(qkv, H, True, scale)
    dqkv_c = cpu.attention_qkv_backward(g, qkv, out_c, lse_c, H, True, scale) if backward else None
    with contextlib.ExitStack() as stack:
        for choice in choices:
            stack.enter_context(choice)
        out, lse, _ = gpu.attention_qkv(QKV, H, True, scale)
        dqkv = gpu.attention_qkv_backward(G, QKV, out, lse, H, True, scale) if backward else None
    got = _download(out), gpu.to_numpy(lse), None if dqkv is None else _download(dqkv)
    return got, (out_c, lse_c, dqkv_c)


@pytest.mark.parametrize("wgmma", KERNELS)
@pytest.mark.parametrize("D", [32, 64, 128])
def test_reads_packed_qkv(wgmma, D):
    """Q, K, V as strided views into one packed (B, T, 3 H D) projection, as in GPT."""
    (out, lse, dqkv), (out_c, lse_c, dqkv_c) = _packed_qkv(D, _kernels(wgmma))
    assert _rel(out, out_c) < TOL
    np.testing.assert_allclose(lse, lse_c, atol=TOL * 10, rtol=TOL)
    assert _rel(dqkv, dqkv_c) < 2 * TOL


# ---- the warp-specialised forward kernels (attention_fwd_ws.cu: a TMA producer warpgroup, 2 or 3
# consumer warpgroups, key tiles of 128 or 64) at head dims 32, 64 and 128

WS_KERNELS = [pytest.param(v, id=name.replace(" ", "_")) for name, v in gpu.FORWARD_KERNELS.items() if v > 0]


@pytest.mark.parametrize("kernel", WS_KERNELS)
@pytest.mark.parametrize("D", [32, 64, 128])
@pytest.mark.parametrize("B,H,T,S,causal", WS_SHAPES)
def test_warp_specialised_forward_matches_cpu(kernel, D, B, H, T, S, causal):
    """Partial query and key tiles (TMA's zero fill), T != S, T > S (queries that see no key), causal
    blocks whose consumers see different numbers of key tiles, and a single query."""
    (Q, K, V, _), (q, k, v, _) = _inputs((B, H, T, D), (B, H, S, D), seed=T + 7 * S + D)
    scale = D ** -0.5
    out_c, lse_c, _ = cpu.attention(q, k, v, causal, scale)
    with _kernels(True), _forward_kernel(kernel):
        out, lse, _ = gpu.attention(Q, K, V, causal, scale)
    assert _rel(_download(out), out_c) < TOL
    lse_g = gpu.to_numpy(lse)
    finite = np.isfinite(lse_c)
    assert np.array_equal(np.isfinite(lse_g), finite)
    np.testing.assert_allclose(lse_g[finite], lse_c[finite], atol=TOL * 10, rtol=TOL)
    assert np.all(_download(out)[~finite] == 0)


@pytest.mark.parametrize("kernel", WS_KERNELS)
@pytest.mark.parametrize("D", [32, 64, 128])
def test_warp_specialised_forward_reads_packed_qkv(kernel, D):
    """A packed (B, T, 3 H D) projection: the heads sit inside the rows, so the TMA map's axes are
    (d, head, rows, batch)."""
    (out, lse, _), (out_c, lse_c, _) = _packed_qkv(D, _kernels(True), _forward_kernel(kernel), backward=False)
    assert _rel(out, out_c) < TOL
    np.testing.assert_allclose(lse, lse_c, atol=TOL * 10, rtol=TOL)


# (B, H, T): one work item a block of the persistent grid, several (more items than an H200's 132 SMs),
# and heads walked in groups across batch elements, the last group smaller (attn::walk_group: 2 or 4 MB
# of K and V, or of Q and dO, a head; forward groups of 9 heads at head dim 64, 4 at 128, backward 4
# and 2)
GRIDS = [pytest.param((2, 6, 512), id="one_item_a_block"), pytest.param((4, 16, 1024), id="several_items_a_block"),
         pytest.param((17, 1, 8192), id="groups_of_heads")]


@pytest.mark.parametrize("shape", GRIDS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("D", [32, 64, 128])
def test_warp_specialised_forward_matches_the_cp_async_kernel(causal, D, shape):
    """Every forward kernel on the same inputs agrees with the two-warpgroup cp.async one far tighter
    than with float32; those with tiles of 128 keys sum in another order, so they must differ in bits
    (proof that they ran, and not the fallback). With several items a block, the ring and the Q
    buffers run on from one item to the next."""
    B, H, T = shape
    (Q, K, V, _), _ = _inputs((B, H, T, D), (B, H, T, D), seed=13)
    res = {}
    with _kernels(True):
        for name, kernel in gpu.FORWARD_KERNELS.items():
            with _forward_kernel(kernel):
                out, lse, _ = gpu.attention(Q, K, V, causal, D ** -0.5)
            res[name] = _download(out), gpu.to_numpy(lse)
    base_out, base_lse = res["cp.async 2x64"]
    for name, (out, lse) in res.items():
        assert _rel(out, base_out) < 1e-2, name
        np.testing.assert_allclose(lse, base_lse, atol=1e-4, rtol=1e-5, err_msg=name)
        if "x128" in name:
            assert not np.array_equal(out, base_out), f"{name}: the cp.async kernel ran instead"


# ---- the warp-specialised backward kernels (attention_bwd_ws.cu: a TMA producer warpgroup, 3 or 2
# consumer warpgroups of 64 keys sharing each query tile) at head dims 64 and 128

WS_BACKWARD = [pytest.param(v, id=name.replace(" ", "_")) for name, v in gpu.BACKWARD_KERNELS.items() if v > 0]


@pytest.mark.parametrize("kernel", WS_BACKWARD)
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("B,H,T,S,causal", WS_SHAPES)
def test_warp_specialised_backward_matches_cpu(kernel, D, B, H, T, S, causal):
    """Partial key and query tiles, T != S, T > S, a single query, and causal blocks whose consumers
    skip different numbers of query tiles (or all of them: keys no query sees)."""
    with _backward_kernel(kernel):
        _check_against_cpu(True, B, H, T, S, D, causal)


@pytest.mark.parametrize("kernel", WS_BACKWARD)
@pytest.mark.parametrize("D", [64, 128])
def test_warp_specialised_backward_reads_packed_qkv(kernel, D):
    (_, _, dqkv), (_, _, dqkv_c) = _packed_qkv(D, _kernels(True), _backward_kernel(kernel))
    assert _rel(dqkv, dqkv_c) < 2 * TOL


@pytest.mark.parametrize("shape", GRIDS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("D", [64, 128])
def test_warp_specialised_backward_matches_the_cp_async_kernel(causal, D, shape):
    """The same gradients as the one-warpgroup kernel up to the order of dQ's atomic adds, with one
    item a block and with several."""
    B, H, T = shape
    (Q, K, V, G), _ = _inputs((B, H, T, D), (B, H, T, D), seed=17)
    scale = D ** -0.5
    res = {}
    with _kernels(True):
        out, lse, _ = gpu.attention(Q, K, V, causal, scale)
        for name, kernel in gpu.BACKWARD_KERNELS.items():
            with _backward_kernel(kernel):
                res[name] = [_download(x) for x in gpu.attention_backward(G, Q, K, V, out, lse, causal, scale)]
    base = res["cp.async 1x64"]
    for name, grads in res.items():
        for got, want, what in zip(grads, base, ("dq", "dk", "dv")):
            assert _rel(got, want) < 1e-2, f"{name} {what}"
        # dK and dV come from the same products in the same order
        np.testing.assert_array_equal(grads[2], base[2], err_msg=f"{name} dv")
