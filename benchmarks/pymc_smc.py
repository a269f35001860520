"""nrpt against PyMC's sequential Monte Carlo on the same PyMC models: log marginal likelihood
error, its spread over repeats, and wall time, run back to back in one process.

The models (``benchmarks/pymc_models.py``) all have exact log Z.  For each model:

1. ``pm.sample_smc`` (``draws`` particles, one chain, one core) is run ``--repeats`` times with
   seeds 0, 1, ...; its estimate is the last stage's ``log_marginal_likelihood``.
2. nrpt runs adaptive NRPT on ``nrpt.targets.from_pymc(model)`` in two variants
   (:data:`VARIANTS`), several independent PT systems batched in one run (nrpt's counterpart of
   SMC's particles), the explorer ``--explorer``:

   * ``prior``: the prior as the reference, 8 systems x 12 chains; the estimate is the mean over
     systems of the stepping-stone ``log_normalizer``;
   * ``variational``: the stabilized variational reference (``reference="variational"``), 4
     systems x 6 chains per leg; the estimate is the mean over systems of the variational
     leg's ``log_normalizer_variational_leg``.

   Each variant's number of rounds is calibrated so that one run takes about as long as one
   SMC run (the largest ``rounds`` whose calibration run is at most ``--time-factor`` x SMC's
   median wall time), then it is run ``--repeats`` times with seeds 0, 1, ...
3. Printed per method: mean error, standard deviation over repeats, RMSE, median wall time; and
   the ratios nrpt / SMC of RMSE and of wall time.

Both methods are timed after one warm-up call on the same model (PyTensor compiles its C code
on first use).  One torch thread; PyTensor single-threaded.

Usage::

    python benchmarks/pymc_smc.py                          # docs/pymc.md
    python benchmarks/pymc_smc.py --models normal-normal --repeats 2 --smc-draws 200   # smoke
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import platform
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pymc_models  # noqa: E402


def smc_log_z(model, draws: int, seed: int) -> tuple[float, float]:
    import pymc as pm

    t0 = time.perf_counter()
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        idata = pm.sample_smc(draws=draws, chains=1, cores=1, random_seed=seed,
                              progressbar=False, compute_convergence_checks=False)
    wall = time.perf_counter() - t0
    lml = np.asarray(idata.sample_stats["log_marginal_likelihood"].values, dtype=object)
    stages = np.asarray([float(v) for v in np.ravel(lml[0, -1] if lml.ndim == 2 else lml)],
                        dtype=float)
    finite = stages[np.isfinite(stages)]
    return float(finite[-1]), wall


#: the nrpt variants: (label, reference, systems, chains per leg, summary key of the estimate)
VARIANTS = (("nrpt prior", "prior", 8, 12, "log_normalizer"),
            ("nrpt variational", "variational", 4, 6, "log_normalizer_variational_leg"))


def nrpt_log_z(target, rounds: int, variant, explorer: str, seed: int) -> tuple[float, float]:
    """(mean over systems of the variant's log Z estimate, wall time)."""
    import nrpt

    _, reference, systems, chains, key = variant
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the health checks of the short calibration runs
        res = nrpt.sample(target, rounds=rounds, chains=chains, systems=systems,
                          explorer=explorer, seed=seed, threads=1, reference=reference)
    wall = time.perf_counter() - t0
    return float(np.mean(res.summary[key])), wall


def stats_of(errors, walls) -> dict:
    e = np.asarray(errors, dtype=float)
    return {"mean_error": float(e.mean()), "sd": float(e.std(ddof=1)) if e.size > 1 else math.nan,
            "rmse": float(np.sqrt(np.mean(e**2))), "wall_s": float(np.median(walls))}


def run_model(name: str, args) -> list[dict]:
    from nrpt.targets import from_pymc

    model, exact, _ = pymc_models.MODELS[name]()
    target = from_pymc(model)
    smc_log_z(model, args.smc_draws, 10_000)  # warm-up (compilation)
    smc = [smc_log_z(model, args.smc_draws, s) for s in range(args.repeats)]
    smc_stats = stats_of([v - exact for v, _ in smc], [w for _, w in smc])
    rows = [{"model": name, "method": "pymc smc", "exact_log_z": exact,
             "setting": f"{args.smc_draws} draws", **smc_stats}]
    for variant in VARIANTS:
        label, reference, systems, chains, _ = variant
        nrpt_log_z(target, 3, variant, args.explorer, 10_000)  # warm-up
        rounds = args.min_rounds
        while rounds < args.max_rounds:
            _, w = nrpt_log_z(target, rounds + 1, variant, args.explorer, 10_001)
            if w > args.time_factor * smc_stats["wall_s"]:
                break
            rounds += 1
        runs = [nrpt_log_z(target, rounds, variant, args.explorer, s)
                for s in range(args.repeats)]
        st = stats_of([v - exact for v, _ in runs], [w for _, w in runs])
        rows.append({"model": name, "method": label, "exact_log_z": exact,
                     "setting": f"{systems}x{chains} r{rounds}", **st,
                     "rmse_ratio": st["rmse"] / smc_stats["rmse"],
                     "wall_ratio": st["wall_s"] / smc_stats["wall_s"]})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(pymc_models.MODELS),
                   choices=list(pymc_models.MODELS))
    p.add_argument("--repeats", type=int, default=8)
    p.add_argument("--smc-draws", type=int, default=1000)
    p.add_argument("--explorer", default="mala")
    p.add_argument("--min-rounds", type=int, default=4)
    p.add_argument("--max-rounds", type=int, default=14)
    p.add_argument("--time-factor", type=float, default=1.0)
    p.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    import pymc  # noqa: F401  (its import sets its logger's level; quiet it afterwards)

    logging.getLogger("pymc").setLevel(logging.ERROR)
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"one thread; repeats {args.repeats}; nrpt explorer {args.explorer}; "
          f"error = estimate - exact log Z; ratios are to SMC's on the same model")
    print(f"{'model':<18} {'method':<17} {'setting':<14} {'mean err':>9} {'sd':>7} {'rmse':>7} "
          f"{'wall s':>7} {'rmse ratio':>10} {'wall ratio':>10}")
    rows = []
    for name in args.models:
        for r in run_model(name, args):
            rows.append(r)
            ratio = (f"{r['rmse_ratio']:>10.2f} {r['wall_ratio']:>10.2f}" if "rmse_ratio" in r
                     else f"{'':>10} {'':>10}")
            print(f"{name:<18} {r['method']:<17} {r['setting']:<14} {r['mean_error']:>9.4f} "
                  f"{r['sd']:>7.4f} {r['rmse']:>7.4f} {r['wall_s']:>7.2f} {ratio}", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
