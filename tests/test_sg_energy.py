"""Energy estimators (nrpt.energy.estimators) and data targets (nrpt.targets.minibatch)."""

from __future__ import annotations

import math

import pytest
import torch

from nrpt.energy.estimators import (
    ControlVariateEnergy,
    ExactEnergy,
    MinibatchEnergy,
    NoisyOracle,
    energy_and_grad,
)
from nrpt.targets import TwentyFiveModes
from nrpt.targets.minibatch import MinibatchTarget, MixtureMeanModel


@pytest.mark.parametrize("penalty", [False, True])
def test_closed_form_twenty_five_modes_gradient_matches_autograd(penalty):
    target = TwentyFiveModes(penalty=penalty)
    g = torch.Generator().manual_seed(0)
    x = 6 * torch.rand(3, 7, 2, generator=g, dtype=torch.float64) - 3  # some beyond |x|^2 = 20
    x[0, 0] = torch.tensor([4.0, 3.0], dtype=torch.float64)
    est = ExactEnergy(target)(x, (0, 0, 0, 0), {})
    u, grad = est.u, est.grad
    u_ref, g_ref = energy_and_grad(target.energy, x)
    torch.testing.assert_close(u, u_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, g_ref, rtol=1e-12, atol=1e-12)


def test_supplied_grad_energy_is_used():
    class Quad:
        dim, calls = 2, 0

        def energy(self, x):
            return 0.5 * (x * x).sum(-1)

        def grad_energy(self, x):
            Quad.calls += 1
            return x

    x = torch.randn(2, 3, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    est = ExactEnergy(Quad())(x, (0, 0, 0, 0), {})
    assert Quad.calls == 1 and torch.equal(est.grad, x)


def test_noisy_oracle_noise_has_the_stated_sd_and_is_keyed():
    target = TwentyFiveModes()
    oracle = NoisyOracle(target, energy_sd=2.0, grad_sd=3.0)
    x = torch.zeros(50, 100, 2, dtype=torch.float64)
    e = oracle(x, (7, 3, 0, 1), {})
    u0 = float(target.energy(torch.zeros(1, 2, dtype=torch.float64)))
    n = e.u.numel()
    # sd estimates from n = 5000 (energy) / 10000 (gradient) normals: relative se 1 / sqrt(2n)
    assert abs(float((e.u - u0).std()) / 2.0 - 1) < 4 / math.sqrt(2 * n)
    assert abs(float(e.grad.std()) / 3.0 - 1) < 4 / math.sqrt(4 * n)
    assert abs(float((e.u - u0).mean())) < 4 * 2.0 / math.sqrt(n)
    assert torch.equal(e.var, torch.full_like(e.u, 4.0))
    again = oracle(x, (7, 3, 0, 1), {})
    other = oracle(x, (7, 4, 0, 1), {})
    assert torch.equal(e.u, again.u) and torch.equal(e.grad, again.grad)
    assert not torch.equal(e.u, other.u)
    with pytest.raises(ValueError, match="energy_sd"):
        NoisyOracle(target, energy_sd=-1.0)


def linear_data(N=500, seed=0):
    """A Bayesian linear-regression-like data target: loss_i = (y_i - x . a_i)^2 / 2."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(N, 2, generator=g, dtype=torch.float64)
    y = a @ torch.tensor([1.0, -2.0], dtype=torch.float64) + torch.randn(N, generator=g,
                                                                        dtype=torch.float64)
    data = torch.cat([a, y[:, None]], dim=1)

    def loss(x, batch):  # x [B, 2], batch [B, n, 3]
        pred = (batch[..., :2] * x[:, None, :]).sum(-1)
        return 0.5 * (batch[..., 2] - pred) ** 2

    return MinibatchTarget(data, loss, dim=2, prior_energy=lambda x: 0.5 * (x * x).sum(-1),
                           name="linear")


def test_minibatch_energy_is_unbiased_with_a_correct_variance_estimate():
    target = linear_data()
    est = MinibatchEnergy(target, batch_size=50)
    x = torch.tensor([[[0.5, -1.0]]], dtype=torch.float64).expand(1, 4000, 2)
    e = est(x, (3, 0, 0, 1), {})  # 4000 replicas = 4000 independent batches at the same x
    full = float(target.energy(x[0, :1]))
    emp_var = float(e.u.var())
    # unbiased: 4 standard errors of the mean of 4000 estimates
    assert abs(float(e.u.mean()) - full) < 4 * math.sqrt(emp_var / 4000)
    # the plug-in variance estimate matches the empirical variance (its own noise is ~15%)
    assert float(e.var.mean()) == pytest.approx(emp_var, rel=0.1)
    # gradient unbiased too
    _, g_full = energy_and_grad(target.energy, x[0, :1])
    g_sd = e.grad.std(dim=1).squeeze(0)
    assert ((e.grad.mean(dim=1)[0] - g_full[0]).abs() < 4 * g_sd / math.sqrt(4000)).all()


def test_minibatch_indices_are_keyed_and_without_replacement():
    target = linear_data(N=40)
    est = MinibatchEnergy(target, batch_size=40)  # the whole data: no noise at all
    x = torch.randn(2, 3, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    e = est(x, (0, 5, 0, 1), {})
    torch.testing.assert_close(e.u, target.energy(x.reshape(-1, 2)).reshape(2, 3))
    est = MinibatchEnergy(target, batch_size=10)
    assert torch.equal(est(x, (1, 2, 0, 1), {}).u, est(x, (1, 2, 0, 1), {}).u)
    assert not torch.equal(est(x, (1, 2, 0, 1), {}).u, est(x, (1, 3, 0, 1), {}).u)


def test_batch_larger_than_data_is_an_error():
    with pytest.raises(ValueError, match=r"batch_size \(41\) is larger than the data \(N = 40\)"):
        MinibatchEnergy(linear_data(N=40), batch_size=41)


def test_control_variate_energy_is_unbiased_with_lower_variance():
    target = linear_data()
    plain = MinibatchEnergy(target, batch_size=20)
    vr = ControlVariateEnergy(target, batch_size=20, anchor_every=50)
    n = 4000
    anchor = torch.tensor([[[0.9, -1.9]]], dtype=torch.float64).expand(1, n, 2)
    x = anchor + 0.05  # the state has moved a little since the anchor was set (k = 0)
    extras = vr.init_extras(anchor, (0, 0, 0, 0))
    e_vr = vr(x, (4, 1, 0, 1), extras)  # k = 1: no refresh, the anchor stays
    e_pl = plain(x, (4, 1, 0, 1), {})
    full = float(target.energy(x[0, :1]))
    for e in (e_vr, e_pl):
        assert abs(float(e.u.mean()) - full) < 4 * math.sqrt(float(e.u.var()) / n)
    ratio = float(e_pl.u.var()) / float(e_vr.u.var())
    assert ratio > 20  # close anchor: the control variate removes most of the variance
    # its own report of the variance reduction agrees with the empirical one
    reported = float(e_vr.extras["energy_var_plain"].mean() / e_vr.var.mean())
    assert reported == pytest.approx(ratio, rel=0.25)
    # refresh at k % m == 0: the anchor moves to the state and the estimate is exact
    e_ref = vr(x, (4, 50, 0, 1), extras)
    torch.testing.assert_close(e_ref.u[0, :1], target.energy(x[0, :1]))
    assert float(e_ref.u.var()) < 1e-18


def test_adaptive_control_variate_coefficient_stays_unbiased():
    target = linear_data()
    vr = ControlVariateEnergy(target, batch_size=20, anchor_every=100, coefficient="adaptive")
    n = 4000
    anchor = torch.tensor([[[0.0, 0.0]]], dtype=torch.float64).expand(1, n, 2)
    x = anchor + torch.tensor([1.0, -2.0], dtype=torch.float64)  # far from the anchor
    extras = vr.init_extras(anchor, (0, 0, 0, 0))
    e1 = vr(x, (4, 1, 0, 1), extras)
    extras.update(e1.extras)
    e2 = vr(x, (4, 2, 0, 1), extras)  # uses the coefficient estimated from the previous batch
    full = float(target.energy(x[0, :1]))
    assert abs(float(e2.u.mean()) - full) < 4 * math.sqrt(float(e2.u.var()) / n)


def test_mixture_mean_model_is_bimodal_with_modes_at_mu_and_gamma_minus_mu():
    model = MixtureMeanModel()
    assert model.n_data == 1000 and model.dim == 1
    edges, probs = model.density_grid()
    mids = 0.5 * (edges[1:] + edges[:-1])
    left, right = probs[mids < 10].sum(), probs[mids >= 10].sum()
    assert left == pytest.approx(0.5, abs=0.02) and right == pytest.approx(0.5, abs=0.02)
    assert abs(mids[probs[mids < 10].argmax()] - (-5)) < 1.0
    assert abs(mids[mids >= 10][probs[mids >= 10].argmax()] - 25) < 1.0


def test_noisy_oracle_per_system_noise_levels():
    oracle = NoisyOracle(TwentyFiveModes(), energy_sd=[0.0, 3.0], grad_sd=0.0)
    x = torch.zeros(2, 2000, 2, dtype=torch.float64)
    e = oracle(x, (1, 0, 0, 1), {})
    assert float(e.u[0].std()) == 0.0 and abs(float(e.u[1].std()) - 3.0) < 4 * 3.0 / 63
    assert e.var[:, 0].tolist() == [0.0, 9.0] and float(e.grad.abs().max()) == 0.0
    with pytest.raises(ValueError, match="per-system"):
        oracle(torch.zeros(3, 4, 2, dtype=torch.float64), (1, 0, 0, 1), {})


def test_make_estimator_picks_the_energy_of_the_run():
    from nrpt.energy.estimators import make_estimator

    data = linear_data(N=40)
    assert isinstance(make_estimator(TwentyFiveModes()), ExactEnergy)
    assert isinstance(make_estimator(TwentyFiveModes(), noise_sd=2.0), NoisyOracle)
    assert isinstance(make_estimator(TwentyFiveModes(), grad_noise_sd=1.0), NoisyOracle)
    plain = make_estimator(data, batch_size=10)
    assert type(plain) is MinibatchEnergy and plain.describe()["energy"] == "minibatch"
    vr = make_estimator(data, batch_size=10, vr_every=7)
    assert isinstance(vr, ControlVariateEnergy) and vr.anchor_every == 7
    with pytest.raises(ValueError, match="batch_size needs a data target"):
        make_estimator(TwentyFiveModes(), batch_size=10)
    with pytest.raises(ValueError, match="vr_every .* needs a minibatch energy"):
        make_estimator(data, vr_every=5)


def test_control_variate_variance_is_zero_at_a_refresh_and_grows_after():
    # what a variance tracker sees: at k % m == 0 the anchor is the state (variance 0), and the
    # variance grows with the distance from the anchor between refreshes
    target = linear_data()
    vr = ControlVariateEnergy(target, batch_size=20, anchor_every=10)
    x0 = torch.tensor([[[0.9, -1.9]]], dtype=torch.float64).expand(1, 200, 2)
    extras = vr.init_extras(x0, (0, 0, 0, 0))
    e0 = vr(x0, (4, 10, 0, 1), extras)
    assert float(e0.var.abs().max()) < 1e-18
    extras.update(e0.extras)
    near = float(vr(x0 + 0.01, (4, 11, 0, 1), extras).var.mean())
    far = float(vr(x0 + 0.1, (4, 11, 0, 1), extras).var.mean())
    assert 0 < near < far and far / near == pytest.approx(100, rel=0.2)  # ~ distance^2
