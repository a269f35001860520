"""The mix25 target of the peer benchmark in nrpt's target protocol (geometric form).

``log_likelihood`` is the normalized 25-component Gaussian mixture (sigma = 0.2, grid
{-4, -2, 0, 2, 4}^2, logsumexp), the reference is uniform on [-6, 6]^2 and is normalized, so
nrpt's stepping-stone estimate is the absolute log Z = -log 144 (see ``protocol.py``).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import protocol  # noqa: E402


class Mix25:
    """Uniform prior on [-6, 6]^2 times a mixture of 25 isotropic Gaussians."""

    name = "mix25"
    dim = protocol.DIM
    reference_is_normalized = True

    def __init__(self, sigma: float = protocol.SIGMA):
        self.sigma = float(sigma)
        self._centres = torch.as_tensor(protocol.CENTRES, dtype=torch.float64)
        self._const = -math.log(protocol.N_MODES) - math.log(2 * math.pi * self.sigma**2)

    def log_likelihood(self, x: torch.Tensor) -> torch.Tensor:
        c = self._centres.to(dtype=x.dtype, device=x.device)
        d = (x[:, None, :] - c) ** 2
        if torch.compiler.is_compiling():  # (one compiled graph: the reduction fuses best)
            d2 = d.sum(-1)
        else:  # eagerly, coordinate by coordinate: torch's CPU sum over a last axis of length
            # 2 costs 165 us on [256, 25, 2], the explicit sum 9 us (make bench-parts, one
            # thread); the same numbers (a sum of two terms is one rounded addition)
            d2 = d[..., 0]
            for i in range(1, self.dim):
                d2 = d2 + d[..., i]
        return torch.logsumexp(-0.5 * d2 / self.sigma**2, dim=-1) + self._const

    def reference_log_prob(self, x: torch.Tensor) -> torch.Tensor:
        inside = (x.abs() <= protocol.BOX).all(-1)
        return torch.where(inside, torch.full_like(x[:, 0], protocol.LOG_PRIOR),
                           torch.full_like(x[:, 0], -math.inf))

    def reference_sample(self, n: int, generator: torch.Generator) -> torch.Tensor:
        u = torch.rand(n, self.dim, generator=generator, dtype=torch.float64)
        return (2.0 * u - 1.0) * protocol.BOX
