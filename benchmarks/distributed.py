"""Cost of spreading replicas over processes (nrpt.core.sharding, gloo on CPU).

Two workloads, each timed in 1, 2 and 4 processes side by side in one run:

* **cheap** — the 25-mode 2-D target with RWMH, DEO, P in {8, 64, 256}: the explorer costs next
  to nothing, so the time per iteration is the engine's and the communication's (one
  ``all_gather`` of the per-replica scalars and one of the slot-0 row per iteration).  The ratio
  to one process is the price of communication.
* **expensive** — a 10-d target whose energy makes 32 or 256 elementwise passes over a
  ``[n, 4096]`` hidden layer (compute-bound per replica), P = 8, RWMH: exploration dominates,
  and each process evaluates only its block of replicas, so the ratio shows the throughput gain
  (bounded by the number of cores).

Each process runs the full loop (explore, gather, swap, recorders; no run folder), warms up,
then times ``--iterations`` iterations; the configurations are interleaved and repeated
``--repeats`` times and the medians are reported.  Process start-up (imports, ``gloo``
rendezvous) is not in the figures; it is printed separately.  One thread per process.

Run:  make bench-distributed     (or: python benchmarks/distributed.py)
      python benchmarks/distributed.py --iterations 50 --repeats 1 --chains 8   (smoke test)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


class Heavy:
    """A 10-d target whose energy costs ``depth`` elementwise passes over a ``[n, 4096]`` hidden
    layer per evaluation: a cost proportional to the rows evaluated, set by one knob
    (``--split-check`` shows that halving the rows per process halves it here)."""

    dim = 10

    def __init__(self, depth: int = 32, width: int = 4096):
        self.depth = int(depth)
        self.name = f"heavy-{self.depth}"
        g = torch.Generator().manual_seed(0)
        self.A = torch.randn(self.dim, width, generator=g, dtype=torch.float64) / width ** 0.5

    def energy(self, x):
        z = x @ self.A
        for _ in range(self.depth):
            z = torch.sin(z) + 0.5 * z
        return 0.5 * (x * x).sum(-1) + 1e-3 * z.sum(-1)


def worker(spec: dict) -> None:
    from nrpt.core import sharding as distributed
    from nrpt.core.loop import execute
    from nrpt.run.build import build
    from nrpt.run.config import RunConfig

    torch.set_num_threads(1)
    t_start = time.perf_counter()
    comm = distributed.from_env("cpu")
    ready = time.perf_counter() - t_start
    results = []
    if comm is not None:  # the latency of one small all_gather (what an iteration pays twice)
        t = torch.zeros(1, 4, 6, dtype=torch.float64)
        for _ in range(20):
            comm.gather_replicas(t, 4 * comm.world)
        t0 = time.perf_counter()
        for _ in range(200):
            comm.gather_replicas(t, 4 * comm.world)
        results.append({"kind": "all_gather", "P": 0, "rep": 0,
                        "per_it_s": (time.perf_counter() - t0) / 200})
    for rep in range(spec["repeats"]):
        for case in spec["cases"]:
            target = Heavy(depth=spec["depth"]) if spec["depth"] else None
            cfg = RunConfig(target="twenty-five-modes" if target is None else target.name,
                            chains=case["P"], iterations=spec["iterations"], explorer="rwmh",
                            scheme="deo", seed=rep, step_size=0.05 if target else 0.5,
                            figures=False)
            warm = build(cfg.replace(iterations=spec["warmup"]), target=target, comm=comm)
            execute(warm)  # warm-up: first-call paths, allocator
            run = build(cfg, target=target, comm=comm)
            per_it = execute(run).wall_time_s / spec["iterations"]
            results.append({**case, "rep": rep, "per_it_s": per_it})
    if comm is None or comm.rank == 0:
        Path(spec["result"]).write_text(json.dumps({"results": results, "startup_s": ready}))


def _time_energy(rows: int, depth: int, out=None) -> float:
    torch.set_num_threads(1)
    target = Heavy(depth=depth)
    x = torch.randn(rows, target.dim, dtype=torch.float64)
    target.energy(x)
    t0 = time.perf_counter()
    for _ in range(20):
        target.energy(x)
    dt = (time.perf_counter() - t0) / 20
    if out is not None:
        out.put(dt)
    return dt


def split_check(depth: int) -> None:
    """Does splitting the rows over two processes split the energy's cost on this machine?"""
    import multiprocessing as mp

    one = _time_energy(8, depth)
    q = mp.get_context("fork").Queue()
    procs = [mp.get_context("fork").Process(target=_time_energy, args=(4, depth, q))
             for _ in range(2)]
    for p in procs:
        p.start()
    both = [q.get() for _ in procs]
    for p in procs:
        p.join()
    print(f"heavy-{depth} energy: 8 rows in one process {1e3 * one:.1f} ms; 4 rows in each of "
          f"two concurrent processes {1e3 * both[0]:.1f} and {1e3 * both[1]:.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--chains", type=int, nargs="+", default=[8, 64, 256])
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--expensive-iterations", type=int, default=100)
    ap.add_argument("--depth", type=int, nargs="+", default=[32, 256],
                    help="hidden-layer passes per energy of the expensive target (one workload "
                         "each)")
    ap.add_argument("--only", choices=["cheap", "expensive"], default=None)
    ap.add_argument("--split-check", action="store_true",
                    help="only time the heavy energy on 8 rows in one process and on 4 rows in "
                         "each of two concurrent processes (no nrpt, no communication)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    if args.split_check:
        split_check(args.depth[0])
        return
    from nrpt.core.sharding import spawn

    print(f"machine: {os.cpu_count()} CPU cores, torch {torch.__version__}, one thread per "
          f"process, gloo; medians of {args.repeats} repeats")
    table: dict = {}
    startup = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = [("cheap", args.chains, args.iterations, 0)]
        work += [("expensive", [8], args.expensive_iterations, nd) for nd in args.depth]
        for kind, chains, iters, depth in work:
            if args.only and kind != args.only:
                continue
            for n in args.procs:
                cases = [{"kind": kind if not depth else f"heavy-{depth}", "P": P}
                         for P in chains if P >= n]
                spec = {"cases": cases, "iterations": iters, "warmup": args.warmup,
                        "repeats": args.repeats, "depth": depth,
                        "result": str(Path(tmp) / f"{kind}{depth}-{n}.json")}
                cmd = [sys.executable, __file__, "--worker", json.dumps(spec)]
                t0 = time.perf_counter()
                env = dict(os.environ, OMP_NUM_THREADS="1")
                code = (subprocess.run(cmd, env=env).returncode if n == 1 else spawn(n, cmd))
                if code != 0:
                    raise SystemExit(f"worker with {n} processes failed ({code})")
                data = json.loads(Path(spec["result"]).read_text())
                startup[(cases[0]["kind"], n)] = (time.perf_counter() - t0, data["startup_s"])
                for r in data["results"]:
                    table.setdefault((r["kind"], r["P"], n), []).append(r["per_it_s"])
    print(f"\n{'workload':<10} {'P':>4} {'procs':>5} {'ms / iteration':>15} {'vs 1 process':>13}")
    for (kind, P, n), times in sorted(table.items()):
        med = statistics.median(times)
        if kind == "all_gather":
            print(f"{'gather':<10} {'-':>4} {n:>5} {1e3 * med:>15.3f}   (one all_gather of "
                  f"[1, 4, 6] float64 per rank)")
            continue
        one = statistics.median(table[(kind, P, 1)]) if (kind, P, 1) in table else float("nan")
        print(f"{kind:<10} {P:>4} {n:>5} {1e3 * med:>15.3f} {med / one:>12.2f}x")
    print("(cheap: the 25-mode 2-D target; heavy-D: D passes over a [n, 4096] layer per "
          "energy)")
    print("\nwhole worker process (start-up, rendezvous, all repeats): "
          + ", ".join(f"{k} x{n}: {t:.1f} s (group ready after {s:.2f} s)"
                      for (k, n), (t, s) in startup.items()))


if __name__ == "__main__":
    main()
