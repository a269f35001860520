"""nrpt on conjugate PyMC models: posterior means, variances and log Z against closed forms.

For each conjugate model of ``benchmarks/pymc_models.py`` (normal-normal, beta-binomial, Bayesian
linear regression) run adaptive NRPT on ``from_pymc(model)`` with ``--systems`` independent PT
systems and print, per scalar quantity (each element of each free variable, in the model's
constrained space, from ``posterior.nc``'s source ``target.model_variables``):

* the estimate (the mean over systems of the per-system value),
* its Monte Carlo standard error (the standard deviation over systems / sqrt(systems): the
  systems are independent, so this needs no autocorrelation model),
* the exact value and the z-score (estimate - exact) / MCSE,

for the posterior mean, the posterior variance, and log Z (the stepping-stone estimate of the
prior reference; with ``--reference variational`` the variational leg's).  ``|z| <= 3``
everywhere is the issue's criterion.

Usage::

    python benchmarks/pymc_conjugate.py                     # docs/pymc.md
    python benchmarks/pymc_conjugate.py --rounds 6 --systems 4   # smoke
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pymc_models  # noqa: E402

CONJUGATE = ("normal-normal", "beta-binomial", "linear-regression")


def run(name: str, args) -> list[tuple]:
    import nrpt
    from nrpt.targets import from_pymc

    model, exact_log_z, facts = pymc_models.MODELS[name]()
    target = from_pymc(model)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = nrpt.sample(target, rounds=args.rounds, chains=args.chains, systems=args.systems,
                          explorer=args.explorer, reference=args.reference, seed=args.seed,
                          threads=1)
    wall = time.perf_counter() - t0
    x = np.asarray(res.samples)  # [R, n, dim]
    R = x.shape[0]
    values = [target.model_variables(x[r]) for r in range(R)]
    rows = []
    for stat in ("mean", "var"):
        for var, exact in facts.get(stat, {}).items():
            exact = np.atleast_1d(np.asarray(exact, dtype=float))
            per = np.stack([(v[var].mean(0) if stat == "mean" else v[var].var(0, ddof=1))
                            .reshape(-1) for v in values])  # [R, k]
            for i in range(per.shape[1]):
                label = var if per.shape[1] == 1 else f"{var}[{i}]"
                rows.append((name, f"{stat} {label}", per[:, i], float(exact[i]), wall))
    key = "log_normalizer" if args.reference == "prior" else "log_normalizer_variational_leg"
    rows.append((name, "log Z", np.atleast_1d(np.asarray(res.summary[key], dtype=float)),
                 exact_log_z, wall))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(CONJUGATE), choices=list(CONJUGATE))
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--chains", type=int, default=8)
    p.add_argument("--systems", type=int, default=8)
    p.add_argument("--explorer", default="mala")
    p.add_argument("--reference", default="prior",
                   choices=["prior", "variational", "variational-meanfield"])
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    print(f"# rounds {args.rounds}, {args.systems} systems x {args.chains} chains, explorer "
          f"{args.explorer}, reference {args.reference}, seed {args.seed}; one thread")
    print(f"{'model':<18} {'quantity':<12} {'estimate':>12} {'MCSE':>9} {'exact':>12} "
          f"{'z':>6} {'wall s':>7}")
    worst = 0.0
    for name in args.models:
        for model, what, per, exact, wall in run(name, args):
            est = float(per.mean())
            se = float(per.std(ddof=1) / np.sqrt(per.size))
            z = (est - exact) / se
            worst = max(worst, abs(z))
            print(f"{model:<18} {what:<12} {est:>12.5f} {se:>9.5f} {exact:>12.5f} {z:>6.2f} "
                  f"{wall:>7.2f}", flush=True)
    print(f"# largest |z| = {worst:.2f} ({'within' if worst <= 3 else 'NOT within'} 3 MCSE)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
