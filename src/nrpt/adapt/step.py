r"""Between-round step-size tuning of Metropolis explorers towards a target acceptance rate.

Model (Roberts & Rosenthal 2001; Beskos et al. 2013): acceptance ``a(h) = 2 Phi(-c h^k / 2)``
with ``k`` the explorer's ``acceptance_order`` (1 RWMH, 3 MALA, 2 HMC).  From one round's
acceptance ``a`` at step ``h`` the step for target ``a*`` is

    h* = h (Phi^{-1}(a*/2) / Phi^{-1}(a/2))^(1/k),

with ``a`` clipped to ``[0.01, 0.99]`` and the factor to ``[1/4, 4]`` per round.

:func:`bracketed_step` keeps per slot a bracket ``[lo, hi]`` of steps seen above / below the
target and replaces a proposal outside it by the geometric mean of the current step and the
bracket's end (converges for any acceptance curve decreasing in the step, e.g. HMC's cliff at
its stability limit in few dimensions).  A contradicted end is dropped and both ends relax by
:data:`BRACKET_RELAX` per update.  :class:`StepTuner` also drops a lower end that a bisection
already moved toward where the acceptance stayed below :data:`STALE_ACCEPTANCE` (a stale end: the
acceptance curve moved, e.g. a funnel's chain entered the neck), and moves a slot frozen
(acceptance < 0.01) in two rounds running down by :data:`FAST_FACTOR`.  Without these a stale
lower end held a frozen slot to ~0.9x per round (the bisection toward an end that relaxes by
1.1x per round; HMC on posteriordb's gp_pois_regr).
"""

from __future__ import annotations

import numpy as np

__all__ = ["BRACKET_RELAX", "STALE_ACCEPTANCE", "StepTuner", "bracketed_step", "step_size_factor"]

_CLIP_ACCEPTANCE = (0.01, 0.99)
_CLIP_FACTOR = (0.25, 4.0)
#: both bracket ends move outwards by this factor per update (stale information fades)
BRACKET_RELAX = 1.1
#: ``fast`` tuning: acceptance below / above these moves the step by :data:`FAST_FACTOR` (down /
#: up) in one update, instead of the model's clipped factor (MALA: at most 0.60x)
FAST_ACCEPTANCE = (0.01, 0.99)
FAST_FACTOR = 10.0
#: :class:`StepTuner`: an acceptance below this after a bisection toward the lower end of the
#: bracket marks that end stale (dropped)
STALE_ACCEPTANCE = 0.1


def _check_target_order(target, order) -> np.ndarray:
    """``order`` as an array, after checking ``target`` in (0, 1) and a scalar ``order`` an
    integer >= 1 (no SciPy: a run that never tunes should not pay for its import)."""
    if not 0.0 < float(target) < 1.0:
        raise ValueError(f"target acceptance must be in (0, 1); got {target!r}")
    k = np.asarray(order, dtype=float)
    if k.ndim == 0 and (int(order) != order or order < 1):
        raise ValueError(f"order must be an integer >= 1; got {order!r}")
    return k


def step_size_factor(acceptance, target: float, order) -> np.ndarray:
    """Multiplicative step-size change per entry of ``acceptance`` (NaN -> 1: no data);
    ``order``: the integer ``k`` of the model, or an array of (estimated) orders per entry."""
    k = _check_target_order(target, order)
    a = np.asarray(acceptance, dtype=float)
    seen = np.isfinite(a)
    a = np.clip(np.where(seen, a, target), *_CLIP_ACCEPTANCE)
    from scipy.special import ndtri  # (imported on use: SciPy costs ~1 s at start-up)

    factor = (ndtri(target / 2.0) / ndtri(a / 2.0)) ** (1.0 / k)
    return np.where(seen, np.clip(factor, *_CLIP_FACTOR), 1.0)



class StepTuner:
    """Per-slot step-size updates toward ``target`` acceptance, with memory (checkpointed via
    :meth:`state_dict`): the bracket of :func:`bracketed_step`, and a secant estimate of the
    acceptance curve's order.  The Newton step of :func:`step_size_factor` assumes the order
    ``k`` of the asymptotic model; where the curve is steeper (HMC in a few dimensions: about
    twice as steep as ``k = 2`` near acceptance 0.65) a full Newton step overshoots by that
    ratio and the step oscillates about the target.  From the last two measurements at one slot
    (steps at least 5 % apart, acceptances inside (0.02, 0.98)) the order is re-estimated as the
    slope of ``log -Phi^{-1}(a/2)`` in ``log h``, clipped to ``[k, 4k]`` (only ever damping
    the Newton step: a shallower estimate is more likely noise of short windows); otherwise
    ``k``."""

    def __init__(self, target: float, order: int, fast: bool = False):
        _check_target_order(target, order)
        self.target, self.order = float(target), int(order)
        #: acceptance ~0 / ~1 moves the step 10x (kept inside the bracket: no new oscillation)
        self.fast = bool(fast)
        self.lo = self.hi = self.prev_h = self.prev_a = None
        #: per slot (bool): whether the last step was bisected toward the bracket's lower end
        #: ("pressed down": that end is dropped as stale if the acceptance stays near 0).  The
        #: upper end is kept on purpose, so a bisection toward it is not remembered.
        self.pressed = None

    def orders(self, h: np.ndarray, a: np.ndarray) -> np.ndarray:
        k = np.full_like(h, float(self.order))
        if self.prev_h is None or self.prev_h.shape != h.shape:
            return k
        from scipy.special import ndtri

        h0, a0 = self.prev_h, self.prev_a
        ok = (np.isfinite(a) & np.isfinite(a0) & (np.abs(np.log(h / h0)) > 0.05)
              & (a > 0.02) & (a < 0.98) & (a0 > 0.02) & (a0 < 0.98))
        with np.errstate(all="ignore"):
            slope = (np.log(-ndtri(np.clip(a, 0.02, 0.98) / 2))
                     - np.log(-ndtri(np.clip(a0, 0.02, 0.98) / 2))) / np.log(h / h0)
        slope = np.clip(np.nan_to_num(slope, nan=self.order), self.order, 4 * self.order)
        return np.where(ok, slope, k)

    def update(self, step, acceptance) -> np.ndarray:
        """The new steps after measuring ``acceptance`` at ``step`` (arrays of one shape)."""
        h = np.asarray(step, dtype=float)
        a = np.asarray(acceptance, dtype=float)
        if self.lo is not None and self.lo.shape != h.shape:
            self.lo = self.hi = self.prev_h = self.prev_a = None
        if self.pressed is not None and self.pressed.shape != h.shape:
            self.pressed = None
        k = self.orders(h, a)
        lo, hi = self.lo, self.hi
        if self.pressed is not None and lo is not None:
            # a bisection toward the lower end that left the acceptance near 0: that end is
            # stale (the curve moved since it was measured, e.g. a funnel's neck), dropped.
            # (Only where the acceptance is that low: near a cliff bisection is the right move.
            # Not the upper end: acceptance ~1 still moves the chain, and on gp_pois_regr the
            # 4x step past a dropped upper end froze slots; there the end relaxes 1.1x/round.)
            lo = np.where(self.pressed & (a < STALE_ACCEPTANCE), 0.0, lo)
        fast = np.asarray(self.fast)
        if self.prev_a is not None and self.prev_a.shape == h.shape:
            # frozen two rounds running: the model step was too timid (only downwards: a 10x
            # move up from acceptance ~1 lands past HMC's cliff, the model's 4x does not)
            fast = fast | ((a < FAST_ACCEPTANCE[0]) & (self.prev_a < FAST_ACCEPTANCE[0]))
        new, self.lo, self.hi, self.pressed = _bracketed(h, a, self.target, k, lo, hi, fast)
        seen = np.isfinite(a)
        if self.prev_h is None:
            self.prev_h, self.prev_a = h.copy(), a.copy()
        else:
            self.prev_h = np.where(seen, h, self.prev_h)
            self.prev_a = np.where(seen, a, self.prev_a)
        return new

    def rescale(self, factor) -> None:
        """Carry the memory (bracket, last step) to steps ``factor`` times larger (the slot's
        scale changed, e.g. a new temperature)."""
        f = np.asarray(factor, dtype=float)
        for k in ("lo", "hi", "prev_h"):
            v = getattr(self, k)
            if v is not None:
                setattr(self, k, v * f)

    def restart(self, where) -> None:
        """Forget the bracket and the last measurement at the slots ``where`` (a boolean array
        of the steps' shape): their scale changed in a way no factor carries (a new
        preconditioner)."""
        w = np.asarray(where, dtype=bool)
        if self.lo is not None and self.lo.shape == w.shape:
            self.lo = np.where(w, 0.0, self.lo)
            self.hi = np.where(w, np.inf, self.hi)
        if self.prev_h is not None and self.prev_h.shape == w.shape:
            self.prev_h = np.where(w, np.nan, self.prev_h)
            self.prev_a = np.where(w, np.nan, self.prev_a)
        if self.pressed is not None and self.pressed.shape == w.shape:
            self.pressed = self.pressed & ~w

    def state_dict(self) -> dict:
        return {k: None if getattr(self, k) is None else getattr(self, k).tolist()
                for k in ("lo", "hi", "prev_h", "prev_a", "pressed")}

    def load_state_dict(self, sd: dict) -> None:  # (checkpoints from before: no memory)
        for k in ("lo", "hi", "prev_h", "prev_a"):
            v = sd.get(k)
            setattr(self, k, None if v is None else np.asarray(v, dtype=float))
        v = sd.get("pressed")
        if v is not None:
            v = np.asarray(v)
            # (a checkpoint written when it was -1 / 0 / +1, down / none / up: -1 is down)
            v = v if v.dtype == bool else v < 0
        self.pressed = v


def bracketed_step(step, acceptance, target: float, order, lo=None, hi=None,
                   fast: bool = False):
    """``(new step, lo, hi)``: the Newton step of :func:`step_size_factor`, kept inside the
    bracket ``(lo, hi)`` of steps known to give acceptance above / below ``target`` (arrays of
    the shape of ``step``; ``None``: no bracket yet, i.e. ``0`` and ``inf``).

    The measurement at ``step`` first updates the bracket (acceptance below the target: ``hi``
    = ``step``; above: ``lo`` = ``step``; an end on the wrong side of ``step`` is dropped as
    contradicted); a proposal at or beyond an end becomes the geometric mean of ``step`` and
    that end.  The returned ends are relaxed by :data:`BRACKET_RELAX`.  NaN acceptance (no
    data) leaves the step and its bracket as they were.  ``fast``: an acceptance outside
    :data:`FAST_ACCEPTANCE` proposes a step :data:`FAST_FACTOR` times smaller / larger, or,
    where the bracket's end on that side is known, the geometric mean of the step and that end
    (bisection of a cliff in the acceptance curve, without oscillating across it)."""
    new, lo, hi, _ = _bracketed(step, acceptance, target, order, lo, hi, fast)
    return new, lo, hi


def _bracketed(step, acceptance, target, order, lo, hi, fast):
    """:func:`bracketed_step` (``fast``: a bool or a per-slot boolean array) and ``pressed``
    (bool): where the step was bisected toward the lower end."""
    h = np.asarray(step, dtype=float)
    a = np.asarray(acceptance, dtype=float)
    lo = np.zeros_like(h) if lo is None else np.asarray(lo, dtype=float).copy()
    hi = np.full_like(h, np.inf) if hi is None else np.asarray(hi, dtype=float).copy()
    seen = np.isfinite(a)
    below, above = seen & (a < target), seen & (a > target)
    # a contradicted end (too large a step accepted often, or too small a step rarely) is stale
    lo = np.where(below & (lo >= h), 0.0, lo)
    hi = np.where(above & (hi <= h), np.inf, hi)
    hi = np.where(below, np.minimum(hi, h), hi)
    lo = np.where(above, np.maximum(lo, h), lo)
    new = h * step_size_factor(a, target, order)
    fast = np.asarray(fast, dtype=bool)
    pressed = np.zeros(h.shape, dtype=bool)
    if fast.any():  # (toward a known end: halfway to it in log scale, i.e. bisection)
        with np.errstate(all="ignore"):
            down = np.where(lo > 0, np.sqrt(h * lo), h / FAST_FACTOR)
            up = np.where(np.isfinite(hi), np.sqrt(h * hi), h * FAST_FACTOR)
        go_down = fast & seen & (a < FAST_ACCEPTANCE[0])
        go_up = fast & seen & (a > FAST_ACCEPTANCE[1])
        new = np.where(go_down, down, new)
        new = np.where(go_up, up, new)
        pressed = go_down & (lo > 0)  # (toward the upper end: not remembered)
    at_hi, at_lo = new >= hi, (new <= lo) & (lo > 0)
    new = np.where(at_hi, np.sqrt(h * hi), new)
    new = np.where(at_lo, np.sqrt(h * lo), new)
    pressed = ~(at_hi & above) & ((at_lo & below) | pressed)
    new = np.where(seen, new, h)
    pressed = pressed & seen
    return new, lo / BRACKET_RELAX, hi * BRACKET_RELAX, pressed
