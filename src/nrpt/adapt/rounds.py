r"""Between-round adaptors of adaptive NRPT (Syed, Bouchard-Côté, Deligiannidis & Doucet 2021).

Rounds are segments of doubling length (:func:`nrpt.loop.Plan.rounds`).  At the end of every
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

from ..roles import AdaptorBase, SegmentView, Update
from .schedule import update_schedule
from .step import ACCEPTANCE_ORDER, step_size_factor

__all__ = ["ScheduleAdaptor", "StepSizeAdaptor", "SliceWidthAdaptor", "DEFAULT_ACCEPTANCE",
           "SLICE_WIDTH"]

#: explorer acceptance aimed at when adapting step sizes (``target_acceptance`` overrides)
DEFAULT_ACCEPTANCE = {"rwmh": 0.3, "mala": 0.574, "hmc": 0.65}
#: slice width per unit of a slot's standard deviation: the mean width of a Gaussian slice,
#: 2 E[sqrt(2 Exp(1))] sd = 2.5 sd
SLICE_WIDTH = 2.5


class ScheduleAdaptor(AdaptorBase):
    """Re-fit each system's schedule from the round's rejection rates (the ``swaps``
    recorder) so that the next round's pairs have equal rejection rates."""

    name = "schedule"

    def end_segment(self, view: SegmentView) -> Update | None:
        if view.last:
            return None
        rej = view.recorders["swaps"].rejection().detach().cpu().double().numpy()
        b = view.schedule.detach().cpu().double().numpy()
        new = np.stack([update_schedule(b[s], rej[s]) for s in range(b.shape[0])])
        return Update(schedule=torch.as_tensor(new))


class StepSizeAdaptor(AdaptorBase):
    """Multiply each slot's step size by :func:`nrpt.adapt.step.step_size_factor` of the
    round's explorer acceptance (the ``swaps`` recorder) toward ``target`` acceptance."""

    name = "step-size"

    def __init__(self, explorer: str, target: float | None = None):
        if explorer not in ACCEPTANCE_ORDER:
            raise ValueError(f"step-size adaptation needs explorer {', '.join(ACCEPTANCE_ORDER)}"
                             f"; got {explorer!r}")
        self.order = ACCEPTANCE_ORDER[explorer]
        self.target = float(target) if target is not None else DEFAULT_ACCEPTANCE[explorer]

    def end_segment(self, view: SegmentView) -> Update | None:
        if view.last:
            return None
        acc = view.recorders["swaps"].explorer_acceptance().detach().cpu().double().numpy()
        factor = torch.as_tensor(step_size_factor(acc, self.target, self.order))
        return Update(step_size=view.step_size * factor.to(view.step_size))


class SliceWidthAdaptor(AdaptorBase):
    """Set each slot's slice width to :data:`SLICE_WIDTH` times the mean standard deviation of
    the states seen at that slot during the round (the ``spread`` recorder)."""

    name = "slice-width"

    def end_segment(self, view: SegmentView) -> Update | None:
        if view.last:
            return None
        scale = view.recorders["spread"].scale().to(view.step_size)
        ok = torch.isfinite(scale) & (scale > 0)
        return Update(step_size=torch.where(ok, SLICE_WIDTH * scale, view.step_size))
