"""Where an iteration's time goes: each piece of the loop timed on its own, in one process.

    python benchmarks/parts.py            # make bench-parts (OMP_NUM_THREADS=1)
    python benchmarks/parts.py --quick    # a smoke run (numbers not for reporting)

Two runs: the headline DEO*-SGD x P16 run (``nrpt.run.sgpt.HEADLINE``) and exact PT on the 25-mode
target (RWMH, DEO, R = 32 systems x P = 8).  For each, after a warm-up, the µs per call of
``engine.step``, the bare explorer step, every adaptor's ``observe`` and every recorder's
``record`` (the ``draws`` recorder included: it keeps the draws in memory here), and one whole
iteration (step + adaptors + recorders) -- with and without ``torch.inference_mode`` (the loop
uses it for runs that need no autograd, ``PTEngine.autograd_free``).  Repeats are interleaved,
medians are printed.  Also: the aten ops of one whole iteration (``torch.profiler``, nested
calls included), and the two finiteness checks of a proposal ``[1, 16, 10^4]``.  Last, the
fused loop (``fuse = true, compile = true``, chunks of 8) per iteration beside the bare explorer
step, plain and compiled; a sum over a last axis of length 2 against the explicit sum, exp of
underflowing arguments against arguments in range, and the mix25 target's log-likelihood in its
textbook form against the eager form of ``benchmarks/peers/mix25_nrpt.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch

from nrpt.explorers import Noise
from nrpt.run.build import build
from nrpt.run.config import RunConfig
from nrpt.run.sgpt import HEADLINE

sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
from mix25_nrpt import Mix25  # noqa: E402


def configs(iterations: int, fused: bool = False) -> dict[str, RunConfig]:
    """The two runs; ``fused``: with ``fuse = true, compile = true`` (nrpt.core.fused)."""
    more = {"fuse": True, "compile": True} if fused else {"fuse": False}  # (plain loop)
    return {"headline (sgd, P16)": RunConfig.from_dict({}, defaults=dict(
                HEADLINE, iterations=iterations, **more)),
            "exact (rwmh, R32 x P8)": RunConfig(target="twenty-five-modes", chains=8, systems=32,
                                                iterations=iterations, explorer="rwmh",
                                                scheme="deo", figures=False, **more)}


def fused_against_bare(reps: int, calls: int, unroll: int = 8) -> None:
    """Per iteration: the fused loop's chunk (compiled, ``unroll`` iterations: explore, swap,
    adapt, round trips, every recorder) against the bare explorer step, plain and compiled
    (``explorers.compiled``), in the loop's inference mode; medians of interleaved repeats."""
    from nrpt.explorers.compiled import Compiled

    n_chunks = max(1, calls // unroll)
    total = (reps + 2) * n_chunks * unroll + 1000
    print(f"\nfused loop (chunks of {unroll}, compiled) vs the bare explorer step, us per "
          f"iteration")
    for label, cfg in configs(total, fused=True).items():
        run = build(cfg)
        for r in run.recorders.values():
            r.start_segment(True, total)
        run.recorders["draws"].initial(run.engine.slot_of)
        eng, f = run.engine, run.fused
        plain = pieces(run)
        compiled = Compiled(f.explorer)

        def bare_plain(eng=eng, explorer=f.explorer):  # (the engine's own is compiled)
            b, h = eng.slot_params(eng.schedule), eng.slot_params(eng.step_size)
            explorer.step(eng.state, b, h, eng.density, Noise(eng.seed, eng.k, eng.R, eng.P,
                                                              eng.device))

        def bare_compiled(eng=eng, compiled=compiled):
            b, h = eng.slot_params(eng.schedule), eng.slot_params(eng.step_size)
            compiled.step(eng.state, b, h, eng.density, Noise(eng.seed, eng.k, eng.R, eng.P,
                                                              eng.device))

        with torch.inference_mode(eng.autograd_free):
            while not f.chunk_at(eng.k, 10**12, ()):
                plain["whole iteration"]()
            t0 = time.perf_counter()
            for _ in range(2):
                f.run_chunk(unroll)
                bare_compiled()
            warm = time.perf_counter() - t0
            t = {"fused iteration": [], "bare step": [], "bare step, compiled": []}
            for _ in range(reps):
                t["fused iteration"].append(
                    per_call_us(lambda f=f: f.run_chunk(unroll), n_chunks) / unroll)
                t["bare step"].append(per_call_us(bare_plain, calls))
                t["bare step, compiled"].append(per_call_us(bare_compiled, calls))
        med = {k: statistics.median(v) for k, v in t.items()}
        print(f"  {label}: fused iteration {med['fused iteration']:.1f}, bare step "
              f"{med['bare step']:.1f}, bare step compiled {med['bare step, compiled']:.1f}; "
              f"fused / bare {med['fused iteration'] / med['bare step']:.2f}x, fused / bare "
              f"compiled {med['fused iteration'] / med['bare step, compiled']:.2f}x "
              f"(compilations {warm:.1f} s)")


def pieces(run) -> dict:
    """name -> a zero-argument call timing one piece (state carried between calls)."""
    eng = run.engine
    holder = {"it": eng.step()}

    def iteration():
        it = eng.step()
        for a in run.adaptors:
            eng.apply(a.observe(it))
        for r in run.recorders.values():
            r.record(it)
        holder["it"] = it

    def bare():
        b, h = eng.slot_params(eng.schedule), eng.slot_params(eng.step_size)
        eng.explorer.step(eng.state, b, h, eng.density, Noise(eng.seed, eng.k, eng.R, eng.P,
                                                               eng.device))

    out = {"whole iteration": iteration, "engine.step": lambda: holder.update(it=eng.step()),
           "bare explorer step": bare}
    for a in run.adaptors:
        out[f"adaptor {a.name}"] = (lambda a=a: a.observe(holder["it"]))
    for name, r in run.recorders.items():
        out[f"recorder {name}"] = (lambda r=r: r.record(holder["it"]))
    return out


def per_call_us(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def aten_ops(fn, n: int = 50) -> float:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(n):
            fn()
    return sum(e.count for e in prof.key_averages() if e.key.startswith("aten::")) / n


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--calls", type=int, default=1000, help="calls per timing")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.reps, args.calls = 2, 50
    torch.set_num_threads(1)
    total = (args.reps * 2 + 2) * args.calls * 12 + 1000
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread; medians of "
          f"{args.reps} interleaved repeats of {args.calls} calls; us per call")
    for label, cfg in configs(total).items():
        run = build(cfg)
        for r in run.recorders.values():
            r.start_segment(True, total)
        run.recorders["draws"].initial(run.engine.slot_of)
        calls = pieces(run)
        for _ in range(200):
            calls["whole iteration"]()
        times = {(name, mode): [] for name in calls for mode in ("plain", "inference")}
        for _ in range(args.reps):
            for mode in ("plain", "inference"):
                ctx = torch.inference_mode() if mode == "inference" else contextlib.nullcontext()
                with ctx:
                    for name, fn in calls.items():
                        times[name, mode].append(per_call_us(fn, args.calls))
        print(f"\n{label}   (autograd_free: {run.engine.autograd_free})")
        print(f"  {'piece':28s} {'plain':>9s} {'inference':>10s}")
        for name in calls:
            print(f"  {name:28s} {statistics.median(times[name, 'plain']):9.1f} "
                  f"{statistics.median(times[name, 'inference']):10.1f}")
        with torch.inference_mode(run.engine.autograd_free):
            print(f"  aten ops per whole iteration (nested included): "
                  f"{aten_ops(calls['whole iteration']):.0f}")
    fused_against_bare(args.reps, args.calls)
    x = torch.randn(1, 16, 10_000, dtype=torch.float64)
    side_by_side("\nfiniteness of a proposal [1, 16, 10^4] float64",
                 {"isfinite(x).all(-1)": lambda: torch.isfinite(x).all(-1),
                  "isfinite(x.sum(-1))": lambda: torch.isfinite(x.sum(-1))}, args)
    # the mix25 target's squared distances (benchmarks/peers/mix25_nrpt.py): torch's CPU sum
    # over a last axis of length 2 against the explicit sum of the two coordinates
    d = torch.randn(256, 25, 2, dtype=torch.float64)
    side_by_side("sum over the last axis of [256, 25, 2] float64",
                 {"d.sum(-1)": lambda: d.sum(-1),
                  "d[..., 0] + d[..., 1]": lambda: d[..., 0] + d[..., 1]}, args)
    # torch's CPU exp of arguments below -708 (they underflow) against arguments in range: the
    # mix25 target floors its logsumexp exponents at -700 below the maximum for this reason
    gen = torch.Generator().manual_seed(0)
    wide = -1250.0 * torch.rand(256, 25, dtype=torch.float64, generator=gen)
    near = -30.0 * torch.rand(256, 25, dtype=torch.float64, generator=gen)
    side_by_side("exp of [256, 25] float64",
                 {"arguments in [-1250, 0]": lambda: wide.exp(),
                  "arguments in [-30, 0]": lambda: near.exp()}, args)
    # the whole mix25 log-likelihood: the textbook form against the target's eager form
    target = Mix25()
    pts = 7.0 * (2.0 * torch.rand(256, 2, dtype=torch.float64, generator=gen) - 1.0)
    centres = target._centres

    def textbook():
        d2 = ((pts[:, None, :] - centres) ** 2).sum(-1)
        return torch.logsumexp(-0.5 * d2 / target.sigma**2, dim=-1) + target._const

    assert torch.equal(textbook(), target.log_likelihood(pts))  # the same numbers
    side_by_side("mix25 log-likelihood of [256, 2] float64",
                 {"broadcast, sum(-1), logsumexp": textbook,
                  "benchmarks/peers/mix25_nrpt.py": lambda: target.log_likelihood(pts)}, args)


def side_by_side(title: str, calls: dict, args) -> None:
    """Print the median µs per call of each of ``calls``, timed in interleaved repeats."""
    res = {k: [] for k in calls}
    for _ in range(args.reps):
        for k, fn in calls.items():
            res[k].append(per_call_us(fn, args.calls))
    print(f"{title}: " + ", ".join(f"{k} {statistics.median(v):.1f} us"
                                   for k, v in res.items()))

if __name__ == "__main__":
    main()
