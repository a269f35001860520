"""Analytic geometric paths ``pi_beta ∝ pi_0 L^beta`` (reference ``N(0, I_d)``, normalized)
with closed-form swap rejection rates, barriers and ``log Z(beta)``, to check a PT set-up
against exact numbers.

:class:`ScaledGaussianPath`: ``l(x) = -c |x|^2 / 2 + offset``, ``c > -1``::

    pi_beta = N(0, I_d / a(beta)),   a(beta) = 1 + c beta,
    log Z(beta) = -(d / 2) log a(beta) + beta * offset,
    r(beta, beta') = 1 - 2 I_{m/(a+a')}(d/2, d/2),   m = min(a, a')

(incomplete beta law, Predescu, Predescu & Ciobanu 2004, J. Chem. Phys. 120, 4119), and
(Syed et al. 2021, Sec. 4)::

    lambda(beta) = kappa_d |c| / (1 + c beta),    kappa_d = Gamma((d+1)/2) / (sqrt(pi) Gamma(d/2)),
    Lambda(beta) = kappa_d |log(1 + c beta)|.

:class:`ShiftedGaussianPath`: ``l(x) = mu . x``, ``|mu| = m``::

    pi_beta = N(beta mu, I_d),   log Z(beta) = beta^2 m^2 / 2,
    r(beta, beta') = erf(m |beta - beta'| / 2),
    lambda = m / sqrt(pi),   Lambda(beta) = beta m / sqrt(pi)."""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy import special

from nrpt.targets._util import check_states, like, randn
from nrpt.targets.protocol import TargetError

__all__ = ["ScaledGaussianPath", "ShiftedGaussianPath", "scaled_gaussian_path",
           "shifted_gaussian_path"]

_LOG_2PI = math.log(2.0 * math.pi)


def _betas(beta) -> np.ndarray:
    b = np.asarray(beta, dtype=float)
    if not np.all(np.isfinite(b)) or np.any(b < 0.0) or np.any(b > 1.0):
        raise ValueError(f"beta must be in [0, 1]; got {b.tolist()}")
    return b


def _scalar_or_array(values: np.ndarray, like_input):
    return float(values) if np.ndim(like_input) == 0 else values


class _AnalyticPath:
    """Shared members: the standard normal reference and schedule helpers."""

    dim: int
    reference_is_normalized = True

    def reference_log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """``log N(x; 0, I)``, shape ``[n]``."""
        check_states(x, self.dim, f"{type(self).__name__}.reference_log_prob")
        return -0.5 * (x * x).sum(dim=1) - 0.5 * self.dim * _LOG_2PI

    def reference_sample(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` iid ``N(0, I)`` draws ``[n, dim]`` (float64, on the generator's device)."""
        return randn(n, self.dim, generator, torch.float64)

    # -- analytic quantities (numpy, vectorized over beta) ------------------------------------
    def swap_rejection(self, beta_1, beta_2):
        """Exact rejection rate ``1 - E min(1, alpha)`` of a swap between ``beta_1`` and
        ``beta_2`` (independent draws at the two betas); broadcasts."""
        raise NotImplementedError

    def rejections(self, schedule) -> np.ndarray:
        """Exact rejection rates ``[P-1]`` of the adjacent pairs of a schedule (any order)."""
        s = _betas(schedule)
        return np.asarray(self.swap_rejection(s[:-1], s[1:]), dtype=float)

    def barrier_at(self, beta):
        """Cumulative barrier ``Lambda(beta) = ∫_0^beta lambda``."""
        raise NotImplementedError

    @property
    def barrier(self) -> float:
        """Global communication barrier ``Lambda = Lambda(1)``."""
        return float(self.barrier_at(1.0))

    def optimal_schedule(self, n_slots: int) -> np.ndarray:
        """The schedule ``[P]`` (from 1 down to 0) whose slots are equally spaced in
        ``Lambda(beta)``: the fixed point of the round-based adaptation as ``P -> inf``."""
        if int(n_slots) != n_slots or n_slots < 2:
            raise ValueError(f"n_slots must be an integer >= 2; got {n_slots!r}")
        t = 1.0 - np.arange(int(n_slots)) / (int(n_slots) - 1)
        out = np.clip(self._inverse_barrier_fraction(t), 0.0, 1.0)
        out[0], out[-1] = 1.0, 0.0
        return out

    def _inverse_barrier_fraction(self, t: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class ScaledGaussianPath(_AnalyticPath):
    """Reference ``N(0, I_d)`` to target ``N(0, I_d / (1 + c))`` (see the module docstring).

    Args:
        dim: dimension ``d >= 1``.
        c: precision increment, ``c > -1`` (``c > 0``: the target is narrower; ``c = 0``: the
            target is the reference and every swap is accepted).
        offset: constant added to the log-likelihood; ``log Z`` moves by ``offset`` (used to
            test numerical stability with energies of order ``10^6``).
    """

    def __init__(self, dim: int = 10, c: float = 10.0, offset: float = 0.0,
                 name: str = "geometric-gaussian-path") -> None:
        if isinstance(dim, bool) or int(dim) != dim or dim < 1:
            raise TargetError(f"ScaledGaussianPath: dim must be an integer >= 1; got {dim!r}")
        if not (math.isfinite(float(c)) and float(c) > -1.0):
            raise TargetError(f"ScaledGaussianPath: c must be a finite number > -1; got {c!r}")
        if not math.isfinite(float(offset)):
            raise TargetError(f"ScaledGaussianPath: offset must be finite; got {offset!r}")
        self.dim: int = int(dim)
        self.c = float(c)
        self.offset = float(offset)
        self.name = name
        #: kappa_d = Gamma((d+1)/2) / (sqrt(pi) Gamma(d/2)), via log-gamma for large d
        self.kappa = math.exp(math.lgamma((self.dim + 1) / 2) - math.lgamma(self.dim / 2)
                              - 0.5 * math.log(math.pi))
        self.mean = torch.zeros(self.dim, dtype=torch.float64)
        self.cov = torch.eye(self.dim, dtype=torch.float64) / (1.0 + self.c)
        self.log_normalizer: float = float(self.log_normalizer_at(1.0))

    def log_likelihood(self, x: torch.Tensor) -> torch.Tensor:
        """``l(x) = -c |x|^2 / 2 + offset``, shape ``[n]``."""
        check_states(x, self.dim, "ScaledGaussianPath.log_likelihood")
        return -0.5 * self.c * (x * x).sum(dim=1) + self.offset

    def sample_at(self, beta: float, n: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` exact draws ``[n, dim]`` from ``pi_beta = N(0, I / (1 + c beta))``."""
        b = float(_betas(beta))
        return randn(n, self.dim, generator, torch.float64) / math.sqrt(1.0 + self.c * b)

    def sample(self, n: int, generator: torch.Generator, dtype=torch.float64) -> torch.Tensor:
        """``n`` exact draws from the target (``beta = 1``)."""
        return self.sample_at(1.0, n, generator).to(dtype)

    def log_normalizer_at(self, beta):
        """``log Z(beta) = -(d/2) log(1 + c beta) + beta offset``."""
        b = _betas(beta)
        out = -0.5 * self.dim * np.log1p(self.c * b) + b * self.offset
        return _scalar_or_array(out, beta)

    def swap_rejection(self, beta_1, beta_2):
        b1, b2 = _betas(beta_1), _betas(beta_2)
        a1, a2 = 1.0 + self.c * b1, 1.0 + self.c * b2
        half = self.dim / 2.0
        out = 1.0 - 2.0 * special.betainc(half, half, np.minimum(a1, a2) / (a1 + a2))
        return _scalar_or_array(np.clip(out, 0.0, 1.0), np.broadcast(beta_1, beta_2))

    def local_barrier(self, beta):
        """``lambda(beta) = kappa_d |c| / (1 + c beta)``."""
        b = _betas(beta)
        return _scalar_or_array(self.kappa * abs(self.c) / (1.0 + self.c * b), beta)

    def barrier_at(self, beta):
        b = _betas(beta)
        return _scalar_or_array(self.kappa * np.abs(np.log1p(self.c * b)), beta)

    def _inverse_barrier_fraction(self, t):
        # Lambda(beta) / Lambda = log(1 + c beta) / log(1 + c) for either sign of c
        if self.c == 0.0:
            return t.astype(float)
        return np.expm1(t * math.log1p(self.c)) / self.c

    def __repr__(self) -> str:
        return f"ScaledGaussianPath(dim={self.dim}, c={self.c}, offset={self.offset})"


class ShiftedGaussianPath(_AnalyticPath):
    """Reference ``N(0, I_d)`` to target ``N(mu, I_d)`` with ``mu = (shift / sqrt(d)) (1, ..., 1)``
    (so ``|mu| = shift``); ``l(x) = mu . x`` (see the module docstring)."""

    def __init__(self, dim: int = 2, shift: float = 3.0,
                 name: str = "geometric-shifted-gaussian-path") -> None:
        if isinstance(dim, bool) or int(dim) != dim or dim < 1:
            raise TargetError(f"ShiftedGaussianPath: dim must be an integer >= 1; got {dim!r}")
        if not (math.isfinite(float(shift)) and float(shift) >= 0.0):
            raise TargetError(f"ShiftedGaussianPath: shift must be a finite number >= 0; "
                              f"got {shift!r}")
        self.dim: int = int(dim)
        self.shift = float(shift)
        self.name = name
        self.mu = torch.full((self.dim,), self.shift / math.sqrt(self.dim), dtype=torch.float64)
        self.mean = self.mu.clone()
        self.cov = torch.eye(self.dim, dtype=torch.float64)
        self.log_normalizer: float = float(self.log_normalizer_at(1.0))

    def log_likelihood(self, x: torch.Tensor) -> torch.Tensor:
        """``l(x) = mu . x``, shape ``[n]``."""
        check_states(x, self.dim, "ShiftedGaussianPath.log_likelihood")
        return x @ like(self.mu, x)

    def sample_at(self, beta: float, n: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` exact draws ``[n, dim]`` from ``pi_beta = N(beta mu, I)``."""
        b = float(_betas(beta))
        z = randn(n, self.dim, generator, torch.float64)
        return z + b * like(self.mu, z)

    def sample(self, n: int, generator: torch.Generator, dtype=torch.float64) -> torch.Tensor:
        return self.sample_at(1.0, n, generator).to(dtype)

    def log_normalizer_at(self, beta):
        """``log Z(beta) = beta^2 |mu|^2 / 2``."""
        b = _betas(beta)
        return _scalar_or_array(0.5 * b * b * self.shift**2, beta)

    def swap_rejection(self, beta_1, beta_2):
        b1, b2 = _betas(beta_1), _betas(beta_2)
        out = special.erf(self.shift * np.abs(b1 - b2) / 2.0)
        return _scalar_or_array(out, np.broadcast(beta_1, beta_2))

    def local_barrier(self, beta):
        """``lambda(beta) = |mu| / sqrt(pi)``."""
        b = _betas(beta)
        return _scalar_or_array(np.full_like(b, self.shift / math.sqrt(math.pi)), beta)

    def barrier_at(self, beta):
        b = _betas(beta)
        return _scalar_or_array(b * self.shift / math.sqrt(math.pi), beta)

    def _inverse_barrier_fraction(self, t):
        return t.astype(float)

    def __repr__(self) -> str:
        return f"ShiftedGaussianPath(dim={self.dim}, shift={self.shift})"


def scaled_gaussian_path(dim: int = 10, c: float = 10.0, offset: float = 0.0) -> ScaledGaussianPath:
    """Built-in ``"geometric-gaussian-path"``: ``N(0, I_d) -> N(0, I_d / (1 + c))``;
    ``Lambda = kappa_d log(1 + c)`` (2.95 for the defaults d = 10, c = 10)."""
    return ScaledGaussianPath(dim=dim, c=c, offset=offset)


def shifted_gaussian_path(dim: int = 2, shift: float = 3.0) -> ShiftedGaussianPath:
    """Built-in ``"geometric-shifted-gaussian-path"``: ``N(0, I_d) -> N(mu, I_d)``,
    ``|mu| = shift``; ``Lambda = shift / sqrt(pi)``."""
    return ShiftedGaussianPath(dim=dim, shift=shift)
