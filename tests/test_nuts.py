"""NUTS (nrpt.explorers.nuts): exact invariance by nrpt.testing at a tempered slot (b = 0.7) on
a badly scaled Gaussian and on a funnel, with no metric, a diagonal and a dense one; the same
check must fail for NUTS with a biased selection (always the last state of the trajectory:
the negative control, on the Gaussian).  Then a short adaptive PT run with NUTS as the explorer."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from explorer_targets import METRICS, TARGETS, B

import nrpt
from nrpt.explorers.nuts import NUTS
from nrpt.paths.ladders import TemperatureLadder
from nrpt.roles import Density, Noise, ReplicaState
from nrpt.targets import Gaussian
from nrpt.testing import check_invariance


class LastState(NUTS):
    """Negative control: the trajectory's last state instead of a multinomial draw."""

    def _take_leaf(self, u, log_w, log_w_total):
        return torch.ones_like(u, dtype=torch.bool)

    def _take_subtree(self, u, log_w_sub, log_w_old):
        return torch.ones_like(u, dtype=torch.bool)


#: about the sd of each target's narrowest direction at b
STEP = {"gaussian": 0.12, "funnel": 0.25}


def check(explorer, target: str, metric: str):
    return check_invariance(explorer, TARGETS[target](), b=B, metric=METRICS[metric],
                            step_size=STEP[target], cross=True, n_steps=60, systems=128, seed=5)


CASES = [("gaussian", "none"), ("funnel", "none"), ("gaussian", "dense"),
         pytest.param("funnel", "dense", marks=pytest.mark.slow),
         pytest.param("gaussian", "diag", marks=pytest.mark.slow),
         pytest.param("funnel", "diag", marks=pytest.mark.slow)]


@pytest.mark.parametrize("target,metric", CASES)
def test_nuts_leaves_the_tempered_slot_invariant(target, metric):
    report = check(NUTS(), target, metric)
    assert report.ok, report
    assert report.nonfinite == 0 and report.moved > 0.9


# On the funnel the last state's bias is too small for this budget (max z 1.5 to 5 with 128
# chains x 60 steps): the control is the badly scaled Gaussian, where it is ~10 se.
NEGATIVE = [("gaussian", "none"),
            pytest.param("gaussian", "dense", marks=pytest.mark.slow),
            pytest.param("gaussian", "diag", marks=pytest.mark.slow)]


@pytest.mark.parametrize("target,metric", NEGATIVE)
def test_negative_control_last_state_of_the_trajectory_is_detected(target, metric):
    report = check(LastState(), target, metric)
    assert not report.ok and report.moved_enough, report
    assert report.max_z > 6, report


def _one_step(ex, x, b, h, metric=None, seed=0):
    t = TARGETS["gaussian"]()
    dens = Density(t, TemperatureLadder([1.0, 2.0]))
    state = ex.prepare(ReplicaState(x, *dens(x)), dens)
    R, P = x.shape[:2]
    bb = torch.full((R, P), b, dtype=torch.float64)
    hh = torch.as_tensor(h, dtype=torch.float64).expand(R, P)
    return ex.step(state, bb, hh, dens, Noise(seed, 0, R, P, torch.device("cpu")),
                   **({} if metric is None else {"metric": metric}))


def test_trajectories_are_per_replica_and_capped_by_the_tree_depth():
    # replicas with very different step sizes build trajectories of different lengths in one
    # batched step; the tree depth caps the gradient evaluations at 2^depth - 1
    calls = []

    x = TARGETS["gaussian"]().sample_at(B, 6, torch.Generator().manual_seed(1)).reshape(3, 2, 2)
    h = torch.tensor([[1e-3, 0.2], [1e-3, 0.2], [1e-3, 0.2]], dtype=torch.float64)
    t = TARGETS["gaussian"]()
    dens = Density(t, TemperatureLadder([1.0, 2.0]))
    orig = dens.grad_components

    def counted(xx):
        calls.append(xx.shape[0])
        return orig(xx)

    dens.grad_components = counted
    ex = NUTS(max_tree_depth=4)
    state = ex.prepare(ReplicaState(x, *dens(x)), dens)
    calls.clear()
    new, info = ex.step(state, torch.full((3, 2), B, dtype=torch.float64), h, dens,
                        Noise(0, 0, 3, 2, torch.device("cpu")))
    # the tiny step never U-turns: 1 + 2 + 4 + 8 = 15 leapfrog steps for its replicas, and
    # the replicas of step 0.2 stop earlier (their rows drop out of the batched evaluations)
    assert len(calls) == 15
    assert calls[0] == 6 and calls[-1] < 6
    assert info.accept_prob.shape == (3, 2) and bool(info.accepted.all())
    assert (info.accept_prob[:, 0] > 0.99).all()  # the tiny step: no energy error


def test_a_non_finite_trajectory_stops_and_is_flagged():
    class Boxed:
        """The standard normal restricted to |x| < 1 (log density -inf outside)."""

        dim = 1
        name = "boxed"

        def energy(self, x):
            e = 0.5 * (x**2).sum(-1)
            return torch.where(x.abs().amax(-1) < 1, e, torch.full_like(e, math.inf))

    dens = Density(Boxed(), TemperatureLadder([1.0, 2.0]))
    x = torch.full((8, 1, 1), 0.9, dtype=torch.float64)
    ex = NUTS(max_tree_depth=6)
    state = ex.prepare(ReplicaState(x, *dens(x)), dens)
    new, info = ex.step(state, torch.ones(8, 1, dtype=torch.float64),
                        torch.full((8, 1), 0.3, dtype=torch.float64), dens,
                        Noise(1, 0, 8, 1, torch.device("cpu")))
    assert info.nonfinite.any()
    assert (new.x.abs() < 1).all() and torch.isfinite(new.v).all()


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="max_tree_depth must be an integer in"):
        NUTS(max_tree_depth=0)
    assert not NUTS.compilable and NUTS.preconditionable
    assert NUTS.target_acceptance == 0.8


def test_nuts_in_adaptive_pt_samples_the_target_and_tunes_its_step():
    # 8 independent PT systems give the standard error of each moment; |error| < 4.5 se
    t = Gaussian([1.0, -2.0], [[1.0, 0.5], [0.5, 2.0]])
    res = nrpt.sample(t, explorer="nuts", chains=3, rounds=7, systems=8, seed=4,
                      step_size=2.0, max_temperature=4.0, max_tree_depth=6, figures=False)
    x = np.asarray(res.samples)  # [R, n, 2]
    per_system = np.concatenate([x.mean(1), (x**2).mean(1)], axis=1)
    truth = np.array([1.0, -2.0, 2.0, 6.0])
    se = per_system.std(0, ddof=1) / math.sqrt(x.shape[0])
    assert (np.abs(per_system.mean(0) - truth) < 4.5 * se).all(), (per_system.mean(0), se)
    acc = np.array(res.summary["explorer_acceptance"])
    assert (acc > 0.6).all() and (acc < 0.97).all()  # tuned toward 0.8 from step 2.0


def test_nuts_with_the_engines_dense_metric_samples_a_badly_conditioned_gaussian():
    # condition number ~140 (sds 1 and 0.2, correlation 0.9): the metric estimated between
    # rounds is passed by the engine; the tuned step grows to the whitened scale
    t = Gaussian([1.0, -2.0], [[1.0, 0.18], [0.18, 0.04]])
    res = nrpt.sample(t, explorer="nuts", precondition="dense", chains=3, rounds=7, systems=8,
                      seed=4, step_size=0.3, max_temperature=4.0, max_tree_depth=8,
                      figures=False)
    x = np.asarray(res.samples)
    per_system = np.concatenate([x.mean(1), x.var(1)], axis=1)
    truth = np.array([1.0, -2.0, 1.0, 0.04])
    se = per_system.std(0, ddof=1) / math.sqrt(x.shape[0])
    assert (np.abs(per_system.mean(0) - truth) < 4.5 * se).all(), (per_system.mean(0), se)
    pre = res.summary["preconditioner"]
    assert pre["kind"] == "dense"
    assert all(20 < c < 400 for c in pre["condition_number"])  # (true 140)
    assert (np.array(res.summary["step_size"]) > 0.5).all()  # whitened: ~1.3 (0.1-0.3 without)
