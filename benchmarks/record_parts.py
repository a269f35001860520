"""Where a full iteration's time goes beyond the explorer: CPU per iteration of each recorder.

    python benchmarks/record_parts.py [--trees A/src B/src] [--pairs 2] [--n 400] [--dim 10000]

For each explorer, the run of ``benchmarks/fixed_cost.py`` (``scaling.Point``: the diagonal
Gaussian at d = ``--dim``, P = 16, one system, the default eager chunks), each tree in a fresh
process, the trees interleaved (A, B, B, A, ...) for ``--pairs`` pairs.  A process runs ``--n``
iterations once to warm up, then 3 times with ``time.process_time`` around each recorder's
``record_block``, the draws' ``close`` and the chunk's function (``body``: the explorer steps
and the swap bookkeeping), and reports the medians over its 3 runs, us per iteration; printed:
per tree the medians over processes.  One torch thread.  (Timers, not a profiler: their own
cost is a few calls a chunk.)
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
import collections, json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(1)
import scaling
import nrpt.core.fused as fused
from nrpt.recorders.draws import Draws
from nrpt.recorders.log_z import SteppingStone
from nrpt.recorders.stats import RoundTrips, SlotSpread, SwapStats
explorer, n, d = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
acc = collections.Counter()

def timed(label, f):
    def g(*a, **k):
        c = time.process_time()
        try:
            return f(*a, **k)
        finally:
            acc[label] += time.process_time() - c
    return g

for cls in (SwapStats, RoundTrips, SteppingStone, SlotSpread, Draws):
    cls.record_block = timed(cls.__name__, cls.record_block)
Draws.close = timed("Draws.close", Draws.close)
plain = fused.Fused._function
fused.Fused._function = lambda self, U, compiled: timed("body", plain(self, U, compiled))
p = scaling.Point(explorer, 16, d, 1, 10)
p.run(n)  # warm
res = collections.defaultdict(list)
for _ in range(3):
    acc.clear()
    c = time.process_time()
    p.run(n)
    res["full"].append((time.process_time() - c) / n * 1e6)
    for k, v in acc.items():
        res[k].append(v / n * 1e6)
print(json.dumps({k: statistics.median(v) for k, v in res.items()}))
"""


def child(src: str, explorer: str, n: int, d: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=src)
    out = subprocess.run([sys.executable, "-c", CHILD, str(HERE), explorer, str(n), str(d)],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", nargs="+", default=[str(HERE.parent / "src")])
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--n", type=int, default=400, help="iterations per run")
    ap.add_argument("--explorers", default="rwmh,mala")
    ap.add_argument("--dim", type=int, default=10_000, help="the Gaussian's dimension d")
    args = ap.parse_args(argv)
    med = statistics.median
    for explorer in args.explorers.split(","):
        got: dict[str, list[dict]] = {t: [] for t in args.trees}
        for rep in range(args.pairs):
            for t in (args.trees if rep % 2 == 0 else args.trees[::-1]):
                got[t].append(child(t, explorer, args.n, args.dim))
        print(f"{explorer}, d = {args.dim}, P = 16, R = 1, {args.n} iterations a run: CPU us "
              f"per iteration, medians of {args.pairs} processes (3 runs each)")
        names = sorted({k for rs in got.values() for r in rs for k in r},
                       key=lambda k: (k != "full", k != "body", k))
        for t, rs in got.items():
            print(f"  {t}: " + ", ".join(f"{k} {med(r.get(k, 0.0) for r in rs):.1f}"
                                          for k in names))


if __name__ == "__main__":
    main()
