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
