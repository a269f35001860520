"""Gaussian targets: a correlated Gaussian, isotropic Gaussian mixtures, a Gaussian reference.

All follow the nrpt target protocol (:mod:`nrpt.targets.protocol`): ``energy(x)`` returns
``U(x) = -log pi(x)`` of shape ``[n]`` for ``x`` of shape ``[n, dim]``, in the dtype and on the
device of ``x`` and differentiable by autograd.  Parameters are stored as float64 CPU tensors and
cast on use.  Each class knows its exact moments (``mean``, ``cov``), its ``log_normalizer``
``log ∫ exp(-U)``, and draws exact samples from an explicit ``torch.Generator``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from nrpt.targets._util import (
    as_float64,
    check_states,
    like,
    logsumexp,
    randn,
    sum_last,
    to_like_input,
)
from nrpt.targets.protocol import TargetError

__all__ = [
    "Gaussian",
    "GaussianMixture",
    "GaussianReference",
    "bimodal_1d",
    "gaussian",
    "mixture_2d",
]

_LOG_2PI = math.log(2.0 * math.pi)


class Gaussian:
    """Multivariate normal ``N(mean, cov)`` as an energy target.

    ``U(x) = 0.5 (x - m)^T cov^{-1} (x - m)`` (no constant), so ``exp(-U)`` integrates to
    ``exp(log_normalizer)`` with ``log_normalizer = 0.5 dim log(2 pi) + 0.5 log det cov``.
    The quadratic form uses the Cholesky factor of ``cov``.

    Args:
        mean: ``[dim]``.
        cov: ``[dim, dim]`` symmetric positive definite.
        name: label for logs.
    """

    def __init__(self, mean, cov, name: str = "gaussian") -> None:
        mean = as_float64(mean, "mean").reshape(-1)
        cov = as_float64(cov, "cov")
        d = mean.numel()
        if d < 1:
            raise TargetError("Gaussian: mean must have at least one entry")
        if cov.shape != (d, d):
            raise TargetError(f"Gaussian: cov must have shape [{d}, {d}]; got {list(cov.shape)}")
        if not torch.allclose(cov, cov.T, rtol=1e-10, atol=1e-12):
            raise TargetError("Gaussian: cov must be symmetric")
        chol, info = torch.linalg.cholesky_ex(cov)
        if int(info) != 0:
            raise TargetError("Gaussian: cov must be positive definite")
        self.dim: int = d
        self.name = name
        self.mean = mean
        self.cov = cov
        self.chol = chol
        self.log_normalizer: float = float(
            0.5 * d * _LOG_2PI + torch.log(torch.diagonal(chol)).sum()
        )

    def energy(self, x: torch.Tensor) -> torch.Tensor:
        """``U(x) = 0.5 |L^{-1}(x - m)|^2``, shape ``[n]``."""
        check_states(x, self.dim, "Gaussian.energy")
        diff = x - like(self.mean, x)
        z = torch.linalg.solve_triangular(like(self.chol, x), diff.T, upper=False)
        return 0.5 * (z * z).sum(dim=0)

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """Normalized log density, shape ``[n]``."""
        return -self.energy(x) - self.log_normalizer

    def sample(
        self, n: int, generator: torch.Generator, dtype: torch.dtype = torch.float64
    ) -> torch.Tensor:
        """``n`` exact draws ``m + L z``, shape ``[n, dim]``, on the generator's device."""
        z = randn(n, self.dim, generator, dtype)
        return like(self.mean, z) + z @ like(self.chol, z).T

    def initial_states(
        self, n: int, generator: torch.Generator, dtype: torch.dtype = torch.float64
    ) -> torch.Tensor:
        """Standard normal starting states ``[n, dim]``."""
        return randn(n, self.dim, generator, dtype)

    def __repr__(self) -> str:
        return f"Gaussian(dim={self.dim}, name={self.name!r})"


def gaussian(
    dim: int = 2, mean: float = 0.0, std: float = 1.0, correlation: float = 0.0
) -> Gaussian:
    """Built-in ``"gaussian"``: ``N(mean 1, std^2 ((1 - rho) I + rho 1 1^T))`` in ``dim`` dims
    (equicorrelated; positive definite for ``-1/(dim-1) < rho < 1``)."""
    if std <= 0:
        raise TargetError(f"gaussian: std must be > 0; got {std}")
    eye = torch.eye(int(dim), dtype=torch.float64)
    cov = std**2 * ((1.0 - correlation) * eye + correlation * torch.ones_like(eye))
    return Gaussian(torch.full((int(dim),), float(mean), dtype=torch.float64), cov)


class GaussianMixture:
    """Mixture of isotropic normals ``sum_k w_k N(m_k, s_k^2 I)`` in ``dim`` dims.

    ``U(x) = -log sum_k w_k N(x; m_k, s_k^2 I)`` (via :func:`~nrpt.targets.logsumexp`); the
    density is normalized, so ``log_normalizer = 0``.  ``mean`` and ``cov`` are the exact
    mixture moments.

    Args:
        weights: ``[K]`` positive (normalized to sum to 1).
        means: ``[K, dim]`` (or ``[K]`` for ``dim = 1``).
        stds: ``[K]`` positive (or a scalar shared by all components).
        name: label for logs.
    """

    log_normalizer: float = 0.0

    def __init__(self, weights, means, stds, name: str = "gaussian-mixture") -> None:
        w = as_float64(weights, "weights").reshape(-1)
        m = as_float64(means, "means")
        if m.dim() == 1:
            m = m.unsqueeze(1)
        k = w.numel()
        if k < 1 or m.dim() != 2 or m.shape[0] != k:
            raise TargetError(
                f"GaussianMixture: means must be [K, dim] with K = len(weights) = {k}; "
                f"got {list(m.shape)}"
            )
        s = as_float64(stds, "stds").reshape(-1)
        if s.numel() == 1:
            s = s.expand(k).clone()
        if s.numel() != k:
            raise TargetError(f"GaussianMixture: stds must have K = {k} entries; got {s.numel()}")
        if not bool((w > 0).all()) or not bool(torch.isfinite(w).all()):
            raise TargetError("GaussianMixture: weights must be positive and finite")
        if not bool((s > 0).all()) or not bool(torch.isfinite(s).all()):
            raise TargetError("GaussianMixture: stds must be positive and finite")
        w = w / w.sum()
        d = m.shape[1]
        self.dim: int = int(d)
        self.name = name
        self.weights = w
        self.means = m
        self.stds = s
        self.mean = (w[:, None] * m).sum(dim=0)
        second = (w[:, None, None] * (m[:, :, None] * m[:, None, :])).sum(dim=0)
        second = second + (w * s**2).sum() * torch.eye(d, dtype=torch.float64)
        self.cov = second - torch.outer(self.mean, self.mean)
        # log w_k - (d/2) log(2 pi s_k^2): the per-component constant of log w_k N(x; m_k, s_k)
        self._log_coef = torch.log(w) - 0.5 * d * (_LOG_2PI + 2.0 * torch.log(s))

    def component_log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """``log w_k + log N(x; m_k, s_k^2 I)``, shape ``[n, K]``."""
        check_states(x, self.dim, "GaussianMixture.energy")
        diff = x[:, None, :] - like(self.means, x)[None, :, :]
        sq = sum_last(diff * diff)
        return like(self._log_coef, x) - 0.5 * sq / like(self.stds, x) ** 2

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """Normalized log density, shape ``[n]``."""
        return logsumexp(self.component_log_prob(x))

    def energy(self, x: torch.Tensor) -> torch.Tensor:
        """``U(x) = -log pi(x)`` (normalized), shape ``[n]``."""
        return -self.log_prob(x)

    def sample(
        self, n: int, generator: torch.Generator, dtype: torch.dtype = torch.float64
    ) -> torch.Tensor:
        """``n`` exact draws ``[n, dim]``: a component from ``weights``, then its normal."""
        z = randn(n, self.dim, generator, dtype)
        w = self.weights.to(device=generator.device)
        comp = torch.multinomial(w, int(n), replacement=True, generator=generator)
        means = like(self.means, z)[comp]
        return means + like(self.stds, z)[comp, None] * z

    def initial_states(
        self, n: int, generator: torch.Generator, dtype: torch.dtype = torch.float64
    ) -> torch.Tensor:
        """Standard normal starting states ``[n, dim]`` (they know nothing of the modes)."""
        return randn(n, self.dim, generator, dtype)

    def marginal_cdf(self, t, dim_index: int = 0):
        """CDF of coordinate ``dim_index``: ``sum_k w_k Phi((t - m_k[dim_index]) / s_k)``.

        ``t`` may be a float, a numpy array or a tensor; the result comes back in the same kind.
        """
        if not 0 <= dim_index < self.dim:
            raise IndexError(f"dim_index must be in [0, {self.dim}); got {dim_index}")
        tt = as_float64(t, "t")
        z = (tt[..., None] - self.means[:, dim_index]) / self.stds
        values = (self.weights * torch.special.ndtr(z)).sum(dim=-1)
        return to_like_input(values, t)

    def cdf(self, t):
        """CDF of a one-dimensional mixture (see :meth:`marginal_cdf`)."""
        if self.dim != 1:
            raise TargetError(
                f"GaussianMixture.cdf needs dim == 1 (dim = {self.dim}); use marginal_cdf"
            )
        return self.marginal_cdf(t, 0)

    def __repr__(self) -> str:
        return f"GaussianMixture(dim={self.dim}, K={self.weights.numel()}, name={self.name!r})"


def bimodal_1d() -> GaussianMixture:
    """Built-in ``"bimodal"``: ``0.3 N(-4, 1) + 0.7 N(4, 1)`` in one dimension.

    The modes are 8 standard deviations apart (the density at 0 is ``~e^-8`` of the peaks), so
    a local sampler at ``tau = 1`` stays in the mode it starts in; the unequal weights make a
    sampler that mixes but with the wrong proportions detectable.
    """
    return GaussianMixture([0.3, 0.7], [[-4.0], [4.0]], [1.0, 1.0], name="bimodal")


def mixture_2d() -> GaussianMixture:
    """Built-in ``"mixture-2d"``: four unit-variance modes at ``(+-4, +-4)`` with weights
    0.1, 0.2, 0.3, 0.4 (8 standard deviations between neighbouring modes)."""
    means = [[-4.0, -4.0], [-4.0, 4.0], [4.0, -4.0], [4.0, 4.0]]
    return GaussianMixture([0.1, 0.2, 0.3, 0.4], means, [1.0] * 4, name="mixture-2d")


class GaussianReference:
    """Isotropic normal ``N(mean, std^2 I)`` in ``dim`` dims: a reference for geometric paths.

    Args:
        mean: scalar or ``[dim]``.
        std: positive scalar.
        dim: dimension.
    """

    is_normalized = True
    log_normalizer: float = 0.0  # of exp(-energy) = exp(log_prob)

    def __init__(
        self, mean: float | Sequence[float] | torch.Tensor = 0.0, std: float = 1.0, dim: int = 1
    ) -> None:
        dim = int(dim)
        if dim < 1:
            raise TargetError(f"GaussianReference: dim must be >= 1; got {dim}")
        if not std > 0:
            raise TargetError(f"GaussianReference: std must be > 0; got {std}")
        m = as_float64(mean, "mean").reshape(-1)
        if m.numel() == 1:
            m = m.expand(dim).clone()
        if m.numel() != dim:
            raise TargetError(f"GaussianReference: mean must be scalar or [{dim}]")
        self.dim = dim
        self.name = "gaussian-reference"
        self.mean = m
        self.std = float(std)
        self.cov = self.std**2 * torch.eye(dim, dtype=torch.float64)
        self._log_norm = dim * (0.5 * _LOG_2PI + math.log(self.std))

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """Normalized log density, shape ``[n]``."""
        check_states(x, self.dim, "GaussianReference.log_prob")
        z = (x - like(self.mean, x)) / self.std
        return -0.5 * (z * z).sum(dim=1) - self._log_norm

    def energy(self, x: torch.Tensor) -> torch.Tensor:
        """``-log_prob(x)``: the reference is itself a (normalized) energy target."""
        return -self.log_prob(x)

    def sample(
        self, n: int, generator: torch.Generator, dtype: torch.dtype = torch.float64
    ) -> torch.Tensor:
        """``n`` iid draws ``[n, dim]`` on the generator's device."""
        z = randn(n, self.dim, generator, dtype)
        return like(self.mean, z) + self.std * z

    def __repr__(self) -> str:
        return f"GaussianReference(std={self.std}, dim={self.dim})"
