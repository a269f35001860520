r"""Between-round adaptors of adaptive NRPT (Syed, Bouchard-Côté, Deligiannidis & Doucet 2021).

Rounds are segments of doubling length (:func:`nrpt.core.loop.Plan.rounds`).  At the end of every
round but the last, each adaptor reads the round's statistics from the recorders and returns an
:class:`~nrpt.roles.Update`:

* :class:`ScheduleAdaptor` -- rejection rates of the round  -->  fitted cumulative barrier
  Lambda(b)  -->  new schedule equally spaced in Lambda (:mod:`nrpt.adapt.schedule`);
* :class:`StepSizeAdaptor` -- explorer acceptance of the round  -->  step sizes toward a target
  acceptance (rwmh, mala, hmc; :mod:`nrpt.adapt.step`);
* :class:`SliceWidthAdaptor` -- the spread of each slot's states  -->  slice interval widths;
* :class:`ChainsAdaptor` (``chains = "auto"``, run last) -- the round's barrier estimate asks
  for more chains than the ladder has  -->  a longer ladder equally spaced in the fitted
  Lambda (:class:`~nrpt.roles.SlotMap`; up to ``max_chains``).
"""

from __future__ import annotations

import numpy as np
import torch

from nrpt.adapt.chains import (
    fitted_chains,
    ladder_too_long,
    ladder_too_short,
    pairs_too_hard,
    recommended_chains,
)
from nrpt.adapt.schedule import clean_rejections, update_schedule
from nrpt.adapt.step import StepTuner, step_size_factor
from nrpt.roles import AdaptorBase, SegmentView, SlotMap, Update

__all__ = ["ScheduleAdaptor", "StepSizeAdaptor", "SliceWidthAdaptor", "ChainsAdaptor",
           "SLICE_WIDTH", "GROW_FROM_ITERATIONS", "own_tuning"]
#: slice width per unit of a slot's standard deviation: the mean width of a Gaussian slice,
#: 2 E[sqrt(2 Exp(1))] sd = 2.5 sd
SLICE_WIDTH = 2.5
#: ``mala-hmc``'s switch: HMC's (``L`` = 10 leapfrog steps, jitter 0.2) step at its target 0.65
#: is ``HMC_FROM_MALA h^(3/2)`` for MALA's step ``h`` at its target 0.574, both in units of the
#: sd (the acceptance models: ``a = 2 Phi(-c h^3 sqrt(d))`` for MALA, ``2 Phi(-c' h^2 sqrt(d))``
#: for HMC, so the dimension cancels).  Measured on standard Gaussians (numpy, 20000 draws per
#: step): 0.96, 1.01, 1.06, 1.14, 1.05 at d = 5, 13, 50, 200, 1000
HMC_FROM_MALA = 1.0


class ScheduleAdaptor(AdaptorBase):
    """Re-fit each system's schedule from the round's rejection rates (the ``swaps``
    recorder) so that the next round's pairs have equal rejection rates."""

    name = "schedule"

    def __init__(self):
        #: ``(segment index, old schedule, new schedule)`` of the last re-fit, for a
        #: :class:`StepSizeAdaptor` that follows it in the same segment end
        self.moved: tuple[int, np.ndarray, np.ndarray] | None = None

    def end_segment(self, view: SegmentView) -> Update | None:
        if view.last:
            return None
        rej = view.recorders["swaps"].rejection().detach().cpu().double().numpy()
        b = view.schedule.detach().cpu().double().numpy()
        new = np.stack([update_schedule(b[s], rej[s]) for s in range(b.shape[0])])
        self.moved = (view.index, b, new)
        return Update(schedule=torch.as_tensor(new))

    def follow_ladder(self, m: SlotMap) -> None:
        """(no per-slot memory beyond the last re-fit, which the grown ladder replaces)"""
        self.moved = None


class StepSizeAdaptor(AdaptorBase):
    """Move each slot's step size toward ``target`` acceptance (default: the ``explorer``'s
    ``target_acceptance``; its ``acceptance_order`` is the model's ``k``) from the segment's
    explorer acceptance (the ``swaps`` recorder), by :class:`nrpt.adapt.step.StepTuner`
    (checkpointed with the adaptor).

    ``phase``: act only at the end of segments whose name starts with it (``"warm-up"``); by
    default at the end of every segment but the last.  ``follow``: the :class:`ScheduleAdaptor`
    run before this one on a temperature ladder; where it moved a slot's ``b`` from ``b0`` to
    ``b1``, the tuned step is scaled by ``sqrt(b0 / b1)``."""

    name = "step-size"

    def __init__(self, explorer, target: float | None = None, phase: str | None = None,
                 follow: ScheduleAdaptor | None = None):
        order = getattr(explorer, "acceptance_order", None)
        if order is None:
            raise ValueError(f"step-size adaptation needs an explorer that declares "
                             f"acceptance_order (and target_acceptance); got explorer "
                             f"{getattr(explorer, 'name', explorer)!r}")
        self.order = int(order)
        self.given_target = target
        self.target = float(target if target is not None else explorer.target_acceptance)
        #: the next update is the first after a switch to HMC (fast tuning in it)
        self.hmc_fast = False
        self._kernel0 = (self.order, self.target)
        self.phase = phase
        self.follow = follow
        #: the :class:`nrpt.adapt.metric.MetricAdaptor` run before this one: where it changed
        #: the metric, the tuned step is multiplied by its step ratio and the bracket restarts
        self.metric_from = None
        self.tuner = StepTuner(self.target, self.order)

    def end_segment(self, view: SegmentView) -> Update | None:
        if view.last or (self.phase is not None and not view.name.startswith(self.phase)):
            return None
        acc = view.recorders["swaps"].explorer_acceptance().detach().cpu().double().numpy()
        h = view.step_size.detach().cpu().double().numpy()
        new = self.tuner.update(h, acc)
        if self.hmc_fast:  # (the first HMC round after a switch only)
            self.tuner.fast, self.hmc_fast = False, False
        moved = self.follow.moved if self.follow is not None else None
        scale = 1.0
        if moved is not None and moved[0] == view.index:
            _, b0, b1 = moved
            with np.errstate(all="ignore"):
                scale = np.sqrt(b0 / b1)
            scale = np.where(np.isfinite(scale) & (scale > 0), scale, 1.0)
            new = new * scale
            self.tuner.rescale(scale)
        changed = self.metric_from.changed if self.metric_from is not None else None
        switched = (self.metric_from is not None
                    and getattr(self.metric_from, "switched_at", None) == view.index)
        if switched:
            return self._switch(view, h, acc, scale, changed)
        if changed is not None and changed[0] == view.index:
            ratio = changed[1].detach().cpu().double().numpy()
            # the new metric's step: the plain model step (no fast move, no bracket: both were
            # for the old metric) mapped by the ratio, and a fresh bracket from there
            changed = np.abs(np.log(ratio)) > 0.01
            plain = h * step_size_factor(acc, self.target, self.order) * scale
            new = np.where(changed, plain * ratio, new)
            self.tuner.restart(changed)
        return Update(step_size=torch.as_tensor(new).to(view.step_size))

    def _switch(self, view: SegmentView, h, acc, scale, changed) -> Update:
        """The explorer switched from MALA (with a metric) to HMC without one (``mala-hmc``,
        :meth:`nrpt.adapt.metric.MetricAdaptor._switch`): each slot's MALA step, moved to
        MALA's target by the plain model step, becomes HMC's step at HMC's target by
        :data:`HMC_FROM_MALA` ``h^(3/2)`` (whitened units), times the shortest old unit step
        in x (``changed``); the tuner then aims at HMC's target with HMC's order, forgets its
        MALA bracket and moves a slot at acceptance ~0 / ~1 by 10x in the first HMC round."""
        hmc = self.metric_from.switch.hmc  # (MALAThenHMC's own HMC)
        plain = h * step_size_factor(acc, self.target, self.order)
        new = HMC_FROM_MALA * plain ** 1.5 * scale
        if changed is not None and changed[0] == view.index:
            new = new * changed[1].detach().cpu().double().numpy()
        if self.given_target is None:
            self.target = float(hmc.target_acceptance)
        self.order = int(hmc.acceptance_order)
        self.tuner = StepTuner(self.target, self.order, fast=True)
        self.hmc_fast = True
        return Update(step_size=torch.as_tensor(new).to(view.step_size))

    def follow_ladder(self, m: SlotMap) -> None:
        """The ladder grew: the tuner's per-slot memory (brackets, last step and acceptance)
        starts afresh from the engine's carried step sizes."""
        self.tuner.lo = self.tuner.hi = self.tuner.prev_h = self.tuner.prev_a = None
        self.tuner.pressed = None

    def state_dict(self) -> dict:
        sd = self.tuner.state_dict()
        if self.hmc_fast or (self.order, self.target) != self._kernel0:
            sd["kernel"] = {"target": self.target, "order": self.order,
                            "hmc_fast": self.hmc_fast}
        return sd

    def load_state_dict(self, sd: dict) -> None:
        k = sd.get("kernel")
        if k is not None:  # (switched to HMC: its target and order, and the fast round)
            self.target, self.order = float(k["target"]), int(k["order"])
            self.hmc_fast = bool(k["hmc_fast"])
            self.tuner = StepTuner(self.target, self.order, fast=self.hmc_fast)
        self.tuner.load_state_dict(sd)


class SliceWidthAdaptor(AdaptorBase):
    """Set each slot's slice width to :data:`SLICE_WIDTH` times the mean standard deviation of
    the states seen at that slot during the round (the ``spread`` recorder)."""

    name = "slice-width"
    #: the ``spread`` recorder must watch every slot (not only the hottest)
    spread_slots = "all"
    #: the :class:`nrpt.adapt.metric.MetricAdaptor` run before this one: with a metric the
    #: widths are in whitened units, from its mean whitened standard deviation
    metric_from = None

    def end_segment(self, view: SegmentView) -> Update | None:
        if view.last:
            return None
        z = self.metric_from.z_scale if self.metric_from is not None else None
        if z is not None and z[0] == view.index:
            scale = z[1].to(view.step_size)
        else:
            scale = view.recorders["spread"].scale().to(view.step_size)
        ok = torch.isfinite(scale) & (scale > 0)
        return Update(step_size=torch.where(ok, SLICE_WIDTH * scale, view.step_size))

    def follow_ladder(self, m: SlotMap) -> None:
        """(no per-slot memory: the widths are the engine's, carried by its growth)"""


#: the ladder grows only from rounds of at least this many iterations (round 4 on): the
#: rejection rates of the first rounds rest on a handful of swap attempts per pair
GROW_FROM_ITERATIONS = 16


class ChainsAdaptor(AdaptorBase):
    """``chains = "auto"``: between rounds, where the round's barrier estimate ``Lambda-hat``
    (any system's) asks for clearly more chains than the ladder has, ``2 Lambda-hat > 1.25 P``
    (:func:`~nrpt.adapt.chains.ladder_too_short`; Syed et al. 2021: about ``2 Lambda``
    chains, :func:`recommended_chains`), grow the ladder
    to ``min(max_chains, ceil(2 Lambda-hat))`` slots placed equally in the fitted cumulative
    barrier (the re-fit of :class:`ScheduleAdaptor` with more slots; on a saturated estimate,
    near ``P - 1``, this about doubles the ladder and the next round looks again).  Only
    rounds of at least :data:`GROW_FROM_ITERATIONS` iterations decide.  Runs after every
    other adaptor: its :class:`~nrpt.roles.Update` ``grow`` replaces the round's schedule, and
    the engine and every adaptor and recorder follow the :class:`~nrpt.roles.SlotMap`.

    ``history``: one entry per growth ``{"round", "from", "to", "barrier"}``; ``capped``: the
    last round whose estimate asked for more than ``max_chains`` allows (``{"round",
    "chains", "barrier", "needed"}``), else None."""

    name = "chains"

    def __init__(self, max_chains: int, min_iterations: int = GROW_FROM_ITERATIONS,
                 min_chains: int | None = None):
        if isinstance(max_chains, bool) or int(max_chains) != max_chains or max_chains < 3:
            raise ValueError(f"max_chains must be an integer >= 3; got {max_chains!r}")
        if min_chains is not None and (isinstance(min_chains, bool) or int(min_chains)
                                       != min_chains or not 2 <= min_chains <= max_chains):
            raise ValueError(f"min_chains must be an integer in [2, max_chains = {max_chains}] "
                             f"or None; got {min_chains!r}")
        self.max_chains = int(max_chains)
        self.min_chains = None if min_chains is None else int(min_chains)
        self.min_iterations = int(min_iterations)
        self.history: list[dict] = []
        self.capped: dict | None = None

    def end_segment(self, view: SegmentView) -> Update | None:
        if view.last or view.iterations < self.min_iterations:
            return None
        rej = view.recorders["swaps"].rejection().detach().cpu().double().numpy()
        b = view.schedule.detach().cpu().double().numpy()
        R, P = b.shape
        lam = [float(clean_rejections(rej[s], P - 1).sum()) for s in range(R)]
        worst = max(lam)
        if self.min_chains is not None:
            return self._both_ways(view, rej, b, worst)
        if not ladder_too_short(worst, P):
            return None
        need = recommended_chains(worst)
        return self._resize(view, rej, b, worst, min(self.max_chains, need), need)

    def _both_ways(self, view: SegmentView, rej, b, worst: float) -> Update | None:
        """``min_chains`` set: the ladder fits the barrier in both directions, to
        :func:`~nrpt.adapt.chains.fitted_chains` ``(Lambda-hat, min_chains)`` (each equalized
        pair rejecting at most 1/2): it grows where the old rule asks
        (:func:`~nrpt.adapt.chains.ladder_too_short`) or where a pair rejects clearly more
        than 1/2 on average (:func:`~nrpt.adapt.chains.pairs_too_hard`, which sees a 2- or
        3-chain ladder's shortfall that ``2 Lambda-hat > 1.25 P`` cannot), and shrinks where
        the ladder has clearly more, ``P >= 1.25 x`` the fit (:func:`ladder_too_long`)."""
        P = b.shape[1]
        fit = fitted_chains(worst, self.min_chains)
        if ladder_too_short(worst, P) or pairs_too_hard(worst, P):
            need = max(fit, recommended_chains(worst))
            return self._resize(view, rej, b, worst, min(self.max_chains, need), need)
        if ladder_too_long(worst, P, self.min_chains):
            return self._resize(view, rej, b, worst, fit, fit)
        return None

    def _resize(self, view: SegmentView, rej, b, worst: float, new_p: int,
                need: int) -> Update | None:
        R, P = b.shape
        if need > P >= new_p:  # a growth the cap stops
            self.capped = {"round": view.index + 1, "chains": P, "barrier": worst,
                           "needed": need}
            return Update(note={"chains_capped": dict(self.capped)})
        if new_p == P:
            return None
        self.capped = None if new_p == need else {"round": view.index + 1, "chains": new_p,
                                                  "barrier": worst, "needed": need}
        new = np.stack([update_schedule(b[s], rej[s], n_slots=new_p) for s in range(R)])
        self.history.append({"round": view.index + 1, "from": P, "to": new_p,
                             "barrier": worst})
        note = {"chains_grown": [dict(h) for h in self.history if h["to"] > h["from"]]}
        shrunk = [dict(h) for h in self.history if h["to"] < h["from"]]
        if shrunk:
            note["chains_shrunk"] = shrunk
        if self.capped is not None:
            note["chains_capped"] = dict(self.capped)
        m = SlotMap.grow(P, new_p) if new_p > P else SlotMap.shrink(P, new_p)
        return Update(resize=(torch.as_tensor(new).to(view.schedule), m), note=note)

    def follow_ladder(self, m: SlotMap) -> None:
        """(its own growth: nothing per slot to carry)"""

    def state_dict(self) -> dict:
        return {"history": [dict(h) for h in self.history],
                "capped": None if self.capped is None else dict(self.capped)}

    def load_state_dict(self, sd: dict) -> None:
        self.history = [dict(h) for h in sd.get("history", [])]
        self.capped = None if sd.get("capped") is None else dict(sd["capped"])


def own_tuning(explorer, target: float | None = None, phase: str | None = None,
               follow: ScheduleAdaptor | None = None):
    """The adaptor that tunes ``explorer``'s step sizes: its own ``step_adaptor`` if it gives
    one, else a :class:`StepSizeAdaptor` where it declares ``acceptance_order``, else
    ``None`` (it cannot tune itself)."""
    own = getattr(explorer, "step_adaptor", None)
    adaptor = own(target, phase=phase, follow=follow) if own is not None else None
    if adaptor is None and getattr(explorer, "acceptance_order", None) is not None:
        adaptor = StepSizeAdaptor(explorer, target, phase=phase, follow=follow)
    return adaptor
