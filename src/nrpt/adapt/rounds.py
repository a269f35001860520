r"""Between-round adaptors of adaptive NRPT (Syed, Bouchard-Côté, Deligiannidis & Doucet 2021).

Rounds are segments of doubling length (:func:`nrpt.core.loop.Plan.rounds`).  At the end of every
round but the last, each adaptor reads the round's statistics from the recorders and returns an
:class:`~nrpt.roles.Update`:

* :class:`ScheduleAdaptor` -- rejection rates of the round  -->  fitted cumulative barrier
  Lambda(b)  -->  new schedule equally spaced in Lambda (:mod:`nrpt.adapt.schedule`);
* :class:`StepSizeAdaptor` -- explorer acceptance of the round  -->  step sizes toward a target
  acceptance (rwmh, mala, hmc; :mod:`nrpt.adapt.step`);
* :class:`SliceWidthAdaptor` -- the spread of each slot's states  -->  slice interval widths.
"""

from __future__ import annotations

import numpy as np
import torch

from nrpt.adapt.schedule import update_schedule
from nrpt.adapt.step import StepTuner, step_size_factor
from nrpt.roles import AdaptorBase, SegmentView, Update

__all__ = ["ScheduleAdaptor", "StepSizeAdaptor", "SliceWidthAdaptor", "SLICE_WIDTH", "own_tuning"]
#: slice width per unit of a slot's standard deviation: the mean width of a Gaussian slice,
#: 2 E[sqrt(2 Exp(1))] sd = 2.5 sd
SLICE_WIDTH = 2.5


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
        self.target = float(target if target is not None else explorer.target_acceptance)
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
        if changed is not None and changed[0] == view.index:
            ratio = changed[1].detach().cpu().double().numpy()
            # the new metric's step: the plain model step (no fast move, no bracket: both were
            # for the old metric) mapped by the ratio, and a fresh bracket from there
            changed = np.abs(np.log(ratio)) > 0.01
            plain = h * step_size_factor(acc, self.target, self.order) * scale
            new = np.where(changed, plain * ratio, new)
            self.tuner.restart(changed)
        return Update(step_size=torch.as_tensor(new).to(view.step_size))

    def state_dict(self) -> dict:
        return self.tuner.state_dict()

    def load_state_dict(self, sd: dict) -> None:
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
