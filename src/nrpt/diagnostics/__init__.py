"""Diagnostics for non-reversible parallel tempering.

* :mod:`nrpt.diagnostics.roundtrips` — restart / round-trip counting of the index
  process (batched online :class:`RoundTripTracker` and the loop-based reference
  :func:`count_round_trips`).
* :mod:`nrpt.diagnostics.theory` — theoretical round-trip times (Deng et al. 2023,
  Lemma 1), optimal ``DEO_W`` window, communication barrier and restart rates
  (Syed et al. 2021).
"""

from nrpt.diagnostics.roundtrips import RoundTripTracker, count_round_trips
from nrpt.diagnostics.theory import (
    asymptotic_restart_rate,
    barrier_from_rejections,
    cumulative_barrier,
    lemma1_round_trip_time,
    optimal_window,
    predicted_restart_rate,
    predicted_round_trips_per_1000,
    scheme_orders,
)

__all__ = [
    "RoundTripTracker",
    "count_round_trips",
    "asymptotic_restart_rate",
    "barrier_from_rejections",
    "cumulative_barrier",
    "lemma1_round_trip_time",
    "optimal_window",
    "predicted_restart_rate",
    "predicted_round_trips_per_1000",
    "scheme_orders",
]
