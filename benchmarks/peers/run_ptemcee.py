"""ptemcee (1.0.0) on mix25: prints one JSON line.  Runs in the peer venv.

Equivalent of 32 systems x 8 temperatures: ONE ptemcee ensemble with 8 temperatures (the
protocol's betas, given explicitly, no ladder adaptation) and 32 walkers per temperature = 256
replicas, one likelihood evaluation per replica per iteration as in the other tools.  ptemcee
has no choice of local move: each iteration is its affine-invariant stretch move (a = 2, the
two half-ensembles updated in turn, so every walker proposes once) followed by one swap round
(for each adjacent pair, hottest first, the 32 walkers of the two temperatures are paired at
random and each pair swaps with the Metropolis probability).  The RWMH scales of the protocol
therefore do not apply to ptemcee.

Compatibility shims: ptemcee 1.0.0 uses ``np.float`` (removed in NumPy 1.24) and ``np.trapz``
(removed in NumPy 2.4, renamed ``np.trapezoid`` in 2.0): ``np.float = float`` and
``np.trapz = np.trapezoid`` are set before it is imported.

Index process: the swap routine is wrapped so that each walker's identity travels with it as an
extra coordinate through ptemcee's own ``_temperature_swaps`` (same random draws, same
decisions), giving the temperature of every one of the 256 replicas at every iteration.  log Z:
ptemcee's ``log_evidence_estimate`` (thermodynamic integration over the ladder, trapezoid on
mean log-likelihoods, first half discarded); the ladder stops at beta = 1e-3, so the integral
over [0, 1e-3] is missing (about 1e-3 x E_prior[log L], ~0.01-0.02 here).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402

if not hasattr(np, "float"):  # shim: removed in NumPy 1.24, used by ptemcee 1.0.0
    np.float = float
if not hasattr(np, "trapz"):  # shim: removed in NumPy 2.4 (renamed trapezoid in 2.0)
    np.trapz = np.trapezoid

import protocol  # noqa: E402
import ptemcee  # noqa: E402


class TrackedSampler(ptemcee.Sampler):
    """ptemcee's sampler with the identity of each walker carried through the swaps."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.labels = np.arange(self.ntemps * self.nwalkers, dtype=float).reshape(
            self.ntemps, self.nwalkers)
        self.levels = []

    def _temperature_swaps(self, betas, p, logpost, logl):
        aug = np.concatenate([p, self.labels[..., None]], axis=-1)
        aug, ratios = super()._temperature_swaps(betas, aug, logpost, logl)
        self.labels = aug[..., -1].copy()
        level = np.empty(self.ntemps * self.nwalkers, dtype=np.int16)
        level[self.labels.astype(int).ravel()] = np.repeat(np.arange(self.ntemps),
                                                           self.nwalkers)
        self.levels.append(level)
        return np.ascontiguousarray(aug[..., :-1]), ratios


def run(args, iterations, seed):
    rng = np.random.default_rng(seed)
    sampler = TrackedSampler(args.walkers, protocol.DIM, logl=protocol.log_likelihood,
                             logp=protocol.log_prior, betas=np.array(protocol.betas(args.chains)),
                             random=np.random.RandomState(seed))
    p0 = protocol.prior_draws(args.chains * args.walkers, rng).reshape(
        args.chains, args.walkers, protocol.DIM)
    ratios = []
    for _p, _lp, _ll, r in sampler.sample(p0, iterations=iterations, swap_ratios=True):
        ratios.append(r)
    level0 = np.repeat(np.arange(args.chains), args.walkers).astype(np.int16)
    return sampler, np.asarray(ratios), np.vstack([level0] + sampler.levels)


def main(argv=None) -> None:
    args = protocol.ensemble_args(__doc__.splitlines()[0], argv)
    (sampler, ratios, level), warm, wall, cpu = protocol.warm_then_time(run, args)

    K, P = args.iterations, args.chains
    out = {"tool": "ptemcee", "variant": "stretch", "ok": True, "seed": args.seed,
           "wall_s": wall, "timed_cpu_s": cpu, "warmup_s": warm, "compile_s": None, "iterations": K,
           "systems": 1, "walkers_per_temperature": args.walkers, "chains": P}
    out.update(protocol.draw_metrics(sampler.chain[0]))  # [walkers, K, 2] at beta = 1
    # 256 replicas = args.walkers system-equivalents of P replicas each
    out.update(protocol.trip_metrics(level, P - 1, K, args.walkers))
    per_pair = ratios.mean(0)  # accepted / 32 proposed, per adjacent pair
    out["swap_acceptance"] = float(per_pair.mean())
    out["swap_acceptance_per_pair"] = per_pair.tolist()
    out["explorer_acceptance"] = sampler.acceptance_fraction.mean(1).tolist()
    logz, dlogz = sampler.log_evidence_estimate(fburnin=0.5)
    out.update(protocol.log_z_fields(logz, "thermodynamic integration "
                                     "(Sampler.log_evidence_estimate, fburnin = 0.5)",
                                     f"ptemcee's quadrature error estimate {dlogz:.3g}; the "
                                     f"ladder stops at beta = {protocol.BETA_MIN}"))
    import importlib.metadata as md

    out["versions"] = {"ptemcee": md.version("ptemcee"), "numpy": np.__version__}
    out["shims"] = ["np.float = float (removed in NumPy 1.24)",
                     "np.trapz = np.trapezoid (removed in NumPy 2.4)"]
    out["threads"] = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
