"""Memory and checkpoint size of a deep run against the number of models it collects.

Each count runs in a fresh process: ``nrpt.deep.fit`` of a ~277k-parameter MLP (1.1 MB of
float32 per model), ``method="ensemble"`` with 2 chains, a model collected from each chain at
every iteration (``collect_every=1``, ``burn_in=0``, no pretraining), so a run of ``n``
iterations collects ``2 n`` models; then ``predict_proba`` on the test set.  It reports:

* ``peak_rss_mb``: the process's peak resident set (``VmHWM``) minus its resident set before the
  run (after imports and a warm-up fit);
* ``rss_anon_after_mb``: anonymous memory (tensors, Python objects) after the run and
  ``predict_proba``, minus before;
* ``checkpoint_bytes``: the final ``checkpoint.pt``; ``models_bytes``: the models on disk
  (``models/`` now, ``models.pt`` in the old layout).

``--old-src DIR`` runs the same counts with another nrpt source tree first (e.g. a checkout of
the commit before the model store) for a side-by-side table.

The anonymous memory of the new layout steps up once between small counts and then stays flat:
glibc's adaptive mmap threshold keeps freed multi-megabyte buffers (the per-collection
serialisation, the chunks ``predict_proba`` reads) in the heap; run with
``MALLOC_MMAP_THRESHOLD_=131072`` to see the flat figure without it.

Usage: ``python benchmarks/deep_memory.py [--counts 10 40 120] [--old-src DIR]``.  One torch
thread; the machine's other load does not change memory figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def status() -> dict[str, float]:
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "VmHWM"):
                out[key] = int(value.split()[0]) / 1024.0
    return out


def child(iterations: int, out: str) -> dict:
    import torch
    from torch import nn

    torch.set_num_threads(1)
    from nrpt.deep import fit

    def model():
        with torch.random.fork_rng():
            torch.manual_seed(0)
            return nn.Sequential(nn.Linear(16, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                                 nn.Linear(512, 10))

    g = torch.Generator().manual_seed(0)
    X = torch.randn(128, 16, generator=g)
    y = torch.randint(0, 10, (128,), generator=g)
    train, test = (X[:64], y[:64]), (X[64:], y[64:])
    opts = dict(method="ensemble", chains=2, batch_size=32, strategy="loop", pretrain_epochs=0,
                burn_in=0.0, collect_every=1, eval_every=1000, checkpoint_every=100000)
    fit(model(), train, test, epochs=1, **opts)  # imports and warm-up
    before = status()
    res = fit(model(), train, test, out=out, epochs=iterations / 2, **opts)
    res.predict_proba(test[0])
    after = status()
    folder = Path(out)
    models = (sum(p.stat().st_size for p in (folder / "models").iterdir())
              if (folder / "models").is_dir() else (folder / "models.pt").stat().st_size)
    return {"models_collected": res.summary["models_collected"],
            "peak_rss_mb": round(after["VmHWM"] - before["VmRSS"], 1),
            "rss_anon_after_mb": round(after["RssAnon"] - before["RssAnon"], 1),
            "checkpoint_bytes": (folder / "checkpoint.pt").stat().st_size,
            "models_bytes": models}


def run(counts, src: str) -> list[dict]:
    rows = []
    for n in counts:
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}
            out = subprocess.run([sys.executable, __file__, "--child", str(n), str(Path(tmp) /
                                  "run")], env=env, capture_output=True, text=True, check=False)
            if out.returncode:
                raise SystemExit(out.stderr[-2000:])
            rows.append({"iterations": n, **json.loads(out.stdout.strip().splitlines()[-1])})
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--counts", type=int, nargs="+", default=[10, 40, 120])
    p.add_argument("--old-src", default=None, help="another nrpt source tree, run first")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child(int(a.child[0]), a.child[1])))
        return
    tables = []
    if a.old_src:
        tables.append(("old", run(a.counts, a.old_src)))
    tables.append(("new", run(a.counts, str(HERE.parent / "src"))))
    print(f"{'tree':5} {'models':>7} {'peak RSS MB':>12} {'anon after MB':>14} "
          f"{'checkpoint B':>13} {'models on disk B':>17}")
    for tag, rows in tables:
        for r in rows:
            print(f"{tag:5} {r['models_collected']:7d} {r['peak_rss_mb']:12.1f} "
                  f"{r['rss_anon_after_mb']:14.1f} {r['checkpoint_bytes']:13d} "
                  f"{r['models_bytes']:17d}")
    print(json.dumps({tag: rows for tag, rows in tables}))


if __name__ == "__main__":
    main()
