"""What the outputs of the headline ``nrpt run`` cost (``make bench-outputs``).

Runs the whole process ``nrpt run --out TMP --no-progress --overwrite`` (the headline,
:data:`nrpt.run.sgpt.HEADLINE`; figures only with ``--figures true|all``: from stop 39 on
a run draws none by default) ``--reps`` times and reads from each run's
``summary.json`` the seconds its outputs took (``outputs_s``: the summary, then posterior.nc with
the other array files, then the figures; wall and CPU each), against the whole process (wall
from fork to exit, CPU = user + system of the child from ``os.wait4``).  With ``--trees A/src
B/src`` (two checkouts, e.g. the commit before a change and after it) each repeat runs both
trees' ``nrpt run``, interleaved (A, B, B, A, ...), and prints each tree's outputs share and the
ratios B / A of the whole process and of the outputs (medians of the per-pair ratios, wall and
CPU).  ``--against SRC`` is ``--trees SRC THIS/src``.

Usage: ``python benchmarks/outputs.py [--reps 5] [--iterations 20000] [--trees A B |
--against SRC] [--figures true|all]``.  One torch thread (``OMP_NUM_THREADS=1``) in every
child.
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
    ap.add_argument("--trees", nargs="+", type=Path, default=None,
                    help="one or two checkouts' src (default: this one), interleaved")
    ap.add_argument("--against", type=Path, default=None,
                    help="another checkout's src: --trees AGAINST THIS/src")
    ap.add_argument("--figures", default=None,
                    help="--figures for every tree's runs (default: none given, each tree's "
                         "own default: false from stop 39 on, true before)")
    args = ap.parse_args(argv)
    trees = args.trees or ([args.against, SRC] if args.against is not None else [SRC])
    if len(trees) > 2:
        ap.error(f"--trees takes one or two source trees; got {len(trees)}")
    got: dict[Path, list[dict]] = {t: [] for t in trees}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for rep in range(args.reps):
            for t in (trees if rep % 2 == 0 else trees[::-1]):
                got[t].append(whole_run(t, tmp, args.iterations, args.figures))
    med = statistics.median
    print(f"headline nrpt run, {args.iterations} iterations, {args.reps} repeats "
          f"(interleaved), medians [range]; one thread")

    def total(r, clock):
        return sum(v[clock] for v in r["outputs"].values())

    for t, rs in got.items():
        print(f"  {t}: figures {rs[0]['figures']}")
        for clock in ("wall", "cpu"):
            whole = [r[f"{clock}_s"] for r in rs]
            parts = {k: [r["outputs"][k][clock] for r in rs] for k in rs[0]["outputs"]}
            share = [total(r, clock) / r[f"{clock}_s"] for r in rs]
            print(f"    {clock:4s}: whole process {med(whole):6.2f} s; outputs "
                  f"{med(total(r, clock) for r in rs):5.2f} s = {100 * med(share):4.1f} % "
                  f"[{100 * min(share):.1f}-{100 * max(share):.1f}] ("
                  + ", ".join(f"{k} {med(v):.2f}" for k, v in parts.items()) + ")")
    if len(trees) == 2:
        a, b = trees
        for clock in ("wall", "cpu"):
            for what, f in (("whole process", lambda r, c=clock: r[f"{c}_s"]),
                            ("outputs", lambda r, c=clock: total(r, c))):
                ratio = [f(y) / f(x) for x, y in zip(got[a], got[b], strict=True)]
                print(f"  {clock:4s}: {what} second / first tree: {med(ratio):.3f} "
                      f"[{min(ratio):.3f}-{max(ratio):.3f}]")


if __name__ == "__main__":
    main()
