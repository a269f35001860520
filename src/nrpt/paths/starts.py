r"""Overdispersed, independent initial states (issue 25, item 4).

R-hat compares the systems: it can see a chain stuck on a ridge only if the systems started
in different places, relative to the posterior's own scale.  What nrpt starts from, by kind:

==============================  ==============================================================
geometric path (a reference)    independent exact draws of the reference (the prior): wider
                                than the posterior wherever the data inform it; unchanged
target ``initial_states``       the target's own (the built-in targets draw them
                                independently, e.g. uniformly over the modes' box); unchanged
target declaring                its ``initial_states`` are one point jittered (PyMC's initial
``starts = "point"``            point +- U(-1, 1), the ``jitter+adapt_diag`` start): they are
                                replaced by :func:`overdispersed_states` -- independent draws
                                of ``N(mode, (2 sd)^2)`` from the Laplace approximation at the
                                mode found from that point (each system and slot its own)
no ``initial_states``           independent N(0, I) draws; unchanged
==============================  ==============================================================

"Overdispersed" here is Gelman and Rubin's (1992): independent starting points spread more
widely than the target, here twice its Laplace standard deviation in every direction of its
local covariance (a long thin ridge is spread along its length, not by a fixed +-1).  Where the
Laplace approximation cannot be made (no gradient, a Hessian that is not positive definite at
the end of the search, ``dim >`` :data:`~nrpt.paths.proper.MAX_DIM`) the target's own starts
are kept.
"""

from __future__ import annotations

import torch

from nrpt.paths.proper import MAX_DIM, laplace
from nrpt.roles import Density

__all__ = ["overdispersed_states", "laplace", "is_point_start", "OVERDISPERSION", "MAX_DIM"]

#: the starts' standard deviation in units of the Laplace approximation's
OVERDISPERSION = 2.0
def overdispersed_states(target, path, n: int, generator: torch.Generator,
                         x0: torch.Tensor) -> torch.Tensor | None:
    """``n`` independent states ``[n, dim]`` from ``N(mode, (OVERDISPERSION L)(...)^T)``
    (:func:`laplace` from ``x0``); a draw where the energy is not finite is drawn again (up to
    20 times, then the mode itself).  None where the Laplace approximation cannot be made."""
    fit = laplace(target, path, x0)
    if fit is None:
        return None
    mode, low = fit
    d = mode.numel()
    density = Density(target, path)
    z = torch.randn(int(n), d, generator=generator, dtype=torch.float64)
    x = mode + OVERDISPERSION * z @ low.T
    for _ in range(20):
        v, base = density(x)
        bad = ~(torch.isfinite(v) & torch.isfinite(base))
        if not bool(bad.any()):
            return x
        z = torch.randn(int(n), d, generator=generator, dtype=torch.float64)
        x = torch.where(bad[:, None], mode + OVERDISPERSION * z @ low.T, x)
    v, base = density(x)
    bad = ~(torch.isfinite(v) & torch.isfinite(base))
    return torch.where(bad[:, None], mode.expand_as(x), x)


def is_point_start(target) -> bool:
    """Whether the target's ``initial_states`` are one point jittered (``starts =
    "point"``) rather than independent draws."""
    return str(getattr(target, "starts", "") or "").lower() == "point"

