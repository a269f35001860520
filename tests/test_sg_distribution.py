"""Stochastic-gradient PT samples the right distribution: slot-0 draws against exact densities.

* DEO*-SGD (the paper's headline run) on the 25-mode target: the total-variation distance of the
  slot-0 histogram to the exact cell probabilities (``nrpt.run.sgpt.grid_errors``), with a bar
  derived from the i.i.d. floor (``nrpt.run.sgpt.iid_floor``) and DEO*-SGD's own bias;
* minibatch and variance-reduced (control-variate) SGLD-PT with the bias-corrected rule on data
  targets with known posteriors: a conjugate Gaussian mean (mean and variance) and the
  VR-reSGLD mixture-mean model with a prior (mode mass, mean, second moment).

Tolerances are Monte Carlo standard errors from ``R`` independent systems run as one batched
engine (the per-system statistics are iid replicates), plus a stated allowance where the
sampler has a known bias.  Every test has a negative control that the same check rejects.
Default-suite versions take ~10-30 s; the longer, tighter versions are marked ``slow``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import nrpt
from nrpt.run.sgpt import HEADLINE, grid_errors, iid_floor
from nrpt.targets import TwentyFiveModes
from nrpt.targets.minibatch import MinibatchTarget, MixtureMeanModel

N_SE = 4.0  # tolerances: 4 standard errors (two-sided false-alarm rate 6e-5 per check)


def se(values: np.ndarray) -> float:
    """Standard error of the mean of per-system values (iid across systems)."""
    return float(np.std(values, ddof=1) / math.sqrt(len(values)))


# ------------------------------------------------------------------ DEO*-SGD on 25 modes
# One cell per mode: an 11 x 11 grid on [-5.5, 5.5]^2 (cells centred on the integer points).
GRID = dict(lim=5.5, bins=11)
# DEO*-SGD is not an exact sampler: the deterministic rule U_hi + C < U_lo sends the lower energy
# down greedily, so slot 0 over-weights the central modes (the paper's Fig. 3: S = 0.4 is the
# best trade-off, not exact).  Its bias on this grid, TV(E histogram, exact), measured as the
# pooled TV of 8 systems x 18,000 draws of the headline run: 0.123.
DEO_STAR_BIAS = 0.12
# Slot-0 draws are correlated: the noise of n draws is taken as that of n / 40 iid draws
# (integrated autocorrelation times of the mode indicators measured at 15-45 iterations, the
# ESS of the coordinates at n / 12).
TAU = 40


def headline_slot0(iterations, systems, burn_in, seed, **over):
    opts = {k: v for k, v in HEADLINE.items() if k != "target"}
    opts["target_options"] = dict(opts["target_options"])
    opts.update(iterations=iterations, systems=systems, seed=seed, figures=False, **over)
    res = nrpt.sample(HEADLINE["target"], **opts)
    return res, res.samples[:, burn_in:].reshape(-1, 2)


def check_headline_tv(iterations, systems, burn_in, seed):
    target = TwentyFiveModes(penalty=True)
    xs, ys, probs = target.density_grid(**GRID)
    res, x = headline_slot0(iterations, systems, burn_in, seed)
    assert res.summary["explorer"] == "sgd" and res.summary["rule"] == "deterministic"
    n = len(x)
    # triangle inequality: TV(histogram, exact) <= TV(histogram, E histogram) + bias
    bar = DEO_STAR_BIAS + iid_floor(n // TAU, xs, ys, probs)["tv"]
    tv = grid_errors(x, xs, ys, probs)["tv"]
    assert tv < bar, (tv, bar)
    # negative control: the same run without swaps (parallel SGLD at slot 0, started in
    # [-1, 1]^2) never reaches the outer modes
    _, x_off = headline_slot0(iterations, systems, burn_in, seed, scheme="none", window=None)
    # (short runs: ~0.5; the long run's 8 x 20,000 draws of slow SGLD reach more of the outer
    # modes: 0.22 before today's changes, 0.25 now, against a bar of 0.17-0.18, so the margin
    # is 0.05: the +0.1 it had failed there before and after)
    tv_off = grid_errors(x_off, xs, ys, probs)["tv"]
    assert tv_off > bar + 0.05, (tv_off, bar)
    return tv, bar


def test_deo_star_sgd_slot0_histogram_is_within_tv_of_the_25_modes():
    # 4 systems x 4000 kept draws: TV ~0.16-0.20, bar 0.12 + floor(400) = 0.26; swaps off ~0.5
    check_headline_tv(iterations=5000, systems=4, burn_in=1000, seed=1)


@pytest.mark.slow
def test_deo_star_sgd_slot0_histogram_is_within_tv_of_the_25_modes_long():
    # the paper's 20,000 iterations, 8 systems: bar 0.12 + floor(3600) = 0.17
    tv, bar = check_headline_tv(iterations=20_000, systems=8, burn_in=2000, seed=11)
    assert bar < 0.18


# ------------------------------------------------------------------ conjugate Gaussian mean
class GaussianMean:
    """d_i ~ N(1, 1), i = 1..N, loss (d_i - x)^2 / 2, prior N(0, 1): the posterior is
    N(m, 1 / A) with A = N + 1, m = sum d / A.  With minibatches of n (without replacement)
    the SGLD gradient is A (x - m) + xi, xi independent of x with variance
    Vg = (N / n)^2 n sigma_pop^2 (N - n) / (N - 1), so SGLD at temperature T and rate eta has
    the exact stationary variance (2 eta T + eta^2 Vg) / (eta A (2 - eta A))."""

    N, n = 50, 10

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.data = 1.0 + torch.randn(self.N, 1, generator=g, dtype=torch.float64)
        self.A = self.N + 1.0
        self.mean = float(self.data.sum()) / self.A
        sigma2 = float(self.data.var(unbiased=False))
        self.Vg = (self.N / self.n) ** 2 * self.n * sigma2 * (self.N - self.n) / (self.N - 1)

    def target(self):
        return MinibatchTarget(self.data, lambda x, b: 0.5 * (b[..., 0] - x[:, :1]) ** 2,
                               dim=1, prior_energy=lambda x: 0.5 * x[:, 0] ** 2,
                               name="gaussian-mean")

    def sgld_variance(self, eta, T=1.0):
        return (2 * eta * T + eta**2 * self.Vg) / (eta * self.A * (2 - eta * self.A))


GAUSS_LR = [2e-4, 3e-4, 4.5e-4, 7e-4]


def gaussian_run(model, systems, iterations, burn_in, **options):
    res = nrpt.sample(model.target(), explorer="sgld", chains=4,
                      temperatures=[1.0, 2.0, 4.0, 8.0], learning_rates=GAUSS_LR,
                      batch_size=model.n, iterations=iterations, systems=systems, seed=1,
                      figures=False, **options)
    x = res.samples[:, burn_in:, 0]
    # per system: the mean, and the mean squared distance to the exact posterior mean (unbiased
    # for the stationary variance; no autocorrelation bias unlike a per-chain sample variance)
    return res, x.mean(1), ((x - model.mean) ** 2).mean(1)


def check_gaussian_minibatch(systems, iterations, burn_in):
    model = GaussianMean()
    res, means, sq = gaussian_run(model, systems, iterations, burn_in)
    assert res.summary["energy"] == "minibatch" and res.summary["rule"] == "bias-corrected"
    assert abs(means.mean() - model.mean) < N_SE * se(means)
    # the minibatch energy noise (sd ~10) makes the corrected rule refuse nearly every swap at
    # pair 0, so slot 0 is the SGLD kernel at eta_0: its exact stationary variance is
    # 1.028 / A (discretization and minibatch-gradient noise)
    want = model.sgld_variance(GAUSS_LR[0])
    assert abs(sq.mean() - want) < N_SE * se(sq), (sq.mean() * model.A, want * model.A)
    assert abs(want * model.A - 1) < 0.03  # and that is the posterior's 1 / A within 3%
    # negative control: the naive noisy Metropolis rule accepts half the swaps and lets hot
    # replicas into slot 0: the variance is ~2.6 / A
    _, _, sq_naive = gaussian_run(model, systems, iterations, burn_in, swap_rule="metropolis")
    assert sq_naive.mean() - want > N_SE * se(sq_naive) + 0.1 * want


def test_minibatch_sgld_pt_matches_a_conjugate_gaussian_posterior():
    # 128 systems x 1500 kept draws: se of the variance ~3.5%
    check_gaussian_minibatch(systems=128, iterations=2000, burn_in=500)


@pytest.mark.slow
def test_minibatch_sgld_pt_matches_a_conjugate_gaussian_posterior_long():
    check_gaussian_minibatch(systems=512, iterations=4500, burn_in=500)


# ------------------------------------------------------------------ mixture-mean posterior
def mixture_model():
    """The VR-reSGLD mixture-mean model with N = 20 data and a N(0, 15^2) prior: bimodal,
    modes near -5 and 25 with masses ~0.78 / 0.22 (the prior breaks the mu <-> 20 - mu
    symmetry).  Exact moments from its density grid."""
    model = MixtureMeanModel(n_data=20, prior_sd=15.0)
    edges, probs = model.density_grid()
    mids = 0.5 * (edges[1:] + edges[:-1])
    mean = float((probs * mids).sum())
    exact = {"right": float(probs[mids > 10].sum()), "mean": mean,
             "second": float((probs * (mids - mean) ** 2).sum())}
    return model, exact


MIXTURE_RUN = dict(explorer="sgld", chains=6, max_temperature=50.0, batch_size=5,
                   learning_rates=[0.01, 0.02, 0.04, 0.08, 0.16, 0.32])


def mixture_run(model, exact, systems, iterations, burn_in, **options):
    """Per-system mode mass P(mu > 10), mean, and mean squared distance to the exact mean."""
    opts = dict(MIXTURE_RUN, iterations=iterations, systems=systems, figures=False, seed=1)
    opts.update(options)
    res = nrpt.sample(model, **opts)
    x = res.samples[:, burn_in:, 0]
    stats = {"right": (x > 10).mean(1), "mean": x.mean(1),
             "second": ((x - exact["mean"]) ** 2).mean(1)}
    return res, stats


def assert_matches(stats, exact):
    for key, values in stats.items():
        assert abs(values.mean() - exact[key]) < N_SE * se(values), (key, values.mean(),
                                                                      se(values), exact[key])


def check_mixture(systems, iterations, burn_in, vr_every):
    model, exact = mixture_model()  # right 0.221, mean 2.04, second 139.5
    extra = {"vr_every": vr_every} if vr_every else {}
    res, stats = mixture_run(model, exact, systems, iterations, burn_in, **extra)
    assert res.summary["rule"] == "bias-corrected"
    assert res.summary["energy"] == ("control-variate" if vr_every else "minibatch")
    assert_matches(stats, exact)
    # negative control: without swaps no replica leaves the left mode (starts in [-8, -2])
    _, off = mixture_run(model, exact, 16, iterations, burn_in, scheme="none", **extra)
    assert off["right"].max() == 0.0
    return res, stats, model, exact


def test_minibatch_sgld_pt_samples_the_mixture_mean_posterior():
    # 64 systems x 2500 kept draws: se of the mode mass ~0.008
    _, _, model, exact = check_mixture(systems=64, iterations=3000, burn_in=500, vr_every=0)
    # negative control: the naive noisy Metropolis rule (no sigma^2) over-weights the light
    # mode: P(mu > 10) ~ 0.33 instead of 0.22
    _, naive = mixture_run(model, exact, 64, 3000, 500, swap_rule="metropolis")
    assert naive["right"].mean() - exact["right"] > N_SE * se(naive["right"]) + 0.03


@pytest.mark.slow  # 8 s; the control-variate estimator's unbiasedness is in test_sg_energy.py
def test_variance_reduced_sgld_pt_samples_the_mixture_mean_posterior():
    res, _, _, _ = check_mixture(systems=64, iterations=3000, burn_in=500, vr_every=2)
    # the control variate does its job: a smaller energy variance and many more swaps at the
    # bottom pair than the plain minibatch energy allows (~0.7 vs ~0.13)
    assert res.summary["variance_reduction"] > 2
    acc = np.asarray(res.summary["swap_acceptance"], dtype=float)
    assert acc[:, 0].mean() > 0.5


@pytest.mark.slow
@pytest.mark.parametrize("vr_every", [0, 2], ids=["minibatch", "control-variate"])
def test_sgld_pt_samples_the_mixture_mean_posterior_long(vr_every):
    check_mixture(systems=256, iterations=6000, burn_in=500, vr_every=vr_every)


@pytest.mark.slow
# regression: the sigma^2 window used to default to 100 iterations whatever vr_every was; with
# vr_every = 10 that over-corrected early in each refresh cycle (P(mu > 10) ~0.156 vs 0.221).
# variance_every now defaults to vr_every for control-variate energies.
def test_control_variate_with_the_default_variance_window_is_unbiased():
    model, exact = mixture_model()
    _, stats = mixture_run(model, exact, 64, 3000, 500, vr_every=10)
    assert_matches(stats, exact)
