"""The fixed cost of an iteration on a small state: full step / bare explorer step, two trees.

    python benchmarks/fixed_cost.py [--trees A/src B/src] [--pairs 5] [--explorers rwmh,mala]

For each explorer, on the diagonal Gaussian of ``benchmarks/scaling.py`` at d = 2 (``--dim``),
P = 16, one system (its :class:`scaling.Point`: a run built by ``nrpt.run.build`` and run by
``nrpt.core.loop.execute``, the default eager chunks, against ``engine.explorer.step`` alone),
each tree in a fresh process, the trees interleaved (A, B, B, A, ...) for ``--pairs`` pairs.
A process warms up, then times ``full`` and ``bare`` interleaved 3 times each (``--n``
iterations a timing, wall by ``perf_counter`` and CPU by ``process_time``) and reports their
medians.  Printed: per tree the medians over processes of full us, bare us and full / bare
(wall and CPU), and the per-pair ratio of full between the trees.  One torch thread.

``--slope``: full per iteration as ``(run(n) - run(n / 5)) / (4 n / 5)`` against ``4 n / 5``
bare steps (a run's own set-up and summary, ~20 ms, cancel: at d = 10^4 they are a few per cent
of 100 iterations).

``--noise-d 10000``: instead, the bare step at that d (P = 16) with ``noise_dtype`` float64 and
float32 (the last tree), interleaved in one process, ``--n`` steps a timing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r"""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(1)
import scaling
explorer, n, d, slope = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
p = scaling.Point(explorer, 16, d, 1, 10)
p.run(n); p.bare(n)  # warm
res = {"full_wall": [], "full_cpu": [], "bare_wall": [], "bare_cpu": []}
def timed(fn, m):
    c, w = time.process_time(), time.perf_counter()
    fn(m)
    return time.process_time() - c, time.perf_counter() - w
for _ in range(3):
    for kind in ("full", "bare"):
        if kind == "full" and slope:  # (a run's own set-up and summary cancel)
            (c0, w0), (c1, w1) = timed(p.run, n // 5), timed(p.run, n)
            c, w, m = c1 - c0, w1 - w0, n - n // 5
        else:
            m = n - n // 5 if slope else n
            c, w = timed(p.run if kind == "full" else p.bare, m)
        res[kind + "_cpu"].append(c / m * 1e6)
        res[kind + "_wall"].append(w / m * 1e6)
print(json.dumps({k: statistics.median(v) for k, v in res.items()}))
"""


def child(src: str, explorer: str, n: int, d: int = 2, slope: bool = False) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=src)
    out = subprocess.run([sys.executable, "-c", CHILD, str(HERE), explorer, str(n), str(d),
                          "1" if slope else "0"],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


NOISE = r"""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(1)
import scaling
from nrpt.explorers import MALA, RWMH
explorer, d, n, pairs = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
p = scaling.Point(explorer, 16, d, 1, 10)
make = {"rwmh": RWMH, "mala": MALA}[explorer]
res = {k: [] for k in ("float64_wall", "float64_cpu", "float32_wall", "float32_cpu")}
for rep in range(pairs + 1):
    for dt in (("float64", "float32") if rep % 2 == 0 else ("float32", "float64")):
        p.engine.explorer = make(noise_dtype=dt)
        c, w = time.process_time(), time.perf_counter()
        p.bare(n)
        if rep:  # (the first pair warms up)
            res[dt + "_cpu"].append((time.process_time() - c) / n * 1e6)
            res[dt + "_wall"].append((time.perf_counter() - w) / n * 1e6)
print(json.dumps(res))
"""


def noise(args) -> None:
    """The bare explorer step at d = ``--noise-d`` with float64 and float32 proposal noise,
    interleaved in one process (``--pairs`` pairs, the order alternating)."""
    med = statistics.median
    for explorer in args.explorers.split(","):
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=args.trees[-1])
        out = subprocess.run([sys.executable, "-c", NOISE, str(HERE), explorer,
                              str(args.noise_d), str(args.n), str(args.pairs)], env=env,
                             capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        for clock in ("wall", "cpu"):
            ratio = [a / b for a, b in zip(r[f"float64_{clock}"], r[f"float32_{clock}"],
                                           strict=True)]
            print(f"{explorer}, d = {args.noise_d}, P = 16, bare step, {clock}: float64 noise "
                  f"{med(r[f'float64_{clock}']):.0f} us, float32 {med(r[f'float32_{clock}']):.0f}"
                  f" us; float64 / float32 {med(ratio):.2f} [{min(ratio):.2f}-{max(ratio):.2f}]")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", nargs="+", default=[str(HERE.parent / "src")])
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--n", type=int, default=2000, help="iterations per timing")
    ap.add_argument("--explorers", default="rwmh,mala")
    ap.add_argument("--dim", type=int, default=2, help="the Gaussian's dimension d")
    ap.add_argument("--slope", action="store_true",
                    help="full per iteration as the difference of runs of n and n / 5 "
                         "iterations over 4n / 5 (a run's set-up and summary cancel; large d)")
    ap.add_argument("--noise-d", type=int, default=0,
                    help="instead: the bare step at this d with float64 / float32 noise")
    args = ap.parse_args(argv)
    if args.noise_d:
        return noise(args)
    med = statistics.median
    for explorer in args.explorers.split(","):
        got: dict[str, list[dict]] = {t: [] for t in args.trees}
        for rep in range(args.pairs):
            for t in (args.trees if rep % 2 == 0 else args.trees[::-1]):
                got[t].append(child(t, explorer, args.n, args.dim, args.slope))
        print(f"{explorer}, d = {args.dim}, P = 16, R = 1: medians of {args.pairs} processes "
              f"(each the median of 3 interleaved timings of {args.n} iterations), us per "
              f"iteration")
        for t, rs in got.items():
            for clock in ("wall", "cpu"):
                full = med(r[f"full_{clock}"] for r in rs)
                bare = med(r[f"bare_{clock}"] for r in rs)
                ratio = [r[f"full_{clock}"] / r[f"bare_{clock}"] for r in rs]
                print(f"  {t}  {clock:4s}: full {full:7.1f}  bare {bare:6.1f}  full / bare "
                      f"{med(ratio):.2f} [{min(ratio):.2f}-{max(ratio):.2f}]")
        if len(args.trees) == 2:
            a, b = args.trees
            for clock in ("wall", "cpu"):
                r = [y[f"full_{clock}"] / x[f"full_{clock}"]
                     for x, y in zip(got[a], got[b], strict=True)]
                print(f"  full, second / first tree, {clock}: {med(r):.3f} "
                      f"[{min(r):.3f}-{max(r):.3f}]")


if __name__ == "__main__":
    main()
