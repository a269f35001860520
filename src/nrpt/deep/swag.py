"""SWAG (Maddox et al. 2019, NeurIPS, Algorithm 1) on flat ``[d]`` vectors.

After n collections: running mean θ̄, running second moment m, ``Σ_diag = max(m − θ̄², 0)``
and the deviations ``D̂`` of the last ``K = min(n, rank)`` iterates (each against the mean
after its update).  Samples::

    θ̃ = θ̄ + sqrt(scale) · ( Σ_diag^{1/2} z₁ + D̂ z₂ / sqrt(max(K − 1, 1)) )

i.e. N(θ̄, scale · (Σ_diag + D̂ D̂ᵀ / (K − 1))); ``scale = 0.5`` is the paper's,
``diag_only=True`` SWAG-Diagonal."""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["SWAG"]


class SWAG:
    """Running SWAG moments of a ``[dim]`` vector, with a rank-``rank`` deviation matrix.

    Args:
        dim: length d of the parameter vector.
        rank: the maximum number K of deviation columns kept (the paper uses 20); 0 keeps none
            (SWAG-Diagonal only).
        dtype, device: of the stored moments (float64 by default: the second-moment difference
            m − θ̄² loses precision fast in float32).
    """

    def __init__(self, dim: int, rank: int = 20, dtype: torch.dtype = torch.float64,
                 device: torch.device | str | None = None) -> None:
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
            raise ValueError(f"dim must be a positive integer, got {dim!r}")
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
            raise ValueError(f"rank must be a non-negative integer, got {rank!r}")
        if not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating-point dtype, got {dtype}")
        self.dim, self.rank = dim, rank
        self.n_collected = 0
        self._mean = torch.zeros(dim, dtype=dtype, device=device)
        self._sq_mean = torch.zeros(dim, dtype=dtype, device=device)
        self._dev = torch.zeros(rank, dim, dtype=dtype, device=device)   # ring buffer of rows
        self._next = 0                                                   # row written next

    # ------------------------------------------------------------------ collection
    def collect(self, theta: Tensor) -> None:
        """Add one iterate ``theta[d]`` (any float dtype/device; converted to SWAG's)."""
        if not isinstance(theta, Tensor) or tuple(theta.shape) != (self.dim,):
            shape = tuple(theta.shape) if isinstance(theta, Tensor) else type(theta).__name__
            raise ValueError(f"theta must be a 1-D tensor of length dim={self.dim}, got {shape}")
        t = theta.detach().to(dtype=self._mean.dtype, device=self._mean.device)
        if not bool(torch.isfinite(t).all()):
            raise ValueError("theta must be finite (found nan or inf)")
        n = self.n_collected + 1
        self._mean = self._mean + (t - self._mean) / n
        self._sq_mean = self._sq_mean + (t * t - self._sq_mean) / n
        if self.rank:
            self._dev[self._next] = t - self._mean
            self._next = (self._next + 1) % self.rank
        self.n_collected = n

    # ------------------------------------------------------------------ moments
    @property
    def mean(self) -> Tensor:
        """θ̄, the running mean ``[d]``."""
        return self._mean.clone()

    @property
    def variance_diag(self) -> Tensor:
        """Σ_diag = max(E[θ²] − θ̄², 0), the population (ddof 0) variance ``[d]``."""
        return (self._sq_mean - self._mean ** 2).clamp(min=0.0)

    @property
    def n_deviations(self) -> int:
        """K = min(n_collected, rank), the deviation columns held."""
        return min(self.n_collected, self.rank)

    @property
    def deviations(self) -> Tensor:
        """D̂ as ``[d, K]``, oldest column first."""
        k = self.n_deviations
        if k < self.rank:
            rows = self._dev[:k]
        else:
            rows = torch.roll(self._dev, -self._next, dims=0)
        return rows.T.clone()

    def covariance(self, scale: float = 0.5, diag_only: bool = False) -> Tensor:
        """The dense ``[d, d]`` covariance of :meth:`sample`:
        ``scale · (diag(Σ_diag) + D̂ D̂ᵀ / max(K − 1, 1))`` (for checks on small d)."""
        cov = torch.diag(self.variance_diag)
        if not diag_only and self.n_deviations:
            d = self.deviations
            cov = cov + d @ d.T / max(self.n_deviations - 1, 1)
        return scale * cov

    # ------------------------------------------------------------------ sampling
    def sample(self, generator: torch.Generator, scale: float = 0.5, diag_only: bool = False,
               num_samples: int | None = None) -> Tensor:
        """One draw ``[d]`` (or ``num_samples`` draws ``[num_samples, d]``) of
        θ̄ + sqrt(scale) (Σ_diag^{1/2} z₁ + D̂ z₂ / sqrt(max(K − 1, 1))).

        ``generator`` is the only source of randomness (on SWAG's device): z₁ ``[(S,) d]`` is drawn
        first, then z₂ ``[(S,) K]`` unless ``diag_only``.  ``scale`` multiplies the covariance
        (0.5 is the paper's; 1 the fitted Gaussian itself)."""
        if self.n_collected < 2:
            raise RuntimeError(f"SWAG.sample needs at least 2 collected iterates to estimate a "
                               f"covariance, has {self.n_collected}")
        if not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale < 0:
            raise ValueError(f"scale must be a finite number >= 0, got {scale!r}")
        if num_samples is not None and (not isinstance(num_samples, int) or num_samples < 1):
            raise ValueError(f"num_samples must be None or a positive integer, got {num_samples!r}")
        shape = (num_samples,) if num_samples is not None else ()
        kw = {"dtype": self._mean.dtype, "device": self._mean.device, "generator": generator}
        z1 = torch.randn(*shape, self.dim, **kw)
        eps = self.variance_diag.sqrt() * z1
        k = self.n_deviations
        if not diag_only and k:
            z2 = torch.randn(*shape, k, **kw)
            eps = eps + (z2 @ self.deviations.T) / math.sqrt(max(k - 1, 1))
        return self._mean + math.sqrt(scale) * eps

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """Ints and tensors only (``torch.load(weights_only=True)`` reads it); the deviations are
        stored oldest first as ``[K, d]``."""
        return {"dim": self.dim, "rank": self.rank, "n_collected": self.n_collected,
                "mean": self._mean.clone(), "sq_mean": self._sq_mean.clone(),
                "deviations": self.deviations.T.contiguous()}

    def load_state_dict(self, state: dict) -> None:
        if int(state["dim"]) != self.dim or int(state["rank"]) != self.rank:
            raise ValueError(f"state is of a SWAG with dim={state['dim']}, rank={state['rank']}; "
                             f"this one has dim={self.dim}, rank={self.rank}")
        n = int(state["n_collected"])
        rows = state["deviations"]
        if tuple(rows.shape) != (min(n, self.rank), self.dim):
            raise ValueError(f"state['deviations'] must be [min(n_collected, rank), dim] = "
                             f"{[min(n, self.rank), self.dim]}, got {list(rows.shape)}")
        kw = {"dtype": self._mean.dtype, "device": self._mean.device}
        self._mean = state["mean"].to(**kw).clone()
        self._sq_mean = state["sq_mean"].to(**kw).clone()
        self._dev = torch.zeros(self.rank, self.dim, **kw)
        self._dev[: rows.shape[0]] = rows.to(**kw)
        self._next = rows.shape[0] % self.rank if self.rank else 0
        self.n_collected = n

    def __repr__(self) -> str:
        return (f"SWAG(dim={self.dim}, rank={self.rank}, n_collected={self.n_collected}, "
                f"dtype={self._mean.dtype})")
