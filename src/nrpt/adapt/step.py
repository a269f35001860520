r"""Between-round step-size tuning of Metropolis explorers towards a target acceptance rate.

For random-walk Metropolis, MALA and HMC in many dimensions the log acceptance ratio is close
to Gaussian with mean ``-s^2/2`` and standard deviation ``s`` proportional to ``h^k`` (``k = 1``
for RWMH, 3 for MALA, 2 for HMC: Roberts & Rosenthal 2001; Beskos et al. 2013), so the mean
acceptance is ``a(h) = 2 Phi(-c h^k / 2)``.  One round's acceptance ``a`` at step ``h`` fixes
``c``; the step that gives the target acceptance ``a*`` is then

    h* = h (Phi^{-1}(a*/2) / Phi^{-1}(a/2))^(1/k),

a Newton step in the coordinates where the model is linear.  Acceptances are clipped to
``[0.01, 0.99]`` (0 or 1 carry no scale) and the factor to ``[1/4, 4]`` per round.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ACCEPTANCE_ORDER", "step_size_factor"]

#: exponent k of h in the spread of the log acceptance ratio
ACCEPTANCE_ORDER = {"rwmh": 1, "mala": 3, "hmc": 2}

_CLIP_ACCEPTANCE = (0.01, 0.99)
_CLIP_FACTOR = (0.25, 4.0)


def step_size_factor(acceptance, target: float, order: int) -> np.ndarray:
    """Multiplicative step-size change per entry of ``acceptance`` (NaN -> 1: no data)."""
    if not 0.0 < float(target) < 1.0:
        raise ValueError(f"target acceptance must be in (0, 1); got {target!r}")
    if int(order) != order or order < 1:
        raise ValueError(f"order must be an integer >= 1; got {order!r}")
    a = np.asarray(acceptance, dtype=float)
    seen = np.isfinite(a)
    a = np.clip(np.where(seen, a, target), *_CLIP_ACCEPTANCE)
    from scipy.special import ndtri  # (imported on use: SciPy costs ~1 s at start-up)

    factor = (ndtri(target / 2.0) / ndtri(a / 2.0)) ** (1.0 / order)
    return np.where(seen, np.clip(factor, *_CLIP_FACTOR), 1.0)
