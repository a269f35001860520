"""Swap rules for noisy (minibatch) energies.

Both rules see only the cached energy estimates ``Ũ`` of the two replicas of a pair (``v_lo`` at
the slot nearer the target, ``v_hi``) and the slot coefficients ``b = 1 / tau``; they combine
with any scheme (DEO, DEO_W, ...).

* :class:`Deterministic` -- Deng et al. (2023), Eq. 7: swap iff ``Ũ_hi + C < Ũ_lo``, with a
  correction buffer ``C > 0`` (adapted toward a target swap rate by
  :class:`nrpt.adapt_sa.CorrectionAdaptor`, Eq. 12/13).  It needs no temperatures, which is what
  makes SGD explorers (whose temperature is inaccessible) usable.  ``prob`` is the 0/1 verdict.
* :class:`BiasCorrected` -- reSGLD (Deng et al. 2020; 2023 Eq. 16): accept with probability
  ``min(1, S̃)``,

      log S̃ = db (Ũ_lo - Ũ_hi) - db^2 (sigma_lo^2 + sigma_hi^2) / (2 F),   db = b_lo - b_hi,

  where ``sigma^2`` is the variance of each energy estimate (for equal variances the correction
  is the paper's ``db^2 sigma^2``) and ``F >= 1`` shrinks the correction (the notes' "F > 1
  reduces the variance"; F = 1 is unbiased).  Under Gaussian energy noise the *ratio* is unbiased,
  ``E exp(log S̃) = exp(db (U_lo - U_hi))`` (because ``E exp(db sqrt(2) sigma xi) =
  exp(db^2 sigma^2)``); the clipped probability ``E min(1, S̃) <= min(1, E S̃)`` is unbiased only
  where ``S̃ < 1`` almost surely.  With ``sigma = 0`` the rule *is* Metropolis.

  ``sigma^2`` is a number (the same for every slot) or a per-slot table ``[R, P]`` set with
  :meth:`BiasCorrected.set_slot_variance` (by :class:`nrpt.adapt_sa.VarianceTracker`, refreshed
  every ``m`` iterations); a pair's slots are found by matching ``b_lo``, ``b_hi`` against the
  slot coefficients passed along with the table.
"""

from __future__ import annotations

import math

import torch

from .rules import Rule, SwapContext

__all__ = ["Deterministic", "BiasCorrected"]


class Deterministic(Rule):
    """Eq. 7: swap the pair iff ``Ũ_hi + C < Ũ_lo``.  ``correction`` is ``C`` (a number, or a
    tensor ``[R, 1]`` per system once an adaptor owns it)."""

    name = "deterministic"
    exact = False

    def __init__(self, correction: float = 4.0):
        if not (isinstance(correction, int | float) and math.isfinite(correction)):
            raise ValueError(f"correction must be a finite number; got {correction!r}")
        self.C: float | torch.Tensor = float(correction)

    def decide(self, ctx: SwapContext):
        C = self.C
        if isinstance(C, torch.Tensor):
            C = C.to(ctx.v_lo.dtype)
        decision = (ctx.v_hi + C < ctx.v_lo) & torch.isfinite(ctx.v_hi) & torch.isfinite(ctx.v_lo)
        return decision, decision.to(ctx.v_lo.dtype)

    def describe(self):
        C = self.C
        if isinstance(C, torch.Tensor):
            C = C.reshape(-1).tolist()
            C = C[0] if len(C) == 1 else C
        return {"rule": self.name, "correction": C}


class BiasCorrected(Rule):
    """reSGLD's bias-corrected Metropolis rule (see the module docstring)."""

    name = "bias-corrected"
    exact = False

    def __init__(self, variance: float = 0.0, factor: float = 1.0):
        if not (isinstance(variance, int | float) and math.isfinite(variance) and variance >= 0):
            raise ValueError(f"variance must be a finite number >= 0; got {variance!r}")
        if not (isinstance(factor, int | float) and math.isfinite(factor) and factor >= 1):
            raise ValueError(f"factor F must be a number >= 1; got {factor!r}")
        self.variance, self.factor = float(variance), float(factor)
        self._slot_var: torch.Tensor | None = None
        self._slot_b: torch.Tensor | None = None

    def set_slot_variance(self, b: torch.Tensor, variance: torch.Tensor) -> None:
        """Per-slot variances ``[R, P]`` of the energy estimates, for slot coefficients ``b``."""
        self._slot_b, self._slot_var = b.clone(), variance.clone()

    def _lookup(self, b_pair: torch.Tensor) -> torch.Tensor:
        match = b_pair.unsqueeze(-1) == self._slot_b.unsqueeze(1)  # [R, M, P]
        idx = match.to(torch.int8).argmax(-1)
        return self._slot_var.gather(1, idx)

    def pair_variance(self, ctx: SwapContext) -> torch.Tensor | float:
        """``sigma_lo^2 + sigma_hi^2`` of each listed pair."""
        if self._slot_var is None:
            return 2.0 * self.variance
        return self._lookup(ctx.b_lo) + self._lookup(ctx.b_hi)

    def log_ratio(self, ctx: SwapContext) -> torch.Tensor:
        db = ctx.b_lo - ctx.b_hi
        lr = db * (ctx.v_lo - ctx.v_hi) - 0.5 * db * db * self.pair_variance(ctx) / self.factor
        return torch.where(torch.isnan(lr), torch.full_like(lr, -math.inf), lr)

    def decide(self, ctx: SwapContext):
        if not bool(torch.isfinite(ctx.b_lo).all() & torch.isfinite(ctx.b_hi).all()):
            raise ValueError("the bias-corrected rule needs finite temperatures at every slot; "
                             "SGD slots (temperature 0) need rule 'deterministic'")
        lr = self.log_ratio(ctx)
        return torch.log(ctx.u) < lr, torch.exp(torch.clamp(lr, max=0.0))

    def describe(self):
        return {"rule": self.name, "variance": (self.variance if self._slot_var is None
                                                else "per-slot, estimated"),
                "factor": self.factor}
