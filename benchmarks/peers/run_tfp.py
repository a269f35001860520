"""TensorFlow Probability (JAX substrate) ReplicaExchangeMC on mix25: prints one JSON line.

Runs in the peer venv.  32 independent PT systems are TFP's batch dimension (state
``[8 replicas, 32, 2]``, ``state_includes_replicas=True``, each replica starting from its own
prior draw); the local kernel is ``tfp.mcmc.RandomWalkMetropolis`` with
``random_walk_normal_fn(scale)``, scale ``[8, 1, 1]`` = the protocol's per-beta scales; the path
is geometric (``untempered_log_prob_fn`` = log prior, ``tempered_log_prob_fn`` = log
likelihood); one ``one_step`` = one RWMH step of every replica + one swap round.  Swaps:
``--swap even-odd`` is ``tfp.mcmc.even_odd_swap_proposal_fn(1.)`` (deterministic alternation of
even and odd pairs, the DEO scheme), ``--swap default`` is the default
``default_swap_proposal_fn(1.)`` (a random parity at every step, per batch member: SEO).

The chain is ``tfp.mcmc.sample_chain`` under ``jax.jit``; the program is lowered and compiled
ahead of time (``compile_s``), then executed once, timed (``wall_s``): one run per process, as
every runner of the benchmark (``protocol.WARMUP``).  ``--warmup N > 0``: before it, a program of
``N`` steps (its own compilation, ``sample_chain``'s length being part of the program) executed
once with another seed (``warmup_s``), the other runners' short warm-up run; the process used to
execute the whole timed program a second time instead, twice the work of the other processes.
The index process is rebuilt from ``is_swap_accepted_adjacent``.  TFP has no
normalizing-constant estimator for ReplicaExchangeMC, so log Z is n/a.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("XLA_FLAGS",
                      "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import protocol  # noqa: E402
import tensorflow_probability.substrates.jax as tfp  # noqa: E402

SWAPS = {"even-odd": lambda: tfp.mcmc.even_odd_swap_proposal_fn(1.0),
         "default": lambda: tfp.mcmc.default_swap_proposal_fn(1.0)}


def build(args, iterations: int):
    centres = jnp.asarray(protocol.CENTRES)
    const = -np.log(protocol.N_MODES) - np.log(2 * np.pi * protocol.SIGMA**2)

    def log_likelihood(x):
        d2 = jnp.sum((x[..., None, :] - centres) ** 2, axis=-1)
        return jax.nn.logsumexp(-0.5 * d2 / protocol.SIGMA**2, axis=-1) + const

    def log_prior(x):
        inside = jnp.all(jnp.abs(x) <= protocol.BOX, axis=-1)
        return jnp.where(inside, protocol.LOG_PRIOR, -jnp.inf)

    betas = jnp.asarray(protocol.betas(args.chains))
    scale = jnp.asarray(protocol.scales(args.chains))[:, None, None]

    def make_kernel_fn(target_log_prob_fn):
        return tfp.mcmc.RandomWalkMetropolis(
            target_log_prob_fn, new_state_fn=tfp.mcmc.random_walk_normal_fn(scale=scale))

    kernel = tfp.mcmc.ReplicaExchangeMC(
        target_log_prob_fn=None, inverse_temperatures=betas, make_kernel_fn=make_kernel_fn,
        swap_proposal_fn=SWAPS[args.swap](), state_includes_replicas=True,
        untempered_log_prob_fn=log_prior, tempered_log_prob_fn=log_likelihood)

    def run(init, key):
        states, (acc, prop) = tfp.mcmc.sample_chain(
            num_results=iterations, current_state=init, kernel=kernel,
            num_burnin_steps=0, seed=key,
            trace_fn=lambda _, kr: (kr.is_swap_accepted_adjacent, kr.is_swap_proposed_adjacent))
        return states[:, 0], acc, prop  # beta = 1 draws [K, R, 2]; [K, P - 1, R] twice

    return jax.jit(run)


def init_states(args, seed):
    rng = np.random.default_rng(seed)
    return jnp.asarray(protocol.prior_draws(args.chains * args.systems, rng)
                       .reshape(args.chains, args.systems, protocol.DIM))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--swap", choices=tuple(SWAPS), default="even-odd")
    ap.add_argument("--iterations", type=int, default=protocol.ITERATIONS)
    ap.add_argument("--systems", type=int, default=protocol.SYSTEMS)
    ap.add_argument("--chains", type=int, default=protocol.CHAINS)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=protocol.WARMUP,
                    help="steps of a warm-up program run before the timed one (0: none)")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    init, key = init_states(args, args.seed), jax.random.PRNGKey(args.seed)
    compiled = build(args, args.iterations).lower(init, key).compile()
    compile_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    if args.warmup > 0:
        init_w = init_states(args, args.seed + 10**6)
        key_w = jax.random.PRNGKey(args.seed + 10**6)
        short = build(args, args.warmup).lower(init_w, key_w).compile()
        jax.block_until_ready(short(init_w, key_w))
    warm = time.perf_counter() - t0

    t0, c0 = time.perf_counter(), time.process_time()
    draws, acc, prop = jax.block_until_ready(compiled(init, key))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0

    draws = np.asarray(draws).transpose(1, 0, 2)  # [R, K, 2]
    acc, prop = np.asarray(acc), np.asarray(prop)
    K, P = args.iterations, args.chains
    out = {"tool": "tfp", "variant": args.swap, "ok": True, "seed": args.seed,
           "wall_s": wall, "timed_cpu_s": cpu, "warmup_s": warm, "compile_s": compile_s,
           "iterations": K, "systems": args.systems, "chains": P}
    out.update(protocol.draw_metrics(draws))
    index = protocol.index_from_adjacent_swaps(acc)  # [K + 1, R, P]
    out.update(protocol.trip_metrics(index.reshape(K + 1, -1), P - 1, K, args.systems))
    per_pair = acc.sum((0, 2)) / np.maximum(prop.sum((0, 2)), 1)
    out["swap_acceptance"] = float(per_pair.mean())
    out["swap_acceptance_per_pair"] = per_pair.tolist()
    out["swaps_proposed_per_pair_per_iter"] = (prop.sum((0, 2)) / (K * args.systems)).tolist()
    out.update(protocol.log_z_fields(
        None, None, "TFP's ReplicaExchangeMC has no normalizing-constant estimator"))
    out["versions"] = {"tensorflow_probability": tfp.__version__, "jax": jax.__version__,
                       "jaxlib": jax.lib.__version__ if hasattr(jax.lib, "__version__")
                       else None, "numpy": np.__version__}
    out["threads"] = {"XLA_FLAGS": os.environ.get("XLA_FLAGS"),
                      "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
