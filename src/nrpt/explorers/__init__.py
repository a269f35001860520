"""Explorers: the local moves applied to every replica at its slot's parameters."""

from nrpt.explorers.base import Density, ExploreInfo, Explorer, Noise, ReplicaState
from nrpt.explorers.metropolis import HMC, MALA, RWMH
from nrpt.explorers.sgmcmc import PSGD, PSGLD, SGD, SGHMC, SGLD, Cyclical, MomentumSGD, SGExplorer
from nrpt.explorers.slice import SliceSampler

__all__ = ["Density", "Explorer", "ExploreInfo", "Noise", "ReplicaState", "RWMH", "MALA", "HMC",
           "SliceSampler", "SGExplorer", "SGLD", "SGD", "SGHMC",
           "MomentumSGD", "PSGLD", "PSGD", "Cyclical"]
