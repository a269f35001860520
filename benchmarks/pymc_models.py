"""PyMC models with exactly known log marginal likelihoods, for ``benchmarks/pymc_smc.py`` and
the workflow example (``docs/examples/pymc_workflow.py``).

Every builder returns ``(model, log_z, facts)``: a ``pm.Model`` over synthetic data drawn from a
fixed NumPy seed, its exact log marginal likelihood ``log p(y)`` (closed form, or one- and
two-dimensional quadrature of closed-form conditionals), and a dict of facts (posterior means
and variances where they are known in closed form, by variable name).

* ``normal-normal``  -- y_i ~ N(mu, 1), mu ~ N(0, 10^2): y ~ N(0, I + 100 11^T).
* ``beta-binomial``  -- k ~ Binomial(n, p), p ~ Beta(2, 2): log C(n, k) + log B(a+k, b+n-k)
  - log B(a, b).
* ``linear-regression`` -- y ~ N(X w, 0.5^2 I), w ~ N(0, 2^2 I_3): y ~ N(0, 0.25 I + 4 X X^T).
* ``mixture``        -- y_i ~ 0.5 N(mu_1, 1) + 0.5 N(mu_2, 1), mu_k ~ N(0, 5^2) iid: two
  label-switched posterior modes; log Z by quadrature on a fine 2-D grid.
* ``hierarchical``   -- the eight schools, non-centred: theta_j = mu + tau eta_j,
  mu ~ N(0, 5^2), tau ~ HalfCauchy(5), eta_j ~ N(0, 1), y_j ~ N(theta_j, sigma_j^2).  Given tau,
  y ~ N(0, 25 11^T + diag(sigma^2 + tau^2)), so log Z is a 1-D integral over tau.
"""

from __future__ import annotations

import numpy as np
from scipy import integrate, special, stats


def _mvn_logpdf(y: np.ndarray, cov: np.ndarray) -> float:
    return float(stats.multivariate_normal(np.zeros(len(y)), cov).logpdf(y))


def normal_normal(seed: int = 0, n: int = 50):
    import pymc as pm

    y = np.random.default_rng(seed).normal(1.0, 1.0, size=n)
    with pm.Model(name="") as model:
        mu = pm.Normal("mu", 0.0, 10.0)
        pm.Normal("y", mu, 1.0, observed=y)
    prec = 1 / 100 + n
    facts = {"mean": {"mu": y.sum() / prec}, "var": {"mu": 1 / prec}}
    return model, _mvn_logpdf(y, np.eye(n) + 100.0 * np.ones((n, n))), facts


def beta_binomial(seed: int = 0, n: int = 100, a: float = 2.0, b: float = 2.0):
    import pymc as pm

    k = int(np.random.default_rng(seed).binomial(n, 0.37))
    with pm.Model() as model:
        p = pm.Beta("p", a, b)
        pm.Binomial("k", n=n, p=p, observed=k)
    log_z = (special.gammaln(n + 1) - special.gammaln(k + 1) - special.gammaln(n - k + 1)
             + special.betaln(a + k, b + n - k) - special.betaln(a, b))
    a1, b1 = a + k, b + n - k
    facts = {"mean": {"p": a1 / (a1 + b1)},
             "var": {"p": a1 * b1 / ((a1 + b1) ** 2 * (a1 + b1 + 1))}}
    return model, float(log_z), facts


def linear_regression(seed: int = 0, n: int = 100, noise: float = 0.5, prior_sd: float = 2.0):
    import pymc as pm

    g = np.random.default_rng(seed)
    X = g.normal(size=(n, 3))
    w_true = np.array([1.0, -2.0, 0.5])
    y = X @ w_true + noise * g.normal(size=n)
    with pm.Model(coords={"feature": ["a", "b", "c"]}) as model:
        w = pm.Normal("w", 0.0, prior_sd, dims="feature")
        pm.Normal("y", pm.math.dot(X, w), noise, observed=y)
    prec = X.T @ X / noise**2 + np.eye(3) / prior_sd**2
    facts = {"mean": {"w": np.linalg.solve(prec, X.T @ y / noise**2)},
             "var": {"w": np.diag(np.linalg.inv(prec))}}
    cov = noise**2 * np.eye(n) + prior_sd**2 * X @ X.T
    return model, _mvn_logpdf(y, cov), facts


def _mixture_data(seed: int, n: int) -> np.ndarray:
    g = np.random.default_rng(seed)
    return np.where(g.random(n) < 0.5, -2.0, 2.0) + g.normal(size=n)


def mixture(seed: int = 0, n: int = 40, prior_sd: float = 5.0):
    import pymc as pm

    y = _mixture_data(seed, n)
    with pm.Model(coords={"component": [0, 1]}) as model:
        mu = pm.Normal("mu", 0.0, prior_sd, dims="component")
        pm.NormalMixture("y", w=np.array([0.5, 0.5]), mu=mu, sigma=1.0, observed=y)
    # log Z = log of the double integral of prior x likelihood by the trapezoid rule on a
    # 601^2 grid over [-6, 6]^2 (spacing 0.02; the posterior modes have sd ~ 0.22, and the
    # value agrees with a 1201^2 grid to 1e-9)
    grid = np.linspace(-6.0, 6.0, 601)
    comp = stats.norm.logpdf(y[None, :], grid[:, None], 1.0) + np.log(0.5)  # [grid, n]
    loglik = np.stack([np.logaddexp(comp[i][None, :], comp).sum(-1) for i in range(len(grid))])
    logprior = stats.norm.logpdf(grid, 0, prior_sd)
    logjoint = loglik + logprior[:, None] + logprior[None, :]
    top = logjoint.max()
    inner = np.trapezoid(np.exp(logjoint - top), grid, axis=1)
    log_z = top + np.log(np.trapezoid(inner, grid))
    return model, float(log_z), {}


SCHOOLS_Y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
SCHOOLS_SIGMA = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])


def hierarchical(seed: int = 0):
    import pymc as pm

    y, sigma = SCHOOLS_Y, SCHOOLS_SIGMA
    with pm.Model(coords={"school": list("ABCDEFGH")}) as model:
        mu = pm.Normal("mu", 0.0, 5.0)
        tau = pm.HalfCauchy("tau", 5.0)
        eta = pm.Normal("eta", 0.0, 1.0, dims="school")
        theta = pm.Deterministic("theta", mu + tau * eta, dims="school")
        pm.Normal("y", theta, sigma, observed=y)

    def integrand(t: float) -> float:
        cov = 25.0 * np.ones((8, 8)) + np.diag(sigma**2 + t**2)
        return np.exp(_mvn_logpdf(y, cov) + stats.halfcauchy.logpdf(t, scale=5.0) + 40.0)

    val, _ = integrate.quad(integrand, 0.0, np.inf, limit=400, epsabs=0, epsrel=1e-10)
    return model, float(np.log(val) - 40.0), {}


MODELS = {"normal-normal": normal_normal, "beta-binomial": beta_binomial,
          "linear-regression": linear_regression, "mixture": mixture,
          "hierarchical": hierarchical}
