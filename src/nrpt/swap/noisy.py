"""Swap rules for noisy (minibatch) energies, from the cached estimates ``Ũ`` of a pair's two
replicas (``v_lo`` nearer the target, ``v_hi``) and ``b = 1 / tau``; any scheme.

* :class:`Deterministic` -- Deng et al. (2023), Eq. 7: swap iff ``Ũ_hi + C < Ũ_lo``, buffer
  ``C > 0`` (adapted by :class:`nrpt.adapt.sa.CorrectionAdaptor`, Eq. 12/13); needs no
  temperatures.  ``prob`` is the 0/1 verdict.
* :class:`BiasCorrected` -- reSGLD (Deng et al. 2020; 2023 Eq. 16): accept with probability
  ``min(1, S̃)``,

      log S̃ = db (Ũ_lo - Ũ_hi) - db^2 (sigma_lo^2 + sigma_hi^2) / (2 F),   db = b_lo - b_hi,

  ``sigma^2`` the per-slot estimate variance ``params["slot_variance"]`` ``[R, P]`` (initialised
  to ``variance``, kept current by :class:`nrpt.adapt.sa.VarianceTracker`), ``F >= 1`` shrinks
  the correction (F = 1 unbiased).  Under Gaussian noise ``E S̃ = exp(db (U_lo - U_hi))``; the
  clipped probability is unbiased only where ``S̃ < 1`` a.s.  ``sigma = 0`` is Metropolis.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from nrpt.host import viewable
from nrpt.options import (
    Option,
    boolean,
    check_number,
    choice,
    integer,
    number,
    parse_bool,
    parse_float,
    parse_floats,
    parse_int,
)
from nrpt.swap.rules import Rule, SwapContext

#: how :class:`nrpt.adapt.sa.LearningRateAdaptor` moves the ladder: ``"paper"`` (Eq. 11/12 as
#: written) or ``"log-gaps"`` (Eq. 10 on the gaps of ``log eta``, renormalized to the fixed end
#: points)
LADDER_UPDATES = ("paper", "log-gaps")

def _sa_step(name, value, cfg=None) -> list[float]:
    if not isinstance(value, list | tuple) or len(value) != 3:
        raise ValueError(f"sa_step must be [a, kappa, b] for gamma_k = a / (k^kappa + b); "
                         f"got {value!r}")
    return [check_number("sa_step a", value[0], 0.0, strict=True),
            check_number("sa_step kappa", value[1], 0.5, strict=True, high=1.0,
                         high_strict=False),
            check_number("sa_step b", value[2], 0.0, strict=True)]


_SA_WHY = "sa_step is the step size of the deterministic rule's adaptation (adapt = true)"
_LU_WHY = ("ladder_update is how the deterministic rule's adaptation (adapt = true) moves the "
           "learning rates")

__all__ = ["Deterministic", "BiasCorrected"]


class Deterministic(Rule):
    """Eq. 7: swap the pair iff ``Ũ_hi + C < Ũ_lo``.  ``correction`` is the initial ``C``; the
    engine owns the per-system table ``params["C"]`` ``[R, 1]`` (which the rule reads) and an
    adaptor may change it."""

    name = "deterministic"
    options = (
        Option("correction", number(), default=4.0, section="swap", parse=parse_float,
               why="correction is the buffer C of {who}",
               help="initial correction buffer C0 of the deterministic rule"),
        Option("adapt", boolean, default=True, section="adaptation", parse=parse_bool,
               why="adapt (C and learning rates) is for {who}",
               help="deterministic rule: adapt C and the learning rates online (true/false)"),
        Option("sa_step", _sa_step, default=[50.0, 0.8, 500.0], section="adaptation",
               parse=parse_floats, why=_SA_WHY,
               applies=lambda cfg: None if cfg.adapt else _SA_WHY,
               help="SA step sizes gamma_k = a / (k^kappa + b) as a,kappa,b (default "
                    "50,0.8,500)"),
        Option("ladder_update", choice(LADDER_UPDATES), default="paper", section="adaptation",
               choices=LADDER_UPDATES, why=_LU_WHY,
               applies=lambda cfg: None if cfg.adapt else _LU_WHY,
               help="how the learning rates adapt: paper (Eq. 11/12 as written; can collapse "
                    "two rungs) or log-gaps (Eq. 10 on the gaps of log eta, renormalized)"),
    )
    exact = False

    def __init__(self, correction: float = 4.0):
        if isinstance(correction, bool) or not (isinstance(correction, int | float)
                                                and math.isfinite(correction)):
            raise ValueError(f"correction must be a finite number; got {correction!r}")
        self.correction = float(correction)

    def initial_params(self, R, P, dtype=torch.float64):
        return {"C": torch.full((R, 1), self.correction, dtype=dtype)}

    def decide(self, ctx: SwapContext):
        if viewable(ctx.v_hi, ctx.v_lo):
            got = self.decide_host(ctx.v_lo.numpy(), ctx.v_hi.numpy(), ctx.params)
            if got is not None:
                return torch.from_numpy(got[0]), torch.from_numpy(got[1])
        C = ctx.params.get("C", self.correction)
        decision = (ctx.v_hi + C < ctx.v_lo) & torch.isfinite(ctx.v_hi) & torch.isfinite(ctx.v_lo)
        return decision, decision.to(ctx.v_lo.dtype)

    def decide_host(self, lo: np.ndarray, hi: np.ndarray, params: dict):
        """:meth:`decide` on float64 NumPy arrays of the energies ``v_lo`` and ``v_hi``
        (views of tensors' memory), as arrays ``(decision, prob)``; ``None`` where ``C`` is
        not a float or a float64 CPU tensor (then :meth:`decide`'s torch ops).  A small NumPy
        op costs a third to a half of a small torch op: the same IEEE sum and comparisons, bit
        for bit (tests/test_sa_host.py).  The eager fused chunk calls it directly
        (``nrpt.core.fused``)."""
        C = params.get("C", self.correction)
        if not (isinstance(C, float) or viewable(C)):
            return None
        with np.errstate(all="ignore"):  # (torch does not warn of overflow either)
            d = _verdicts(lo, hi, C if isinstance(C, float) else C.numpy())
        return d, d.astype(lo.dtype)

    def decide_arrays(self, lo: np.ndarray, hi: np.ndarray, params: dict) -> np.ndarray:
        """The verdicts ``hi + C < lo`` of finite energies on arrays (``params``: the rule's
        parameters as arrays, ``C`` an ``[R, 1]`` array or a float; without ``C`` the initial
        correction; NumPy's floating-point warnings are the caller's to silence): the core of
        :meth:`decide_host`, which the eager fused chunk's host iteration calls."""
        return _verdicts(lo, hi, params.get("C", self.correction))

    def describe(self):
        return {"rule": self.name, "initial_correction": self.correction}


def _verdicts(lo: np.ndarray, hi: np.ndarray, C) -> np.ndarray:
    """The deterministic rule's verdicts on arrays: ``hi + C < lo``, both energies finite."""
    return (hi + C < lo) & np.isfinite(hi) & np.isfinite(lo)


class BiasCorrected(Rule):
    """reSGLD's bias-corrected Metropolis rule (see the module docstring)."""

    name = "bias-corrected"
    options = (
        Option("variance_factor", number(1.0), default=1.0, section="swap", parse=parse_float,
               help="bias-corrected rule: divide the sigma^2 correction by F >= 1"),
        # control-variate energies have a variance that restarts at 0 at every anchor refresh:
        # a sigma^2 window longer than the refresh cycle over-corrects (measured bias)
        Option("variance_every", integer(1), section="swap", parse=parse_int,
               default=lambda cfg: getattr(cfg, "vr_every", None) or 100,
               help="bias-corrected rule: refresh the per-slot sigma^2 every m iterations"),
    )
    exact = False

    def __init__(self, variance: float = 0.0, factor: float = 1.0):
        if not (isinstance(variance, int | float) and math.isfinite(variance) and variance >= 0):
            raise ValueError(f"variance must be a finite number >= 0; got {variance!r}")
        if not (isinstance(factor, int | float) and math.isfinite(factor) and factor >= 1):
            raise ValueError(f"factor F must be a number >= 1; got {factor!r}")
        self.variance, self.factor = float(variance), float(factor)

    def initial_params(self, R, P, dtype=torch.float64):
        return {"slot_variance": torch.full((R, P), self.variance, dtype=dtype)}

    def pair_variance(self, ctx: SwapContext) -> torch.Tensor | float:
        """``sigma_lo^2 + sigma_hi^2`` of each listed pair."""
        var = ctx.params.get("slot_variance")
        if var is None or ctx.lo is None:
            return 2.0 * self.variance
        return var.gather(1, ctx.lo) + var.gather(1, ctx.hi)

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
        return {"rule": self.name, "initial_variance": self.variance, "factor": self.factor}
