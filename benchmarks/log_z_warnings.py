"""How often nrpt's log Z checks fire where the answer is known, and whether the reported bridge
is then right: the false-alarm rate of the stepping-stone halves' comparison (the former
``log-z-halves`` warning, now a summary note) beside the detection rate of ``log-z-overlap``.

Each configuration runs ``sets`` independent sets of 4 PT systems (a run's systems) in one
engine, RWMH with each slot's step scaled to its spread, 200 burn-in and ``iterations`` main
iterations on a fixed ladder, with the ``log_z`` recorder; the targets have exact log Z
(:class:`nrpt.targets.gaussian_path.ScaledGaussianPath` on its optimal schedule,
:class:`~nrpt.targets.gaussian_path.ShiftedGaussianPath` on an even one, and the
Uniform/HalfNormal prior path of tests/test_lognorm.py, whose reverse half has infinite-variance
weights).  Per set, the halves' rule (some system's ``|halves_z| > HALVES_Z``, or the systems'
``sum z / sqrt(R)``), the overlap rule (some system's pair with ``v / n > 1 / OVERLAP_DRAWS``),
and the pooled bridge against the exact value: its bias over the sets (± its error), the share
of sets whose ``estimate ± 1.96 se`` covers it, and the share more than 3 se off.

Run:  python benchmarks/log_z_warnings.py            (~1 min CPU, one thread)
      python benchmarks/log_z_warnings.py --only c1e4 --sets 50
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

import nrpt
from nrpt.core.loop import Plan, Run, Segment, execute
from nrpt.recorders.log_z import HALVES_Z, OVERLAP_DRAWS, SteppingStone, pooled_log_z
from nrpt.targets.gaussian_path import ScaledGaussianPath, ShiftedGaussianPath

R = 4


def run(target, betas, steps, exact, sets, iters, seed, swaps=("deo", 1, "metropolis")):
    """The per-set rules and the bridge's error over ``sets`` sets of ``R`` systems (``swaps``:
    scheme, window, rule)."""
    eng = nrpt.PTEngine(target, nrpt.GeometricPath(betas), nrpt.make_explorer("rwmh"),
                        nrpt.make_scheme(swaps[0], window=swaps[1]), nrpt.make_rule(swaps[2]),
                        step_size=steps, systems=sets * R, seed=seed)
    st = SteppingStone(sets * R, len(betas), reference_normalized=True)
    execute(Run(engine=eng, adaptors=[], recorders={st.name: st},
                plan=Plan((Segment("burn-in", 200, sample=False), Segment("main", iters)))))
    est = {k: v.double() for k, v in st.estimate().items()}
    z = est["halves_z"].reshape(sets, R)
    ok = torch.isfinite(z)
    comb = torch.where(ok, z, torch.zeros_like(z)).sum(1) / ok.sum(1).clamp_min(1).sqrt()
    halves = ((z.abs() > HALVES_Z) & ok).any(1) | ((ok.sum(1) >= 2) & (comb.abs() > HALVES_Z))
    # forward above reverse: against both halves' known (Jensen) biases
    upward = ((z > HALVES_Z) & ok).any(1) | ((ok.sum(1) >= 2) & (comb > HALVES_Z))
    bc = st.pair_overlap().double()
    ratio = (1 / bc.clamp_min(1e-150).square() - 1) / st.n
    ratio = torch.where(torch.isnan(bc), torch.zeros_like(ratio), ratio)
    overlap = (ratio.max(1).values * OVERLAP_DRAWS > 1).reshape(sets, R).any(1)
    lz, se = est["log_normalizer"].reshape(sets, R), est["se"].reshape(sets, R)
    pooled = [pooled_log_z(lz[i], se[i]) for i in range(sets)]
    e = np.array([p["estimate"] for p in pooled])
    bz = (e - exact) / np.array([p["se"] for p in pooled])
    alone = (halves & ~overlap).numpy()
    return {"halves": halves.double().mean().item(), "halves z > +4": upward.double().mean().item(),
            "max z": float(z[ok].max()), "overlap": overlap.double().mean().item(),
            "halves alone": alone.mean(),
            "bias": f"{e.mean() - exact:+.3f} ± {e.std(ddof=1) / math.sqrt(sets):.3f}",
            "covered": float(np.mean(np.abs(bz) <= 1.96)),
            "> 3 se off": float(np.mean(np.abs(bz) > 3)),
            "> 3 se off, halves alone": float(np.mean(np.abs(bz[alone]) > 3))
            if alone.any() else float("nan"),
            "reverse - exact": float(est["reverse"].mean() - exact),
            "median v/n": float(ratio.max(1).values.median())}


def scaled(d, c, P, sets, iters, seed, swaps=("deo", 1, "metropolis")):
    t = ScaledGaussianPath(dim=d, c=c)
    betas = [1.0, 0.0] if P == 2 else list(t.optimal_schedule(P))
    steps = [2.38 / math.sqrt(d * (1 + c * b)) for b in betas]
    return run(t, betas, steps, t.log_normalizer, sets, iters, seed, swaps)


def shifted(d, m, P, sets, iters, seed):
    t = ShiftedGaussianPath(dim=d, shift=m)
    return run(t, list(np.linspace(1.0, 0.0, P)), 2.38 / math.sqrt(d), t.log_normalizer, sets,
               iters, seed)


def uniform_halfnormal(sets, iters, seed):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from test_lognorm import UniformHalfNormal

    t = UniformHalfNormal(np.random.default_rng(0).normal(1.0, 1.5, size=20))
    betas = list(np.geomspace(1.0, 0.2, 5)) + [0.0]
    steps = [0.5 / math.sqrt(b) if b else 1.0 for b in betas]
    return run(t, betas, steps, t.exact_log_z(), sets, iters, seed)


# name -> (function, args, iterations); the sets and seed come from the command line
CONFIGS = {
    "scaled d=5 c=1e4 P=4": (scaled, (5, 1e4, 4), 1024),
    "scaled d=5 c=1e4 P=4 n=256": (scaled, (5, 1e4, 4), 256),
    "scaled d=5 c=1e4 P=5": (scaled, (5, 1e4, 5), 1024),
    "scaled d=5 c=1e4 P=5 n=2048": (scaled, (5, 1e4, 5), 2048),
    "scaled d=5 c=1e4 P=6": (scaled, (5, 1e4, 6), 1024),
    "scaled d=5 c=1e4 P=6 n=256": (scaled, (5, 1e4, 6), 256),
    "scaled d=5 c=1e4 P=10": (scaled, (5, 1e4, 10), 1024),
    "scaled d=5 c=1e4 P=16": (scaled, (5, 1e4, 16), 1024),
    "scaled d=5 c=1.5 P=2": (scaled, (5, 1.5, 2), 1024),
    "scaled d=5 c=3 P=2": (scaled, (5, 3.0, 2), 1024),
    "scaled d=5 c=3 P=3": (scaled, (5, 3.0, 3), 1024),
    "scaled d=5 c=30 P=3": (scaled, (5, 30.0, 3), 1024),
    "scaled d=10 c=0.5 P=2": (scaled, (10, 0.5, 2), 1024),
    "scaled d=5 c=-0.6 P=2": (scaled, (5, -0.6, 2), 1024),
    "shifted d=2 m=3 P=2": (shifted, (2, 3.0, 2), 1024),
    "shifted d=2 m=3 P=3": (shifted, (2, 3.0, 3), 1024),
    "shifted d=2 m=3 P=7": (shifted, (2, 3.0, 7), 1024),
    "uniform-halfnormal P=6": (uniform_halfnormal, (), 1024),
    # every swap accepted (DEO_W, window 3, rule "always", as golden's exact-deo-w-*): the
    # slots' draws are not their path distributions, so no log Z estimate is right
    "scaled d=5 c=30 P=6 swaps always accepted": (scaled, (5, 30.0, 6), 1024, ("deo-w", 3,
                                                                                "always")),
    "scaled d=5 c=1e4 P=10 swaps always accepted": (scaled, (5, 1e4, 10), 1024, ("deo-w", 3,
                                                                                 "always")),
    # DEO_W's gate with exact Metropolis swaps (biased; nrpt.sample refuses it, the engine
    # does not)
    "scaled d=5 c=30 P=6 DEO_W gate, Metropolis": (scaled, (5, 30.0, 6), 1024, ("deo-w", 3,
                                                                                 "metropolis")),
}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", type=int, default=100, help="sets of 4 systems per configuration")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", nargs="*", default=[], help="substrings of configuration names")
    args = ap.parse_args(argv)
    cols = None
    for name, (f, a, iters, *swaps) in CONFIGS.items():
        if args.only and not any(o in name for o in args.only):
            continue
        t0 = time.process_time()
        res = f(*a, args.sets, iters, args.seed, *swaps)
        if cols is None:
            cols = list(res)
            print("| configuration | " + " | ".join(cols) + " | CPU s |")
            print("|" + " --- |" * (len(cols) + 2))
        cells = [v if isinstance(v, str) else f"{v:.3g}" for v in res.values()]
        print(f"| {name} | " + " | ".join(cells) + f" | {time.process_time() - t0:.1f} |",
              flush=True)


if __name__ == "__main__":
    main()
