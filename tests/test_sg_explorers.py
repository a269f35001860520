"""Stochastic-gradient explorers (nrpt.explorers.sgmcmc), reflection (nrpt.explorers.domains) and
the
no-swap driver (nrpt.run.sgpt.run_chains)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import nrpt
from nrpt.energy.estimators import energy_and_grad
from nrpt.explorers import PSGLD, SGD, SGHMC, SGLD, Cyclical, Noise
from nrpt.explorers.domains import Ball, Box, UserDomain, parse_domain
from nrpt.explorers.sgmcmc import cyclical_factor
from nrpt.paths.ladders import NoiseLadder
from nrpt.run.build import build
from nrpt.run.sgpt import run_chains
from nrpt.swap import AlwaysAccept
from nrpt.targets import Gaussian, TwentyFiveModes

COV = torch.tensor([[1.0, 0.5], [0.5, 2.0]], dtype=torch.float64)
MEAN = torch.tensor([1.0, -1.0], dtype=torch.float64)


def chain_moments(samples: np.ndarray, chains: int):
    """Per-chain means and second central moments; returns (estimate, standard error) of the
    mean [2] and covariance [2, 2] with the chains as independent replicates."""
    x = samples.reshape(-1, chains, 2)  # [K, chains, 2]
    m = x.mean(0)  # [chains, 2]
    c = x - x.mean((0, 1))
    cov = np.einsum("kci,kcj->cij", c, c) / x.shape[0]  # [chains, 2, 2]
    se = lambda a: a.std(0, ddof=1) / math.sqrt(chains)  # noqa: E731
    return (m.mean(0), se(m)), (cov.mean(0), se(cov))


class FastGaussian(Gaussian):
    """The same N(MEAN, COV), with the supplied gradient A (x - m) (no autograd)."""

    PRECISION = torch.linalg.inv(COV)

    def grad_energy(self, x):
        return (x - MEAN.to(x.dtype)) @ self.PRECISION.to(x.dtype)


def test_sgld_at_small_step_samples_a_2d_gaussian():
    target = FastGaussian(MEAN, COV)
    eta, chains = 0.05, 256
    samples = run_chains(target, SGLD(), chains=chains, iterations=2000, step_size=eta, seed=1,
                         burn_in=500)[0]
    (mean, mean_se), (cov, cov_se) = chain_moments(samples, chains)
    A = torch.linalg.inv(COV)
    # the Euler-Maruyama (ULA) chain is exactly Gaussian with covariance (A - eta A^2 / 2)^-1
    cov_eta = torch.linalg.inv(A - 0.5 * eta * A @ A).numpy()
    # tolerance: 4 standard errors over 256 independent chains
    assert (np.abs(mean - MEAN.numpy()) < 4 * mean_se).all()
    assert (np.abs(cov - cov_eta) < 4 * cov_se).all()
    # and the target itself, allowing the O(eta) discretization bias |cov_eta - cov|
    bias = np.abs(cov_eta - COV.numpy())
    assert (np.abs(cov - COV.numpy()) < 4 * cov_se + bias).all()
    assert bias.max() < 0.06
    # negative control: the same check rejects a chain at temperature 1.3
    hot = run_chains(target, SGLD(), chains=chains, iterations=2000, step_size=eta, seed=1,
                     burn_in=500, temperature=1.3)[0]
    (_, _), (cov_hot, se_hot) = chain_moments(hot, chains)
    assert not (np.abs(cov_hot - COV.numpy()) < 4 * se_hot + bias).all()


def test_sgd_without_noise_is_deterministic_gradient_descent():
    target = Gaussian(MEAN, COV)
    x0 = torch.tensor([[[3.0, 3.0], [-2.0, 0.0], [0.0, 5.0]]], dtype=torch.float64)
    run = lambda seed: run_chains(target, SGD(), chains=3, iterations=400, step_size=0.2,  # noqa
                                  seed=seed, temperature=0.0, initial_states=x0)
    a, b = run(1), run(2)
    # the noise seed does not matter at temperature 0 with exact gradients ...
    assert np.array_equal(a, b)
    # ... and gradient descent converges to the minimum (the mean)
    assert np.allclose(a[0, -3:], MEAN.numpy(), atol=1e-6)


def test_truncated_gaussian_by_reflected_sgld_on_a_box():
    from scipy.stats import truncnorm

    lo, hi, chains, eta = -0.5, 1.5, 256, 0.01
    target = Isotropic(1.0)
    explorer = SGLD(domain=Box(lo, hi))
    x0 = 0.5 * torch.ones(1, chains, 2, dtype=torch.float64)
    samples = run_chains(target, explorer, chains=chains, iterations=3000, step_size=eta, seed=3,
                         burn_in=500, initial_states=x0)[0]
    assert (samples >= lo).all() and (samples <= hi).all()
    (mean, mean_se), (cov, cov_se) = chain_moments(samples, chains)
    tn = truncnorm(lo, hi)
    # 4 standard errors plus an O(eta) = 0.01 allowance for the discretization
    assert (np.abs(mean - tn.mean()) < 4 * mean_se + 0.01).all()
    assert (np.abs(np.diag(cov) - tn.var()) < 4 * np.diag(cov_se) + 0.01).all()
    assert abs(cov[0, 1]) < 4 * cov_se[0, 1] + 0.01
    # negative control: the untruncated normal's moments are rejected by the same check
    assert not (np.abs(np.diag(cov) - 1.0) < 4 * np.diag(cov_se) + 0.01).all()


def _ellipse():
    a = torch.tensor([2.0, 0.5], dtype=torch.float64)

    def inside(x):
        return ((x / a) ** 2).sum(-1) <= 1.0

    def normal(y):
        return y / a**2

    return inside, normal


@pytest.mark.parametrize("domain", [
    Box(-1.0, 2.0), Box([-1.0, 0.0], [1.0, 0.1]), Ball(1.5), Ball(0.7, centre=[1.0, -1.0]),
    UserDomain(*_ellipse()), UserDomain(_ellipse()[0]),
], ids=["box", "thin-box", "ball", "offset-ball", "ellipse", "ellipse-no-normal"])
def test_a_reflected_step_never_leaves_the_domain(domain):
    g = torch.Generator().manual_seed(7)
    n = 4000
    # points inside: rejection-sample a covering box
    pts = 8 * torch.rand(20 * n, 2, generator=g, dtype=torch.float64) - 4
    x = pts[domain.contains(pts)][:n]
    assert x.shape[0] > 100
    for scale in (0.01, 0.5, 3.0, 50.0):
        y = x + scale * torch.randn(x.shape, generator=g, dtype=torch.float64)
        z = domain.reflect(x, y)
        assert bool(domain.contains(z).all()), f"left the domain at scale {scale}"
        inside = domain.contains(y)
        assert torch.allclose(z[inside], y[inside])  # moves that stay inside are untouched


def test_box_reflection_is_the_mirror_image():
    box = Box(0.0, 1.0)
    x = torch.tensor([[0.5, 0.5]], dtype=torch.float64)
    y = torch.tensor([[1.25, -0.3]], dtype=torch.float64)
    assert torch.allclose(box.reflect(x, y), torch.tensor([[0.75, 0.3]], dtype=torch.float64))
    y = torch.tensor([[2.25, -1.25]], dtype=torch.float64)  # two bounces each
    assert torch.allclose(box.reflect(x, y), torch.tensor([[0.25, 0.75]], dtype=torch.float64))


def test_energy_is_never_evaluated_outside_the_domain():
    class Guarded:
        dim, name = 2, "guarded"

        def energy(self, x):
            if x.abs().max() > 1.0 + 1e-9 and x.shape[0] > 3:  # (3 = the validation probe)
                raise AssertionError("energy evaluated outside the box")
            return TwentyFiveModes().energy(x)

        def initial_states(self, n, generator):
            return 2 * torch.rand(n, 2, generator=generator, dtype=torch.float64) - 1

    res = nrpt.sample(Guarded(), explorer="sgd", chains=6, iterations=100, noise_sd=2.0,
                      lr_max=0.8, domain="box:-1,1", figures=False)
    assert res.samples.shape == (90, 2) and np.abs(res.samples).max() <= 1.0


def test_initial_states_outside_the_domain_are_an_error():
    cfg = nrpt.RunConfig(explorer="sgd", chains=4, iterations=10, domain="box:2,3")
    with pytest.raises(ValueError, match="outside the domain"):
        build(cfg)
    for bad in ("box:1", "ball:-1", "cube:1,2"):
        with pytest.raises(ValueError):
            parse_domain(bad)


def _reference_sghmc(eng0, K, momentum):
    """Per-system, per-replica loop of SGHMC + DEO with always-accepted swaps (same keyed noise)."""
    R, P, d = eng0.R, eng0.P, eng0.dim
    lr = eng0.step_size[0].tolist()
    temps = [1.0 / b for b in eng0.schedule[0].tolist()]
    U = eng0.target.energy
    x = [[eng0.state.x[s, r].clone() for r in range(P)] for s in range(R)]
    m = [[torch.zeros(d, dtype=torch.float64) for _ in range(P)] for _ in range(R)]
    grad = lambda v: energy_and_grad(U, v[None])[1][0]  # noqa: E731
    g = [[grad(x[s][r]) for r in range(P)] for s in range(R)]
    slot_of = [list(range(P)) for _ in range(R)]
    for k in range(K):
        xi = Noise(eng0.seed, k, R, P, "cpu").normal(0, (d,), torch.float64)
        for s in range(R):
            for r in range(P):
                p = slot_of[s][r]
                m[s][r] = (momentum * m[s][r] - lr[p] * g[s][r]
                           + math.sqrt(2 * (1 - momentum) * lr[p] * temps[p]) * xi[s, r])
                x[s][r] = x[s][r] + m[s][r]
                g[s][r] = grad(x[s][r])
            for p in range(k % 2, P - 1, 2):  # DEO: even pairs at even k; always accepted
                ra, rb = slot_of[s].index(p), slot_of[s].index(p + 1)
                slot_of[s][ra], slot_of[s][rb] = p + 1, p
    return x, m, slot_of


def test_batched_sghmc_matches_a_per_replica_loop_and_momentum_stays_with_its_replica():
    target = TwentyFiveModes()
    P, R, K, mom = 5, 2, 25, 0.8
    temps = [1.0, 1.5, 2.0, 3.0, 4.0]
    eng = nrpt.PTEngine(target, NoiseLadder(temps), SGHMC(momentum=mom), nrpt.make_scheme("deo"),
                        AlwaysAccept(), step_size=[0.001, 0.002, 0.004, 0.006, 0.01],
                        systems=R, seed=13)
    x_ref, m_ref, slots_ref = _reference_sghmc(eng, K, mom)
    for _ in range(K):
        eng.step()
    for s in range(R):
        assert eng.slot_of[s].tolist() == slots_ref[s]
        for r in range(P):
            torch.testing.assert_close(eng.state.x[s, r], x_ref[s][r], rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(eng.state.extras["momentum"][s, r], m_ref[s][r],
                                       rtol=1e-10, atol=1e-12)


class Isotropic:
    """N(0, var I) in 2-D with a supplied gradient (fast)."""

    dim, name = 2, "isotropic"

    def __init__(self, var):
        self.var = var

    def energy(self, x):
        return 0.5 * (x * x).sum(-1) / self.var

    def grad_energy(self, x):
        return x / self.var


def test_psgld_with_a_slow_preconditioner_samples_an_isotropic_gaussian():
    # with rho = 0.999 the RMSprop preconditioner G ~ 1 / sqrt(E g^2) = 2 is nearly constant,
    # so pSGLD (Gamma term dropped) is preconditioned ULA with variance ~4.02: allow 10%.
    # (A fast preconditioner, rho = 0.99, follows g^2 and inflates the variance by ~30%: the
    # missing Gamma term, documented in the class.)
    chains = 128
    samples = run_chains(Isotropic(4.0), PSGLD(rho=0.999), chains=chains, iterations=2500,
                         step_size=0.02, seed=4, burn_in=500)[0]
    (mean, mean_se), (cov, _) = chain_moments(samples, chains)
    assert (np.abs(mean) < 4 * mean_se + 0.05).all()
    assert np.allclose(np.diag(cov), 4.0, rtol=0.1)


def test_cyclical_schedule_and_wrapper():
    assert cyclical_factor(0, 10, 1000) == pytest.approx(1.0)
    assert cyclical_factor(50, 10, 1000) == pytest.approx(0.5)
    assert cyclical_factor(100, 10, 1000) == pytest.approx(1.0)
    assert cyclical_factor(99, 10, 1000) < 1e-3
    cyc = Cyclical(SGLD(), cycles=10, iterations=1000, sampling_fraction=0.2)
    assert cyc.name == "cycsgld"
    assert not cyc.in_sampling_stage(50) and cyc.in_sampling_stage(85)
    with pytest.raises(ValueError):
        Cyclical(SGLD(), cycles=0, iterations=10)
    x = run_chains(Gaussian(MEAN, COV), cyc, chains=2, iterations=300, step_size=0.1, seed=0,
                   keep=cyc.in_sampling_stage)
    assert x.shape == (1, 2 * 60, 2) and np.isfinite(x).all()


@pytest.mark.parametrize("bad", [dict(momentum=1.0), dict(momentum=-0.1)])
def test_bad_explorer_options(bad):
    with pytest.raises(ValueError):
        SGHMC(**bad)


def test_host_booleans_match_torch():
    """The step's two host reads (every slot cold; every replica finite) on NumPy views give
    what torch's ``.all()`` gives, including the edge cases."""
    from nrpt.explorers.base import Noise
    from nrpt.explorers.sgmcmc import _all_cold, _all_true

    inf = float("inf")
    noise = Noise(0, 0, 1, 2, "cpu")
    for vals in ([inf, inf], [inf, 1.0], [1.0, 2.0], [inf], [-inf, inf], [float("nan"), inf]):
        for dtype in (torch.float32, torch.float64):
            b = torch.tensor([vals], dtype=dtype)
            assert _all_cold(b, noise) == bool(torch.isinf(b).all())
    assert _all_cold(torch.full((1, 2), inf)[:, ::2], noise)  # (a strided view)
    for vals in ([True, True], [True, False], [False], []):
        ok = torch.tensor(vals, dtype=torch.bool)
        assert _all_true(ok) == bool(ok.all())


def _sghmc_covariance(A: np.ndarray, eta: float, mu: float, temperature: float = 1.0):
    """The exact stationary covariance of x under SGHMC's move on the energy x^T A x / 2
    (``m' = mu m - eta A x + sqrt(2 (1 - mu) eta T) xi``, ``x' = x + m'``): a linear chain,
    so the solution of the discrete Lyapunov equation ``S = F S F^T + Q`` in ``(x, m)``."""
    d = A.shape[0]
    eye = np.eye(d)
    F = np.block([[eye - eta * A, mu * eye], [-eta * A, mu * eye]])
    Q = 2.0 * (1.0 - mu) * eta * temperature * np.block([[eye, eye], [eye, eye]])
    n = 2 * d
    S = np.linalg.solve(np.eye(n * n) - np.kron(F, F), Q.reshape(-1)).reshape(n, n)
    return S[:d, :d]


def test_sghmc_samples_its_exact_stationary_gaussian_and_near_the_target():
    """SGHMC (one addcmul_ per move) in law: on a 2-D Gaussian its chains' mean and covariance
    are the exact stationary ones of the linear chain within 4 standard errors over 256
    independent chains, and that covariance is the target's to its O(eta) bias.  Negative
    control: the same check rejects a chain at temperature 1.3."""
    target = FastGaussian(MEAN, COV)
    eta, mu, chains = 0.01, 0.9, 256
    A = np.linalg.inv(COV.numpy())
    cov_eta = _sghmc_covariance(A, eta, mu)
    bias = np.abs(cov_eta - COV.numpy())
    assert bias.max() < 0.06

    def moments(temperature):
        samples = run_chains(target, SGHMC(momentum=mu), chains=chains, iterations=2000,
                             step_size=eta, seed=3, burn_in=500, temperature=temperature)[0]
        return chain_moments(samples, chains)

    (mean, mean_se), (cov, cov_se) = moments(1.0)
    assert (np.abs(mean - MEAN.numpy()) < 4 * mean_se).all()
    assert (np.abs(cov - cov_eta) < 4 * cov_se).all()
    (_, _), (cov_hot, se_hot) = moments(1.3)
    assert not (np.abs(cov_hot - cov_eta) < 4 * se_hot).all()


def test_sghmc_move_with_a_step_size_that_broadcasts_beyond_the_state_is_the_formula(
        monkeypatch):
    """The in-place addcmul_ is taken only where the step size broadcasts into the state's
    shape; a wider step size (here [2, 1, 3, 1] against [1, 3, 5]) gets the plain formula's
    broadcast result instead of an error, and no addcmul_.  Negative control: the state's own
    shape takes the in-place form (one addcmul_) and equals the same formula to rounding."""
    from nrpt.explorers.sgmcmc import _within_shape

    fused = []
    plain_addcmul_ = torch.Tensor.addcmul_

    def counting(self, *a, **k):
        fused.append(1)
        return plain_addcmul_(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "addcmul_", counting)
    for small, shape in [((1, 3, 1), (1, 3, 5)), ((3, 1), (1, 3, 5)), ((), (2,)),
                         ((2, 1, 3, 1), (1, 3, 5)), ((1, 3, 5), (1, 3, 1)), ((0,), (1,))]:
        try:
            want = torch.broadcast_shapes(small, shape) == torch.Size(shape)
        except RuntimeError:
            want = False
        assert _within_shape(torch.Size(small), torch.Size(shape)) == want
    g = torch.Generator().manual_seed(0)
    x, grad, m = (torch.randn(1, 3, 5, generator=g, dtype=torch.float64) for _ in range(3))
    move = SGHMC(momentum=0.5).move
    wide = torch.tensor([0.1, 0.2]).double().reshape(2, 1, 1, 1).expand(2, 1, 3, 1)
    x_new, out = move(x, grad, wide, torch.zeros_like(wide), {"momentum": m}, None)
    want = 0.5 * m - wide * grad
    assert out["momentum"].shape == (2, 1, 3, 5)
    assert torch.equal(out["momentum"], want) and torch.equal(x_new, x + want)
    assert fused == []
    eta = torch.full((1, 3, 1), 0.1, dtype=torch.float64)
    _, own = move(x, grad, eta, torch.zeros_like(eta), {"momentum": m}, None)
    assert fused == [1]
    torch.testing.assert_close(own["momentum"], 0.5 * m - eta * grad, rtol=1e-15, atol=1e-15)
