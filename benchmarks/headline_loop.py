"""The headline loop against its NumPy yardstick, paired: ``make bench-headline-loop``.

    python benchmarks/headline_loop.py [--trees A/src B/src] [--pairs 5] [--iterations 20000]
                                       [--fuse N --compile] [--whole [--figures true|false|all]]

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

``--fuse N --compile``: issue 24's second headline goal, "<= 1.0x with compilation (after
compilation)": nrpt's side is the headline with ``fuse = N, compile = true`` in its config, so
a run built wholly from its config, whose compiled chunk nrpt saves once per machine
(:mod:`nrpt.core.precompile`, ``$NRPT_COMPILE_CACHE``) and later processes load.  Before the
pairs, one untimed process per tree builds (or finds) the saved chunk; every timed process
must then report ``precompiled: loaded`` (else the benchmark stops), so its loop clock holds
no compilation, only the saved library's load (milliseconds).

``--whole``: issue 24's third headline goal, "whole process <= 3x the whole NumPy script":
instead of the loops, the whole ``python -m nrpt run --out TMP --no-progress --overwrite``
(imports, build, loop, checkpoints, summary, posterior file; figures with ``--figures
true``, the default before stop 39) against the whole
``python benchmarks/headline_numpy.py --out TMP`` (imports, run, statistics, records), each a
fresh process started by ``headline.launch`` (wall from the fork to the exit, CPU = the child's
user + system time), alternating in order pair by pair.  nrpt's sources and this folder are
byte-compiled first, as an install would (this environment may set PYTHONDONTWRITEBYTECODE,
and a process would otherwise compile nrpt's ~70 modules from source each time; torch's and
NumPy's bytecode was written when pip installed them); ``--no-byte-compile`` skips that.
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
K, i, seed, fuse = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
kw = {"compiled": True, "unroll": fuse, "configured": True} if fuse else {}
hn.simulate(200, 99); warm = hl.run_nrpt_loop(200, 99, **kw)  # warm-up
out = {"numpy_wall": [], "numpy_cpu": [], "nrpt_wall": [], "nrpt_cpu": [],
       "precompiled": [warm["precompiled"]]}
for kind in (("numpy", "nrpt") if i % 2 == 0 else ("nrpt", "numpy")):
    c = time.process_time()
    if kind == "numpy":
        t0 = time.perf_counter(); hn.simulate(K, seed + i); w = time.perf_counter() - t0
    else:
        got = hl.run_nrpt_loop(K, seed + i, **kw)
        w = got["time_s"]  # (the loop's own clock)
        out["precompiled"].append(got["precompiled"])
    out[kind + "_cpu"].append(time.process_time() - c)
    out[kind + "_wall"].append(w)
print(json.dumps(out))
"""


def child(src: str, K: int, i: int, seed: int, fuse: int = 0) -> dict:
    """Pair ``i`` (seed ``seed + i``) in a fresh process running the nrpt of ``src``
    (``fuse``: nrpt's side with ``fuse = fuse, compile = true``; 0: the default)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=src)
    out = subprocess.run([sys.executable, "-c", CHILD, str(HERE), str(K), str(i),
                          str(seed), str(fuse)], env=env, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _ratios(tree: str, r: dict, a: str, b: str, what: str) -> None:
    """Print a tree's medians of ``nrpt_{clock}`` and ``numpy_{clock}`` (named ``a``, ``b``)
    and the median [range] of their per-pair ratio (``what``), wall and CPU."""
    med = statistics.median
    for clock in ("wall", "cpu"):
        ratio = [x / y for x, y in zip(r[f"nrpt_{clock}"], r[f"numpy_{clock}"], strict=True)]
        print(f"  {tree}  {clock:4s}: {a} {med(r[f'nrpt_{clock}']):7.3f} s, {b} "
              f"{med(r[f'numpy_{clock}']):6.3f} s; {what} {med(ratio):.2f} "
              f"[{min(ratio):.2f}-{max(ratio):.2f}]")


def _between(got: dict, what: str) -> None:
    """With two trees: print the per-pair ratio of nrpt's times, second tree / first."""
    if len(got) != 2:
        return
    med = statistics.median
    a, b = got.values()
    for clock in ("wall", "cpu"):
        r = [y / x for x, y in zip(a[f"nrpt_{clock}"], b[f"nrpt_{clock}"], strict=True)]
        print(f"  {what}, second / first tree, {clock}: {med(r):.3f} "
              f"[{min(r):.3f}-{max(r):.3f}]")


def whole(trees: list[str], pairs: int, K: int, seed: int, byte_compile: bool,
          figures: str | None = None) -> None:
    """The whole processes, ``nrpt run`` against the NumPy script (see ``--whole``)."""
    import tempfile

    sys.path.insert(0, str(HERE))
    import headline as hl

    if byte_compile:
        for t in trees:
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(t) / "nrpt")],
                           check=True)
        subprocess.run([sys.executable, "-m", "compileall", "-q", "-l", str(HERE)], check=True)
    med = statistics.median
    got: dict[str, dict[str, list[float]]] = {t: {} for t in trees}
    with tempfile.TemporaryDirectory(prefix="nrpt-headline-whole-") as tmpdir:
        tmp = Path(tmpdir)
        for i in range(pairs):
            for t in (trees if i % 2 == 0 else trees[::-1]):
                env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=t)
                nrpt_cmd = [sys.executable, "-m", "nrpt", "run", "--out", str(tmp / "run"),
                            "--no-progress", "--overwrite", "--seed", str(seed + i)]
                np_cmd = [sys.executable, str(HERE / "headline_numpy.py"), "--iterations",
                          str(K), "--seed", str(seed + i), "--out", str(tmp / "numpy")]
                if K != 20000:
                    nrpt_cmd += ["--iterations", str(K)]
                if figures is not None:
                    nrpt_cmd += ["--figures", figures]
                for kind in (("numpy", "nrpt") if i % 2 == 0 else ("nrpt", "numpy")):
                    r = hl.launch(np_cmd if kind == "numpy" else nrpt_cmd, env, tmp)
                    if r["rc"] != 0:
                        raise SystemExit(f"{kind} exited with {r['rc']}: {r['stderr']}")
                    got[t].setdefault(f"{kind}_wall", []).append(r["wall_s"])
                    got[t].setdefault(f"{kind}_cpu", []).append(r["cpu_s"])
                    if kind == "nrpt":
                        summary = json.loads((tmp / "run" / "summary.json").read_text())
                        got[t].setdefault("nrpt_loop", []).append(summary["wall_time_s"])
    print(f"headline whole process: nrpt run / NumPy script, {K} iterations, {pairs} "
          f"interleaved pairs a tree, one thread, bytecode {'on' if byte_compile else 'off'}, "
          f"figures {figures or 'the default'}; "
          f"load average {os.getloadavg()[0]:.2f} at the end")
    for t, r in got.items():
        _ratios(t, r, "nrpt run", "NumPy script", "ratio")
        print(f"  {t}  nrpt's loop (wall_time_s) {med(r['nrpt_loop']):.3f} s of its "
              f"{med(r['nrpt_wall']):.3f} s wall")
    _between(got, "nrpt run")


def paired_parser(doc: str) -> argparse.ArgumentParser:
    """The options of a headline benchmark that times two source trees side by side:
    --trees (default: this checkout's), --pairs, --iterations, --seed (also
    benchmarks/process_phases.py)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--trees", nargs="+", default=[str(HERE.parent / "src")])
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--figures", default=None, choices=["true", "false", "all"],
                    help="nrpt run's --figures in the whole processes (default: none given, "
                         "the program's own default: false from stop 39 on, true before)")
    return ap


def main(argv=None) -> None:
    ap = paired_parser(__doc__)
    ap.add_argument("--fuse", type=int, default=0,
                    help="nrpt's side with fuse = N (a chunk length >= 1) and compile = true; "
                         "needs --compile")
    ap.add_argument("--compile", action="store_true",
                    help="with --fuse N: time the compiled chunk after its compilation")
    ap.add_argument("--whole", action="store_true",
                    help="time the whole nrpt run and NumPy script processes instead")
    ap.add_argument("--no-byte-compile", action="store_true",
                    help="with --whole: do not byte-compile nrpt's sources first")
    args = ap.parse_args(argv)
    if args.whole:
        if args.fuse:
            ap.error("--whole times the default nrpt run; it takes no --fuse / --compile")
        whole(args.trees[:2], args.pairs, args.iterations, args.seed, not args.no_byte_compile,
              args.figures)
        return
    if (args.fuse > 0) != args.compile or args.fuse < 0:
        ap.error(f"--fuse N (N >= 1) and --compile go together; got --fuse {args.fuse}"
                 f"{' --compile' if args.compile else ''}")
    trees = args.trees[:2]
    got: dict[str, dict[str, list]] = {t: {} for t in trees}
    if args.fuse:  # (each tree's saved chunk built, or found, before any timing)
        for t in trees:
            warm = child(t, 200, 0, args.seed, args.fuse)["precompiled"]
            print(f"{t}: saved chunk {' then '.join(map(str, warm))}", flush=True)
    for i in range(args.pairs):
        for t in (trees if i % 2 == 0 else trees[::-1]):
            for k, v in child(t, args.iterations, i, args.seed, args.fuse).items():
                got[t].setdefault(k, []).extend(v)
    if args.fuse:
        for t, r in got.items():
            if set(r["precompiled"]) != {"loaded"}:
                raise SystemExit(f"{t}: a timed process did not load the saved chunk: "
                                 f"{sorted(set(map(str, r['precompiled'])))}")
    what = f"fuse = {args.fuse}, compile = true, saved chunk loaded" if args.fuse else \
        "default (eager chunks)"
    print(f"headline loop, {what}, {args.iterations} iterations, {args.pairs} interleaved "
          f"pairs a tree, one thread; load average {os.getloadavg()[0]:.2f} at the end")
    for t, r in got.items():
        _ratios(t, r, "nrpt", "NumPy", "nrpt / NumPy")
    _between(got, "nrpt loop")


if __name__ == "__main__":
    main()
