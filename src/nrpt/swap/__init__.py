"""Swaps: schemes (which pairs) and rules (how a pair decides), kept separate so any scheme
combines with any rule."""

from .rules import RULES, AlwaysAccept, FixedRate, Metropolis, Rule, SwapContext, make_rule
from .schemes import ADJ, APE, DEO, DEOW, SCHEMES, SEO, Scheme, make_scheme

__all__ = ["RULES", "AlwaysAccept", "FixedRate", "Metropolis", "Rule", "SwapContext", "make_rule",
           "ADJ", "APE", "DEO", "DEOW", "SCHEMES", "SEO", "Scheme", "make_scheme"]
