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


@pytest.mark.parametrize("height", [3.3, 2.0])  # 495 / 300 rows: blocks of 64 and a rest
def test_png_writer_stores_the_pixels_savefig_draws(height):
    fig = _busy_figure(height)
    ours = plots.png_bytes(fig, dpi=150)
    buf = io.BytesIO()
    with rc_context({"text.hinting": "no_hinting"}):  # (the writer draws text unhinted)
        fig.savefig(buf, dpi=150, format="png")
    theirs = _pixels(buf.getvalue())
    got = _pixels(ours)
    assert got.shape == theirs.shape == (round(150 * height), round(150 * 4.1), 4)
    assert np.array_equal(got, theirs)
    with Image.open(io.BytesIO(ours)) as im:
        assert im.format == "PNG" and im.mode == "RGBA"
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
