"""Restarts and round trips of the swap schemes on a ladder with a fixed adjacent rejection rate r.

The swap rule is :class:`nrpt.swap.FixedRate` (every proposed swap is rejected with probability
r, whatever the states) and there are no local moves, so the index process is exactly the one
that Lemma 1 of Deng et al. (2023) and Theorem 1 of Syed et al. (2021) analyse, and the measured
numbers isolate the scheme.  For each r, P and scheme we run R independent systems in one run
(:func:`nrpt.execute` with the ``round_trips`` recorder) and report, per 1000 iterations summed
over the P replicas (mean ± sd over systems), two different counts, each beside the prediction
*of that count*:

* **restarts** (Syed et al.: a replica that visited slot P - 1 arrives at slot 0; in the long run
  the Syed round trips have the same rate), beside ``theory.predicted_rates(...)
  ["restarts_per_1000"]``: Lemma 1 for DEO / DEO_W, ``1000 P / E[T]`` with
  ``E[T] = 2WP + 2WP sum_p r^W / (1 - r^W)`` (at W = 1 Syed et al.'s Theorem 1), and the exact
  rate of the index chain (:func:`nrpt.diagnostics.theory.exact_event_rates`) for SEO and ADJ;
* **A.5 round trips** (Deng et al.'s appendix A.5: leave your slot, touch both ends, come back),
  beside the exact A.5 rate of the same index chain (``exact_event_rates``).  Lemma 1 does not
  predict this count: for DEO it is 0-15 % higher than the restart rate (a replica that bounces
  back to the end it just left can still complete an A.5 trip).

Then the growth of the round-trip time T = 1000 P / rate with P is fitted as T ∝ P^a on the
largest P values (for the restart rate, T is Lemma 1's E[T]) and printed beside Table 1's orders
(ADJ/SEO: P^2; DEO: P^2 when r is large, P when r -> 0; DEO*: P log P).  Finally, iterations per
second of the full engine (25-mode 2-D target, P = 16, DEO) for three explorers.

Run:  make bench-schemes       (or: python benchmarks/schemes.py --iterations 20000)
      python benchmarks/schemes.py --iterations 300 --chains 4 8 --systems 2 --throughput 200
                                   (a smoke test; numbers not for reporting)
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np
import torch

import nrpt
from nrpt.core.loop import Run
from nrpt.diagnostics import theory
from nrpt.recorders.stats import RoundTrips
from nrpt.testing import Flat, Frozen


def measure(scheme: str, window: int, P: int, r: float, K: int, R: int, seed: int) -> dict:
    """Observed restarts and A.5 round trips per 1000 iterations, per system ``[R]``."""
    path = nrpt.TemperatureLadder([1.0 + p for p in range(P)])
    engine = nrpt.PTEngine(Flat(), path, Frozen(), nrpt.make_scheme(scheme, window),
                           nrpt.FixedRate(r), systems=R, seed=seed)
    trips = RoundTrips(engine.slot_of, P)
    nrpt.execute(Run(engine, [], {"round_trips": trips}, nrpt.Plan.fixed(K)))
    c = trips.counts()
    return {k: c[k].double().cpu().numpy() * 1000.0 / K for k in ("restarts", "round_trips_a5")}


def slope(Ps, rates):
    """Exponent a of T ∝ P^a, T = 1000 P / rate, fitted on the three largest P."""
    Ps, rates = np.asarray(Ps[-3:], float), np.asarray(rates[-3:], float)
    if len(Ps) < 2 or (rates <= 0).any():
        return float("nan")
    T = 1000.0 * Ps / rates
    return float(np.polyfit(np.log(Ps), np.log(T), 1)[0])


ROWS = [("adj", 1), ("seo", 1), ("deo", 1), ("deo-w", 2), ("deo-w", 4), ("deo-w", 8),
        ("deo*", None)]
ORDERS = {"adj": "P^2", "seo": "P^2", "deo": "P^2 (r large) / P (r->0)", "deo*": "P log P"}
QUANTITIES = (
    ("restarts", "restarts_per_1000",
     "restarts (Syed et al.) per 1000 it; (prediction): Lemma 1 for DEO/DEO_W (= Syed Thm 1 "
     "at W = 1), exact index chain for ADJ/SEO"),
    ("round_trips_a5", "round_trips_a5_per_1000",
     "A.5 round trips per 1000 it; (prediction): exact A.5 rate of the index chain"),
)


def table(r: float, chains, K: int, R: int, seed: int) -> None:
    cells = {q: [] for q, _, _ in QUANTITIES}
    for scheme, W in ROWS:
        row = {q: [] for q, _, _ in QUANTITIES}
        for P in chains:
            w = theory.optimal_window(P, r) if W is None else W
            name = "deo-w" if scheme == "deo*" else scheme
            obs = measure(name, w, P, r, K, R, seed)
            pred = theory.predicted_rates([r] * (P - 1), name, w)
            for q, key, _ in QUANTITIES:
                row[q].append((obs[q].mean(), obs[q].std(ddof=1) if R > 1 else 0.0, pred[key],
                               w if scheme == "deo*" else None))
        for q in cells:
            cells[q].append((scheme, W, row[q]))
    for q, _, title in QUANTITIES:
        print(f"\n## r = {r}: {title}")
        print(f"{'scheme':>10} " + " ".join(f"{'P=' + str(P):>22}" for P in chains)
              + f" {'T~P^a':>7}  Table 1")
        for scheme, W, row in cells[q]:
            out = []
            for m, s, p, w in row:
                cell = f"{m:6.1f}±{s:4.1f} ({p:5.1f})" + (f"W{w}" if w is not None else "")
                out.append(f"{cell:>22}")
            label = scheme if W in (1, None) else f"deo-w{W}"
            a = slope(chains, [c[0] for c in row])
            print(f"{label:>10} " + " ".join(out) + f" {a:7.2f}  {ORDERS.get(scheme, '')}",
                  flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iterations", type=int, default=10_000)
    ap.add_argument("--systems", type=int, default=4)
    ap.add_argument("--chains", type=int, nargs="+", default=[4, 8, 16, 32])
    ap.add_argument("--rejection", type=float, nargs="+", default=[0.2, 0.6])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--throughput", type=int, default=3000,
                    help="iterations of each engine-throughput run (0: skip them)")
    args = ap.parse_args()
    K, R = args.iterations, args.systems
    torch.set_num_threads(1)
    print(f"# FixedRate ladders, no local moves: per 1000 iterations summed over the P replicas, "
          f"mean ± sd over {R} systems, {K} iterations each")
    for r in args.rejection:
        table(r, args.chains, K, R, args.seed)
    print("\n(deo* uses W* = ceil((log P + log log P)/(-log r)), shown as W<n>; T~P^a: exponent "
          "of T = 1000 P / rate fitted on the three largest P)")

    # throughput of the full engine on the 2-D target (the loop's own clock: build and summary
    # excluded)
    n = args.throughput
    if n <= 0:
        return
    warnings.simplefilter("ignore", nrpt.SamplingWarning)  # short runs: health notes are noise
    for explorer in ("rwmh", "mala", "hmc"):
        extra = {"leapfrog_steps": 5} if explorer == "hmc" else {}
        res = nrpt.sample("twenty-five-modes", chains=16, iterations=n, explorer=explorer,
                          seed=args.seed, figures=False, **extra)
        its = res.summary["iterations_per_s"]
        print(f"engine throughput, 25-mode 2-D target, P = 16, DEO, {explorer}: "
              f"{its:,.0f} iterations/s ({its * 16:,.0f} replica-moves/s)")
    res = nrpt.sample("twenty-five-modes", chains=16, iterations=n, systems=64, seed=1,
                      figures=False)
    its = res.summary["iterations_per_s"]
    print(f"same (rwmh) with 64 systems batched (1024 replicas): {its:,.0f} iterations/s "
          f"({its * 1024:,.0f} replica-moves/s)")


if __name__ == "__main__":
    main()
