"""Regression with a Gaussian likelihood (nrpt.deep.regression): the energy equals the hand
formula (fixed and learned noise, minibatch and its plug-in variance), the test log-likelihood
is the mixture's (not the Gaussian of the mean), a short tempered-SGHMC fit of a linear network
matches the conjugate Bayesian linear regression predictive within its Monte Carlo error (and
a wrong noise does not), and bad input is refused by name."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from nrpt import rng
from nrpt.deep.config import DeepConfig
from nrpt.deep.energy import NetworkEnergy, NetworkTarget
from nrpt.deep.fitting import fit
from nrpt.deep.regression import GaussianLoss, GaussianMixture, NoiseHead, Targets
from nrpt.deep.replicas import FunctionalNet

HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _linear(d=2, k=1, seed=0):
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return nn.Linear(d, k).double()


def _data(n=30, d=2, seed=0, k=None):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = X @ torch.arange(1.0, d + 1, dtype=torch.float64) + 0.5 * torch.randn(
        n, generator=g, dtype=torch.float64)
    if k is not None:
        y = torch.stack([y * (j + 1) for j in range(k)], 1)
    return X, y


def _hand_energy(theta, X, y, log_sd, wd, N, idx=None):
    """Σ_i [(y_i - w·x_i - b)² / (2 s²) + log s + ½ log 2π] (× N/B on a batch) + N wd/2 |θ|²
    for the linear model theta = [w..., b] (learned noise: theta = [log_sd, w..., b])."""
    w, b = theta[-3:-1], theta[-1]
    mu = X @ w + b
    per = (y - mu) ** 2 / (2 * math.exp(2 * log_sd)) + log_sd + HALF_LOG_2PI
    scale = 1.0
    if idx is not None:
        per, scale = per[idx], N / len(idx)
    return scale * per.sum() + 0.5 * N * wd * (theta * theta).sum(), per


@pytest.mark.parametrize("learned", [False, True])
def test_energy_is_the_gaussian_nll_plus_prior(learned):
    X, y = _data()
    t = Targets(y, None if learned else 0.7)
    ys = t.standardise(y, torch.float64)
    model = NoiseHead(_linear(), 1) if learned else _linear()
    net = FunctionalNet(model, loss=GaussianLoss(t))
    wd, N = 1e-2, X.shape[0]
    target = NetworkTarget(net, X, ys, weight_decay=wd, strategy="loop")
    g = torch.Generator().manual_seed(3)
    theta = torch.randn(4, net.dim, generator=g, dtype=torch.float64)
    u = target.energy(theta)
    for i in range(4):
        log_sd = float(theta[i, 0]) if learned else math.log(0.7 / float(t.scale[0]))
        want, _ = _hand_energy(theta[i], X, ys[:, 0], log_sd, wd, N)
        assert float(u[i]) == pytest.approx(float(want), rel=1e-12)
    # the minibatch estimate: (N/B) Σ_B + prior, and its plug-in variance N² s²_B / B (1 - B/N)
    B = 8
    est = NetworkEnergy(target, B)
    x = theta.reshape(1, 4, -1)
    key = rng.Key((5, 1))
    e = est(x, key, est.init_extras(x, key))
    idx = est.batches(key, (1, 4), x.device).reshape(4, B)
    for i in range(4):
        log_sd = float(theta[i, 0]) if learned else math.log(0.7 / float(t.scale[0]))
        want, per = _hand_energy(theta[i], X, ys[:, 0], log_sd, wd, N, idx[i])
        assert float(e.u[0, i]) == pytest.approx(float(want), rel=1e-12)
        var = N ** 2 * per.var() / B * (1 - B / N)
        assert float(e.var[0, i]) == pytest.approx(float(var), rel=1e-10)


def test_energy_sums_the_columns_of_a_vector_target():
    X, y = _data(k=2)
    t = Targets(y, None)
    ys = t.standardise(y, torch.float64)
    net = FunctionalNet(NoiseHead(_linear(k=2), 2), loss=GaussianLoss(t))
    target = NetworkTarget(net, X, ys, weight_decay=0.0, strategy="loop")
    theta = torch.linspace(-0.5, 0.5, net.dim, dtype=torch.float64)
    p = net.params(theta)
    mu = X @ p["model.weight"].T + p["model.bias"]
    log_sd = p["log_sd"]
    want = ((ys - mu) ** 2 / (2 * torch.exp(2 * log_sd)) + log_sd + HALF_LOG_2PI).sum()
    assert float(target.energy(theta[None])[0]) == pytest.approx(float(want), rel=1e-12)


def test_mixture_log_likelihood_is_the_mixture_not_the_gaussian_of_the_mean():
    g = torch.Generator().manual_seed(0)
    n, S = 7, 5
    y = 100 + 30 * torch.randn(n, generator=g, dtype=torch.float64)
    t = Targets(y, None)
    ys = t.standardise(y, torch.float64)
    mus = torch.randn(S, n, 1, generator=g, dtype=torch.float64)
    log_sds = 0.3 * torch.randn(S, n, 1, generator=g, dtype=torch.float64) - 0.5
    mix = GaussianMixture(t, ys)
    for s in range(S):
        mix.add(torch.cat([mus[s], log_sds[s]], 1))
    m = mix.evaluate()
    # direct: in original units, density of y under (1/S) Σ_s N(mu_s σ + m, (s_s σ)²)
    mu_o = mus[..., 0] * t.scale + t.mean
    sd_o = torch.exp(log_sds[..., 0]) * t.scale
    dens = torch.exp(-0.5 * ((y - mu_o) / sd_o) ** 2) / (sd_o * math.sqrt(2 * math.pi))
    ll = torch.log(dens.mean(0))
    assert m["test_ll"] == pytest.approx(float(ll.mean()), rel=1e-12)
    assert m["nll_sum"] == pytest.approx(-float(ll.sum()), rel=1e-12)
    mean = mu_o.mean(0)
    assert m["rmse"] == pytest.approx(float(((mean - y) ** 2).mean().sqrt()), rel=1e-12)
    # the mixture's moments
    mean_m, sd_m = mix.moments()
    var = (mu_o ** 2 + sd_o ** 2).mean(0) - mean ** 2
    torch.testing.assert_close(mean_m[:, 0], mean, rtol=1e-12, atol=0)
    torch.testing.assert_close(sd_m[:, 0], var.sqrt(), rtol=1e-10, atol=0)
    # negative control: the Gaussian of the mean (moment-matched) is another number
    gauss = (-0.5 * ((y - mean) / var.sqrt()) ** 2 - var.sqrt().log() - HALF_LOG_2PI).mean()
    assert abs(m["test_ll"] - float(gauss)) > 1e-3
    # and the running log-sum-exp survives densities that underflow exp()
    far = GaussianMixture(t, ys)
    far.add(torch.tensor([[40.0, -3.0]] * n, dtype=torch.float64))
    far.add(torch.tensor([[41.0, -3.0]] * n, dtype=torch.float64))
    lp = torch.stack([-0.5 * ((ys[:, 0] - c) / math.exp(-3)) ** 2 + 3 - HALF_LOG_2PI
                      for c in (40.0, 41.0)])
    torch.testing.assert_close(far.log_likelihood(), torch.logsumexp(lp, 0) - math.log(2))
    assert bool(torch.isfinite(far.log_likelihood()).all())


def test_mixture_state_round_trip_and_shape_errors():
    y = torch.linspace(0, 1, 5, dtype=torch.float64)
    t = Targets(y, 0.1)
    mix = GaussianMixture(t, t.standardise(y, torch.float64))
    mix.add(torch.zeros(5, 1, dtype=torch.float64))
    other = GaussianMixture(t, t.standardise(y, torch.float64))
    other.load_state_dict(mix.state_dict())
    assert other.evaluate() == mix.evaluate()
    with pytest.raises(ValueError, match=r"out must be a \[5, 1\] tensor"):
        mix.add(torch.zeros(5, 2))
    with pytest.raises(RuntimeError, match="no model"):
        GaussianMixture(t, y).evaluate()


def _posterior(X, ys, s, alpha):
    """Bayesian linear regression y_std = w x + b + s ε, (w, b) ~ N(0, I / α): the posterior
    precision Λ and mean m of (w, b)."""
    Phi = torch.cat([X, torch.ones_like(X)], 1)
    Lam = alpha * torch.eye(2, dtype=torch.float64) + Phi.T @ Phi / s ** 2
    return Lam, torch.linalg.solve(Lam, Phi.T @ ys / s ** 2)


def test_sampled_linear_network_matches_the_conjugate_predictive():
    """SGLD at temperature 1 on full batches of the Gaussian energy of a linear network with
    fixed noise samples Bayesian linear regression's posterior; at step η its stationary law is
    exactly N(m, (Λ - η Λ² / 2)⁻¹) for this quadratic energy (so no discretisation slack is
    needed).  The collected models' predictive mean and epistemic variance at test points, and
    the mixture's sd, match it within 5 batch-means standard errors; negative controls: the
    posterior for twice the noise sd, and one without the prior scaling N·wd, are rejected."""
    from nrpt.deep.methods import make_engine
    from nrpt.explorers.sgmcmc import SGLD
    from nrpt.swap import Deterministic, NoSwap

    g = torch.Generator().manual_seed(11)
    N, P = 20, 4
    X = torch.rand(N, 1, generator=g, dtype=torch.float64) * 4 - 2
    y = 3.0 + 2.0 * X[:, 0] + 1.5 * torch.randn(N, generator=g, dtype=torch.float64)
    xs = torch.tensor([[-3.0], [0.0], [2.5]], dtype=torch.float64)
    noise, wd = 1.5, 2.0
    t = Targets(y, noise)
    ys = t.standardise(y, torch.float64)
    net = FunctionalNet(_linear(d=1), loss=GaussianLoss(t))
    target = NetworkTarget(net, X, ys, weight_decay=wd, strategy="vmap")
    s, alpha = noise / float(t.scale[0]), N * wd
    Lam, m = _posterior(X, ys[:, 0], s, alpha)
    eta = 0.2 / float(torch.linalg.eigvalsh(Lam).max())
    x0 = m.repeat(P, 1)  # (names: weight, bias; started at the mean, burn-in still dropped)
    eng = make_engine(target, SGLD(NetworkEnergy(target, N)), [1.0] * P, eta, NoSwap(),
                      Deterministic(0.0), 7, x0, torch.zeros(P, 0, dtype=torch.float64),
                      torch.float64, "cpu")
    mix = GaussianMixture(t, torch.zeros(3, 1, dtype=torch.float64))
    draws = []
    for k in range(700):
        eng.step()
        if k >= 100:
            theta = eng.state.x[0].clone()
            draws.append(theta)
            if k % 4 == 0:  # (the mixture of every 4th draw: the network's own forward)
                for out in net.logits(theta, torch.zeros(P, 0, dtype=torch.float64), xs,
                                      "loop"):
                    mix.add(out)
    th = torch.stack(draws)  # [K, P, 2]
    mus = th[..., 0:1] * xs[:, 0] + th[..., 1:2]  # [K, P, 3]
    batches = mus.reshape(6, -1, P, 3).mean(1).reshape(-1, 3)  # 24 batch means
    se_mean = batches.std(0) / math.sqrt(24)
    cen = (mus - mus.mean((0, 1))) ** 2
    se_var = cen.reshape(6, -1, P, 3).mean(1).reshape(-1, 3).std(0) / math.sqrt(24)
    phi = torch.cat([xs, torch.ones_like(xs)], 1)

    def predictive(Lam, m):
        cov = torch.linalg.inv(Lam - eta * Lam @ Lam / 2)
        return phi @ m, (phi @ cov * phi).sum(1)

    mean_cf, epi_cf = predictive(Lam, m)
    flat = mus.reshape(-1, 3)
    assert bool(((flat.mean(0) - mean_cf).abs() < 5 * se_mean).all()), (flat.mean(0), mean_cf)
    assert bool(((flat.var(0) - epi_cf).abs() < 5 * se_var).all()), (flat.var(0), epi_cf, se_var)
    # the mixture of the collected Gaussians: its sd is sqrt(epistemic + s²), original units
    mean, sd = mix.moments()
    sd_cf = (epi_cf + s ** 2).sqrt() * t.scale[0]
    torch.testing.assert_close(mean[:, 0], mus[::4].reshape(-1, 3).mean(0) * t.scale[0]
                               + t.mean[0])
    assert bool(((sd[:, 0] - sd_cf).abs() / sd_cf < 0.02).all()), (sd, sd_cf)
    # negative controls: the posterior of another noise sd, or of an unscaled prior (α = wd)
    for wrong in (_posterior(X, ys[:, 0], 2 * s, alpha), _posterior(X, ys[:, 0], s, wd)):
        _, epi_w = predictive(*wrong)
        assert not bool(((flat.var(0) - epi_w).abs() < 5 * se_var).all())


def test_fit_learned_noise_runs_every_method_and_writes_the_folder(tmp_path):
    X, y = _data(n=40, d=3)
    for method in ("deo-star", "ensemble", "swag"):
        res = fit(_linear(d=3), (X[:30], y[:30]), (X[30:], y[30:]), method=method, chains=2,
                  epochs=4, seed=0, likelihood="gaussian", batch_size=10, lr_min=0.001,
                  lr_max=0.005, pretrain_epochs=1, strategy="loop",
                  out=tmp_path / method if method == "deo-star" else None)
        s = res.summary
        assert s["noise"] == "learned" and math.isfinite(s["test_ll"])
        assert s["nll_mean"] == pytest.approx(-s["test_ll"])
        assert "accuracy" not in s
        mean, sd = res.predict(X[30:])
        assert mean.shape == (10,) and bool((sd > 0).all())
        assert "slot_rmse" in res.metrics[-1]
        assert ("bma_rmse" in res.metrics[-1]) == (method != "swag")  # (swag: drawn after)
        assert (tmp_path / "deo-star" / "summary.json").exists() or method != "deo-star"
        with pytest.raises(ValueError, match="predict_proba is for likelihood='categorical'"):
            res.predict_proba(X[30:])


def test_bad_input_is_refused_by_name():
    X, y = _data()
    lin = _linear()
    kw = dict(chains=2, epochs=1, pretrain_epochs=0, batch_size=10, strategy="loop")
    with pytest.raises(ValueError, match="needs float targets"):
        fit(lin, (X, y.long()), (X, y.long()), likelihood="gaussian", **kw)
    with pytest.raises(ValueError, match="likelihood='gaussian'"):
        fit(_linear(k=3), (X, y), (X, y), **kw)  # float y, categorical: named, not guessed
    with pytest.raises(ValueError, match="y must be"):
        fit(lin, (X, y[:-1]), (X, y), likelihood="gaussian", **kw)
    with pytest.raises(ValueError, match="2 outputs per example but y has 1"):
        fit(_linear(k=2), (X, y), (X, y), likelihood="gaussian", **kw)
    with pytest.raises(ValueError, match="test: y has shape"):
        fit(lin, (X, y), (X, torch.stack([y, y], 1)), likelihood="gaussian", **kw)
    with pytest.raises(ValueError, match="classes applies to likelihood='categorical' only"):
        fit(lin, (X, y), (X, y), likelihood="gaussian", classes=3, **kw)
    # the execution settings reach a regression's net too (they were once ignored silently)
    with pytest.raises(ValueError, match="memory_format='channels_last' applies to image"):
        fit(lin, (X, y), (X, y), likelihood="gaussian", memory_format="channels_last", **kw)
    if next(lin.parameters()).dtype != torch.float32:
        with pytest.raises(ValueError, match="precision='bf16' autocasts float32 models"):
            fit(lin, (X, y), (X, y), likelihood="gaussian", precision="bf16", **kw)
    with pytest.raises(ValueError, match="y is constant"):
        fit(lin, (X, torch.ones(30, dtype=torch.float64)), (X, y), likelihood="gaussian", **kw)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="noise"):
            DeepConfig(likelihood="gaussian", noise=bad)
    with pytest.raises(ValueError, match="noise applies to likelihood='gaussian' only"):
        DeepConfig(noise=0.5)
    with pytest.raises(ValueError, match="likelihood must be one of categorical, gaussian"):
        DeepConfig(likelihood="poisson")
    with pytest.raises(ValueError, match="average='logits' has no meaning"):
        DeepConfig(likelihood="gaussian", average="logits")


def test_regression_run_resumes_bit_for_bit(tmp_path):
    """Interrupted at its first callback (iteration 256) and resumed, a learned-noise DEO* run
    ends with the uninterrupted run's mixture (the GaussianMixture state in the checkpoint)."""
    X, y = _data(n=60, d=3)
    kw = dict(method="deo-star", chains=2, epochs=90, seed=2, likelihood="gaussian",
              batch_size=20, lr_min=0.001, lr_max=0.005, swap_rate=0.3, pretrain_epochs=0,
              strategy="loop", checkpoint_every=100, eval_every=25)
    run = lambda **more: fit(_linear(d=3), (X[:45], y[:45]), (X[45:], y[45:]),  # noqa: E731
                             **{**kw, **more})
    whole = run()

    def stop(engine):
        raise KeyboardInterrupt

    part = run(out=tmp_path / "run", callback=stop)
    assert part.summary["interrupted"]
    done = run(out=tmp_path / "run", resume=True)
    for key in ("test_ll", "nll_sum", "rmse", "round_trips", "learning_rates"):
        assert done.summary[key] == whole.summary[key], key
    torch.testing.assert_close(done.predict(X[45:]), whole.predict(X[45:]), rtol=0, atol=0)


def test_diabetes_dataset_and_cli(capsys):
    from nrpt.deep.data import load_dataset
    from nrpt.run.cli import main

    ds = load_dataset("diabetes", seed=3)
    assert (ds.x_train.shape, ds.x_test.shape, ds.classes) == ((354, 10), (88, 10), 0)
    assert ds.y_train.dtype == torch.float32 and float(ds.y_train.min()) >= 25
    torch.testing.assert_close(ds.x_train.mean(0), torch.zeros(10), atol=1e-5, rtol=0)
    assert not torch.equal(load_dataset("diabetes", seed=4).y_test, ds.y_test)  # seeded split
    rc = main(["deep", "--dataset", "diabetes", "--method", "ensemble", "--epochs", "1",
               "--pretrain-epochs", "1", "--chains", "2", "--no-progress", "--strategy", "loop"])
    out = capsys.readouterr().out
    assert rc == 0 and "test_ll" in out and "rmse" in out and "accuracy" not in out
    assert "noise: learned" in out


def test_a_run_recorded_before_the_likelihood_setting_still_resumes(tmp_path):
    from nrpt.deep.fitting import _same_settings

    now = DeepConfig().to_dict()
    then = {k: v for k, v in now.items() if k not in ("likelihood", "noise")}
    _same_settings(tmp_path, then, now)  # recorded before: categorical, no noise
    with pytest.raises(ValueError, match="likelihood: 'gaussian' -> 'categorical'"):
        _same_settings(tmp_path, {**now, "likelihood": "gaussian"}, now)
