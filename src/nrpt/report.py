"""Reports of adaptive runs: per-round rows, figures and an ArviZ InferenceData file.

* :func:`format_row` / :data:`ROW_HEADER` -- the one-line-per-round table printed during a run
  and kept in ``report.txt`` / ``rounds.csv``;
* :func:`write_figures` -- ``index_process.png`` (a few replicas' slot over time, round
  boundaries marked), ``swap_acceptance.png`` (per pair per round), ``local_barrier.png``
  (``lambda(b)`` of the last round, with the Method I cross-check and, for the analytic
  targets, the exact curve) and ``schedules.png`` (the schedule of every round);
* :func:`export_inference_data` -- ``posterior.nc``: the last round's slot-0 draws as the
  ``posterior`` group (``chain`` = PT system), the slot-0 energy as ``sample_stats``, and
  per-slot / per-pair statistics as ``constant_data``, so that ``arviz.summary`` gives ESS and
  R-hat (R-hat needs ``systems >= 2``).

Figures use matplotlib's Agg canvas through :class:`matplotlib.figure.Figure`, never pyplot, so
the user's backend and global state are untouched.
"""

from __future__ import annotations

import csv
import warnings
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ROW_HEADER", "format_row", "write_round_table", "write_figures",
           "export_inference_data", "import_arviz"]

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


def write_round_table(rows: list[dict[str, Any]], path: str | Path) -> None:
    """``rounds.csv``: one row per round with the columns of :data:`ROW_HEADER`."""
    keys = [k for k, _, _ in _COLUMNS]
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        for row in rows:
            w.writerow(row)


# ------------------------------------------------------------------------------ figures
def _figure(width=7.0, height=4.0):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def plot_index_process(index: np.ndarray, boundaries: list[int], path: Path,
                       replicas: int = 4) -> None:
    """Slot over time of the first ``replicas`` replicas of system 0."""
    fig = _figure()
    ax = fig.add_subplot()
    k = np.arange(index.shape[0])
    n_rep = min(replicas, index.shape[2])
    for r in range(n_rep):
        ax.step(k, index[:, 0, r], where="post", lw=0.8, label=f"replica {r}", rasterized=True)
    for b in boundaries:
        ax.axvline(b, color="0.7", lw=0.6, ls="--")
    ax.set_xlabel("iteration (dashed: round boundaries)")
    ax.set_ylabel("slot (0 = target)")
    ax.set_title("index process")
    ax.legend(loc="upper right", fontsize=7, ncols=n_rep)
    fig.savefig(path, dpi=110)


def plot_swap_acceptance(acceptance: np.ndarray, path: Path) -> None:
    """Heat map of the swap acceptance ``[rounds, P-1]`` (system 0)."""
    fig = _figure()
    ax = fig.add_subplot()
    n_rounds, n_pairs = acceptance.shape
    im = ax.imshow(acceptance, aspect="auto", origin="lower", vmin=0.0, vmax=1.0,
                   cmap="viridis", extent=(-0.5, n_pairs - 0.5, 0.5, n_rounds + 0.5))
    fig.colorbar(im, ax=ax, label="mean min(1, α)")
    ax.set_xlabel("pair (p, p+1)")
    ax.set_ylabel("round")
    ax.set_title("swap acceptance per pair per round")
    fig.savefig(path, dpi=110)


def plot_local_barrier(grid: np.ndarray, values: np.ndarray, at: np.ndarray,
                       method_one: np.ndarray, coordinate: str, path: Path,
                       exact=None) -> None:
    """``lambda(b)`` from the fitted cumulative barrier, Method I points, exact curve."""
    fig = _figure()
    ax = fig.add_subplot()
    ax.plot(grid, values, lw=1.5, label="rejection-based (derivative of the fit)")
    ok = np.isfinite(method_one)
    ax.plot(at[ok], method_one[ok], "o", ms=4, label="Method I: ½ E|ℓ(X) − ℓ(Y)|")
    if exact is not None:
        ax.plot(grid, exact, "k--", lw=1.0, label="exact")
    ax.set_xlabel(coordinate)
    ax.set_ylabel("local barrier λ")
    ax.set_title("local communication barrier (last round)")
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)


def plot_schedules(schedules: np.ndarray, coordinate: str, path: Path) -> None:
    """The schedule of every round (system 0): one row of points per round."""
    fig = _figure()
    ax = fig.add_subplot()
    for i, b in enumerate(schedules):
        ax.plot(b, np.full_like(b, i + 1), "|", ms=10, mew=1.2, color="C0")
    ax.set_xlabel(coordinate)
    ax.set_ylabel("round")
    ax.set_title("schedule per round")
    fig.savefig(path, dpi=110)


def write_figures(out: Path, *, index: np.ndarray, stats: list, summary: dict,
                  target=None) -> list[str]:
    """Write the four figures of an adaptive run into ``out``; returns their file names."""
    out = Path(out)
    last = stats[-1]
    boundaries = [st.first_iteration for st in stats[1:]]
    coordinate = summary["local_barrier"]["coordinate"]
    grid = np.asarray(summary["local_barrier"]["grid"], dtype=float)
    values = np.asarray(summary["local_barrier"]["values"], dtype=float)
    values = values if values.ndim == 1 else values[0]
    exact = None
    if target is not None and callable(getattr(target, "local_barrier", None)) and \
            coordinate == "beta":
        exact = np.asarray(target.local_barrier(grid), dtype=float)
    plot_index_process(index, boundaries, out / "index_process.png")
    plot_swap_acceptance(np.stack([1.0 - st.rejection[0] for st in stats]),
                         out / "swap_acceptance.png")
    plot_local_barrier(grid, values, last.schedule[0], last.method_one[0], coordinate,
                       out / "local_barrier.png", exact)
    plot_schedules(np.stack([st.schedule[0] for st in stats]), coordinate,
                   out / "schedules.png")
    return ["index_process.png", "swap_acceptance.png", "local_barrier.png", "schedules.png"]


# ------------------------------------------------------------------------------ ArviZ
def import_arviz():
    """``arviz``, imported with its import-time FutureWarning silenced; None if missing."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import arviz
        except ImportError:
            return None
    return arviz


def export_inference_data(path: str | Path, *, samples: np.ndarray, energies: np.ndarray,
                          stats, summary: dict) -> str | None:
    """Write ``posterior.nc`` (see the module docstring); returns its file name, or None when
    ArviZ is not installed (``pip install nrpt[arviz]``)."""
    az = import_arviz()
    if az is None:
        return None
    x = np.asarray(samples, dtype=float)
    e = np.asarray(energies, dtype=float)
    if x.ndim == 2:  # one system: [n, dim] -> [1, n, dim]
        x, e = x[None], e[None]
    constant = {
        "schedule": stats.schedule, "step_size": stats.step_size,
        "swap_acceptance": 1.0 - stats.rejection, "explorer_acceptance":
            stats.explorer_acceptance, "local_barrier_method_i": stats.method_one,
        "log_normalizer_per_slot": stats.log_normalizer_per_slot,
    }
    dims = {"x": ["x_dim"], "schedule": ["system", "slot"], "step_size": ["system", "slot"],
            "swap_acceptance": ["system", "pair"], "explorer_acceptance": ["system", "slot"],
            "local_barrier_method_i": ["system", "slot"],
            "log_normalizer_per_slot": ["system", "slot"]}
    attrs = {"nrpt_" + k: str(summary.get(k)) for k in (
        "target", "path", "chains", "explorer", "statistics_from", "log_normalizer",
        "log_normalizer_kind", "barrier")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        idata = az.from_dict(posterior={"x": x}, sample_stats={"path_energy": e},
                             constant_data=constant, dims=dims, attrs=attrs)
        idata.to_netcdf(str(path))
    return Path(path).name
