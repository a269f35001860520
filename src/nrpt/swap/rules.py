"""Swap rules: how a proposed pair decides.

A rule sees the two slot coefficients and the two cached energies of the pair (shapes
``[R, M]``) and one keyed uniform per pair (owned by the lower slot, so every process that
holds the energies reaches the same decision), and returns ``(accepted, prob)`` where ``prob``
is the acceptance probability min(1, alpha) used for rejection-rate statistics.

Rules are stateless.  A rule with tunable parameters (the deterministic rule's buffer ``C``,
the bias-corrected rule's per-slot energy variance) declares them in :meth:`Rule.initial_params`;
the engine owns them, adaptors change them through the engine (:class:`nrpt.roles.Update`), and
the rule reads them from :attr:`SwapContext.params`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from nrpt.options import Option
from nrpt.paths.ladders import swap_log_ratio

__all__ = ["SwapContext", "Rule", "Metropolis", "AlwaysAccept", "FixedRate", "make_rule"]


@dataclass(frozen=True)
class SwapContext:
    b_lo: torch.Tensor  # slot coefficient of the lower slot (nearer the target)
    b_hi: torch.Tensor
    v_lo: torch.Tensor  # tempered energy of the replica at the lower slot
    v_hi: torch.Tensor
    #: Uniform(0, 1) per pair, or a function that draws them on first use of :attr:`u` (the
    #: deterministic rule never reads them, so they are not drawn for it)
    uniform_or_draw: torch.Tensor | Callable[[], torch.Tensor]
    iteration: int
    lo: torch.Tensor | None = None  # the pairs' slots [R, M] (for per-slot parameters)
    hi: torch.Tensor | None = None
    params: dict[str, torch.Tensor] = field(default_factory=dict)  # the rule's parameters

    @property
    def u(self) -> torch.Tensor:
        """The pairs' keyed Uniform(0, 1) numbers ``[R, M]``."""
        if callable(self.uniform_or_draw):
            object.__setattr__(self, "uniform_or_draw", self.uniform_or_draw())
        return self.uniform_or_draw

    @property
    def log_ratio(self) -> torch.Tensor:
        return swap_log_ratio(self.b_lo, self.b_hi, self.v_lo, self.v_hi)


class Rule:
    name = ""
    #: the settings this rule reads (:class:`nrpt.options.Option`)
    options: tuple[Option, ...] = ()
    #: False for rules that do not target the tempered product distribution
    exact = True
    #: False for rules whose verdicts ignore the states (``always``, ``fixed-rate``): under such
    #: a rule DEO_W's one-swap-per-window gate is a fixed function of the verdicts' own coins
    #: and biases nothing (:func:`nrpt.swap.schemes.check_gate`)
    state_dependent = True

    def initial_params(self, R: int, P: int, dtype=torch.float64) -> dict[str, torch.Tensor]:
        """The rule's tunable parameters (owned by the engine), e.g. ``{"C": [R, 1]}``."""
        return {}

    def decide(self, ctx: SwapContext) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def describe(self) -> dict:
        return {"rule": self.name}


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


def make_rule(name: str, **options) -> Rule:
    """Build a rule by its registered name (:mod:`nrpt.run.registry`)."""
    from nrpt.run import registry

    return registry.create("rule", name, **options)
