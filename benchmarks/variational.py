"""The variational reference against the prior reference on a posterior far from its prior.

Target: Bayesian logistic regression written in torch as a geometric target -- prior
N(0, prior_sd^2 I_d) over the coefficients (intercept included), Bernoulli likelihood of ``n``
synthetic observations (features N(0, 1), true coefficients fixed, seeded).  The posterior is
concentrated (sd ~ 0.1-0.3) far inside a wide prior, which is where annealing from the prior
pays a large global barrier.

Runs (adaptive NRPT, the same rounds, seed, explorer and systems):

* ``prior``: reference = prior, ``2N`` chains;
* ``variational`` / ``variational-meanfield``: two legs of ``N`` chains each (``2N`` in all),
  the prior leg and the leg annealed from the fitted Gaussian q, joined at the target.

Printed per run, from the last round (mean ± sd over the R systems): the global barrier Λ̂ of
each leg, the restart rate (restarts per iteration: of each leg, and their sum -- restarts of
the joined ladder reaching the target from either end), log Z (each leg's stepping stone), and
wall time of the whole ``nrpt.sample`` call with one torch thread.

Usage::

    python benchmarks/variational.py            # the table (make bench-variational)
    python benchmarks/variational.py --rounds 6 --systems 2  # smoke test
"""

from __future__ import annotations

import argparse
import math
import platform
import time
import warnings

import numpy as np
import torch

import nrpt


class LogisticRegression:
    """Geometric target: prior N(0, prior_sd^2 I), Bernoulli likelihood with logits X w."""

    reference_is_normalized = True

    def __init__(self, n: int = 300, dim: int = 5, prior_sd: float = 10.0, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.dim, self.name, self.prior_sd = dim, f"logistic-{n}x{dim}", float(prior_sd)
        X = torch.randn(n, dim - 1, generator=g, dtype=torch.float64)
        self.X = torch.cat([torch.ones(n, 1, dtype=torch.float64), X], 1)  # intercept
        self.w_true = torch.linspace(-2.0, 2.0, dim, dtype=torch.float64) + 1.0
        p = torch.sigmoid(self.X @ self.w_true)
        self.y = (torch.rand(n, generator=g, dtype=torch.float64) < p).to(torch.float64)

    def log_likelihood(self, w):
        z = w @ self.X.T.to(w)  # [m, n]
        y = self.y.to(w)
        return (y * z - torch.nn.functional.softplus(z)).sum(-1)

    def reference_log_prob(self, w):
        s = self.prior_sd
        return (-0.5 * (w * w).sum(-1) / s**2
                - self.dim * (math.log(s) + 0.5 * math.log(2 * math.pi)))

    def reference_sample(self, n, generator):
        return self.prior_sd * torch.randn(n, self.dim, generator=generator,
                                           dtype=torch.float64)


def ms(v) -> str:
    v = np.atleast_1d(np.asarray(v, dtype=float))
    return f"{v.mean():.3f} ± {v.std(ddof=1) if v.size > 1 else 0.0:.3f}"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--chains", type=int, default=8, help="N: chains per leg (prior-only: 2N)")
    ap.add_argument("--systems", type=int, default=4)
    ap.add_argument("--n", type=int, default=300, help="observations")
    ap.add_argument("--dim", type=int, default=5)
    ap.add_argument("--explorer", default="slice")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    t = LogisticRegression(a.n, a.dim)
    print(f"# {t.name}, prior N(0, {t.prior_sd:g}^2 I), rounds = {a.rounds} (last round "
          f"{2 ** a.rounds} iterations), systems = {a.systems}, explorer {a.explorer}, seed "
          f"{a.seed}; torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"1 thread")
    head = (f"{'reference':<22} {'chains':>6} {'Λ̂ prior leg':>15} {'Λ̂ var. leg':>15} "
            f"{'restarts/it prior':>18} {'restarts/it var.':>17} {'restarts/it all':>16} "
            f"{'log Z prior leg':>17} {'log Z var. leg':>17} {'wall s':>7}")
    print(head)
    print("-" * len(head))
    for ref in ("prior", "variational", "variational-meanfield"):
        P = 2 * a.chains if ref == "prior" else a.chains
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = nrpt.sample(t, reference=ref, rounds=a.rounds, chains=P, systems=a.systems,
                              explorer=a.explorer, seed=a.seed, figures=False, threads=1)
        wall = time.perf_counter() - t0
        s = res.summary
        if ref == "prior":
            bp, bv = s["barrier"], None
            rp, rv = s["restart_rate"], None
            lp, lv = s["log_normalizer"], None
            tot = np.asarray(rp)
        else:
            bp, bv = s["barrier_prior_leg"], s["barrier_variational_leg"]
            rp, rv = s["restart_rate_prior_leg"], s["restart_rate_variational_leg"]
            lp, lv = s["log_normalizer_prior_leg"], s["log_normalizer_variational_leg"]
            tot = np.asarray(rp) + np.asarray(rv)
        na = f"{'-':>15}"
        chains = str(P) if ref == "prior" else f"{P}+{P}"  # total, or per leg
        print(f"{ref:<22} {chains:>6} {ms(bp):>15} {ms(bv) if bv is not None else na:>15} "
              f"{ms(rp):>18} {ms(rv) if rv is not None else '-':>17} {ms(tot):>16} "
              f"{ms(lp):>17} {ms(lv) if lv is not None else '-':>17} {wall:>7.1f}")


if __name__ == "__main__":
    main()
