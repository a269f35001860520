"""Targets and a metric wrapper shared by tests/test_automala.py and tests/test_nuts.py: each
target is exactly samplable at any slot ``b`` of a temperature ladder (``sample_at``), so
:func:`nrpt.testing.check_invariance` starts from exact draws and takes its truth from them."""

from __future__ import annotations

import math

import torch

from nrpt.targets import Gaussian

B = 0.7  # a temperature-ladder slot other than the target's


class Funnel:
    """x1 ~ N(0, s^2), x2 | x1 ~ N(0, exp(c x1)): the step that suits the neck is far too
    small for the mouth.  Tempered by b it stays exactly samplable: x1 ~ N((1 - b) c s^2 /
    (2 b), s^2 / b), x2 | x1 ~ N(0, exp(c x1) / b)."""

    name = "funnel"
    dim = 2

    def __init__(self, s: float = 1.0, c: float = 1.0):
        self.s, self.c = s, c

    def energy(self, x):
        x1, x2 = x[..., 0], x[..., 1]
        return 0.5 * (x1 / self.s) ** 2 + 0.5 * x2**2 * torch.exp(-self.c * x1) + 0.5 * self.c * x1

    def sample_at(self, b, n, g):
        z = torch.randn(n, 2, generator=g, dtype=torch.float64)
        x1 = (1 - b) * self.c * self.s**2 / (2 * b) + z[:, 0] * self.s / math.sqrt(b)
        return torch.stack([x1, z[:, 1] * torch.exp(0.5 * self.c * x1) / math.sqrt(b)], -1)


def ill_gaussian() -> Gaussian:
    """Badly scaled and correlated: sds 1 and 0.1, correlation 0.3."""
    return Gaussian([1.0, -1.0], [[1.0, 0.03], [0.03, 0.01]])


class TemperedGaussian:
    """``Gaussian`` at slot b, with exact draws there (``sample_at``)."""

    def __init__(self, g: Gaussian):
        self.g, self.dim, self.name = g, g.dim, "badly scaled gaussian"

    def energy(self, x):
        return self.g.energy(x)

    def sample_at(self, b, n, gen):
        return self.g.mean + (self.g.sample(n, gen) - self.g.mean) / math.sqrt(b)


TARGETS = {"gaussian": lambda: TemperedGaussian(ill_gaussian()), "funnel": Funnel}
#: fixed metrics (any metric must leave pi_b invariant); they do not whiten the targets, so
#: the negative controls stay badly scaled in the whitened space too
METRICS = {"none": None,
           "diag": torch.tensor([0.6, 0.6], dtype=torch.float64),
           "dense": torch.tensor([[0.6, 0.0], [0.06, 0.5]], dtype=torch.float64)}
