"""Issue 25, items 3 and 4: enough chains (the ``too-few-chains`` advice), overdispersed starts,
improper tempered hot ends refused before sampling, and PyMC priors that cannot be drawn."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import nrpt
from nrpt import SamplingWarning
from nrpt.report.health import check_run
from nrpt.targets.gaussian_path import ShiftedGaussianPath


def run_and_collect(target, **options):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SamplingWarning)
        res = nrpt.sample(target, figures=False, progress=False, **options)
    return res, [str(w.message) for w in caught if issubclass(w.category, SamplingWarning)]


# ---------------------------------------------------------------- too few chains

def test_the_warning_and_the_growth_use_one_margin():
    from nrpt.adapt import chains
    from nrpt.report import health

    assert health.SHORT_LADDER == chains.SHORT_LADDER


def test_too_few_chains_from_synthetic_acceptance():
    # 7 pairs accepting 0.05 each: Lambda-hat = 6.65, saturated near P - 1 = 7
    found = check_run(swap_acceptance=np.full((1, 7), 0.05), n_chains=8)
    msg = [f.message for f in found if f.code == "too-few-chains"]
    assert len(msg) == 1 and "chains = 14" in msg[0] and "at least" in msg[0], msg
    # negative control: pairs accepting 0.7 (Lambda-hat = 2.1, 2 Lambda-hat = 5 <= 8)
    assert "too-few-chains" not in [f.code for f in check_run(
        swap_acceptance=np.full((1, 7), 0.7), n_chains=8)]


def test_a_large_barrier_with_8_chains_says_how_many_chains_to_use():
    # N(0, I) -> N(mu, I), |mu| = 20: Lambda = 20 / sqrt(pi) = 11.3; with 8 chains the estimate
    # saturates near P - 1 = 7 (6.6 at this seed) and the run must say so, with the number
    target = ShiftedGaussianPath(dim=2, shift=20.0)
    res, found = run_and_collect(target, chains=8, rounds=7, seed=1)
    assert res.summary["barrier"] > 5.5
    hits = [w for w in found if w.startswith("Too few chains")]
    assert len(hits) == 1 and "run with chains = " in hits[0], found
    need = int(hits[0].split("run with chains = ")[1].split()[0])
    assert need >= 12
    # negative control: enough chains for the barrier, no such advice
    res, found = run_and_collect(target, chains=28, rounds=7, seed=1)
    assert not any(w.startswith("Too few chains") for w in found), found


# ---------------------------------------------------------------- chains = "auto"

BIG_BARRIER = dict(target="geometric-shifted-gaussian-path", target_options={"dim": 2,
                                                                            "shift": 20.0})


def test_auto_chains_grow_on_a_large_barrier_and_cross_it():
    # Lambda = 20 / sqrt(pi) = 11.3: from 8 chains the ladder grows between rounds (the
    # estimate saturates near P - 1 first), and the replicas then cross it; 8 fixed chains do not
    grown, _ = run_and_collect(BIG_BARRIER["target"], target_options=BIG_BARRIER[
        "target_options"], chains="auto", rounds=9, seed=1)
    fixed, found = run_and_collect(BIG_BARRIER["target"], target_options=BIG_BARRIER[
        "target_options"], chains=8, rounds=9, seed=1)
    s = grown.summary
    assert s["chains_start"] == 8 and s["max_chains"] == 64
    assert s["chains"] >= 14 and s["chains_grown"] and s["chains_grown"][0]["from"] == 8
    assert s["chains_grown"][-1]["to"] == s["chains"] == len(s["schedule"])
    assert all(g["round"] >= 4 for g in s["chains_grown"])  # (rounds of >= 16 iterations)
    assert s["barrier"] > 9.0 and s["round_trips"] >= 3
    assert fixed.summary["chains"] == 8 and fixed.summary["round_trips"] == 0
    assert fixed.summary["barrier"] < 7.0  # saturated near P - 1 = 7
    assert any(w.startswith("Too few chains") for w in found)
    # the states are the target's: slot 0 near mu = (20 / sqrt 2) (1, 1) = 14.1 each
    assert np.allclose(np.asarray(grown.samples).mean(0), 14.14, atol=0.6)


def test_auto_chains_keep_8_where_the_barrier_is_small_and_equal_chains_8():
    opts = dict(target="geometric-gaussian-path", target_options={"dim": 2}, rounds=6, seed=3,
                explorer="rwmh")
    auto, _ = run_and_collect(opts["target"], **{k: v for k, v in opts.items() if k != "target"},
                              chains="auto")
    fixed, _ = run_and_collect(opts["target"], **{k: v for k, v in opts.items()
                                                  if k != "target"}, chains=8)
    assert auto.summary["chains"] == 8 and auto.summary["chains_grown"] == []
    assert np.array_equal(auto.samples, fixed.samples)  # nothing grew: the same run


def test_auto_chains_stop_at_max_chains_and_say_so():
    res, found = run_and_collect(BIG_BARRIER["target"], target_options=BIG_BARRIER[
        "target_options"], chains="auto", max_chains=12, rounds=7, seed=1)
    assert res.summary["chains"] == 12 and res.summary["chains_capped"]["needed"] > 12
    hits = [w for w in found if w.startswith("Too few chains")]
    assert hits and "max_chains = 12" in hits[0] and "raise max_chains" in hits[0], found


def test_resume_after_growth_is_bit_for_bit(tmp_path):
    from nrpt.run.api import run_config
    from nrpt.run.config import RunConfig

    opts = dict(**BIG_BARRIER, rounds=8, chains="auto", seed=2, explorer="mala",
                figures=False, checkpoint_every=100)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)
        full = run_config(RunConfig(out=str(tmp_path / "full"), **opts))

        def interrupt(engine):  # iteration 256 is in the middle of round 8 (255..510)
            if engine.k == 256:
                raise KeyboardInterrupt

        part = run_config(RunConfig(out=str(tmp_path / "cut"), **opts), callback=interrupt)
        assert part.summary["interrupted"] and part.summary["chains"] > 8  # it grew before
        resumed = nrpt.resume(tmp_path / "cut")
    assert full.summary["chains"] == resumed.summary["chains"] > 8
    assert np.array_equal(resumed.samples, full.samples)
    assert np.array_equal(resumed.index, full.index)
    assert np.array_equal(np.load(tmp_path / "cut" / "index.npy"), full.index)
    for key in ("chains_grown", "schedule", "step_size", "barrier", "log_normalizer",
                "restarts_total", "round_trips"):
        assert resumed.summary[key] == full.summary[key], key


def test_auto_chains_refusals():
    from nrpt.run.config import RunConfig

    with pytest.raises(ValueError, match="give rounds"):
        RunConfig(chains="auto")
    with pytest.raises(ValueError, match="max_chains must be >= chains"):
        RunConfig(chains=10, max_chains=5, rounds=3)
    with pytest.raises(ValueError, match="record='all'|explicit ladder|cannot follow"):
        nrpt.sample("geometric-gaussian-path", chains="auto", rounds=3,
                    betas=[1.0, 0.5, 0.2, 0.1, 0.05, 0.02, 0.01, 0.0], figures=False,
                    progress=False)

    class Frozen(nrpt.roles.AdaptorBase):  # a per-slot table it cannot carry
        name = "frozen"

    with pytest.raises(ValueError, match="adaptor 'frozen' cannot follow"):
        nrpt.sample("geometric-gaussian-path", chains="auto", rounds=3, adaptors=[Frozen()],
                    figures=False, progress=False)
    nrpt.sample("geometric-gaussian-path", chains=8, rounds=3, adaptors=[Frozen()],
                figures=False, progress=False)  # (fixed chains: fine)


# ---------------------------------------------------------------- PyMC priors that cannot be drawn

def _ordered_model(ordered: bool):
    pm = pytest.importorskip("pymc")
    y = np.random.default_rng(0).normal(size=20)
    with pm.Model() as model:
        kw = {"transform": pm.distributions.transforms.ordered} if ordered else {}
        mu = pm.Normal("mu", 0.0, 3.0, shape=2, initval=[-1.0, 1.0], **kw)
        pm.Normal("y", mu.sum(), 1.0, observed=y)
    return model


def test_an_ordered_prior_is_refused_on_the_prior_path_naming_the_temperature_path():
    from nrpt.targets import from_pymc
    from nrpt.targets.protocol import TargetError

    # before: a NaN forward draw made a misleading "does not draw from its generator" error
    with pytest.raises(TargetError, match=r"'mu' has the ordered transform.*cannot draw.*"
                                          r"path='temperature'"):
        from_pymc(_ordered_model(True))
    # the temperature path takes it
    t = from_pymc(_ordered_model(True), path="temperature")
    res = nrpt.sample(t, chains=4, rounds=3, seed=0, figures=False, progress=False)
    assert np.isfinite(res.samples).all()
    # negative control: without the transform the prior path is fine
    from_pymc(_ordered_model(False))


def test_non_finite_forward_draws_are_refused_by_the_per_draw_sampler(monkeypatch):
    # the generic guard behind the transform check: forward draws that land outside the
    # transform's domain (NaN) say so instead of failing later as non-finite initial states
    from nrpt.targets import from_pymc
    from nrpt.targets.adapters import pymc as adapter
    from nrpt.targets.protocol import TargetError

    monkeypatch.setattr(adapter, "CONSTRAINING_TRANSFORMS", ())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (the vectorized sampler's fallback)
        with pytest.raises(TargetError, match=r"non-finite.*cannot draw.*path='temperature'"):
            from_pymc(_ordered_model(True))


# ---------------------------------------------------------------- overdispersed starts

class Compartments:
    """``u ~ N(0, 100^2)`` cut into compartments 60 wide by walls of height 50 (width 4) that
    a random-walk step cannot cross, ``v ~ N(0, 1)``.  ``starts = "point"``: its own initial
    states are one point (``u = 180``) jittered by ``U(-1, 1)``, as PyMC's."""

    name, dim = "compartments", 2

    def __init__(self, point: bool = True):
        import torch

        self.walls = torch.arange(-8, 8, dtype=torch.float64) * 60 + 30
        if point:
            self.starts = "point"

    def energy(self, x):
        import torch

        u, v = x[:, 0], x[:, 1]
        walls = torch.exp(-0.5 * ((u[:, None] - self.walls) / 4.0) ** 2).sum(1)
        return 0.5 * (u / 100.0) ** 2 + 0.5 * v * v + 50.0 * walls

    def initial_point(self):
        import torch

        return torch.tensor([180.0, 0.0], dtype=torch.float64)

    def initial_states(self, n, generator):
        import torch

        u = torch.rand(n, 2, generator=generator, dtype=torch.float64)
        return self.initial_point() + 2 * u - 1


def test_overdispersed_starts_let_r_hat_see_what_point_starts_hide():
    opts = dict(chains=2, max_temperature=1.5, iterations=4000, systems=4, seed=0,
                explorer="rwmh")
    # before (the target's own starts, as a target without starts = "point" keeps): every
    # system in the compartment of u = 180, each well mixed there: R-hat near 1, mean u ~ 178
    # where the truth is 0 (sd 100)
    old, _ = run_and_collect(Compartments(point=False), **opts)
    x = np.asarray(old.samples)
    assert max(old.summary["slot0"]["r_hat"]) < 1.05
    assert abs(x[..., 0].mean() - 180.0) < 10.0
    # now: independent draws around the mode at twice the Laplace sd (100 along u): the
    # systems start in different compartments and R-hat says so
    new, found = run_and_collect(Compartments(), **opts)
    means = np.asarray(new.samples)[..., 0].mean(1)
    assert means.max() - means.min() > 100.0
    assert max(new.summary["slot0"]["r_hat"]) > 1.2
    assert any("R-hat" in w for w in found), found


def test_overdispersed_states_follow_the_laplace_scale():
    import torch

    from nrpt.paths.ladders import make_path
    from nrpt.paths.starts import overdispersed_states
    from nrpt.targets.gaussian import Gaussian

    cov = torch.tensor([[100.0**2, 0.0], [0.0, 1.0]], dtype=torch.float64)
    t = Gaussian(torch.tensor([5.0, -3.0], dtype=torch.float64), cov)
    path = make_path(t, 4, temperatures=None, betas=None, max_temperature=4.0)
    x = overdispersed_states(t, path, 4000, torch.Generator().manual_seed(1),
                             torch.tensor([300.0, 10.0]))
    # N(mode, (2 sd)^2): the mode found from a far point, the sds twice the target's
    se = torch.tensor([200.0, 2.0], dtype=torch.float64) / 4000**0.5
    assert ((x.mean(0) - torch.tensor([5.0, -3.0], dtype=torch.float64)).abs() < 4 * se).all()
    assert torch.allclose(x.std(0), torch.tensor([200.0, 2.0], dtype=torch.float64), rtol=0.05)


# ---------------------------------------------------------------- improper hot ends

class FlatRegression:
    """``y = a + b t + N(0, sigma^2)``, ``n = 20``, flat priors on ``a``, ``b`` and ``sigma >
    0``; ``x = (a, b, log sigma)``.  Tempered at ``beta``, the hot end is proper only for
    ``beta (n - 1) > 2``: improper at ``1/25``, proper at ``1/3``."""

    name = "flat-regression"
    dim = 3
    coordinate_names = ["a", "b", "log_sigma"]

    def __init__(self, n: int = 20):
        import torch

        g = torch.Generator().manual_seed(0)
        self.t = torch.linspace(-1, 1, n, dtype=torch.float64)
        self.y = 1.0 + 2.0 * self.t + 0.5 * torch.randn(n, generator=g, dtype=torch.float64)

    def energy(self, x):
        import torch

        a, b, s = x[:, 0:1], x[:, 1:2], x[:, 2]
        r = self.y - a - b * self.t
        n = self.y.numel()
        return (r * r).sum(1) * torch.exp(-2 * s) / 2 + (n - 1) * s  # (Jacobian of e^s)

    def initial_states(self, n, generator):
        import torch

        return 0.1 * torch.randn(n, 3, generator=generator, dtype=torch.float64)


def test_an_improper_hot_end_is_refused_with_the_max_temperature_that_fixes_it():
    from nrpt.targets.protocol import TargetError

    t = FlatRegression()
    # before: the default max_temperature = 25 ran, its hot chains drifting to sigma -> inf
    with pytest.raises(TargetError, match=r"improper.*'log_sigma'.*lower max_temperature to "
                                          r"(\d+(\.\d+)?) or less"):
        nrpt.sample(t, chains=6, iterations=50, figures=False, progress=False)
    try:
        nrpt.sample(t, chains=6, iterations=50, figures=False, progress=False)
    except TargetError as err:
        fix = float(str(err).split("lower max_temperature to ")[1].split()[0])
    assert 2.0 < fix < 1 / (2 / 19)  # inside the exact boundary beta = 2 / (n - 1)
    # the fix it names runs, and so does max_temperature = 3
    for T in (fix, 3.0):
        res = nrpt.sample(t, chains=6, iterations=200, max_temperature=T, seed=0,
                          figures=False, progress=False)
        assert np.isfinite(res.samples).all()


def test_proper_targets_are_not_refused_by_the_hot_end_check():
    import torch

    from nrpt.paths.ladders import make_path
    from nrpt.paths.proper import hot_end_check
    from nrpt.targets.gaussian import Gaussian, GaussianMixture
    from nrpt.targets.twenty_five_modes import TwentyFiveModes

    class Laplace2:  # exponential tails: proper at every temperature
        name, dim = "laplace", 2

        def energy(self, x):
            return torch.sqrt(1 + x * x).sum(1)

    class Cauchy2:  # polynomial tails: exp(-beta log(1 + x^2)) is improper for beta <= 1/2
        name, dim = "cauchy", 2

        def energy(self, x):
            return torch.log1p(x * x).sum(1)

    cov = torch.tensor([[1.0, 0.95], [0.95, 1.0]])
    for target in (TwentyFiveModes(), Gaussian(torch.zeros(2), cov),
                   GaussianMixture([0.5, 0.5], [[-30.0], [30.0]], 1.0), Laplace2(),
                   FlatRegression()):
        path = make_path(target, 4, temperatures=None, betas=None, max_temperature=25.0)
        beta = 1 / 3 if isinstance(target, FlatRegression) else 1 / 25
        assert hot_end_check(target, path, torch.zeros(target.dim), beta) is None, target
    # the check is not blind to heavy tails: a Cauchy tempered at 25 is improper (beta_c = 1/2)
    path = make_path(Cauchy2(), 4, temperatures=None, betas=None, max_temperature=25.0)
    hot = hot_end_check(Cauchy2(), path, torch.zeros(2), 1 / 25)
    assert hot is not None and abs(hot.beta_critical - 0.5) < 0.02
    assert hot_end_check(Cauchy2(), path, torch.zeros(2), 0.6) is None
