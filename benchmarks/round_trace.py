"""Per-round trace of an adaptive run on a posteriordb posterior: what the between-round
adaptation did, and the verdict against the reference draws.

For every round but the last it prints system 0's schedule, the per-slot explorer acceptance
(mean over systems), the step sizes before -> after the step tuner, the metric's scale along
one coordinate (``--coord``; the square root of the diagonal of ``L L^T``), and the refitted
Gaussian reference's sd and mean along it (with whether the refit was taken).  Then one
``RESULT`` line: pass/fail (max |z| <= 4 and sd ratios in [0.9, 1.1], as
``benchmarks/posteriordb.py``), the sd ratios outside [0.9, 1.1], the smallest bulk ESS, and
wall and CPU seconds.

Written to find why gp_pois_regr fails (docs/gaussian_reference.md, "Funnels"); it wraps
``StepSizeAdaptor.end_segment`` and ``GaussianRefit.end_segment`` to read their views, so it
changes nothing in the run (the same draws as without it).

    NRPT_STAN_CACHE=/tmp/nrpt-stan-cache OMP_NUM_THREADS=1 PYTHONPATH=src \\
      python benchmarks/round_trace.py --posterior gp_pois_regr-gp_pois_regr --coord 1 \\
      --options '{"rounds": 10, "seed": 0}'

``--options`` are ``nrpt.sample``'s keywords (``systems`` 4, ``rounds`` 11, ``seed`` 0 unless
given); ``--quiet`` prints the RESULT line only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import posteriordb as pdb  # noqa: E402

import nrpt  # noqa: E402
from nrpt.adapt import rounds as _rounds  # noqa: E402
from nrpt.paths import gaussian_reference as _gref  # noqa: E402


def _wrap(coord: int, quiet: bool) -> None:
    step_end, refit_end = _rounds.StepSizeAdaptor.end_segment, _gref.GaussianRefit.end_segment

    def traced_step(self, view):
        up = step_end(self, view)
        if quiet or up is None:
            return up
        acc = view.recorders["swaps"].explorer_acceptance().double().mean(0).cpu().numpy()
        h = view.step_size[0].double().cpu().numpy()
        new = up.step_size[0].double().cpu().numpy() if up.step_size is not None else h
        m = view.metric
        if m is None:
            scale = np.ones_like(h)
        else:
            m0 = m[0].double().cpu()
            scale = ((m0 ** 2).sum(-1)[:, coord].sqrt() if m0.dim() == 3 else m0[:, coord]).numpy()
        r = lambda a: np.round(a, 3).tolist()  # noqa: E731
        print(f"round {view.index}: schedule {r(view.schedule[0].double().cpu().numpy())}\n"
              f"    acceptance {np.round(acc, 2).tolist()}\n    step {r(h)} -> {r(new)}\n"
              f"    metric sd[{coord}] {r(scale)}", flush=True)
        return up

    def traced_refit(self, view):
        up = refit_end(self, view)
        if not quiet and up is not None and up.reference is not None:
            q, ok = up.reference
            sd = (q.chol[0] ** 2).sum(-1).sqrt()
            print(f"    reference refitted {bool(ok[0])}: sd[{coord}] {float(sd[coord]):.3f}, "
                  f"mean {float(q.mean[0, coord]):.3f}", flush=True)
        return up

    _rounds.StepSizeAdaptor.end_segment = traced_step
    _gref.GaussianRefit.end_segment = traced_refit


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db", default=str(pdb.DEFAULT_DB))
    p.add_argument("--posterior", default="gp_pois_regr-gp_pois_regr")
    p.add_argument("--coord", type=int, default=1, help="unconstrained coordinate traced")
    p.add_argument("--options", default="{}", help="nrpt.sample keywords (JSON)")
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    opts = {"rounds": 11, "systems": 4, "seed": 0, **json.loads(a.options)}
    post = pdb.load_posterior(a.db, a.posterior)
    ref, ref_ess = post.reference(), post.reference_ess()
    target, _ = pdb.make_target(post)
    _wrap(a.coord, a.quiet)
    t0, c0 = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = nrpt.sample(target, progress=False, **opts)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    cmp = pdb.compare(pdb.nrpt_draws(target, res.samples), ref, ref_ess)
    bad = {k: round(v["sd_ratio"], 3) for k, v in cmp["params"].items()
           if not 0.9 <= v["sd_ratio"] <= 1.1}
    ess = min(v["ess_bulk"] for v in cmp["params"].values())
    print(f"RESULT {json.dumps(opts)} {'pass' if cmp['pass'] else 'FAIL'} max|z| "
          f"{cmp['max_abs_z']:.2f} ({cmp['worst']}) sd ratio [{cmp['sd_ratio_min']:.3f}, "
          f"{cmp['sd_ratio_max']:.3f}] outside {bad} ESS min {ess:.0f} wall {wall:.1f} s "
          f"cpu {cpu:.1f} s chains {res.summary.get('chains')}", flush=True)


if __name__ == "__main__":
    main()
