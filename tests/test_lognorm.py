"""Stepping-stone log normalizing constants (nrpt.lognorm): the streaming log-sum-exp, the
``log_z`` recorder on fixed schedules against closed forms, energies of order 10^6, and ratios.

Statistical checks use R independent PT systems (the engine's system axis): each gives one
estimate, the standard error is sd / sqrt(R), and |mean - truth| < 4.5 se (for R = 8, a t_7
tail probability of about 3e-3; seeds are fixed).  The stepping-stone estimator has an O(1/n)
bias, far below se ~ 1/sqrt(n R) at these sizes.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import nrpt
from nrpt.lognorm import SteppingStone, StreamingLogSumExp
from nrpt.loop import Plan, Run, Segment, execute
from nrpt.targets import Gaussian
from nrpt.targets.gaussian_path import ScaledGaussianPath, ShiftedGaussianPath

Z = 4.5
R = 8


def test_streaming_logsumexp_matches_batch_logsumexp():
    g = torch.Generator().manual_seed(0)
    terms = 1e6 * torch.randn(300, 3, 4, generator=g, dtype=torch.float64)
    terms[:50, 0, 0] = -math.inf  # weight-0 terms before any finite one
    terms[:, 1, 1] = -math.inf  # an entry that only ever sees weight 0
    acc = StreamingLogSumExp((3, 4))
    for t in terms:
        acc.add(t)
    expected = torch.logsumexp(terms, 0)
    got = acc.value()
    assert got[1, 1] == -math.inf
    mask = torch.isfinite(expected)
    torch.testing.assert_close(got[mask], expected[mask], rtol=1e-14, atol=0)
    assert acc.n == 300 and int(acc.invalid.sum()) == 0
    torch.testing.assert_close(acc.log_mean()[mask], (expected - math.log(300))[mask])


def test_streaming_logsumexp_skips_and_counts_invalid_terms():
    acc = StreamingLogSumExp((2,))
    for t in ([0.0, math.nan], [math.inf, 1.0], [0.0, 1.0]):
        acc.add(torch.tensor(t, dtype=torch.float64))
    assert acc.invalid.tolist() == [1, 1]
    torch.testing.assert_close(acc.value(), torch.tensor([math.log(2.0), 1.0 + math.log(2.0)],
                                                         dtype=torch.float64))


def test_reading_the_estimate_mid_stream_does_not_change_its_bits():
    """A report row read between chunks must not regroup the terms: a run read at other times
    (resumed, extended) has to end with the same bits.  Negative control: the grouping does
    matter at this scale, so the check can fail."""
    g = torch.Generator().manual_seed(3)
    terms = 30.0 * torch.randn(200, 5, generator=g, dtype=torch.float64)
    quiet, read = StreamingLogSumExp((5,), chunk=64), StreamingLogSumExp((5,), chunk=64)
    for i, t in enumerate(terms):
        quiet.add(t)
        read.add(t)
        if i in (10, 99, 150):
            read.value(), read.invalid, read.zeros, read.log_mean()
    assert torch.equal(quiet.value(), read.value())
    regrouped = StreamingLogSumExp((5,), chunk=64)
    for i, t in enumerate(terms):
        regrouped.add(t)
        if i in (10, 99, 150):
            regrouped._flush()  # what a read did before
    assert not torch.equal(quiet.value(), regrouped.value())


def run_fixed(target, betas, iterations=600, seed=1, step=0.8):
    """PT on a fixed geometric schedule with the ``log_z`` recorder, through the run loop: a
    burn-in segment, then the main segment, whose start resets the recorder (the estimates
    use only the main segment's iterations, started in (near) stationarity)."""
    path = nrpt.GeometricPath(betas)
    eng = nrpt.PTEngine(target, path, nrpt.make_explorer("rwmh"), nrpt.make_scheme("deo"),
                        nrpt.make_rule("metropolis"), step_size=step, systems=R, seed=seed)
    stone = SteppingStone(R, path.n_slots, reference_normalized=True)
    plan = Plan((Segment("burn-in", 100, sample=False), Segment("main", iterations)))
    execute(Run(engine=eng, adaptors=[], recorders={stone.name: stone}, plan=plan))
    assert stone.n == iterations
    return {k: v.numpy() for k, v in stone.estimate().items()}


def check(values: np.ndarray, truth: float) -> float:
    se = values.std(ddof=1) / math.sqrt(len(values))
    return abs(values.mean() - truth) / se


@pytest.mark.parametrize("target,betas", [
    (ShiftedGaussianPath(dim=2, shift=3.0), np.linspace(1.0, 0.0, 7)),
    (ScaledGaussianPath(dim=5, c=9.0), ScaledGaussianPath(dim=5, c=9.0).optimal_schedule(6)),
])
def test_log_normalizer_and_per_slot_values_match_closed_forms(target, betas):
    est = run_fixed(target, list(betas))
    assert check(est["log_normalizer"], target.log_normalizer) < Z
    # both halves estimate the same quantity
    assert check(est["forward"], target.log_normalizer) < Z
    assert check(est["reverse"], target.log_normalizer) < Z
    # per slot: log Z(beta_p) - log Z(0) = log Z(beta_p)
    for p in range(1, len(betas) - 1):
        assert check(est["per_slot"][:, p], target.log_normalizer_at(betas[p])) < Z
    # negative control: the test has the power to see a 20% error in log Z
    assert check(est["log_normalizer"], 0.8 * target.log_normalizer) > Z


def test_energies_of_order_a_million_do_not_overflow():
    # offset -1e6 in the log-likelihood shifts every term by (beta_p - beta_{p+1}) * -1e6 and
    # log Z by exactly -1e6; the estimates of the two runs (same seed) differ by that shift
    betas = list(np.linspace(1.0, 0.0, 6))
    plain = run_fixed(ScaledGaussianPath(dim=3, c=4.0), betas, iterations=200)
    big = run_fixed(ScaledGaussianPath(dim=3, c=4.0, offset=-1e6), betas, iterations=200)
    for key in ("log_normalizer", "forward", "reverse"):
        assert np.all(np.isfinite(big[key]))
        np.testing.assert_allclose(big[key] - plain[key], -1e6, atol=1e-4)


def test_temperature_ladder_gives_the_ratio_of_normalizing_constants():
    # pi ∝ exp(-b U) with U = |x|^2 / 2 in d dims: Z(b) = (2 pi / b)^(d/2), so
    # log Z(1) - log Z(b_min) = (d/2) log(b_min)
    d, temps = 3, [1.0, 2.0, 4.0, 8.0, 16.0]
    target = Gaussian(np.zeros(d), np.eye(d))
    path = nrpt.TemperatureLadder(temps)
    eng = nrpt.PTEngine(target, path, nrpt.make_explorer("rwmh"), nrpt.make_scheme("deo"),
                        nrpt.make_rule("metropolis"),
                        step_size=[1.2 * math.sqrt(t) for t in temps], systems=R, seed=4)
    stone = SteppingStone(R, path.n_slots, reference_normalized=False)
    for _ in range(100):  # burn-in, not recorded
        eng.step()
    stone.start_segment(True, 800)
    for _ in range(800):  # the recorder contract by hand: record every iteration
        stone.record(eng.step())
    assert stone.n == 800
    est = stone.estimate()["log_normalizer"].numpy()
    assert check(est, 0.5 * d * math.log(1 / 16)) < Z


def test_recorder_state_round_trips_through_a_state_dict_and_summarizes():
    stone = SteppingStone(2, 3, reference_normalized=True)
    stone.forward.add(torch.ones(2, 2, dtype=torch.float64))
    stone.reverse.add(torch.zeros(2, 2, dtype=torch.float64))
    other = SteppingStone(2, 3, reference_normalized=True)
    other.load_state_dict(stone.state_dict())
    for k, v in stone.estimate().items():
        torch.testing.assert_close(other.estimate()[k], v)
    # forward: log(Z_p / Z_{p+1}) = 1 per pair, reverse: 0 -> log Z = (2 + 0) / 2 = 1
    s = other.summary()
    assert s["log_normalizer"] == [1.0, 1.0] and s["log_normalizer_kind"] == "log Z"
    assert s["log_normalizer_forward"] == [2.0, 2.0] and s["log_normalizer_reverse"] == [0, 0]
    assert other.segment_row() == {"log_normalizer": 1.0}
    # a segment that resets starts fresh statistics (a new round's schedule)
    other.start_segment(False, 10)
    assert other.n == 1
    other.start_segment(True, 10)
    assert other.n == 0


class CountingShifted(ShiftedGaussianPath):
    """Counts reference draws (the initial states are one call)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.draws = 0

    def reference_sample(self, n, generator):
        self.draws += 1
        return super().reference_sample(n, generator)


def test_a_ladder_stopping_short_of_the_reference_estimates_the_ratio_without_iid_draws():
    """A geometric ladder whose hottest beta is > 0 (other tools' ladders end at, say, 1e-3)
    is explored by local moves alone (no iid refresh of the last slot) and the stepping stone
    gives log Z(1) - log Z(beta_min); negative control: that is measurably not log Z(1)."""
    target = CountingShifted(dim=2, shift=3.0)
    betas = [1.0, 0.85, 0.7, 0.55, 0.45, 0.35]
    path = nrpt.GeometricPath(betas)
    assert not path.has_reference and nrpt.GeometricPath([1.0, 0.5, 0.0]).has_reference
    est = run_fixed(target, betas, iterations=1500)
    assert target.draws == 1  # the initial states only
    truth = target.log_normalizer_at(1.0) - target.log_normalizer_at(betas[-1])
    assert check(est["log_normalizer"], truth) < Z
    assert check(est["log_normalizer"], target.log_normalizer_at(1.0)) > Z
    for bad in ([1.0, 0.5, -0.1], [1.0, 0.5, 1.0]):
        with pytest.raises(ValueError, match="betas"):
            nrpt.GeometricPath(bad)


def test_a_run_on_a_ladder_stopping_short_says_log_z_is_a_ratio():
    res = nrpt.sample("geometric-shifted-gaussian-path", chains=4, iterations=300,
                      betas=[1.0, 0.5, 0.1, 0.01], explorer="rwmh")
    assert res.summary["log_normalizer_kind"] == "ratio"
    assert "beta = 0.01 > 0" in res.summary["log_normalizer_note"]
