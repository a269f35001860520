"""Swaps: schemes (which pairs) and rules (how a pair decides), kept separate so any scheme
combines with any rule.  Names resolve through :mod:`nrpt.run.registry`."""

from nrpt.swap.noisy import BiasCorrected, Deterministic
from nrpt.swap.rules import AlwaysAccept, FixedRate, Metropolis, Rule, SwapContext, make_rule
from nrpt.swap.schemes import ADJ, APE, DEO, DEOW, SEO, NoSwap, Scheme, make_scheme

__all__ = ["AlwaysAccept", "FixedRate", "Metropolis", "Rule", "SwapContext", "make_rule",
           "ADJ", "APE", "DEO", "DEOW", "SEO", "NoSwap", "Scheme", "make_scheme",
           "Deterministic", "BiasCorrected"]
