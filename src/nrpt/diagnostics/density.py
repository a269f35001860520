"""Histogram errors against an exact density on a grid (Deng et al. 2023's simulation metric).

* :func:`grid_errors` -- total variation and KL between a sample's 2-D histogram and exact cell
  probabilities;
* :func:`iid_floor` -- the same errors for as many exact iid draws: the finite-sample floor a
  perfect sampler would show.
"""

from __future__ import annotations

import numpy as np

__all__ = ["grid_errors", "iid_floor"]


def grid_errors(samples: np.ndarray, edges_x: np.ndarray, edges_y: np.ndarray,
                probs: np.ndarray) -> dict[str, float]:
    """Total variation and KL between the histogram of ``samples[n, 2]`` on a grid and the exact
    cell probabilities ``probs`` (e.g. ``TwentyFiveModes.density_grid``); the mass outside the
    grid is one more cell on both sides.

    ``tv = 1/2 sum |q - p|``; ``kl = sum q log(q / p)`` = KL(histogram || exact) (finite: the exact
    density is positive everywhere; the other direction is infinite for an empty cell)."""
    x = np.asarray(samples, dtype=float)
    if x.ndim != 2 or x.shape[1] != 2 or x.shape[0] == 0:
        raise ValueError(f"samples must be [n, 2] with n >= 1; got {x.shape}")
    h, _, _ = np.histogram2d(x[:, 0], x[:, 1], bins=(edges_x, edges_y))
    q = np.append(h.ravel(), x.shape[0] - h.sum()) / x.shape[0]
    p = np.append(np.asarray(probs, dtype=float).ravel(), max(0.0, 1.0 - float(np.sum(probs))))
    p = np.maximum(p, 1e-300)
    tv = 0.5 * float(np.abs(q - p).sum())
    nz = q > 0
    kl = float(np.sum(q[nz] * np.log(q[nz] / p[nz])))
    return {"tv": tv, "kl": kl}


def iid_floor(n: int, edges_x, edges_y, probs, repeats: int = 5, seed: int = 0) -> dict:
    """Mean TV / KL of ``n`` *exact* iid draws (multinomial on the grid cells): the Monte Carlo
    floor against which the errors of ``n`` correlated draws should be read."""
    p = np.asarray(probs, dtype=float).ravel()
    p = np.append(p, max(0.0, 1.0 - p.sum()))
    p = p / p.sum()
    rs = np.random.default_rng(seed)
    tvs, kls = [], []
    for _ in range(repeats):
        q = rs.multinomial(n, p) / n
        tvs.append(0.5 * np.abs(q - p).sum())
        nz = q > 0
        kls.append(np.sum(q[nz] * np.log(q[nz] / np.maximum(p[nz], 1e-300))))
    return {"tv": float(np.mean(tvs)), "kl": float(np.mean(kls))}
