"""Built-in targets (energies ``U = -log pi``; states ``[n, dim]``, results ``[n]``).

See :mod:`nrpt.target` for the target protocol and :data:`nrpt.target.BUILTIN_TARGETS` for the
names under which :func:`nrpt.target.load_target` finds the factories below.
"""

from nrpt.targets.gaussian import (
    Gaussian,
    GaussianMixture,
    GaussianReference,
    bimodal_1d,
    gaussian,
    mixture_2d,
)
from nrpt.targets.geometric import GeometricTarget, geometric_bimodal
from nrpt.targets.twenty_five_modes import TwentyFiveModes

__all__ = [
    "Gaussian",
    "GaussianMixture",
    "GaussianReference",
    "GeometricTarget",
    "TwentyFiveModes",
    "bimodal_1d",
    "gaussian",
    "geometric_bimodal",
    "mixture_2d",
]
