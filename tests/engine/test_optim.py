"""engine.optim: optimizers, clipping and schedules against PyTorch's (where torch is installed),
state_dict round trips, and the errors that bad input gets.

Tolerances: updates are float32 on both sides but in a different operation order, so parameters
and state are compared with rtol=1e-5, atol=1e-6 (about 100 float32 ulps at the values used);
learning rates are float64 Python numbers compared with rel=1e-12.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

import engine
from engine.backends import cpu
from engine.nn import Parameter
from engine.optim import (
    SGD,
    Adam,
    AdamW,
    LambdaLR,
    StepLR,
    WarmupCosine,
    clip_grad_norm_,
    clip_grad_value_,
    warmup_cosine_lr,
)

RTOL, ATOL = 1e-5, 1e-6
SHAPES = [(4, 3), (3,), (2, 2, 5)]
STEPS = 6


def _start(seed: int = 0) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    """Starting weights and one gradient per parameter per step."""
    rng = np.random.default_rng(seed)
    weights = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in SHAPES] for _ in range(STEPS)]
    return weights, grads


def _engine_params(weights) -> list[Parameter]:
    return [Parameter(engine.tensor(w)) for w in weights]


def _set_grads(params, grads) -> None:
    for p, g in zip(params, grads):
        p.grad = None if g is None else engine.tensor(g)


def _torch_run(torch_cls, weights, grads, steps, **kw):
    torch = pytest.importorskip("torch")
    params = [torch.tensor(w, requires_grad=True) for w in weights]
    opt = torch_cls(params, **kw)
    for step in range(steps):
        for p, g in zip(params, grads[step]):
            p.grad = None if g is None else torch.tensor(g)
        opt.step()
    return params, opt


def _engine_run(cls, weights, grads, steps, **kw):
    params = _engine_params(weights)
    opt = cls(params, **kw)
    for step in range(steps):
        _set_grads(params, grads[step])
        opt.step()
    return params, opt


def _close(engine_tensors, torch_tensors) -> None:
    for i, (a, b) in enumerate(zip(engine_tensors, torch_tensors)):
        np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=RTOL, atol=ATOL, err_msg=f"tensor {i}")


# ---- optimizers against PyTorch -----------------------------------------------------------------

SGD_CONFIGS = [
    dict(lr=0.1),
    dict(lr=0.1, weight_decay=0.01),
    dict(lr=0.05, momentum=0.9),
    dict(lr=0.05, momentum=0.9, dampening=0.2, weight_decay=1e-3),
    dict(lr=0.05, momentum=0.9, nesterov=True),
    dict(lr=0.7, momentum=0.9, nesterov=True, weight_decay=0.01),  # DiLoCo's outer optimizer
]


@pytest.mark.parametrize("kw", SGD_CONFIGS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_sgd_matches_torch(kw):
    torch = pytest.importorskip("torch")
    weights, grads = _start()
    tp, topt = _torch_run(torch.optim.SGD, weights, grads, STEPS, **kw)
    ep, eopt = _engine_run(SGD, weights, grads, STEPS, **kw)
    _close(ep, tp)
    if kw.get("momentum"):
        _close([eopt.state[p]["momentum_buffer"] for p in ep], [topt.state[p]["momentum_buffer"] for p in tp])


ADAM_CONFIGS = [
    (Adam, "Adam", dict(lr=1e-2)),
    (Adam, "Adam", dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
    (AdamW, "AdamW", dict(lr=1e-2)),
    (AdamW, "AdamW", dict(lr=3e-2, betas=(0.9, 0.95), weight_decay=0.1)),
    (AdamW, "AdamW", dict(lr=1e-3, weight_decay=0.0)),
]


@pytest.mark.parametrize("cls,torch_name,kw", ADAM_CONFIGS,
                         ids=[f"{name}-" + ",".join(f"{k}={v}" for k, v in kw.items()) for _, name, kw in ADAM_CONFIGS])
def test_adam_matches_torch(cls, torch_name, kw):
    torch = pytest.importorskip("torch")
    weights, grads = _start(1)
    tp, topt = _torch_run(getattr(torch.optim, torch_name), weights, grads, STEPS, **kw)
    ep, eopt = _engine_run(cls, weights, grads, STEPS, **kw)
    _close(ep, tp)
    for name in ("exp_avg", "exp_avg_sq"):
        _close([eopt.state[p][name] for p in ep], [topt.state[p][name] for p in tp])
    assert all(eopt.state[p]["step"] == STEPS for p in ep)
    assert all(isinstance(eopt.state[p]["step"], int) for p in ep)


def test_adam_decoupled_flag_is_adamw():
    weights, grads = _start(2)
    a, _ = _engine_run(Adam, weights, grads, 3, lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True)
    b, _ = _engine_run(AdamW, weights, grads, 3, lr=1e-2, weight_decay=0.1)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.numpy(), y.numpy())


@pytest.mark.parametrize("cls,torch_name,kw", [(SGD, "SGD", dict(lr=0.1, momentum=0.9)),
                                               (Adam, "Adam", dict(lr=1e-2)), (AdamW, "AdamW", dict(lr=1e-2))])
def test_missing_grads_match_torch(cls, torch_name, kw):
    """A parameter without a gradient is skipped and starts its state (step count, momentum) late."""
    torch = pytest.importorskip("torch")
    weights, grads = _start(3)
    for step in range(3):
        grads[step][1] = None  # parameter 1 first gets a gradient at step 3
    grads[4][0] = None
    tp, _ = _torch_run(getattr(torch.optim, torch_name), weights, grads, STEPS, **kw)
    ep, _ = _engine_run(cls, weights, grads, STEPS, **kw)
    _close(ep, tp)


def test_param_groups_match_torch():
    torch = pytest.importorskip("torch")
    weights, grads = _start(4)
    tparams = [torch.tensor(w, requires_grad=True) for w in weights]
    eparams = _engine_params(weights)

    def groups(ps):
        return [{"params": ps[:1], "lr": 0.05, "weight_decay": 0.0}, {"params": ps[1:]}]

    topt = torch.optim.AdamW(groups(tparams), lr=1e-2, weight_decay=0.1)
    eopt = AdamW(groups(eparams), lr=1e-2, weight_decay=0.1)
    assert [g["lr"] for g in eopt.param_groups] == [0.05, 1e-2]
    for step in range(STEPS):
        for tp, g in zip(tparams, grads[step]):
            tp.grad = torch.tensor(g)
        _set_grads(eparams, grads[step])
        topt.step()
        eopt.step()
    _close(eparams, tparams)


@pytest.mark.parametrize("cls,primitive", [(SGD, "sgd_"), (Adam, "adamw_"), (AdamW, "adamw_")])
def test_one_backend_call_per_group(monkeypatch, cls, primitive):
    """The whole group goes to the multi-tensor primitive at once (one fused launch on CUDA)."""
    calls = []
    real = getattr(cpu, primitive)

    def counting(params, *args, **kw):
        calls.append(len(params))
        return real(params, *args, **kw)

    monkeypatch.setattr(cpu, primitive, counting)
    weights, grads = _start()
    params = _engine_params(weights)
    opt = cls([{"params": params[:2]}, {"params": params[2:]}], lr=0.1, **({"momentum": 0.9} if cls is SGD else {}))
    for step in range(3):
        _set_grads(params, grads[step])
        opt.step()
    assert calls == [2, 1] * 3


def test_state_lives_on_param_device_and_update_is_in_place():
    weights, grads = _start()
    params = _engine_params(weights)
    before = [p.data for p in params]
    opt = AdamW(params)
    _set_grads(params, grads[0])
    opt.step()
    assert all(p.data is b for p, b in zip(params, before))  # updated in place: views stay valid
    for p in params:
        for name in ("exp_avg", "exp_avg_sq"):
            t = opt.state[p][name]
            assert t.device == p.device and t.shape == p.shape and t.dtype == p.dtype and not t.requires_grad


def test_step_closure_returns_loss():
    weights, grads = _start()
    params = _engine_params(weights)
    opt = SGD(params, lr=0.1)

    def closure():
        opt.zero_grad()
        _set_grads(params, grads[0])
        return 1.5

    assert opt.step(closure) == 1.5
    np.testing.assert_allclose(params[0].numpy(), weights[0] - 0.1 * grads[0][0], rtol=1e-6)


def test_zero_grad():
    weights, grads = _start()
    params = _engine_params(weights)
    opt = SGD(params, lr=0.1)
    _set_grads(params, grads[0])
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.numpy().any() for p in params)
    opt.zero_grad()
    assert all(p.grad is None for p in params)


# ---- state_dict --------------------------------------------------------------------------------

def _through_json_and_numpy(sd: dict) -> dict:
    """What a checkpoint does: tensors to arrays (safetensors), everything else through JSON."""
    arrays = {}
    state = {}
    for index, entry in sd["state"].items():
        state[index] = {}
        for k, v in entry.items():
            if isinstance(v, engine.Tensor):
                arrays[f"{index}.{k}"] = v.numpy().copy()
            else:
                state[index][k] = v
    meta = json.loads(json.dumps({"state": state, "param_groups": sd["param_groups"]}))
    for name, arr in arrays.items():
        index, k = name.split(".")
        meta["state"][index][k] = arr
    return meta


@pytest.mark.parametrize("cls,kw", [(SGD, dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
                                    (Adam, dict(lr=1e-2, weight_decay=0.1)),
                                    (AdamW, dict(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1))])
@pytest.mark.parametrize("via_json", [False, True])
def test_state_dict_resume_continues_exactly(cls, kw, via_json):
    weights, grads = _start(5)
    straight, opt = _engine_run(cls, weights, grads, 3, **kw)
    saved_weights = [p.numpy().copy() for p in straight]
    sd = opt.state_dict()
    assert sorted(sd["state"]) == [0, 1, 2] and sd["param_groups"][0]["params"] == [0, 1, 2]
    if via_json:
        sd = _through_json_and_numpy(sd)
    else:  # the live state goes on changing below: keep an independent copy, as a checkpoint would
        sd = {"state": {i: {k: (engine.tensor(v.numpy()) if isinstance(v, engine.Tensor) else v) for k, v in s.items()}
                        for i, s in sd["state"].items()},
              "param_groups": sd["param_groups"]}

    resumed = _engine_params(saved_weights)
    opt2 = cls(resumed, lr=123.0)  # the saved hyper-parameters win
    opt2.load_state_dict(sd)
    assert opt2.param_groups[0]["lr"] == kw["lr"]
    for step in range(3, STEPS):
        _set_grads(straight, grads[step])
        opt.step()
        _set_grads(resumed, grads[step])
        opt2.step()
    for a, b in zip(straight, resumed):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_resume_through_checkpoint_files(tmp_path):
    """Optimizer and schedule saved with engine.checkpoint (safetensors + JSON) resume bit for bit."""
    from engine.checkpoint import load_checkpoint, save_checkpoint

    weights, grads = _start(8)
    straight = _engine_params(weights)
    opt = AdamW(straight, lr=1e-2, weight_decay=0.1)
    sched = WarmupCosine(opt, warmup_steps=2, total_steps=STEPS, min_lr=1e-3)
    for step in range(3):
        _set_grads(straight, grads[step])
        opt.step()
        sched.step()
    save_checkpoint(tmp_path / "ckpt", params=[p.numpy() for p in straight], optimizer=opt.state_dict(),
                    scheduler=sched.state_dict())

    saved = load_checkpoint(tmp_path / "ckpt")
    resumed = _engine_params(saved["params"])
    opt2 = AdamW(resumed)
    sched2 = WarmupCosine(opt2, warmup_steps=2, total_steps=STEPS, min_lr=1e-3)
    opt2.load_state_dict(saved["optimizer"])
    sched2.load_state_dict(saved["scheduler"])
    for step in range(3, STEPS):
        _set_grads(straight, grads[step])
        opt.step()
        sched.step()
        _set_grads(resumed, grads[step])
        opt2.step()
        sched2.step()
        assert sched2.get_last_lr() == sched.get_last_lr()
    for a, b in zip(straight, resumed):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_load_state_dict_copies_rather_than_aliases():
    weights, grads = _start()
    params, opt = _engine_run(AdamW, weights, grads, 1)
    params2 = _engine_params(weights)
    opt2 = AdamW(params2)
    opt2.load_state_dict(opt.state_dict())
    assert opt2.state[params2[0]]["exp_avg"].data is not opt.state[params[0]]["exp_avg"].data
    assert opt2.param_groups[0]["betas"] == (0.9, 0.999)


def test_load_state_dict_errors():
    weights, grads = _start()
    _, opt = _engine_run(AdamW, weights, grads, 1)
    sd = opt.state_dict()

    two_groups = AdamW([{"params": _engine_params(weights)[:1]}, {"params": _engine_params(weights)[1:]}])
    with pytest.raises(ValueError, match="1 param group.*this optimizer has 2"):
        two_groups.load_state_dict(sd)

    fewer = AdamW(_engine_params(weights)[:2])
    with pytest.raises(ValueError, match="saved with 3 parameter.*has 2"):
        fewer.load_state_dict(sd)

    other_shapes = AdamW(_engine_params([np.zeros(s[::-1], np.float32) for s in SHAPES]))
    with pytest.raises(ValueError, match=r"'exp_avg' of parameter 0 has shape \(4, 3\).*\(3, 4\)"):
        other_shapes.load_state_dict(sd)

    with pytest.raises(ValueError, match="'state' and 'param_groups'"):
        AdamW(_engine_params(weights)).load_state_dict({"lr": 1})


def test_constructor_errors():
    weights, _ = _start()
    params = _engine_params(weights)
    with pytest.raises(ValueError, match="nesterov=True needs momentum > 0"):
        SGD(params, lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="lr must be >= 0"):
        AdamW(params, lr=-1.0)
    with pytest.raises(ValueError, match="betas"):
        Adam(params, betas=(0.9, 1.5))
    with pytest.raises(TypeError, match="single Tensor"):
        SGD(params[0], lr=0.1)
    with pytest.raises(ValueError, match="appears twice"):
        SGD([{"params": params[:2]}, {"params": params[1:]}], lr=0.1)
    with pytest.raises(ValueError, match="empty parameter list"):
        AdamW([])
    with pytest.raises(TypeError, match="unknown hyper-parameter"):
        AdamW([{"params": params, "momentum": 0.9}])


# ---- clipping ----------------------------------------------------------------------------------

@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, math.inf])
@pytest.mark.parametrize("max_norm", [0.5, 1e3])  # clipping active / a no-op
def test_clip_grad_norm_matches_torch(norm_type, max_norm):
    torch = pytest.importorskip("torch")
    _, grads = _start(6)
    tparams = [torch.zeros(s, requires_grad=True) for s in SHAPES]
    for p, g in zip(tparams, grads[0]):
        p.grad = torch.tensor(g)
    eparams = _engine_params([np.zeros(s, np.float32) for s in SHAPES])
    _set_grads(eparams, grads[0])
    tnorm = torch.nn.utils.clip_grad_norm_(tparams, max_norm, norm_type)
    enorm = clip_grad_norm_(eparams, max_norm, norm_type)
    assert isinstance(enorm, engine.Tensor) and enorm.shape == () and enorm.device == eparams[0].device
    np.testing.assert_allclose(enorm.numpy(), tnorm.numpy(), rtol=RTOL)
    _close([p.grad for p in eparams], [p.grad for p in tparams])


def test_clip_grad_norm_stays_on_device(monkeypatch):
    """No host round trip: the norm is one sum_of_squares call, the result is applied by scale_."""
    calls = []
    real_sos, real_scale = cpu.sum_of_squares, cpu.scale_
    monkeypatch.setattr(cpu, "sum_of_squares", lambda xs: calls.append(("sum_of_squares", len(xs))) or real_sos(xs))
    monkeypatch.setattr(cpu, "scale_", lambda xs, f: calls.append(("scale_", len(xs))) or real_scale(xs, f))

    def no_host(*a, **k):
        raise AssertionError("clip_grad_norm_ read a value back to the host")

    monkeypatch.setattr(engine.Tensor, "item", no_host)
    monkeypatch.setattr(engine.Tensor, "numpy", no_host)
    _, grads = _start()
    params = _engine_params([np.zeros(s, np.float32) for s in SHAPES])
    _set_grads(params, grads[0])
    params[1].grad = None  # skipped
    clip_grad_norm_(params, 1.0)
    assert calls == [("sum_of_squares", 2), ("scale_", 2)]


def test_clip_grad_norm_edge_cases():
    params = _engine_params([np.zeros(3, np.float32)])
    assert clip_grad_norm_(params, 1.0).numpy() == 0.0  # no grads at all
    params[0].grad = engine.zeros(3)
    assert clip_grad_norm_(params[0], 1.0).numpy() == 0.0  # zero grads stay zero (eps keeps it finite)
    assert not params[0].grad.numpy().any()
    with pytest.raises(ValueError, match="norm_type must be > 0"):
        clip_grad_norm_(params, 1.0, norm_type=0)


def test_clip_grad_value_matches_torch():
    torch = pytest.importorskip("torch")
    _, grads = _start(7)
    tparams = [torch.zeros(s, requires_grad=True) for s in SHAPES]
    for p, g in zip(tparams, grads[0]):
        p.grad = torch.tensor(g)
    eparams = _engine_params([np.zeros(s, np.float32) for s in SHAPES])
    _set_grads(eparams, grads[0])
    torch.nn.utils.clip_grad_value_(tparams, 0.3)
    clip_grad_value_(eparams, 0.3)
    _close([p.grad for p in eparams], [p.grad for p in tparams])


# ---- schedules ---------------------------------------------------------------------------------

def _two_group_opts(torch):
    tp = [torch.zeros(1, requires_grad=True), torch.zeros(1, requires_grad=True)]
    ep = _engine_params([np.zeros(1, np.float32)] * 2)
    topt = torch.optim.SGD([{"params": tp[:1], "lr": 0.5}, {"params": tp[1:]}], lr=0.1)
    eopt = SGD([{"params": ep[:1], "lr": 0.5}, {"params": ep[1:]}], lr=0.1)
    return topt, eopt


def test_step_lr_matches_torch():
    torch = pytest.importorskip("torch")
    topt, eopt = _two_group_opts(torch)
    tsched = torch.optim.lr_scheduler.StepLR(topt, step_size=3, gamma=0.5)
    esched = StepLR(eopt, step_size=3, gamma=0.5)
    for _ in range(12):
        assert esched.get_last_lr() == pytest.approx(tsched.get_last_lr(), rel=1e-12)
        assert [g["lr"] for g in eopt.param_groups] == pytest.approx([g["lr"] for g in topt.param_groups], rel=1e-12)
        topt.step()
        eopt.step()
        tsched.step()
        esched.step()
    assert esched.last_epoch == tsched.last_epoch == 12


def test_lambda_lr_matches_torch():
    torch = pytest.importorskip("torch")
    topt, eopt = _two_group_opts(torch)
    fns = [lambda e: 0.9 ** e, lambda e: 1.0 / (1 + e)]
    tsched = torch.optim.lr_scheduler.LambdaLR(topt, fns)
    esched = LambdaLR(eopt, fns)
    for _ in range(8):
        assert esched.get_last_lr() == pytest.approx(tsched.get_last_lr(), rel=1e-12)
        topt.step()
        tsched.step()
        esched.step()


def test_warmup_cosine_by_hand():
    # base 1.0, min 0.1, warm-up 4 steps, cosine until step 12
    expected = {0: 0.25, 1: 0.5, 2: 0.75, 3: 1.0, 4: 1.0, 8: 0.1 + 0.45 * (1 + math.cos(math.pi / 2)),
                10: 0.1 + 0.45 * (1 + math.cos(math.pi * 0.75)), 12: 0.1, 50: 0.1}
    for step, lr in expected.items():
        assert warmup_cosine_lr(step, 1.0, 4, 12, 0.1) == pytest.approx(lr, abs=1e-15), step

    params = _engine_params([np.zeros(1, np.float32)])
    opt = AdamW([{"params": params, "lr": 1.0}])
    sched = WarmupCosine(opt, warmup_steps=4, total_steps=12, min_lr=0.1)
    for step in range(51):
        assert sched.last_epoch == step
        assert opt.param_groups[0]["lr"] == pytest.approx(warmup_cosine_lr(step, 1.0, 4, 12, 0.1), abs=1e-15)
        if step in expected:
            assert sched.get_last_lr() == [pytest.approx(expected[step], abs=1e-15)]
        assert sched.get_lr_at(step) == sched.get_last_lr()
        sched.step()
    assert warmup_cosine_lr(3, 1.0, 0, 10) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.3)))  # no warm-up


def test_scheduler_state_dict_resume():
    params = _engine_params([np.zeros(1, np.float32)])
    opt = AdamW([{"params": params, "lr": 3e-4}])
    sched = WarmupCosine(opt, warmup_steps=5, total_steps=20, min_lr=3e-5)
    for _ in range(7):
        sched.step()
    saved_opt = json.loads(json.dumps(opt.state_dict()))  # no state yet: all JSON
    saved_sched = json.loads(json.dumps(sched.state_dict()))

    params2 = _engine_params([np.zeros(1, np.float32)])
    opt2 = AdamW(params2, lr=3e-4)
    sched2 = WarmupCosine(opt2, warmup_steps=5, total_steps=20, min_lr=3e-5)
    sched2.load_state_dict(saved_sched)  # either order works
    opt2.load_state_dict(saved_opt)
    assert sched2.last_epoch == 7 and opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    for _ in range(20):
        sched.step()
        sched2.step()
        assert sched2.get_last_lr() == sched.get_last_lr()
        assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]


def test_scheduler_errors():
    params = _engine_params([np.zeros(1, np.float32)])
    opt = SGD(params, lr=0.1)
    with pytest.raises(ValueError, match="warmup_steps <= total_steps"):
        WarmupCosine(opt, warmup_steps=10, total_steps=5)
    with pytest.raises(ValueError, match="step_size must be a positive int"):
        StepLR(opt, step_size=0)
    sched = StepLR(opt, step_size=2)
    two_groups = SGD([{"params": _engine_params([np.zeros(1, np.float32)])} for _ in range(2)], lr=0.1)
    with pytest.raises(ValueError, match=r"1 base learning rate\(s\), the optimizer has 2 param group"):
        StepLR(two_groups, step_size=2).load_state_dict({"last_epoch": 0, "base_lrs": [0.1]})
    assert sched.last_epoch == 0
