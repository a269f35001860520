"""nrpt on mix25 (peer benchmark runner, project venv): prints one JSON line.

Variants, through the public API ``nrpt.sample``:

* ``fixed``: the protocol's ladder (8 geometric betas from 1 to 1e-3), RWMH with the protocol's
  per-slot scales (kept: ``adapt_step_size = False``, as the peers keep theirs; until stop 36
  nrpt re-tuned them in its burn-in, another kernel than the peers', with 10 % fewer round
  trips), DEO swaps, ``iterations`` iterations, nrpt's defaults otherwise (so eager
  chunks, ``fuse = "auto"``; the runner forced the plain loop until issue 24);
* ``compiled``: ``fixed`` with the RWMH step compiled (``compile = true``);
* ``fused``: ``fixed`` with chunks of 8 whole iterations as one compiled graph
  (``fuse = true``, ``compile = true``; :mod:`nrpt.core.fused`); ``fused-eager``: the same chunks
  run eagerly (``fuse = true`` alone: no compilation);
* ``adaptive``: nrpt's adaptive rounds (``rounds = N``, round r runs 2^r iterations) from the
  same initial ladder and scales; N is the largest with 2^(N+1) - 2 <= iterations + 48 (10 for
  2000: 2046 iterations).  The hottest beta stays at 1e-3; the schedule and the RWMH scales
  are re-fitted between rounds.  Draw scores use the last round (1024 iterations, the
  statistics nrpt reports), round trips the whole run's index process.

Run:  python benchmarks/peers/run_nrpt.py --variant fixed --iterations 2000 --seed 1
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import protocol  # noqa: E402
import torch  # noqa: E402
from mix25_nrpt import Mix25  # noqa: E402

import nrpt  # noqa: E402


def adaptive_rounds(iterations: int) -> int:
    """The largest N with 2^(N+1) - 2 <= iterations + 48 (at least 1)."""
    n = 1
    while 2 ** (n + 2) - 2 <= iterations + 48:
        n += 1
    return n


def betas_for(args) -> list[float]:
    b = protocol.betas(args.chains)
    if args.zero_end:  # for an nrpt that still requires the last beta = 0
        b[-1] = 0.0
    return b


def run(args, iterations: int, seed: int, ticks: list | None = None):
    """One ``nrpt.sample`` call; ``ticks`` collects ``(iteration, time)`` at every callback
    (every 256 iterations), from which the steady per-iteration cost is read."""
    opts = dict(chains=args.chains, systems=args.systems, explorer="rwmh", scheme="deo",
                betas=betas_for(args), step_size=protocol.scales(args.chains), seed=seed,
                figures=False, compile=args.variant in ("compiled", "fused"))
    if args.variant != "adaptive" and iterations >= 10:  # the protocol's scales, as the peers
        opts["adapt_step_size"] = False  # run them (nrpt's default would re-tune them in its
        # burn-in, floor(0.1 iterations) > 0; without a burn-in the option does not apply)
    if args.variant in ("fused", "fused-eager"):  # (else nrpt's default, fuse = "auto")
        opts["fuse"] = True
    if ticks is not None:
        opts["callback"] = lambda eng: ticks.append((eng.k, time.perf_counter()))
    if args.variant == "adaptive":
        opts["rounds"] = adaptive_rounds(iterations)
    else:
        opts["iterations"] = iterations
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nrpt.report.health's advice on short runs
        return nrpt.sample(Mix25(), **opts)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", choices=("fixed", "adaptive", "compiled", "fused",
                                          "fused-eager"), default="fixed")
    ap.add_argument("--iterations", type=int, default=protocol.ITERATIONS)
    ap.add_argument("--systems", type=int, default=protocol.SYSTEMS)
    ap.add_argument("--chains", type=int, default=protocol.CHAINS)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=protocol.WARMUP,
                    help="iterations of a warm-up run before the timed one (default 0: one run "
                         "per process, as every peer runner)")
    ap.add_argument("--zero-end", action="store_true",
                    help="end the ladder at beta = 0 (for an nrpt without beta_min > 0)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    t0 = time.perf_counter()
    if args.warmup > 0:
        warm_variant = args.variant if args.variant != "adaptive" else "fixed"
        run(argparse.Namespace(**{**vars(args), "variant": warm_variant}), args.warmup,
            args.seed + 10**6)
    warm = time.perf_counter() - t0

    ticks: list = []
    t0, c0 = time.perf_counter(), time.process_time()
    res = run(args, args.iterations, args.seed, ticks)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    # steady cost: from the first callback (iteration 256, past any compilation) to the end
    # of the loop, scaled to the run's iterations (the loop's own wall time is loop_s)
    loop = float(res.summary["wall_time_s"])
    steady = None
    if len(ticks) >= 2 and ticks[-1][0] > ticks[0][0]:
        k0, t_first = ticks[0]
        k1, t_last = ticks[-1]
        steady = (t_last - t_first) / (k1 - k0) * k1

    s = res.summary
    samples = np.asarray(res.samples)  # [R, n, 2] (last round for adaptive)
    if samples.ndim == 2:
        samples = samples[None]
    index = np.asarray(res.index)  # [K + 1, R, P] slot_of[replica]
    K = index.shape[0] - 1
    P = args.chains
    out = {"tool": "nrpt", "variant": args.variant, "ok": True, "seed": args.seed,
           "wall_s": wall, "timed_cpu_s": cpu, "warmup_s": warm, "compile_s": None,
           "loop_s": loop, "steady_s": steady,
           "iterations": K, "systems": args.systems, "chains": P}
    out.update(protocol.draw_metrics(samples))
    if args.variant == "adaptive":  # the last round is already the second half of the run
        out["max_freq_error"] = protocol.max_frequency_error(samples)
        out["n_draws_kept"] = int(samples.shape[0] * samples.shape[1])
        out["rounds"] = s.get("rounds")
        out["schedule_last_round_median"] = _slot_median(s.get("schedule"))
        out["step_size_last_round_median"] = _slot_median(s.get("step_size"))
    out.update(protocol.trip_metrics(index.reshape(K + 1, -1), P - 1, K, args.systems))
    acc = s.get("swap_acceptance")
    out["swap_acceptance"] = _mean(acc)
    out["swap_acceptance_per_pair"] = _pairs(acc)
    out["nrpt_round_trips"] = _sum(s.get("round_trips"))
    lz = s.get("log_normalizer")
    lz = float(np.mean(lz)) if lz is not None else None
    note = s.get("log_normalizer_note")
    out.update(protocol.log_z_fields(lz, f"stepping stone ({s.get('log_normalizer_kind')}), "
                                         f"mean over systems", note))
    for half in ("forward", "reverse"):
        v = s.get(f"log_normalizer_{half}")
        out[f"log_z_{half}"] = float(np.mean(v)) if v is not None else None
    out["betas"] = betas_for(args)
    out["versions"] = {"nrpt": getattr(nrpt, "__version__", "0.1.0"), "torch": torch.__version__,
                       "numpy": np.__version__}
    out["threads"] = {"torch": torch.get_num_threads(),
                      "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")}
    print(json.dumps(out))


def _mean(v):
    if v is None:
        return None
    a = np.asarray(v, dtype=float)
    return float(np.nanmean(a)) if a.size else None


def _pairs(v):
    if v is None:
        return None
    a = np.asarray(v, dtype=float)
    return (a.reshape(-1, a.shape[-1]).mean(0) if a.ndim > 1 else a).tolist()


def _slot_median(v):
    if v is None:
        return None
    a = np.asarray(v, dtype=float)
    return (np.median(a, axis=0) if a.ndim > 1 else a).tolist()


def _sum(v):
    if v is None:
        return None
    a = np.asarray(v, dtype=float)
    return float(a.sum()) if np.all(np.isfinite(a)) else None


if __name__ == "__main__":
    main()
