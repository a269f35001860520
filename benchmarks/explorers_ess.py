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

Measured (``--steps 500``, 16 chains, 2-core VM shared with other jobs, one thread; min ESS
over the 20 statistics, per 1000 gradient evaluations / per second):

    metric   mala        hmc (10)     automala    nuts
    none     5.1 / 66    21.7 / 420   0.9 / 4     27.1 / 97
    diag     6.8 / 60     5.3 / 81    1.1 / 5     30.1 / 110
    dense  250.7 / 2745  23.7 / 403  34.9 / 165  117.4 / 354
    funnel (d = 10, s = 1): mala 13.2 / 115, hmc 1.4 / 19, automala 2.7 / 11, nuts 13.4 / 46

AutoMALA spends ~4.5 gradients per step (forward and reverse selections) and its thresholds
select steps whose acceptance is ~0.75, below MALA's optimal step; NUTS's per-leaf Python
loop costs ~2 ms per leapfrog step at this size, so its ESS per second trails HMC's.

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


class Funnel:
    """``--target funnel``: v ~ N(0, s^2), x_i | v ~ N(0, exp(v)) (i < dim), exact draws."""

    def __init__(self, dim: int, s: float = 1.0):
        self.dim, self.s, self.name = dim, s, "funnel"

    def energy(self, x):
        v, rest = x[..., 0], x[..., 1:]
        return (0.5 * (v / self.s) ** 2 + 0.5 * (rest**2).sum(-1) * torch.exp(-v)
                + 0.5 * (self.dim - 1) * v)

    def sample(self, n, g):
        z = torch.randn(n, self.dim, generator=g, dtype=torch.float64)
        v = self.s * z[:, :1]
        return torch.cat([v, z[:, 1:] * torch.exp(0.5 * v)], -1)


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
    ap.add_argument("--target", choices=("gaussian", "funnel"), default="gaussian")
    args = ap.parse_args()
    import arviz

    torch.set_num_threads(1)
    t = target(args.dim, args.ratio) if args.target == "gaussian" else Funnel(args.dim)
    if args.metric != "none" and args.target != "gaussian":
        raise SystemExit("--metric is for --target gaussian")
    metric = None if args.metric == "none" else {
        "diag": lambda: torch.sqrt(torch.diagonal(t.cov)),
        "dense": lambda: torch.linalg.cholesky(t.cov)}[args.metric]()
    makers = {"mala": MALA, "hmc": lambda: HMC(10), "automala": AutoMALA, "nuts": NUTS}
    what = f"sd ratio {args.ratio:g}" if args.target == "gaussian" else "funnel"
    print(f"d = {args.dim}, {what}, metric {args.metric}, "
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
