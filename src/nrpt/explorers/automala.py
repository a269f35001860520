"""AutoMALA (Biron-Lattes, Surjanovic, Syed, Campbell & Bouchard-Côté, AISTATS 2024): MALA
whose step size is chosen afresh at every step, reversibly, batched over all replicas.

One step from ``x`` (per replica, in the whitened space ``x = L z`` of the slot's ``metric``,
see :func:`nrpt.explorers.base.metric_mul`)::

    auxiliaries  p ~ N(0, I); thresholds 0 < a < b < 1 (two ordered uniforms);
                 a jittered initial step  h0 = step_size * exp(jitter * N(0, 1))
    selection    l(h) = log acceptance ratio of one leapfrog step of size h from (x, p)
                 (= MALA's ratio), c(h) = -|l(h)| (``symmetric``, the default) or l(h):
                 h = h0 if log a < c(h0) < log b; else
                 c(h0) >= log b: double while c stays >= log b, take the largest step with
                                 c >= log b (h0 2^j, j <= max_doublings);
                 c(h0) <= log a: halve until c > log a (h0 2^-j, j <= max_doublings)
    proposal     (x', p') = leapfrog_h(x, p)
    accept       with probability min(1, exp l(h)) AND only if the selection run from
                 (x', -p') with the same (a, b, h0) picks the same step (reversibility)

The auxiliaries do not depend on the state and the selection is a deterministic function of
(state, auxiliaries); with the reversibility check the move is an involution accepted with
its Metropolis ratio, so every ``pi_p`` is exactly invariant (without the check it is not:
tests/test_automala.py keeps that negative control).  Replicas run the doublings together:
a loop over at most ``max_doublings`` rounds, each evaluating gradients only for the replicas
still searching.  Non-finite densities or gradients count as ``l = -inf`` (the step halves);
a selected proposal that is not finite is rejected and flagged.

Far from the mode the move is slow by design: the selected step has ``|l| < log(1/a)`` (the
symmetric rule; with the signed one downhill moves fail the check outright), so the energy
falls by only a few units per step.  From a start ~100 sds out (energy ~1e5) AutoMALA was
still in its transient after 8 rounds where MALA had reached the bulk: start it near the
bulk (or let the hot slots of the ladder feed it).

The slot's ``step_size`` is the base step.  Between rounds :class:`AutoStepAdaptor` sets it
to the geometric mean of the steps selected at that slot during the round (it reads the
per-replica ``extras["automala_log_step"]`` / ``extras["automala_b"]`` of every iteration).

Random numbers: ``noise.normal(sub)`` the momentum, ``noise.normal(sub + 1)`` the jitter
(``substeps = 2``), the EXPLORE uniforms ``(sub, 1)`` the thresholds, the ACCEPT uniform
``sub`` the decision.  Gradient evaluations per step: about ``2 (1 + |j| + 1)``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from nrpt.explorers.base import (
    PRECONDITION,
    STEP_SIZE,
    Density,
    ExploreInfo,
    Noise,
    ReplicaState,
    metric_mul,
    metric_tmul,
    slot_grad,
)
from nrpt.explorers.metropolis import GradientCached, finite_rows
from nrpt.options import Option, integer, parse_int
from nrpt.roles import AdaptorBase, Iteration, SegmentView, Update

__all__ = ["AutoMALA", "AutoStepAdaptor"]

#: per-replica extras of the last step: log of the selected step, and the b it was made at
LOG_STEP, AT_B = "automala_log_step", "automala_b"


class _Leap:
    """One leapfrog step of size ``h`` from rows of the whitened phase space (flat rows
    ``[n, dim]``), with the MALA log acceptance ratio ``l``."""

    __slots__ = ("x", "p", "v", "base", "g_v", "g_base", "lp", "ell", "ok")

    def __init__(self, x, gz, lp, p, h, b, metric, density: Density):
        hh = h[:, None]
        p_half = p + 0.5 * hh * gz
        self.x = x + hh * metric_mul(metric, p_half)
        self.v, self.base, self.g_v, self.g_base = density.grad_components(self.x)
        g_new = slot_grad(self.g_v, self.g_base, b)
        self.p = p_half + 0.5 * hh * metric_tmul(metric, g_new)
        self.lp = self.base - b * self.v
        ell = (self.lp - 0.5 * (self.p**2).sum(-1)) - (lp - 0.5 * (p**2).sum(-1))
        self.ok = (torch.isfinite(self.lp) & finite_rows(self.x) & finite_rows(g_new)
                   & finite_rows(self.p))
        self.ell = torch.where(self.ok & ~torch.isnan(ell), ell,
                               torch.full_like(ell, -math.inf))


def _rows(metric, mask):
    return None if metric is None else metric[mask]


class AutoMALA(GradientCached):
    """AutoMALA (see the module docstring).

    Args:
        max_doublings: the cap ``K`` on doublings / halvings of the step per step (an integer
            in ``[1, 60]``; default 30: steps within ``2^+-30`` of the jittered base step;
            the search stops once the ratio is inside the thresholds, so a high cap costs
            nothing where the base step is reasonable).
        jitter: the standard deviation ``s`` of the log-normal jitter of the base step
            (``>= 0``; default 0.5).
        symmetric: the thresholds bound ``-|l|`` (default) rather than ``l``.  Both are exact;
            with the signed ``l`` (the autoMALA paper's rule) the selection from the proposal
            of a large downhill move (``l >> 0``) is a different step, so far from the mode
            every move fails the reversibility check: from the default start on a Gaussian
            with sds 1 and 0.01 no replica moved in 8 rounds (acceptance 0).  With ``|l|``
            the selected step has the same ``|l|`` from either end and the chain descends
            (about ``log(1/a)`` per step).
    """

    name = "automala"
    uses_gradient = True
    preconditionable = True
    compilable = False  # data-dependent doubling loop
    substeps = 2
    #: the explorer acceptance is reported (the mean MH probability times the reversibility
    #: check) but not tuned toward: the base step follows the selected steps instead
    target_acceptance = None
    acceptance_order = None
    options = (STEP_SIZE, PRECONDITION,
               Option("max_doublings", integer(1, 60), default=30, section="explorer",
                      parse=parse_int,
                      help="automala: cap on the doublings / halvings of the step per step"))

    def __init__(self, max_doublings: int = 30, jitter: float = 0.5, symmetric: bool = True):
        if (isinstance(max_doublings, bool) or int(max_doublings) != max_doublings
                or not 1 <= max_doublings <= 60):
            raise ValueError(f"max_doublings must be an integer in [1, 60]; got "
                             f"{max_doublings!r}")
        if not (isinstance(jitter, int | float) and math.isfinite(jitter) and jitter >= 0):
            raise ValueError(f"jitter must be a finite number >= 0; got {jitter!r}")
        if not isinstance(symmetric, bool):
            raise ValueError(f"symmetric must be true or false; got {symmetric!r}")
        self.max_doublings = int(max_doublings)
        self.jitter = float(jitter)
        self.symmetric = symmetric

    def describe(self) -> dict:
        return {"name": self.name, "max_doublings": self.max_doublings, "jitter": self.jitter,
                "symmetric": self.symmetric}

    def step_adaptor(self, target_acceptance=None, *, phase=None, follow=None):
        """The base step per slot from the selected steps (:class:`AutoStepAdaptor`)."""
        return AutoStepAdaptor(phase=phase, follow=follow)

    def prepare(self, state: ReplicaState, density: Density) -> ReplicaState:
        state = super().prepare(state, density)
        nan = torch.full_like(state.v, math.nan)
        return state.replace(extras={**state.extras, LOG_STEP: nan, AT_B: nan.clone()})

    # ------------------------------------------------------------------------- the selection
    def _criterion(self, ell: torch.Tensor) -> torch.Tensor:
        """What the thresholds compare: ``-|l|`` (symmetric) or ``l`` (signed)."""
        return -ell.abs() if self.symmetric else ell

    def _select(self, x, gz, lp, p, log_a, log_b, h0, b, metric, density):
        """``(j, leap)``: the selected exponent ``j`` (step ``h0 2^j``) per row and the leapfrog
        step at it.  Rows: flat ``[n, ...]``."""
        first = _Leap(x, gz, lp, p, h0, b, metric, density)
        n = x.shape[0]
        j = torch.zeros(n, dtype=torch.long, device=x.device)
        crit = self._criterion
        up = crit(first.ell) >= log_b
        down = crit(first.ell) <= log_a
        sel = first
        searching = up | down
        direction = torch.where(up, 1, -1)
        for k in range(1, self.max_doublings + 1):
            if not bool(searching.any()):
                break
            rows = searching.nonzero().squeeze(-1)
            h = h0[rows] * torch.pow(2.0, (direction[rows] * k).to(h0.dtype))
            leap = _Leap(x[rows], gz[rows], lp[rows], p[rows], h, b[rows], _rows(metric, rows),
                         density)
            dr = direction[rows]
            # doubling: stop at the first step below log b and keep the one before (already
            # selected); still above: select this one.  halving: select this one; stop once
            # above log a.
            c = crit(leap.ell)
            take = torch.where(dr > 0, c >= log_b[rows], torch.ones_like(leap.ok))
            stop = torch.where(dr > 0, c < log_b[rows], c > log_a[rows])
            take_rows = rows[take]
            j[take_rows] = direction[take_rows] * k
            sel = _merge(sel, leap, rows, take)
            searching[rows[stop]] = False
        return j, sel

    def step(self, state, b, step_size, density: Density, noise: Noise, sub: int = 0,
             metric=None):
        state = self._cached(state, density)
        shape, dim, dtype = state.v.shape, state.x.shape[-1], state.x.dtype
        p = noise.normal(sub, (dim,), dtype)
        eta = noise.normal(sub + 1, (), dtype)
        u = noise.uniform(sub, dtype, (2,), parts=(1,))
        log_a = torch.log(torch.minimum(u[..., 0], u[..., 1]))
        log_b = torch.log(torch.maximum(u[..., 0], u[..., 1]))
        h0 = step_size.to(dtype) * torch.exp(self.jitter * eta)

        def flat(t):
            return t.reshape(-1, *t.shape[len(shape):])

        x, bb, M = flat(state.x), flat(b.to(dtype).expand(shape)), (
            None if metric is None else flat(metric.to(dtype).expand(*shape, *metric.shape[2:])))
        g = slot_grad(flat(state.extras["grad_v"]), flat(state.extras["grad_base"]), bb)
        lp = flat(state.log_density(b))
        start_ok = finite_rows(g) & torch.isfinite(lp)
        gz = metric_tmul(M, g)
        j, fwd = self._select(x, gz, lp, flat(p), flat(log_a), flat(log_b), flat(h0), bb, M,
                              density)
        rev_ok = self._reversible(fwd, j, flat(log_a), flat(log_b), flat(h0), bb, M, density)
        ok = fwd.ok & start_ok
        log_alpha = torch.where(ok & rev_ok, fwd.ell, torch.full_like(fwd.ell, -math.inf))
        log_alpha = log_alpha.reshape(shape)
        accepted = torch.log(noise.uniform(sub, dtype)) < log_alpha
        prob = torch.exp(torch.clamp(log_alpha, max=0.0))
        def unflat(t):
            return t.reshape(*shape, *t.shape[1:])

        log_h = torch.log(flat(h0)) + j.to(dtype) * math.log(2.0)
        prop = ReplicaState(unflat(fwd.x), unflat(fwd.v), unflat(fwd.base),
                            {"grad_v": unflat(fwd.g_v), "grad_base": unflat(fwd.g_base)})
        new = state.where(accepted, prop)
        new = new.replace(extras={**new.extras, LOG_STEP: unflat(log_h),
                                  AT_B: b.to(dtype).expand(shape).clone()})
        return new, ExploreInfo(prob, accepted, ~unflat(ok))

    def _reversible(self, fwd: _Leap, j, log_a, log_b, h0, b, metric, density) -> torch.Tensor:
        """Whether the selection from ``(x', -p')`` picks exponent ``j`` too (rows where the
        proposal is not finite: False, without evaluating)."""
        out = torch.zeros_like(fwd.ok)
        rows = fwd.ok.nonzero().squeeze(-1)
        if rows.numel() == 0:
            return out
        g = slot_grad(fwd.g_v[rows], fwd.g_base[rows], b[rows])
        M = _rows(metric, rows)
        j_rev, _ = self._select(fwd.x[rows], metric_tmul(M, g), fwd.lp[rows], -fwd.p[rows],
                                log_a[rows], log_b[rows], h0[rows], b[rows], M, density)
        out[rows] = j_rev == j[rows]
        return out


def _merge(sel: _Leap, leap: _Leap, rows: torch.Tensor, take: torch.Tensor) -> _Leap:
    """``sel`` with the rows ``rows[take]`` replaced by ``leap``'s (in place on clones)."""
    if not bool(take.any()):
        return sel
    out = _Leap.__new__(_Leap)
    dst = rows[take]
    for name in _Leap.__slots__:
        t = getattr(sel, name).clone()
        t[dst] = getattr(leap, name)[take]
        setattr(out, name, t)
    return out


class AutoStepAdaptor(AdaptorBase):
    """Between rounds: each slot's base step becomes the geometric mean of the steps AutoMALA
    selected at that slot during the round (slots without a step keep theirs).  ``phase``:
    act only at the end of segments whose name starts with it; ``follow``: a
    :class:`nrpt.adapt.rounds.ScheduleAdaptor` whose moves of ``b`` (``b0 -> b1``, same
    segment end) scale the new step by ``sqrt(b0 / b1)`` (as :class:`StepSizeAdaptor`)."""

    name = "automala-step"

    def __init__(self, phase: str | None = None, follow=None):
        self.phase, self.follow = phase, follow
        #: the :class:`nrpt.adapt.metric.MetricAdaptor` run before this one: where it changed
        #: a slot's metric the new base step is multiplied by its step ratio (the steps were
        #: selected in the old whitened units)
        self.metric_from = None
        self.sum: torch.Tensor | None = None
        self.count: torch.Tensor | None = None

    def observe(self, it: Iteration) -> Update | None:
        ex = it.state.extras
        if LOG_STEP not in ex or AT_B not in ex:
            return None
        log_h, at_b = ex[LOG_STEP].double(), ex[AT_B].double()  # [R, P] per replica
        sched = it.schedule.double()  # [R, P] per slot
        # the slot each replica explored at: the one whose b is the b of its step
        slot = (sched[:, None, :] - at_b[..., None]).abs().argmin(-1)  # [R, P]
        seen = torch.isfinite(log_h) & torch.isfinite(at_b)
        if self.sum is None or self.sum.shape != sched.shape:
            self.sum = torch.zeros_like(sched)
            self.count = torch.zeros_like(sched)
        self.sum.scatter_add_(1, slot, torch.where(seen, log_h, torch.zeros_like(log_h)))
        self.count.scatter_add_(1, slot, seen.double())
        return None

    def end_segment(self, view: SegmentView) -> Update | None:
        total, count = self.sum, self.count
        self.sum = self.count = None
        if view.last or (self.phase is not None and not view.name.startswith(self.phase)):
            return None
        h = view.step_size.detach().cpu().double()
        if total is None or total.shape != h.shape:
            return None
        total, count = total.cpu(), count.cpu()
        new = torch.where(count > 0, torch.exp(total / count.clamp(min=1)), h)
        new = torch.where(torch.isfinite(new) & (new > 0), new, h)
        moved = self.follow.moved if self.follow is not None else None
        if moved is not None and moved[0] == view.index:
            _, b0, b1 = moved
            with np.errstate(all="ignore"):
                scale = np.sqrt(b0 / b1)
            scale = np.where(np.isfinite(scale) & (scale > 0), scale, 1.0)
            new = new * torch.as_tensor(scale)
        changed = self.metric_from.changed if self.metric_from is not None else None
        if changed is not None and changed[0] == view.index:
            ratio = changed[1].detach().cpu().double()
            new = new * torch.where(torch.isfinite(ratio) & (ratio > 0), ratio,
                                    torch.ones_like(ratio))
        return Update(step_size=new.to(view.step_size))

    def state_dict(self) -> dict:
        return {"sum": self.sum, "count": self.count}

    def load_state_dict(self, sd: dict) -> None:
        self.sum, self.count = sd.get("sum"), sd.get("count")
