"""The run folder of a deep run: ``config.json``, ``summary.json``, ``metrics.csv`` (one row per
evaluation epoch), ``index.npy`` (PT methods), ``models/index.json`` (the listing of the collected
models, streamed to ``models/`` during the run: :class:`nrpt.deep.store.ModelStore`, for
:meth:`DeepResult.predict_proba` after the fact) and the figures
``index_process.png``, ``slot_accuracy.png``, ``reliability.png``; every file written
atomically (:func:`nrpt.run.folder.atomic_write` / :func:`~nrpt.run.folder.atomic_path`).
``run.json``, ``strategy.json``, ``pretrained.pt`` (and its sidecar) and the checkpoints are
written by :func:`nrpt.deep.fit`."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from nrpt.recorders.stats import json_ready
from nrpt.run import folder as rf

__all__ = ["write_folder"]


def write_folder(res, out: Path, x_test, y_test, figures: bool = True) -> None:
    out = Path(out)
    rf.atomic_write(out / "config.json", json.dumps(res.config.to_dict(), indent=2), sync=False)
    rf.atomic_write(out / "summary.json", json.dumps(json_ready(res.summary), indent=2),
                    sync=False)
    rows = res.metrics
    if rows:
        keys = sorted({k for r in rows for k in r}, key=lambda k: (k != "iteration", k))
        with rf.atomic_path(out / "metrics.csv") as tmp, open(tmp, "w", newline="") as fh:
            w = csv.DictWriter(fh, keys)
            w.writeheader()
            for r in rows:
                w.writerow({k: json.dumps(v) if isinstance(v, list) else v
                            for k, v in r.items()})
    if res.index is not None:
        with rf.atomic_path(out / "index.npy") as tmp:
            np.save(tmp, res.index)
    if res.store is not None:
        res.store.write_index()
    if figures:
        _figures(res, out, x_test, y_test)


def _figures(res, out: Path, x_test, y_test) -> None:
    import matplotlib

    matplotlib.use("Agg")
    for name, draw in (("index_process.png", _index_process_figure),
                       ("slot_accuracy.png", _slot_accuracy_figure),
                       ("reliability.png", _reliability_figure)):
        fig = draw(res, x_test, y_test)
        if fig is not None:
            _save(fig, out / name)


def _save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    with rf.atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def _index_process_figure(res, x_test, y_test):
    import matplotlib.pyplot as plt

    if res.index is None or not res.index.size:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.2))
    idx = res.index
    for r in range(idx.shape[1]):
        ax.plot(idx[:, r], lw=0.7)
    ax.set(xlabel="iteration", ylabel="slot (0 = lowest learning rate)",
           title=f"index process ({res.config.method}, W = {res.summary.get('window')})")
    return fig


def _slot_accuracy_figure(res, x_test, y_test):
    import matplotlib.pyplot as plt

    rows = [r for r in res.metrics if "slot_accuracy" in r]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.2))
    it = [r["iteration"] for r in rows]
    acc = np.array([r["slot_accuracy"] for r in rows])
    for p in range(acc.shape[1]):
        ax.plot(it, acc[:, p], label=f"slot {p}")
    bma = [r.get("bma_accuracy") for r in rows]
    if any(b is not None for b in bma):
        ax.plot(it, [np.nan if b is None else b for b in bma], "k--", label="BMA")
    ax.set(xlabel="iteration", ylabel="test accuracy", title="accuracy per slot")
    ax.legend(fontsize=6, ncol=2)
    return fig


def _reliability_figure(res, x_test, y_test):
    import matplotlib.pyplot as plt

    from nrpt.deep.metrics import reliability

    if res.store is None or not len(res.store) or res.targets is not None:  # regression: no classes
        return None
    probs = res.predict_proba(x_test)
    rel = reliability(probs, y_test.to(probs.device))
    fig, ax = plt.subplots(figsize=(3.6, 3.6))
    conf = [np.nan if c is None else c for c in rel["confidence"]]
    accs = [np.nan if a is None else a for a in rel["accuracy"]]
    ax.plot([0, 1], [0, 1], "k:", lw=0.8)
    ax.plot(conf, accs, "o-")
    ax.set(xlabel="confidence", ylabel="accuracy",
           title=f"reliability (ECE {res.summary.get('ece', float('nan')):.3f})")
    return fig
