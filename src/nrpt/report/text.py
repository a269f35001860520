"""Reports of a run: :func:`format_row` / :data:`ROW_HEADER` (the per-segment rows of
``report.txt`` / ``rounds.csv``), :func:`write_figures`, :func:`export_inference_data`
(``posterior.nc``, :mod:`nrpt.report.posterior_file`)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np

from nrpt.diagnostics.density import iid_floor
from nrpt.targets.protocol import capabilities

__all__ = ["ROW_HEADER", "format_row", "TABLE", "write_round_table", "write_figures",
           "export_inference_data"]


def export_inference_data(path, **kwargs):
    """:func:`nrpt.report.posterior_file.write_inference_data` (imported here, at the call: a
    run without an output folder never loads the module)."""
    from nrpt.report.posterior_file import write_inference_data

    return write_inference_data(path, **kwargs)


_COLUMNS = [("round", "round", "{:>5d}"), ("iterations", "iters", "{:>8d}"),
            ("restarts", "restarts", "{:>8.1f}"), ("round_trips", "trips", "{:>7.1f}"),
            ("barrier", "Λ̂", "{:>7.3f}"), ("log_normalizer", "log Z", "{:>10.2f}"),
            ("min_swap_acceptance", "min acc", "{:>7.3f}"),
            ("mean_swap_acceptance", "mean acc", "{:>8.3f}"), ("wall_s", "time s", "{:>8.2f}")]

#: the header of the per-round table
ROW_HEADER = " ".join(f"{label:>{len(fmt.format(0 if 'd' in fmt else 0.0))}}"
                      for _, label, fmt in _COLUMNS)


def format_row(row: dict[str, Any]) -> str:
    """One round as a line under :data:`ROW_HEADER` (mean over systems)."""
    cells = []
    for key, _, fmt in _COLUMNS:
        v = row.get(key)
        if v is None or (isinstance(v, float) and not np.isfinite(v)):
            width = len(fmt.format(0 if "d" in fmt else 0.0))
            cells.append(f"{'n/a':>{width}}")
        else:
            cells.append(fmt.format(int(v) if "d" in fmt else float(v)))
    return " ".join(cells)


#: what :func:`nrpt.core.loop.execute` prints its per-round rows with (``table=``)
TABLE = (ROW_HEADER, format_row)


def write_round_table(rows: list[dict[str, Any]], path: str | Path) -> None:
    """``rounds.csv``: one row per round with the columns of :data:`ROW_HEADER`."""
    keys = [k for k, _, _ in _COLUMNS]
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        for row in rows:
            w.writerow(row)


# ------------------------------------------------------------------------------ figures
def write_figures(out: Path, *, run, summary: dict, samples: np.ndarray, index: np.ndarray,
                  rows: list[dict], which: bool | str = "all") -> list[str]:
    """Write the figures of :mod:`nrpt.report.figures` that apply to the run into ``out``; returns
    their file names (``density.png``, ``index_process.png``, ``swap_acceptance.png``,
    ``adaptation.png``, and for adaptive runs ``local_barrier.png``, ``schedules.png``; with
    ``which="all"`` also ``trace.png`` and ``rank.png``, which ``which=True`` --
    ``figures = true`` -- leaves out: a third of the figures' cost for what the summary's ESS
    and R-hat already say).  A run draws them at its end only with ``figures = true`` / ``all``;
    :func:`nrpt.figures` draws the same files later from its folder.

    ``which=True`` also leaves out ``swap_acceptance.png`` where ``adaptation.png`` is drawn
    (stochastic-approximation runs): its last panel draws every pair's swap rate over the
    run, and the printed report and ``summary.json`` give the per-pair acceptance; and the
    index process's zoom panel (its last iterations at full resolution: a close-up of the
    panel above it).  Each was a twentieth of the figures' cost (docs/benchmarks.md,
    "Outputs, third pass")."""
    from nrpt.report import figures as plots

    out = Path(out)
    written: list[str] = []
    target = run.engine.target
    has = capabilities(target).has

    def save(fig, name):
        plots.save(fig, out / name)
        written.append(name)

    x = samples if samples.ndim == 2 else samples[0]
    if x.shape[0] and x.shape[1] in (1, 2):
        save(plots.density(x, target if has("density_grid") else None,
                           tv_floor=_tv_floor(target, x, summary, has)), "density.png")
    if which == "all" and samples.size and samples.shape[-2] >= 4:  # slot 0: one chain per system
        names = _coordinate_names(target, samples.shape[-1])
        save(plots.trace(samples, names=names), "trace.png")
        save(plots.rank(samples, names=names), "rank.png")
    boundaries = [r["first_iteration"] for r in rows[1:]]
    save(plots.index_process(index, boundaries=boundaries or None,
                             boundary_label="segment boundary",
                             zoom="auto" if which == "all" else None), "index_process.png")
    trace = run.recorders.get("trace")
    adapted = trace is not None and bool(trace.k)
    acc = _floats(summary.get("swap_acceptance") or [])
    if acc.size and (which == "all" or not adapted):
        save(plots.swap_acceptance(acc.reshape(run.engine.R, -1)), "swap_acceptance.png")
    if adapted:
        arrays = trace.arrays()
        save(plots.adaptation(arrays["k"], arrays.get("C"), arrays.get("learning_rates"),
                              arrays.get("pair_rate"), summary.get("swap_rate_target"),
                              window=summary.get("window")), "adaptation.png")
    if "local_barrier" in summary:
        save(_local_barrier_figure(plots, target, has, summary, rows), "local_barrier.png")
        sched = [np.asarray(r["b"][0], dtype=float) for r in rows]  # (ragged: auto chains)
        save(plots.schedules(sched, summary["local_barrier"]["coordinate"]), "schedules.png")
    return written


def _floats(values) -> np.ndarray:
    """``values`` flattened to floats, None as NaN."""
    return np.asarray([np.nan if v is None else v for v in np.ravel(values)], dtype=float)


def _tv_floor(target, x: np.ndarray, summary: dict, has) -> float | None:
    """The TV of as many exact iid draws as ``x`` (the density figure's sample) on a 2-D
    target's ``density_grid`` (``has``: its :meth:`~nrpt.targets.protocol.Capabilities.has`),
    else None; a failure is recorded in the summary."""
    if not (has("density_grid") and x.shape[1] == 2):
        return None
    try:
        grid = target.density_grid()
        return iid_floor(x.shape[0], *grid)["tv"] if len(grid) == 3 else None
    except Exception as err:  # noqa: BLE001 -- recorded in the summary, never hidden
        summary.setdefault("figure_errors", []).append(
            f"density.png: the iid TV floor could not be computed: {type(err).__name__}: {err}")
        return None


def _local_barrier_figure(plots, target, has, summary: dict, rows):
    """System 0's local barrier (``plots``: :mod:`nrpt.report.figures`): the fit (on the dense
    grid where it can be refitted), the Method I points and the exact barrier where the target
    has ``local_barrier`` (``has``: its :meth:`~nrpt.targets.protocol.Capabilities.has`)."""
    lb = summary["local_barrier"]
    grid = np.asarray(lb["grid"], dtype=float)
    values = np.asarray(lb["values"], dtype=float)
    values = values if values.ndim == 1 else values[0]
    mi = summary.get("local_barrier_method_i") or {}
    at = np.asarray(mi.get("at", []), dtype=float)
    m1 = _floats(mi.get("values", [])).reshape(at.shape) if at.size else None
    dense = _dense_local_barrier(rows, summary)
    if dense is not None:  # the fit on a grid that also resolves small beta (log axis)
        grid, values = dense
    exact = None
    if has("local_barrier") and lb["coordinate"] == "beta":
        exact = np.asarray(target.local_barrier(grid), dtype=float)
    return plots.local_barrier(grid, values, at if at.size else None, m1, lb["coordinate"],
                               exact=exact)  # [R, P] Method I points: drawn at system 0


def _coordinate_names(target, dim: int) -> list[str] | None:
    """Names of the state's coordinates where the target gives them (``coordinate_names``, a
    value of the protocol -- a list or a method giving one -- read here), else None (``x[j]``)."""
    names = getattr(target, "coordinate_names", None)
    try:
        names = list(names() if callable(names) else names) if names is not None else None
    except TypeError:
        return None
    return names if names and len(names) == dim else None


#: the same, public (the summary's ``tail-acceptance`` input names its coordinates with it)
coordinate_names = _coordinate_names


def _dense_local_barrier(rows, summary):
    """System 0's fitted local barrier (:func:`nrpt.adapt.schedule.fit_barrier` on the last
    round's schedule and swap rejections, as the summary's) on 201 evenly spaced points plus
    200 log-spaced ones down to the smallest positive schedule point, so a log axis shows the
    fit near ``beta = 0``; None where the inputs are missing."""
    from nrpt.adapt.schedule import fit_barrier

    acc = summary.get("swap_acceptance")
    if not rows or "b" not in rows[-1] or acc is None:
        return None
    b = np.asarray(rows[-1]["b"], dtype=float)
    b = b if b.ndim == 1 else b[0]
    a = _floats(acc)
    a = a[:b.size - 1] if a.size >= b.size - 1 else None
    if a is None:
        return None
    fit = fit_barrier(b, np.nan_to_num(1.0 - a, nan=0.0))
    lo, hi = float(fit.lo), float(fit.hi)
    pos = b[b > 0]
    grid = np.linspace(lo, hi, 201)
    if pos.size and pos.min() > lo and hi > 0:
        grid = np.union1d(grid, np.geomspace(pos.min(), hi, 200))
    return grid, np.asarray(fit.local(grid), dtype=float)
