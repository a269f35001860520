"""Adaptors: what tunes the ladder while sampling (the adaptor role, :mod:`nrpt.roles`).

:mod:`~nrpt.adapt.rounds` between rounds (Syed et al. 2021; :mod:`~nrpt.adapt.schedule`,
:mod:`~nrpt.adapt.step`); :mod:`~nrpt.adapt.sa` online stochastic approximation (Deng et al.
2023, Alg. 1); :mod:`~nrpt.adapt.window` ``window = "auto"``; :mod:`~nrpt.adapt.chains` how
many chains.
"""

from nrpt.adapt.chains import recommended_chains, recommended_chains_noisy, restart_rate_curve
from nrpt.adapt.rounds import ScheduleAdaptor, SliceWidthAdaptor, StepSizeAdaptor
from nrpt.adapt.sa import CorrectionAdaptor, LearningRateAdaptor, SAStepSize, VarianceTracker
from nrpt.adapt.schedule import (
    BarrierFit,
    clean_rejections,
    equalized_schedule,
    fit_barrier,
    update_schedule,
    validate_schedule,
)
from nrpt.adapt.step import step_size_factor
from nrpt.adapt.window import WindowAdaptor

__all__ = ["BarrierFit", "clean_rejections", "equalized_schedule",
           "fit_barrier", "recommended_chains", "recommended_chains_noisy", "restart_rate_curve",
           "step_size_factor", "update_schedule", "validate_schedule", "ScheduleAdaptor",
           "StepSizeAdaptor", "SliceWidthAdaptor", "CorrectionAdaptor", "LearningRateAdaptor",
           "VarianceTracker", "SAStepSize", "WindowAdaptor"]
