"""AutoMALA (nrpt.explorers.automala): exact invariance by nrpt.testing at a tempered slot
(b = 0.7), on an ill-conditioned correlated Gaussian and on a funnel, with no metric, a
diagonal and a dense one; the same check must fail for AutoMALA without its reversibility
check (the negative control: the step selected from the proposal differs from the one that
made it, and the kernel is biased).  Then a short adaptive PT run with AutoMALA and its base
step adaptation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from explorer_targets import METRICS, TARGETS, B

import nrpt
from nrpt.explorers.automala import AT_B, LOG_STEP, AutoMALA
from nrpt.targets import Gaussian
from nrpt.testing import check_invariance


class WithoutReversibilityCheck(AutoMALA):
    """Negative control: accepts with the MH ratio at the selected step only."""

    def _reversible(self, fwd, j, *args):
        return torch.ones_like(fwd.ok)


def check(explorer, target: str, metric: str, step_size: float = 0.3, systems: int = 48):
    return check_invariance(explorer, TARGETS[target](), b=B, metric=METRICS[metric],
                            step_size=step_size, cross=True, n_steps=200, systems=systems, seed=3)


CASES = [("gaussian", "none"), ("funnel", "none"), ("funnel", "dense"),
         pytest.param("gaussian", "diag", marks=pytest.mark.slow),
         pytest.param("gaussian", "dense", marks=pytest.mark.slow),
         pytest.param("funnel", "diag", marks=pytest.mark.slow)]


@pytest.mark.parametrize("target,metric", CASES)
def test_automala_leaves_the_tempered_slot_invariant(target, metric):
    report = check(AutoMALA(), target, metric)
    assert report.ok, report
    assert report.nonfinite == 0 and report.moved > 0.3


@pytest.mark.parametrize("target", ["gaussian",
                                    pytest.param("funnel", marks=pytest.mark.slow)])
def test_the_signed_criterion_is_exact_too(target):
    report = check(AutoMALA(symmetric=False), target, "none")
    assert report.ok, report


# The controls: without the check, the symmetric rule (the default) is biased on the funnel
# (its step depends strongly on the state: ~10 se with 256 chains) but by less than the
# check can resolve on a Gaussian (max z 2 to 4 with 256 chains); there the signed rule,
# whose forward and reverse selections disagree far more often, is the control (~6-10 se).
NEGATIVE = [("funnel", "none", True), ("funnel", "dense", True), ("gaussian", "none", False),
            ("gaussian", "dense", False),
            pytest.param("funnel", "diag", True, marks=pytest.mark.slow),
            pytest.param("gaussian", "diag", False, marks=pytest.mark.slow)]


@pytest.mark.parametrize("target,metric,symmetric", NEGATIVE)
def test_negative_control_without_the_reversibility_check_is_detected(target, metric,
                                                                      symmetric):
    report = check(WithoutReversibilityCheck(symmetric=symmetric), target, metric,
                   systems=256 if target == "funnel" else 48)
    assert not report.ok and report.moved_enough, report
    assert report.max_z > 5.5, report


@pytest.mark.slow
def test_the_step_is_chosen_per_state_and_the_check_rejects():
    # from a far too small base step the selection doubles it many times (the chains move
    # as far as from a good step), and the reversibility check rejects a share of proposals
    ex = AutoMALA()
    t = TARGETS["funnel"]()
    small = check_invariance(ex, t, b=B, step_size=1e-3, cross=True, n_steps=100, systems=32)
    good = check_invariance(ex, t, b=B, step_size=0.5, cross=True, n_steps=100, systems=32)
    assert small.ok and good.ok
    ess = lambda r: min(c.ess for c in r.checks)  # noqa: E731
    assert ess(small) > 0.5 * ess(good)
    unchecked = check_invariance(WithoutReversibilityCheck(), t, b=B, step_size=0.5,
                                 n_steps=100, systems=32)
    assert good.acceptance < unchecked.acceptance - 0.1


def test_selected_steps_are_recorded_per_replica():
    from nrpt.paths.ladders import TemperatureLadder
    from nrpt.roles import Density, Noise, ReplicaState

    t = TARGETS["funnel"]()
    dens = Density(t, TemperatureLadder([1.0, 2.0]))
    x = t.sample_at(B, 12, torch.Generator().manual_seed(0)).reshape(4, 3, 2)
    ex = AutoMALA(max_doublings=3)
    state = ex.prepare(ReplicaState(x, *dens(x)), dens)
    assert torch.isnan(state.extras[LOG_STEP]).all()
    b = torch.full((4, 3), B, dtype=torch.float64)
    h = torch.full((4, 3), 1e-3, dtype=torch.float64)
    new, info = ex.step(state, b, h, dens, Noise(0, 0, 4, 3, torch.device("cpu")))
    log_h = new.extras[LOG_STEP]
    assert torch.equal(new.extras[AT_B], b)
    # at most 2^3 above the jittered base step 1e-3 exp(0.5 N(0, 1))
    assert (log_h <= math.log(1e-3) + 3 * math.log(2) + 0.5 * 5).all()
    assert (log_h > math.log(1e-3) - 5).all()
    assert info.accept_prob.shape == (4, 3)


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="max_doublings must be an integer in"):
        AutoMALA(max_doublings=0)
    with pytest.raises(ValueError, match="jitter must be"):
        AutoMALA(jitter=-1.0)
    assert nrpt.explorers.automala.AutoMALA.compilable is False
    with pytest.raises(ValueError, match="symmetric must be true or false"):
        AutoMALA(symmetric=1)
    assert AutoMALA.preconditionable and AutoMALA.substeps == 2


def test_automala_in_adaptive_pt_samples_the_target_and_adapts_its_base_step():
    # 8 independent PT systems give the standard error of each moment; |error| < 4.5 se
    t = Gaussian([1.0, -2.0], [[1.0, 0.5], [0.5, 2.0]])
    res = nrpt.sample(t, explorer="automala", chains=3, rounds=8, systems=8, seed=4,
                      step_size=0.01, max_temperature=4.0, figures=False)
    x = np.asarray(res.samples)  # [R, n, 2], the last round's slot-0 draws
    per_system = np.concatenate([x.mean(1), (x**2).mean(1)], axis=1)
    truth = np.array([1.0, -2.0, 2.0, 6.0])
    se = per_system.std(0, ddof=1) / math.sqrt(x.shape[0])
    assert (np.abs(per_system.mean(0) - truth) < 4.5 * se).all(), (per_system.mean(0), se)
    steps = np.array(res.summary["step_size"])  # the last round's base steps [R, P]
    assert (steps > 0.2).all() and (steps < 5.0).all()  # from 0.01: the selected steps' scale


def test_automala_with_the_engines_dense_metric_samples_a_badly_conditioned_gaussian():
    # condition number ~140 (sds 1 and 0.2, correlation 0.9): the metric estimated between
    # rounds is passed by the engine; the base step grows to the whitened scale
    t = Gaussian([1.0, -2.0], [[1.0, 0.18], [0.18, 0.04]])
    res = nrpt.sample(t, explorer="automala", precondition="dense", chains=3, rounds=7,
                      systems=8, seed=4, step_size=0.3, max_temperature=4.0, figures=False)
    x = np.asarray(res.samples)
    per_system = np.concatenate([x.mean(1), x.var(1)], axis=1)
    truth = np.array([1.0, -2.0, 1.0, 0.04])
    se = per_system.std(0, ddof=1) / math.sqrt(x.shape[0])
    assert (np.abs(per_system.mean(0) - truth) < 4.5 * se).all(), (per_system.mean(0), se)
    pre = res.summary["preconditioner"]
    assert pre["kind"] == "dense"
    assert all(20 < c < 400 for c in pre["condition_number"])  # (true 140)
    assert (np.array(res.summary["step_size"]) > 0.3).all()  # whitened (0.1-0.2 without)


def test_an_interrupted_automala_run_resumes_to_the_same_draws(tmp_path, monkeypatch):
    # the base-step adaptor's sums over the selected steps travel in the checkpoint: a run cut
    # in the middle of a round and resumed gives the uninterrupted run's draws and steps
    import os
    import signal

    from nrpt.recorders.draws import Draws

    opts = dict(target="gaussian", rounds=5, chains=3, systems=2, seed=6, explorer="automala",
                figures=False, checkpoint_every=5)
    full = nrpt.sample(out=str(tmp_path / "full"), **opts)
    calls = {"n": 0}
    record = Draws.record

    def stop_in_round_three(self, it):
        calls["n"] += 1
        if calls["n"] == 9:  # rounds of 2, 4, 8, ...: iteration 9 lies inside round three
            os.kill(os.getpid(), signal.SIGINT)
        record(self, it)

    monkeypatch.setattr(Draws, "record", stop_in_round_three)
    # SIGINT as a foreground process has it: a suite started in the background by a shell
    # inherits SIGINT ignored, nrpt keeps an ignored signal ignored, and the run would not stop
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        part = nrpt.sample(out=str(tmp_path / "cut"), **opts)
    finally:
        signal.signal(signal.SIGINT, old)
    assert part.summary["interrupted"]
    monkeypatch.setattr(Draws, "record", record)
    resumed = nrpt.resume(tmp_path / "cut")
    np.testing.assert_array_equal(np.asarray(resumed.samples), np.asarray(full.samples))
    np.testing.assert_array_equal(resumed.summary["step_size"], full.summary["step_size"])
