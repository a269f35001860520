"""A target of your own, for ``nrpt run --target docs/examples/my_model.py:TARGET``.

A 2-D banana: x1 ~ N(0, 2^2) and x2 | x1 ~ N(b (x1^2 - 4), 1), so that the exact moments are
known (mean (0, 0), sd of x1 = 2, sd of x2 = sqrt(1 + 32 b^2) = 3 for b = 1/2): the report
prints them beside the sampled ones.  A target needs only ``dim`` and ``energy(x)`` (U = -log pi
up to a constant, ``x`` is ``[n, dim]``, the result ``[n]``); gradients come from autograd.
"""

import torch


class Banana:
    name = "banana"
    dim = 2

    def __init__(self, b: float = 0.5):
        self.b = b
        self.mean = torch.zeros(2, dtype=torch.float64)
        self.cov = torch.diag(torch.tensor([4.0, 1.0 + 32.0 * b * b], dtype=torch.float64))

    def energy(self, x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., 0], x[..., 1]
        return x1 ** 2 / 8.0 + (x2 - self.b * (x1 ** 2 - 4.0)) ** 2 / 2.0


TARGET = Banana()
