"""Adaptors: what tunes the ladder while sampling.

* :mod:`nrpt.adapt.schedule` -- round-based schedule adaptation from swap rejection rates
  (Syed et al. 2021): fitted cumulative barrier, local barrier, equalized schedule;
* :mod:`nrpt.adapt.step` -- between-round step sizes towards a target acceptance.
"""

from nrpt.adapt.schedule import (
    BarrierFit,
    clean_rejections,
    equalized_schedule,
    fit_barrier,
    recommended_chains,
    restart_rate_curve,
    update_schedule,
    validate_schedule,
)
from nrpt.adapt.step import ACCEPTANCE_ORDER, step_size_factor

__all__ = ["ACCEPTANCE_ORDER", "BarrierFit", "clean_rejections", "equalized_schedule",
           "fit_barrier", "recommended_chains", "restart_rate_curve", "step_size_factor",
           "update_schedule", "validate_schedule"]
