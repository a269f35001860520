"""Swaps: schemes (which pairs) and rules (how a pair decides), kept separate so any scheme
combines with any rule."""

from .noisy import BiasCorrected, Deterministic
from .rules import RULES, AlwaysAccept, FixedRate, Metropolis, Rule, SwapContext, make_rule
from .schemes import ADJ, APE, DEO, DEOW, SCHEMES, SEO, Scheme, make_scheme

RULES.update({"deterministic": Deterministic, "bias-corrected": BiasCorrected})

__all__ = ["RULES", "AlwaysAccept", "FixedRate", "Metropolis", "Rule", "SwapContext", "make_rule",
           "ADJ", "APE", "DEO", "DEOW", "SCHEMES", "SEO", "Scheme", "make_scheme",
           "Deterministic", "BiasCorrected"]
