"""Swaps: schemes (which pairs) and rules (how a pair decides), kept separate so any scheme
combines with any rule.  Names resolve through :mod:`nrpt.registry`."""

from .noisy import BiasCorrected, Deterministic
from .rules import AlwaysAccept, FixedRate, Metropolis, Rule, SwapContext, make_rule
from .schemes import ADJ, APE, DEO, DEOW, SEO, NoSwap, Scheme, make_scheme

__all__ = ["AlwaysAccept", "FixedRate", "Metropolis", "Rule", "SwapContext", "make_rule",
           "ADJ", "APE", "DEO", "DEOW", "SEO", "NoSwap", "Scheme", "make_scheme",
           "Deterministic", "BiasCorrected"]
