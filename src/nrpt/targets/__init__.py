"""Built-in targets (energies ``U = -log pi``; states ``[n, dim]``, results ``[n]``).

See :mod:`nrpt.targets.protocol` for the target protocol and
:data:`nrpt.targets.protocol.BUILTIN_TARGETS` for the
names under which :func:`nrpt.targets.protocol.load_target` finds the factories below.

:func:`from_pymc` (a PyMC model as a target, :mod:`nrpt.targets.adapters.pymc`) and
:func:`from_stan` (a Stan program, :mod:`nrpt.targets.stan`) are exported lazily: importing
:mod:`nrpt` or this package imports neither PyMC nor the Stan toolchain.
"""

from nrpt.targets._util import logsumexp, sum_last
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
    "from_pymc",
    "from_stan",
    "gaussian",
    "geometric_bimodal",
    "logsumexp",
    "mixture_2d",
    "sum_last",
]


def __getattr__(name: str):
    # the PyMC bridge is loaded on first use, so that `import nrpt` never imports PyMC
    if name == "from_pymc":
        from nrpt.targets.adapters.pymc import from_pymc

        return from_pymc
    if name == "from_stan":
        from nrpt.targets.stan import from_stan

        return from_stan
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
