"""Slot-0 ESS per second with and without per-slot preconditioning (issue 25, item 2).

    OMP_NUM_THREADS=1 python benchmarks/precondition.py [mala|hmc|rwmh|slice] [seeds]

Target: a d = 6 Gaussian with sds 1 ... 1e-3 (ratio 1000) and every correlation 0.99 (the
test case of tests/test_precondition.py).  Adaptive NRPT, 10 rounds, 4 chains, 4 systems, one
thread; for precondition none / diagonal / dense: the wall time of the whole run, the smallest
bulk ESS over coordinates of the last round's slot-0 draws (all systems), that ESS per second
of the whole run, and the range of sd ratios (estimate / truth)."""

from __future__ import annotations

import sys
import time
import warnings

import torch

import nrpt
from nrpt.diagnostics.ess import ess_bulk
from nrpt.targets import Gaussian


def main(explorer: str = "mala", seeds=(1, 2)) -> None:
    d = 6
    sd = torch.logspace(0, -3, d, dtype=torch.float64)
    corr = 0.01 * torch.eye(d, dtype=torch.float64) + 0.99
    target = Gaussian(torch.linspace(1, -1, d, dtype=torch.float64) * sd,
                      sd[:, None] * corr * sd[None, :], name="ill-conditioned")
    for mode in ("none", "diagonal", "dense"):
        for seed in seeds:
            t = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res = nrpt.sample(target, rounds=10, chains=4, systems=4, explorer=explorer,
                                  precondition=mode, seed=seed, threads=1, progress=False)
            wall = time.perf_counter() - t
            x = res.samples
            ess = min(ess_bulk(x[..., j]) for j in range(d))
            ratio = x.reshape(-1, d).std(0) / sd.numpy()
            print(f"{explorer} {mode:8s} seed {seed}: wall {wall:5.1f} s, min bulk ESS "
                  f"{ess:7.1f}, ESS/s {ess / wall:7.2f}, sd ratio {ratio.min():.3f}-"
                  f"{ratio.max():.3f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "mala",
         tuple(int(s) for s in sys.argv[2].split(",")) if len(sys.argv) > 2 else (1, 2))
