"""The headline loop against its NumPy yardstick, paired: ``make bench-headline-loop``.

    python benchmarks/headline_loop.py [--trees A/src B/src] [--pairs 5] [--iterations 20000]

Issue 24's goal "headline loop <= 2x the minimal NumPy implementation without compilation",
measured alone (``benchmarks/headline.py`` times it among the compiled kinds and the whole
processes, which take minutes).  ``--pairs`` pairs a tree, each in a fresh process (one torch
thread, ``OMP_NUM_THREADS=1``; with two trees the processes alternate A, B, B, A, ...) that
warms both up and then runs, in alternating order (NumPy first in even pairs), the yardstick
``headline_numpy.simulate`` (its loop and its statistics) and nrpt's default headline run
built and executed in process (``headline.run_nrpt_loop``: the loop's own clock
``wall_time_s``, eager chunks); CPU time (``time.process_time``) is taken around each as
well (nrpt's includes its build, a few ms).  Printed per tree: the medians and the per-pair
ratios nrpt / NumPy (median [min-max]), wall and CPU; with two trees, the per-pair ratio of
nrpt's loop between them.
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
import json, sys, time
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(1)
import headline as hl
import headline_numpy as hn
K, i, seed = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
hn.simulate(200, 99); hl.run_nrpt_loop(200, 99)  # warm-up
out = {"numpy_wall": [], "numpy_cpu": [], "nrpt_wall": [], "nrpt_cpu": []}
for kind in (("numpy", "nrpt") if i % 2 == 0 else ("nrpt", "numpy")):
    c = time.process_time()
    if kind == "numpy":
        t0 = time.perf_counter(); hn.simulate(K, seed + i); w = time.perf_counter() - t0
    else:
        w = hl.run_nrpt_loop(K, seed + i)["time_s"]  # (the loop's own clock)
    out[kind + "_cpu"].append(time.process_time() - c)
    out[kind + "_wall"].append(w)
print(json.dumps(out))
"""


def child(src: str, K: int, i: int, seed: int) -> dict:
    """Pair ``i`` (seed ``seed + i``) in a fresh process running the nrpt of ``src``."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=src)
    out = subprocess.run([sys.executable, "-c", CHILD, str(HERE), str(K), str(i),
                          str(seed)], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", nargs="+", default=[str(HERE.parent / "src")])
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    med = statistics.median
    trees = args.trees[:2]
    got: dict[str, dict[str, list[float]]] = {t: {} for t in trees}
    for i in range(args.pairs):
        for t in (trees if i % 2 == 0 else trees[::-1]):
            for k, v in child(t, args.iterations, i, args.seed).items():
                got[t].setdefault(k, []).extend(v)
    print(f"headline loop, {args.iterations} iterations, {args.pairs} interleaved pairs a "
          f"tree, one thread; load average {os.getloadavg()[0]:.2f} at the end")
    for t, r in got.items():
        for clock in ("wall", "cpu"):
            ratio = [a / b for a, b in zip(r[f"nrpt_{clock}"], r[f"numpy_{clock}"], strict=True)]
            print(f"  {t}  {clock:4s}: nrpt {med(r[f'nrpt_{clock}']):7.3f} s, NumPy "
                  f"{med(r[f'numpy_{clock}']):6.3f} s; nrpt / NumPy {med(ratio):.2f} "
                  f"[{min(ratio):.2f}-{max(ratio):.2f}]")
    if len(got) == 2:
        a, b = got.values()
        for clock in ("wall", "cpu"):
            r = [y / x for x, y in zip(a[f"nrpt_{clock}"], b[f"nrpt_{clock}"], strict=True)]
            print(f"  nrpt loop, second / first tree, {clock}: {med(r):.3f} "
                  f"[{min(r):.3f}-{max(r):.3f}]")


if __name__ == "__main__":
    main()
