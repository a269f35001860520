"""Rank-normalized split R-hat and bulk / tail ESS in NumPy, as defined by Vehtari et al.
(2021, Bayesian Analysis 16(2)) and computed by ArviZ (the tests compare) -- without ArviZ's
import cost.  For ``x[chains, n]``: chains split in halves; pooled ranks mapped by
``Phi^{-1}((r - 3/8) / (S + 1/4))``; R-hat the larger of the rank-normalized and folded
(``|x - median|``) potential scale reductions; ESS ``chains * n / tau`` with Geyer's
monotone initial positive sequence, ``tau >= 1 / log10(chains * n)``; bulk ESS of the
rank-normalized chains, tail ESS the smaller of those of ``x <= q_05`` and ``x <= q_95``."""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["rhat", "ess_bulk", "ess_tail", "ess"]


def _split(x: np.ndarray) -> np.ndarray:
    half = x.shape[1] // 2
    return np.concatenate([x[:, :half], x[:, x.shape[1] - half:]], axis=0)


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..S of the pooled values, ties sharing their average rank."""
    flat = x.ravel()
    _, inverse, counts = np.unique(flat, return_inverse=True, return_counts=True)
    before = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return (before + (counts + 1) / 2.0)[inverse].reshape(x.shape)


def _rank_normalize(x: np.ndarray) -> np.ndarray:
    r = _average_ranks(x)
    p = (r - 3.0 / 8.0) / (x.size + 1.0 / 4.0)
    return torch.special.ndtri(torch.from_numpy(p)).numpy()


def _psrf(x: np.ndarray) -> float:
    """The classic potential scale reduction of chains ``x[m, n]``."""
    n = x.shape[1]
    between = n * np.var(x.mean(axis=1), ddof=1)
    within = np.mean(np.var(x, axis=1, ddof=1))
    return float(np.sqrt((between / within + n - 1) / n))


def _autocovariance(x: np.ndarray) -> np.ndarray:
    """Biased autocovariances ``[m, n]`` of each chain (FFT, zero-padded)."""
    n = x.shape[1]
    c = x - x.mean(axis=1, keepdims=True)
    size = 1 << (2 * n - 1).bit_length()
    f = np.fft.rfft(c, n=size, axis=1)
    return np.fft.irfft(f * np.conj(f), n=size, axis=1)[:, :n] / n


def ess(x: np.ndarray) -> float:
    """Effective sample size of chains ``x[m, n]`` (no splitting or normalization here)."""
    x = np.asarray(x, dtype=float)
    m, n = x.shape
    if not np.isfinite(x).all():
        return math.nan
    if np.max(x) - np.min(x) < np.finfo(float).resolution:
        return float(x.size)  # a constant: every draw counts
    acov = _autocovariance(x).mean(axis=0)  # averaged over chains, [n]
    within = acov[0] * n / (n - 1.0)
    var_plus = within * (n - 1.0) / n
    if m > 1:
        var_plus += np.var(x.mean(axis=1), ddof=1)
    rho = 1.0 - (within - acov) / var_plus  # rho[0] = 1 up to rounding
    rho[0] = 1.0
    # Geyer's initial positive sequence over pairs (rho_t, rho_t+1), t = 0, 2, 4, ...; pairs
    # are kept while their sum is positive (the first pair always), at most up to lag n - 2
    kept = np.zeros(n)
    kept[:2] = rho[:2]
    even, odd = 1.0, rho[1]
    t = 1
    while t < n - 3 and even + odd > 0.0:
        even, odd = rho[t + 1], rho[t + 2]
        if even + odd >= 0.0:
            kept[t + 1], kept[t + 2] = even, odd
        t += 2
    last = t - 2
    if even > 0.0:
        kept[last + 1] = even  # the positive half of the pair that ended the sequence
    # ... made monotone: no pair sum larger than the one before it
    t = 1
    while t <= last - 2:
        if kept[t + 1] + kept[t + 2] > kept[t - 1] + kept[t]:
            kept[t + 1] = kept[t + 2] = (kept[t - 1] + kept[t]) / 2.0
        t += 2
    total = m * n
    tau = -1.0 + 2.0 * kept[:last + 1].sum() + kept[last + 1:last + 2].sum()
    tau = max(tau, 1.0 / math.log10(total))
    return float(total / tau)


def _valid(x: np.ndarray, chains: int) -> bool:
    return x.shape[0] >= chains and x.shape[1] >= 4 and bool(np.isfinite(x).all())


def rhat(x) -> float:
    """Rank-normalized split R-hat of chains ``x[m, n]`` (NaN below 2 chains or 4 draws)."""
    x = np.asarray(x, dtype=float)
    if not _valid(x, 2):
        return math.nan
    s = _split(x)
    folded = np.abs(s - np.median(s))
    return max(_psrf(_rank_normalize(s)), _psrf(_rank_normalize(folded)))


def ess_bulk(x) -> float:
    """Bulk ESS of chains ``x[m, n]``: ESS of the rank-normalized split chains."""
    x = np.asarray(x, dtype=float)
    if not _valid(x, 1):
        return math.nan
    return ess(_rank_normalize(_split(x)))


def ess_tail(x) -> float:
    """Tail ESS of chains ``x[m, n]``: the smaller ESS of the 5 % and 95 % quantile
    indicators of the split chains."""
    x = np.asarray(x, dtype=float)
    if not _valid(x, 1):
        return math.nan
    q05, q95 = np.quantile(x, [0.05, 0.95])
    return min(ess(_split((x <= q05).astype(float))), ess(_split((x <= q95).astype(float))))
