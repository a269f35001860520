"""The ``draws`` recorder: target-slot draws, their energies and the index process, streamed.

Records are written in chunks: the engine keeps a small device buffer and copies it to the
host once per chunk (the only host sync of a run, besides the progress bar).  The sinks are
NumPy arrays preallocated for the whole run — in memory, or ``.npy`` files opened as memory
maps in the run folder, so a long run has flat memory (after each flush the written pages are
released from the process) and a crash loses at most what was not flushed yet (the checkpoint
is written right after a flush, so a resumed run rewrites the same rows).

A run folder's files hold only valid rows once the run ends or stops: :meth:`Draws.close` cuts
them (a rewritten header and ``os.truncate`` when the rows are the leading axis, a copy when
they are not: ``[R, n, ...]`` with R > 1).  A resumption checks each file before mapping it
(present, as long as its header says -- a memory map would zero-extend a truncated file --, the
right shape and dtype) and against the rows the checkpoint needs, then grows it back.  After
``kill -9`` the files keep their full preallocated length; the checkpoint (and its sidecar
``checkpoint.json``) says which rows are valid.

Layouts (``R`` systems, ``P`` slots, ``K`` iterations, ``n = K // thin`` draws):

* ``samples``  ``[n, dim]`` when R = 1, else ``[R, n, dim]`` — the state at slot 0 after
  iteration ``thin - 1, 2 thin - 1, ...`` (with ``slots="all"``: ``[R, n, P, dim]``, the states
  of every slot, for the no-swap baselines);
* ``energies`` ``[n]`` / ``[R, n]`` — the tempered part ``v`` of those states;
* ``index``    ``[K + 1, R, P]`` int16 (int32 above 32,768 slots: :func:`index_dtype`) —
  ``slot_of[replica]`` before the first iteration (row 0)
  and after each iteration.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from pathlib import Path

import numpy as np
import torch

from .roles import IterationBlock, RecorderBase

__all__ = ["Draws"]


def _release(arr: np.memmap) -> None:
    """Drop the written pages of a file map from this process's resident set (they were just
    written back; the page cache keeps them): a long run's memory stays flat."""
    mm = getattr(arr, "_mmap", None)
    shared = getattr(arr, "mode", None) in ("r+", "w+")  # never a private (copy-on-write) map
    if mm is not None and shared and hasattr(mmap, "MADV_DONTNEED"):
        with contextlib.suppress(OSError, ValueError):
            mm.madvise(mmap.MADV_DONTNEED)


def _layout(path: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    """``(shape, dtype, data offset)`` of a ``.npy`` file, from its header alone."""
    with open(path, "rb") as fh:
        try:
            major, _ = np.lib.format.read_magic(fh)
            read = {1: np.lib.format.read_array_header_1_0,
                    2: np.lib.format.read_array_header_2_0}[major]
            shape, fortran, dtype = read(fh)
        except (ValueError, KeyError, OSError, SyntaxError) as err:
            raise ValueError(f"cannot resume: {path} is not a readable .npy file "
                             f"({type(err).__name__}: {err})") from None
        if fortran:
            raise ValueError(f"cannot resume: {path} is in Fortran order (not written by nrpt)")
        return tuple(int(n) for n in shape), dtype, fh.tell()


def _set_shape(path: Path, shape: tuple[int, ...]) -> None:
    """Rewrite the header of ``path`` in place for ``shape`` (same dtype, same header length:
    numpy pads headers, and a shape that differs only in its leading axis fits)."""
    _, dtype, offset = _layout(path)
    with open(path, "r+b") as fh:
        major, _ = np.lib.format.read_magic(fh)
        start = fh.tell() + (2 if major == 1 else 4)
        descr, dims = np.lib.format.dtype_to_descr(dtype), tuple(int(n) for n in shape)
        text = f"{{'descr': {descr!r}, 'fortran_order': False, 'shape': {dims!r}, }}"
        room = offset - start - 1
        if len(text) > room:
            raise ValueError(f"{path}: the header has no room for shape {shape}")
        fh.seek(start)
        fh.write((text + " " * (room - len(text)) + "\n").encode("latin1"))
        fh.flush()
        os.fsync(fh.fileno())


def _resize(path: Path, shape: tuple[int, ...], axis: int) -> None:
    """Give ``path`` the row count of ``shape`` along ``axis`` (the other axes agree): in place
    for the leading axis (header and size; the size is changed so that a crash in between
    leaves a file at least as long as its header says), by a copy for an inner axis."""
    have, dtype, offset = _layout(path)
    if tuple(have) == tuple(shape):
        return
    n_bytes = offset + int(np.prod(shape)) * dtype.itemsize
    if axis == 0:
        try:
            if shape[0] > have[0]:
                os.truncate(path, n_bytes)  # zeros
                _set_shape(path, shape)
            else:
                _set_shape(path, shape)
                os.truncate(path, n_bytes)
            return
        except ValueError:
            pass  # no room in the header: copy
    from .runfolder import temporary

    fd, tmp = temporary(path)
    os.close(fd)
    try:
        old = np.load(path, mmap_mode="r")
        new = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=tuple(shape))
        keep = min(have[axis], shape[axis])
        cut = tuple(slice(0, keep) if i == axis else slice(None) for i in range(len(shape)))
        if axis == 0:
            new[cut] = old[cut]
        else:
            for i in range(shape[0]):  # one system at a time: flat memory
                new[i][cut[1:]] = old[i][cut[1:]]
        new.flush()
        del old, new
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _check(path: Path, shape: tuple[int, ...], dtype, axis: int) -> int:
    """Check a record file a resumption reopens, before anything maps it: it exists, is as long
    as its header says (a memory map would silently zero-extend a truncated file), and agrees
    with ``shape`` except in its row count along ``axis``; returns that row count."""
    if not path.exists():
        raise ValueError(f"cannot resume: {path} is missing (deleted?): the run's records are "
                         f"gone; start a new run (overwrite=True / --overwrite)")
    have, have_dtype, offset = _layout(path)
    need = offset + int(np.prod(have)) * have_dtype.itemsize
    size = path.stat().st_size
    if size < need:
        raise ValueError(f"cannot resume: {path} is truncated: {size} bytes, but its header "
                         f"describes {have} {have_dtype} ({need} bytes)")
    others = [i for i in range(len(shape)) if i != axis]
    if have_dtype != np.dtype(dtype) or len(have) != len(shape) or \
            any(have[i] != shape[i] for i in others) or have[axis] > shape[axis]:
        raise ValueError(f"cannot resume: {path} has shape {have} {have_dtype}, this run needs "
                         f"{shape} {np.dtype(dtype)} (rows along axis {axis}; not this run's "
                         f"file?)")
    return have[axis]


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


def index_dtype(P: int) -> np.dtype:
    """The dtype of the index process (``slot_of``, values ``0 .. P - 1``) of ``P`` slots: int16
    up to 32,768 slots, int32 above (int16 wrapped around past 32,767: issue 26)."""
    return np.dtype(np.int16) if int(P) - 1 <= np.iinfo(np.int16).max else np.dtype(np.int32)


def index_torch_dtype(P: int) -> torch.dtype:
    """:func:`index_dtype` as a torch dtype."""
    return torch.int16 if index_dtype(P) == np.int16 else torch.int32


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
        self.reads_slots = (0,) if slots == "target" else tuple(range(P))
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
        row_axis = 0 if R == 1 else 1
        self._paths = None if out is None else {
            "samples": (out / "samples.npy", s_shape, dtype, row_axis),
            "energies": (out / "energies.npy", e_shape, dtype, row_axis),
            "index": (out / "index.npy", (self.K + 1, R, P), index_dtype(P), 0)}
        self._disk: dict[str, int] | None = None
        self._tail, self._e_tail = tail, e_tail
        if out is None:
            self.samples = np.zeros(s_shape, dtype=dtype)
            self.energies = np.zeros(e_shape, dtype=dtype)
            self.index = np.zeros((self.K + 1 if self.store else 0, R, P), dtype=index_dtype(P))
        elif resume:  # checked now, reopened by load_state_dict once the rows needed are known
            self._disk = {name: _check(*spec) for name, spec in self._paths.items()}
            self.samples = self.energies = self.index = self._s = self._e = None
        else:
            self.samples, self.energies, self.index = (
                np.lib.format.open_memmap(path, mode="w+", dtype=dt, shape=shape)
                for path, shape, dt, _ in self._paths.values())
        if self.samples is not None:
            self._views()
        self._buf_x: list[torch.Tensor] = []
        self._buf_v: list[torch.Tensor] = []
        # index rows [n, R, P], draws [n, R, (P,) dim] and energies [n, R, (P)] per entry
        self._buf_i: list[torch.Tensor] = []
        self._buf_rows = 0
        self._next_draw = 0
        self._next_row = 0

    def _views(self) -> None:
        """Views with the system axis first, for uniform writing."""
        n = self.samples.shape[0 if self.R == 1 else 1]
        self._s = self.samples.reshape(self.R, n, *self._tail)
        self._e = self.energies.reshape(self.R, n, *self._e_tail)

    def initial(self, slot_of: torch.Tensor) -> None:
        if self.store:
            self.index[0] = slot_of.to("cpu", index_torch_dtype(self.P)).numpy()
        self._next_row = 1

    def record(self, it) -> None:
        """Record one :class:`~nrpt.roles.Iteration` (``it.k`` 0-based)."""
        draw = (it.k + 1) % self.thin == 0
        x = it.slot_x(self.reads_slots) if draw else None  # every rank takes part in the gather
        if not self.store:
            return
        self._buffer(it.slot_of.to(index_torch_dtype(self.P))[None])
        if draw:
            if self.slots == "target":
                x, v = x.squeeze(1), it.slot_energies[:, 0]
            else:
                v = it.slot_energies
            self._buf_x.append(x.detach().clone()[None])
            self._buf_v.append(v.detach().clone()[None])
        if self._buf_rows >= self.chunk:
            self.flush()

    def record_block(self, block: IterationBlock) -> None:
        """Record ``U`` iterations at once: the block's index rows, and its draws (the
        iterations ``k`` with ``(k + 1) % thin == 0``: one strided slice) copied out of the
        block; the files end as with ``U`` calls of :meth:`record`."""
        if not self.store:
            return
        self._buffer(block.slot_of.to(index_torch_dtype(self.P), copy=True))
        first = (self.thin - (block.k0 + 1) % self.thin) % self.thin
        if first < block.U:
            x = block.watched_x(self.reads_slots)[first::self.thin]  # [D, R, S, dim]
            v = block.slot_energies[first::self.thin]  # [D, R, P]
            if self.slots == "target":
                x, v = x[:, :, 0], v[:, :, 0]
            # copies: the buffers must not hold views of the block
            self._buf_x.append(x.detach().clone())
            self._buf_v.append(v.detach().clone())
        if self._buf_rows >= self.chunk:
            self.flush()

    def _buffer(self, rows: torch.Tensor) -> None:
        """Hold index rows ``[n, R, P]`` (:func:`index_dtype`) until the next flush."""
        self._buf_i.append(rows)
        self._buf_rows += rows.shape[0]

    def state_dict(self) -> dict:
        self.flush()
        return {"next_row": self._next_row, "next_draw": self._next_draw}

    def load_state_dict(self, sd: dict) -> None:
        self._next_row, self._next_draw = int(sd["next_row"]), int(sd["next_draw"])
        if self._disk is not None:
            for name, need in (("index", self._next_row), ("samples", self._next_draw),
                               ("energies", self._next_draw)):
                if self._disk[name] < need:
                    raise ValueError(
                        f"cannot resume: {self._paths[name][0]} holds {self._disk[name]} rows "
                        f"but the checkpoint needs {need}: the file was cut short or replaced; "
                        f"restore it or start a new run (overwrite=True / --overwrite)")
            self._reopen("r+", {name: spec[1] for name, spec in self._paths.items()})

    def valid_rows(self) -> dict[str, int]:
        """Rows of each record written so far."""
        return {"samples": self._next_draw, "energies": self._next_draw,
                "index": self._next_row}

    def close(self) -> None:
        """Flush, and cut the record files to their valid rows (a run's end or interruption: a
        reader of the folder sees only real draws; a resumption grows them back).  The arrays
        stay readable, as copy-on-write maps of the cut files."""
        self.flush()
        if self._paths is None:
            return
        rows = self.valid_rows()
        self._reopen("c", {name: tuple(rows[name] if i == axis else n for i, n in
                                       enumerate(shape))
                           for name, (_, shape, _, axis) in self._paths.items()})

    def _reopen(self, mode: str, shapes: dict[str, tuple[int, ...]]) -> None:
        """Resize the record files to ``shapes`` and map them again (``mode`` of np.load)."""
        # no map of the files may outlive a truncation
        self.samples = self.energies = self.index = self._s = self._e = None
        for name, (path, _, _, axis) in self._paths.items():
            _resize(path, shapes[name], axis)
        self.samples, self.energies, self.index = (
            np.load(self._paths[n][0], mmap_mode=mode) for n in ("samples", "energies", "index"))
        self._views()

    def flush(self) -> None:
        if self._buf_i:
            rows = torch.cat(self._buf_i).cpu().numpy()
            self.index[self._next_row:self._next_row + len(rows)] = rows
            self._next_row += len(rows)
            self._buf_i.clear()
            self._buf_rows = 0
        if self._buf_x:
            xs = torch.cat(self._buf_x).movedim(0, 1).cpu().numpy()  # [R, c, (P,) dim]
            vs = torch.cat(self._buf_v).movedim(0, 1).cpu().numpy()
            c = xs.shape[1]
            self._s[:, self._next_draw:self._next_draw + c] = xs
            self._e[:, self._next_draw:self._next_draw + c] = vs
            self._next_draw += c
            self._buf_x.clear()
            self._buf_v.clear()
        for arr in (self.samples, self.energies, self.index):
            if isinstance(arr, np.memmap):
                arr.flush()
                _release(arr)

    def arrays(self, first: int, done: int) -> dict[str, np.ndarray]:
        """Views of the draws of iterations ``first .. done - 1`` and the index process of
        iterations ``0 .. done`` (rows ``0 .. done``)."""
        a, b = first // self.thin, done // self.thin
        if self.R == 1:
            return {"samples": self.samples[a:b], "energies": self.energies[a:b],
                    "index": self.index[:done + 1]}
        return {"samples": self.samples[:, a:b], "energies": self.energies[:, a:b],
                "index": self.index[:done + 1]}
