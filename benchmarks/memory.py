"""Resident memory of runs of increasing length: the records stream to the run folder, so the
memory a run holds does not grow with its number of iterations.

Each length runs in a fresh process (``nrpt.sample`` with a run folder, figures off) that reads
``/proc/self/status`` before the run, every 256 iterations during it (the loop's callback) and
after it (summary and posterior.nc written), and reports:

* ``VmRSS`` — resident set: anonymous memory (``RssAnon``: tensors, Python objects, buffers)
  plus the pages of mapped files (``RssFile``: the ``.npy`` records being written, shared
  libraries);
* the peak of each during the loop and the process's lifetime peak (``VmHWM``);
* the records on disk, in bytes and bytes per iteration.

Usage: ``python benchmarks/memory.py`` (default lengths 10k, 100k, 1M; P = 10; the 2-D
``gaussian`` target with rwmh) or ``--lengths 1000 10000`` for a smoke test; ``make
bench-memory``.  The script pins one torch thread.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FIELDS = ("VmRSS", "RssAnon", "RssFile", "VmHWM")


def status() -> dict[str, float]:
    """The :data:`FIELDS` of ``/proc/self/status``, in MB."""
    out: dict[str, float] = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in FIELDS:
                out[key] = int(value.split()[0]) / 1024.0  # kB -> MB
    return out


def child(iterations: int, chains: int, out: str) -> dict:
    import torch

    torch.set_num_threads(1)
    import nrpt

    nrpt.sample("gaussian", chains=2, iterations=300, figures=False)  # imports and warm-up
    before = status()
    peak = dict(before)
    trace: list[tuple[int, float]] = []

    def watch(engine):
        s = status()
        for k in FIELDS:
            peak[k] = max(peak[k], s[k])
        trace.append((engine.k, s["VmRSS"]))

    t0 = time.perf_counter()
    res = nrpt.sample("gaussian", chains=chains, iterations=iterations, seed=0, out=out,
                      figures=False, callback=watch)
    wall = time.perf_counter() - t0
    after = status()
    records = sum((Path(out) / f).stat().st_size
                  for f in ("samples.npy", "energies.npy", "index.npy"))
    # the loop's growth: VmRSS late in the run minus VmRSS early in it (after the first chunk)
    early = [v for k, v in trace if k >= min(4096, iterations // 4)][:1] or [before["VmRSS"]]
    return {"iterations": iterations, "chains": chains, "wall_s": wall,
            "it_per_s": res.summary["iterations_per_s"], "records_bytes": records,
            "before": before, "peak_loop": peak, "after": after,
            "loop_growth_mb": trace[-1][1] - early[0] if trace else 0.0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    p.add_argument("--chains", type=int, default=10)
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.chains, args.out)))
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    print(f"resident memory (MB) of nrpt.sample('gaussian', chains={args.chains}, out=...), "
          f"one fresh process per run")
    head = (f"{'iterations':>10} {'wall s':>7} {'it/s':>6} {'records MB':>10} {'B/it':>5} | "
            f"{'RSS before':>10} {'loop peak':>9} {'growth':>6} {'anon peak':>9} "
            f"{'file peak':>9} {'after':>6} {'VmHWM':>6}")
    print(head)
    print("-" * len(head))
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.lengths:
            out = Path(tmp) / f"run-{n}"
            text = subprocess.run([sys.executable, __file__, "--child", str(n), "--chains",
                                   str(args.chains), "--out", str(out)], env=env, check=True,
                                  capture_output=True, text=True).stdout
            r = json.loads(text.strip().splitlines()[-1])
            b, pk, a = r["before"], r["peak_loop"], r["after"]
            print(f"{n:>10,} {r['wall_s']:>7.1f} {r['it_per_s']:>6.0f} "
                  f"{r['records_bytes'] / 2**20:>10.1f} {r['records_bytes'] / n:>5.1f} | "
                  f"{b['VmRSS']:>10.1f} {pk['VmRSS']:>9.1f} {r['loop_growth_mb']:>6.1f} "
                  f"{pk['RssAnon']:>9.1f} {pk['RssFile']:>9.1f} {a['VmRSS']:>6.1f} "
                  f"{a['VmHWM']:>6.1f}", flush=True)


if __name__ == "__main__":
    main()
