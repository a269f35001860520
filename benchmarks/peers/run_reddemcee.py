"""reddemcee (1.0) on mix25: prints one JSON line.  Runs in the peer venv.

Equivalent of 32 systems x 8 temperatures: ONE reddemcee ensemble with the protocol's 8 betas
and 32 walkers per temperature (256 replicas).  The ladder is held fixed
(``adapt_mode="NONE"``: reddemcee's ladder update multiplies the gaps by exp(0)).  The local
move is the protocol's random-walk Metropolis, written against reddemcee's move interface
(``moves=``, a subclass of ``reddemcee.moves.Move``): every walker proposes
x + scale(beta) * N(0, I) with the protocol's per-beta scale and is accepted by Metropolis on
reddemcee's tempered log-probability.

One reddemcee *sweep* with ``nsteps = 1`` is one local move per walker and TWO swap rounds:
``PTSampler.sample`` calls its swap move before and after the local moves of each sweep.  A
swap round goes over the adjacent pairs sequentially, alternating hot-to-cold and cold-to-hot
between calls, and walker k of one temperature is offered a swap with walker k of the other.
The benchmark runs 2000 sweeps = 2000 local moves + 4000 swap rounds (the tool's design).

Index process: the swap move is wrapped so that after each call the same decisions are replayed
on walker labels from the saved global NumPy random state (reddemcee draws its swap uniforms
from ``np.random``); the replay is checked against reddemcee's own log-likelihoods after the
swap (``index_replay_exact``).  The index is recorded after every swap round (2 per sweep) and
swap acceptance is counted over all swap rounds.

log Z: reddemcee's ``get_evidence_ss`` (stepping stone with bridge, its default), first half of
the sweeps discarded; ``get_evidence_ti`` and ``get_evidence_hybrid`` are recorded too.  The
ladder stops at beta = 1e-3, so the piece [0, 1e-3] is not covered.

Compatibility shim: ``np.trapz = np.trapezoid`` (removed in NumPy 2.4; used by its TI code).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402

if not hasattr(np, "trapz"):  # shim: removed in NumPy 2.4 (renamed trapezoid in 2.0)
    np.trapz = np.trapezoid

import protocol  # noqa: E402
import reddemcee  # noqa: E402
from reddemcee.moves import Move, PTMove  # noqa: E402
from reddemcee.state import State  # noqa: E402


class RWMove(Move):
    """Random-walk Metropolis with the protocol's scale at the state's beta."""

    def propose(self, model, state):
        n, d = state.coords.shape
        q = state.coords + protocol.scale(state.beta) * model.random.randn(n, d)
        log_prob, log_like, blobs = model.compute_log_prob_fn(q, state.beta)
        with np.errstate(invalid="ignore"):
            accepted = log_prob - state.log_prob > np.log(model.random.rand(n))
        new = State(q, log_prob=log_prob, log_like=log_like, beta=state.beta, blobs=blobs)
        return self.update(state, new, accepted), accepted


class TrackedPTMove(PTMove):
    """reddemcee's swap move; each call's decisions are replayed on walker labels."""

    def __init__(self, ntemps, nwalkers):
        super().__init__()
        self.tsw_hist = True
        self.labels = np.arange(ntemps * nwalkers).reshape(ntemps, nwalkers)
        self.levels = []
        self.accepted = np.zeros(ntemps - 1)
        self.attempted = np.zeros(ntemps - 1)
        self.exact = True

    def swap(self, state):
        saved = np.random.get_state()
        ntemps, nwalkers, _ = state.shape
        ll = [s.log_like.copy() for s in state]
        dbetas = -np.diff(state.betas)
        out = super().swap(state)
        order = range(1, ntemps) if self.inverted else range(ntemps - 1, 0, -1)
        rs = np.random.RandomState()
        rs.set_state(saved)
        lab = self.labels
        for t in order:
            raccept = np.log(rs.uniform(size=nwalkers))
            asel = dbetas[t - 1] * (ll[t] - ll[t - 1]) > raccept
            ll[t][asel], ll[t - 1][asel] = ll[t - 1][asel], ll[t][asel]
            lab[t][asel], lab[t - 1][asel] = lab[t - 1][asel], lab[t][asel]
            self.accepted[t - 1] += asel.sum()
            self.attempted[t - 1] += nwalkers
        self.exact &= all(np.array_equal(ll[t], state[t].log_like) for t in range(ntemps))
        level = np.empty(ntemps * nwalkers, dtype=np.int16)
        level[lab.ravel()] = np.repeat(np.arange(ntemps), nwalkers)
        self.levels.append(level)
        return out


def run(args, iterations, seed):
    np.random.seed(seed)  # reddemcee seeds its sampler RNG and draws swap uniforms from here
    rng = np.random.default_rng(seed)
    betas = protocol.betas(args.chains)
    sampler = reddemcee.PTSampler(args.walkers, protocol.DIM, protocol.log_likelihood,
                                  protocol.log_prior, betas=list(betas), adapt_mode="NONE",
                                  moves=RWMove())
    sampler._swap_move = TrackedPTMove(args.chains, args.walkers)
    p0 = protocol.prior_draws(args.chains * args.walkers, rng).reshape(
        args.chains, args.walkers, protocol.DIM)
    sampler.run_mcmc(p0, nsweeps=iterations, nsteps=1)
    return sampler


def main(argv=None) -> None:
    args = protocol.ensemble_args(__doc__.splitlines()[0], argv)
    sampler, warm, wall, cpu = protocol.warm_then_time(run, args)

    K, P = args.iterations, args.chains
    mv = sampler._swap_move
    out = {"tool": "reddemcee", "variant": "rwmh", "ok": True, "seed": args.seed,
           "wall_s": wall, "timed_cpu_s": cpu, "warmup_s": warm, "compile_s": None, "iterations": K,
           "systems": 1, "walkers_per_temperature": args.walkers, "chains": P,
           "swap_rounds_per_iteration": 2}
    chain = sampler.get_chain()  # [P, K, W, 2]
    out.update(protocol.draw_metrics(chain[0].transpose(1, 0, 2)))
    level0 = np.repeat(np.arange(P), args.walkers).astype(np.int16)
    level = np.vstack([level0] + mv.levels)  # after every swap round: 2K + 1 rows
    out.update(protocol.trip_metrics(level, P - 1, K, args.walkers))
    out["index_replay_exact"] = bool(mv.exact)
    per_pair = mv.accepted / np.maximum(mv.attempted, 1)
    out["swap_acceptance"] = float(per_pair.mean())
    out["swap_acceptance_per_pair"] = per_pair.tolist()
    out["swap_acceptance_end_of_sweep_tool"] = sampler.get_tsw().mean(0).tolist()
    out["explorer_acceptance"] = np.asarray(sampler.acceptance_fraction).mean(-1).tolist()
    d = K // 2
    z_ss, e_ss = sampler.get_evidence_ss(discard=d)
    extra = {}
    for name, fn in (("ti", sampler.get_evidence_ti), ("hybrid", sampler.get_evidence_hybrid)):
        try:
            z, e = fn(discard=d)
            extra[name] = [float(z), float(e)]
        except Exception as err:  # an optional extra: record why
            extra[name] = f"{type(err).__name__}: {err}"
    out.update(protocol.log_z_fields(
        z_ss, "stepping stone with bridge (PTSampler.get_evidence_ss, first half discarded)",
        f"reddemcee's error estimate {float(e_ss):.3g}; the ladder stops at beta = "
        f"{protocol.BETA_MIN}"))
    out["log_z_other"] = extra
    import importlib.metadata as md

    out["versions"] = {"reddemcee": md.version("reddemcee"), "emcee": md.version("emcee"),
                       "numpy": np.__version__}
    out["shims"] = ["np.trapz = np.trapezoid (removed in NumPy 2.4)"]
    out["threads"] = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
