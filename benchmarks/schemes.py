"""Round trips of the swap schemes on a ladder with a fixed adjacent rejection rate r.

The swap rule is :class:`nrpt.swap.FixedRate` (every proposed swap is rejected with probability
r, whatever the states), so the index process is exactly the one Lemma 1 of Deng et al. (2023)
analyses, and the measured numbers isolate the scheme.  For each r, P and scheme we run R
independent systems in one engine call and report round trips (A.5 definition: leave your slot,
touch both ends, come back) per 1000 iterations, mean ± sd over systems, beside Lemma 1's
prediction 1000 P / E[T], E[T] = 2WP + 2WP sum_p r^W / (1 - r^W) (DEO and DEO_W only).

Then the growth of the round-trip time T = 1000 P / rate with P is fitted as T ∝ P^a on the
largest P values and printed beside Table 1's orders (ADJ/SEO: P^2; DEO: P^2 when r is large,
P when r -> 0; DEO*: P log P).  Finally, iterations per second of the full engine (RWMH,
Metropolis, DEO) on the 2-D 25-mode target with P = 16.

Run:  make bench-schemes       (or: python benchmarks/schemes.py --iterations 20000)
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch

import nrpt
from nrpt.diagnostics import theory
from nrpt.explorers import ExploreInfo, Explorer


class Frozen(Explorer):
    """No local move: only the index process matters under a FixedRate rule."""

    name = "frozen"

    def step(self, state, b, step_size, density, noise, sub=0):
        ones = torch.ones_like(state.v)
        return state, ExploreInfo(ones, ones.bool(), torch.zeros_like(ones, dtype=torch.bool))


class Flat:
    dim = 1
    name = "flat"

    def energy(self, x):
        return 0.5 * (x**2).sum(-1)


def measure(scheme: str, window: int, P: int, r: float, K: int, R: int, seed: int):
    path = nrpt.TemperatureLadder([1.0 + p for p in range(P)])
    eng = nrpt.PTEngine(Flat(), path, Frozen(), nrpt.make_scheme(scheme, window),
                        nrpt.FixedRate(r), systems=R, seed=seed)
    for _ in range(K):
        eng.step()
    rate = eng.tracker.round_trips_a5.double().cpu().numpy() * 1000.0 / K
    return rate.mean(), rate.std(ddof=1), float(eng.rejection_rates().nanmean())


def slope(Ps, rates):
    """Exponent a of T ∝ P^a, T = 1000 P / rate, fitted on the three largest P."""
    Ps, rates = np.asarray(Ps[-3:], float), np.asarray(rates[-3:], float)
    if (rates <= 0).any():
        return float("nan")
    T = 1000.0 * Ps / rates
    return float(np.polyfit(np.log(Ps), np.log(T), 1)[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iterations", type=int, default=10_000)
    ap.add_argument("--systems", type=int, default=4)
    ap.add_argument("--chains", type=int, nargs="+", default=[4, 8, 16, 32])
    ap.add_argument("--rejection", type=float, nargs="+", default=[0.2, 0.6])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    K, R = args.iterations, args.systems
    torch.set_num_threads(1)
    print(f"# round trips (A.5) per 1000 iterations, mean ± sd over {R} systems, "
          f"{K} iterations each; Lemma 1 beside DEO/DEO_W")
    for r in args.rejection:
        print(f"\n## r = {r}")
        print(f"{'scheme':>10} " + " ".join(f"{'P=' + str(P):>22}" for P in args.chains)
              + f" {'T~P^a':>7}  Table 1")
        rows = [("adj", 1), ("seo", 1), ("deo", 1), ("deo-w", 2), ("deo-w", 4), ("deo-w", 8),
                ("deo*", None)]
        for scheme, W in rows:
            cells, means = [], []
            for P in args.chains:
                w = theory.optimal_window(P, r) if W is None else W
                name = "deo-w" if scheme == "deo*" else scheme
                m, s, _ = measure(name, w, P, r, K, R, args.seed)
                means.append(m)
                cell = f"{m:6.1f}±{s:4.1f}"
                if name in ("deo", "deo-w"):
                    cell += f" ({theory.predicted_round_trips_per_1000([r] * (P - 1), w):5.1f})"
                    if scheme == "deo*":
                        cell += f"W{w}"
                cells.append(f"{cell:>22}")
            label = scheme if W in (1, None) else f"deo-w{W}"
            order = {"adj": "P^2", "seo": "P^2", "deo": "P^2 (r large) / P (r->0)",
                     "deo*": "P log P"}.get(scheme, "")
            print(f"{label:>10} " + " ".join(cells) + f" {slope(args.chains, means):7.2f}  {order}")
    print("\n(parentheses: Lemma 1 prediction; deo* uses W* = ceil((log P + log log P)/(-log r)),"
          " shown as W<n>)")

    # throughput of the full engine on the 2-D target
    for explorer in ("rwmh", "mala", "hmc"):
        res = nrpt.sample("twenty-five-modes", chains=16, iterations=3000, explorer=explorer,
                          leapfrog_steps=5, seed=args.seed)
        print(f"engine throughput, 25-mode 2-D target, P = 16, DEO, {explorer}: "
              f"{res.iterations_per_s:,.0f} iterations/s "
              f"({res.iterations_per_s * 16:,.0f} replica-moves/s)")
    t0 = time.perf_counter()
    res = nrpt.sample("twenty-five-modes", chains=16, iterations=3000, systems=64, seed=1)
    dt = time.perf_counter() - t0
    print(f"same with 64 systems batched (1024 replicas): {3000 / dt:,.0f} iterations/s "
          f"({3000 * 1024 / dt:,.0f} replica-moves/s)")
    _ = math


if __name__ == "__main__":
    main()
