"""Figures of nrpt runs: object-oriented matplotlib only (``pyplot`` is never imported, no
global state), each function returning a :class:`matplotlib.figure.Figure`; :func:`save`
writes PNG.  Inputs are numpy arrays (and a duck-typed ``target`` for exact densities)."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.cm import ScalarMappable
from matplotlib.colors import BoundaryNorm, ListedColormap, Normalize, TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.ticker import Formatter, MaxNLocator

__all__ = ["density", "adaptation", "index_process", "swap_acceptance", "local_barrier",
           "schedules", "trace", "rank", "save"]

# font sizes (points) for figures shown on slides at their saved size
_FS_LABEL = 12
_FS_TITLE = 13
_FS_TICK = 10.5
_FS_LEGEND = 10
_FS_CAPTION = 10.5
_DPI = 150


# ------------------------------------------------------------------------------ helpers
def save(fig: Figure, path: str | Path, dpi: int = _DPI) -> Path:
    """Write ``fig`` to ``path`` (format from the suffix, e.g. ``.png``); returns the path."""
    from nrpt.files import atomic_path

    path = Path(path)
    fmt = path.suffix.lstrip(".").lower() or None
    with atomic_path(path) as tmp:  # a reader never sees half a figure
        if fmt == "png":
            Path(tmp).write_bytes(png_bytes(fig, dpi))
        else:
            fig.savefig(tmp, dpi=dpi, format=fmt)
    return path


def png_bytes(fig: Figure, dpi: int = _DPI) -> bytes:
    """``fig`` drawn by Agg at ``dpi``, as a PNG file's bytes: the pixels ``savefig`` draws
    (8 bits; RGB where every pixel is opaque, as on a figure's white ground, else RGBA) with
    text unhinted, each row stored as its difference from the row above (PNG's "Up" filter)
    and deflated at zlib level 1 (docs/benchmarks.md, "Outputs").

    Plots repeat from row to row, so the files are about the size of Pillow's at level 1,
    written in half its time (Pillow tries five filters on every row).  FreeType's hinting of
    each glyph (the font's TrueType program, matplotlib's default) was a sixth of drawing the
    run's figures; at 150 dpi (22-pixel letters) unhinted text looks the same."""
    import struct
    import zlib

    from matplotlib import rc_context
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas, old_dpi = fig.canvas, fig.dpi
    try:  # (as savefig: the figure keeps its canvas and dpi)
        fig.set_dpi(dpi)
        agg = FigureCanvasAgg(fig)
        with rc_context({"text.hinting": "no_hinting"}):
            agg.draw()
        rgba = np.asarray(agg.buffer_rgba())  # (a view that keeps the renderer alive)
    finally:
        fig.set_canvas(canvas)
        fig.set_dpi(old_dpi)
    h, w = rgba.shape[:2]
    alpha = np.frombuffer(b"\0\0\0\xff", dtype=np.uint32)[0]  # (a pixel's 4th byte, any byte order)
    opaque = bool(((rgba.view(np.uint32) & alpha) == alpha).all())  # (whole pixels: 5x faster)
    c = 3 if opaque else 4  # opaque (every figure's white ground): RGB
    if c == 3:  # each pixel's first 3 bytes, copied as one 3-byte item (numpy copies a
        # [h, w, 3] slice of uint8 byte by byte: 4x slower)
        rgb = np.dtype({"names": ["rgb"], "formats": ["V3"], "offsets": [0], "itemsize": 4})
        pixels = np.ascontiguousarray(rgba.view(rgb)["rgb"]).view(np.uint8).reshape(h, 3 * w)
    else:
        pixels = rgba.reshape(h, 4 * w)
    rows = np.empty((h, 1 + c * w), dtype=np.uint8)
    rows[:, 0] = 2  # filter type "Up" (the row above the first is zeros)
    rows[0, 1:] = pixels[0]
    np.subtract(pixels[1:], pixels[:-1], out=rows[1:, 1:])  # (mod 256; contiguous rows)
    del rgba, pixels
    idat = zlib.compress(rows, 1)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + \
            struct.pack(">I", zlib.crc32(kind + data))

    per_metre = round(dpi / 0.0254)
    return b"".join([b"\x89PNG\r\n\x1a\n",
                     chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2 if c == 3 else 6, 0,
                                                0, 0)),
                     chunk(b"pHYs", struct.pack(">IIB", per_metre, per_metre, 1)),
                     chunk(b"IDAT", idat),
                     chunk(b"IEND", b"")])


def _figure(width: float, height: float) -> Figure:
    return Figure(figsize=(width, height), layout="constrained")


def _fixed(width: float, height: float, *, cols: int = 1, rows: int = 1, left: float = 0.9,
           right: float = 0.25, bottom: float = 0.7, top: float = 0.5, wgap: float = 0.0,
           hgap: float = 0.0) -> Figure:
    """A figure with a fixed layout: margins and gaps between a ``rows`` x ``cols`` grid of
    panels in inches (colorbars then take their room from their panel).  The figures every run
    writes use it: constrained layout measured every text twice and cost a third of their
    drawing (docs/benchmarks.md, "Outputs")."""
    aw = (width - left - right - (cols - 1) * wgap) / cols
    ah = (height - bottom - top - (rows - 1) * hgap) / rows
    if aw <= 0 or ah <= 0:
        raise ValueError(f"a {width} x {height} in figure has no room for {rows} x {cols} "
                         f"panels with these margins")
    fig = Figure(figsize=(width, height))  # (Figure(subplotpars=...) is ignored in 3.11)
    fig.subplots_adjust(left=left / width, right=1.0 - right / width, bottom=bottom / height,
                        top=1.0 - top / height, wspace=wgap / aw, hspace=hgap / ah)
    return fig


def _style(ax, xlabel: str, ylabel: str, title: str | None = None) -> None:
    ax.set_xlabel(xlabel, fontsize=_FS_LABEL)
    ax.set_ylabel(ylabel, fontsize=_FS_LABEL)
    if title:
        ax.set_title(title, fontsize=_FS_TITLE, y=1.0)
    ax.tick_params(labelsize=_FS_TICK)


def _rect(fig: Figure, left: float, bottom: float, width: float, height: float) -> list:
    """``fig.add_axes``' rectangle of a box given in inches from the lower left corner."""
    w, h = fig.get_size_inches()
    return [left / w, bottom / h, width / w, height / h]


def _colorbar(fig: Figure, mappable, ax, label: str, **kwargs):
    cb = fig.colorbar(mappable, ax=ax, **kwargs)
    cb.set_label(label, fontsize=_FS_LABEL)
    cb.ax.tick_params(labelsize=_FS_TICK)
    return cb


def _legend(ax, **kwargs):
    kwargs.setdefault("fontsize", _FS_LEGEND)
    kwargs.setdefault("framealpha", 0.9)
    return ax.legend(**kwargs)


def _wrapped(text: str, width_chars: int) -> str:
    return "\n".join(textwrap.fill(par, width_chars) for par in text.split("\n"))


#: inches per line of caption text (_FS_CAPTION points, matplotlib's 1.2 line spacing)
_CAPTION_LINE = _FS_CAPTION * 1.2 / 72


def _caption(fig: Figure, text: str, width_chars: int) -> None:
    """A caption under the panels (``supxlabel``: constrained layout makes room for it; a fixed
    layout leaves ``_CAPTION_LINE`` inches per line of ``_wrapped(text, width_chars)``)."""
    fig.supxlabel(_wrapped(text, width_chars), fontsize=_FS_CAPTION, x=0.01, y=0.1 /
                  fig.get_figheight(), ha="left", va="bottom", multialignment="left")


def _caption_room(text: str | None, width_chars: int) -> float:
    """Inches under the panels that :func:`_caption` of ``text`` needs (0 without one)."""
    return 0.0 if not text else 0.2 + _CAPTION_LINE * (_wrapped(text, width_chars).count(
        "\n") + 1)


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def _pick_system(a: np.ndarray, ndim_one: int, system: int, name: str) -> np.ndarray:
    """``a`` with ``ndim_one >= 1`` dimensions, or one more with the system axis second (taken
    at ``system``)."""
    a = np.asarray(a, dtype=float)
    if a.ndim == ndim_one + 1:
        if not 0 <= system < a.shape[1]:
            raise ValueError(f"{name}: system {system} out of range (R = {a.shape[1]})")
        return a[:, system]
    if a.ndim != ndim_one:
        raise ValueError(f"{name} must have {ndim_one} or {ndim_one + 1} dimensions; "
                         f"got shape {a.shape}")
    return a


def _lines(ax, x: np.ndarray, ys: np.ndarray, colors, **kwargs) -> None:
    """The columns of ``ys[T, n]`` over ``x[T]`` as one :class:`LineCollection` (one artist,
    not ``n`` lines: drawn alike, a fraction of the cost), line ``j`` in ``colors[j]``; the
    axes' data limits take them in."""
    from matplotlib.collections import LineCollection

    segs = np.empty((ys.shape[1], x.size, 2))
    segs[:, :, 0] = x
    segs[:, :, 1] = ys.T
    ax.add_collection(LineCollection(segs, colors=colors, **kwargs), autolim=True)
    ax.autoscale_view()


def _moving_average(y: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over ``window`` rows of ``y[T, ...]``; ``[T - window + 1, ...]``."""
    if window <= 1:
        return y
    c = np.cumsum(np.nan_to_num(y), axis=0)
    c = np.concatenate([np.zeros((1,) + y.shape[1:]), c], axis=0)
    return (c[window:] - c[:-window]) / window


def _cmap(name: str):
    """``name`` without its palest 15% (pale yellow lines vanish on white)."""
    base = colormaps[name]
    return ListedColormap(base(np.linspace(0.0, 0.85, 256)), name=f"{name}_dark")


def _slot_colors(n: int, cmap_name: str = "viridis") -> list:
    cmap = _cmap(cmap_name)
    norm = Normalize(vmin=0, vmax=max(1, n - 1))
    return [cmap(norm(i)) for i in range(n)]


def _discrete_mappable(n: int, cmap_name: str = "viridis", dark: bool = False):
    """A ScalarMappable for a colorbar of ``n`` discrete indices 0..n-1."""
    base = _cmap(cmap_name) if dark else colormaps[cmap_name]
    if n > 256:  # continuous scale (BoundaryNorm's int16 bins fail past 32,767 slots)
        return ScalarMappable(norm=Normalize(vmin=-0.5, vmax=n - 0.5), cmap=base)
    return ScalarMappable(norm=BoundaryNorm(np.arange(-0.5, n + 0.5), n), cmap=base.resampled(n))


class _PlainLog(Formatter):
    """Tick labels of a log or symlog axis in plain text -- 0.003, 0.1, 1, 1000, 1e+06 --
    instead of mathtext's powers of ten (mathtext's first use in a process cost 0.1 s of a
    run's figures, its labels half a log panel's drawing).  Minor ticks (``minor``) are
    labelled as matplotlib's own log labels are: only on a log axis spanning at most a decade,
    then those at 2, 3, 4 and 6 times a power of ten, and all of them within 10^0.4."""

    def __init__(self, minor: bool = False) -> None:
        self.minor = minor

    def __call__(self, x, pos=None) -> str:
        if self.minor:
            lo, hi = sorted(self.axis.get_view_interval())
            if self.axis.get_scale() != "log" or not (0 < lo and hi <= 10 * lo) or x <= 0:
                return ""
            m = x / 10.0 ** math.floor(math.log10(x) + 1e-9)  # 1 <= m < 10
            if hi > 10**0.4 * lo and not (abs(m - round(m)) < 1e-6 and round(m) in (2, 3, 4, 6)):
                return ""
        return f"{x:.6g}".replace("-", "\N{MINUS SIGN}")


def _plain_log_labels(axis) -> None:
    """:class:`_PlainLog` labels on a log / symlog ``axis`` (major and minor ticks)."""
    axis.set_major_formatter(_PlainLog())
    axis.set_minor_formatter(_PlainLog(minor=True))


#: major ticks on a linear axis of the run's figures: at most this many intervals (about five
#: labels; matplotlib's "auto" put up to nine on a wide axis, and each tick label is drawn and
#: measured glyph by glyph: the figures' text was a third of their drawing)
_NBINS = 5


class _InView(MaxNLocator):
    """:class:`MaxNLocator` giving only the ticks inside the axis' view (with matplotlib's own
    tolerance, widened): it gives a step more on each side, and matplotlib makes a tick -- two
    lines, a grid line, two labels -- for every location and then draws only those in view
    (the axes' ticks were a seventh of drawing the run's figures).  The same ticks are drawn."""

    def __call__(self):
        locs = super().__call__()
        lo, hi = sorted(self.axis.get_view_interval())
        tol = 1e-6 * (hi - lo)
        return locs[(locs >= lo - tol) & (locs <= hi + tol)]


def _few(nbins: int = _NBINS) -> MaxNLocator:
    """A locator of at most ``nbins`` intervals at matplotlib's own round steps (1, 2, 2.5, 5
    times a power of ten, as its default locator), the ticks in view only."""
    return _InView(nbins=nbins, steps=[1, 2, 2.5, 5, 10])


def _few_ticks(*axes) -> None:
    """At most :data:`_NBINS` intervals between the major ticks of each linear ``axes``
    (shared axes share their locator)."""
    for axis in axes:
        axis.set_major_locator(_few())


def _integer_ticks(cb, n: int) -> None:
    """At most about 8 integer ticks on a colorbar of ``n`` indices, no minor ticks (the
    colour bands mark the boundaries; a tick at each was a fifth of a figure's ticks)."""
    step = max(1, int(math.ceil(n / 8)))
    cb.set_ticks(np.arange(0, n, step))
    cb.minorticks_off()


# ------------------------------------------------------------------------------ density
def _tv(counts: np.ndarray, n: int, probs: np.ndarray) -> float:
    """``1/2 sum |q - p|`` over the cells plus one cell for the mass outside the grid (as
    :func:`nrpt.run.sgpt.grid_errors`)."""
    q = np.append(counts.ravel(), n - counts.sum()) / n
    p = np.append(probs.ravel(), max(0.0, 1.0 - float(probs.sum())))
    return 0.5 * float(np.abs(q - p).sum())


def _view_box(edges_x, edges_y, *arrays, rel: float = 1e-3):
    """The smallest box of cells holding every cell above ``rel * max`` of any of ``arrays``,
    padded by a cell."""
    mask = np.zeros(arrays[0].shape, dtype=bool)
    for a in arrays:
        m = float(np.max(a)) if a.size else 0.0
        if m > 0:
            mask |= a > rel * m
    if not mask.any():
        return edges_x[0], edges_x[-1], edges_y[0], edges_y[-1]
    ix = np.flatnonzero(mask.any(axis=1))
    iy = np.flatnonzero(mask.any(axis=0))
    i0, i1 = max(0, ix[0] - 1), min(len(edges_x) - 1, ix[-1] + 2)
    j0, j1 = max(0, iy[0] - 1), min(len(edges_y) - 1, iy[-1] + 2)
    return edges_x[i0], edges_x[i1], edges_y[j0], edges_y[j1]


def _floor_caption(tv: float, tv_floor: float | None, n: int,
                   signs: str = "Red cells: too many samples; blue: too few.") -> str:
    """One line: what the TV's finite-sample floor is and how far above it the run is (the
    definitions: README, "Where results go")."""
    if tv_floor is not None:
        ratio = tv / tv_floor if tv_floor > 0 else float("inf")
        floor = (f"TV above the floor ≈ {_fmt(tv_floor)} (the TV of {n:,} exact independent "
                 f"draws; this run {ratio:.2g} ×)")
    else:
        floor = (f"TV above the floor of {n:,} exact independent draws "
                 "(nrpt.diagnostics.density.iid_floor)")
    return (floor + " is sampler error: bias, modes not in equilibrium, correlated draws. "
            + signs)


def density(samples, target=None, *, bins: int = 80, grid_kwargs: dict | None = None,
            tv_floor: float | None = None, view: tuple[float, float, float, float] | None = None,
            labels: tuple[str, str] = ("x₁", "x₂"), title: str = "slot-0 samples",
            caption: bool = True) -> Figure:
    """Histogram of the slot-0 samples, with the exact density and the error where known.

    Args:
        samples: ``[n, 2]`` (or ``[n, 1]`` / ``[n]`` for a one-dimensional target).
        target: optional; if it has ``density_grid(**grid_kwargs)`` returning ``(xs, ys,
            probs[len(xs)-1, len(ys)-1])`` (2-D, e.g. ``TwentyFiveModes``) or ``(edges, probs)``
            (1-D), the histogram is taken on that grid and the exact panel and the error panel
            (histogram minus exact, with the total-variation distance) are drawn.
        bins: cells per axis without an exact grid.
        grid_kwargs: keyword arguments for ``target.density_grid``.
        tv_floor: the TV of as many exact iid draws (e.g.
            ``nrpt.diagnostics.density.iid_floor``), printed beside the run's TV.
        view: ``(xmin, xmax, ymin, ymax)`` shown; default: the cells above 1e-3 of the peak.
        labels: axis names.
        title: title of the histogram panel.
        caption: explain the TV floor under the panels.
    """
    x = np.asarray(samples, dtype=float)
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2 or x.shape[1] not in (1, 2) or x.shape[0] == 0:
        raise ValueError(f"samples must be [n, 2] or [n, 1] with n >= 1; got {x.shape}")
    grid_fn = getattr(target, "density_grid", None) if target is not None else None
    exact = grid_fn(**(grid_kwargs or {})) if callable(grid_fn) else None
    if exact is not None and len(exact) != 1 + x.shape[1]:
        exact = None  # a grid of the other dimension: not comparable
    if x.shape[1] == 1:
        if exact is None:
            return _histogram_1d(x[:, 0], bins, labels[0], title)
        return _density_1d(x[:, 0], exact, tv_floor, labels[0], title, caption)
    if exact is None:
        return _histogram_2d(x, bins, view, labels, title)
    return _density_2d(x, exact, tv_floor, view, labels, title, caption)


def _histogram_2d(x, bins, view, labels, title) -> Figure:
    n = x.shape[0]
    fig = _fixed(6.4, 5.2, left=0.8, right=0.95, bottom=0.65, top=0.45)
    ax = fig.add_subplot()
    h, ex, ey = np.histogram2d(x[:, 0], x[:, 1], bins=bins)
    im = ax.imshow((h / n).T, origin="lower", extent=(ex[0], ex[-1], ey[0], ey[-1]),
                   cmap="viridis", vmin=0.0, aspect="equal", interpolation="nearest")
    _style(ax, labels[0], labels[1], f"{title} (n = {n:,})")
    cell = f"{ex[1] - ex[0]:.2g} × {ey[1] - ey[0]:.2g}"
    _colorbar(fig, im, ax, f"fraction of samples per cell ({cell})", shrink=0.9)
    if view is not None:
        ax.set_xlim(view[0], view[1])
        ax.set_ylim(view[2], view[3])
    return fig


def _error_scale(err, probs, h) -> tuple[float, bool]:
    """The error panel's colour limit (the 99.8% quantile of the error over the cells with
    mass, so that one outlier does not wash out the rest) and whether it clips."""
    emax_all = float(np.abs(err).max()) or 1e-12
    live = (probs > 1e-3 * probs.max()) | (h > 0)
    emax = float(np.quantile(np.abs(err[live]), 0.998)) if live.any() else emax_all
    emax = emax_all if not emax > 0 else min(emax, emax_all)
    return emax, emax < emax_all


def _density_2d(x, exact, tv_floor, view, labels, title, caption) -> Figure:
    n = x.shape[0]
    xs, ys, probs = (np.asarray(a, dtype=float) for a in exact)
    h, _, _ = np.histogram2d(x[:, 0], x[:, 1], bins=(xs, ys))
    q = h / n
    err = q - probs
    tv = _tv(h, n, probs)
    box = view if view is not None else _view_box(xs, ys, probs, q, rel=5e-3)
    vmax = float(max(probs.max(), q.max()))
    emax, clipped = _error_scale(err, probs, h)
    text = _floor_caption(tv, tv_floor, n) if caption else None
    room = _caption_room(text, 200)
    # a fixed layout in inches: three square panels, a colorbar right of the second (for the
    # first two) and of the third
    side, bottom, width = 3.85, 0.6 + room, 16.5
    fig = Figure(figsize=(width, bottom + side + 0.75))
    x0 = [0.75, 0.75 + side + 0.75, 0.75 + 2 * side + 0.75 + 1.9]
    axes = [fig.add_axes(_rect(fig, x0[0], bottom, side, side))]
    axes += [fig.add_axes(_rect(fig, x, bottom, side, side), sharex=axes[0], sharey=axes[0])
             for x in x0[1:]]
    caxes = [fig.add_axes(_rect(fig, x + side + 0.15, bottom, 0.22, side)) for x in x0[1:]]
    cell = f"{xs[1] - xs[0]:.2g} × {ys[1] - ys[0]:.2g}"
    common = dict(origin="lower", extent=(xs[0], xs[-1], ys[0], ys[-1]), aspect="equal",
                  interpolation="nearest")
    im0 = axes[0].imshow(q.T, cmap="viridis", vmin=0.0, vmax=vmax, **common)
    axes[1].imshow(probs.T, cmap="viridis", vmin=0.0, vmax=vmax, **common)
    im2 = axes[2].imshow(err.T, cmap="RdBu_r", norm=TwoSlopeNorm(0.0, -emax, emax), **common)
    _style(axes[0], labels[0], labels[1], f"{title} (n = {n:,})")
    _style(axes[1], labels[0], labels[1], "exact density")
    floor = f" (iid floor ≈ {tv_floor:.3g})" if tv_floor is not None else ""
    _style(axes[2], labels[0], labels[1], f"histogram − exact\nTV = {tv:.3g}{floor}")
    cbs = [_colorbar(fig, im0, None, f"probability per cell ({cell})", cax=caxes[0]),
           _colorbar(fig, im2, None, "difference in probability per cell"
                     + (" (scale clipped)" if clipped else ""), cax=caxes[1],
                     extend="both" if clipped else "neither")]
    for a in axes[1:]:
        a.tick_params(labelleft=True)
    _few_ticks(axes[0].xaxis, axes[0].yaxis)  # (x and y alike: the panels are square)
    for cb in cbs:
        cb.locator = _few()
    axes[0].set_xlim(box[0], box[1])
    axes[0].set_ylim(box[2], box[3])
    if text:
        _caption(fig, text, 200)
    return fig


def _histogram_1d(x, bins, label, title) -> Figure:
    fig = _fixed(7.5, 4.6, left=0.85, right=0.3, bottom=0.65, top=0.45)
    ax = fig.add_subplot()
    ax.hist(x, bins=bins, density=True, color="C0", alpha=0.75)
    _style(ax, label, "probability density", f"{title} (n = {x.size:,})")
    return fig


def _density_1d(x, exact, tv_floor, label, title, caption) -> Figure:
    n = x.size
    edges, probs = (np.asarray(a, dtype=float) for a in exact)
    width = np.diff(edges)
    counts, _ = np.histogram(x, bins=edges)
    q = counts / n
    tv = _tv(counts, n, probs)
    text = _floor_caption(tv, tv_floor, n, "Positive: too many samples; negative: too few.") \
        if caption else None
    room = _caption_room(text, 110)
    fig = _fixed(9.0, 6.2 + room, rows=2, left=0.95, right=0.3, bottom=0.65 + room, top=0.45,
                 hgap=0.55)
    ax, ax_e = fig.subplots(2, 1, sharex=True, height_ratios=(2, 1))
    ax.stairs(q / width, edges, fill=True, color="C0", alpha=0.55, label="samples (histogram)")
    ax.stairs(probs / width, edges, color="k", lw=1.2, label="exact")
    _style(ax, "", "probability density", f"{title} (n = {n:,})")
    _legend(ax, loc="upper right")
    ax_e.stairs((q - probs) / width, edges, fill=True, color="C3", alpha=0.7)
    ax_e.axhline(0.0, color="k", lw=0.8)
    floor = f" (iid floor ≈ {tv_floor:.2g})" if tv_floor is not None else ""
    _style(ax_e, label, "density difference", f"histogram − exact: TV = {tv:.3g}{floor}")
    lo, hi = _view_box(edges, np.array([0.0, 1.0]), np.stack([probs, q], 1), rel=1e-4)[:2]
    ax.set_xlim(lo, hi)
    if text:
        _caption(fig, text, 110)
    return fig


# ------------------------------------------------------------------------------ adaptation
def adaptation(k, C=None, learning_rates=None, pair_rate=None, swap_rate: float | None = None,
               system: int = 0, *, window: int | None = None,
               ladder_label: str = "learning rate") -> Figure:
    """Traces of the stochastic-approximation adaptors (Deng et al. 2023, Fig. 4b/4d).

    Args:
        k: iterations of the records ``[T]``.
        C: correction buffer ``[T, R]`` or ``[T]`` (None: panel left out).
        learning_rates: ladder per slot ``[T, R, P]`` or ``[T, P]`` (or any per-slot schedule
            values; name them with ``ladder_label``); None: panel left out.
        pair_rate: swap-indicator rate per adjacent pair ``[T, R, P-1]`` or ``[T, P-1]``, the
            mean 0/1 verdict over each record's block; None: panel left out.
        swap_rate: the target swap rate ``S`` (drawn as a labelled line).
        system: which PT system to draw.
        window: moving-average window (in records) for the pair rates; default ``T // 50``.
    """
    k = np.asarray(k, dtype=float).ravel()
    if k.size == 0:
        raise ValueError("adaptation: no records (k is empty)")
    panels = [(draw, data) for draw, data in ((_correction_panel, C),
                                              (_ladder_panel, learning_rates),
                                              (_pair_rate_panel, pair_rate)) if data is not None]
    if not panels:
        raise ValueError("adaptation: give at least one of C, learning_rates, pair_rate")
    fig = _fixed(5.6 * len(panels) + 0.8, 4.8, cols=len(panels), left=1.0, right=0.85,
                 bottom=0.65, top=1.0, wgap=1.75)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    fig.suptitle(f"Stochastic-approximation adaptation of system {system}", fontsize=_FS_TITLE)
    for ax, (draw, data) in zip(axes, panels, strict=True):
        draw(fig, ax, k, data, system=system, swap_rate=swap_rate, window=window,
             ladder_label=ladder_label)
        _few_ticks(ax.xaxis)  # (iterations)
    return fig


def _correction_panel(fig, ax, k, C, *, system, swap_rate, **_) -> None:
    c = _pick_system(C, 1, system, "C")
    ax.plot(k, c, color="C0", lw=1.5)
    ax.axhline(0.0, color="0.6", lw=0.8, ls=":")
    _few_ticks(ax.yaxis)
    s_txt = f"S = {swap_rate:g}" if swap_rate is not None else "S"
    _style(ax, "iteration", "correction buffer C",
           f"correction buffer C (final {_fmt(float(c[-1]))})\n"
           f"C ← C + γₖ (mean pair indicator − {s_txt})")


def _ladder_panel(fig, ax, k, learning_rates, *, system, ladder_label, **_) -> None:
    lr = _pick_system(learning_rates, 2, system, "learning_rates")
    P = lr.shape[1]
    if np.all(lr[np.isfinite(lr)] > 0):
        ax.set_yscale("log")
        _plain_log_labels(ax.yaxis)
    _lines(ax, k, lr, _slot_colors(P), lw=1.2)
    _style(ax, "iteration", f"{ladder_label} (log scale)", f"{ladder_label} per slot")
    cb = _colorbar(fig, _discrete_mappable(P, dark=True), ax, "slot (0 = target)")
    _integer_ticks(cb, P)


def _pair_rate_panel(fig, ax, k, pair_rate, *, system, swap_rate, window, **_) -> None:
    rate = _pick_system(pair_rate, 2, system, "pair_rate")
    M = rate.shape[1]
    T = k.size
    w = min(max(1, T // 50) if window is None else max(1, int(window)), T)
    sm = _moving_average(rate, w)
    ks = k[w - 1:]
    _lines(ax, ks, sm, _slot_colors(M, "plasma"), lw=0.9, alpha=0.85)
    ax.plot(ks, sm.mean(axis=1), color="k", lw=2.0, label="mean over pairs")
    if swap_rate is not None:
        ax.axhline(swap_rate, color="C3", ls="--", lw=1.8,
                   label=f"target swap rate S = {swap_rate:g}")
    ax.set_ylim(-0.02, 1.02)
    avg = f"moving average of {w} records" if w > 1 else "per record"
    _style(ax, "iteration", f"swap-indicator rate\n({avg})", "swap-indicator rate per pair")
    _legend(ax, loc="upper right")
    cb = _colorbar(fig, _discrete_mappable(M, "plasma", dark=True), ax, "pair (p, p+1)")
    _integer_ticks(cb, M)


# ------------------------------------------------------------------------------ index process
def index_process(index, system: int = 0, highlight: Sequence[int] | int | None = None,
                  max_points: int = 4000, boundaries: Sequence[float] | None = None, *,
                  boundary_label: str = "round boundary", heatmap: bool = True,
                  zoom: int | None | str = "auto", title: str | None = None) -> Figure:
    """The slot of replicas over the whole run.

    Panels: the ``highlight`` replicas' slots (others faint grey when ``P <= 8``), thinned
    evenly past ``max_points`` iterations (the title says so); with ``heatmap`` every replica's
    slot as an image; with ``zoom`` the last ``zoom`` iterations at full resolution (``"auto"``:
    the last ``max(200, 10 P)`` when the run is more than twice as long; ``None``: none).

    Args:
        index: ``[K + 1, R, P]`` (or ``[K + 1, P]``): slot of replica ``i`` of system ``r``
            before iteration ``k`` (``-1``: the replica did not exist yet; not drawn).
        system: which PT system.
        highlight: replica number(s) drawn in colour (the first 4 are used).
        max_points: the most iterations drawn in the whole-run panels.
        boundaries: iterations of round/segment boundaries (dashed lines), ``boundary_label``
            their legend entry.
        heatmap, zoom: see above.
        title: replaces the default title's first part."""
    idx = np.asarray(index)
    if idx.ndim == 3:
        if not 0 <= system < idx.shape[1]:
            raise ValueError(f"index_process: system {system} out of range (R = {idx.shape[1]})")
        idx = idx[:, system, :]
    if idx.ndim != 2 or idx.shape[0] == 0:
        raise ValueError(f"index must be [K + 1, R, P] or [K + 1, P]; got {np.shape(index)}")
    n_rows, P = idx.shape
    K = n_rows - 1
    stride = _stride(n_rows, max_points)
    rows = np.arange(0, n_rows, stride)
    if rows[-1] != n_rows - 1:
        rows = np.append(rows, n_rows - 1)
    sub = np.asarray(idx[rows], dtype=float)  # [n_shown, P]
    sub[sub < 0] = np.nan  # a replica not there yet (a ladder that grew: chains = "auto")
    ip = _IndexPanels(P, K, _highlighted(highlight, P), [float(b) for b in (boundaries or ())])
    zoom = _zoom_length(zoom, n_rows, P)
    thin_txt = (f"every {_ordinal(stride)} iteration shown" if stride > 1
                else "every iteration shown")
    n_panels = 1 + bool(heatmap) + (zoom is not None)
    # a fixed layout in inches: the panels aligned, the heatmap's colorbar in the right margin
    # (the legend above the first panel: 6 entries a row)
    entries = (P <= 8 and len(ip.highlight) < P) + len(ip.highlight) + \
        any(0 <= b <= K for b in ip.bounds) + (zoom is not None)
    top = 0.85 + 0.25 * (math.ceil(entries / 6) - 1)
    width, height, bottom, gap = 11.0, 0.15 + top + 3.1 * n_panels, 0.6, 0.95
    fig = Figure(figsize=(width, height))
    side = (height - top - bottom - gap * (n_panels - 1)) / n_panels
    axes = [fig.add_axes(_rect(fig, 0.8, height - top - (i + 1) * side - i * gap,
                               width - 0.8 - 1.35, side)) for i in range(n_panels)]
    ax = axes.pop(0)
    ip.lines(ax, rows, sub, True)
    ip.vlines(ax, 0, K, "0.3", boundary_label)
    if zoom is not None:
        ax.axvspan(K - zoom, K, color="C1", alpha=0.12, lw=0, label="zoomed below")
    ax.set_xlim(0, max(K, 1))
    _few_ticks(ax.xaxis)
    _style(ax, f"iteration ({thin_txt})", "slot (0 = target)")
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=6, frameon=False,
              fontsize=_FS_LEGEND, borderaxespad=0.2, handlelength=1.6)
    head = title or f"Index process of system {system}"
    fig.suptitle(f"{head}: {P} replicas, {K:,} iterations ({thin_txt})", fontsize=_FS_TITLE)
    if heatmap:
        ip.heatmap(fig, axes.pop(0), rows, sub, thin_txt)
    if zoom is not None:
        lo = n_rows - 1 - zoom
        last = np.asarray(idx[lo:], dtype=float)
        last[last < 0] = np.nan
        ip.zoom(axes.pop(0), np.arange(lo, n_rows), last)
    return fig


def _stride(n: int, max_points: int) -> int:
    """Every how many-th of ``n`` points to draw so that at most ``max_points`` are drawn."""
    return max(1, int(math.ceil(n / max(2, int(max_points)))))


def _highlighted(highlight, P: int) -> list[int]:
    """The (at most 4, distinct, in range) replicas drawn in colour."""
    if highlight is None:
        highlight = [0, P - 1] if P > 1 else [0]
    elif isinstance(highlight, int | np.integer):
        highlight = [int(highlight)]
    return list(dict.fromkeys(int(h) for h in highlight if 0 <= int(h) < P))[:4]


def _zoom_length(zoom, n_rows: int, P: int) -> int | None:
    """The zoom panel's number of iterations (``index_process``'s ``zoom``), None for none."""
    if zoom == "auto":
        zoom = max(200, 10 * P)
        return zoom if n_rows > 2 * zoom else None
    if zoom is not None:
        return int(zoom) if 1 < int(zoom) < n_rows else None
    return None


@dataclass
class _IndexPanels:
    """Draws the panels of :func:`index_process` for ``P`` replicas over ``K`` iterations."""

    P: int
    K: int
    highlight: list[int]
    bounds: list[float]
    palette: tuple[str, ...] = ("C3", "C0", "C2", "C1")

    def lines(self, a, x, y, others: bool) -> None:
        """The highlighted replicas' slots (and, with ``others``, the rest faint grey)."""
        P, highlight = self.P, self.highlight
        if others and P <= 8 and len(highlight) < P:
            rest = [i for i in range(P) if i not in highlight]
            for n, i in enumerate(rest):
                a.plot(x, y[:, i], color="0.78", lw=0.6, drawstyle="steps-post",
                       rasterized=True, label="other replicas" if n == 0 else None)
        lw = 1.3 if len(x) < 1500 else 0.8
        for c, i in zip(self.palette, highlight, strict=False):
            a.plot(x, y[:, i], color=c, lw=lw, drawstyle="steps-post", alpha=0.9,
                   label=f"replica {i}", rasterized=True)
        a.set_ylim(-0.5, P - 0.5)
        a.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=8))

    def vlines(self, a, lo, hi, color, label) -> None:
        """The boundaries within ``[lo, hi]`` as dashed lines (the first one labelled)."""
        for n, b in enumerate([b for b in self.bounds if lo <= b <= hi]):
            a.axvline(b, color=color, lw=1.0, ls="--", label=label if n == 0 else None)

    def heatmap(self, fig, ax, rows, sub, thin_txt: str) -> None:
        """Every replica's slot, one column per shown iteration reaching to the next one."""
        P, K, highlight = self.P, self.K, self.highlight
        edges = np.append(rows, rows[-1] + 1).astype(float)
        mappable = _discrete_mappable(P, "viridis")
        # (pcolorfast: one image on the rectilinear grid, not a mesh of K / stride * P cells)
        ax.pcolorfast(edges, np.arange(P + 1) - 0.5, sub.T, cmap=mappable.cmap,
                      norm=mappable.norm)
        self.vlines(ax, 0, K, "w", None)
        ax.set_ylim(-0.5, P - 0.5)
        ax.set_xlim(0, max(K, 1))
        _few_ticks(ax.xaxis)
        ticks = [int(t) for t in MaxNLocator(integer=True, nbins=8).tick_values(0, P - 1)
                 if 0 <= t <= P - 1]
        gap = max(1.0, P / 14)
        ticks = sorted(set(highlight) | {t for t in ticks
                                          if all(abs(t - h) >= gap for h in highlight)})
        ax.set_yticks(ticks)
        _style(ax, f"iteration ({thin_txt})", "replica",
               "slot of every replica (highlighted replicas' numbers in colour)")
        for lab, t in zip(ax.get_yticklabels(), ticks, strict=True):
            if t in highlight:
                lab.set_color(self.palette[highlight.index(t)])
                lab.set_fontweight("bold")
        box = ax.get_position()  # (figure fractions): the colorbar 0.15 in to its right
        w = fig.get_figwidth()
        cax = fig.add_axes([box.x1 + 0.15 / w, box.y0, 0.2 / w, box.height])
        cb = _colorbar(fig, mappable, None, "slot (0 = target)", cax=cax)
        _integer_ticks(cb, P)

    def zoom(self, ax, x, y) -> None:
        """The highlighted replicas at every iteration ``x`` (the last ones of the run)."""
        self.lines(ax, x, y, False)
        self.vlines(ax, x[0], self.K, "0.3", None)
        ax.set_xlim(x[0], self.K)
        _few_ticks(ax.xaxis)
        _style(ax, "iteration (every iteration shown)", "slot (0 = target)",
               f"zoom: the last {len(x) - 1:,} iterations")


# ------------------------------------------------------------------------------ swaps
def swap_acceptance(acceptance, *, at=None, coordinate: str | None = None,
                    title: str = "Swap acceptance per adjacent pair") -> Figure:
    """Per-pair swap acceptance: mean over systems, their range and each system.

    Args:
        acceptance: ``[R, P-1]`` (or ``[P-1]``): mean ``min(1, alpha)`` of pair ``(p, p+1)``.
        at: optional x positions per pair (e.g. the midpoints of the schedule); default the pair
            index ``p``.
        coordinate: the x label when ``at`` is given.
    """
    a = np.asarray(acceptance, dtype=float)
    if a.ndim == 1:
        a = a[None]
    if a.ndim != 2 or a.shape[1] == 0:
        raise ValueError(f"acceptance must be [R, P-1] or [P-1]; got {np.shape(acceptance)}")
    R, M = a.shape
    x = np.arange(M) if at is None else np.asarray(at, dtype=float).ravel()
    if x.size != M:
        raise ValueError(f"at has {x.size} entries for {M} pairs")
    mean = np.nanmean(a, axis=0) if np.isfinite(a).any() else np.full(M, np.nan)
    fig = _fixed(8.0, 4.8, left=0.85, right=0.3, bottom=0.65, top=0.75)
    ax = fig.add_subplot()
    if R > 1:
        lo, hi = np.nanmin(a, axis=0), np.nanmax(a, axis=0)
        ax.fill_between(x, lo, hi, color="C0", alpha=0.2, step=None,
                        label=f"range over {R} systems")
        for r in range(R):
            ax.plot(x, a[r], ".", color="C0", ms=4, alpha=0.5,
                    label="one system" if r == 0 else None)
    ax.plot(x, mean, "o-", color="C0", lw=1.8, ms=5,
            label=f"mean over {R} systems" if R > 1 else "acceptance")
    overall = float(np.nanmean(a)) if np.isfinite(a).any() else float("nan")
    ax.axhline(overall, color="0.4", ls="--", lw=1.0, label=f"average = {overall:.3f}")
    ax.set_ylim(0.0, 1.02)
    if at is None:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        xlabel = "pair p (swaps slots p and p+1; 0 = target end)"
    else:
        xlabel = coordinate or "pair position"
    worst = int(np.nanargmin(mean)) if np.isfinite(mean).any() else 0
    _style(ax, xlabel, "swap acceptance  E[min(1, α)]",
           f"{title}\nlowest: pair {worst} ({mean[worst]:.3f})")
    _legend(ax, loc="lower right")
    return fig


# ------------------------------------------------------------------------------ barrier
def local_barrier(grid, values, at=None, method_one=None, coordinate: str = "beta", *,
                  exact=None, system: int = 0, yscale: str = "auto", xscale: str = "auto",
                  title: str = "Local communication barrier") -> Figure:
    """The local barrier ``lambda`` over the schedule coordinate.

    ``yscale="auto"``: log when the values span more than a factor 20; ``xscale="auto"``:
    ``symlog`` when the positive points span more than two decades; or force ``"linear"`` /
    ``"log"`` / ``"symlog"``.

    Args:
        grid: coordinate values ``[G]``.
        values: ``lambda`` on ``grid`` ``[G]`` (or ``[R, G]``, drawn at ``system``).
        at, method_one: Method I estimates at the schedule points (``[P]`` or ``[R, P]``; NaN
            skipped).
        coordinate: the x label, e.g. ``"beta"``.
        exact: the exact ``lambda`` on ``grid`` where known."""
    g = np.asarray(grid, dtype=float).ravel()
    v = np.asarray(values, dtype=float)
    if v.ndim == 2:
        v = v[system]
    if v.shape != g.shape:
        raise ValueError(f"values {v.shape} do not match grid {g.shape}")
    fig = _figure(8.0, 4.8)
    ax = fig.add_subplot()
    ax.plot(g, v, color="C0", lw=2.0, label="from swap rejections (derivative of the fit)")
    b = m = np.array([])  # the Method I points
    if at is not None and method_one is not None:
        b, m = (_at_system(np.asarray(a, dtype=float), system) for a in (at, method_one))
        ok = np.isfinite(m) & np.isfinite(b)
        ax.plot(b[ok], m[ok], "o", color="C1", ms=6, mec="k", mew=0.5,
                label="Method I: ½ E|ℓ(X) − ℓ(Y)| at the schedule")
    if exact is not None:
        ax.plot(g, np.asarray(exact, dtype=float).ravel(), "k--", lw=1.3, label="exact")
    ok = np.isfinite(v)
    gg, vv = g[ok], v[ok]
    total = float(np.sum(0.5 * (vv[1:] + vv[:-1]) * np.diff(gg))) if ok.sum() > 1 else \
        float("nan")
    _barrier_yscale(ax, yscale, np.concatenate([vv[vv > 0], m[np.isfinite(m) & (m > 0)]]))
    _barrier_xscale(ax, xscale, np.concatenate([g, b.ravel()]), b[np.isfinite(b) & (b > 0)])
    for axis in (ax.xaxis, ax.yaxis):
        if axis.get_scale() in ("log", "symlog"):
            _plain_log_labels(axis)
    name = {"beta": "β (annealing parameter)"}.get(coordinate, coordinate)
    if ax.get_xscale() == "symlog":
        name += f"; linear below {ax.xaxis.get_transform().linthresh:.2g}, log above"
    _style(ax, name, "local barrier λ" + (" (log scale)" if ax.get_yscale() == "log" else ""),
           f"{title}: Λ = ∫ λ = {total:.3g}")
    _legend(ax, loc="best")
    return fig


def _at_system(a: np.ndarray, system: int) -> np.ndarray:
    return a[system] if a.ndim == 2 else a


def _barrier_yscale(ax, yscale: str, pos: np.ndarray) -> None:
    """``yscale`` (``"auto"``: log when the positive values drawn, ``pos``, span more than a
    factor 20) with limits that hold every value drawn."""
    if yscale == "auto":
        yscale = "log" if pos.size and pos.max() > 20.0 * pos.min() else "linear"
    if yscale == "log" and pos.size:
        ax.set_yscale("log")
        ax.set_ylim(pos.min() / 1.5, pos.max() * 1.5)
        return
    if yscale != "linear":
        ax.set_yscale(yscale)
    ax.set_ylim(bottom=0.0)


def _barrier_xscale(ax, xscale: str, pts: np.ndarray, sched: np.ndarray) -> None:
    """``xscale`` for the coordinates drawn, ``pts`` (``"auto"``: symlog when the positive
    schedule points ``sched``, else the positive ``pts``, span more than two decades)."""
    xpos = sched if sched.size else pts[np.isfinite(pts) & (pts > 0)]
    if xscale == "auto":
        xscale = "symlog" if xpos.size and xpos.max() > 100.0 * xpos.min() else "linear"
    if xscale == "symlog" and xpos.size:
        lin = float(xpos.min())
        ax.set_xscale("symlog", linthresh=lin, linscale=0.6)
        finite = pts[np.isfinite(pts)]
        ax.set_xlim(float(finite.min()) - 0.12 * lin, float(finite.max()) * 1.15)
    elif xscale != "linear":
        ax.set_xscale(xscale)


def schedules(schedules, coordinate: str = "beta", *,
              title: str = "Schedule per round") -> Figure:
    """The schedule of every round (rows) as ticks at its points, the same slot joined.

    Args:
        schedules: ``[n_rounds, P]`` (rows may also be a list of arrays of different lengths).
        coordinate: the schedule coordinate (x label).
    """
    rows = [np.asarray(s, dtype=float).ravel() for s in schedules]
    if not rows:
        raise ValueError("schedules: no rounds")
    n = len(rows)
    same = len({r.size for r in rows}) == 1
    fig = _figure(8.0, 1.8 + min(5.5, 0.32 * n + 1.4))
    ax = fig.add_subplot()
    y = np.arange(1, n + 1)
    if same and n > 1:
        arr = np.stack(rows)
        for p in range(arr.shape[1]):
            ax.plot(arr[:, p], y, color="0.75", lw=0.8, zorder=1)
    for i, b in enumerate(rows):
        ax.plot(b, np.full_like(b, i + 1), "|", ms=12, mew=1.6,
                color="C3" if i == n - 1 else "C0", zorder=2)
    ax.set_ylim(0.4, n + 0.6)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    name = {"beta": "β (annealing parameter; 0 = reference, 1 = target)"}.get(coordinate,
                                                                          coordinate)
    P = rows[-1].size
    _style(ax, name, "round", f"{title} ({P} slots in the last round, red)")
    return fig


# ------------------------------------------------------------------------------ chains
def _chains(samples, max_coords: int) -> tuple[np.ndarray, int]:
    """``samples`` as ``[R, n, k]`` (the first ``k <= max_coords`` coordinates) and the
    state's dimension."""
    x = np.asarray(samples, dtype=float)
    if x.ndim == 1:
        x = x[None, :, None]
    elif x.ndim == 2:
        x = x[None]
    if x.ndim != 3 or x.shape[1] == 0 or x.shape[2] == 0:
        raise ValueError(f"samples must be [R, n, dim], [n, dim] or [n] with n >= 1; got "
                         f"{np.shape(samples)}")
    return x[:, :, :max(1, int(max_coords))], x.shape[2]


def _coord_names(names, k: int) -> list[str]:
    if names is None:
        return [f"x[{j}]" for j in range(k)]
    names = list(names)
    return [str(names[j]) if j < len(names) else f"x[{j}]" for j in range(k)]


def trace(samples, *, names: Sequence[str] | None = None, max_coords: int = 4,
          max_points: int = 5000, title: str = "Slot-0 trace") -> Figure:
    """Trace plot of the slot-0 chains (ArviZ's ``plot_trace`` layout): per coordinate, the
    marginal histogram of each chain (left) and its trace (right); chain = PT system.

    Args:
        samples: ``[R, n, dim]`` (or ``[n, dim]`` / ``[n]``: one system).
        names: coordinate names (default ``x[j]``).
        max_coords: the first this many coordinates are drawn (high-dimensional targets).
        max_points: traces longer than this are thinned evenly (the title says so).
    """
    x, dim = _chains(samples, max_coords)
    R, n, k = x.shape
    labels = _coord_names(names, k)
    stride = _stride(n, max_points)
    it = np.arange(0, n, stride)
    fig = _figure(12.0, 1.2 + 2.3 * k)
    axes = fig.subplots(k, 2, squeeze=False, width_ratios=(1, 2.6))
    colors = [f"C{r % 10}" for r in range(R)]
    for j in range(k):
        col = x[:, :, j]
        fin = col[np.isfinite(col)]
        edges = np.histogram_bin_edges(fin, bins=min(60, max(10, int(np.sqrt(n))))) \
            if fin.size else np.linspace(-1, 1, 11)
        a_h, a_t = axes[j]
        for r in range(R):
            h, _ = np.histogram(col[r], bins=edges, density=True)
            a_h.stairs(h, edges, color=colors[r], lw=1.2, alpha=0.85,
                       label=f"system {r}" if R > 1 else None)
            a_t.plot(it, col[r, it], color=colors[r], lw=0.5, alpha=0.7, rasterized=True)
        _style(a_h, labels[j], "density")
        _style(a_t, "draw" + (f" (every {_ordinal(stride)} shown)" if stride > 1 else ""),
               labels[j])
        a_t.set_xlim(0, max(1, n - 1))
    if R > 1:
        _legend(axes[0, 0], loc="upper right")
    more = f"; first {k} of {dim} coordinates" if dim > k else ""
    chains = f"{R} systems (one chain each)" if R > 1 else "1 system"
    fig.suptitle(f"{title}: {chains}, {n:,} draws{more}", fontsize=_FS_TITLE)
    return fig


def rank(samples, *, names: Sequence[str] | None = None, max_coords: int = 4,
         bins: int = 20, title: str = "Slot-0 rank plot") -> Figure:
    """Rank histograms (ArviZ's ``plot_rank``; Vehtari et al. 2021), one chain per system (one
    system: its four quarters).

    Args:
        samples: ``[R, n, dim]`` (or ``[n, dim]`` / ``[n]``).
        names, max_coords: as :func:`trace`.
        bins: rank bins per chain."""
    x, dim = _chains(samples, max_coords)
    R, n, k = x.shape
    split = R == 1
    if split:
        q = n // 4
        if q < 1:
            raise ValueError(f"rank: one system needs >= 4 draws to split; got {n}")
        x = np.stack([x[0, i * q:(i + 1) * q] for i in range(4)])
    C, m = x.shape[0], x.shape[1]
    labels = _coord_names(names, k)
    ncols = min(k, 2)
    nrows = int(math.ceil(k / ncols))
    fig = _figure(6.2 * ncols, 1.0 + 0.55 * C * nrows + 1.0 * nrows)
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    nb = max(2, min(int(bins), m))
    edges = np.linspace(0, C * m, nb + 1)
    for j in range(k):
        ax = axes[j]
        flat = x[:, :, j].ravel()
        order = np.argsort(flat, kind="stable")
        ranks = np.empty(flat.size)
        ranks[order] = np.arange(flat.size)
        ranks = ranks.reshape(C, m)
        for c in range(C):
            h, _ = np.histogram(ranks[c], bins=edges)
            frac = h / m / (1.0 / nb)  # 1 = uniform
            ax.bar(edges[:-1], 0.8 * frac / 2.0, width=np.diff(edges), bottom=c, align="edge",
                   color=f"C{c % 10}", alpha=0.8, edgecolor="w", lw=0.3)
            ax.axhline(c + 0.8 * 0.5, color="k", ls="--", lw=0.8)
        ax.set_yticks(np.arange(C) + 0.4)
        ax.set_yticklabels([f"quarter {c + 1}" if split else f"system {c}" for c in range(C)])
        ax.set_ylim(-0.1, C)
        ax.set_xlim(0, C * m)
        _style(ax, f"rank of {labels[j]} among all {C * m:,} draws", "")
    for ax in axes[k:]:
        ax.set_visible(False)
    more = f"; first {k} of {dim} coordinates" if dim > k else ""
    what = "the run's four quarters as chains" if split else f"{C} systems as chains"
    fig.suptitle(f"{title} ({what}{more}): flat = the chains agree; dashed = uniform",
                 fontsize=_FS_TITLE)
    return fig
