"""What a compiled run pays before it falls back, this tree against another checkout.

A banana target whose ``b`` is a NumPy float64 (a guard torch.compile cannot hold under the
loop's inference mode) run with ``fuse = true, compile = true`` for 64 iterations, each run a
fresh process with an empty inductor cache (``TORCHINDUCTOR_CACHE_DIR`` a new folder), the two
trees interleaved (A, B, B, A, ...).  Printed per process: wall and CPU time with the
compiler's subprocesses (timed by this process), the loop's own wall and CPU time, and the
fallback's reason.

Usage: ``python benchmarks/compile_fallback.py --baseline CHECKOUT [--reps 5]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r'''
import time, warnings
import numpy as np, torch
from nrpt.core.loop import execute
from nrpt.run.build import build
from nrpt.run.config import RunConfig
class Banana:
    name = "banana"; dim = 2
    def __init__(self, b): self.b = b
    def energy(self, x):
        x1, x2 = x[..., 0], x[..., 1]
        return x1 ** 2 / 8.0 + (x2 - self.b * (x1 ** 2 - 4.0)) ** 2 / 2.0
cfg = RunConfig(target="banana", chains=4, systems=2, explorer="rwmh", iterations=64,
                figures=False, burn_in=0, seed=3, fuse=True, compile=True)
r = build(cfg, target=Banana(np.float64(0.5)))
W1, C1 = time.perf_counter(), time.process_time()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    execute(r)
print("RESULT", f"loop {time.perf_counter() - W1:.1f} s wall {time.process_time() - C1:.1f} s CPU",
      "|", r.fused.failed[:90])
'''


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", required=True, help="another checkout (its src/ is used)")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args(argv)
    srcs = {"base": str(Path(a.baseline).resolve() / "src"),
            "new": str(Path(__file__).resolve().parents[1] / "src")}
    rows: dict = {"base": [], "new": []}
    for rep in range(a.reps):
        for arm in (("base", "new") if rep % 2 == 0 else ("new", "base")):
            with tempfile.TemporaryDirectory(prefix="nrpt-fallback-") as d:
                env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=srcs[arm],
                           TORCHINDUCTOR_CACHE_DIR=d)
                b, t = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
                out = subprocess.run([sys.executable, "-c", CHILD], env=env,
                                     capture_output=True, text=True, check=False)
                wall, e = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = e.ru_utime - b.ru_utime + e.ru_stime - b.ru_stime
            res = [s for s in out.stdout.splitlines() if s.startswith("RESULT")]
            print(rep, arm, f"process {wall:.1f} s wall {cpu:.1f} s CPU (with compilers)",
                  res[-1] if res else out.stderr[-800:], flush=True)
            rows[arm].append((wall, cpu))
    for arm, rs in rows.items():
        print(arm, "median process", round(statistics.median(x[0] for x in rs), 1), "s wall",
              round(statistics.median(x[1] for x in rs), 1), "s CPU")
    print("paired CPU ratios new / base",
          [round(n[1] / b[1], 3) for n, b in zip(rows["new"], rows["base"], strict=True)],
          f"(load average {os.getloadavg()[0]:.2f}; the machine is shared)")


if __name__ == "__main__":
    main()
