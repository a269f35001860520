"""Adaptive NRPT on the analytic Gaussian path: estimates against closed forms.

For the path N(0, I_d) -> N(0, I_d / (1 + c)) (``nrpt.targets.gaussian_path``) in d dimensions
with N chains, run round-based adaptive NRPT (``rounds`` rounds of doubling length, R
independent systems) and print, from the last round:

* ``Λ̂`` (sum of the estimated rejection rates, mean ± standard error over the R systems) beside
  the analytic barrier ``Λ = κ_d log(1 + c)``;
* ``Σr exact``: the exact finite-N sum of rejection rates on the adapted schedules (what Λ̂
  estimates), and on the analytic optimal N-slot schedule;
* the error of the stepping-stone ``log Z`` (mean ± se) against ``-(d/2) log(1 + c)``;
* restarts per 1000 iterations: observed, the finite-N prediction ``1 / (2 + 2 Σ r/(1-r))`` from
  the estimated rates, and the asymptotic ``1 / (2 + 2 Λ)``;
* iterations per second (one iteration advances all R systems): of the run loop, and of the
  whole ``nrpt.sample`` call (building the run, the summary and its health checks included).

Usage::

    python benchmarks/adaptive.py                       # the table in docs/benchmarks-adaptive.md
    python benchmarks/adaptive.py --dims 10 --chains 5 10 --explorer slice --rounds 9
    python benchmarks/adaptive.py --dims 2 --chains 5 --rounds 4 --systems 2   # smoke test
"""

from __future__ import annotations

import argparse
import math
import platform
import time

import numpy as np
import torch

import nrpt
from nrpt.diagnostics import theory
from nrpt.targets.gaussian_path import ScaledGaussianPath


def mean_se(values) -> tuple[float, float]:
    v = np.asarray(values, dtype=float)
    return float(v.mean()), float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else math.nan


def one(dim: int, chains: int, args) -> dict:
    target = ScaledGaussianPath(dim, args.c)
    t0 = time.perf_counter()
    res = nrpt.sample(target, rounds=args.rounds, chains=chains, systems=args.systems,
                      explorer=args.explorer, seed=args.seed, step_size=0.5, figures=False)
    wall = time.perf_counter() - t0
    s, last = res.summary, res.rows[-1]  # statistics of the last round; its report row
    R = args.systems
    schedule = np.asarray(last["b"], dtype=float).reshape(R, chains)  # b used in the last round
    exact_r = [target.rejections(schedule[i]) for i in range(R)]
    optimal_sum = target.rejections(target.optimal_schedule(chains)).sum()
    n = last["iterations"]
    K = s["n_iterations"]
    return {
        "d": dim, "N": chains, "Lambda": target.barrier,
        "Lambda_hat": mean_se(np.atleast_1d(s["barrier"])),
        "sum_r_exact": float(np.mean([r.sum() for r in exact_r])),
        "sum_r_optimal": float(optimal_sum),
        "logZ_err": mean_se(np.atleast_1d(s["log_normalizer"]) - target.log_normalizer),
        "restarts_obs": mean_se(1000.0 * np.atleast_1d(s["restarts"]) / n),
        # Syed et al. Thm 1 (DEO) from the estimated rates of the last round, per system
        "restarts_pred": float(np.mean(np.atleast_1d(s["predicted_restarts_per_1000"]))),
        "restarts_exact": float(np.mean([1000.0 * theory.predicted_restart_rate(r)
                                         for r in exact_r])),
        "restarts_asym": 1000.0 * theory.asymptotic_restart_rate(target.barrier),
        "its": s["iterations_per_s"], "its_call": K / wall,
        "last_round": n,
    }


def pm(pair, spec=".3f") -> str:
    m, s = pair
    return f"{m:{spec}} ± {s:{spec}}"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dims", type=int, nargs="+", default=[10, 100])
    p.add_argument("--chains", type=int, nargs="+", default=[5, 10, 20, 40])
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--systems", type=int, default=8)
    p.add_argument("--explorer", default="mala", choices=["slice", "rwmh", "mala", "hmc"])
    p.add_argument("--c", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    K = sum(2**r for r in range(1, args.rounds + 1))
    print(f"# adaptive NRPT on N(0, I_d) -> N(0, I_d/(1+c)), c = {args.c}: {args.rounds} rounds "
          f"({K} iterations, last round {2 ** args.rounds}), {args.systems} systems, explorer "
          f"{args.explorer}, seed {args.seed}; torch {torch.__version__}, "
          f"{args.threads} thread(s), {platform.processor() or platform.machine()}")
    print("| d | N | Λ analytic | Λ̂ (last round) | Σr exact, adapted | Σr exact, optimal | "
          "log Z error | restarts/1000 observed | predicted (finite N) | exact rates | "
          "1000/(2+2Λ) | it/s (loop) | it/s (call) |")
    print("|" + "---|" * 13)
    for d in args.dims:
        for n in args.chains:
            r = one(d, n, args)
            print(f"| {d} | {n} | {r['Lambda']:.3f} | {pm(r['Lambda_hat'])} | "
                  f"{r['sum_r_exact']:.3f} | {r['sum_r_optimal']:.3f} | "
                  f"{pm(r['logZ_err'])} | {pm(r['restarts_obs'], '.1f')} | "
                  f"{r['restarts_pred']:.1f} | {r['restarts_exact']:.1f} | "
                  f"{r['restarts_asym']:.1f} | {r['its']:.0f} | {r['its_call']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
