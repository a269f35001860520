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

from nrpt.targets import logsumexp

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
        if torch.compiler.is_compiling():  # (one compiled graph: the reduction fuses best)
            d2 = ((x[:, None, :] - c) ** 2).sum(-1)
            return torch.logsumexp(-0.5 * d2 / self.sigma**2, dim=-1) + self._const
        # Eagerly, two things cost more than the arithmetic on [256, 25(, 2)] (make
        # bench-parts, one thread): a broadcast or a reduction over a last axis of length 2
        # (the sum: 165 us, against 9 us written coordinate by coordinate), and torch's CPU exp
        # of arguments below -708 (4x slower than in range).  So the squared distances are
        # summed coordinate by coordinate, and nrpt.targets.logsumexp floors the exponents far
        # below the maximum (the same numbers, bit for bit).
        d2 = None
        for i in range(self.dim):
            di = x[:, i:i + 1] - c[:, i]
            d2 = di * di if d2 is None else d2 + di * di
        return logsumexp(-0.5 * d2 / self.sigma**2) + self._const

    def reference_log_prob(self, x: torch.Tensor) -> torch.Tensor:
        inside = x[:, 0].abs() <= protocol.BOX
        for i in range(1, self.dim):  # (coordinate by coordinate, as above)
            inside = inside & (x[:, i].abs() <= protocol.BOX)
        return torch.full_like(x[:, 0], -math.inf).masked_fill_(inside, protocol.LOG_PRIOR)

    def reference_sample(self, n: int, generator: torch.Generator) -> torch.Tensor:
        u = torch.rand(n, self.dim, generator=generator, dtype=torch.float64)
        return (2.0 * u - 1.0) * protocol.BOX
