"""The run folder's figure files: the PNG writer stores exactly the pixels matplotlib draws (text
unhinted), and the outputs' garbage-collector setting leaves the caller's state as it found it."""

from __future__ import annotations

import gc
import io

import numpy as np
import pytest

pytest.importorskip("matplotlib")
from matplotlib import rc_context  # noqa: E402
from PIL import Image  # noqa: E402  (matplotlib's own dependency)

from nrpt.report import figures as plots  # noqa: E402


def _busy_figure(height: float = 3.3):
    """Lines, an image, a colorbar and text (non-ASCII included), ``height`` inches tall."""
    from matplotlib.figure import Figure

    rng = np.random.default_rng(0)
    fig = Figure(figsize=(4.1, height))
    ax = fig.add_subplot()
    im = ax.imshow(rng.random((30, 40)), cmap="viridis")
    ax.plot(np.arange(40), 15 + 10 * np.sin(np.arange(40) / 4), "r-", lw=1.5)
    ax.set_title("TV = ½ Σ |q − p|  (n = 1,000)")
    fig.colorbar(im, ax=ax, label="probability")
    return fig


def _pixels(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGBA"))


@pytest.mark.parametrize("height, transparent", [(3.3, False), (2.0, False), (2.0, True)])
def test_png_writer_stores_the_pixels_savefig_draws(height, transparent):
    # an opaque figure is stored as RGB (its alpha is 255 everywhere), one with a transparent
    # ground as RGBA
    fig = _busy_figure(height)
    if transparent:
        fig.patch.set_alpha(0.0)
    ours = plots.png_bytes(fig, dpi=150)
    buf = io.BytesIO()
    with rc_context({"text.hinting": "no_hinting"}):  # (the writer draws text unhinted)
        fig.savefig(buf, dpi=150, format="png")
    theirs = _pixels(buf.getvalue())
    got = _pixels(ours)
    assert got.shape == theirs.shape == (round(150 * height), round(150 * 4.1), 4)
    assert np.array_equal(got, theirs)
    assert (theirs[:, :, 3] == 255).all() != transparent
    with Image.open(io.BytesIO(ours)) as im:
        assert im.format == "PNG" and im.mode == ("RGBA" if transparent else "RGB")
        assert im.info["dpi"] == pytest.approx((150, 150), abs=0.05)  # (pixels per metre)
    # negative control: one more line drawn is seen by the comparison
    fig.axes[0].plot([0, 39], [0, 29], "k-")
    assert not np.array_equal(_pixels(plots.png_bytes(fig, dpi=150)), theirs)


def test_save_leaves_the_figure_its_canvas_and_dpi(tmp_path):
    import matplotlib as mpl

    fig = _busy_figure()
    canvas, dpi, hinting = fig.canvas, fig.dpi, mpl.rcParams["text.hinting"]
    path = plots.save(fig, tmp_path / "f.png", dpi=120)
    assert fig.canvas is canvas and fig.dpi == dpi
    assert mpl.rcParams["text.hinting"] == hinting  # (the unhinted text: only while drawing)
    assert _pixels(path.read_bytes()).shape[:2] == (round(120 * 3.3), round(120 * 4.1))
    # other formats still go through savefig
    svg = plots.save(fig, tmp_path / "f.svg")
    assert svg.read_text().lstrip().startswith("<?xml")


def test_the_outputs_heap_freeze_leaves_the_callers_gc_state():
    from nrpt.run.api import _heap_frozen

    assert gc.isenabled() and gc.get_freeze_count() == 0
    with _heap_frozen():
        assert gc.get_freeze_count() > 0  # the objects alive on entry are frozen
    assert gc.get_freeze_count() == 0 and gc.isenabled()
    # a caller that froze objects of its own keeps them frozen (unfreeze would release them)
    keep = [object() for _ in range(10)]
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with _heap_frozen():
            pass
        assert gc.get_freeze_count() == frozen
        # negative control: an unconditional freeze / unfreeze releases the caller's objects
        gc.freeze()
        gc.unfreeze()
        assert gc.get_freeze_count() != frozen
    finally:
        gc.unfreeze()
    del keep
    # a collector the caller turned off stays off
    gc.disable()
    try:
        with _heap_frozen():
            assert gc.get_freeze_count() == 0
        assert not gc.isenabled()
    finally:
        gc.enable()


def _labels(ax, minor=False):
    lo, hi = ax.get_ylim()
    return [t.get_text() for t in ax.yaxis.get_ticklabels(minor=minor)
            if t.get_text() and lo <= t.get_position()[1] <= hi]


@pytest.mark.parametrize("lo, hi, major, minor", [
    (0.003, 0.6, ["0.01", "0.1"], []),  # more than a decade: powers of ten only
    (0.15, 0.9, [], ["0.2", "0.3", "0.4", "0.6"]),  # within a decade: 2, 3, 4, 6 x 10^k
    (0.21, 0.29, [], [f"0.{j}" for j in range(21, 30)]),  # within 10^0.4: every one
    (1e-7, 1e-5, ["1e\N{MINUS SIGN}07", "1e\N{MINUS SIGN}06", "1e\N{MINUS SIGN}05"], []),
])
def test_log_axes_are_labelled_in_plain_text(lo, hi, major, minor):
    # the ladder and local-barrier figures' log axes: no mathtext (its first use cost 0.1 s
    # of a run's figures), the same ticks labelled as matplotlib's own log labels
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4, 3))
    ax = fig.add_subplot()
    ax.plot([0, 1], [lo, hi])
    ax.set_yscale("log")
    default = Figure(figsize=(4, 3)).add_subplot()
    default.plot([0, 1], [lo, hi])
    default.set_yscale("log")
    plots._plain_log_labels(ax.yaxis)
    plots.png_bytes(fig, dpi=50)
    plots.png_bytes(default.figure, dpi=50)
    assert _labels(ax) == major and _labels(ax, minor=True) == minor
    # the same ticks carry a label as with matplotlib's formatter, which writes mathtext
    # (negative control: the check of "no mathtext" sees it there)
    assert len(_labels(default)) == len(major)
    assert len(_labels(default, minor=True)) == len(minor)
    assert all("$" in t for t in _labels(default) + _labels(default, minor=True))
    assert not any("$" in t for t in _labels(ax) + _labels(ax, minor=True))


def test_the_ladder_panel_and_the_barrier_use_plain_log_labels():
    ladder = plots.adaptation(np.arange(50), learning_rates=np.geomspace(0.003, 0.6, 4)[None]
                              * np.ones((50, 1)))
    b = np.array([0.0, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0])
    grid = np.linspace(0.0, 1.0, 51)
    barrier = plots.local_barrier(grid, 290.0 / (1.0 + 300.0 * grid) + 0.3, b,
                                  290.0 / (1.0 + 300.0 * b) + 0.3)
    for fig in (ladder, barrier):
        plots.png_bytes(fig, dpi=50)
    axes = [ladder.axes[0].yaxis, barrier.axes[0].xaxis, barrier.axes[0].yaxis]
    assert all(isinstance(a.get_major_formatter(), plots._PlainLog) for a in axes)
    assert not any("$" in t.get_text() for a in axes for t in a.get_ticklabels())


def _shown(axis):
    """The non-empty major tick labels of ``axis`` inside its view."""
    lo, hi = sorted(axis.get_view_interval())
    return [t.label1.get_text() for t in axis.get_major_ticks()
            if lo <= t.get_loc() <= hi and t.label1.get_text()]


def test_the_default_figures_label_their_linear_axes_at_round_steps_sparsely():
    # each tick label is measured and drawn glyph by glyph (text was a third of drawing the
    # run's figures): the iteration axes carry at most six labels at 1, 2, 2.5 or 5 x 10^k,
    # the density's square panels the same ticks on x and y (x had 5, y 9 before)
    rng = np.random.default_rng(0)
    index = np.argsort(rng.random((20_001, 16)), axis=1).astype(np.int16)
    fig = plots.index_process(index)
    xy = rng.normal(size=(2000, 2))
    grid = (np.linspace(-4.4, 4.4, 81), np.linspace(-4.4, 4.4, 81), np.full((80, 80), 1 / 6400))

    class Exact:
        def density_grid(self):
            return grid

    dens = plots.density(xy, Exact())
    for f in (fig, dens):
        plots.png_bytes(f, dpi=40)
    iterations = [_shown(ax.xaxis) for ax in fig.axes[:3]]
    assert iterations[0] == ["0", "5000", "10000", "15000", "20000"]
    assert all(2 <= len(labels) <= 6 for labels in iterations)
    assert _shown(dens.axes[0].xaxis) == _shown(dens.axes[0].yaxis) == \
        ["\N{MINUS SIGN}4", "\N{MINUS SIGN}2", "0", "2", "4"]
    # negative control: matplotlib's default locator puts nine labels on the iteration axis
    from matplotlib.ticker import AutoLocator

    fig.axes[0].xaxis.set_major_locator(AutoLocator())
    plots.png_bytes(fig, dpi=40)
    assert len(_shown(fig.axes[0].xaxis)) == 9


def test_the_in_view_locator_draws_the_same_ticks_with_fewer_tick_objects():
    # matplotlib makes a tick (two lines, a grid line, two labels) for each location its locator
    # gives, a step beyond the view on each side included, and draws those in view: _few() gives
    # only those, the picture the same
    from matplotlib.ticker import MaxNLocator

    rng = np.random.default_rng(1)
    grid = (np.linspace(-4.4, 4.4, 81), np.linspace(-4.4, 4.4, 81), np.full((80, 80), 1 / 6400))

    class Exact:
        def density_grid(self):
            return grid

    def draw(plain: bool):
        fig = plots.density(rng.normal(size=(500, 2)), Exact())
        if plain:  # (the same steps, every location kept)
            for ax in fig.axes:
                for axis in (ax.xaxis, ax.yaxis):
                    if isinstance(axis.get_major_locator(), plots._InView):
                        axis.set_major_locator(MaxNLocator(nbins=plots._NBINS,
                                                           steps=[1, 2, 2.5, 5, 10]))
        data = plots.png_bytes(fig, dpi=40)
        return data, sum(len(a.xaxis.majorTicks) + len(a.yaxis.majorTicks) for a in fig.axes)

    rng = np.random.default_rng(1)
    ours, n_ours = draw(False)
    rng = np.random.default_rng(1)
    plain, n_plain = draw(True)
    assert ours == plain  # the same pixels
    assert n_ours < n_plain  # negative control: the plain locator makes the ticks out of view
    assert all(isinstance(a.xaxis.get_major_locator(), plots._InView) for a in
               plots.density(rng.normal(size=(50, 2)), Exact()).axes[:3])

_SET_DOCS = """
import io, sys
from nrpt.report._matplotlib import without_set_docs
applied = without_set_docs() if sys.argv[1] == "lean" else False
import numpy as np
from matplotlib.lines import Line2D
from nrpt.report import figures as plots
line = Line2D([0, 1], [0, 1])
line.set(lw=3, color="r")
try:
    line.set(nonsense=1)
except AttributeError as err:
    message = str(err)
fig = plots.index_process(np.argsort(np.random.default_rng(0).random((400, 6)), axis=1))
sys.stdout.write(repr((applied, Line2D.set.__doc__ is None, Line2D.set.__qualname__,
                       line.get_linewidth(), line.get_color(), message,
                       without_set_docs(), plots.png_bytes(fig, dpi=40))))
"""


def test_matplotlib_without_set_docs_draws_the_same():
    # the program nrpt skips the help text matplotlib writes for each artist class's set() (a
    # third of its import): set() accepts, does and reports the same, the figures are the same
    import ast
    import os
    import subprocess
    import sys
    from pathlib import Path

    import nrpt

    env = dict(os.environ, PYTHONPATH=str(Path(nrpt.__file__).resolve().parents[1]),
               OMP_NUM_THREADS="1")
    got = {}
    for mode in ("lean", "plain"):
        r = subprocess.run([sys.executable, "-c", _SET_DOCS, mode], env=env,
                           capture_output=True, text=True, encoding="latin-1", timeout=300)
        assert r.returncode == 0, r.stderr
        got[mode] = ast.literal_eval(r.stdout)
    lean, plain = got["lean"], got["plain"]
    assert lean[0] is True and lean[1] is True  # applied: no generated docstring
    assert plain[0] is False and plain[1] is False  # negative control: matplotlib's own
    assert lean[2:6] == plain[2:6] == ("Line2D.set", 3.0, "r", lean[5])
    assert "nonsense" in lean[5]
    assert lean[6] is False and plain[6] is False  # too late once matplotlib.figure is loaded
    assert lean[7] == plain[7]  # the same PNG bytes
