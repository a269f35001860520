"""Explorers: the local moves applied to every replica at its slot's parameters."""

from .base import Density, ExploreInfo, Explorer, Noise, ReplicaState
from .metropolis import HMC, MALA, RWMH

EXPLORERS = {"rwmh": RWMH, "mala": MALA, "hmc": HMC}


def make_explorer(name: str, **options) -> Explorer:
    """Build an explorer by name; ``options`` go to its constructor (e.g. leapfrog_steps)."""
    if name not in EXPLORERS:
        raise ValueError(f"explorer must be one of {sorted(EXPLORERS)}; got {name!r}")
    cls = EXPLORERS[name]
    if cls is HMC:
        return cls(**options)
    return cls()


__all__ = ["Density", "Explorer", "ExploreInfo", "Noise", "ReplicaState", "RWMH", "MALA", "HMC",
           "EXPLORERS", "make_explorer"]
