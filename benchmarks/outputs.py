"""What the outputs of the headline ``nrpt run`` cost (``make bench-outputs``).

Runs the whole process ``nrpt run --out TMP --no-progress --overwrite`` (the headline,
:data:`nrpt.run.sgpt.HEADLINE`, figures on) ``--reps`` times and reads from each run's
``summary.json`` the seconds its outputs took (``outputs_s``: the summary, then posterior.nc with
the other array files, then the figures; wall and CPU each), against the whole process (wall
from fork to exit, CPU = user + system of the child from ``os.wait4``).  With ``--against SRC``
(another checkout's ``src``, e.g. the commit before a change) each repeat runs that tree's
``nrpt run`` too, interleaved (A, B, A, B, ...; the order alternates every repeat), and the
whole-process ratio B / A is reported (median of the per-pair ratios, wall and CPU).

Usage: ``python benchmarks/outputs.py [--reps 5] [--iterations 20000] [--against SRC]
[--figures true|all]``.  One torch thread (``OMP_NUM_THREADS=1``) in every child.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"

sys.path.insert(0, str(HERE))
from headline import LAUNCHER  # noqa: E402  (fork, exec, wall and rusage of the child)


def whole_run(src: Path, tmp: Path, iterations: int, figures: str | None) -> dict:
    """One headline ``nrpt run`` process with ``src`` first on the path."""
    out = tmp / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(src))
    cmd = [sys.executable, "-m", "nrpt", "run", "--out", str(out), "--no-progress",
           "--overwrite", "--iterations", str(iterations)]
    if figures is not None:
        cmd += ["--figures", figures]
    report = tmp / "launcher.json"
    res = subprocess.run([sys.executable, "-I", "-S", "-c", LAUNCHER, str(report), *cmd],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    got = json.loads(report.read_text())
    if got["rc"] != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {got['rc']}: "
                           f"{res.stderr.decode()[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    got["outputs"] = summary.get("outputs_s")
    got["loop_s"] = summary.get("wall_time_s")
    got["figures"] = summary.get("figures")
    return got


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=20_000)
    ap.add_argument("--against", type=Path, default=None,
                    help="another checkout's src: its whole process, interleaved")
    ap.add_argument("--figures", default=None, help="--figures for this tree's runs")
    args = ap.parse_args(argv)
    mine: list[dict] = []
    base: list[dict] = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for rep in range(args.reps):
            order = ["mine", "base"] if rep % 2 == 0 else ["base", "mine"]
            for who in order:
                if who == "mine":
                    mine.append(whole_run(SRC, tmp, args.iterations, args.figures))
                elif args.against is not None:
                    base.append(whole_run(args.against, tmp, args.iterations, None))
    med = statistics.median
    print(f"headline nrpt run, {args.iterations} iterations, {args.reps} repeats, medians; "
          f"one thread; figures: {mine[0]['figures']}")
    for clock in ("wall", "cpu"):
        whole = [r[f"{clock}_s"] for r in mine]
        parts = {k: [r["outputs"][k][clock] for r in mine] for k in mine[0]["outputs"]}
        total = [sum(r["outputs"][k][clock] for k in r["outputs"]) for r in mine]
        share = [t / w for t, w in zip(total, whole, strict=True)]
        print(f"  {clock:4s}: whole process {med(whole):6.2f} s; outputs {med(total):5.2f} s = "
              f"{100 * med(share):4.1f} % [{100 * min(share):.1f}-{100 * max(share):.1f}] ("
              + ", ".join(f"{k} {med(v):.2f}" for k, v in parts.items()) + ")")
    if base:
        for clock in ("wall", "cpu"):
            ratio = [m[f"{clock}_s"] / b[f"{clock}_s"] for m, b in zip(mine, base, strict=True)]
            print(f"  {clock:4s}: whole process this tree / {args.against}: "
                  f"{med(ratio):.3f} [{min(ratio):.3f}-{max(ratio):.3f}] "
                  f"({med(m[f'{clock}_s'] for m in mine):.2f} s vs "
                  f"{med(b[f'{clock}_s'] for b in base):.2f} s)")


if __name__ == "__main__":
    main()
