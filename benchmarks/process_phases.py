"""Where the headline ``nrpt run`` process spends its CPU outside the loop, tree against tree.

    python benchmarks/process_phases.py [--trees A/src B/src] [--pairs 5] [--iterations 20000]
        [--figures true|false|all]

Each tree runs ``nrpt run --out TMP --no-progress --overwrite`` (the default headline; its
figures with ``--figures true``, the default before stop 39) in fresh processes, alternating
A, B, B, A, ... (one torch thread, ``OMP_NUM_THREADS=1``).
The process is the program as ``python -m nrpt`` starts it (``nrpt.run.cli.entry`` where the
tree has it, else ``main``), with a few functions wrapped to read ``time.process_time`` around
them: ``imports`` (``import nrpt`` and the command line's modules, torch's among them),
``loop`` (``nrpt.core.loop.execute`` less its checkpoints), ``checkpoints``
(``write_checkpoint``, every call), ``outputs`` (``nrpt.run.api._finish``: the summary,
posterior.nc, the figures, summary.json) and ``other`` (the rest of ``main``: the config, the
folder, the build).  ``start + exit`` is the child's CPU (user + system, ``os.wait4``) less
what it measured inside: the interpreter's start and its finalization after ``main`` returned.
``fixed`` = the whole process less ``loop``.  Printed: medians per tree and the per-pair ratio
of the second tree's fixed part to the first's.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r"""
import json, sys, time
c0 = time.process_time()
import nrpt
from nrpt.run import api, cli
import nrpt.core.loop as loop
laps = {"imports": time.process_time() - c0}
def wrap(mod, name, label):
    f = getattr(mod, name)
    def timed(*a, **k):
        c = time.process_time()
        try:
            return f(*a, **k)
        finally:
            laps[label] = laps.get(label, 0.0) + time.process_time() - c
    setattr(mod, name, timed)
wrap(loop, "write_checkpoint", "checkpoints")
wrap(api, "execute", "execute")
wrap(api, "_finish", "outputs")
sys.argv = ["nrpt", *sys.argv[1:]]
c = time.process_time()
code = (cli.entry if hasattr(cli, "entry") else cli.main)()
laps["main"] = time.process_time() - c
laps["inside"] = time.process_time()
with open(REPORT, "w") as fh:
    json.dump(laps, fh)
sys.exit(code)
"""


def one(tree: str, K: int, seed: int, tmp: Path, figures: str | None = None) -> dict:
    sys.path.insert(0, str(HERE))
    import headline as hl

    report = tmp / "phases.json"
    code = CHILD.replace("REPORT", repr(str(report)))
    cmd = [sys.executable, "-c", code, "run", "--out", str(tmp / "run"), "--no-progress",
           "--overwrite", "--seed", str(seed)]
    if K != 20000:
        cmd += ["--iterations", str(K)]
    if figures is not None:
        cmd += ["--figures", figures]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=tree)
    r = hl.launch(cmd, env, tmp)
    if r["rc"] != 0:
        raise SystemExit(f"{tree}: exited with {r['rc']}: {r['stderr']}")
    laps = json.loads(report.read_text())
    ck = laps.get("checkpoints", 0.0)
    out = {"whole": r["cpu_s"], "imports": laps["imports"], "loop": laps["execute"] - ck,
           "checkpoints": ck, "outputs": laps["outputs"],
           "other": laps["main"] - laps["execute"] - laps["outputs"],
           "start + exit": r["cpu_s"] - laps["inside"]}
    out["fixed"] = out["whole"] - out["loop"]
    return out


def main(argv=None) -> None:
    sys.path.insert(0, str(HERE))
    from headline_loop import paired_parser

    args = paired_parser(__doc__).parse_args(argv)
    trees = args.trees[:2]
    for t in trees:  # (as an install would: bytecode written once, not in the timed runs)
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(t) / "nrpt")],
                       check=True)
    got: dict[str, list[dict]] = {t: [] for t in trees}
    with tempfile.TemporaryDirectory(prefix="nrpt-phases-") as tmpdir:
        for i in range(args.pairs):
            for t in (trees if i % 2 == 0 else trees[::-1]):
                got[t].append(one(t, args.iterations, args.seed + i, Path(tmpdir), args.figures))
    med = statistics.median
    print(f"nrpt run (headline, {args.iterations} iterations): CPU seconds by phase, medians of "
          f"{args.pairs} processes a tree, interleaved, one thread; load average "
          f"{os.getloadavg()[0]:.2f} at the end; figures {args.figures or 'the default'}")
    keys = ["whole", "loop", "fixed", "imports", "checkpoints", "outputs", "other",
            "start + exit"]
    print("  " + " " * 28 + "".join(f"{k:>13s}" for k in keys))
    for t, rows in got.items():
        print(f"  {t[-28:]:28s}" + "".join(f"{med([r[k] for r in rows]):13.3f}" for k in keys))
    if len(trees) == 2:
        a, b = got.values()
        for k in ("fixed", "whole"):
            r = [y[k] / x[k] for x, y in zip(a, b, strict=True)]
            print(f"  {k}, second / first tree: {med(r):.3f} [{min(r):.3f}-{max(r):.3f}]")


if __name__ == "__main__":
    main()
