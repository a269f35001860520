"""Explorers: the local moves applied to every replica at its slot's parameters."""

from .base import Density, ExploreInfo, Explorer, Noise, ReplicaState
from .metropolis import HMC, MALA, RWMH
from .sgmcmc import PSGD, PSGLD, SGD, SGHMC, SGLD, Cyclical, MomentumSGD, SGExplorer
from .slice import SliceSampler

EXPLORERS = {"rwmh": RWMH, "mala": MALA, "hmc": HMC, "slice": SliceSampler}
EXPLORERS.update({"sgld": SGLD, "sgd": SGD, "sghmc": SGHMC, "msgd": MomentumSGD,  # sgmcmc.py
                  "psgld": PSGLD, "psgd": PSGD})


def make_explorer(name: str, **options) -> Explorer:
    """Build an explorer by name; ``options`` go to its constructor (e.g. leapfrog_steps)."""
    if name not in EXPLORERS:
        raise ValueError(f"explorer must be one of {sorted(EXPLORERS)}; got {name!r}")
    cls = EXPLORERS[name]
    if cls is HMC or cls is SliceSampler or issubclass(cls, SGExplorer):
        return cls(**options)
    return cls()


__all__ = ["Density", "Explorer", "ExploreInfo", "Noise", "ReplicaState", "RWMH", "MALA", "HMC",
           "SliceSampler", "EXPLORERS", "make_explorer", "SGExplorer", "SGLD", "SGD", "SGHMC",
           "MomentumSGD", "PSGLD", "PSGD", "Cyclical"]
