"""A Bayesian Gaussian mixture with label-switching modes (Syed et al. 2021, Sec. 7): ``K``
equal-weight components of known scale ``sigma``, means ``mu[K]``::

    mu_k ~ N(0, prior_std^2)  iid                         (prior = the path's reference)
    y_i | mu ~ (1/K) sum_k N(mu_k, sigma^2),  i = 1..n    (likelihood)

``K!`` symmetric posterior modes; a geometric path from the normalized prior, so ``log Z`` is
the log marginal likelihood.  States ``x = mu`` are ``[n, K]``."""

from __future__ import annotations

import math
from itertools import permutations

import numpy as np
import torch

from nrpt.targets._util import as_float64, check_states, like, randn
from nrpt.targets.protocol import TargetError

__all__ = ["GaussianMixtureModel", "mixture_model"]

_LOG_2PI = math.log(2.0 * math.pi)


class GaussianMixtureModel:
    """Posterior of the component means of an equal-weight Gaussian mixture (see above).

    Args:
        data: observations ``[n]`` (default: :meth:`synthetic` data).
        n_components: ``K >= 2``.
        sigma: the known component standard deviation.
        prior_std: standard deviation of the ``N(0, prior_std^2)`` prior of every mean.
    """

    reference_is_normalized = True

    def __init__(self, data=None, n_components: int = 3, sigma: float = 1.0,
                 prior_std: float = 10.0, name: str = "geometric-mixture-model") -> None:
        if isinstance(n_components, bool) or int(n_components) != n_components or \
                n_components < 2:
            raise TargetError(f"mixture model: n_components must be an integer >= 2; "
                              f"got {n_components!r}")
        if not (float(sigma) > 0 and math.isfinite(float(sigma))):
            raise TargetError(f"mixture model: sigma must be > 0; got {sigma!r}")
        if not (float(prior_std) > 0 and math.isfinite(float(prior_std))):
            raise TargetError(f"mixture model: prior_std must be > 0; got {prior_std!r}")
        self.dim: int = int(n_components)
        self.sigma = float(sigma)
        self.prior_std = float(prior_std)
        y = self.synthetic(self.dim) if data is None else as_float64(data, "data").reshape(-1)
        if y.numel() < 1 or not bool(torch.isfinite(y).all()):
            raise TargetError("mixture model: data must be a non-empty array of finite numbers")
        self.data = y
        self.name = name

    @staticmethod
    def synthetic(n_components: int = 3, per_component: int = 20, spacing: float = 4.0,
                  seed: int = 20210601) -> torch.Tensor:
        """``per_component`` draws from each ``N(m_k, 1)``, ``m_k`` equally spaced ``spacing``
        apart and centred at 0, from a fixed seed (the shipped example data)."""
        g = torch.Generator().manual_seed(seed)
        centres = spacing * (torch.arange(n_components, dtype=torch.float64)
                             - (n_components - 1) / 2)
        noise = torch.randn(n_components, per_component, generator=g, dtype=torch.float64)
        return (centres[:, None] + noise).reshape(-1)

    # -- the geometric form -------------------------------------------------------------------
    def log_likelihood(self, x: torch.Tensor) -> torch.Tensor:
        """``sum_i log (1/K) sum_k N(y_i; mu_k, sigma^2)``, shape ``[n]``."""
        check_states(x, self.dim, "GaussianMixtureModel.log_likelihood")
        y = like(self.data, x)
        z = (y[None, :, None] - x[:, None, :]) / self.sigma  # [n, N, K]
        comp = -0.5 * z * z - math.log(self.sigma) - 0.5 * _LOG_2PI - math.log(self.dim)
        return torch.logsumexp(comp, dim=2).sum(dim=1)

    def reference_log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """The prior ``log N(mu; 0, prior_std^2 I)``, shape ``[n]``."""
        check_states(x, self.dim, "GaussianMixtureModel.reference_log_prob")
        z = x / self.prior_std
        return -0.5 * (z * z).sum(dim=1) - self.dim * (0.5 * _LOG_2PI + math.log(self.prior_std))

    def reference_sample(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` iid prior draws ``[n, K]``."""
        return self.prior_std * randn(n, self.dim, generator, torch.float64)

    # -- label switching ----------------------------------------------------------------------
    def label_permutation(self, x) -> np.ndarray:
        """Which ordering of the labels each state is in: the index (in
        ``itertools.permutations(range(K))`` order) of ``argsort(mu)``, shape ``[n]``.
        A sampler that mixes over the label-switching modes visits all ``K!`` of them about
        equally often."""
        mu = np.asarray(x.detach().cpu() if isinstance(x, torch.Tensor) else x, dtype=float)
        mu = mu.reshape(-1, self.dim)
        table = {p: i for i, p in enumerate(permutations(range(self.dim)))}
        return np.array([table[tuple(int(j) for j in row)] for row in np.argsort(mu, axis=1)])

    def __repr__(self) -> str:
        return (f"GaussianMixtureModel(K={self.dim}, n={self.data.numel()}, sigma={self.sigma}, "
                f"prior_std={self.prior_std})")


def mixture_model(n_components: int = 3, per_component: int = 20, spacing: float = 4.0,
                  sigma: float = 1.0, prior_std: float = 10.0) -> GaussianMixtureModel:
    """Built-in ``"geometric-mixture-model"``: the label-switching mixture on synthetic data
    (``K = 3`` components 4 apart, 20 points each; ``K! = 6`` posterior modes)."""
    data = GaussianMixtureModel.synthetic(n_components, per_component, spacing)
    return GaussianMixtureModel(data, n_components, sigma, prior_std)
