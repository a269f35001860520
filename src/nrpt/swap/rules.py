"""Swap rules: how a proposed pair decides.

A rule sees the pair's slot coefficients and cached energies (``[R, M]``) and one keyed uniform
per pair, and returns ``(accepted, prob)``, ``prob`` = min(1, alpha) for the statistics.
Rules are stateless: tunable parameters are declared in :meth:`Rule.initial_params`, owned by
the engine, changed through :class:`nrpt.roles.Update` and read from :attr:`SwapContext.params`.
"""

from __future__ import annotations

import torch

from nrpt.roles import Rule, SwapContext

__all__ = ["SwapContext", "Rule", "Metropolis", "AlwaysAccept", "FixedRate"]


class Metropolis(Rule):
    """Exact energies: accept with probability min(1, alpha), Eq. (1) of
    :mod:`nrpt.paths.ladders`."""

    name = "metropolis"

    def decide(self, ctx):
        lr = ctx.log_ratio
        return torch.log(ctx.u) < lr, torch.exp(torch.clamp(lr, max=0.0))


class AlwaysAccept(Rule):
    """Every proposed swap is executed.  For testing index-process bookkeeping only."""

    name = "always"
    exact = False
    state_dependent = False

    def decide(self, ctx):
        return torch.ones_like(ctx.v_lo, dtype=torch.bool), torch.ones_like(ctx.v_lo)


class FixedRate(Rule):
    """Accept with a fixed probability 1 - r, whatever the states.

    Not a sampler of anything: it makes a ladder whose adjacent rejection rate is exactly ``r``,
    which isolates the index process to compare schemes against Lemma 1 (benchmarks)."""

    name = "fixed-rate"
    exact = False
    state_dependent = False

    def __init__(self, rejection: float):
        if not 0.0 <= float(rejection) < 1.0:
            raise ValueError(f"rejection must be in [0, 1); got {rejection!r}")
        self.rejection = float(rejection)

    def decide(self, ctx):
        u = ctx.u
        p = torch.full_like(u, 1.0 - self.rejection)
        return u < p, p

    def describe(self):
        return {"rule": self.name, "rejection": self.rejection}
