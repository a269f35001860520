"""Per-slot preconditioning (issue 25, item 2): the explorers' ``metric`` keyword, the engine's
metric table and :class:`nrpt.adapt.metric.MetricAdaptor` (``precondition``).

* Each preconditionable explorer (RWMH, MALA, HMC, slice) leaves its target invariant with a
  diagonal and with a dense metric (:func:`nrpt.testing.check_invariance`, exact draws, 4.5
  batch-means standard errors), and a kernel that gets the metric wrong is flagged (negative
  controls: MALA whose proposal density ignores the metric, a random walk that evaluates its
  proposal without the metric, HMC whose kinetic energy does not match its
  momentum, a slice sampler whose levels are stale within a sweep).
* On a badly scaled, correlated Gaussian (sds 1 to 1e-3, correlation 0.99, d = 6) adaptive MALA
  without preconditioning fails the mean / sd check and with ``precondition = "dense"`` passes
  it within Monte-Carlo error.
* A run with a metric resumes bit for bit and fuses bit for bit.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import nrpt
from nrpt.explorers import HMC, MALA, RWMH, ReplicaState, SliceSampler
from nrpt.explorers.base import metric_mul, metric_tmul, slot_grad
from nrpt.explorers.metropolis import metropolis_select
from nrpt.explorers.slice import slot_log_density
from nrpt.roles import Update
from nrpt.run.api import run_config
from nrpt.run.config import RunConfig
from nrpt.targets import Gaussian
from nrpt.testing import check_invariance

Z = 4.5

# a 3-d Gaussian with sds 1, 10, 0.1 and correlations up to 0.9
_SD = torch.tensor([1.0, 10.0, 0.1], dtype=torch.float64)
_CORR = torch.tensor([[1, .9, .5], [.9, 1, .6], [.5, .6, 1.]], dtype=torch.float64)
_COV = _SD[:, None] * _CORR * _SD[None, :]
SCALED = Gaussian(mean=[1.0, -2.0, 0.5], cov=_COV)
METRICS = {"diagonal": _COV.diagonal().sqrt(), "dense": torch.linalg.cholesky(_COV)}
# explorer, step size (whitened units; halved with the diagonal metric, which leaves the
# correlations), steps
KERNELS = {"rwmh": (RWMH, {}, 1.0, 300), "mala": (MALA, {}, 0.9, 300),
           "hmc": (HMC, {"leapfrog_steps": 5}, 0.3, 300), "slice": (SliceSampler, {}, 2.5, 150)}


@pytest.mark.parametrize("kind", sorted(METRICS))
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_every_preconditionable_explorer_is_invariant_with_a_metric(name, kind):
    cls, options, h, n = KERNELS[name]
    assert cls.preconditionable
    h = h * (0.5 if kind == "diagonal" else 1.0)
    report = check_invariance(cls(**options), SCALED, step_size=h, n_steps=n, seed=2, cross=True,
                              metric=METRICS[kind])
    assert report.ok, str(report)
    assert report.moved > 0.2 and all(c.ess > 50 for c in report.checks)


# ---------------------------------------------------------------- negative controls
class MALAIdentityQ(MALA):
    """Negative control: moves with the metric, but its proposal density is the identity's
    (``N(x + h^2/2 grad, h^2 I)`` in x): the Hastings ratio is wrong."""

    name = "mala-identity-q"

    def step(self, state, b, step_size, density, noise, sub=0, metric=None):
        state = self._cached(state, density)
        h = step_size[..., None]
        g = slot_grad(state.extras["grad_v"], state.extras["grad_base"], b)
        xi = noise.normal(sub, (state.x.shape[-1],), state.x.dtype)
        x_new = state.x + metric_mul(metric, 0.5 * h * h * metric_tmul(metric, g) + h * xi)
        v, base, g_v, g_base = density.grad_components(x_new)
        g_new = slot_grad(g_v, g_base, b)
        prop = ReplicaState(x_new, v, base, {"grad_v": g_v, "grad_base": g_base})
        fwd = ((x_new - state.x - 0.5 * h * h * g) ** 2).sum(-1)
        bwd = ((state.x - x_new - 0.5 * h * h * g_new) ** 2).sum(-1)
        log_alpha = prop.log_density(b) - state.log_density(b) + (fwd - bwd) / (2 * step_size**2)
        ok = torch.isfinite(log_alpha)
        return metropolis_select(state, prop, log_alpha, ok, noise, sub)


class RWMHUnmapped(RWMH):
    """Negative control: moves to ``x + h L xi`` but accepts on the density at ``x + h xi``
    (the metric forgotten where the proposal is evaluated)."""

    name = "rwmh-unmapped"

    def step(self, state, b, step_size, density, noise, sub=0, metric=None):
        xi = noise.normal(sub, (state.x.shape[-1],), state.x.dtype)
        h = step_size[..., None]
        v, base = density(state.x + h * xi)
        lp = base - b * v
        x_new = state.x + h * metric_mul(metric, xi)
        v_new, base_new = density(x_new)
        prop = ReplicaState(x_new, v_new, base_new)
        return metropolis_select(state, prop, lp - state.log_density(b), torch.isfinite(lp),
                                 noise, sub)


class HMCWrongKinetic(HMC):
    """Negative control: HMC whose kinetic energy is ``|L p|^2 / 2`` while its momentum is drawn
    from N(0, I)."""

    name = "hmc-wrong-kinetic"

    def step(self, state, b, step_size, density, noise, sub=0, metric=None):
        state = self._cached(state, density)
        h = step_size[..., None]
        p0 = noise.normal(sub, (state.x.shape[-1],), state.x.dtype)
        g = slot_grad(state.extras["grad_v"], state.extras["grad_base"], b)
        x, p = state.x, p0 + 0.5 * h * metric_tmul(metric, g)
        for i in range(self.leapfrog_steps):
            x = x + h * metric_mul(metric, p)
            v, base, g_v, g_base = density.grad_components(x)
            gz = metric_tmul(metric, slot_grad(g_v, g_base, b))
            p = p + (h * gz if i < self.leapfrog_steps - 1 else 0.5 * h * gz)
        prop = ReplicaState(x, v, base, {"grad_v": g_v, "grad_base": g_base})
        kin = lambda q: 0.5 * (metric_mul(metric, q) ** 2).sum(-1)  # noqa: E731
        log_alpha = (prop.log_density(b) - kin(p)) - (state.log_density(b) - kin(p0))
        return metropolis_select(state, prop, log_alpha, torch.isfinite(log_alpha), noise, sub)


class SliceStaleLevel(SliceSampler):
    """Negative control: every slice level of a sweep drawn under the density at the sweep's
    start (stale after the first coordinate or line moved)."""

    name = "slice-stale-level"

    def step(self, state, b, step_size, density, noise, sub=0, metric=None):
        self._start = slot_log_density(state.v, state.base, b)
        return super().step(state, b, step_size, density, noise, sub, metric=metric)

    def _slice(self, x0, v0, base0, f0, w, u, evaluate):
        return super()._slice(x0, v0, base0, self._start, w, u, evaluate)


NEGATIVE = {"mala": (MALAIdentityQ(), 0.9, 32), "rwmh": (RWMHUnmapped(), 1.0, 128),
            "hmc": (HMCWrongKinetic(leapfrog_steps=5), 0.3, 32),
            "slice": (SliceStaleLevel(), 2.5, 128)}


@pytest.mark.parametrize("kind", sorted(METRICS))
@pytest.mark.parametrize("name", sorted(NEGATIVE))
def test_negative_control_kernels_that_get_the_metric_wrong_are_flagged(name, kind):
    bad, h, systems = NEGATIVE[name]
    h, n = h * (0.5 if kind == "diagonal" else 1.0), KERNELS[name][3]
    report = check_invariance(bad, SCALED, step_size=h, n_steps=n, seed=2, cross=True,
                              systems=systems, metric=METRICS[kind])
    assert not report.ok and report.moved_enough, str(report)
    assert report.max_z > Z


def test_metric_argument_is_checked():
    with pytest.raises(ValueError, match=r"metric must have shape \[3\] or \[3, 3\]"):
        check_invariance("mala", SCALED, step_size=0.5, n_steps=10, metric=torch.ones(2))


# ---------------------------------------------------------------- the ill-conditioned Gaussian
def ill_conditioned(d: int = 6) -> tuple[Gaussian, np.ndarray, np.ndarray]:
    """sds from 1 down to 1e-3 (ratio 1000), every correlation 0.99."""
    sd = torch.logspace(0, -3, d, dtype=torch.float64)
    corr = 0.01 * torch.eye(d, dtype=torch.float64) + 0.99
    mean = torch.linspace(1, -1, d, dtype=torch.float64) * sd
    return (Gaussian(mean, sd[:, None] * corr * sd[None, :], name="ill-conditioned"),
            mean.numpy(), sd.numpy())


def mean_sd_check(samples: np.ndarray, mean: np.ndarray, sd: np.ndarray, batches: int = 4):
    """``(max |z| of the means, sd ratios)``: z from batch means (``batches`` per system)."""
    R, n, d = samples.shape
    L = n // batches
    bm = samples[:, : L * batches].reshape(R, batches, L, d).mean(2).reshape(-1, d)
    se = bm.std(0, ddof=1) / math.sqrt(R * batches)
    flat = samples.reshape(-1, d)
    return float((np.abs(flat.mean(0) - mean) / se).max()), flat.std(0) / sd


def test_dense_preconditioning_passes_where_none_fails():
    target, mean, sd = ill_conditioned()
    out = {}
    for mode in ("none", "dense"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (the unpreconditioned run warns, rightly)
            res = nrpt.sample(target, rounds=10, chains=4, systems=4, explorer="mala",
                              precondition=mode, seed=1, threads=1, progress=False)
        out[mode] = mean_sd_check(res.samples, mean, sd)
        if mode == "dense":
            pre = res.summary["preconditioner"]
            assert pre["kind"] == "dense" and pre["precondition"] == "dense"
            assert len(pre["condition_number"]) == 4 and min(pre["condition_number"]) > 1e6
        else:
            assert "preconditioner" not in res.summary
    z, ratio = out["dense"]
    assert z < Z and ratio.min() > 0.9 and ratio.max() < 1.1, out["dense"]
    z, ratio = out["none"]  # measured: max z 7.4, sds up to 213x the truth
    assert z > Z or ratio.min() < 0.8 or ratio.max() > 1.25, out["none"]


# ---------------------------------------------------------------- engine, resume, fuse
def test_resume_with_a_metric_is_bit_for_bit(tmp_path):
    # stop at iteration 256, in the middle of round 8 (254..509), after several new metrics:
    # the metric, the step tuner and the spread's co-moments are all in the checkpoint
    stop = 256
    opts = dict(target="gaussian", target_options={"dim": 3, "correlation": 0.9, "std": 0.1},
                rounds=8, chains=4, systems=2, seed=5, explorer="mala", precondition="dense",
                figures=False, checkpoint_every=64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = run_config(RunConfig(out=str(tmp_path / "full"), **opts))

        def interrupt(engine):
            if engine.k == stop:
                raise KeyboardInterrupt

        part = run_config(RunConfig(out=str(tmp_path / "cut"), **opts), callback=interrupt)
        assert part.summary["interrupted"] and part.summary["n_iterations"] == stop
        assert "preconditioner" in part.summary
        resumed = nrpt.resume(tmp_path / "cut")
    assert not resumed.summary["interrupted"]
    assert np.array_equal(resumed.samples, full.samples)
    assert np.array_equal(resumed.index, full.index)
    for key in ("preconditioner", "step_size", "schedules"):
        assert resumed.summary[key] == full.summary[key], key
    assert (tmp_path / "full" / "config.toml").read_text().count('precondition = "dense"') == 1
    # negative control: the comparison sees another seed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        other = run_config(RunConfig(**{**opts, "seed": 6}))
    assert not np.array_equal(other.samples, full.samples)


@pytest.mark.parametrize("explorer", ["mala", "hmc"])
def test_a_fused_run_with_a_metric_equals_the_plain_loop(explorer):
    kw = dict(target="gaussian", target_options={"dim": 3, "correlation": 0.9}, rounds=5,
              chains=4, systems=2, seed=3, explorer=explorer, precondition="diagonal",
              threads=1, progress=False)
    a = nrpt.sample(fuse=True, **kw)
    b = nrpt.sample(fuse=False, **kw)
    assert a.summary["fused"]["chunks"] > 0 and "preconditioner" in a.summary
    assert np.array_equal(a.samples, b.samples)


def test_engine_metric_table_is_checked_and_refused_without_preconditionable():
    from nrpt.core.engine import PTEngine
    from nrpt.paths.ladders import TemperatureLadder
    from nrpt.swap import DEO, Metropolis
    from nrpt.testing import Frozen

    path = TemperatureLadder([1.0, 2.0])
    eng = PTEngine(SCALED, path, MALA(), DEO(), Metropolis(), systems=2, step_size=0.5)
    eng.apply(Update(metric=METRICS["dense"].expand(2, 3, 3)))  # [P, d, d]: broadcast
    assert eng.metric.shape == (2, 2, 3, 3)
    eng.step()
    assert torch.equal(eng.state_dict()["metric"], eng.metric)
    with pytest.raises(ValueError, match=r"metric must be None, \[systems, chains, dim\]"):
        eng.apply(Update(metric=torch.ones(2, 2, 4)))
    with pytest.raises(ValueError, match="positive diagonal"):
        eng.apply(Update(metric=-torch.ones(2, 2, 3)))
    frozen = PTEngine(SCALED, path, Frozen(), DEO(), Metropolis(), systems=2, step_size=0.5)
    with pytest.raises(ValueError, match="takes no preconditioner"):
        frozen.apply(Update(metric=torch.ones(2, 2, 3)))


def test_precondition_option_is_checked():
    with pytest.raises(ValueError, match="precondition must be one of none, diagonal, dense, auto"):
        RunConfig(target="gaussian", rounds=3, explorer="mala", precondition="full")
    with pytest.raises(ValueError, match="precondition"):
        RunConfig(target="gaussian", iterations=100, explorer="mala", precondition="dense")
    assert RunConfig(target="gaussian", rounds=3, explorer="mala").precondition == "none"


def test_identity_metric_reproduces_the_plain_random_walk():
    # a diagonal metric of ones moves RWMH exactly as no metric (x + h * (1 * xi))
    kw = dict(step_size=1.0, n_steps=40, seed=4, systems=8)
    a = check_invariance("rwmh", SCALED, **kw)
    b = check_invariance("rwmh", SCALED, metric=torch.ones(3), **kw)
    assert [c.estimate for c in a.checks] == [c.estimate for c in b.checks]


def test_metric_adaptor_pools_systems_and_falls_back_to_the_diagonal():
    from nrpt.adapt.metric import MetricAdaptor, resolve_mode
    from nrpt.recorders.stats import SlotSpread
    from nrpt.roles import SegmentView

    assert resolve_mode("auto", 200) == "dense" and resolve_mode("auto", 201) == "diagonal"
    R, P, d, n = 3, 2, 3, 64
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, R, P, d, generator=g, dtype=torch.float64) @ METRICS["dense"].T
    spread = SlotSpread(R, P, d, covariance=True)
    spread._take(x)
    # batched co-moments equal the plain per-slot covariance
    n_, mean, c2 = spread.moments()
    ref = torch.stack([torch.stack([torch.cov(x[:, r, p].T, correction=0) * n for p in range(P)])
                       for r in range(R)])
    assert n_ == n and torch.allclose(c2, ref, rtol=1e-10, atol=1e-12)

    class Swaps:  # acceptance inside the gate
        def explorer_acceptance(self):
            return torch.full((R, P), 0.5, dtype=torch.float64)

    view = SegmentView(index=0, name="round 1", iterations=n, last=False,
                       recorders={"spread": spread, "swaps": Swaps()},
                       schedule=torch.ones(R, P), step_size=torch.ones(R, P, dtype=torch.float64),
                       params={}, metric=None)
    upd = MetricAdaptor("dense", d).end_segment(view)
    L = upd.metric
    assert L.shape == (R, P, d, d) and torch.equal(L[0], L[1])  # pooled over systems
    pooled = torch.cov(x.reshape(-1, P, d)[:, 0].T)
    assert torch.allclose(L[0, 0] @ L[0, 0].T, pooled, rtol=0.05)
    assert torch.equal(L, torch.tril(L))


# ---------------------------------------------------------------- robust step sizes
def _mala_acceptance(h_star: float, target: float = 0.574):
    """The tuner's own model for MALA (k = 3), at target acceptance at ``h_star``."""
    from scipy.stats import norm

    c = -2 * norm.ppf(target / 2) / h_star**3
    return lambda h: 2 * norm.cdf(-c * h**3 / 2)


@pytest.mark.parametrize("fast, rounds", [(False, 6), (True, 4)])
def test_fast_tuning_reaches_a_small_step_in_few_rounds(fast, rounds):
    # The issue: from 0.35 to 0.001 the model step shrinks at most 0.60x per round for MALA (12
    # rounds); fast tuning moves 10x at acceptance ~0 and reaches it in 4, then stays.  Without
    # fast, a slot frozen two rounds running also moves 10x (lane hmc): 6 rounds, was 12.
    from nrpt.adapt.step import StepTuner

    acc, tuner, h = _mala_acceptance(1e-3), StepTuner(0.574, 3, fast=fast), np.array([0.35])
    seen = []
    for _ in range(14):
        seen.append(float(h[0]))
        h = tuner.update(h, acc(h))
    first = next(i for i, x in enumerate(seen) if abs(math.log(x / 1e-3)) < 0.05)
    assert first == rounds, seen
    assert all(abs(math.log(x / 1e-3)) < 0.05 for x in seen[first:]), seen  # no oscillation


def test_fast_tuning_brackets_a_cliff_without_swinging_across_it():
    # acceptance 1 below h = 1e-3 and 0 above: fast moves bisect the bracket once both ends are
    # known, ending within 15% of the cliff instead of jumping 10x back and forth
    from nrpt.adapt.step import StepTuner

    tuner, h, seen = StepTuner(0.574, 3, fast=True), np.array([0.35]), []
    for _ in range(14):
        seen.append(float(h[0]))
        h = tuner.update(h, np.where(h < 1e-3, 0.995, 0.0))
    assert all(abs(math.log(x / 1e-3)) < math.log(1.25) for x in seen[6:]), seen


@pytest.mark.distributed
def test_a_run_with_a_metric_is_identical_on_2_processes(tmp_path):
    # the metric table is full on every rank and each takes its block of replicas
    import json
    import os
    import subprocess
    import sys

    args = ["--target", "gaussian", "--option", "dim=3", "--option", "correlation=0.9",
            "--rounds", "6", "--chains", "4", "--systems", "2", "--explorer", "mala",
            "--precondition", "dense", "--figures", "false", "--no-progress"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for n in (1, 2):
        r = subprocess.run([sys.executable, "-m", "nrpt", "run", *args, "--nproc", str(n),
                            "--out", str(tmp_path / f"p{n}")], capture_output=True, text=True,
                           env=env, timeout=300)
        assert r.returncode == 0, r.stderr
    a, b = (np.load(tmp_path / f"p{n}" / "samples.npy") for n in (1, 2))
    assert np.array_equal(a, b)
    s1, s2 = (json.loads((tmp_path / f"p{n}" / "summary.json").read_text()) for n in (1, 2))
    assert s1["preconditioner"] == s2["preconditioner"]
