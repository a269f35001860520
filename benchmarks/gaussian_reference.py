"""Reference for density-only targets: the refitted Gaussian (``reference="gaussian"``) against
a broad fixed Gaussian (``"gaussian-fixed"``), today's temperature ladder and, where the target
has a prior, the prior reference: round trips, barrier, log Z error (issue 25, item 1).

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/gaussian_reference.py [--rounds 9]

Targets (all with a closed-form log Z of exp(-energy)): a correlated 4-d Gaussian far from the
origin, a conjugate Bayesian linear regression (d = 5, covariates on scales 0.1 .. 30, so the
posterior sds span two orders of magnitude) given as energy only, a 2-d twisted Gaussian
("banana", non-Gaussian), and a 2-d two-component mixture."""

from __future__ import annotations

import argparse
import math
import time
import warnings

import numpy as np
import torch

import nrpt
from nrpt.targets.gaussian import Gaussian

F64 = torch.float64


class LinReg:
    """y = X w + eps, eps ~ N(0, sigma^2), w ~ N(0, tau^2 I): ``energy`` = -log p(y | w) -
    log p(w) (both normalized), so log Z = log p(y) = log N(y; 0, sigma^2 I + tau^2 X X^T).
    ``as_prior()``: the same posterior as a geometric target (prior reference)."""

    name = "linreg"

    def __init__(self, n=40, d=5, sigma=1.0, tau=10.0, seed=3):
        g = torch.Generator().manual_seed(seed)
        scales = torch.logspace(-1, math.log10(30), d, dtype=F64)
        self.X = torch.randn(n, d, generator=g, dtype=F64) * scales
        w = torch.randn(d, generator=g, dtype=F64) * 2.0 / scales
        self.y = self.X @ w + sigma * torch.randn(n, generator=g, dtype=F64)
        self.dim, self.sigma, self.tau, self.n = d, sigma, tau, n
        cov = sigma ** 2 * torch.eye(n, dtype=F64) + tau ** 2 * self.X @ self.X.T
        self.log_normalizer = float(torch.distributions.MultivariateNormal(
            torch.zeros(n, dtype=F64), cov).log_prob(self.y))
        prec = self.X.T @ self.X / sigma ** 2 + torch.eye(d, dtype=F64) / tau ** 2
        self.cov = torch.linalg.inv(prec)
        self.mean = self.cov @ self.X.T @ self.y / sigma ** 2

    def loglik(self, w):
        r = self.y.to(w) - w @ self.X.to(w).T
        return (-0.5 * (r * r).sum(-1) / self.sigma ** 2
                - self.n * (math.log(self.sigma) + 0.5 * math.log(2 * math.pi)))

    def log_prior(self, w):
        return (-0.5 * (w * w).sum(-1) / self.tau ** 2
                - self.dim * (math.log(self.tau) + 0.5 * math.log(2 * math.pi)))

    def energy(self, w):
        return -self.loglik(w) - self.log_prior(w)

    def as_prior(self):
        me = self

        class WithPrior:
            name, dim, reference_is_normalized = "linreg-prior", me.dim, True
            log_normalizer, mean, cov = me.log_normalizer, me.mean, me.cov

            def log_likelihood(self, w):
                return me.loglik(w)

            def reference_log_prob(self, w):
                return me.log_prior(w)

            def reference_sample(self, n, generator):
                return me.tau * torch.randn(n, me.dim, generator=generator, dtype=F64)

        return WithPrior()


class Banana:
    """x1 ~ N(0, s^2), x2 | x1 ~ N(b (x1^2 - s^2), 1): Jacobian 1, so log Z = log(2 pi s)."""

    name, dim = "banana", 2

    def __init__(self, s=2.0, b=0.5):
        self.s, self.b = s, b
        self.log_normalizer = math.log(2 * math.pi * s)
        self.mean = torch.zeros(2, dtype=F64)

    def energy(self, x):
        x1, x2 = x[..., 0], x[..., 1]
        return 0.5 * (x1 / self.s) ** 2 + 0.5 * (x2 - self.b * (x1 ** 2 - self.s ** 2)) ** 2


class Mixture:
    """0.5 N(-m, I) + 0.5 N(m, I) in 2-d, normalized: log Z = 0."""

    name, dim, log_normalizer = "mixture", 2, 0.0

    def __init__(self, m=(3.0, 3.0)):
        self.m = torch.tensor(m, dtype=F64)

    def energy(self, x):
        m = self.m.to(x)
        a = -0.5 * ((x - m) ** 2).sum(-1)
        b = -0.5 * ((x + m) ** 2).sum(-1)
        return -(torch.logaddexp(a, b) - math.log(2) - math.log(2 * math.pi))


def targets():
    d = 4
    A = torch.randn(d, d, generator=torch.Generator().manual_seed(1), dtype=F64)
    gauss = Gaussian(torch.tensor([5., -3, 2, 10], dtype=F64), A @ A.T + 0.5 * torch.eye(d,
                                                                                      dtype=F64))
    gauss.name = "gauss4"
    return [gauss, LinReg(), Banana(), Mixture()]


def one(target, reference, seed, rounds, chains, explorer):
    opts = dict(rounds=rounds, chains=chains, systems=2, explorer=explorer, seed=seed,
                progress=False, threads=1, figures=False)
    if reference is not None:
        opts["reference"] = reference
    t0 = time.time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = nrpt.sample(target, **opts)
    s = r.summary
    lz, se = np.atleast_1d(s.get("log_normalizer")), np.atleast_1d(s.get("log_normalizer_se"))
    return dict(rt=int(np.sum(s["round_trips"])), lam=float(np.mean(s["barrier"])),
                lz=lz, se=se, wall=time.time() - t0)


def sweep(factors, a):
    """``reference="gaussian"`` with each inflation factor of the fitted covariance."""
    import nrpt.paths.gaussian_reference as gr

    print(f"inflation sweep: rounds={a.rounds} chains={a.chains} systems=2 "
          f"explorer={a.explorer}, seeds 1..{a.seeds}")
    for t in [targets()[0], Banana(), Mixture()]:
        for f in factors:
            gr.INFLATE = f
            rows = [one(t, "gaussian", s, a.rounds, a.chains, a.explorer)
                    for s in range(1, a.seeds + 1)]
            lz = np.concatenate([r["lz"] for r in rows])
            se = np.concatenate([r["se"] for r in rows])
            print(f"{t.name:8} inflate {f:4.1f}: rt {sum(r['rt'] for r in rows):5d}, Λ "
                  f"{np.mean([r['lam'] for r in rows]):.2f}, max|z| "
                  f"{np.max(np.abs((lz - t.log_normalizer) / se)):.1f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--chains", type=int, default=8)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--explorer", default="slice")
    ap.add_argument("--inflate", default=None,
                    help="comma-separated factors: sweep the fitted covariance's inflation "
                         "(reference 'gaussian' only) instead")
    a = ap.parse_args()
    if a.inflate:
        return sweep([float(v) for v in a.inflate.split(",")], a)
    print(f"rounds={a.rounds} chains={a.chains} systems=2 explorer={a.explorer}, "
          f"seeds 1..{a.seeds}; "
          f"rt: last-round round trips (sum over systems and seeds); Λ: mean barrier; "
          f"z: (log Z - exact) / se per system")
    print(f"{'target':8} {'reference':15} {'rt':>5} {'Λ':>6} {'max|z|':>7} "
          f"{'max|err|':>9} {'median se':>9} {'wall s':>6}")
    for t in targets():
        refs = ["gaussian", "gaussian-fixed", "temperature"]
        for ref in refs + (["prior"] if hasattr(t, "as_prior") else []):
            tgt = t.as_prior() if ref == "prior" else t
            rows = [one(tgt, None if ref in ("temperature", "prior") else ref, s, a.rounds,
                        a.chains, a.explorer) for s in range(1, a.seeds + 1)]
            rt = sum(r["rt"] for r in rows)
            lam = np.mean([r["lam"] for r in rows])
            wall = sum(r["wall"] for r in rows)
            if ref == "temperature":  # log Z not absolute on a temperature ladder
                zs, err, se = "-", "-", "-"
            else:
                lz = np.concatenate([r["lz"] for r in rows])
                sev = np.concatenate([r["se"] for r in rows])
                e = lz - t.log_normalizer
                zs, err, se = (f"{np.max(np.abs(e / sev)):.1f}", f"{np.max(np.abs(e)):.3f}",
                               f"{np.median(sev):.3f}")
            print(f"{t.name:8} {ref:15} {rt:5d} {lam:6.2f} {zs:>7} {err:>9} {se:>9} "
                  f"{wall:6.1f}", flush=True)


if __name__ == "__main__":
    main()
