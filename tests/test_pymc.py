"""Tests of the PyMC bridge (nrpt.targets.from_pymc).

Statistical checks use fixed seeds.  Distribution checks are Kolmogorov-Smirnov tests at level
``ALPHA = 1e-4`` (a correct sampler fails one with probability 1e-4); the Monte Carlo error of
a run's estimates is the spread over ``R`` independent PT systems (``se = sd / sqrt(R)``) and
estimates must lie within ``N_SE = 4`` of it.  Negative controls show that each check rejects a
modest error.  PyTensor compiles C code on first use; each model is built once per module.
"""

from __future__ import annotations

import importlib
import math
import sys
import textwrap

import numpy as np
import pytest
import torch
from scipy import special, stats

pm = pytest.importorskip("pymc")
from pytensor.compile.mode import Mode  # noqa: E402

import nrpt  # noqa: E402
from nrpt.targets import from_pymc  # noqa: E402
from nrpt.targets.adapters.pymc import PyMCPriorTarget, PyMCTemperatureTarget  # noqa: E402
from nrpt.targets.protocol import TargetError, load_target, path_kind, validate_target  # noqa: E402

ALPHA = 1e-4
N_SE = 4.0
N_DRAWS = 4000
Y = np.array([0.3, -0.4, 1.1, 0.8, 0.2])
BETA_A, BETA_B, HN_SIGMA = 2.0, 3.0, 1.5


#: PyMC's own reference functions run on PyTensor's Python linker: no C to compile for them
#: (they evaluate a few points; the targets under test use the default compiled mode)
PY_MODE = Mode(linker="py", optimizer="fast_compile")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def mixed_model():
    """Bounded (Beta), positive (HalfNormal), vector Normal with dims, Dirichlet (simplex),
    a Deterministic, observed data."""
    with pm.Model(coords={"k": ["a", "b", "c"]}) as model:
        p = pm.Beta("p", BETA_A, BETA_B)
        s = pm.HalfNormal("s", HN_SIGMA)
        mu = pm.Normal("mu", 0.0, 1.0, dims="k")
        w = pm.Dirichlet("w", np.ones(3), dims="k")
        pm.Deterministic("d", mu * s, dims="k")
        pm.Normal("y", (mu * w).sum() + p, s, observed=Y)
    return model


@pytest.fixture(scope="module")
def mixed():
    model = mixed_model()
    return model, from_pymc(model)


@pytest.fixture(scope="module")
def draws(mixed):
    return mixed[1].reference_sample(N_DRAWS, gen(11))


def points(target, n: int, seed: int) -> torch.Tensor:
    """Reference draws moved off them by N(0, 0.5^2) noise: generic points of the space."""
    g = gen(seed)
    x = target.reference_sample(n, g)
    return x + 0.5 * torch.randn(x.shape, generator=g, dtype=x.dtype)


# ---------------------------------------------------------------------------------------------
# the layout and the reference draws
# ---------------------------------------------------------------------------------------------


def test_layout_follows_the_free_variables(mixed):
    _, t = mixed
    assert isinstance(t, PyMCPriorTarget) and path_kind(t) == "geometric"
    assert t.dim == 1 + 1 + 3 + 2 and t.reference_is_normalized and t.analytic_gradients
    assert [name for name, _, _ in t.layout] == ["p_logodds__", "s_log__", "mu", "w_simplex__"]
    assert t.name == "pymc:model"
    assert validate_target(t) == "geometric"


def ks_pvalue(values, cdf) -> float:
    return float(stats.kstest(np.asarray(values), cdf).pvalue)


def test_reference_draws_are_the_prior_through_the_transforms(mixed, draws):
    _, t = mixed
    x = draws.numpy()
    assert draws.dtype == torch.float64 and draws.shape == (N_DRAWS, t.dim)
    beta = stats.beta(BETA_A, BETA_B)
    halfnormal = stats.halfnorm(scale=HN_SIGMA)
    # the transformed CDFs: logodds(p) <= z  <=>  p <= expit(z);  log(s) <= z  <=>  s <= e^z
    assert ks_pvalue(x[:, 0], lambda z: beta.cdf(special.expit(z))) > ALPHA
    assert ks_pvalue(x[:, 1], lambda z: halfnormal.cdf(np.exp(z))) > ALPHA
    for j in (2, 3, 4):
        assert ks_pvalue(x[:, j], stats.norm.cdf) > ALPHA
    # w ~ Dirichlet(1, 1, 1): every component is Beta(1, 2) (back through the simplex map)
    w = t.model_variables(draws)["w"]
    for j in range(3):
        assert ks_pvalue(w[:, j], stats.beta(1, 2).cdf) > ALPHA
    # the draws are independent across coordinates: mu's entries are uncorrelated
    r = np.corrcoef(x[:, 2], x[:, 3])[0, 1]
    assert abs(r) < N_SE / math.sqrt(N_DRAWS)


def test_negative_control_shifted_prior_fails_the_ks_test(draws):
    x = draws.numpy()
    beta = stats.beta(BETA_A, BETA_B)
    assert ks_pvalue(x[:, 2] + 0.15, stats.norm.cdf) < ALPHA
    assert ks_pvalue(x[:, 0], lambda z: stats.beta(2.6, BETA_B).cdf(special.expit(z))) < ALPHA
    assert ks_pvalue(x[:, 0], lambda z: beta.cdf(special.expit(z))) > ALPHA  # same draws pass


def test_reference_draws_come_from_the_generator_only(mixed):
    _, t = mixed
    a = t.reference_sample(7, gen(5))
    np.random.seed(0)
    torch.manual_seed(0)
    b = t.reference_sample(7, gen(5))
    c = t.reference_sample(7, gen(6))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(t.initial_states(7, gen(5)), a)
    with pytest.raises(TypeError, match="torch.Generator"):
        t.reference_sample(3, None)


def hierarchical_model():
    """Root Beta, HalfNormal, Dirichlet; theta ~ Normal(mu, tau) with random mu and tau (the
    downstream draw must see its own draw's parents) and a Uniform with random bounds."""
    with pm.Model() as model:
        pm.Beta("p", BETA_A, BETA_B)
        pm.HalfNormal("s", HN_SIGMA)
        mu = pm.Normal("mu", 0.0, 2.0)
        tau = pm.HalfNormal("tau", 1.0)
        theta = pm.Normal("theta", mu, tau, shape=4)
        u = pm.Uniform("u", mu - 1.0, mu + tau)
        w = pm.Dirichlet("w", np.array([1.0, 2.0, 3.0]))
        pm.Normal("y", theta.sum() + u + w[0], 1.0, observed=Y[:4])
    return model


def test_vectorized_prior_draws_match_the_per_draw_loop():
    model = hierarchical_model()
    t, loop = from_pymc(model), from_pymc(model, vectorize=False)
    assert t.vectorized["sample"] and not loop.vectorized["sample"]
    a = t.reference_sample(N_DRAWS, gen(31))
    assert a.shape == (N_DRAWS, t.dim) and a.dtype == torch.float64
    assert torch.equal(t.reference_sample(N_DRAWS, gen(31)), a)  # the generator alone
    assert not torch.equal(t.reference_sample(N_DRAWS, gen(32)), a)
    b = loop.reference_sample(N_DRAWS, gen(33)).numpy()
    x = a.numpy()
    for j in range(t.dim):  # every coordinate: the same distribution as the loop's draws
        assert stats.ks_2samp(x[:, j], b[:, j]).pvalue > ALPHA, j
    # the joint structure: theta's draw i sees mu and tau of draw i -- (theta - mu) / tau is
    # N(0, 1); u sits in (mu - 1, mu + tau) as Uniform: (u - lower) / (upper - lower) ~ U(0, 1)
    mv = t.model_variables(a)
    z = (mv["theta"] - mv["mu"][:, None]) / mv["tau"][:, None]
    for j in range(4):
        assert ks_pvalue(z[:, j], stats.norm.cdf) > ALPHA
    r = (mv["u"] - mv["mu"] + 1.0) / (mv["tau"] + 1.0)
    assert ks_pvalue(r, stats.uniform.cdf) > ALPHA
    for j, alpha in enumerate((1.0, 2.0, 3.0)):  # Dirichlet(1, 2, 3) marginals
        assert ks_pvalue(mv["w"][:, j], stats.beta(alpha, 6.0 - alpha).cdf) > ALPHA
    # negative control: pairing theta with another draw's parents fails the same check
    zbad = (mv["theta"] - np.roll(mv["mu"], 1)[:, None]) / np.roll(mv["tau"], 1)[:, None]
    assert ks_pvalue(zbad[:, 0], stats.norm.cdf) < ALPHA
    # a batch of one and an empty batch
    assert t.reference_sample(1, gen(1)).shape == (1, t.dim)
    assert t.reference_sample(0, gen(1)).shape == (0, t.dim)


# ---------------------------------------------------------------------------------------------
# densities and gradients against PyMC
# ---------------------------------------------------------------------------------------------


def pymc_point(t, row: np.ndarray) -> dict[str, np.ndarray]:
    return {name: v[0] for name, v in t.unravel(row[None, :]).items()}


def test_log_densities_and_gradients_equal_pymc(mixed):
    model, t = mixed
    x = points(t, 16, seed=21)
    logp = model.compile_logp(jacobian=True, mode=PY_MODE)
    dlogp = model.compile_dlogp(jacobian=True, mode=PY_MODE)
    total = (t.reference_log_prob(x) + t.log_likelihood(x)).numpy()
    grad = (t.grad_reference_log_prob(x) + t.grad_log_likelihood(x)).numpy()
    prior_logp = model.compile_logp(vars=model.free_RVs, jacobian=True, mode=PY_MODE)
    for i, row in enumerate(x.numpy()):
        point = pymc_point(t, row)
        assert abs(total[i] - logp(point)) <= 1e-10 * max(1.0, abs(total[i]))
        assert np.allclose(grad[i], dlogp(point), rtol=1e-10, atol=1e-10)
        assert abs(float(t.reference_log_prob(x[i:i + 1])[0]) - prior_logp(point)) <= 1e-10
    # negative control: without the Jacobian the same comparison fails
    no_jac = model.compile_logp(jacobian=False, mode=PY_MODE)
    assert abs(total[0] - no_jac(pymc_point(t, x[0].numpy()))) > 1e-3


def test_batch_equals_pointwise_and_dtypes_follow_the_input(mixed):
    _, t = mixed
    x = points(t, 9, seed=22)
    assert all(t.vectorized.values()), t.vectorized
    members = ("reference_log_prob", "log_likelihood", "grad_reference_log_prob",
               "grad_log_likelihood")
    for m in members:
        batch = getattr(t, m)(x)
        single = torch.cat([getattr(t, m)(x[i:i + 1]) for i in range(len(x))])
        assert torch.allclose(batch, single, rtol=1e-12, atol=1e-12), m
        out32 = getattr(t, m)(x.float())
        assert out32.dtype == torch.float32 and out32.shape == batch.shape
        assert np.allclose(getattr(t, m)(x.numpy()).numpy(), batch.numpy())
    with pytest.raises(ValueError, match=r"\[n, 7\]"):
        t.log_likelihood(x[:, :3])


# ---------------------------------------------------------------------------------------------
# the model-variables hook
# ---------------------------------------------------------------------------------------------


def test_model_variables_are_the_constrained_values(mixed):
    model, t = mixed
    x = points(t, 6, seed=23)
    mv = t.model_variables(x)
    assert list(mv) == ["p", "s", "mu", "w", "d"]
    assert {k: v.shape for k, v in mv.items()} == {
        "p": (6,), "s": (6,), "mu": (6, 3), "w": (6, 3), "d": (6, 3)}
    a = x.numpy()
    assert np.allclose(mv["p"], special.expit(a[:, 0]), rtol=1e-12)
    assert np.allclose(mv["s"], np.exp(a[:, 1]), rtol=1e-12)
    assert np.allclose(mv["mu"], a[:, 2:5], rtol=1e-12)
    assert np.allclose(mv["d"], a[:, 2:5] * np.exp(a[:, 1:2]), rtol=1e-12)
    # the simplex: PyMC's own backward map of the Dirichlet's transform, state by state
    w_rv = model["w"]
    backward = model.rvs_to_transforms[w_rv]
    for i in range(len(a)):
        expected = backward.backward(a[i, 5:7], *w_rv.owner.inputs).eval()
        assert np.allclose(mv["w"][i], expected, rtol=1e-12)
    assert np.allclose(mv["w"].sum(axis=1), 1.0) and (mv["w"] > 0).all()
    assert t.model_dims == {"mu": ["k"], "w": ["k"], "d": ["k"]}
    assert t.model_coords == {"k": ["a", "b", "c"]}
    assert t.model_variables(a)["p"].shape == (6,)  # numpy input too


# ---------------------------------------------------------------------------------------------
# a conjugate run with an exact answer
# ---------------------------------------------------------------------------------------------

PRIOR_MEAN, PRIOR_SD, NOISE_SD = 0.5, 2.0, 1.0
Y_CONJ = np.array([1.2, 0.4, 2.1, 1.6, 0.9, 1.4, 0.2, 1.8])


def conjugate_exact(noise_sd: float = NOISE_SD) -> tuple[float, float, float]:
    """Posterior mean and variance of theta, and log p(y), for y_i ~ N(theta, noise_sd^2),
    theta ~ N(PRIOR_MEAN, PRIOR_SD^2)."""
    n = len(Y_CONJ)
    precision = 1 / PRIOR_SD**2 + n / noise_sd**2
    mean = (PRIOR_MEAN / PRIOR_SD**2 + Y_CONJ.sum() / noise_sd**2) / precision
    cov = noise_sd**2 * np.eye(n) + PRIOR_SD**2 * np.ones((n, n))
    log_z = stats.multivariate_normal(np.full(n, PRIOR_MEAN), cov).logpdf(Y_CONJ)
    return mean, 1 / precision, float(log_z)


def test_conjugate_run_recovers_posterior_and_log_marginal_likelihood():
    with pm.Model() as model:
        theta = pm.Normal("theta", PRIOR_MEAN, PRIOR_SD)
        pm.Normal("y", theta, NOISE_SD, observed=Y_CONJ)
    # adaptive rounds: the schedule adapts to the path, which keeps the reverse stepping-stone
    # estimate's tails light (a fixed linear ladder of 6 betas gives outliers of several nats)
    R = 8
    res = nrpt.sample(from_pymc(model), chains=8, rounds=9, systems=R, seed=7,
                      explorer="mala", step_size=0.3)
    mean, var, log_z = conjugate_exact()
    samples = np.asarray(res.samples)[:, :, 0]  # [R, n]: the last round of each system
    means, vars_ = samples.mean(axis=1), samples.var(axis=1)
    log_zs = np.asarray(res.summary["log_normalizer"], dtype=float)
    assert res.summary.get("log_normalizer_kind") == "log Z"

    def within(estimates, exact):
        se = estimates.std(ddof=1) / math.sqrt(len(estimates))
        return abs(estimates.mean() - exact) <= N_SE * se

    assert within(means, mean)
    assert within(vars_, var)
    assert within(log_zs, log_z)
    # negative controls: a prior-only mean and the log Z of a wrong noise level are rejected
    assert not within(means, PRIOR_MEAN)
    assert not within(log_zs, conjugate_exact(noise_sd=1.3)[2])


# ---------------------------------------------------------------------------------------------
# the temperature path
# ---------------------------------------------------------------------------------------------


def test_temperature_path_energy_is_the_joint_density_with_potentials():
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 1.0)
        b = pm.LogNormal("b", 0.0, 0.5)
        pm.Potential("soft", -0.5 * (a - b) ** 2)
    with pytest.raises(TargetError, match="temperature"):
        from_pymc(model)  # no observed variable (and a Potential): the prior path refuses
    t = from_pymc(model, path="temperature")
    assert isinstance(t, PyMCTemperatureTarget) and path_kind(t) == "temperature"
    assert not hasattr(t, "log_likelihood") and not hasattr(t, "reference_sample")
    assert validate_target(t) == "temperature"
    x = t.initial_states(5, gen(3))
    logp = model.compile_logp(jacobian=True, mode=PY_MODE)
    dlogp = model.compile_dlogp(jacobian=True, mode=PY_MODE)
    e, ge = t.energy(x).numpy(), t.grad_energy(x).numpy()
    for i, row in enumerate(x.numpy()):
        point = pymc_point(t, row)
        assert abs(e[i] + logp(point)) <= 1e-10 * max(1.0, abs(e[i]))
        assert np.allclose(ge[i], -dlogp(point), rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------


def test_discrete_free_variable_is_refused_with_marginalizing_advice():
    with pm.Model() as model:
        z = pm.Categorical("z", p=np.array([0.3, 0.7]))
        pm.Normal("y", pm.math.switch(z, 1.0, -1.0), 1.0, observed=Y)
    with pytest.raises(TargetError, match=r"'z' is discrete.*continuous.*pm.NormalMixture"):
        from_pymc(model)
    with pm.Model() as counts:
        pm.Poisson("n", 3.0)
    with pytest.raises(TargetError, match="'n' is discrete"):
        from_pymc(counts, path="temperature")


def test_model_without_observed_variables_is_refused():
    with pm.Model() as model:
        pm.Normal("a", 0.0, 1.0)
    with pytest.raises(TargetError, match=r"no observed variables.*no likelihood.*observed="):
        from_pymc(model)


def test_potential_on_the_prior_path_is_refused():
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 1.0)
        pm.Potential("pen", -a**2)
        pm.Normal("y", a, 1.0, observed=Y)
    with pytest.raises(TargetError, match=r"Potential.*'pen'.*cannot be sampled exactly.*"
                                          r"path='temperature'"):
        from_pymc(model)


def test_free_variable_below_an_observed_one_is_refused():
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 1.0)
        y = pm.Normal("y", a, 1.0, observed=Y)
        pm.Normal("b", y.mean(), 1.0)
    with pytest.raises(TargetError, match=r"'b' depends on the observed variable 'y'"):
        from_pymc(model)


def test_bad_path_and_non_model_are_refused():
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 1.0)
        pm.Normal("y", a, 1.0, observed=Y)
    with pytest.raises(TargetError, match=r"'prior', 'temperature'.*got 'geometric'"):
        from_pymc(model, path="geometric")
    with pytest.raises(TargetError, match="expects a pymc.Model"):
        from_pymc(object())


def test_missing_pymc_says_how_to_install(monkeypatch):
    real = importlib.import_module

    def fake(name, *args, **kwargs):
        if name == "pymc" or name.startswith("pymc."):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", fake)
    with pytest.raises(ImportError, match=r"pip install nrpt\[pymc\]"):
        from_pymc(None)


def test_importing_nrpt_does_not_import_pymc():
    import subprocess

    code = ("import nrpt, nrpt.targets, nrpt.targets.protocol, sys; "
            "assert 'pymc' not in sys.modules and 'pytensor' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------------------------
# loading from a file
# ---------------------------------------------------------------------------------------------


def test_load_target_turns_a_pymc_model_into_a_target(tmp_path):
    f = tmp_path / "model.py"
    f.write_text(textwrap.dedent("""
        import numpy as np
        import pymc as pm

        with pm.Model(name="tiny") as model:
            mu = pm.Normal("mu", 0.0, 1.0)
            pm.Normal("y", mu, 1.0, observed=np.array([0.5, 1.5]))

        not_a_model = 3
    """))
    t = load_target(f"{f}:model")
    assert isinstance(t, PyMCPriorTarget) and t.name == "pymc:tiny" and t.dim == 1
    t2 = load_target(f"{f}:model", path="temperature")
    assert isinstance(t2, PyMCTemperatureTarget)
    with pytest.raises(TargetError, match="path must be one of"):
        load_target(f"{f}:model", path="nope")
    assert load_target(f"{f}:not_a_model") == 3


def test_small_dirichlet_concentrations_stay_finite():
    """Gamma variates of a small concentration underflow to 0 in float64; the draws are made in
    log space and the simplex transform sees the log weights, so every draw is finite and the
    weights keep their Beta marginal (KS).  Control: the marginal of a wrong concentration."""
    alpha = np.array([0.01, 0.02, 0.03])
    with pm.Model() as m:
        pm.Dirichlet("w", a=alpha)
        pm.Normal("y", 0.0, 1.0, observed=[0.1])
    t = from_pymc(m)
    x = t.reference_sample(N_DRAWS, torch.Generator().manual_seed(5))
    assert torch.isfinite(x).all()
    w0 = t.model_variables(x)["w"][:, 0]
    rest = alpha.sum() - alpha[0]
    assert stats.kstest(w0, stats.beta(alpha[0], rest).cdf).pvalue > ALPHA
    assert stats.kstest(w0, stats.beta(3 * alpha[0], rest).cdf).pvalue < ALPHA  # control
