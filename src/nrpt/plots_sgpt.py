"""Figures of a stochastic-gradient PT run (matplotlib, Agg backend, written as PNG).

:func:`run_figures` writes, into a run folder:

* ``density.png`` -- a 2-D histogram of the slot-0 samples beside the exact density (targets
  with ``density_grid``, e.g. the 25-mode target), or the 1-D histogram for 1-D targets;
* ``index.png`` -- the index process (slot of each replica over time, one replica highlighted);
* ``adaptation.png`` -- learning rates, per-pair swap-indicator rates and the buffer ``C`` over
  time (Fig. 4b/4d of Deng et al. 2023).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["run_figures", "density_panel", "index_panel", "adaptation_figure"]


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def density_panel(ax_s, ax_t, samples: np.ndarray, target, title: str = "slot-0 samples"):
    """Histogram of ``samples[n, 2]`` on ``ax_s`` and the exact cell masses on ``ax_t``."""
    xs, ys, probs = target.density_grid()
    h, _, _ = np.histogram2d(samples[:, 0], samples[:, 1], bins=(xs, ys))
    h = h / max(1, samples.shape[0])
    vmax = float(probs.max())
    ext = (xs[0], xs[-1], ys[0], ys[-1])
    ax_s.imshow(h.T, origin="lower", extent=ext, cmap="viridis", vmin=0, vmax=vmax)
    ax_s.set_title(title)
    ax_t.imshow(probs.T, origin="lower", extent=ext, cmap="viridis", vmin=0, vmax=vmax)
    ax_t.set_title("exact density")


def index_panel(ax, index: np.ndarray, system: int = 0, highlight: int = 0,
                max_points: int = 4000):
    """Slots of every replica over time (``index[K + 1, R, P]``), one highlighted in red."""
    idx = index[:, system, :]
    K = idx.shape[0]
    stop = min(K, max_points)
    t = np.arange(stop)
    for r in range(idx.shape[1]):
        if r != highlight:
            ax.plot(t, idx[:stop, r], color="0.75", lw=0.5)
    ax.plot(t, idx[:stop, highlight], color="tab:red", lw=1.0, label=f"replica {highlight}")
    ax.set_xlabel("iteration")
    ax.set_ylabel("slot")
    ax.legend(loc="upper right", fontsize=8)


def adaptation_figure(arrays: dict, swap_rate: float | None = None, system: int = 0):
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    k = arrays["k"]
    if "learning_rates" in arrays:
        lr = arrays["learning_rates"][:, system, :]
        axes[0].plot(k, lr, lw=0.8)
        axes[0].set_yscale("log")
        axes[0].set_title("learning rate per slot")
        rate = arrays["pair_rate"][:, system, :]
        window = max(1, len(k) // 50)
        kernel = np.ones(window) / window
        for p in range(rate.shape[1]):
            axes[1].plot(k[window - 1:], np.convolve(rate[:, p], kernel, mode="valid"), lw=0.7)
        if swap_rate is not None:
            axes[1].axhline(swap_rate, color="k", ls="--", lw=1, label=f"S = {swap_rate}")
            axes[1].legend(fontsize=8)
        axes[1].set_title("swap indicator rate per pair (moving average)")
        axes[1].set_ylim(-0.02, 1.02)
    if "C" in arrays:
        axes[2].plot(k, arrays["C"][:, system])
        axes[2].set_title("correction buffer C")
    for ax in axes:
        ax.set_xlabel("iteration")
    fig.tight_layout()
    return fig


def run_figures(out, samples: np.ndarray, index: np.ndarray, arrays: dict, target,
                summary: dict) -> list[Path]:
    """Write the run's figures into ``out``; returns their paths."""
    plt = _plt()
    out = Path(out)
    written = []
    x = samples if samples.ndim == 2 else samples[0]
    if x.shape[1] == 2 and hasattr(target, "density_grid"):
        fig, axes = plt.subplots(1, 2, figsize=(10, 4.6))
        density_panel(axes[0], axes[1], x, target)
        fig.tight_layout()
        fig.savefig(out / "density.png", dpi=110)
        plt.close(fig)
        written.append(out / "density.png")
    elif x.shape[1] == 1:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.hist(x[:, 0], bins=200, density=True, alpha=0.7, label="slot-0 samples")
        if hasattr(target, "density_grid"):
            edges, probs = target.density_grid()
            ax.stairs(probs / np.diff(edges), edges, color="k", label="exact")
        ax.legend()
        fig.savefig(out / "density.png", dpi=110)
        plt.close(fig)
        written.append(out / "density.png")
    fig, ax = plt.subplots(figsize=(10, 4))
    index_panel(ax, index)
    ax.set_title(f"index process ({summary.get('scheme')}, W = {summary.get('window')})")
    fig.tight_layout()
    fig.savefig(out / "index.png", dpi=110)
    plt.close(fig)
    written.append(out / "index.png")
    if len(arrays.get("k", [])):
        fig = adaptation_figure(arrays, summary.get("swap_rate_target"))
        fig.savefig(out / "adaptation.png", dpi=110)
        plt.close(fig)
        written.append(out / "adaptation.png")
    return written
