"""Local communication barrier by the slides' "Method I" (Syed et al. 2021, JRSS-B, Sec. 4)::

    lambda(b) = (1/2) E |V(X) - V(Y)|,    X, Y iid pi_b,

``V`` the tempered part of the log density (``-l`` geometric, ``U`` temperature).  Estimated
per slot by Gini's mean difference of the energies :class:`SlotEnergyRecorder` keeps over a
round; a cross-check of the rejection-based curve (:meth:`nrpt.adapt.BarrierFit.local`)."""

from __future__ import annotations

import math

import numpy as np
import torch

from nrpt.recorders.stats import per_system
from nrpt.roles import IterationBlock, RecorderBase

__all__ = ["SlotEnergyRecorder", "mean_absolute_difference", "method_one"]


def mean_absolute_difference(values: np.ndarray, axis: int = 0) -> np.ndarray:
    """``(2 / (n (n-1))) sum_{i<j} |x_i - x_j|`` along ``axis``, ignoring non-finite entries
    (NaN where fewer than two finite values remain)."""
    x = np.moveaxis(np.asarray(values, dtype=float), axis, 0)
    x = np.where(np.isfinite(x), x, np.nan)
    n = np.sum(np.isfinite(x), axis=0)
    xs = np.sort(x, axis=0)  # NaN sorts last
    i = np.arange(1, x.shape[0] + 1).reshape((-1,) + (1,) * (x.ndim - 1))
    weights = 2 * i - n - 1  # coefficient of the i-th smallest of n finite values
    total = np.nansum(np.where(i <= n, weights * xs, 0.0), axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = 2.0 * total / (n * (n - 1.0))
    return np.where(n >= 2, out, np.nan)


def method_one(slot_energies: np.ndarray) -> np.ndarray:
    """Method I local barrier ``(1/2) E|V(X) - V(Y)|`` per slot from ``V`` recorded by slot,
    ``[n, R, P] -> [R, P]`` (or ``[n, P] -> [P]``)."""
    return 0.5 * mean_absolute_difference(slot_energies, axis=0)


class SlotEnergyRecorder(RecorderBase):
    """Recorder (``slot_energies``) keeping ``V`` of the replica at every slot, ``[n, R, P]``,
    for one round.

    The loop calls ``start_segment(reset=True, length)`` at the beginning of each round (which
    calls :meth:`start` with the round's length); at most ``max_rows`` rows are kept (every
    ``ceil(n / max_rows)``-th iteration), preallocated on the engine's device, so memory stays
    flat however long the round.
    """

    def __init__(self, systems: int, slots: int, max_rows: int = 4096, dtype=torch.float64,
                 device="cpu"):
        if int(max_rows) != max_rows or max_rows < 2:
            raise ValueError(f"max_rows must be an integer >= 2; got {max_rows!r}")
        self.R, self.P, self.max_rows = int(systems), int(slots), int(max_rows)
        self.dtype, self.device = dtype, device
        self.start(self.max_rows)

    def start(self, n_iterations: int) -> None:
        self.stride = max(1, math.ceil(int(n_iterations) / self.max_rows))
        rows = min(self.max_rows, max(1, int(n_iterations)))
        self.buffer = torch.empty(rows, self.R, self.P, dtype=self.dtype, device=self.device)
        self.rows = 0
        self._count = 0

    name = "slot_energies"

    def start_segment(self, reset: bool, length: int = 0) -> None:
        if reset:
            self.start(max(int(length), 1))

    def follow_ladder(self, m) -> None:
        """The ladder grew: an empty buffer of the new width (a new round starts anyway)."""
        self.P = int(m.new)
        self.start(self.max_rows)

    def record(self, it) -> None:
        if self._count % self.stride == 0 and self.rows < self.buffer.shape[0]:
            self.buffer[self.rows] = it.slot_energies
            self.rows += 1
        self._count += 1

    def record_block(self, block: IterationBlock) -> None:
        """``U`` iterations at once: the rows ``u`` with ``(count + u) % stride == 0``, while
        the buffer has room, copied with one slice."""
        U, stride = block.U, self.stride
        first = -self._count % stride
        m = min(self.buffer.shape[0] - self.rows, len(range(first, U, stride)))
        if m > 0:
            rows = block.slot_energies[first:first + (m - 1) * stride + 1:stride]
            self.buffer[self.rows:self.rows + m] = rows
            self.rows += m
        self._count += U

    def summary(self) -> dict:
        return {"local_barrier_method_i": per_system(self.local_barrier(), self.R)}

    def segment_row(self) -> dict:
        return {}

    def state_dict(self) -> dict:
        return {"stride": self.stride, "rows": self.rows, "count": self._count,
                "buffer": self.buffer[:self.rows].clone(), "size": self.buffer.shape[0]}

    def load_state_dict(self, sd: dict) -> None:
        self.stride, self.rows, self._count = int(sd["stride"]), int(sd["rows"]), int(sd["count"])
        self.buffer = torch.empty(int(sd["size"]), self.R, self.P, dtype=self.dtype,
                                  device=self.device)
        self.buffer[:self.rows] = sd["buffer"].to(self.buffer)

    def values(self) -> np.ndarray:
        """The recorded ``V`` by slot, ``[rows, R, P]`` (host copy)."""
        return self.buffer[:self.rows].detach().cpu().numpy()

    def local_barrier(self) -> np.ndarray:
        """Method I estimate per slot, ``[R, P]``."""
        return method_one(self.values())
