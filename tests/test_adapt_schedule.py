"""Schedule adaptation as pure functions (nrpt.adapt.schedule): fit, inversion, degenerate
rejection rates, and the fixed point reached with the exact rejection rates of the analytic
Gaussian paths; the between-round ScheduleAdaptor built on them; the restart-rate curve."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nrpt.adapt import (
    ScheduleAdaptor,
    clean_rejections,
    equalized_schedule,
    fit_barrier,
    recommended_chains,
    restart_rate_curve,
    update_schedule,
)
from nrpt.diagnostics import theory
from nrpt.roles import SegmentView
from nrpt.targets.gaussian_path import ScaledGaussianPath, ShiftedGaussianPath

LINEAR = np.linspace(1.0, 0.0, 9)


def test_equal_rejections_keep_an_equally_spaced_schedule():
    new = update_schedule(LINEAR, np.full(8, 0.3))
    np.testing.assert_allclose(new, LINEAR, atol=1e-12)


def test_fit_passes_through_the_cumulative_rejections_and_is_monotone():
    r = np.array([0.1, 0.0, 0.5, 1.0, 0.2, 0.05, 0.3, 0.0])
    fit = fit_barrier(LINEAR, r)
    # knots run from the explorative end (b = 0) up to the target (b = 1)
    np.testing.assert_allclose(fit.barrier(LINEAR[::-1]), np.concatenate([[0], np.cumsum(r[::-1])]))
    assert fit.total == pytest.approx(r.sum())
    b = np.linspace(0, 1, 2001)
    assert np.all(np.diff(fit.barrier(b)) >= -1e-12)  # PCHIP keeps monotone data monotone
    assert np.all(fit.local(b) >= 0)
    # the local barrier integrates back to the global one
    lam = fit.local(b)
    assert np.sum(0.5 * (lam[1:] + lam[:-1]) * np.diff(b)) == pytest.approx(r.sum(), rel=1e-3)


def test_new_schedule_equalizes_the_fitted_barrier():
    r = np.array([0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.6, 0.9])
    fit = fit_barrier(LINEAR, r)
    new = equalized_schedule(fit, 9)
    assert new[0] == 1.0 and new[-1] == 0.0 and np.all(np.diff(new) < 0)
    np.testing.assert_allclose(np.diff(fit.barrier(new[::-1])), r.sum() / 8, rtol=1e-8)
    # slots move towards b = 0 where the rejections are high
    assert np.all(new[1:-1] < LINEAR[1:-1])


@pytest.mark.parametrize("rejection", [np.zeros(8), np.array([0, 0, 0, 1.0, 0, 0, 0, 0]),
                                       np.array([1.0] * 8), np.array([np.nan] * 8),
                                       np.array([0.2, np.nan, 0.4, 0, 1, 0.3, 0.2, 0.1])])
def test_degenerate_rejections_give_a_valid_schedule_without_warnings(rejection):
    # pytest runs with warnings as errors: no division by zero, no invalid value
    new = update_schedule(LINEAR, rejection)
    assert new.shape == (9,) and np.all(np.isfinite(new))
    assert new[0] == 1.0 and new[-1] == 0.0 and np.all(np.diff(new) < 0)


def test_all_rejections_zero_leaves_the_schedule_unchanged():
    sched = np.array([1.0, 0.9, 0.5, 0.45, 0.1, 0.0])
    np.testing.assert_array_equal(update_schedule(sched, np.zeros(5)), sched)
    # re-sizing a ladder without information spaces it evenly
    np.testing.assert_allclose(update_schedule(sched, np.zeros(5), n_slots=3), [1.0, 0.5, 0.0])


def test_unattempted_pairs_take_the_mean_of_the_others():
    np.testing.assert_allclose(clean_rejections([0.2, np.nan, 0.4]), [0.2, 0.3, 0.4])
    np.testing.assert_allclose(clean_rejections([np.nan, np.nan]), [0.5, 0.5])
    np.testing.assert_allclose(clean_rejections([-1e-12, 1 + 1e-12]), [0.0, 1.0])


def test_temperature_ladder_schedule_keeps_its_hottest_end():
    # b = 1/tau from 1 down to 1/25
    b = 1.0 / np.geomspace(1.0, 25.0, 7)
    new = update_schedule(b, [0.1, 0.1, 0.2, 0.3, 0.5, 0.6])
    assert new[0] == pytest.approx(1.0) and new[-1] == pytest.approx(1 / 25)
    assert np.all(np.diff(new) < 0)


@pytest.mark.parametrize("target", [ScaledGaussianPath(dim=10, c=10.0),
                                    ScaledGaussianPath(dim=3, c=-0.9),
                                    ShiftedGaussianPath(dim=2, shift=4.0)])
def test_iterating_with_exact_rejections_reaches_the_optimal_schedule(target):
    # With exact rejection rates the update is deterministic; its fixed point equalizes the
    # rejection rates, and for a fine ladder it is the analytic optimum Lambda^-1(j Lambda/(P-1))
    P = 16
    sched = np.linspace(1.0, 0.0, P)
    spread = []
    for _ in range(6):
        r = target.rejections(sched)
        spread.append(r.max() - r.min())
        sched = update_schedule(sched, r)
    r = target.rejections(sched)
    assert r.max() - r.min() < 1e-3 * r.mean()
    assert spread[-1] < spread[0] / 20 or spread[0] < 1e-9
    np.testing.assert_allclose(sched, target.optimal_schedule(P), atol=2e-3)


def test_bad_input_is_rejected_with_clear_messages():
    with pytest.raises(ValueError, match="strictly decreasing"):
        update_schedule([1.0, 0.2, 0.5, 0.0], [0.1, 0.1, 0.1])
    with pytest.raises(ValueError, match="one rate per adjacent pair"):
        update_schedule(LINEAR, [0.1, 0.2])
    with pytest.raises(ValueError, match=r"lie in \[0, 1\]"):
        update_schedule([1.0, 0.5, 0.0], [0.1, 1.5])
    with pytest.raises(ValueError, match="at least 2 slots"):
        update_schedule([1.0], [])
    with pytest.raises(ValueError, match="finite"):
        update_schedule([1.0, 0.5, 0.0], [0.1, math.inf])
    with pytest.raises(ValueError, match="n_slots must be an integer >= 2"):
        equalized_schedule(fit_barrier(LINEAR, np.full(8, 0.1)), 1)


def test_restart_rate_curve_rises_to_its_asymptote():
    lam = 3.0
    chains = np.array([2, 4, 7, 10, 20, 50, 1000])
    tau = restart_rate_curve(lam, chains)
    assert tau[0] == 0.0 and tau[1] == 0.0  # fewer pairs than the barrier: r >= 1
    assert np.all(np.diff(tau[2:]) > 0)
    assert tau[-1] == pytest.approx(1 / (2 + 2 * lam), rel=1e-2)
    assert recommended_chains(lam) == 6 and recommended_chains(0.0) == 2
    with pytest.raises(ValueError, match="barrier"):
        restart_rate_curve(-1.0, chains)


def test_restart_rate_curve_is_the_finite_p_formula_on_equalized_ladders():
    # tau(P) is Syed et al.'s finite-P DEO rate with P - 1 equal rates Lambda / (P - 1)
    lam = 2.5
    for P in (4, 8, 32):
        assert restart_rate_curve(lam, [P])[0] == pytest.approx(
            theory.predicted_restart_rate([lam / (P - 1)] * (P - 1)), rel=1e-12)


class _Swaps:
    def __init__(self, rejection):
        self._r = torch.as_tensor(rejection, dtype=torch.float64)

    def rejection(self):
        return self._r


def _view(schedule, rejection, last=False):
    b = torch.as_tensor(schedule, dtype=torch.float64)
    return SegmentView(index=0, name="round 1", iterations=2, last=last,
                       recorders={"swaps": _Swaps(rejection)}, schedule=b,
                       step_size=torch.ones_like(b), params={})


def test_schedule_adaptor_updates_every_system_from_its_own_round():
    # the adaptor is update_schedule per system, fed by the ``swaps`` recorder of the round
    sched = np.stack([LINEAR, LINEAR])
    rej = np.array([[0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.6, 0.9], [0.3] * 8])
    update = ScheduleAdaptor().end_segment(_view(sched, rej))
    new = update.schedule.numpy()
    np.testing.assert_allclose(new[0], update_schedule(LINEAR, rej[0]), rtol=1e-12)
    np.testing.assert_allclose(new[1], LINEAR, atol=1e-12)  # equal rates: a fixed point
    assert update.step_size is None and not update.params
    # the last round's schedule is the one reported: no update after it
    assert ScheduleAdaptor().end_segment(_view(sched, rej, last=True)) is None
