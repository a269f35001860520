"""ESS per gradient evaluation and per second of the gradient explorers (mala, hmc, automala,
nuts) on a d = 10 ill-conditioned, correlated Gaussian, one slot (b = 1), no swaps, one thread.

Each explorer runs ``--chains`` independent chains batched in one tensor, from exact draws (no
burn-in needed), at a step tuned by short pilots (bisection; MALA to acceptance ~0.57, HMC
~0.65 with 10 leapfrog steps, NUTS ~0.8; AutoMALA's base step is the geometric mean of its
selected steps in the pilot, as its round adaptor does). ESS: arviz's bulk ESS of each
coordinate and of its square over the chains, the minimum over the 20 statistics. Gradient
evaluations are counted per replica (``Density.grad_components`` rows). ``--metric dense``
passes the exact Cholesky factor of the covariance (ideal preconditioning), ``diag`` its
marginal sds.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/explorers_ess.py [--metric none]

"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch

from nrpt.explorers.automala import LOG_STEP, AutoMALA
from nrpt.explorers.metropolis import HMC, MALA
from nrpt.explorers.nuts import NUTS
from nrpt.paths.ladders import TemperatureLadder
from nrpt.roles import Density, Noise, ReplicaState
from nrpt.targets import Gaussian

TARGET_ACC = {"mala": 0.574, "hmc": 0.65, "nuts": 0.8}


def target(dim: int, ratio: float, seed: int = 0) -> Gaussian:
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(dim, dim, generator=g, dtype=torch.float64))
    sds = torch.logspace(-math.log10(ratio), 0.0, dim, dtype=torch.float64)
    return Gaussian(torch.zeros(dim), q @ torch.diag(sds**2) @ q.T)


class Counting(Density):
    def __init__(self, *a):
        super().__init__(*a)
        self.rows = 0

    def grad_components(self, x):
        self.rows += int(np.prod(x.shape[:-1]))
        return super().grad_components(x)


def run(ex, t, h, steps, chains, metric, seed=1):
    dens = Counting(t, TemperatureLadder([1.0, 2.0]))
    x = t.sample(chains, torch.Generator().manual_seed(seed)).reshape(chains, 1, -1)
    state = ex.prepare(ReplicaState(x, *dens(x)), dens)
    b = torch.ones(chains, 1, dtype=torch.float64)
    hh = torch.full((chains, 1), h, dtype=torch.float64)
    kw = {} if metric is None else {"metric": metric.expand(chains, 1, *metric.shape)}
    out, acc, logh = [], 0.0, []
    dens.rows = 0
    t0 = time.perf_counter()
    for k in range(steps):
        state, info = ex.step(state, b, hh, dens, Noise(seed, k, chains, 1, torch.device("cpu")),
                              **kw)
        out.append(state.x[:, 0].clone())
        acc += float(info.accept_prob.mean())
        if LOG_STEP in state.extras:
            logh.append(state.extras[LOG_STEP].mean().item())
    secs = time.perf_counter() - t0
    return torch.stack(out, 1).numpy(), acc / steps, dens.rows, secs, logh


def tune(name, make, t, metric, chains):
    if name == "automala":
        _, _, _, _, logh = run(make(), t, 0.1, 30, chains, metric)
        return float(math.exp(np.mean(logh)))
    lo, hi = 1e-3, 10.0  # bisection in log h on the pilot's acceptance (decreasing in h)
    for _ in range(12):
        h = math.sqrt(lo * hi)
        _, acc, _, _, _ = run(make(), t, h, 20, chains, metric)
        lo, hi = (h, hi) if acc > TARGET_ACC[name] else (lo, h)
    return math.sqrt(lo * hi)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dim", type=int, default=10)
    ap.add_argument("--ratio", type=float, default=10.0, help="longest / shortest sd")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--chains", type=int, default=16)
    ap.add_argument("--metric", choices=("none", "diag", "dense"), default="none")
    ap.add_argument("--only", default="mala,hmc,automala,nuts")
    args = ap.parse_args()
    import arviz

    torch.set_num_threads(1)
    t = target(args.dim, args.ratio)
    metric = {"none": None, "diag": torch.sqrt(torch.diagonal(t.cov)),
              "dense": torch.linalg.cholesky(t.cov)}[args.metric]
    makers = {"mala": MALA, "hmc": lambda: HMC(10), "automala": AutoMALA, "nuts": NUTS}
    print(f"d = {args.dim}, sd ratio {args.ratio:g}, metric {args.metric}, "
          f"{args.chains} chains x {args.steps} steps, one thread")
    print(f"{'explorer':<9}{'step':>8}{'acc':>6}{'grads/step':>11}{'min ESS':>9}"
          f"{'ESS/1k grad':>12}{'ESS/s':>8}{'s':>7}")
    for name in args.only.split(","):
        h = tune(name, makers[name], t, metric, args.chains)
        x, acc, rows, secs, _ = run(makers[name](), t, h, args.steps, args.chains, metric, seed=7)
        stats = np.concatenate([x, x**2], -1)  # [chains, draws, 2 dim]
        ess = min(float(arviz.ess(stats[..., i])) for i in range(stats.shape[-1]))
        gps = rows / (args.chains * args.steps)
        print(f"{name:<9}{h:>8.3g}{acc:>6.2f}{gps:>11.1f}{ess:>9.0f}"
              f"{1000 * ess / rows:>12.2f}{ess / secs:>8.0f}{secs:>7.1f}")


if __name__ == "__main__":
    main()
