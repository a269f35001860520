"""Minibatch targets for stochastic-gradient PT (data + per-datum loss), and VR-reSGLD's
mixture-mean model.  A minibatch target is an energy target that also exposes ``data``
``[N, ...]``, ``n_data``, ``loss(x[B, dim], batch[B, n, ...]) -> [B, n]`` and
``prior_energy(x[B, dim]) -> [B]``, with
``U(x) = sum_i loss(x, d_i) + prior_energy(x)``
(estimated by :class:`nrpt.energy.estimators.MinibatchEnergy`)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from nrpt.targets._util import check_generator, check_states

__all__ = ["MinibatchTarget", "MixtureMeanModel", "mixture_mean"]


class MinibatchTarget:
    """A posterior given by data and a per-datum loss (see the module docstring).

    Args:
        data: ``[N, ...]`` tensor (float64 is kept; other dtypes are converted on use).
        loss: ``loss(x[B, dim], batch[B, n, ...]) -> [B, n]``, the negative log likelihood of
            each datum of each state's batch.
        dim: dimension of the states.
        prior_energy: ``x[B, dim] -> [B]``, minus the log prior (default 0, a flat prior).
        name: shown in reports.
        chunk: data per chunk when the full energy is evaluated (bounds memory).
    """

    def __init__(self, data, loss: Callable, dim: int, prior_energy: Callable | None = None,
                 name: str = "minibatch-target", chunk: int = 4096):
        self.data = torch.as_tensor(data)
        if self.data.ndim < 1 or self.data.shape[0] < 1:
            raise ValueError("data must be a tensor [N, ...] with N >= 1")
        if isinstance(dim, bool) or int(dim) != dim or dim < 1:
            raise ValueError(f"dim must be an integer >= 1; got {dim!r}")
        self.n_data = int(self.data.shape[0])
        self.dim = int(dim)
        self._loss = loss
        self._prior = prior_energy
        self.name = name
        self.chunk = int(chunk)

    def loss(self, x: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        return self._loss(x, batch.to(x.dtype) if batch.is_floating_point() else batch)

    def prior_energy(self, x: torch.Tensor) -> torch.Tensor:
        if self._prior is None:
            return x.new_zeros(x.shape[0])
        return self._prior(x)

    def energy(self, x: torch.Tensor) -> torch.Tensor:
        """Full-data energy ``[n]`` (summed in chunks of the data)."""
        check_states(x, self.dim, f"{self.name}.energy")
        total = self.prior_energy(x)
        for start in range(0, self.n_data, self.chunk):
            part = self.data[start:start + self.chunk].to(x.device)
            batch = part.unsqueeze(0).expand(x.shape[0], *part.shape)
            total = total + self.loss(x, batch).sum(-1)
        return total

    def __repr__(self) -> str:
        return f"MinibatchTarget(name={self.name!r}, N={self.n_data}, dim={self.dim})"


class MixtureMeanModel(MinibatchTarget):
    """The mixture-mean model of VR-reSGLD (Deng et al. 2021, Sec. 5.1), one parameter ``mu``:

        d_i ~ 0.5 N(mu, s^2) + 0.5 N(gamma - mu, s^2),   i = 1..N,

    with ``mu_true = -5``, ``gamma = 20``, ``s = 5``, ``N = 1000`` by default and a flat prior, so
    ``loss(mu, d) = -log(0.5 N(d; mu, s^2) + 0.5 N(d; gamma - mu, s^2))``.  The posterior is
    bimodal: ``mu`` and ``gamma - mu`` explain the data equally well (modes near -5 and 25).
    The data are drawn once from a generator seeded by ``data_seed``.

    :meth:`density_grid` gives the exact normalized posterior on a 1-D grid (for errors).
    """

    def __init__(self, n_data: int = 1000, mu: float = -5.0, gamma: float = 20.0,
                 sd: float = 5.0, data_seed: int = 0, prior_sd: float | None = None):
        g = torch.Generator().manual_seed(int(data_seed))
        n = int(n_data)
        comp = torch.rand(n, generator=g, dtype=torch.float64) < 0.5
        centre = torch.where(comp, torch.tensor(float(mu), dtype=torch.float64),
                             torch.tensor(float(gamma - mu), dtype=torch.float64))
        data = centre + float(sd) * torch.randn(n, generator=g, dtype=torch.float64)
        self.mu_true, self.gamma, self.sd = float(mu), float(gamma), float(sd)
        self.prior_sd = prior_sd
        prior = None if prior_sd is None else (lambda x: 0.5 * (x[:, 0] / prior_sd) ** 2)
        super().__init__(data, self._mixture_loss, dim=1, prior_energy=prior,
                         name="mixture-mean")

    def _mixture_loss(self, x: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        mu = x[:, :1]  # [B, 1] against batch [B, n]
        s2 = self.sd**2
        a = -0.5 * (batch - mu) ** 2 / s2
        b = -0.5 * (batch - (self.gamma - mu)) ** 2 / s2
        return -(torch.logaddexp(a, b) + math.log(0.5) - 0.5 * math.log(2 * math.pi * s2))

    def initial_states(self, n: int, generator: torch.Generator,
                       dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """Start near the left mode: uniform on [-8, -2] (so a sampler must cross to reach the
        other mode)."""
        g = check_generator(generator)
        return -8.0 + 6.0 * torch.rand(int(n), 1, generator=g, dtype=dtype, device=g.device)

    def density_grid(self, lim: tuple[float, float] = (-15.0, 35.0), bins: int = 500):
        """``(edges[bins + 1], probs[bins])``: posterior mass per cell (midpoint rule on a
        20x finer grid; the mass outside ``lim`` is negligible for the default data)."""
        edges = np.linspace(lim[0], lim[1], bins + 1)
        fine = 20
        pts = np.linspace(lim[0], lim[1], bins * fine + 1)
        mids = 0.5 * (pts[1:] + pts[:-1])
        with torch.no_grad():
            u = self.energy(torch.from_numpy(mids)[:, None]).numpy()
        w = np.exp(-(u - u.min()))
        probs = w.reshape(bins, fine).sum(1)
        return edges, probs / probs.sum()


def mixture_mean(**kwargs) -> MixtureMeanModel:
    """Factory for :class:`MixtureMeanModel` (keyword arguments as the class)."""
    return MixtureMeanModel(**kwargs)
