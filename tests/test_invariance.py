"""Exact schemes leave the target invariant: slot-0 draws match known moments.

Tolerances come from Monte Carlo error measured on the run itself: R independent PT systems run
side by side (the engine's leading system dimension), each gives one estimate, and the
standard error is sd(estimates) / sqrt(R).  Every check asks |estimate - truth| < Z * se with
Z = 4.5: for R = 16 systems (a t distribution with 15 degrees of freedom) a correct sampler
fails one check with probability below 1e-3, and the seeds are fixed anyway.  A negative
control (a swap rule with the sign of the log ratio flipped) must fail the same check.

Each explorer is also checked on its own, at fixed parameters and without swaps, from exact
draws, with :mod:`nrpt.testing` -- the helper users call to check their own explorers -- and
that helper must flag deliberately wrong kernels (negative controls).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import nrpt
from nrpt.explorers import HMC, MALA, RWMH, ExploreInfo, Explorer, SliceSampler
from nrpt.explorers.base import slot_grad
from nrpt.swap import Metropolis
from nrpt.targets import Gaussian, GaussianMixture, bimodal_1d, geometric_bimodal
from nrpt.targets.gaussian_path import ScaledGaussianPath
from nrpt.testing import InvarianceReport, assert_invariant, check_invariance

Z = 4.5
R = 16


def deviations(draws: np.ndarray, functions: dict, truth: dict) -> dict[str, float]:
    """|mean - truth| / se for each function, se from the spread over systems.

    ``draws`` is [R, n, dim]; the first 10% of each system's draws are discarded as burn-in."""
    n = draws.shape[1]
    kept = draws[:, n // 10:]
    out = {}
    for name, f in functions.items():
        per_system = np.array([f(kept[s]).mean() for s in range(kept.shape[0])])
        se = per_system.std(ddof=1) / math.sqrt(len(per_system))
        out[name] = abs(per_system.mean() - truth[name]) / max(se, 1e-12)
    return out


BIMODAL_F = {"P(x>0)": lambda x: (x[:, 0] > 0).astype(float), "E[x]": lambda x: x[:, 0],
             "E[x^2]": lambda x: x[:, 0] ** 2}


def bimodal_truth(t: GaussianMixture) -> dict[str, float]:
    w = t.weights.tolist()
    m = t.means[:, 0].tolist()
    s = t.stds.tolist()
    comps = list(zip(w, m, s, strict=True))
    return {
        "P(x>0)": sum(wi * 0.5 * math.erfc(-mi / (si * math.sqrt(2))) for wi, mi, si in comps),
        "E[x]": float(t.mean[0]),
        "E[x^2]": sum(wi * (mi**2 + si**2) for wi, mi, si in comps),
    }


def run_bimodal(scheme: str, rule=None, iterations: int = 3000, seed: int = 11):
    return nrpt.sample(bimodal_1d(), chains=5, iterations=iterations, scheme=scheme,
                       max_temperature=30.0, step_size=1.5, systems=R, seed=seed, rule=rule)


@pytest.mark.parametrize("scheme", ["adj", "seo", "deo", "ape"])
def test_exact_schemes_leave_bimodal_target_invariant(scheme):
    target = bimodal_1d()
    res = run_bimodal(scheme)
    dev = deviations(res.samples, BIMODAL_F, bimodal_truth(target))
    assert max(dev.values()) < Z, dev
    # the check is not vacuous: both modes are visited by every system
    assert ((res.samples[..., 0] > 0).mean(1) > 0.4).all()
    assert ((res.samples[..., 0] < 0).mean(1) > 0.1).all()


class FlippedMetropolis(Metropolis):
    """Negative control: the sign of the swap log ratio is flipped (a classic bug)."""

    def decide(self, ctx):
        lr = -ctx.log_ratio
        return torch.log(ctx.u) < lr, torch.exp(torch.clamp(lr, max=0.0))


def test_negative_control_wrong_swap_rule_is_detected():
    target = bimodal_1d()
    res = run_bimodal("deo", rule=FlippedMetropolis())
    dev = deviations(res.samples, BIMODAL_F, bimodal_truth(target))
    assert max(dev.values()) > Z, dev


def test_without_swaps_the_target_chain_is_stuck():
    # A second control: without a hot slot (a ladder 1, 1.01 gives no exploration) RWMH cannot
    # find the 30% mode from initial states near the 70% mode, and the moment check flags it.
    class Start:
        dim = 1
        def __init__(self):
            self.t = bimodal_1d()
        def energy(self, x):
            return self.t.energy(x)
        def initial_states(self, n, generator):
            return 4.0 + torch.randn(n, 1, generator=generator, dtype=torch.float64)

    # (step_size 0.5 kept: the burn-in's tuning would widen it until RWMH hops the modes)
    res = nrpt.sample(Start(), chains=2, temperatures=[1.0, 1.01], iterations=1500, systems=R,
                      step_size=0.5, seed=2, adapt_step_size=False)
    dev = deviations(res.samples, BIMODAL_F, bimodal_truth(bimodal_1d()))
    assert max(dev.values()) > Z, dev


@pytest.mark.parametrize("explorer", ["rwmh", "mala", "hmc"])
def test_explorers_sample_correlated_gaussian(explorer):
    target = Gaussian(mean=[1.0, -2.0], cov=[[1.0, 0.6], [0.6, 2.0]])
    extra = {"leapfrog_steps": 5} if explorer == "hmc" else {}  # a setting of HMC only
    res = nrpt.sample(target, chains=3, max_temperature=4.0, iterations=2000, systems=R,
                      explorer=explorer,
                      step_size={"rwmh": 1.2, "mala": 0.9, "hmc": 0.35}[explorer],
                      seed=4, **extra)
    m, c = target.mean.numpy(), target.cov.numpy()
    fs = {"m0": lambda x: x[:, 0], "m1": lambda x: x[:, 1],
          "c00": lambda x: (x[:, 0] - m[0]) ** 2,
          "c01": lambda x: (x[:, 0] - m[0]) * (x[:, 1] - m[1]),
          "c11": lambda x: (x[:, 1] - m[1]) ** 2}
    truth = {"m0": m[0], "m1": m[1], "c00": c[0, 0], "c01": c[0, 1], "c11": c[1, 1]}
    dev = deviations(res.samples, fs, truth)
    assert max(dev.values()) < Z, dev
    acc = np.array(res.explorer_acceptance)
    assert (acc > 0.2).all() and (acc < 0.99).all()


def test_geometric_path_with_iid_reference_is_invariant():
    target = geometric_bimodal()
    res = nrpt.sample(target, chains=6, iterations=3000, systems=R, step_size=1.0, seed=7)
    dev = deviations(res.samples, BIMODAL_F, bimodal_truth(target.base))
    assert max(dev.values()) < Z, dev
    assert res.summary["path"] == "geometric"
    assert min(res.round_trips) > 0  # replicas do travel through the iid reference


def _slot0(scheme: str, window: int | None, **kw) -> np.ndarray:
    """Slot-0 draws ``[R, n, dim]`` of a run built by :func:`nrpt.run.build.build` past the
    refusal of :func:`nrpt.swap.schemes.check_gate` (``allow_gate_bias``): the scheme machinery
    itself, as the refused combination would run."""
    from nrpt.core.loop import execute
    from nrpt.run.build import build
    from nrpt.run.config import RunConfig

    cfg = RunConfig(target="bimodal", scheme=scheme, window=window, figures=False, **kw)
    run = build(cfg, target=bimodal_1d(), allow_gate_bias=True)
    execute(run)
    return np.asarray(run.recorders["draws"].arrays(0, run.engine.k)["samples"])


def test_deo_w_with_exact_metropolis_swaps_is_biased_which_is_why_runs_refuse_it():
    """The negative control behind the refusal (tests/test_gate.py): the at-most-one-swap gate
    is a stopping time, and with exact energies and Metropolis swaps the target marginal is
    biased (docs/architecture.md).  Two chains (tau 1 and 10) on the bimodal target, the same
    seed and the same deviation check (tolerance from the spread over R = 16 systems): DEO
    passes, DEO_5 fails by far (measured: P(x>0) = 0.617 +- 0.005 vs 0.7 at 20k its)."""
    kw = dict(chains=2, temperatures=[1.0, 10.0], iterations=6000, step_size=1.0, systems=R,
              seed=3)
    truth = bimodal_truth(bimodal_1d())
    ok = deviations(_slot0("deo", None, **kw), BIMODAL_F, truth)
    assert max(ok.values()) < Z, ok
    biased = deviations(_slot0("deo-w", 5, **kw), BIMODAL_F, truth)
    assert biased["P(x>0)"] > Z, biased  # measured: 8.0 standard errors (E[x]: 8.0)
    # window 1 is DEO, draw for draw
    assert np.array_equal(_slot0("deo-w", 1, **{**kw, "iterations": 300}),
                          _slot0("deo", None, **{**kw, "iterations": 300}))


# ---------------------------------------------------------------- one kernel at a time
CORRELATED = Gaussian(mean=[1.0, -2.0], cov=[[1.0, 0.6], [0.6, 2.0]])
# explorer class, options, step size, steps (doubling slice: fewer, costlier, better-mixing)
KERNELS = {"rwmh": (RWMH, {}, 1.2, 300), "mala": (MALA, {}, 0.9, 300),
           "hmc": (HMC, {"leapfrog_steps": 5}, 0.35, 300), "slice": (SliceSampler, {}, 1.5, 300),
           "slice-doubling": (SliceSampler, {"method": "doubling"}, 1.5, 100)}


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_every_explorer_kernel_is_invariant_on_its_own(name):
    # nrpt.testing: 32 chains x n steps from exact draws at b = 1, means, variances and the
    # covariance against the known moments within 4.5 batch-means standard errors.
    cls, options, h, n = KERNELS[name]
    report = assert_invariant(cls(**options), CORRELATED, step_size=h, n_steps=n, seed=1,
                              cross=True)
    assert report.start == "exact draws" and report.truth_from == "the target's moments"
    assert [c.name for c in report.checks] == ["mean[0]", "mean[1]", "var[0]", "var[1]",
                                               "cov[0,1]"]
    assert 0.2 < report.acceptance <= 1.0 and report.moved > 0.2
    assert all(c.se > 0 and c.ess > 100 for c in report.checks)


def test_invariance_check_on_a_geometric_slot_and_a_tempered_slot():
    # A slot of a geometric path (beta = 0.4): exact draws from target.sample_at; the truth is
    # estimated from 1e5 exact draws (its error joins the tolerance).
    t = ScaledGaussianPath(dim=3, c=9.0)
    report = assert_invariant("mala", t, b=0.4, step_size=0.5, n_steps=300, seed=2)
    assert report.start == "exact draws" and "exact draws" in report.truth_from
    sd2 = 1.0 / (1.0 + 9.0 * 0.4)
    assert all(abs(c.truth - sd2) < 0.01 for c in report.checks if c.name.startswith("var"))
    # A tempered slot (b = 0.4, N(m, cov / 0.4)) the target cannot draw from: the chains start
    # from the target's initial states and drop a burn-in; the truth is given.
    report = assert_invariant("rwmh", CORRELATED, b=0.4, step_size=2.0, n_steps=400, seed=3,
                              mean=CORRELATED.mean, cov=CORRELATED.cov / 0.4, cross=True)
    assert report.start == "initial states" and report.burn_in == 80
    # custom statistics: P(x > 0) on the bimodal target, RWMH from exact draws.  RWMH stays in
    # the mode it starts in; the error bar (one batch per independent chain) accounts for it.
    report = assert_invariant(RWMH(), bimodal_1d(), step_size=1.5, n_steps=200, seed=4,
                              functions={"P(x>0)": lambda x: (x[:, 0] > 0).double()},
                              truth={"P(x>0)": 0.7})
    assert report.checks[-1].name == "P(x>0)" and report.checks[-1].ess < 100


# ---------------------------------------------------------------- negative controls
class AlwaysAcceptRWMH(RWMH):
    """Negative control: a random walk whose proposals are always accepted (no Metropolis
    correction): the variance grows without bound."""

    name = "rwmh-always-accept"

    def step(self, state, b, step_size, density, noise, sub=0):
        xi = noise.normal(sub, (state.x.shape[-1],), state.x.dtype)
        x = state.x + step_size[..., None] * xi
        v, base = density(x)
        yes = torch.ones_like(v, dtype=torch.bool)
        return state.replace(x=x, v=v, base=base), ExploreInfo(torch.ones_like(v), yes, ~yes)


class UnadjustedLangevin(MALA):
    """Negative control: MALA without its Metropolis-Hastings correction (ULA).  On a Gaussian
    its stationary variance along an eigendirection of variance s^2 is s^2 / (1 - h^2 / 4s^2):
    at h = 0.9, 38% too large along the 0.74 eigendirection of CORRELATED."""

    name = "ula"

    def step(self, state, b, step_size, density, noise, sub=0):
        state = self._cached(state, density)
        h = step_size[..., None]
        g = slot_grad(state.extras["grad_v"], state.extras["grad_base"], b)
        xi = noise.normal(sub, (state.x.shape[-1],), state.x.dtype)
        x = state.x + 0.5 * h * h * g + h * xi
        v, base = density(x)
        new = self.prepare(state.replace(x=x, v=v, base=base), density)
        yes = torch.ones_like(v, dtype=torch.bool)
        return new, ExploreInfo(torch.ones_like(v), yes, ~yes)


class Frozen(Explorer):
    """Negative control: never moves (trivially invariant, so the check must say it is void)."""

    name = "frozen"

    def step(self, state, b, step_size, density, noise, sub=0):
        no = torch.zeros_like(state.v, dtype=torch.bool)
        return state, ExploreInfo(torch.zeros_like(state.v), no, no)


@pytest.mark.parametrize("bad,h,systems", [(AlwaysAcceptRWMH, 1.2, 128),
                                            (UnadjustedLangevin, 0.9, 32)])
def test_negative_control_wrong_kernels_are_flagged(bad, h, systems):
    # The always-accept walk's variance grows like t h^2, and so does the spread of its
    # per-chain estimates: its z is ~ sqrt(systems) (min 4.9 over 20 seeds at 32 chains, hence
    # 128); ULA's bias is fixed, z ~ 7-12 at 32 chains.
    kw = dict(step_size=h, n_steps=300, systems=systems, seed=1)
    report = check_invariance(bad(), CORRELATED, **kw)
    assert isinstance(report, InvarianceReport) and not report.ok
    assert any(c.name.startswith("var") for c in report.failures), str(report)
    assert report.max_z > 1.5 * Z and report.moved_enough  # flagged for its moments
    with pytest.raises(AssertionError, match=r"(?s)invariance check FAILED.*var\[0\].*FAIL"):
        assert_invariant(bad(), CORRELATED, **kw)


def test_negative_control_a_kernel_that_never_moves_is_not_a_pass():
    report = check_invariance(Frozen(), CORRELATED, step_size=1.0, n_steps=50, seed=1)
    assert report.moved == 0.0 and not report.moved_enough and not report.ok
    with pytest.raises(AssertionError, match="trivially invariant"):
        assert_invariant(Frozen(), CORRELATED, step_size=1.0, n_steps=50, seed=1)


def test_invariance_check_is_reproducible_and_refuses_an_unknown_truth():
    a = check_invariance("rwmh", CORRELATED, step_size=1.2, n_steps=50, seed=7)
    b = check_invariance("rwmh", CORRELATED, step_size=1.2, n_steps=50, seed=7)
    assert a.checks == b.checks
    with pytest.raises(ValueError, match="the truth is not known"):
        check_invariance("rwmh", CORRELATED, b=0.5, step_size=1.0, n_steps=50)
    with pytest.raises(ValueError, match="start='exact'"):
        check_invariance("rwmh", CORRELATED, b=0.5, step_size=1.0, n_steps=50, start="exact",
                         mean=[1.0, -2.0], var=[2.0, 4.0])
