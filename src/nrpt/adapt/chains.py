"""How many chains: the two recommendations nrpt makes, side by side.

* Exact energies (Syed et al. 2021): the restart rate with ``P`` equalized chains rises to its
  ``P -> inf`` limit ``1 / (2 + 2 Lambda)``; about ``2 Lambda`` chains get within a factor ~2
  (:func:`restart_rate_curve`, :func:`recommended_chains`).
* Noisy energies (Deng et al. 2023, Corollary 1 / appendix B.3): the crude optimal range of
  ``P`` from the energy estimators' standard deviations (:func:`recommended_chains_noisy`).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["restart_rate_curve", "recommended_chains", "recommended_chains_noisy",
           "ladder_too_short", "SHORT_LADDER", "fitted_chains", "pairs_too_hard",
           "ladder_too_long", "HARD_PAIR"]

#: a ladder of ``P`` chains is too short for a barrier estimate ``Lambda-hat`` when
#: ``2 Lambda-hat > SHORT_LADDER * P``: the margin keeps a ladder near ``2 Lambda`` (where the
#: restart rate is already within a factor ~2 of its limit, and more chains gain little) from
#: growing or being warned about by a chain or two of estimation noise
SHORT_LADDER = 1.25


def restart_rate_curve(barrier: float, chains) -> np.ndarray:
    r"""Predicted DEO restart rate with ``P`` chains on a schedule that equalizes the rejection
    rates, ``r = Lambda / (P - 1)`` per pair (first order in the spacing):

        tau(P) = 1 / (2 + 2 (P - 1) r / (1 - r)),   0 where r >= 1,

    increasing in ``P`` towards the asymptote ``1 / (2 + 2 Lambda)`` (Syed et al. 2021, Thm. 1 and
    Cor. 2): the diminishing return of more chains."""
    lam = float(barrier)
    if not (math.isfinite(lam) and lam >= 0.0):
        raise ValueError(f"barrier must be a finite number >= 0; got {barrier!r}")
    p = np.asarray(chains, dtype=float)
    if np.any(p < 2):
        raise ValueError("chains must be >= 2")
    r = lam / (p - 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        tau = 1.0 / (2.0 + 2.0 * (p - 1.0) * r / (1.0 - r))
    return np.where(r < 1.0, tau, 0.0)


def recommended_chains(barrier: float) -> int:
    """The number of chains suggested by the barrier, ``max(2, ceil(2 Lambda))``: with ``P ~
    2 Lambda`` equalized pairs reject ``r ~ 1/2`` each and the restart rate is within a factor
    ~2 of its ``P -> inf`` limit (see :func:`restart_rate_curve` for the whole curve)."""
    lam = float(barrier)
    if not (math.isfinite(lam) and lam >= 0.0):
        raise ValueError(f"barrier must be a finite number >= 0; got {barrier!r}")
    return max(2, math.ceil(2.0 * lam))


def ladder_too_short(barrier: float, chains: int) -> bool:
    """Whether ``chains`` are clearly fewer than the barrier asks for: ``2 Lambda-hat >``
    :data:`SHORT_LADDER` ``* P`` (then :func:`recommended_chains` says how many to use)."""
    return 2.0 * float(barrier) > SHORT_LADDER * int(chains)


#: with ``min_chains`` (a ladder fitted in both directions), the ladder is too short where its
#: pairs reject more than ``1/2`` by this margin on average, ``Lambda-hat / (P - 1) > 1.25 / 2``
#: (the same margin as :data:`SHORT_LADDER`), and too long where ``P >= SHORT_LADDER x`` the
#: fitted number of chains
HARD_PAIR = 0.5 * SHORT_LADDER


def fitted_chains(barrier: float, min_chains: int = 2) -> int:
    """The chains a ladder fitted in both directions moves to: ``max(min_chains, 1 + ceil(2
    Lambda))``, the fewest whose ``P - 1`` equalized pairs reject at most ``1/2`` each (the
    ``2 Lambda`` of :func:`recommended_chains` counted in pairs, not slots: at small barriers
    ``ceil(2 Lambda)`` slots would leave one pair rejecting ``Lambda`` near 1)."""
    lam = float(barrier)
    if not (math.isfinite(lam) and lam >= 0.0):
        raise ValueError(f"barrier must be a finite number >= 0; got {barrier!r}")
    return max(int(min_chains), 1 + math.ceil(2.0 * lam))


def pairs_too_hard(barrier: float, chains: int) -> bool:
    """Whether the ladder's pairs reject clearly more than ``1/2`` on average, ``Lambda-hat /
    (P - 1) >`` :data:`HARD_PAIR`: a short ladder's shortfall, which ``2 Lambda-hat > 1.25 P``
    (:func:`ladder_too_short`) cannot see with 2 chains (``Lambda-hat <= 1``) and hardly with 3."""
    return float(barrier) / (int(chains) - 1) > HARD_PAIR


def ladder_too_long(barrier: float, chains: int, min_chains: int = 2) -> bool:
    """Whether ``chains`` are clearly more than the barrier asks for: ``P >=`` :data:`SHORT_LADDER`
    ``x`` :func:`fitted_chains` (the margin keeps a ladder near its fit from shrinking on a
    chain or two of estimation noise, and a shrunk ladder from growing back at once: its pairs
    then reject ``<= 1/2 < HARD_PAIR``)."""
    return int(chains) >= SHORT_LADDER * fitted_chains(barrier, min_chains)


def recommended_chains_noisy(sigma, temperatures) -> tuple[float, float]:
    """Corollary 1 / Eq. 53 (appendix B.3): the crude optimal number of chains in big data lies in

        ( min_p sigma_p / (3 tau_{p+1}) log(tau_P / tau_1),  max_p sigma_p / (2 tau_{p+1}) log(..) )

    for the energy-estimator standard deviations ``sigma_p`` (``p = 0..P-2``, or ``P`` values of
    which the last is ignored) and the temperature ladder ``tau`` (for SGD ladders, where the
    temperature is inaccessible, the paper uses ``tau ∝ eta``: pass the learning rates).
    Returns ``(lower, upper)``."""
    s = np.asarray(sigma, dtype=float).reshape(-1)
    t = np.asarray(temperatures, dtype=float).reshape(-1)
    if t.size < 2 or np.any(t <= 0) or np.any(~np.isfinite(t)):
        raise ValueError("temperatures must be >= 2 positive finite numbers")
    if s.size not in (t.size, t.size - 1) or np.any(s < 0) or np.any(~np.isfinite(s)):
        raise ValueError(f"sigma must hold {t.size - 1} or {t.size} finite numbers >= 0")
    s = s[: t.size - 1]
    ratio = s / t[1:]
    log_range = math.log(t[-1] / t[0])
    return float(ratio.min() / 3.0 * log_range), float(ratio.max() / 2.0 * log_range)
