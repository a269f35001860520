"""What a process pays before its first compiled iteration, cold and warm (``make bench-compile``).

Each repetition starts fresh processes (``OMP_NUM_THREADS=1``) running the headline
(:data:`nrpt.run.sgpt.HEADLINE`) with ``fuse = 16, compile = true`` for 64 iterations
(figures off, no burn-in), and times inside the child, in wall time and CPU time
(``time.process_time``):

* ``import``  importing torch and nrpt;
* ``first``   the first compiled chunk of 16 iterations (Dynamo's trace, inductor from its
  cache or from scratch, the loading of the compiled code, one run of it);
* ``steady``  a later chunk (the same 16 iterations compiled, no compilation);
* ``overhead`` = ``first`` - ``steady``: what the process paid before its first compiled
  iteration beyond running it;
* ``before``  from the start of ``execute`` to the end of the first compiled chunk (the 16 plain
  iterations before it included);
* ``process`` the whole child process, timed by this process: wall, and CPU with the
  compiler's subprocesses (g++, inductor's workers), which ``process_time`` does not count.

Arms, interleaved in a rotating order within each repetition:

* ``cold``  an empty ``NRPT_COMPILE_CACHE`` (every cache of inductor and AOTAutograd empty),
  ``torch.compile`` (``NRPT_PRECOMPILE=0``);
* ``warm``  the per-machine cache, filled by one priming process before the repetitions,
  ``torch.compile`` (``NRPT_PRECOMPILE=0``: inductor's caches, Dynamo's trace in every process);
* ``aot``   nrpt's saved chunk (the default since issue 24's third session,
  :mod:`nrpt.core.precompile`): a ``.pt2`` exported and compiled by AOTInductor in the priming
  process, found by nrpt's key and loaded with torch's C++ loader;
* ``aot-cold`` an empty cache with the saved chunk on: the export and AOTInductor's compile;
* ``baseline`` (``--baseline DIR``) warm, with another checkout's ``src`` (an older nrpt keeps
  torch's cache folder: the child gets ``TORCHINDUCTOR_CACHE_DIR`` = its own primed folder);
* ``precompile`` (``--precompile``) torch 2.13's experimental caching precompile
  (``TORCH_CACHING_PRECOMPILE=1``: Dynamo's trace saved and loaded too, with the plain
  ``inductor`` backend; its own primed cache).  nrpt does not use it: it drops the guards on
  objects' identities (torch logs each dropped guard), so a graph could be reused for a
  changed target without a word.

Usage: ``python benchmarks/compile_cache.py [--reps 5] [--arms cold,warm,aot] [--precompile]
[--json FILE]``.  Medians and per-repetition figures are printed; a cold process takes about a
minute on two loaded cores.
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

CHILD = r"""
import time, json, os, sys
W0, C0 = time.perf_counter(), time.process_time()
if os.environ.get("BENCH_PRECOMPILE") == "1":
    os.environ["TORCH_CACHING_PRECOMPILE"] = "1"
import torch
import nrpt.core.fused as fused
from nrpt.core.loop import execute
from nrpt.run.build import build
from nrpt.run.config import RunConfig
from nrpt.run.sgpt import HEADLINE
if os.environ.get("BENCH_PRECOMPILE") == "1":
    fused.deferred_inductor = "inductor"  # (the precompile records inductor's artifacts)
W1, C1 = time.perf_counter(), time.process_time()
run = build(RunConfig.from_dict({"compile": True, "fuse": 16, "iterations": 64,
                                 "figures": False, "burn_in": 0}, defaults=HEADLINE))
f = run.fused
marks = []
inner = f.run_chunk
def timed(U):
    a, ca = time.perf_counter(), time.process_time()
    out = inner(U)
    marks.append((time.perf_counter() - a, time.process_time() - ca, time.perf_counter(),
                  time.process_time()))
    return out
f.run_chunk = timed
W2, C2 = time.perf_counter(), time.process_time()
execute(run)
if os.environ.get("BENCH_PRECOMPILE") == "1":  # (writes the Dynamo packages to the cache)
    torch.compiler.save_cache_artifacts()
from torch._dynamo.utils import counters
print(json.dumps({"precompiled": f.describe().get("precompiled"),
    "counters": {k: dict(v) for k, v in counters.items()
                               if k in ("dynamo_cache", "inductor", "aot_autograd")},
    "import_s": W1 - W0, "import_cpu": C1 - C0,
    "first_s": marks[0][0], "first_cpu": marks[0][1],
    "steady_s": min(m[0] for m in marks[1:]), "steady_cpu": min(m[1] for m in marks[1:]),
    "before_s": marks[0][2] - W2, "before_cpu": marks[0][3] - C2,
    "failed": f.failed, "chunks": f.chunks}))
"""


def child(env_extra: dict) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", **env_extra)
    src = env.pop("BENCH_SRC", None) or str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    if "TORCHINDUCTOR_CACHE_DIR" not in env_extra:
        env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    w0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                         text=True, check=False)
    wall = time.perf_counter() - w0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    line = [s for s in out.stdout.splitlines() if s.startswith("{")]
    if out.returncode or not line:
        raise RuntimeError(f"child failed ({out.returncode}):\n{out.stderr[-3000:]}")
    r = json.loads(line[-1])
    r["overhead_s"] = r["first_s"] - r["steady_s"]
    r["overhead_cpu"] = r["first_cpu"] - r["steady_cpu"]
    # the whole process, with the compiler's subprocesses (g++, inductor's workers) that
    # process_time does not count
    r["process_s"] = wall
    r["process_cpu"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return r


def hits(r: dict) -> str:
    """The caches a child hit or missed (torch's counters)."""
    c = r.get("counters", {})
    keys = {"inductor": ("fxgraph_cache_hit", "fxgraph_cache_miss"),
            "dynamo_cache": ("dynamo_cache_hit", "dynamo_cache_miss")}
    return " ".join(f"{k} {c[g][k]}" for g, ks in keys.items() for k in ks
                    if k in c.get(g, {}))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--arms", default="cold,warm,aot")
    ap.add_argument("--precompile", action="store_true", help="add torch's caching precompile")
    ap.add_argument("--baseline", default=None,
                    help="another checkout: adds the arm 'baseline', warm, with its src/")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    arms = a.arms.split(",") + (["precompile"] if a.precompile else []) + \
        (["baseline"] if a.baseline else [])
    with tempfile.TemporaryDirectory(prefix="nrpt-compile-bench-") as tmp:
        warm = os.path.join(tmp, "warm")
        pre = os.path.join(tmp, "precompile")
        envs = {"warm": {"NRPT_COMPILE_CACHE": warm, "NRPT_PRECOMPILE": "0"},
                "aot": {"NRPT_COMPILE_CACHE": os.path.join(tmp, "aot"), "NRPT_PRECOMPILE": "1"},
                "precompile": {"NRPT_COMPILE_CACHE": pre, "BENCH_PRECOMPILE": "1",
                               "NRPT_PRECOMPILE": "0"}}
        if a.baseline:
            envs["baseline"] = {"TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, "baseline"),
                                "BENCH_SRC": str(Path(a.baseline).resolve() / "src")}
        for arm in arms:  # priming processes (not timed)
            if arm in envs:
                print(f"priming {arm} ...", flush=True)
                child(envs[arm])
        rows: dict = {arm: [] for arm in arms}
        for rep in range(a.reps):
            order = arms[rep % len(arms):] + arms[:rep % len(arms)]
            for arm in order:
                env = envs.get(arm) or {"NRPT_COMPILE_CACHE": os.path.join(tmp, f"{arm}{rep}"),
                                        "NRPT_PRECOMPILE": "1" if arm == "aot-cold" else "0"}
                r = child(env)
                rows[arm].append(r)
                print(f"rep {rep} {arm:10s} overhead {r['overhead_s']:7.2f} s wall "
                      f"{r['overhead_cpu']:7.2f} s CPU | process {r['process_s']:6.2f} s wall "
                      f"{r['process_cpu']:6.2f} s CPU | before first compiled chunk "
                      f"{r['before_s']:7.2f} s wall | import {r['import_s']:.2f} s | steady "
                      f"chunk {1e3 * r['steady_s']:.2f} ms | failed {r['failed']} | {hits(r)} "
                      f"| precompiled {r.get('precompiled')}",
                      flush=True)
    keys = ("overhead_s", "overhead_cpu", "before_s", "before_cpu", "process_s", "process_cpu",
            "import_s", "import_cpu", "steady_s")
    med = {arm: {k: statistics.median(r[k] for r in rs) for k in keys}
           for arm, rs in rows.items()}
    print(f"\nmedians over {a.reps} repetitions (one thread; seconds)")
    print(f"load average at the end: {os.getloadavg()[0]:.2f} (the machine is shared)")
    print(f"{'arm':12s}" + "".join(f"{k:>14s}" for k in keys))
    for arm in arms:
        print(f"{arm:12s}" + "".join(f"{med[arm][k]:14.3f}" for k in keys))
    for a_, b_ in (("warm", "cold"), ("precompile", "warm"), ("aot", "warm"),
                   ("aot-cold", "cold")):
        if a_ in med and b_ in med:
            print(f"{a_} / {b_} overhead: {med[a_]['overhead_s'] / med[b_]['overhead_s']:.3f} "
                  f"wall, {med[a_]['overhead_cpu'] / med[b_]['overhead_cpu']:.3f} CPU; whole "
                  f"process {med[a_]['process_s'] / med[b_]['process_s']:.3f} wall, "
                  f"{med[a_]['process_cpu'] / med[b_]['process_cpu']:.3f} CPU; before the first "
                  f"compiled chunk {med[a_]['before_s'] / med[b_]['before_s']:.3f} wall, "
                  f"{med[a_]['before_cpu'] / med[b_]['before_cpu']:.3f} CPU")
            paired = sorted(x["before_cpu"] / y["before_cpu"]
                            for x, y in zip(rows[a_], rows[b_], strict=True))
            print(f"  paired {a_} / {b_} before-first-chunk CPU ratios (rep by rep): "
                  f"{', '.join(f'{r:.3f}' for r in paired)}")
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "medians": med}, indent=1))


if __name__ == "__main__":
    main()
