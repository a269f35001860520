"""Recorders: target-slot draws, slot-0 energies and the index process, streamed to arrays.

Records are written in chunks: the engine keeps a small device buffer and copies it to the
host once per chunk (the only host sync of a run, besides the progress bar).  The sinks are
NumPy arrays preallocated for the whole run — in memory, or ``.npy`` files opened as memory
maps in the run folder, so a long run has flat memory and a crash loses at most what was not
flushed yet (the checkpoint is written right after a flush, so a resumed run rewrites the same
rows).

Layouts (``R`` systems, ``P`` slots, ``K`` iterations, ``n = K // thin`` draws):

* ``samples``  ``[n, dim]`` when R = 1, else ``[R, n, dim]`` — the state at slot 0 after
  iteration ``thin - 1, 2 thin - 1, ...``;
* ``energies`` ``[n]`` / ``[R, n]`` — the tempered part ``v`` of those states;
* ``index``    ``[K + 1, R, P]`` int16 — ``slot_of[replica]`` before the first iteration (row 0)
  and after each iteration.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

__all__ = ["Recorder"]


def _open(path: Path | None, shape: tuple[int, ...], dtype, resume: bool) -> np.ndarray:
    if path is None:
        return np.zeros(shape, dtype=dtype)
    if resume and path.exists():
        arr = np.load(path, mmap_mode="r+")
        if arr.shape != shape or arr.dtype != np.dtype(dtype):
            raise ValueError(f"cannot resume: {path} has shape {arr.shape}, expected {shape}")
        return arr
    return np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)


class Recorder:
    def __init__(self, n_iterations: int, R: int, P: int, dim: int, *, thin: int = 1,
                 out_dir: str | os.PathLike | None = None, dtype=np.float64, chunk: int = 512,
                 resume: bool = False):
        if int(thin) != thin or thin < 1:
            raise ValueError(f"thin must be an integer >= 1; got {thin!r}")
        self.K, self.R, self.P, self.dim, self.thin = int(n_iterations), R, P, dim, int(thin)
        self.n_draws = self.K // self.thin
        self.chunk = int(chunk)
        out = Path(out_dir) if out_dir is not None else None
        s_shape = (self.n_draws, dim) if R == 1 else (R, self.n_draws, dim)
        e_shape = (self.n_draws,) if R == 1 else (R, self.n_draws)
        self.samples = _open(out / "samples.npy" if out else None, s_shape, dtype, resume)
        self.energies = _open(out / "energies.npy" if out else None, e_shape, dtype, resume)
        self.index = _open(out / "index.npy" if out else None, (self.K + 1, R, P), np.int16,
                           resume)
        # views with the system axis first, for uniform writing
        self._s = self.samples.reshape(R, self.n_draws, dim)
        self._e = self.energies.reshape(R, self.n_draws)
        self._buf_x: list[torch.Tensor] = []
        self._buf_v: list[torch.Tensor] = []
        self._buf_i: list[torch.Tensor] = []
        self._next_draw = 0
        self._next_row = 0

    def set_position(self, n_done: int) -> None:
        """Resume writing after ``n_done`` completed iterations (row 0 is already written)."""
        self._next_row = n_done + 1
        self._next_draw = n_done // self.thin

    def initial(self, slot_of: torch.Tensor) -> None:
        self.index[0] = slot_of.to("cpu", torch.int16).numpy()
        self._next_row = 1

    def record(self, k: int, x0: torch.Tensor, v0: torch.Tensor, slot_of: torch.Tensor) -> None:
        """Record iteration ``k`` (0-based): ``x0[R, dim]``, ``v0[R]`` at slot 0, ``slot_of``."""
        self._buf_i.append(slot_of.to(torch.int16))
        if (k + 1) % self.thin == 0:
            self._buf_x.append(x0.detach().clone())
            self._buf_v.append(v0.detach().clone())
        if len(self._buf_i) >= self.chunk:
            self.flush()

    def flush(self) -> None:
        if self._buf_i:
            rows = torch.stack(self._buf_i).cpu().numpy()
            self.index[self._next_row:self._next_row + len(rows)] = rows
            self._next_row += len(rows)
            self._buf_i.clear()
        if self._buf_x:
            xs = torch.stack(self._buf_x, dim=1).cpu().numpy()  # [R, c, dim]
            vs = torch.stack(self._buf_v, dim=1).cpu().numpy()
            c = xs.shape[1]
            self._s[:, self._next_draw:self._next_draw + c] = xs
            self._e[:, self._next_draw:self._next_draw + c] = vs
            self._next_draw += c
            self._buf_x.clear()
            self._buf_v.clear()
        for arr in (self.samples, self.energies, self.index):
            if isinstance(arr, np.memmap):
                arr.flush()

    def truncated(self, n_done: int) -> dict[str, np.ndarray]:
        """Views of the records of the first ``n_done`` iterations (for interrupted runs)."""
        n = n_done // self.thin
        if self.R == 1:
            return {"samples": self.samples[:n], "energies": self.energies[:n],
                    "index": self.index[:n_done + 1]}
        return {"samples": self.samples[:, :n], "energies": self.energies[:, :n],
                "index": self.index[:n_done + 1]}
