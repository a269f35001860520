"""The ``draws`` recorder: target-slot draws, their energies and the index process, streamed.

Records are written in chunks: the engine keeps a small device buffer and copies it to the
host once per chunk (the only host sync of a run, besides the progress bar).  The sinks are
NumPy arrays preallocated for the whole run — in memory, or ``.npy`` files opened as memory
maps in the run folder, so a long run has flat memory and a crash loses at most what was not
flushed yet (the checkpoint is written right after a flush, so a resumed run rewrites the same
rows).

Layouts (``R`` systems, ``P`` slots, ``K`` iterations, ``n = K // thin`` draws):

* ``samples``  ``[n, dim]`` when R = 1, else ``[R, n, dim]`` — the state at slot 0 after
  iteration ``thin - 1, 2 thin - 1, ...`` (with ``slots="all"``: ``[R, n, P, dim]``, the states
  of every slot, for the no-swap baselines);
* ``energies`` ``[n]`` / ``[R, n]`` — the tempered part ``v`` of those states;
* ``index``    ``[K + 1, R, P]`` int16 — ``slot_of[replica]`` before the first iteration (row 0)
  and after each iteration.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from .roles import RecorderBase

__all__ = ["Draws"]


def _open(path: Path | None, shape: tuple[int, ...], dtype, resume: bool) -> np.ndarray:
    if path is None:
        return np.zeros(shape, dtype=dtype)
    if resume and path.exists():
        arr = np.load(path, mmap_mode="r+")
        if arr.shape == shape and arr.dtype == np.dtype(dtype):
            return arr
        grown = [i for i, (a, b) in enumerate(zip(arr.shape, shape, strict=False)) if a != b]
        if arr.ndim != len(shape) or len(grown) != 1 or arr.shape[grown[0]] > shape[grown[0]]:
            raise ValueError(f"cannot resume: {path} has shape {arr.shape}, expected {shape}")
        # a longer budget (nrpt resume --iterations): copy into a larger file, then rename
        tmp = path.with_name(path.stem + ".grow.npy")
        new = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=shape)
        new[tuple(slice(0, n) for n in arr.shape)] = arr
        new.flush()
        del arr, new
        os.replace(tmp, path)
        return np.load(path, mmap_mode="r+")
    return np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)


#: records held in memory (no run folder) beyond this many bytes are refused
MAX_MEMORY_BYTES = 4 * 2 ** 30


def _check_size(K: int, R: int, P: int, dim: int, n: int, slots: str, item: int,
                out: Path | None) -> None:
    per = dim if slots == "target" else P * dim
    need = R * n * (per + (1 if slots == "target" else P)) * item + (K + 1) * R * P * 2
    gib = need / 2 ** 30
    if out is None and need > MAX_MEMORY_BYTES:
        raise ValueError(f"the run's records would take {gib:.1f} GiB of memory (iterations or "
                         f"rounds too large for thin = {n and K // n}): lower iterations / "
                         f"rounds, raise thin, or give out (a run folder: records streamed to "
                         f"disk)")
    if out is not None:
        import shutil

        probe = next((p for p in [out, *out.parents] if p.exists()), None)
        if probe is not None and need > shutil.disk_usage(probe).free:
            raise ValueError(f"the run's records would take {gib:.1f} GiB but {probe} has "
                             f"{shutil.disk_usage(probe).free / 2 ** 30:.1f} GiB free: lower "
                             f"iterations / rounds or raise thin")


class Draws(RecorderBase):
    """Recorder (``draws``, :mod:`nrpt.roles`) streaming the run's records in chunks."""

    name = "draws"

    def __init__(self, n_iterations: int, R: int, P: int, dim: int, *, thin: int = 1,
                 out_dir: str | os.PathLike | None = None, dtype=np.float64, chunk: int = 512,
                 resume: bool = False, slots: str = "target", store: bool = True):
        if int(thin) != thin or thin < 1:
            raise ValueError(f"thin must be an integer >= 1; got {thin!r}")
        if slots not in ("target", "all"):
            raise ValueError(f"slots must be 'target' or 'all'; got {slots!r}")
        self.K, self.R, self.P, self.dim, self.thin = int(n_iterations), R, P, dim, int(thin)
        self.slots = slots
        self.n_draws = self.K // self.thin
        self.chunk = int(chunk)
        out = Path(out_dir) if out_dir is not None else None
        #: False on the ranks of a distributed run that do not write (they still take part in
        #: the gathers of the recorded rows); their arrays are empty
        self.store = bool(store)
        if not self.store:
            self.n_draws, out = 0, None
        _check_size(self.K, R, P, dim, self.n_draws, slots, np.dtype(dtype).itemsize, out)
        tail = (dim,) if slots == "target" else (P, dim)
        e_tail = () if slots == "target" else (P,)
        s_shape = (self.n_draws, *tail) if R == 1 else (R, self.n_draws, *tail)
        e_shape = (self.n_draws, *e_tail) if R == 1 else (R, self.n_draws, *e_tail)
        self.samples = _open(out / "samples.npy" if out else None, s_shape, dtype, resume)
        self.energies = _open(out / "energies.npy" if out else None, e_shape, dtype, resume)
        self.index = _open(out / "index.npy" if out else None,
                           (self.K + 1 if self.store else 0, R, P), np.int16, resume)
        # views with the system axis first, for uniform writing
        self._s = self.samples.reshape(R, self.n_draws, *tail)
        self._e = self.energies.reshape(R, self.n_draws, *e_tail)
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
        if self.store:
            self.index[0] = slot_of.to("cpu", torch.int16).numpy()
        self._next_row = 1

    def record(self, it) -> None:
        """Record one :class:`~nrpt.roles.Iteration` (``it.k`` 0-based)."""
        if not self.store:
            if (it.k + 1) % self.thin == 0:  # the rows are gathered on every rank
                it.slot_x([0] if self.slots == "target" else list(range(self.P)))
            return
        self._buf_i.append(it.slot_of.to(torch.int16))
        if (it.k + 1) % self.thin == 0:
            if self.slots == "target":
                x = it.slot_x([0]).squeeze(1)
                v = it.slot_energies[:, 0]
            else:
                x, v = it.slot_x(list(range(self.P))), it.slot_energies
            self._buf_x.append(x.detach().clone())
            self._buf_v.append(v.detach().clone())
        if len(self._buf_i) >= self.chunk:
            self.flush()

    def state_dict(self) -> dict:
        self.flush()
        return {"next_row": self._next_row, "next_draw": self._next_draw}

    def load_state_dict(self, sd: dict) -> None:
        self._next_row, self._next_draw = int(sd["next_row"]), int(sd["next_draw"])

    def flush(self) -> None:
        if self._buf_i:
            rows = torch.stack(self._buf_i).cpu().numpy()
            self.index[self._next_row:self._next_row + len(rows)] = rows
            self._next_row += len(rows)
            self._buf_i.clear()
        if self._buf_x:
            xs = torch.stack(self._buf_x, dim=1).cpu().numpy()  # [R, c, (P,) dim]
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

    def arrays(self, first: int, done: int) -> dict[str, np.ndarray]:
        """Views of the draws of iterations ``first .. done - 1`` and the index process of
        iterations ``0 .. done`` (rows ``0 .. done``)."""
        a, b = first // self.thin, done // self.thin
        if self.R == 1:
            return {"samples": self.samples[a:b], "energies": self.energies[a:b],
                    "index": self.index[:done + 1]}
        return {"samples": self.samples[:, a:b], "energies": self.energies[:, a:b],
                "index": self.index[:done + 1]}
