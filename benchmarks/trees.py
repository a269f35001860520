"""The same work on two source trees of nrpt, interleaved: is a refactor slower?

    python benchmarks/trees.py OLD_SRC NEW_SRC [--reps 5] [--iterations 20000]

Each repetition runs, for each tree (the order alternates between repetitions), in a fresh
process with one thread and ``PYTHONPATH=<tree>/src`` (the same interpreter and packages):

* ``headline``  the whole ``nrpt run`` process on its default (DEO*-SGD x P16, figures on),
                ``--iterations`` iterations, and the loop's own ``wall_time_s`` from summary.json;
* ``mix25``     the peer benchmark's nrpt runner (``benchmarks/peers/run_nrpt.py --variant
                fixed`` and ``adaptive``, 2000 iterations): whole-process time.

Printed: medians of wall and CPU time (user + system of the child) per tree and their ratio
new / old with the range over repetitions.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def timed(cmd: list[str], src: Path) -> tuple[float, float, str]:
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, out


def work(src: Path, iterations: int) -> dict[str, float]:
    got: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        wall, cpu, _ = timed([sys.executable, "-m", "nrpt", "run", "--out", str(out),
                              "--iterations", str(iterations), "--no-progress"], src)
        loop = json.loads((out / "summary.json").read_text())["wall_time_s"]
        got.update({"headline wall": wall, "headline cpu": cpu, "headline loop": loop})
    for variant in ("fixed", "adaptive"):
        wall, cpu, _ = timed([sys.executable, str(HERE / "peers" / "run_nrpt.py"), "--variant",
                              variant, "--iterations", "2000", "--seed", "1"], src)
        got.update({f"mix25 {variant} wall": wall, f"mix25 {variant} cpu": cpu})
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=20000)
    a = ap.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for rep in range(a.reps):
        order = ("old", "new") if rep % 2 == 0 else ("new", "old")
        for which in order:
            runs[which].append(work(getattr(a, which), a.iterations))
        print(f"repetition {rep + 1}/{a.reps} done", flush=True)
    print(f"{'measure':24s} {'old (s)':>9s} {'new (s)':>9s} {'new/old':>8s}  range")
    for key in runs["old"][0]:
        old = [r[key] for r in runs["old"]]
        new = [r[key] for r in runs["new"]]
        ratios = [n / o for n, o in zip(new, old, strict=True)]
        print(f"{key:24s} {statistics.median(old):9.3f} {statistics.median(new):9.3f} "
              f"{statistics.median(ratios):8.3f}  [{min(ratios):.3f}-{max(ratios):.3f}]")


if __name__ == "__main__":
    main()
