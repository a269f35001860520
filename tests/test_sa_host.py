"""The CPU paths on NumPy views (issue 24, the headline loop): the SA adaptors' updates
(:mod:`nrpt.adapt.sa`), the deterministic rule's verdicts (:mod:`nrpt.swap.noisy`), the noisy
oracle (:mod:`nrpt.energy.estimators`) and the 25-mode target's ``energy_and_grad`` give the
torch paths' numbers bit for bit; negative controls show the comparisons can fail."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nrpt.adapt import sa
from nrpt.roles import Iteration, PhaseDecision, adjacent_pairs

F64 = torch.float64


def _ladders(g, R, P):
    """Increasing ladders ``[R, P]`` spanning decades (as the headline's 0.003 .. 0.6)."""
    steps = torch.rand(R, P, generator=g, dtype=F64) * 0.5 + 1e-3
    return 0.003 * torch.exp(steps.cumsum(1) - steps[:, :1])


def _iteration(g, R, P, params, step_size, sweep=True):
    lo, hi = adjacent_pairs(R, P, "cpu")[:2]
    if not sweep:  # (a copy: not the cached pairs, so the indicators take the scatter path)
        lo, hi = lo.clone(), hi.clone()
    decision = torch.rand(R, P - 1, generator=g) < 0.45
    active = torch.rand(R, P - 1, generator=g) < 0.5
    slots = torch.arange(P).expand(R, P)
    table = torch.ones(R, P, dtype=F64)
    return Iteration(k=0, state=None, slot_of=slots, replica_at=slots, schedule=table,
                     step_size=step_size, params=params, explore_accept=table,
                     nonfinite=torch.zeros(R, P, dtype=torch.int64),
                     decisions=[PhaseDecision(lo, hi, active, decision, decision & active,
                                              decision.to(F64))])


def _run(adaptor, its, gains, host, monkeypatch):
    with monkeypatch.context() as m:
        if not host:
            m.setattr(sa, "viewable", lambda *ts: False)
        return [adaptor.observe_block(it, g) for it, g in zip(its, gains, strict=True)]


@pytest.mark.parametrize("pairs", ["all", "attempted"])
@pytest.mark.parametrize("sweep", [True, False])
def test_sa_adaptors_numpy_path_equals_torch_path(pairs, sweep, monkeypatch):
    g = torch.Generator().manual_seed(3)
    R, P, n = 5, 16, 300
    C = 4.0 + torch.randn(R, 1, generator=g, dtype=F64)
    its = [_iteration(g, R, P, {"C": C}, _ladders(g, R, P), sweep) for _ in range(n)]
    # gains as the fused chunk hands them (0-d tensors) and as observe does (floats); large
    # ones too, so that some updates break the order and are refused
    gains = [t for t in (torch.rand(n, generator=g, dtype=F64) * 3.0).unbind(0)]
    gains[::3] = [float(t) for t in gains[::3]]
    lr = sa.LearningRateAdaptor(0.4, pairs=pairs)
    corr = sa.CorrectionAdaptor(0.4, pairs=pairs)
    assert sa.viewable(C, gains[1]) and not sa.viewable(C.float())
    for ad, field in ((lr, "step_size"), (corr, "C")):
        host = _run(ad, its, gains, True, monkeypatch)
        plain = _run(ad, its, gains, False, monkeypatch)
        pick = (lambda u: u.step_size) if field == "step_size" else (lambda u: u.params["C"])
        a, b = torch.stack([pick(u) for u in host]), torch.stack([pick(u) for u in plain])
        assert a.dtype == b.dtype == F64 and a.shape == b.shape
        assert torch.equal(a.view(torch.int64), b.view(torch.int64))  # bit for bit
    refused = [bool(torch.equal(u.step_size, it.step_size))
               for u, it in zip(_run(lr, its, gains, True, monkeypatch), its, strict=True)]
    assert any(refused) and not all(refused)  # both branches of the order check were taken


def _libm_exp(a):
    """The C library's ``exp`` element by element (rounds ~5 % of values differently from
    torch's vectorized kernel on the project machine; NumPy's own SIMD ``exp`` happens to
    agree with torch's there, but nothing promises it elsewhere)."""
    return np.array([math.exp(v) for v in a.ravel()]).reshape(a.shape)


def test_sa_numpy_exp_is_torch_exp_negative_control(monkeypatch):
    """Another ``exp`` in place of torch's changes some ladders' last bits (which is why the
    NumPy path keeps torch's kernel): the comparison above can fail."""
    g = torch.Generator().manual_seed(4)
    R, P, n = 5, 16, 200
    its = [_iteration(g, R, P, {}, _ladders(g, R, P)) for _ in range(n)]
    gains = list((torch.rand(n, generator=g, dtype=F64) * 0.1).unbind(0))
    lr = sa.LearningRateAdaptor(0.4)
    plain = torch.stack([u.step_size for u in _run(lr, its, gains, False, monkeypatch)])
    with monkeypatch.context() as m:
        m.setattr(sa, "_exp_np", _libm_exp)
        numpy_exp = torch.stack([u.step_size for u in _run(lr, its, gains, True, monkeypatch)])
    assert not torch.equal(plain, numpy_exp)
    assert torch.allclose(plain, numpy_exp, rtol=1e-14, atol=0.0)


def test_sa_exp_np_is_torch_exp_of_the_same_shape():
    a = np.random.default_rng(0).normal(size=(40, 15)) * 3.0
    want = torch.exp(torch.from_numpy(a.copy()))
    assert torch.equal(torch.from_numpy(sa._exp_np(a.copy())), want)
    assert not np.array_equal(_libm_exp(a), want.numpy())  # (libm's rounding differs)
    assert np.allclose(_libm_exp(a), want.numpy(), rtol=1e-15, atol=0.0)


def test_correction_numpy_path_with_unlisted_pairs(monkeypatch):
    """Phases listing some pairs only, and a system with none listed (``n = 0``: no step)."""
    R, P = 3, 6
    lo = torch.tensor([[0, 2], [1, 3], [0, 0]])
    hi = lo + torch.tensor([[1, 1], [1, 1], [2, 3]])  # system 2: no adjacent pair
    d = torch.tensor([[True, False], [True, True], [True, True]])
    table = torch.ones(R, P, dtype=F64)
    C = torch.tensor([[4.0], [-0.0], [2.5]], dtype=F64)
    it = Iteration(k=0, state=None, slot_of=torch.arange(P).expand(R, P),
                   replica_at=torch.arange(P).expand(R, P), schedule=table, step_size=table,
                   params={"C": C}, explore_accept=table,
                   nonfinite=torch.zeros(R, P, dtype=torch.int64),
                   decisions=[PhaseDecision(lo, hi, d, d, d, d.to(F64))])
    for pairs in ("all", "attempted"):
        ad = sa.CorrectionAdaptor(0.4, pairs=pairs)
        (a,), (b,) = (_run(ad, [it], [0.3], h, monkeypatch) for h in (True, False))
        assert torch.equal(a.params["C"].view(torch.int64), b.params["C"].view(torch.int64))
        assert float(a.params["C"][2]) == 2.5


# ------------------------------------------------------------------ rule, target, oracle, step
def _off(monkeypatch, *modules):
    for m in modules:
        monkeypatch.setattr(m, "viewable", lambda *ts, **kw: False)


def _bits_equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.int64) if a.dtype == F64 else a,
        b.contiguous().view(torch.int64) if b.dtype == F64 else b)


def test_deterministic_rule_numpy_path_equals_torch_path(monkeypatch):
    from nrpt.swap import SwapContext, noisy

    g = torch.Generator().manual_seed(5)
    R, P = 4, 17
    v = 6.0 * torch.randn(R, P, generator=g, dtype=F64)
    v[0, 3], v[1, 5], v[2, 7], v[3, 2] = math.inf, -math.inf, math.nan, 1e308
    b = torch.ones(R, P - 1, dtype=F64)
    for C in ({"C": 4.0 + torch.randn(R, 1, generator=g, dtype=F64)}, {}):
        ctx = SwapContext(b, b, v[:, :-1], v[:, 1:], None, 0, params=C)
        rule = noisy.Deterministic(3.0)
        host = rule.decide(ctx)
        with monkeypatch.context() as m:
            _off(m, noisy)
            plain = rule.decide(ctx)
        assert all(_bits_equal(x, y) for x, y in zip(host, plain, strict=True))
        assert host[0].any() and not host[0].all()


@pytest.mark.parametrize("penalty", [True, False])
def test_twenty_five_modes_numpy_path_equals_torch_path(penalty, monkeypatch):
    from nrpt.targets import twenty_five_modes as tfm

    g = torch.Generator().manual_seed(6)
    x = 3.0 * torch.randn(4000, 2, generator=g, dtype=F64)  # |x|^2 > 20 for some
    x[0], x[1], x[2, 0], x[3, 1] = math.inf, math.nan, -math.inf, 1e200
    t = tfm.TwentyFiveModes(penalty=penalty)
    # no state beyond the penalty's radius (its terms left out), signed zeros and a NaN
    inside = torch.tensor([[-0.0, -0.0], [0.0, -0.0], [-0.0, 0.5], [math.nan, 0.0],
                           [-4.4, 0.3], [1e-300, -1e-320]], dtype=F64)
    inside = torch.cat([inside, x[4:].clamp(-3.1, 3.1)])
    assert bool((inside[4:] ** 2).sum(1).le(20.0).all())
    for y in (inside, inside[4:]):
        a = t.energy_and_grad(y)
        with monkeypatch.context() as m:
            _off(m, tfm)
            assert all(_bits_equal(c, d) for c, d in zip(a, t.energy_and_grad(y), strict=True))
    host = t.energy_and_grad(x)
    with monkeypatch.context() as m:
        _off(m, tfm)
        plain = t.energy_and_grad(x)
        # negative control: the C library's cos and sin (math) in place of torch's kernels
        m.setattr(tfm.torch, "cos", lambda a: torch.from_numpy(_libm(math.cos, a.numpy())))
    assert all(_bits_equal(a, b) for a, b in zip(host, plain, strict=True))
    with monkeypatch.context() as m:
        m.setattr(tfm.torch, "cos", lambda a: torch.from_numpy(_libm(math.cos, a.numpy())))
        other = t.energy_and_grad(x)
    assert not _bits_equal(other[0], plain[0])
    assert torch.allclose(other[0][4:], plain[0][4:], rtol=1e-13, atol=1e-13)


def _libm(fn, a):
    """``fn`` of the C library (through ``math``) element by element; NaN where undefined."""
    return np.array([fn(v) if math.isfinite(v) else math.nan for v in a.ravel()]
                    ).reshape(a.shape)


def test_noisy_oracle_and_sgd_step_numpy_path_equal_torch_path(monkeypatch):
    """One SGD / SGLD step with the noisy oracle (the headline's explorer) on NumPy views and
    in torch: every output, the non-finite guard's included."""
    from nrpt.energy import estimators
    from nrpt.explorers import Noise, ReplicaState, sgmcmc
    from nrpt.host import viewable
    from nrpt.targets import twenty_five_modes as tfm

    R, P = 2, 8
    target = tfm.TwentyFiveModes(penalty=True)
    g = torch.Generator().manual_seed(7)
    x = 2.0 * torch.randn(R, P, 2, generator=g, dtype=F64)
    x[1, 3, 0] = 1e308  # its step overflows: kept where it was
    b = torch.full((R, P), math.inf, dtype=F64)
    b[:, 0] = 1.0
    h = 0.003 * 1.4 ** torch.arange(P, dtype=F64).expand(R, P)
    state = ReplicaState(x, torch.zeros(R, P, dtype=F64), torch.zeros(R, P, dtype=F64), {})

    def steps(host):
        with monkeypatch.context() as m:
            if not host:
                _off(m, estimators, sgmcmc, tfm)
            ex = sgmcmc.SGD(estimators.NoisyOracle(target, 2.0, 1.5))
            st, outs = state, []
            for k in range(4):
                st, info = ex.step(st, b, h, None, Noise(3, k, R, P, "cpu"))
                outs += [st.x, st.v, st.base, st.extras["sg_grad"], st.extras["energy_var"],
                         info.accept_prob, info.accepted, info.nonfinite]
            return outs

    host, plain = steps(True), steps(False)
    assert viewable(x) and not viewable(x.float())
    assert all(_bits_equal(a, c) for a, c in zip(host, plain, strict=True))
    assert bool(plain[-1].any())  # the guard fired
    # negative control: a change of 1e-9 relative in one learning rate shows
    h[0, 1] *= 1.0 + 1e-9
    assert not all(_bits_equal(a, c) for a, c in zip(steps(True), plain, strict=True))


def test_headline_run_numpy_paths_equal_torch_paths(monkeypatch):
    """The headline configuration (DEO*-SGD, noisy oracle, both adaptors), a short run with the
    NumPy paths and one with all of them off: the same draws, ladders and C bit for bit."""
    from nrpt.core.loop import execute
    from nrpt.energy import estimators
    from nrpt.explorers import sgmcmc
    from nrpt.run.build import build
    from nrpt.run.config import RunConfig
    from nrpt.run.sgpt import HEADLINE
    from nrpt.swap import noisy
    from nrpt.targets import twenty_five_modes as tfm

    def run(host):
        with monkeypatch.context() as m:
            if not host:
                _off(m, estimators, sgmcmc, tfm, noisy)
                m.setattr(sa, "viewable", lambda *ts: False)
            r = build(RunConfig.from_dict({"iterations": 300, "seed": 2}, defaults=HEADLINE))
            execute(r)
            eng = r.engine
            return [eng.state.x, eng.state.v, eng.step_size, eng.params["C"],
                    eng.replica_at, torch.as_tensor(np.asarray(r.recorders["draws"].samples))]

    assert all(_bits_equal(a, b) for a, b in zip(run(True), run(False), strict=True))


def test_noisy_oracle_call_numpy_path_equals_torch_path(monkeypatch):
    """The oracle called on tensors (momentum and preconditioned explorers, checks): its NumPy
    path and its torch path; per-system sds and a target without a NumPy kernel take torch."""
    from nrpt.energy import estimators
    from nrpt.rng import Key
    from nrpt.targets import twenty_five_modes as tfm

    target = tfm.TwentyFiveModes(penalty=True)
    x = 3.0 * torch.randn(3, 8, 2, generator=torch.Generator().manual_seed(8), dtype=F64)
    oracle = estimators.NoisyOracle(target, 2.0, 0.5)
    assert oracle._numpy and not estimators.NoisyOracle(target, [1.0, 2.0, 3.0])._numpy
    host = oracle(x, Key((1, 5)), {})
    with monkeypatch.context() as m:
        _off(m, estimators, tfm)
        plain = oracle(x, Key((1, 5)), {})
    for a, b in ((host.u, plain.u), (host.grad, plain.grad), (host.var, plain.var)):
        assert _bits_equal(a, b)
    assert not _bits_equal(host.u, oracle(x, Key((1, 6)), {}).u)  # (another key: other noise)
