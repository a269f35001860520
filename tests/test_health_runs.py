"""End to end: the audit's three runs that looked healthy now warn, naming the knob; a healthy
run stays quiet (the negative control)."""

from __future__ import annotations

import warnings

import pytest
import torch

import nrpt
from nrpt import SamplingWarning
from nrpt.targets.gaussian import Gaussian, GaussianMixture


def run_and_collect(target, **options):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SamplingWarning)
        res = nrpt.sample(target, figures=False, **options)
    found = [str(w.message) for w in caught if issubclass(w.category, SamplingWarning)]
    assert found == res.summary["warnings"]  # the same findings, each naming its knob
    return res, found


def test_separated_mixture_with_all_defaults_warns_that_systems_disagree():
    # modes at -30 and 30: swaps look excellent, yet the systems' mode shares disagree beyond
    # their Monte Carlo error (R-hat 1.012-1.033 over seeds 0-3; at +-20 it is borderline)
    target = GaussianMixture([0.3, 0.7], [[-30.0], [30.0]], 1.0)
    res, found = run_and_collect(target, systems=4, iterations=3000, seed=0)
    assert min(res.summary["swap_acceptance"][0]) > 0.5  # the swaps are not the problem
    text = " ".join(found)
    assert "R-hat" in text or "forget" in text or "disagree" in text, found
    assert any("turn:" in w for w in res.summary["warnings"])


def test_hmc_at_the_default_step_size_on_25_modes_warns_about_the_step_size():
    # the step as given (no tuning in the burn-in): the health check names step_size
    res, found = run_and_collect("twenty-five-modes", explorer="hmc", iterations=600, seed=0,
                                 adapt_step_size=False)
    assert any("hmc acceptance" in w and "step_size" in w for w in found), found
    # by default the burn-in tunes the step toward HMC's target acceptance: no such warning
    res, found = run_and_collect("twenty-five-modes", explorer="hmc", iterations=600, seed=0)
    assert res.summary["step_size_tuned_in_burn_in"]
    assert not any("hmc acceptance" in w for w in found), found


def test_400d_gaussian_on_the_default_ladder_warns_about_the_ladder():
    target = Gaussian(torch.zeros(400), torch.eye(400))
    res, found = run_and_collect(target, iterations=600, seed=0, step_size=0.1)
    assert min(res.summary["swap_acceptance"]) < 0.05
    assert any("Swap acceptance is below" in w and "chains" in w for w in found), found


def test_a_healthy_run_is_quiet():
    target = Gaussian(torch.zeros(1), torch.eye(1))
    res, found = run_and_collect(target, chains=4, max_temperature=4.0, iterations=6000,
                                 step_size=2.0, systems=2, seed=1)
    assert found == [], found


@pytest.mark.parametrize("bad", [True, False])
def test_the_report_prints_the_warnings(bad, capsys):
    target = Gaussian(torch.zeros(1), torch.eye(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)
        res = nrpt.sample(target, chains=4, max_temperature=4.0, iterations=2000, seed=1,
                          step_size=1e4 if bad else 2.0, figures=False)
    assert ("WARNING" in str(res)) == bad


# ------------------------------------------------------------ DEO*-SGD's learning-rate ladder
def _headline(**changes):
    from nrpt.run.sgpt import HEADLINE

    cfg = {k: (dict(v) if isinstance(v, dict) else v) for k, v in HEADLINE.items()}
    cfg.update(changes)
    return cfg.pop("target"), cfg


def test_the_default_sgd_ladder_warns_that_it_is_not_equalized():
    # Eq. 11/12 as written: pair 0 swaps at 0.54-0.59 against S = 0.4 (rungs 1 and 2 collapse
    # later: 0.015169 / 0.015176 at 20000 iterations)
    target, cfg = _headline(iterations=1500, seed=0)
    res, found = run_and_collect(target, **cfg)
    off = [w for w in found if "swap-indicator rate of pair 0" in w]
    assert off and "S = 0.4" in off[0] and "ladder_update = log-gaps" in off[0], found


def test_the_log_gap_ladder_is_equalized_and_quiet():
    # negative control: the same run with ladder_update = "log-gaps" holds every pair at S
    target, cfg = _headline(iterations=1500, seed=0, ladder_update="log-gaps")
    res, found = run_and_collect(target, **cfg)
    assert not [w for w in found if "ladder" in w], found
    rates = res.summary["indicator_rate"]
    assert max(abs(r - 0.4) for r in rates) < 0.05, rates


def test_the_collapse_warning_names_the_rungs():
    from nrpt.report.health import check_run

    lr = [0.003, 0.015169, 0.015176, 0.0221, 0.0278, 0.6]
    f = check_run(learning_rates=lr)
    assert [x.code for x in f] == ["ladder-collapse"]
    assert "slots 1 and 2" in f[0].message and "0.015169" in f[0].message
    assert "ladder_update" in f[0].knob
    geometric = list(torch.logspace(-2.5, -0.2, 16).tolist())
    assert check_run(learning_rates=geometric, pair_rate=[0.41, 0.35, 0.45],
                     swap_rate_target=0.4) == []
    f = check_run(pair_rate=[[0.4, 0.4], [0.59, 0.4]], swap_rate_target=0.4)
    assert [x.code for x in f] == ["swap-rate-off-target"]
    assert "pair 0" in f[0].message and "system 1" in f[0].message


def test_the_log_gap_update_keeps_the_end_points_and_the_order():
    from nrpt.adapt.sa import LearningRateAdaptor

    eta = torch.tensor([[0.003, 0.0152, 0.015201, 0.1, 0.6]], dtype=torch.float64)
    listed = torch.ones(1, 4)
    A = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    new = LearningRateAdaptor.update_log_gaps(eta, A, listed, 0.4, 0.5)
    assert new[0, 0] == eta[0, 0] and torch.isclose(new[0, -1], eta[0, -1], rtol=1e-14)
    assert bool((new.diff(dim=1) > 0).all())
    # the tiny gap of pair 1 (rate 0 < S) shrinks, the others widen; nothing is frozen
    gaps, old = new.log().diff(dim=1), eta.log().diff(dim=1)
    assert gaps[0, 1] < old[0, 1] and not torch.equal(new, eta)
    target, cfg = _headline(iterations=5, ladder_update="geometric")
    with pytest.raises(ValueError, match="ladder_update must be one of"):
        nrpt.sample(target, figures=False, **cfg)
