"""The NumPy yardstick of nrpt's headline run: DEO*-SGD x P16 on the 25-mode target.

A minimal, plain NumPy implementation of the algorithm that ``nrpt run`` (no arguments; the
preset :data:`nrpt.run.sgpt.HEADLINE`) runs -- Deng et al. (AAAI 2023), Algorithm 1, in the form
nrpt implements it -- written from nrpt's own modules, vectorized over the ``P`` replicas (no
Python loop over replicas), one ``np.random.Generator`` (PCG64) seeded once.  It does not
reproduce nrpt's random stream, only its law; ``benchmarks/headline.py`` compares the two.

Per iteration ``k`` (nrpt's order: explore, swaps, adaptors, records):

1. explore (``nrpt.explorers.sgmcmc.SGD``): every replica takes one SGD step at its slot's
   learning rate with the noisy gradient cached at its position,
   ``x <- x - eta_slot * grad~U(x)``; the replica at slot 0 also gets Langevin noise
   ``sqrt(2 eta_0 tau_0) xi`` (noise temperature ``tau_0 = bottom_temperature = 1``; the other
   slots have temperature 0).  The noisy oracle (``nrpt.energy.estimators.NoisyOracle``) is
   evaluated once
   at the new position: ``U~ = U + 2 N(0, 1)``, ``grad~U = grad U + 2 N(0, I)``; its energy is
   what the swaps read, its gradient is cached for the next move.  A step whose position,
   energy or gradient is not finite is not taken (nrpt's guard).
2. swaps, DEO_W (``nrpt.swap.schemes.DEOW``) with ``W = ceil((log P + log log P) / -log(1 - S))``
   (= 8 for P = 16, S = 0.4): even pairs while ``floor(k / W)`` is even, odd pairs otherwise; each
   pair's gate opens at ``k mod W == 0`` and closes after the pair swaps.  The deterministic rule
   (``nrpt.swap.noisy.Deterministic``): the verdict of pair ``(p, p+1)`` is
   ``A_p = [U~_{p+1} + C < U~_p]`` for every adjacent pair; the pairs of the right parity with
   an open gate and ``A_p = 1`` swap.
3. stochastic approximation (``nrpt.adapt.sa``), step ``gamma_k = 50 / (k^0.8 + 500)``:
   ``C <- C + gamma_k (mean_p A_p - S)`` and, with the end points fixed, the learning rates by
   Eq. 11 with ``H_p = A_p - S`` (a ladder that would lose its order is left unchanged).
4. records (``nrpt.recorders.draws.Draws``, ``nrpt.recorders.stats.Trace``): the slot-0 position
  and energy,
   the index process (``slot_of`` per replica, int16, with the initial row), ``C`` and the
   learning rates every ``K // 1000`` iterations; the sum of the verdicts ``A_p`` (and a copy of
   it at mid-run, for the rates of the second half).

After the loop, the statistics nrpt's recorders keep online are computed from the records
(inside the timed region): the swap-indicator rate per pair, the slot-0 mean / sd, and the
restarts and round trips of Syed et al. (nrpt's ``round_trips``) from the index process.

Usage: ``python benchmarks/headline_numpy.py [--iterations N] [--seed S] [--out DIR]`` prints
the run's summary as JSON (and with ``--out`` saves ``samples.npy``, ``energies.npy``,
``index.npy``, ``adaptation.npz`` and ``summary.json`` there).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

__all__ = ["HEADLINE", "simulate", "window_from_swap_rate", "round_trips", "oracle"]

#: the settings of nrpt's headline run (nrpt.run.sgpt.HEADLINE and the RunConfig defaults it uses)
HEADLINE = {"chains": 16, "iterations": 20_000, "lr_min": 0.003, "lr_max": 0.6,
            "noise_sd": 2.0, "swap_rate": 0.4, "correction": 4.0, "adapt": True,
            "sa_step": (50.0, 0.8, 500.0), "bottom_temperature": 1.0, "penalty": True,
            "seed": 0}

TWO_PI = 2.0 * math.pi
FOUR_PI = 4.0 * math.pi
R2_PENALTY = 20.0  # the penalty max(0, |x|^2 - 20) starts at |x|^2 = 20


def window_from_swap_rate(P: int, S: float) -> int:
    """Algorithm 1's ``W = ceil((log P + log log P) / -log(1 - S))``; 1 for ``P <= 3``."""
    if P <= 3:
        return 1
    return max(1, math.ceil((math.log(P) + math.log(math.log(P))) / -math.log(1.0 - S)))


def oracle(x: np.ndarray, z: np.ndarray, sd_e: float, sd_g: float, penalty: bool):
    """Noisy energy and gradient of the 25-mode target at ``x[P, 2]`` with the standard normals
    ``z[P, 3]`` (column 0: energy noise, 1-2: gradient noise)::

        U(x) = 0.2 |x|^2 - 2 (cos 2 pi x1 + cos 2 pi x2) [+ max(0, |x|^2 - 20)]
    """
    ang = TWO_PI * x
    r2 = np.einsum("ij,ij->i", x, x)
    u = 0.2 * r2 - 2.0 * np.cos(ang).sum(1)
    g = 0.4 * x + FOUR_PI * np.sin(ang)
    if penalty:
        over = r2 - R2_PENALTY
        u += np.maximum(over, 0.0)
        g += (2.0 * (over > 0.0))[:, None] * x
    u += sd_e * z[:, 0]
    g += sd_g * z[:, 1:]
    return u, g


def round_trips(index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Restarts and round trips of Syed et al. per replica from an index process
    ``index[K + 1, P]`` (``slot_of`` per replica, the initial row first), as nrpt's
    ``RoundTripTracker`` counts them: a restart is a replica's first arrival at slot 0 after a
    visit to slot ``P - 1``; a round trip is its next arrival at ``P - 1`` after a restart.

    Vectorized over replicas and iterations: the last end visited (0 none, 1 bottom, 2 top) is
    carried forward; a restart is a change top -> bottom, a round trip a change bottom -> top
    after at least one restart."""
    idx = np.asarray(index)
    P = idx.shape[1]
    code = np.where(idx == 0, 1, np.where(idx == P - 1, 2, 0)).astype(np.int8)
    rows = np.arange(idx.shape[0])[:, None]
    last_at = np.maximum.accumulate(np.where(code > 0, rows, -1), axis=0)
    last = np.where(last_at >= 0, np.take_along_axis(code, np.maximum(last_at, 0), 0), 0)
    prev, now = last[:-1], last[1:]
    restart = (prev == 2) & (now == 1)
    after_restart = np.cumsum(restart, axis=0) > 0
    trip = (prev == 1) & (now == 2) & after_restart  # a restart cannot happen at a top arrival
    return restart.sum(0), trip.sum(0)


def simulate(iterations: int = HEADLINE["iterations"], seed: int = HEADLINE["seed"], *,
             chains: int = HEADLINE["chains"], lr_min: float = HEADLINE["lr_min"],
             lr_max: float = HEADLINE["lr_max"], noise_sd: float = HEADLINE["noise_sd"],
             grad_noise_sd: float | None = None, swap_rate: float = HEADLINE["swap_rate"],
             correction: float = HEADLINE["correction"], adapt: bool = HEADLINE["adapt"],
             sa_step=HEADLINE["sa_step"],
             bottom_temperature: float = HEADLINE["bottom_temperature"],
             penalty: bool = HEADLINE["penalty"], window: int | None = None,
             noise=None) -> dict:
    """Run the headline algorithm; returns the records, the final tables and the statistics
    (``loop_s``: wall time of the loop; ``stats_s``: of the statistics computed after it).

    ``noise`` (for checks only) replaces the generator: an object with ``initial(P) -> [P, 2]``
    (the initial states), ``oracle(k) -> [P, 3]`` (the oracle's standard normals at iteration
    ``k``; ``k = -1``: the evaluation at the initial states) and ``langevin(k) -> [P, 2]`` (the
    Langevin normals of every replica; the yardstick uses the row of the replica at slot 0).
    ``tests/test_headline_yardstick.py`` passes nrpt's keyed random numbers this way; the object
    may also have ``observe(k, x, u, margin, C, eta)``, called at every iteration with the
    positions and noisy energies of the replicas, the margins ``U~_p - U~_{p+1} - C`` of the
    verdicts in slot order (``A_p = margin_p > 0``), ``C`` and the learning rates in force."""
    t0 = time.perf_counter()
    K, P, S = int(iterations), int(chains), float(swap_rate)
    sd_e = float(noise_sd)
    sd_g = sd_e if grad_noise_sd is None else float(grad_noise_sd)
    a, kappa, b = (float(v) for v in sa_step)
    W = int(window) if window is not None else window_from_swap_rate(P, S)
    rng = np.random.Generator(np.random.PCG64(seed))

    observe = None
    if noise is None:
        x = 2.0 * rng.random((P, 2)) - 1.0  # uniform on [-1, 1]^2 (the target's initial states)
        normal = rng.standard_normal
        oracle_z = lambda k: normal((P, 3))  # noqa: E731
        slot0_xi = lambda k, r: normal(2)  # noqa: E731
    else:
        x = np.array(noise.initial(P), dtype=np.float64)
        oracle_z = noise.oracle
        slot0_xi = lambda k, r: noise.langevin(k)[r]  # noqa: E731
    observe = getattr(noise, "observe", None)
    eta = lr_min * (lr_max / lr_min) ** (np.arange(P) / (P - 1))  # geometric initial ladder
    noise0 = math.sqrt(2.0 * eta[0] * bottom_temperature)  # slot 0's rate is an end point: fixed
    slot_of = np.arange(P)  # slot of each replica
    rep_at = np.arange(P)  # replica at each slot
    ids = np.arange(P)
    gate = np.ones(P - 1, dtype=bool)
    lo_slots = np.arange(P - 1)
    parity_pairs = (lo_slots % 2 == 0, lo_slots % 2 == 1)
    gammas = a / (np.arange(K, dtype=np.float64) ** kappa + b)
    C = float(correction)

    samples = np.empty((K, 2))
    energies = np.empty(K)
    index = np.empty((K + 1, P), dtype=np.int16)
    index[0] = slot_of
    a_sum = np.zeros(P - 1)
    swaps = np.zeros(P - 1, dtype=np.int64)
    nonfinite = 0
    half, a_half = K // 2, None  # the verdict sums at mid-run (rates of the second half)
    every = max(1, K // 1000)  # the adaptation trace: C and the ladder every `every` iterations
    trace_c = np.empty(K // every)
    trace_eta = np.empty((K // every, P))

    # the gradient at the initial states: one oracle evaluation before the first move
    u, g = oracle(x, oracle_z(-1), sd_e, sd_g, penalty)
    t_loop = time.perf_counter()
    for k in range(K):
        if k == half:
            a_half = a_sum.copy()
        # 1. explore: SGD at each replica's slot rate, Langevin noise at slot 0
        x_new = x - eta[slot_of][:, None] * g
        r0 = rep_at[0]
        x_new[r0] += noise0 * slot0_xi(k, r0)
        u_new, g_new = oracle(x_new, oracle_z(k), sd_e, sd_g, penalty)
        if math.isfinite(u_new.sum() + x_new.sum() + g_new.sum()):
            x, u, g = x_new, u_new, g_new
        else:  # keep the replicas whose step is not finite where they were
            ok = np.isfinite(u_new + x_new.sum(1) + g_new.sum(1))
            nonfinite += int(P - ok.sum())
            x = np.where(ok[:, None], x_new, x)
            u = np.where(ok, u_new, u)
            g = np.where(ok[:, None], g_new, g)
        # 2. swaps: DEO_W gates and parity, the deterministic rule's verdicts of every pair
        if k % W == 0:
            gate[:] = True
        v = u[rep_at]  # energies in slot order
        A = v[1:] + C < v[:-1]
        if observe is not None:  # (checks only) the state each verdict was made from
            observe(k, x, u, v[:-1] - v[1:] - C, C, eta)
        acc = A & parity_pairs[(k // W) % 2] & gate
        if acc.any():
            gate &= ~acc
            lo = np.flatnonzero(acc)
            rep_at[lo], rep_at[lo + 1] = rep_at[lo + 1], rep_at[lo]
            slot_of[rep_at] = ids
            swaps += acc
        # 3. stochastic approximation of C and of the learning rates (Eqs. 11-13)
        if adapt:
            gam = gammas[k]
            C += gam * (A.mean() - S)
            grown = np.diff(eta) * np.exp(gam * (A - S))
            new = eta.copy()
            new[1:-1] = 0.5 * (eta[:-2] + eta[2:] + grown[:-1] - grown[1:])
            if (np.diff(new) > 0.0).all():
                eta = new
        # 4. records: slot-0 draw and energy, the index process, the verdicts
        r0 = rep_at[0]
        samples[k] = x[r0]
        energies[k] = u[r0]
        index[k + 1] = slot_of
        a_sum += A
        if (k + 1) % every == 0:
            j = (k + 1) // every - 1
            trace_c[j] = C
            trace_eta[j] = eta
    t_stats = time.perf_counter()

    restarts, trips = round_trips(index)
    mean, sd = samples.mean(0), samples.std(0, ddof=1)
    t_end = time.perf_counter()
    return {
        "samples": samples, "energies": energies, "index": index,
        "trace_k": every * np.arange(1, K // every + 1), "trace_C": trace_c,
        "trace_learning_rates": trace_eta,
        "C": C, "learning_rates": eta, "window": W,
        "indicator_rate": a_sum / max(K, 1), "swaps": swaps,
        "indicator_rate_late": (a_sum - a_half) / max(K - half, 1) if K else a_sum,
        "restarts": int(restarts.sum()), "round_trips": int(trips.sum()),
        "slot0_mean": mean, "slot0_sd": sd, "nonfinite": nonfinite,
        "setup_s": t_loop - t0, "loop_s": t_stats - t_loop, "stats_s": t_end - t_stats,
        "iterations": K, "seed": seed,
    }


def summary(res: dict) -> dict:
    """The JSON-ready statistics of :func:`simulate`'s result."""
    out = {k: v for k, v in res.items()
           if k not in ("samples", "energies", "index") and not k.startswith("trace_")}
    return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=HEADLINE["iterations"])
    p.add_argument("--seed", type=int, default=HEADLINE["seed"])
    p.add_argument("--out", default=None, help="folder for samples/energies/index .npy and "
                                               "summary.json")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    res = simulate(args.iterations, args.seed)
    summ = summary(res)
    summ["run_s"] = time.perf_counter() - t0
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for name in ("samples", "energies", "index"):
            np.save(out / f"{name}.npy", res[name])
        np.savez(out / "adaptation.npz", k=res["trace_k"], C=res["trace_C"],
                 learning_rates=res["trace_learning_rates"])
        (out / "summary.json").write_text(json.dumps(summ, indent=2) + "\n")
    json.dump(summ, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
