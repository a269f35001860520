"""Burn-in of fixed-length runs (``burn_in``) and the step sizes tuned during it.

The statistics, ``Result.samples`` and ``posterior.nc`` exclude the warm-up; the step sizes of
rwmh / mala / hmc are tuned between warm-up windows and frozen for sampling; a resumption keeps
the first run's burn-in.  Known answer: the slot-0 sd of a standard Gaussian (1), from replicas
started 25 sd away."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import nrpt
from nrpt.targets import gaussian


class FarStart:
    """A standard 2-D Gaussian whose replicas all start at (25, 25)."""

    name = "far-start"
    dim = 2

    def __init__(self):
        self.g = gaussian(dim=2)

    def energy(self, x):
        return self.g.energy(x)

    def initial_states(self, n, generator):
        return torch.full((n, 2), 25.0, dtype=torch.float64)


OPTS = dict(chains=6, iterations=2000, seed=0, figures=False, max_temperature=100.0)


def test_the_warm_up_is_in_no_statistic_and_the_answer_is_right():
    res = nrpt.sample(FarStart(), **OPTS)
    assert res.summary["burn_in"] == 200 and res.samples.shape == (1800, 2)
    # sd of a sd estimate ~ 1 / sqrt(2 ESS): ESS >= 300 here, so 4 sd < 0.17
    ess = min(res.summary["slot0"]["ess_bulk"])
    assert ess > 300
    sd = res.samples.std(0)
    assert np.all(np.abs(sd - 1.0) < 4 / np.sqrt(2 * ess)), (sd, ess)
    assert "burn-in of 200" in res.summary["statistics_from"]
    # negative control: the same run keeping its warm-up (what every fixed-length run did before
    # burn_in existed) is far off -- the test can fail
    kept = nrpt.sample(FarStart(), **OPTS, burn_in=0, adapt_step_size=None)
    assert np.any(np.abs(kept.samples.std(0) - 1.0) > 0.5), kept.samples.std(0)


def test_step_sizes_are_tuned_in_the_warm_up_and_frozen_after(tmp_path):
    seen = {}

    def watch(engine):
        seen[engine.k] = engine.step_size.clone()

    res = nrpt.sample("gaussian", chains=6, iterations=3000, seed=1, figures=False,
                      callback=watch, out=str(tmp_path / "run"))
    assert res.summary["step_size_tuned_in_burn_in"] and res.summary["warmup_windows"] == 6
    after = [v for k, v in seen.items() if k >= 300]
    assert len(after) >= 10 and all(torch.equal(v, after[0]) for v in after)
    assert after[0][0, 0] > 3 * 0.35  # the default 0.35 accepts ~0.8 here: tuned up
    acc = np.asarray(res.summary["explorer_acceptance"])
    assert np.all(np.abs(acc - 0.3) < 0.1), acc  # rwmh's target acceptance
    assert not [w for w in res.summary["warnings"] if "too small" in w]
    # samples.npy keeps every row (burn-in first); posterior.nc only the samples
    rows = np.load(tmp_path / "run" / "samples.npy")
    assert rows.shape == (3000, 2) and np.array_equal(rows[300:], res.samples)
    idata = pytest.importorskip("arviz").from_netcdf(tmp_path / "run" / "posterior.nc")
    assert idata.posterior["x"].shape == (1, 2700, 2)
    # no tuning asked for: the step sizes stay as given
    fixed = nrpt.sample("gaussian", chains=6, iterations=600, seed=1, figures=False,
                        adapt_step_size=False)
    assert fixed.summary["step_size"][0] == pytest.approx(0.35)
    assert not fixed.summary["step_size_tuned_in_burn_in"]


def test_a_run_stopped_in_its_warm_up_resumes_exactly(tmp_path):
    opts = dict(chains=5, iterations=1000, burn_in=600, seed=4, figures=False,
                explorer="mala", checkpoint_every=100)
    full = nrpt.sample("gaussian", out=str(tmp_path / "full"), **opts)

    def stop(engine):
        if engine.k == 256:  # inside the warm-up (8 windows of 75): after 3 tunings
            raise KeyboardInterrupt

    part = nrpt.sample("gaussian", out=str(tmp_path / "cut"), callback=stop, **opts)
    assert part.summary["interrupted"] and part.samples.shape[0] == 0
    again = nrpt.resume(tmp_path / "cut")
    assert np.array_equal(again.samples, full.samples)
    assert again.summary["step_size"] == full.summary["step_size"]
    # a larger budget keeps the burn-in: equal to a fresh run with that count
    more = nrpt.resume(tmp_path / "cut", iterations=1500)
    fresh = nrpt.sample("gaussian", **{**opts, "iterations": 1500})
    assert more.summary["burn_in"] == 600 and np.array_equal(more.samples, fresh.samples)
