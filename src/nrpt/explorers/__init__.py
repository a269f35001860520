"""Explorers: the local moves applied to every replica at its slot's parameters."""

from nrpt.explorers.base import Density, ExploreInfo, Explorer, Noise, ReplicaState
from nrpt.explorers.metropolis import HMC, MALA, RWMH
from nrpt.explorers.sgmcmc import PSGD, PSGLD, SGD, SGHMC, SGLD, Cyclical, MomentumSGD, SGExplorer
from nrpt.explorers.slice import SliceSampler


def make_explorer(name: str, **options) -> Explorer:
    """Build an explorer by its registered name (:mod:`nrpt.run.registry`); ``options`` go to its
    constructor (e.g. ``leapfrog_steps``)."""
    from nrpt.run import registry

    return registry.entry("explorer", name, what="explorer").load()(**options)


__all__ = ["Density", "Explorer", "ExploreInfo", "Noise", "ReplicaState", "RWMH", "MALA", "HMC",
           "SliceSampler", "make_explorer", "SGExplorer", "SGLD", "SGD", "SGHMC",
           "MomentumSGD", "PSGLD", "PSGD", "Cyclical"]
