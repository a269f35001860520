"""Adaptive rounds against closed forms: the analytic Gaussian paths' formulas themselves, then
the barrier, the swap rejection sums, log Z and the Method I local barrier estimated by
round-based NRPT, and the equalization of the rejection rates round over round.

Tolerances come from Monte Carlo error: R = 8 independent PT systems (the engine's system
axis, each adapting its own schedule) give R estimates; se = sd / sqrt(R), and a check passes
when |mean - truth| < 4.5 se (a t_7 tail probability of about 3e-3; the seeds are fixed).
Where the truth depends on the schedule a system ended with (the finite-P sum of rejection
rates), the truth is computed exactly per system and the differences are tested.  The global
barrier Lambda differs from a finite-P sum of rejections by a discretization error that is
also known exactly here (sum of the exact rates on the schedule minus Lambda), and is added
to the tolerance.  Each check has a negative control (a wrong truth that must be rejected).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import pytest
from scipy import integrate, special

import nrpt
from nrpt.adapt import ScheduleAdaptor
from nrpt.core.loop import Plan, Run, execute
from nrpt.diagnostics import theory
from nrpt.recorders.stats import RoundTrips, SwapStats
from nrpt.roles import AdaptorBase
from nrpt.targets import Gaussian
from nrpt.targets.gaussian_path import ScaledGaussianPath, ShiftedGaussianPath

Z = 4.5
R = 8


def zscore(values, truth) -> float:
    values = np.asarray(values, dtype=float)
    se = values.std(ddof=1) / math.sqrt(len(values))
    return float(abs(values.mean() - np.mean(truth)) / se)


# ------------------------------------------------------------------ the closed forms
@pytest.mark.parametrize("target", [ScaledGaussianPath(1, 3.0), ScaledGaussianPath(4, -0.6),
                                    ScaledGaussianPath(12, 20.0), ShiftedGaussianPath(3, 2.5)])
def test_closed_forms_agree_with_monte_carlo_and_quadrature(target):
    rng = np.random.default_rng(7)
    n = 100_000
    d = target.dim
    b1, b2 = 0.7, 0.35

    def draws(beta):
        if isinstance(target, ScaledGaussianPath):
            return rng.standard_normal((n, d)) / math.sqrt(1 + target.c * beta)
        return rng.standard_normal((n, d)) + beta * target.mu.numpy()

    def loglik(x):
        import torch

        return target.log_likelihood(torch.from_numpy(x)).numpy()

    # swap rejection: 1 - E min(1, exp((b1 - b2)(l(Y) - l(X)))), X ~ pi_b1, Y ~ pi_b2
    acc = np.exp(np.minimum(0.0, (b1 - b2) * (loglik(draws(b2)) - loglik(draws(b1)))))
    assert abs(1 - acc.mean() - target.swap_rejection(b1, b2)) < Z * acc.std() / math.sqrt(n)
    # Method I definition of the local barrier: (1/2) E|l(X) - l(Y)|, X, Y iid pi_beta
    diff = 0.5 * np.abs(loglik(draws(b2)) - loglik(draws(b2)))
    assert abs(diff.mean() - target.local_barrier(b2)) < Z * diff.std() / math.sqrt(n)
    # lambda is the rejection rate per unit of beta, and Lambda its integral
    h = 1e-6
    assert target.swap_rejection(b2 + h, b2) / h == pytest.approx(target.local_barrier(b2),
                                                                   rel=1e-4)
    integral, _ = integrate.quad(lambda b: target.local_barrier(b), 0.0, b1)
    assert integral == pytest.approx(target.barrier_at(b1), rel=1e-8)
    # log Z(beta) = log E_ref[exp(beta l(X))], by quadrature over the radius / the projection
    if isinstance(target, ScaledGaussianPath):
        log_chi2 = lambda s: ((d / 2 - 1) * np.log(s) - s / 2  # noqa: E731
                              - d / 2 * math.log(2) - special.gammaln(d / 2))
        val, _ = integrate.quad(lambda s: np.exp(log_chi2(s) - b1 * target.c * s / 2), 0, np.inf)
    else:
        m = target.shift
        val, _ = integrate.quad(lambda t: np.exp(-t * t / 2 + b1 * m * t) / math.sqrt(2 * math.pi),
                                -np.inf, np.inf)
    assert math.log(val) == pytest.approx(target.log_normalizer_at(b1), rel=1e-8)


def test_large_dimension_barrier_grows_like_sqrt_d():
    t = ScaledGaussianPath(400, 10.0)
    assert t.kappa == pytest.approx(math.sqrt(400 / (2 * math.pi)), rel=1e-3)


# ------------------------------------------------------------------ adaptive rounds
@dataclass
class RoundStats:
    """What one round measured, per system (leading axis ``R``)."""

    iterations: int
    schedule: np.ndarray  # [R, P] the coefficients b used during the round
    step_size: np.ndarray  # [R, P]
    rejection: np.ndarray  # [R, P-1]
    explorer_acceptance: np.ndarray  # [R, P]
    restarts: np.ndarray  # [R]
    log_normalizer: np.ndarray | None  # [R]
    method_one: np.ndarray | None  # [R, P]

    @property
    def barrier(self) -> np.ndarray:
        return np.nansum(self.rejection, axis=1)

    def predicted_restart_rate(self) -> np.ndarray:
        """Finite-P DEO restart rate 1 / (2 + 2 sum r/(1-r)) per system (Syed et al. Thm 1)."""
        return np.array([theory.predicted_restart_rate(np.clip(np.nan_to_num(r), 0, 1))
                         for r in self.rejection])


class RoundLog(AdaptorBase):
    """An adaptor that changes nothing: at the end of every round it keeps the round's
    per-system statistics from the recorders (the rows of a run hold means over systems)."""

    name = "round-log"

    def __init__(self):
        self.rounds: list[RoundStats] = []

    def end_segment(self, view):
        rec = view.recorders
        np_ = lambda t: t.detach().cpu().double().numpy().copy()  # noqa: E731
        swaps = rec["swaps"]
        self.rounds.append(RoundStats(
            iterations=view.iterations, schedule=np_(view.schedule),
            step_size=np_(view.step_size), rejection=np_(swaps.rejection()),
            explorer_acceptance=np_(swaps.explorer_acceptance()),
            restarts=np_(rec["round_trips"].counts()["restarts"]),
            log_normalizer=np_(rec["log_z"].estimate()["log_normalizer"]) if "log_z" in rec
            else None,
            method_one=rec["slot_energies"].local_barrier() if "slot_energies" in rec
            else None))
        return None


def rounds_with_log(target, **options) -> tuple[list[RoundStats], list[dict]]:
    """``nrpt.sample(target, rounds=..., **options)`` assembled by the builder and executed by
    the run loop, with a :class:`RoundLog` after the run's own adaptors; returns the per-round
    statistics and the run's rows."""
    cfg = nrpt.RunConfig(target=getattr(target, "name", type(target).__name__), **options)
    run = nrpt.build(cfg, target=target)
    log = RoundLog()
    run.adaptors.append(log)
    outcome = execute(run)
    assert len(log.rounds) == len(outcome.rows) == cfg.rounds
    for st, row in zip(log.rounds, outcome.rows, strict=True):  # the rows agree
        assert np.array_equal(np.asarray(row["b"]), st.schedule)
        assert row["barrier"] == pytest.approx(st.barrier.mean(), rel=1e-12)
    return log.rounds, outcome.rows


@functools.cache
def adaptive_run(kind: str, dim: int, chains: int, explorer: str, rounds: int = 8,
                 seed: int = 1):
    target = (ScaledGaussianPath(dim, 9.0) if kind == "scaled"
              else ShiftedGaussianPath(dim, 3.0))
    stats, _ = rounds_with_log(target, rounds=rounds, chains=chains, systems=R, seed=seed,
                               explorer=explorer, step_size=0.5, figures=False)
    return target, stats


CONFIGS = [("scaled", 2, 5, "slice"), ("scaled", 8, 10, "rwmh"), ("shifted", 3, 6, "mala")]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c[0]}-d{c[1]}-P{c[2]}-{c[3]}")
def test_rejection_sums_match_the_exact_rates_of_the_adapted_schedules(config):
    target, stats = adaptive_run(*config)
    last = stats[-1]
    exact = np.array([target.rejections(last.schedule[s]).sum() for s in range(R)])
    assert zscore(last.barrier - exact, 0.0) < Z
    # negative control: the exact sums of a 30% steeper path are rejected
    steeper = (ScaledGaussianPath(target.dim, 1.3 * target.c) if config[0] == "scaled"
               else ShiftedGaussianPath(target.dim, 1.3 * target.shift))
    wrong = np.array([steeper.rejections(last.schedule[s]).sum() for s in range(R)])
    assert zscore(last.barrier - wrong, 0.0) > Z


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c[0]}-d{c[1]}-P{c[2]}-{c[3]}")
def test_global_barrier_and_log_z_match_the_closed_forms(config):
    target, stats = adaptive_run(*config)
    last = stats[-1]
    exact_sums = np.array([target.rejections(last.schedule[s]).sum() for s in range(R)])
    discretization = abs(exact_sums.mean() - target.barrier)
    se = last.barrier.std(ddof=1) / math.sqrt(R)
    assert abs(last.barrier.mean() - target.barrier) < Z * se + discretization
    assert discretization < 0.1 * target.barrier  # the adapted ladders are fine enough
    assert zscore(last.log_normalizer, target.log_normalizer) < Z
    # negative controls: a 30% larger barrier, a 20% smaller |log Z|
    assert abs(last.barrier.mean() - 1.3 * target.barrier) > Z * se + discretization
    assert zscore(last.log_normalizer, 0.8 * target.log_normalizer) > Z


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c[0]}-d{c[1]}-P{c[2]}-{c[3]}")
def test_method_one_local_barrier_matches_lambda(config):
    target, stats = adaptive_run(*config)
    last = stats[-1]
    # per system and slot: Method I estimate / exact lambda at that slot's beta; ratios of the
    # R systems at one slot are independent replicates with mean 1
    ratio = last.method_one / target.local_barrier(last.schedule)
    for p in range(last.schedule.shape[1]):
        assert zscore(ratio[:, p], 1.0) < Z, (p, ratio[:, p])
    assert max(zscore(ratio[:, p], 1.3) for p in range(ratio.shape[1])) > Z  # control


def test_rejection_based_local_barrier_agrees_with_method_one():
    target, stats = adaptive_run("scaled", 8, 10, "rwmh")
    last = stats[-1]
    fits = [nrpt.adapt.fit_barrier(last.schedule[s], last.rejection[s]) for s in range(R)]
    interior = last.schedule[:, 1:-1]
    fitted = np.stack([fits[s].local(interior[s]) for s in range(R)])
    exact = target.local_barrier(interior)
    # a 10-point PCHIP derivative is a coarse estimate: ask for 25% on average over systems
    assert np.all(np.abs(fitted.mean(0) / exact.mean(0) - 1) < 0.25)
    assert np.all(np.abs(last.method_one[:, 1:-1].mean(0) / exact.mean(0) - 1) < 0.25)


def test_adapted_schedule_equalizes_rejections_round_over_round():
    # start from the linear schedule, whose exact rates run from 0.13 to 0.75 (d = 8, c = 9)
    target, stats = adaptive_run("scaled", 8, 10, "rwmh")
    spread = np.array([[np.ptp(target.rejections(st.schedule[s])) for s in range(R)]
                       for st in stats]).mean(1)  # exact spread of each round's schedule
    assert spread[0] > 0.4
    # rounds 1-4 (2 to 16 iterations) adapt from very noisy estimates; from round 4 on (the
    # schedules fitted on >= 16 iterations) the spread shrinks round over round
    assert np.all(np.diff(spread[3:]) < 0), spread
    assert spread[-1] < 0.25 * spread[0]
    # the measured rates agree: the last round's spread is below the first rounds' with data
    measured = np.array([np.ptp(st.rejection, axis=1).mean() for st in stats])
    assert measured[-1] < 0.5 * measured[3], measured
    # and the schedule approaches the analytic optimum
    np.testing.assert_allclose(stats[-1].schedule.mean(0), target.optimal_schedule(10),
                               atol=0.05)


def test_temperature_ladder_adaptation_against_closed_forms():
    # pi_b ∝ exp(-b |x|^2 / 2) = N(0, I / b): the swap rejection between b and b' is the
    # incomplete-beta law with precisions b, b' (module nrpt.targets.gaussian_path), and
    # lambda(b) = kappa_d / b, so Lambda = kappa_d log(tau_max)
    d, tau_max, P = 4, 50.0, 8
    kappa = ScaledGaussianPath(d, 1.0).kappa

    def exact(b):
        b1, b2 = b[:-1], b[1:]
        return 1 - 2 * special.betainc(d / 2, d / 2, np.minimum(b1, b2) / (b1 + b2))

    # start from b = 1/tau equally spaced (the geometric ladder would already be optimal);
    # the run's rows hold each round's schedule, its summary the last round's statistics
    res = nrpt.sample(Gaussian(np.zeros(d), np.eye(d)), rounds=8, chains=P,
                      temperatures=list(1 / np.linspace(1.0, 1 / tau_max, P)), explorer="rwmh",
                      step_size=1.0, systems=R, seed=3, figures=False)
    schedules = np.array([row["b"] for row in res.rows])  # [rounds, R, P]
    assert len(res.rows) == 8 and res.summary["rounds"] == 8
    first, last = schedules[0], schedules[-1]
    assert np.allclose(last[:, -1], 1 / tau_max) and np.allclose(last[:, 0], 1)
    barrier = np.array(res.summary["barrier"])  # the last round's sum of rejections, [R]
    np.testing.assert_allclose(barrier, res.recorders["swaps"].barrier().numpy())
    sums = np.array([exact(last[s]).sum() for s in range(R)])
    assert zscore(barrier - sums, 0.0) < Z
    assert abs(sums.mean() - kappa * math.log(tau_max)) < 0.1 * kappa * math.log(tau_max)
    spread = [np.ptp(exact(sched[s])) for sched in (first, last) for s in range(R)]
    assert np.mean(spread[:R]) > 0.5 and np.mean(spread[R:]) < 0.3 * np.mean(spread[:R])
    # log Z ratio: log Z(1) - log Z(1/tau_max) = -(d/2) log(tau_max)
    log_z = np.array(res.summary["log_normalizer"])
    assert res.summary["log_normalizer_kind"] == "ratio"
    assert zscore(log_z, -0.5 * d * math.log(tau_max)) < Z
    # negative controls: the exact sums of the first (linear) schedule, a 20% smaller ratio
    first_sums = np.array([exact(first[s]).sum() for s in range(R)])
    assert zscore(barrier - first_sums, 0.0) > Z
    assert zscore(log_z, -0.4 * d * math.log(tau_max)) > Z


class ExactDraws(nrpt.explorers.Explorer):
    """Test explorer for ScaledGaussianPath: a fresh exact draw from pi_beta at every step
    ("efficient local exploration", the assumption of Syed et al.'s restart-rate theorem)."""

    name = "exact"

    def __init__(self, c: float):
        self.c = c

    def step(self, state, b, step_size, density, noise, sub=0):
        import torch

        z = noise.normal(sub, (state.x.shape[-1],), state.x.dtype)
        x = z / torch.sqrt(1 + self.c * b)[..., None]
        v, base = density(x)
        one = torch.ones_like(b)
        info = nrpt.explorers.ExploreInfo(one, one.bool(), ~one.bool())
        return nrpt.explorers.ReplicaState(x, v, base), info


def test_observed_restart_rate_matches_the_finite_p_prediction_under_exact_exploration():
    # Under efficient local exploration the DEO restart rate is 1 / (2 + 2 sum r/(1-r))
    # (Syed et al. 2021, Thm. 1).  Per system: observed restarts per iteration of the last round
    # minus the prediction from that round's estimated rates; the R differences have mean 0.
    target = ScaledGaussianPath(10, 10.0)
    engine = nrpt.PTEngine(target, nrpt.GeometricPath.linear(8), ExactDraws(10.0),
                           nrpt.make_scheme("deo"), nrpt.make_rule("metropolis"),
                           step_size=1.0, systems=R, seed=6)
    log = RoundLog()
    recorders = {"swaps": SwapStats(R, 8), "round_trips": RoundTrips(engine.slot_of, 8)}
    execute(Run(engine=engine, adaptors=[ScheduleAdaptor(), log], recorders=recorders,
                plan=Plan.rounds(10)))
    last = log.rounds[-1]
    assert last.iterations == 2**10
    observed = last.restarts / last.iterations
    predicted = last.predicted_restart_rate()
    assert zscore(observed - predicted, 0.0) < Z
    # and both lie below the P -> infinity bound 1 / (2 + 2 Lambda)
    assert observed.mean() < 1 / (2 + 2 * target.barrier)
    # negative control: a prediction that ignores the rejections (1/2) is far off
    assert zscore(observed - 0.5, 0.0) > Z
