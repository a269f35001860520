"""The mix25 protocol shared by every runner of the peer benchmark (NumPy only).

This module is imported both by the nrpt runner (project venv) and by the peer runners (the
throwaway peer venv), so it needs nothing but NumPy.

Target ("mix25"): uniform prior on the box [-6, 6]^2 and a likelihood that is a *normalized*
mixture of 25 isotropic Gaussians (sigma = 0.2, equal weights) centred on the grid
{-4, -2, 0, 2, 4}^2.  The mixture's mass outside the box is below e^-50, so
Z = int prior * L = 1/144 and log Z = -log 144.

Ladder: 8 temperatures, beta geometric from 1 down to 1e-3.  Local move: random-walk
Metropolis with proposal scale ``0.35 / sqrt(beta)`` capped at 12 (0.35 ~ 2.38 sigma / sqrt(2),
the usual optimal RWMH scale for one mode at beta = 1), the same in every tool that lets us
choose it.

Metrics computed here on every tool's output (so all tools are scored by the same code):

* ``mode_of`` / ``draw_metrics``: nearest-mode labels of the beta = 1 draws, modes visited
  (over all draws and systems) and max |frequency - 1/25| (second half, pooled over systems);
* ``round_trips``: per replica, trips slot 0 -> hottest slot -> slot 0 on the index process;
* ``index_from_adjacent_swaps``: the index process rebuilt from accepted adjacent swaps.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

DIM = 2
BOX = 6.0
SIGMA = 0.2
GRID = (-4.0, -2.0, 0.0, 2.0, 4.0)
CENTRES = np.array([[a, b] for a in GRID for b in GRID])  # [25, 2], mode k = 5 * i + j
N_MODES = len(CENTRES)
LOG_Z = -math.log((2 * BOX) ** 2)  # -log 144
LOG_PRIOR = LOG_Z  # the uniform prior's log density inside the box

CHAINS = 8
SYSTEMS = 32
ITERATIONS = 2000
#: iterations of a warm-up run before the timed run, every tool alike: 0 (the default): one
#: run per process, so that whole processes compare the same work (TFP's process used to run
#: its whole 2000-step program twice, a warm-up execution and the timed one, nrpt's 20 + 2000)
WARMUP = 0
BETA_MIN = 1e-3
SCALE_AT_ONE = 0.35
SCALE_CAP = 12.0


def betas(chains: int = CHAINS, beta_min: float = BETA_MIN) -> list[float]:
    """beta_p = beta_min^(p / (P - 1)): 1 at slot 0 down to beta_min at the hottest slot."""
    return [float(beta_min ** (p / (chains - 1))) for p in range(chains)]


def scale(beta: float) -> float:
    """RWMH proposal standard deviation at inverse temperature ``beta``."""
    return float(min(SCALE_CAP, SCALE_AT_ONE / math.sqrt(beta)))


def scales(chains: int = CHAINS, beta_min: float = BETA_MIN) -> list[float]:
    return [scale(b) for b in betas(chains, beta_min)]


def log_likelihood(x, sigma: float = SIGMA) -> np.ndarray:
    """log L(x) for ``x[..., 2]``: log of the normalized 25-component mixture (logsumexp)."""
    x = np.asarray(x, dtype=float)
    d2 = ((x[..., None, :] - CENTRES) ** 2).sum(-1)  # [..., 25]
    a = -0.5 * d2 / sigma**2
    m = a.max(-1, keepdims=True)
    lse = m[..., 0] + np.log(np.exp(a - m).sum(-1))
    return lse - math.log(N_MODES) - math.log(2 * math.pi * sigma**2)


def log_prior(x) -> np.ndarray:
    """Uniform on [-6, 6]^2: -log 144 inside, -inf outside."""
    x = np.asarray(x, dtype=float)
    inside = (np.abs(x) <= BOX).all(-1)
    return np.where(inside, LOG_PRIOR, -np.inf)


def log_z_at(beta: float, h: float = 0.02) -> float:
    """log Z_beta = log int prior L^beta by the midpoint rule on the box (h: grid step).

    The ladder stops at beta_min = 1e-3, so what the tools' estimators aim at is the ratio
    log(Z_1 / Z_beta_min) = LOG_Z - log_z_at(beta_min) (-4.952 here, 0.018 above -log 144)."""
    g = np.arange(-BOX + h / 2, BOX, h)
    total = -np.inf
    for row in np.array_split(g, 8):  # [n, 600, 2] chunks keep the memory small
        x = np.stack(np.meshgrid(row, g, indexing="ij"), -1)
        a = beta * log_likelihood(x).ravel()
        m = a.max()
        total = np.logaddexp(total, m + math.log(np.exp(a - m).sum()))
    return float(total + math.log(h * h) + LOG_PRIOR)


def prior_draws(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(-BOX, BOX, size=(n, DIM))


# ------------------------------------------------------------------------------ metrics
def mode_of(x) -> np.ndarray:
    """Index (0..24) of the nearest mode centre of each draw ``x[..., 2]`` (grid rounding)."""
    x = np.asarray(x, dtype=float)
    ij = np.clip(np.rint((x - GRID[0]) / (GRID[1] - GRID[0])), 0, len(GRID) - 1).astype(int)
    return ij[..., 0] * len(GRID) + ij[..., 1]


def mode_counts(x) -> np.ndarray:
    return np.bincount(mode_of(x).ravel(), minlength=N_MODES)


def modes_visited(x) -> int:
    """Number of modes holding at least one of the draws ``x[..., 2]``."""
    return int((mode_counts(x) > 0).sum())


def max_frequency_error(x) -> float:
    """max over modes of |share of the draws ``x[..., 2]`` in the mode - 1/25|."""
    c = mode_counts(x)
    return float(np.abs(c / c.sum() - 1.0 / N_MODES).max())


def draw_metrics(draws) -> dict:
    """Scores of the beta = 1 draws ``draws[S, K, 2]`` (S chains/walkers, K iterations):
    modes visited over all draws, frequency error after discarding the first half."""
    draws = np.asarray(draws, dtype=float)
    kept = draws[:, draws.shape[1] // 2:]
    return {"modes_visited": modes_visited(draws),
            "max_freq_error": max_frequency_error(kept),
            "n_draws": int(draws.shape[0] * draws.shape[1]),
            "n_draws_kept": int(kept.shape[0] * kept.shape[1])}


def round_trips(level, top: int) -> np.ndarray:
    """Round trips per replica on an index process ``level[K + 1, N]`` (the slot, 0..top, of
    each of N replicas at every iteration, row 0 = the start).

    A round trip is a replica going from slot 0 to slot ``top`` and back to slot 0: it is
    counted when a replica that has been at slot 0, then at slot ``top``, arrives at slot 0."""
    level = np.asarray(level)
    phase = (level[0] == 0).astype(np.int8)  # 0: not yet at 0, 1: left 0, 2: reached the top
    count = np.zeros(level.shape[1], dtype=np.int64)
    for row in level[1:]:
        at0 = row == 0
        done = at0 & (phase == 2)
        count += done
        phase = np.where(at0, 1, np.where((row == top) & (phase == 1), 2, phase)).astype(np.int8)
    return count


def index_from_adjacent_swaps(accepted) -> np.ndarray:
    """The index process ``slot_of[K + 1, R, P]`` from accepted adjacent swaps
    ``accepted[K, P - 1, R]`` (True: the replicas at slots p and p + 1 exchanged at that
    iteration; the accepted pairs of one iteration are disjoint)."""
    acc = np.asarray(accepted, dtype=bool)
    K, Pm1, R = acc.shape
    P = Pm1 + 1
    at = np.tile(np.arange(P), (R, 1))  # at[r, p] = replica at slot p
    rows = np.arange(R)
    out = np.empty((K + 1, R, P), dtype=np.int16)
    out[0] = np.argsort(at, axis=1)
    for k in range(K):
        for p in np.flatnonzero(acc[k].any(axis=1)):
            m = rows[acc[k, p]]
            at[m, p], at[m, p + 1] = at[m, p + 1], at[m, p].copy()
        out[k + 1] = np.argsort(at, axis=1)
    return out


def trip_metrics(level, top: int, iterations: int, systems_equivalent: int) -> dict:
    """Round trips from ``level[K + 1, N]``: total over the N replicas, per system
    (total / ``systems_equivalent``) and per iteration per system."""
    rt = round_trips(level, top)
    total = int(rt.sum())
    return {"round_trips_total": total,
            "round_trips_per_system": total / systems_equivalent,
            "round_trips_per_iter": total / systems_equivalent / iterations}


def log_z_fields(estimate, method: str | None, note: str | None = None) -> dict:
    if estimate is None or not np.isfinite(estimate):
        return {"log_z": None, "log_z_error": None, "log_z_method": method,
                "log_z_note": note}
    return {"log_z": float(estimate), "log_z_error": float(abs(estimate - LOG_Z)),
            "log_z_method": method, "log_z_note": note}


# ------------------------------------------------------------------ the ensemble runners' frame
def ensemble_args(description: str, argv=None) -> argparse.Namespace:
    """The command line of an ensemble runner (ptemcee, reddemcee)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--iterations", type=int, default=ITERATIONS)
    ap.add_argument("--walkers", type=int, default=SYSTEMS,
                    help="walkers per temperature (32: 256 replicas, like 32 systems x 8)")
    ap.add_argument("--chains", type=int, default=CHAINS)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=WARMUP,
                    help="iterations of a warm-up run before the timed one (0: none)")
    return ap.parse_args(argv)


def warm_then_time(run, args):
    """``run(args, iterations, seed)`` timed, after a warm-up run of ``args.warmup``
    iterations with another seed when that is > 0 (default :data:`WARMUP` = 0: one run per
    process): ``(result, warm-up s, wall s, cpu s)``."""
    t0 = time.perf_counter()
    if args.warmup > 0:
        run(args, args.warmup, args.seed + 10**6)
    warm = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    result = run(args, args.iterations, args.seed)
    return result, warm, time.perf_counter() - t0, time.process_time() - c0
