r"""Theoretical round-trip, restart and barrier formulas for (non-reversible) PT.

Pure numpy / Python; every function validates its arguments and raises
:class:`ValueError` naming the offending argument and its allowed range.

Notation: ``P`` chains (slots ``0..P-1``), ``r_p`` the rejection rate of the swap
between adjacent slots ``p`` and ``p+1`` (``P-1`` rates), ``W`` the window size of the
generalized DEO scheme ``DEO_W`` (each even/odd swap phase lasts ``W`` iterations).

References
----------
* S. Syed, A. Bouchard-Côté, G. Deligiannidis, A. Doucet (2021), "Non-reversible
  parallel tempering: a scalable highly parallel MCMC scheme", JRSS-B.
* W. Deng, Q. Zhang, Q. Feng, F. Liang, G. Lin (2023), "Non-reversible parallel
  tempering for deep posterior approximation", AAAI (Lemma 1, Eq. 4; Table 1).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import numpy as np

__all__ = [
    "lemma1_round_trip_time",
    "predicted_round_trips_per_1000",
    "optimal_window",
    "barrier_from_rejections",
    "cumulative_barrier",
    "predicted_restart_rate",
    "asymptotic_restart_rate",
    "scheme_orders",
]


def _rejections(rejection: Sequence[float] | np.ndarray, name: str = "rejection") -> np.ndarray:
    """Validate a 1-D sequence of ``P-1 >= 1`` rejection rates in ``[0, 1]``."""
    try:
        r = np.asarray(rejection, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a sequence of rates in [0, 1]") from None
    if r.ndim != 1 or r.size < 1:
        raise ValueError(
            f"{name} must be a non-empty 1-D sequence of the P-1 adjacent rejection rates "
            f"(rates in [0, 1]), got shape {r.shape}"
        )
    if not np.all(np.isfinite(r)) or np.any(r < 0.0) or np.any(r > 1.0):
        raise ValueError(f"{name} must contain rates in [0, 1], got {r.tolist()}")
    return r


def _window(window) -> int:
    if isinstance(window, bool):
        raise ValueError(f"window must be an integer >= 1, got {window!r}")
    try:
        w = operator.index(window)
    except TypeError:
        raise ValueError(f"window must be an integer >= 1, got {window!r}") from None
    if w < 1:
        raise ValueError(f"window must be an integer >= 1, got {w}")
    return w


def lemma1_round_trip_time(rejection: Sequence[float] | np.ndarray, window: int = 1) -> float:
    r"""Expected round-trip time of ``DEO_W`` (Deng et al. 2023, Lemma 1, Eq. 4).

    .. math::

        \mathbb{E}[T] = 2WP + 2WP \sum_{p=0}^{P-2} \frac{r_p^W}{1 - r_p^W},

    where ``P = len(rejection) + 1`` and ``W = window``.  With ``W = 1`` this is the
    DEO round-trip time of Syed et al. (2021).  With all swaps accepted
    (``r_p = 0``) a replica zig-zags deterministically and ``E[T] = 2WP``.

    Returns ``inf`` if any ``r_p == 1`` (that pair never swaps, no round trip).
    """
    r = _rejections(rejection)
    w = _window(window)
    n_chains = r.size + 1
    if np.any(r >= 1.0):
        return math.inf
    rw = r**w
    return float(2 * w * n_chains * (1.0 + np.sum(rw / (1.0 - rw))))


def predicted_round_trips_per_1000(
    rejection: Sequence[float] | np.ndarray, window: int = 1
) -> float:
    r"""Predicted number of round trips per 1000 iterations, summed over the ``P`` replicas.

    Each of the ``P`` replicas completes round trips as a renewal process with mean
    inter-arrival time :func:`lemma1_round_trip_time`, so the total rate is
    ``P / E[T]`` per iteration, i.e. ``1000 P / E[T]`` per 1000 iterations
    (``0`` if ``E[T] = inf``).
    """
    r = _rejections(rejection)
    expected_time = lemma1_round_trip_time(r, window)
    if math.isinf(expected_time):
        return 0.0
    return 1000.0 * (r.size + 1) / expected_time


def optimal_window(n_chains: int, rejection_rate: float) -> int:
    r"""Optimal window size ``W*`` of ``DEO_W`` (Deng et al. 2023, derived from Lemma 1).

    .. math::

        W^\star = \left\lceil \frac{\log P + \log\log P}{-\log r} \right\rceil ,

    which makes ``r^W ≲ 1 / (P log P)`` so that the sum in Lemma 1 is ``O(1)`` and the
    round-trip time is ``O(P log P)`` instead of ``O(P^2)``.  Conventions: ``W* = 1``
    for ``P <= 3`` (``log log P`` is negative or tiny) and for ``r <= 0`` (swaps are
    never rejected, so no window is needed); the result is always at least 1.

    Parameters
    ----------
    n_chains:
        Number of chains ``P``, an integer ``>= 2``.
    rejection_rate:
        Common adjacent rejection rate ``r``, must be ``< 1`` (and not NaN).
    """
    if isinstance(n_chains, bool):
        raise ValueError(f"n_chains must be an integer >= 2, got {n_chains!r}")
    try:
        n = operator.index(n_chains)
    except TypeError:
        raise ValueError(f"n_chains must be an integer >= 2, got {n_chains!r}") from None
    if n < 2:
        raise ValueError(f"n_chains must be an integer >= 2, got {n}")
    try:
        r = float(rejection_rate)
    except (TypeError, ValueError):
        raise ValueError(
            f"rejection_rate must be a number in [0, 1), got {rejection_rate!r}"
        ) from None
    if math.isnan(r) or r >= 1.0:
        raise ValueError(f"rejection_rate must be a number in [0, 1), got {rejection_rate!r}")
    if n <= 3 or r <= 0.0:
        return 1
    w = math.ceil((math.log(n) + math.log(math.log(n))) / (-math.log(r)))
    return max(1, int(w))


def barrier_from_rejections(rejection: Sequence[float] | np.ndarray) -> float:
    r"""Estimated global communication barrier :math:`\hat\Lambda = \sum_p r_p` (Syed et al. 2021).

    For a fine schedule the rejection rates sum to the barrier
    :math:`\Lambda = \int_0^1 \lambda(\beta)\, d\beta`, independently of ``P``.
    """
    return float(np.sum(_rejections(rejection)))


def cumulative_barrier(rejection: Sequence[float] | np.ndarray) -> np.ndarray:
    r"""Cumulative barrier :math:`\hat\Lambda(\beta_p) = \sum_{q < p} r_q`, shape ``[P]``.

    Starts at ``0`` for slot ``0`` and ends at :func:`barrier_from_rejections`; it is
    the quantity whose equispacing the adaptive schedule of Syed et al. (2021) targets.
    """
    r = _rejections(rejection)
    return np.concatenate([[0.0], np.cumsum(r)])


def predicted_restart_rate(rejection: Sequence[float] | np.ndarray) -> float:
    r"""Finite-``P`` DEO restart rate of Syed et al. (2021, Theorem 1).

    .. math::

        \tau = \frac{1}{2 + 2 \sum_p \frac{r_p}{1 - r_p}},

    the expected number of restarts per iteration (summed over all replicas).  It
    equals ``P / E[T]`` with ``E[T]`` from Lemma 1 at ``W = 1``.  Returns ``0`` if any
    ``r_p == 1``.
    """
    r = _rejections(rejection)
    if np.any(r >= 1.0):
        return 0.0
    return float(1.0 / (2.0 + 2.0 * np.sum(r / (1.0 - r))))


def asymptotic_restart_rate(barrier: float) -> float:
    r"""Large-``P`` DEO restart rate :math:`\bar\tau = 1 / (2 + 2\Lambda)` (Syed et al. 2021).

    ``barrier`` is the global communication barrier :math:`\Lambda \ge 0`.
    """
    try:
        lam = float(barrier)
    except (TypeError, ValueError):
        raise ValueError(f"barrier must be a finite number >= 0, got {barrier!r}") from None
    if not math.isfinite(lam) or lam < 0.0:
        raise ValueError(f"barrier must be a finite number >= 0, got {barrier!r}")
    return 1.0 / (2.0 + 2.0 * lam)


def scheme_orders(n_chains: int, rejection_rate: float) -> dict[str, float]:
    r"""Round-trip times for a uniform rejection rate, for display (cf. Deng et al. Table 1).

    Returns a dict with

    * ``"DEO"``: Lemma 1 with ``W = 1``, i.e. ``2P + 2P(P-1) r/(1-r)`` — ``O(P^2)``
      when ``r`` stays bounded away from 0;
    * ``"W_star"``: :func:`optimal_window` ``W*``;
    * ``"DEO_star"``: Lemma 1 with ``W = W*`` — ``O(P log P)``;
    * ``"P^2"`` and ``"P log P"``: the reference scalings ``P^2`` and ``P log P``.

    Parameters are validated as in :func:`optimal_window`.
    """
    w_star = optimal_window(n_chains, rejection_rate)
    rates = np.full(n_chains - 1, max(float(rejection_rate), 0.0))
    return {
        "DEO": lemma1_round_trip_time(rates, 1),
        "W_star": float(w_star),
        "DEO_star": lemma1_round_trip_time(rates, w_star),
        "P^2": float(n_chains**2),
        "P log P": float(n_chains * math.log(n_chains)),
    }
