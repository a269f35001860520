"""Swap rules for noisy energies (nrpt.swap.noisy) and the SA adaptors (nrpt.adapt_sa)."""

from __future__ import annotations

import math

import pytest
import torch

import nrpt
from nrpt import adapt_sa
from nrpt.sgpt import geometric_ladder
from nrpt.swap import BiasCorrected, Deterministic, Metropolis, SwapContext, make_rule


def ctx(b_lo, b_hi, v_lo, v_hi, u):
    t = lambda a: torch.as_tensor(a, dtype=torch.float64)  # noqa: E731
    return SwapContext(t(b_lo), t(b_hi), t(v_lo), t(v_hi), t(u), 0)


# ------------------------------------------------------------------ bias-corrected rule
def test_bias_corrected_with_exact_energies_is_metropolis():
    g = torch.Generator().manual_seed(0)
    shape = (5, 40)
    b_lo = 1.0 / (1.0 + torch.rand(shape, generator=g, dtype=torch.float64))
    b_hi = b_lo * torch.rand(shape, generator=g, dtype=torch.float64)
    v_lo = 5 * torch.randn(shape, generator=g, dtype=torch.float64)
    v_hi = 5 * torch.randn(shape, generator=g, dtype=torch.float64)
    u = torch.rand(shape, generator=g, dtype=torch.float64)
    c = SwapContext(b_lo, b_hi, v_lo, v_hi, u, 0)
    d1, p1 = BiasCorrected(variance=0.0).decide(c)
    d2, p2 = Metropolis().decide(c)
    assert torch.equal(d1, d2) and torch.equal(p1, p2)


def test_bias_corrected_engine_run_equals_metropolis_run():
    def run(rule):
        eng = nrpt.PTEngine(nrpt.load_target("twenty-five-modes"),
                            nrpt.TemperatureLadder([1.0, 2.0, 4.0, 8.0]),
                            nrpt.make_explorer("rwmh"), nrpt.make_scheme("deo"), rule,
                            step_size=0.4, systems=2, seed=4)
        for _ in range(200):
            eng.step()
        return eng

    a, b = run(make_rule("bias-corrected")), run(Metropolis())
    assert torch.equal(a.state.x, b.state.x) and torch.equal(a.slot_of, b.slot_of)


def test_bias_corrected_ratio_is_unbiased_under_gaussian_energy_noise():
    # E exp(db (U_lo - U_hi + sqrt(2) sigma xi) - db^2 sigma^2) = exp(db (U_lo - U_hi)).
    n, db, sigma, dU = 400_000, 0.5, 1.0, -1.0
    g = torch.Generator().manual_seed(11)
    noise = sigma * torch.randn(2, n, generator=g, dtype=torch.float64)
    c = ctx(torch.full((1, n), 1.0), torch.full((1, n), 1.0 - db), dU + noise[0:1],
            noise[1:2], torch.full((1, n), 0.5))
    rule = BiasCorrected(variance=sigma**2)
    ratio = rule.log_ratio(c).exp()
    exact = math.exp(db * dU)
    # tolerance: 4 Monte Carlo standard errors of the mean of n iid ratios
    se = float(ratio.std()) / math.sqrt(n)
    assert abs(float(ratio.mean()) - exact) < 4 * se
    # negative control: without the correction the ratio is biased by e^{db^2 sigma^2} = 1.28
    naive = (db * (c.v_lo - c.v_hi)).exp()
    assert abs(float(naive.mean()) - exact) > 20 * float(naive.std()) / math.sqrt(n)


def test_bias_corrected_acceptance_is_unbiased_where_the_ratio_stays_below_one():
    # dU = -6, db = 0.5, sigma = 1: P(ratio > 1) = P(xi > 4.6) ~ 2e-6, so the clipped
    # acceptance E min(1, S~) equals E S~ = exp(db dU) = e^-3 up to ~1e-7.
    n, db, sigma, dU = 400_000, 0.5, 1.0, -6.0
    g = torch.Generator().manual_seed(12)
    noise = sigma * torch.randn(2, n, generator=g, dtype=torch.float64)
    u = torch.rand(1, n, generator=g, dtype=torch.float64)
    c = ctx(torch.full((1, n), 1.0), torch.full((1, n), 1.0 - db), dU + noise[0:1],
            noise[1:2], u)
    decision, prob = BiasCorrected(variance=sigma**2).decide(c)
    exact = math.exp(db * dU)
    se = float(prob.std()) / math.sqrt(n)
    assert abs(float(prob.mean()) - exact) < 4 * se
    # the accept/reject draws: binomial standard error
    se_bin = math.sqrt(exact * (1 - exact) / n)
    assert abs(float(decision.double().mean()) - exact) < 4 * se_bin
    # negative control: the uncorrected (naive Metropolis) acceptance overshoots by ~28%
    _, p_naive = Metropolis().decide(c)
    assert float(p_naive.mean()) - exact > 20 * se


def test_bias_corrected_factor_and_per_slot_variances():
    rule = BiasCorrected(variance=2.0, factor=2.0)
    c = ctx([[1.0]], [[0.5]], [[3.0]], [[1.0]], [[0.5]])
    # db = 0.5: 0.5 * 2 - 0.5 * 0.25 * (2 + 2) / 2 = 0.75
    assert float(rule.log_ratio(c)) == pytest.approx(0.75)
    b = torch.tensor([[1.0, 0.5, 0.25]], dtype=torch.float64)
    rule.set_slot_variance(b, torch.tensor([[1.0, 3.0, 5.0]], dtype=torch.float64))
    c2 = ctx([[1.0, 0.5]], [[0.5, 0.25]], [[0.0, 0.0]], [[0.0, 0.0]], [[0.5, 0.5]])
    assert rule.pair_variance(c2).tolist() == [[4.0, 8.0]]


def test_bias_corrected_refuses_sgd_slots():
    c = ctx([[1.0]], [[math.inf]], [[0.0]], [[0.0]], [[0.5]])
    with pytest.raises(ValueError, match="deterministic"):
        BiasCorrected().decide(c)


@pytest.mark.parametrize("bad", [dict(variance=-1.0), dict(factor=0.5)])
def test_bias_corrected_bad_input(bad):
    with pytest.raises(ValueError):
        BiasCorrected(**bad)


# ------------------------------------------------------------------ deterministic rule
def test_deterministic_rule_is_eq7():
    rule = Deterministic(correction=1.0)
    c = ctx([[1.0, 1.0, 1.0]], [[0.5, 0.5, 0.5]], [[3.0, 2.0, 0.0]], [[1.0, 1.0, 1.0]],
            [[0.0, 0.0, 0.0]])
    d, p = rule.decide(c)
    assert d.tolist() == [[True, False, False]]  # 1 + 1 < 3 only; 1 + 1 < 2 is false
    assert p.tolist() == [[1.0, 0.0, 0.0]]
    rule.C = torch.tensor([[-1.5]], dtype=torch.float64)  # per-system tensor
    assert rule.decide(c)[0].tolist() == [[True, True, True]]


# ------------------------------------------------------------------ adaptors
def test_gamma_default_and_window_from_swap_rate():
    gamma = adapt_sa.SAStepSize()
    assert gamma(0) == pytest.approx(0.1) and gamma(1000) == pytest.approx(50 / (1000**0.8 + 500))
    assert adapt_sa.window_from_swap_rate(16, 0.4) == 8  # Algorithm 1 / Fig. 4a optimum
    assert adapt_sa.window_from_swap_rate(3, 0.4) == 1
    for S in (0.0, 1.0, -0.1, 1.5, True):
        with pytest.raises(ValueError, match="swap_rate"):
            adapt_sa.window_from_swap_rate(16, S)


def test_learning_rate_update_is_eq11():
    eta = torch.tensor([[0.1, 0.2, 0.4, 0.8]], dtype=torch.float64)
    S, gam = 0.4, 0.1
    # every pair exactly at S: nothing moves
    A = torch.full((1, 3), S, dtype=torch.float64)
    ones = torch.ones(1, 3, dtype=torch.bool)
    assert torch.allclose(adapt_sa.LearningRateAdaptor.update(eta, A, ones, S, gam), eta)
    # pair 0 swapped (A = 1), the others not: hand-computed forward/backward average
    A = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64)
    new = adapt_sa.LearningRateAdaptor.update(eta, A, ones, S, gam)
    g = [0.1 * math.exp(gam * 0.6), 0.2 * math.exp(-gam * 0.4), 0.4 * math.exp(-gam * 0.4)]
    want = [0.1, 0.5 * (0.1 + 0.4) + 0.5 * (g[0] - g[1]), 0.5 * (0.2 + 0.8) + 0.5 * (g[1] - g[2]),
            0.8]
    assert new[0].tolist() == pytest.approx(want)
    assert new[0, 1] > eta[0, 1]  # the busy pair (0, 1) has its gap widened


def test_learning_rate_adaptor_keeps_ladder_ordered_and_end_points_fixed():
    # adversarial indicator patterns with large steps: the ladder must stay strictly increasing
    g = torch.Generator().manual_seed(3)
    R, P, S = 16, 12, 0.4
    eta = torch.tensor(geometric_ladder(0.003, 0.6, P), dtype=torch.float64).expand(R, P).clone()
    listed = torch.ones(R, P - 1, dtype=torch.bool)
    for k in range(3000):
        mode = k % 3
        if mode == 0:
            A = (torch.rand(R, P - 1, generator=g) < 0.5).double()
        elif mode == 1:  # alternate all-swap / no-swap pairs
            A = (torch.arange(P - 1) % 2 == (k // 3) % 2).double().expand(R, P - 1)
        else:  # one pair always swaps, the others never: squeezes its neighbours' gaps
            A = torch.zeros(R, P - 1, dtype=torch.float64)
            A[:, k % (P - 1)] = 1.0
        gamma = 2.0 if k < 200 else 0.3  # far larger than the default 0.1
        eta = adapt_sa.LearningRateAdaptor.update(eta, A, listed, S, gamma)
        assert bool((eta.diff(dim=1) > 0).all()), f"ladder lost its order at k = {k}"
    assert torch.equal(eta[:, 0], torch.full((R,), 0.003, dtype=torch.float64))
    assert torch.allclose(eta[:, -1], torch.full((R,), 0.6, dtype=torch.float64), rtol=0,
                          atol=0)


def _synthetic_decisions(rule, k, R, M, mu, sd, g):
    """One phase listing M adjacent pairs whose energy gaps v_lo - v_hi ~ N(mu, sd^2)."""
    lo = torch.arange(M).expand(R, M)
    gap = mu + sd * torch.randn(R, M, generator=g, dtype=torch.float64)
    c = SwapContext(torch.ones(R, M, dtype=torch.float64), torch.full((R, M), math.inf),
                    gap, torch.zeros(R, M, dtype=torch.float64),
                    torch.rand(R, M, generator=g, dtype=torch.float64), k)
    d, p = rule.decide(c)
    return [{"lo": lo, "hi": lo + 1, "active": torch.ones_like(d), "decision": d,
             "accepted": d, "prob": p}]


class _FakeEngine:
    def __init__(self, R, P):
        self.R, self.P, self.dtype, self.device = R, P, torch.float64, "cpu"


def test_correction_buffer_converges_to_the_target_swap_rate():
    # Synthetic problem: energy gaps ~ N(1, (2 sqrt 2)^2) (noise sd 2 on each energy), so the
    # deterministic rule swaps with probability P(gap > C) and the root of P(gap > C) = S is
    # C* = 1 + 2 sqrt(2) z_{1-S}.
    from scipy.stats import norm

    R, M, S, mu, sd = 4, 15, 0.4, 1.0, 2.0 * math.sqrt(2.0)
    rule = Deterministic(correction=4.0)
    hook = adapt_sa.CorrectionAdaptor(rule, S)
    eng = _FakeEngine(R, M + 1)
    g = torch.Generator().manual_seed(5)
    K, tail = 8_000, 3_000
    hits = torch.zeros(R, dtype=torch.float64)
    for k in range(K):
        dec = _synthetic_decisions(rule, k, R, M, mu, sd, g)
        hook.after_iteration(eng, k, dec)
        if k >= K - tail:
            hits += dec[0]["decision"].double().mean(1)
    c_star = mu + sd * norm.ppf(1 - S)
    # SA error at the end ~ sqrt(gamma_K / (2 h'(C*))) with gamma_K ~ 0.03, h' = pdf/sd ~ 0.14,
    # and 15 pairs averaged per step: ~0.05; allow 0.25
    assert torch.allclose(rule.C[:, 0], torch.full((R,), c_star, dtype=torch.float64),
                          atol=0.25)
    rate = hits / tail
    # swap rate over the last 3000 iterations x 15 pairs: binomial se ~ 0.003 (+ C jitter)
    assert torch.allclose(rate, torch.full((R,), S, dtype=torch.float64), atol=0.02)
    # negative control: C left at its start value 4 gives a swap rate far from S
    p_start = 1 - norm.cdf((4.0 - mu) / sd)
    assert abs(p_start - S) > 0.2


def test_variance_tracker_feeds_the_bias_corrected_rule():
    from nrpt.sgpt import build_sg_engine

    cfg = nrpt.RunConfig(explorer="sgld", chains=4, iterations=50, noise_sd=2.0,
                         max_temperature=8.0, variance_every=10)
    eng = build_sg_engine(cfg)
    for _ in range(25):
        eng.step()
    rule = eng.rule
    assert isinstance(rule, BiasCorrected)
    # the noisy oracle reports sigma^2 = 4 exactly: every slot's block average is 4
    assert torch.allclose(rule._slot_var, torch.full((1, 4), 4.0, dtype=torch.float64))


def test_optimal_chains_formula():
    lo, hi = adapt_sa.optimal_chains([6.0, 6.0, 6.0], [1.0, 2.0, 4.0, 8.0])
    assert lo == pytest.approx(min(6 / 2, 6 / 4, 6 / 8) / 3 * math.log(8))
    assert hi == pytest.approx(max(6 / 2, 6 / 4, 6 / 8) / 2 * math.log(8))
    with pytest.raises(ValueError):
        adapt_sa.optimal_chains([1.0], [1.0, -2.0])


def test_pair_indicators_for_multi_phase_schemes():
    # ADJ lists one pair per phase: the table is assembled from all phases
    R, P = 2, 4
    decs = []
    for p in range(P - 1):
        lo = torch.full((R, 1), p)
        d = torch.tensor([[p % 2 == 0], [True]])
        decs.append({"lo": lo, "hi": lo + 1, "active": torch.ones_like(d), "decision": d,
                     "accepted": d, "prob": d.double()})
    A, listed = adapt_sa.pair_indicators(decs, R, P)
    assert A.tolist() == [[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]] and bool(listed.all())
    # APE-like phase with a non-adjacent pair: nothing listed for the adaptors
    d = torch.tensor([[True], [True]])
    lo = torch.zeros(R, 1, dtype=torch.long)
    A, listed = adapt_sa.pair_indicators([{"lo": lo, "hi": lo + 2, "active": d, "decision": d,
                                           "accepted": d, "prob": d.double()}], R, P)
    assert not bool(listed.any()) and float(A.sum()) == 0.0
