r"""Round-based schedule adaptation from swap rejection rates (Syed et al. 2021, Sec. 5, Alg. 3).

Pure functions of numpy arrays.  A schedule is ``b[P]``, ``b_0 = 1`` at the target, strictly
decreasing (:mod:`nrpt.paths.ladders`); rejection rate ``r_p`` belongs to pair ``(p, p + 1)``.

1. cumulative barrier ``Lambda(b_{P-1}) = 0``, ``Lambda(b_p) = sum_{q >= p} r_q`` (Eq. 32);
2. a monotone PCHIP interpolant through these points;
3. the new schedule is the inverse image of equally spaced ``Lambda`` levels (Thm. 3).

The local barrier is ``lambda(b) = dLambda/db`` of the fitted curve.  Rates are clipped to
``[0, 1]``; a never-attempted pair (NaN) gets the mean of the attempted ones; if every rate is
zero the schedule is returned unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # SciPy is imported when a schedule is fitted (it costs ~1 s at start-up)
    from scipy.interpolate import PchipInterpolator

__all__ = ["BarrierFit", "clean_rejections", "fit_barrier", "equalized_schedule",
           "update_schedule", "validate_schedule"]

#: smallest gap kept between adjacent coefficients of a new schedule, relative to its span
_MIN_GAP = 1e-9


def validate_schedule(schedule, name: str = "schedule") -> np.ndarray:
    """A float array ``[P]``, ``P >= 2``, finite and strictly decreasing."""
    try:
        b = np.asarray(schedule, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a sequence of numbers") from None
    if b.ndim != 1 or b.size < 2:
        raise ValueError(f"{name} must be 1-D with at least 2 slots; got shape {b.shape}")
    if not np.all(np.isfinite(b)):
        raise ValueError(f"{name} must be finite; got {b.tolist()}")
    if not np.all(np.diff(b) < 0):
        raise ValueError(f"{name} must be strictly decreasing from the target slot (b_0) to the "
                         f"last slot; got {b.tolist()}")
    return b


def clean_rejections(rejection, n_pairs: int | None = None) -> np.ndarray:
    """Rejection rates ready for fitting: NaN (pair never attempted) -> mean of the attempted
    pairs (0.5 if none was attempted), then clipped to ``[0, 1]``.  Raises on a wrong length, on
    infinite values and on values clearly outside ``[0, 1]`` (beyond rounding)."""
    try:
        r = np.asarray(rejection, dtype=float).copy()
    except (TypeError, ValueError):
        raise ValueError("rejection must be a sequence of rates in [0, 1]") from None
    if r.ndim != 1 or r.size < 1:
        raise ValueError(f"rejection must be a non-empty 1-D sequence; got shape {r.shape}")
    if n_pairs is not None and r.size != n_pairs:
        raise ValueError(f"rejection must have one rate per adjacent pair ({n_pairs}); "
                         f"got {r.size}")
    if np.any(np.isinf(r)):
        raise ValueError(f"rejection must be finite (or NaN for unattempted pairs); got "
                         f"{r.tolist()}")
    seen = ~np.isnan(r)
    if np.any((r[seen] < -1e-9) | (r[seen] > 1.0 + 1e-9)):
        raise ValueError(f"rejection rates must lie in [0, 1]; got {r.tolist()}")
    r[~seen] = float(np.mean(r[seen])) if seen.any() else 0.5
    return np.clip(r, 0.0, 1.0)


@dataclass(frozen=True)
class BarrierFit:
    """The fitted cumulative barrier ``Lambda(b)`` of one ladder.

    ``knots`` are the schedule's coefficients in increasing order (``b_{P-1}, ..., b_0 = 1``) and
    ``cumulative`` the estimated ``Lambda`` there (``0`` at ``b_{P-1}``, ``total`` at ``b_0``).
    """

    knots: np.ndarray
    cumulative: np.ndarray
    interpolant: PchipInterpolator  # noqa: F821 (imported where used)

    @property
    def total(self) -> float:
        """The global barrier estimate ``Lambda-hat = sum_p r_p``."""
        return float(self.cumulative[-1])

    @property
    def lo(self) -> float:
        return float(self.knots[0])

    @property
    def hi(self) -> float:
        return float(self.knots[-1])

    def barrier(self, b) -> np.ndarray:
        """``Lambda(b)`` for ``b`` in ``[lo, hi]`` (clipped there)."""
        return self.interpolant(np.clip(np.asarray(b, dtype=float), self.lo, self.hi))

    def local(self, b) -> np.ndarray:
        """The local barrier ``lambda(b) = dLambda/db`` (>= 0) of the fitted curve."""
        x = np.clip(np.asarray(b, dtype=float), self.lo, self.hi)
        return np.maximum(self.interpolant.derivative()(x), 0.0)

    def grid(self, n: int = 101) -> tuple[np.ndarray, np.ndarray]:
        """``(b, lambda(b))`` on ``n`` equally spaced points of ``[lo, hi]``."""
        b = np.linspace(self.lo, self.hi, int(n))
        return b, self.local(b)

    def inverse(self, levels) -> np.ndarray:
        """The smallest ``b`` with ``Lambda(b) >= level``, for levels in ``[0, total]``
        (vectorized bisection: the curve is monotone but may have flat pieces)."""
        y = np.clip(np.asarray(levels, dtype=float), 0.0, self.total)
        lo = np.full(y.shape, self.lo)
        hi = np.full(y.shape, self.hi)
        for _ in range(100):  # halves the bracket each time: 2^-100 of the span
            mid = 0.5 * (lo + hi)
            below = self.interpolant(mid) < y
            lo = np.where(below, mid, lo)
            hi = np.where(below, hi, mid)
        return hi


def fit_barrier(schedule, rejection) -> BarrierFit:
    """Fit the monotone cumulative barrier through ``(b_p, sum_{q >= p} r_q)``.

    Args:
        schedule: ``b[P]``, strictly decreasing (``b_0`` is the target slot).
        rejection: ``r[P-1]`` of the adjacent pairs ``(p, p+1)`` (see :func:`clean_rejections`).
    """
    b = validate_schedule(schedule)
    r = clean_rejections(rejection, b.size - 1)
    knots = b[::-1].copy()  # increasing: b_{P-1} .. b_0
    cumulative = np.concatenate([[0.0], np.cumsum(r[::-1])])  # Lambda at the knots
    from scipy.interpolate import PchipInterpolator

    return BarrierFit(knots, cumulative, PchipInterpolator(knots, cumulative, extrapolate=True))


def equalized_schedule(fit: BarrierFit, n_slots: int) -> np.ndarray:
    """The schedule ``b[n_slots]`` (decreasing, same end points as the fit) whose slots are
    equally spaced in the fitted ``Lambda``.  With ``Lambda-hat = 0`` the slots are equally
    spaced in ``b`` instead (nothing is known about where swaps are hard)."""
    n = int(n_slots)
    if n != n_slots or n < 2:
        raise ValueError(f"n_slots must be an integer >= 2; got {n_slots!r}")
    if not fit.total > 0.0:
        new = np.linspace(fit.hi, fit.lo, n)
    else:
        levels = fit.total * np.arange(n - 1, -1, -1) / (n - 1)  # decreasing, total .. 0
        new = fit.inverse(levels)
    new[0], new[-1] = fit.hi, fit.lo
    return _strictly_decreasing(new)


def _strictly_decreasing(b: np.ndarray) -> np.ndarray:
    """Keep end points; push interior coefficients apart by at least ``_MIN_GAP`` of the span
    (a barrier concentrated at one point could otherwise make two of them coincide)."""
    gap = _MIN_GAP * (b[0] - b[-1])
    out = b.copy()
    for p in range(1, out.size - 1):
        out[p] = min(out[p], out[p - 1] - gap)
    for p in range(out.size - 2, 0, -1):
        out[p] = max(out[p], out[p + 1] + gap)
    return out


def update_schedule(schedule, rejection, n_slots: int | None = None) -> np.ndarray:
    """One adaptation step: the new schedule from the old one and its pairs' rejection rates.

    Returns ``schedule`` unchanged (as a new array) when every rate is zero, since then there is
    no barrier to equalize.  ``n_slots`` may differ from ``len(schedule)`` (re-sizing a ladder).
    """
    b = validate_schedule(schedule)
    fit = fit_barrier(b, rejection)
    n = b.size if n_slots is None else n_slots
    if not fit.total > 0.0 and n == b.size:
        return b.copy()
    return equalized_schedule(fit, n)
