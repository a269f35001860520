"""Swaps: schemes (which pairs) and rules (how a pair decides), kept separate so any scheme
combines with any rule.  Names resolve through :mod:`nrpt.run.registry`
(:func:`nrpt.run.registry.make_scheme`, :func:`~nrpt.run.registry.make_rule`)."""

from nrpt.swap.noisy import BiasCorrected, Deterministic
from nrpt.swap.rules import AlwaysAccept, FixedRate, Metropolis, Rule, SwapContext
from nrpt.swap.schemes import ADJ, APE, DEO, DEOW, SEO, NoSwap, Scheme

__all__ = ["AlwaysAccept", "FixedRate", "Metropolis", "Rule", "SwapContext",
           "ADJ", "APE", "DEO", "DEOW", "SEO", "NoSwap", "Scheme",
           "Deterministic", "BiasCorrected"]
