"""The ``draws`` recorder: target-slot draws, their energies and the index process, streamed.

Records go into NumPy arrays preallocated for the whole run: in memory, or ``.npy`` memory
maps in the run folder (``posix_fallocate``d; never opened through a symbolic link; written
pages released every ``chunk`` rows).  A fused block on the CPU is copied straight in; rows on
an accelerator (or recorded one iteration at a time) wait in a small device buffer copied to
the host once per chunk.  The maps are forced to disk (``msync``) only by :meth:`Draws.flush`
(each checkpoint, the close): a crash of the process loses no written row (they are in the
page cache), and a checkpoint's rows are on disk before the checkpoint is.  The checkpoint is
written right after a flush and holds the sha256 of every :data:`BLOCK_BYTES` block of valid
rows; a resumption checks each file (present, header length, shape, dtype, hashes) before
mapping it, refuses a damaged or foreign file, and grows it back.  :meth:`Draws.close` cuts
the files to their valid rows.

Layouts (``R`` systems, ``P`` slots, ``K`` iterations, ``n = K // thin`` draws):

* ``samples``  ``[n, dim]`` when R = 1, else ``[R, n, dim]`` — the slot-0 state after
  iterations ``thin - 1, 2 thin - 1, ...`` (``slots="all"``: ``[R, n, P, dim]``);
* ``energies`` ``[n]`` / ``[R, n]`` — the tempered part ``v`` of those states;
* ``index``    ``[K + 1, R, P]`` (dtype :func:`index_dtype`) — ``slot_of[replica]`` before the
  first iteration (row 0) and after each iteration.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import mmap
import os
from pathlib import Path

import numpy as np
import torch

from nrpt.roles import IterationBlock, RecorderBase

__all__ = ["Draws"]


def _release(arr: np.memmap) -> None:
    """Drop the written pages of a file map from this process's resident set: a long run's
    memory stays flat.  The page cache keeps them (a shared file map: dirty pages are not
    discarded), written back by the kernel or by the next :meth:`Draws.flush`'s msync."""
    mm = getattr(arr, "_mmap", None)
    shared = getattr(arr, "mode", None) in ("r+", "w+")  # never a private (copy-on-write) map
    if mm is not None and shared and hasattr(mmap, "MADV_DONTNEED"):
        with contextlib.suppress(OSError, ValueError):
            mm.madvise(mmap.MADV_DONTNEED)


class _NoRoom(ValueError):
    """A header without room for a new shape (the file is then copied)."""


def _open(path: Path, write: bool = False):
    """A record file opened in place: never through a symbolic link, only a regular file with
    one name (:func:`nrpt.files.open_fd`)."""
    from nrpt.files import open_fd

    fd = open_fd(path, os.O_RDWR if write else os.O_RDONLY)
    return os.fdopen(fd, "r+b" if write else "rb")


def _header(fh, path: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    """``(shape, dtype, data offset)`` from the header of the open ``.npy`` file ``fh``."""
    try:
        major, _ = np.lib.format.read_magic(fh)
        read = {1: np.lib.format.read_array_header_1_0,
                2: np.lib.format.read_array_header_2_0}[major]
        shape, fortran, dtype = read(fh)
    except Exception as err:  # noqa: BLE001 - a damaged header fails in many ways (ValueError,
        # SyntaxError, tokenize.TokenError, KeyError, ...): all of them are this one error
        raise ValueError(f"cannot resume: {path} is not a readable .npy file: its header is "
                         f"damaged ({type(err).__name__}: {str(err)[:200]}); restore the "
                         f"file or start a new run (overwrite=True / --overwrite)") from None
    if fortran:
        raise ValueError(f"cannot resume: {path} is in Fortran order (not written by nrpt)")
    return tuple(int(n) for n in shape), dtype, fh.tell()


def _layout(path: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    """``(shape, dtype, data offset)`` of a ``.npy`` file, from its header alone."""
    with _open(path) as fh:
        return _header(fh, path)


def _map(path: Path, mode: str) -> np.memmap:
    """``np.load(path, mmap_mode=mode)``, opened by :func:`_open` (no symbolic link)."""
    with _open(path, write=mode == "r+") as fh:
        shape, dtype, offset = _header(fh, path)
        return np.memmap(fh, dtype=dtype, mode=mode, offset=offset, shape=shape)


def _allocate(fd: int, size: int, path: Path) -> None:
    """Make the file ``fd`` ``size`` bytes long with its blocks reserved (``posix_fallocate``):
    a full disk is an ``OSError`` (ENOSPC) here, naming the file -- not a SIGBUS later, when a
    write into the memory map finds no block for a page of a sparse file."""
    try:
        os.posix_fallocate(fd, 0, size)
    except AttributeError:  # (no posix_fallocate on this platform: sparse)
        os.ftruncate(fd, max(size, os.fstat(fd).st_size))
    except OSError as err:
        if err.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            os.ftruncate(fd, max(size, os.fstat(fd).st_size))  # a file system without it
        else:
            err.filename = str(path)
            raise


def _create(path: Path, shape: tuple[int, ...], dtype) -> np.memmap:
    """A new record file ``path`` (``np.lib.format.open_memmap(path, "w+")``, but never through
    a link and with its blocks allocated: :func:`_allocate`), mapped read-write."""
    from nrpt.files import open_fd

    fd = open_fd(path, os.O_RDWR | os.O_CREAT)
    with os.fdopen(fd, "r+b") as fh:
        fh.truncate(0)
        dtype = np.dtype(dtype)
        header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
                  "shape": tuple(int(n) for n in shape)}
        try:
            np.lib.format.write_array_header_1_0(fh, header)
        except ValueError:  # (a header over 64 KiB)
            np.lib.format.write_array_header_2_0(fh, header)
        fh.flush()
        offset = fh.tell()
        _allocate(fh.fileno(), offset + int(np.prod(shape)) * dtype.itemsize, path)
        return np.memmap(fh, dtype=dtype, mode="r+", offset=offset, shape=tuple(shape))


def _set_shape(path: Path, shape: tuple[int, ...]) -> None:
    """Rewrite the header of ``path`` in place for ``shape`` (same dtype, same header length:
    numpy pads headers, and a shape that differs only in its leading axis fits)."""
    with _open(path, write=True) as fh:
        _, dtype, offset = _header(fh, path)
        fh.seek(0)
        major, _ = np.lib.format.read_magic(fh)
        start = fh.tell() + (2 if major == 1 else 4)
        descr, dims = np.lib.format.dtype_to_descr(dtype), tuple(int(n) for n in shape)
        text = f"{{'descr': {descr!r}, 'fortran_order': False, 'shape': {dims!r}, }}"
        room = offset - start - 1
        if len(text) > room:
            raise _NoRoom(f"{path}: the header has no room for shape {shape}")
        fh.seek(start)
        fh.write((text + " " * (room - len(text)) + "\n").encode("latin1"))
        fh.flush()
        os.fsync(fh.fileno())


def _resize(path: Path, shape: tuple[int, ...], axis: int) -> None:
    """Give ``path`` the row count of ``shape`` along ``axis`` (the other axes agree): in place
    for the leading axis (header and size; the size is changed so that a crash in between
    leaves a file at least as long as its header says; growth allocates the blocks), by a copy
    for an inner axis."""
    have, dtype, offset = _layout(path)
    if tuple(have) == tuple(shape):
        return
    n_bytes = offset + int(np.prod(shape)) * dtype.itemsize
    if axis == 0:
        try:
            with _open(path, write=True) as fh:
                if shape[0] > have[0]:
                    _allocate(fh.fileno(), n_bytes, path)  # zeros
                    _set_shape(path, shape)
                else:
                    _set_shape(path, shape)
                    fh.truncate(n_bytes)
            return
        except _NoRoom:
            pass  # no room in the header: copy
    from nrpt.files import temporary

    fd, tmp = temporary(path)
    os.close(fd)
    try:
        old = _map(path, "r")
        new = _create(Path(tmp), tuple(shape), dtype)
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
    """Check a record file a resumption reopens, before anything maps it: it exists (a plain
    file, not a link), is as long as its header says (a memory map would silently zero-extend
    a truncated file), and agrees with ``shape`` except in its row count along ``axis``;
    returns that row count."""
    if not os.path.lexists(path):
        raise ValueError(f"cannot resume: {path} is missing (deleted?): the run's records are "
                         f"gone; start a new run (overwrite=True / --overwrite)")
    with _open(path) as fh:
        have, have_dtype, offset = _header(fh, path)
        size = os.fstat(fh.fileno()).st_size
    need = offset + int(np.prod(have)) * have_dtype.itemsize
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


#: bytes of rows per checksum block of a record file (:meth:`Draws.state_dict`): a checkpoint
#: hashes only the blocks written since the one before
BLOCK_BYTES = 1 << 22


def _digest(arr: np.ndarray, axis: int, a: int, b: int) -> str:
    """sha256 of rows ``a .. b - 1`` along ``axis`` (0, or 1 with systems first)."""
    h = hashlib.sha256()
    if axis == 0:
        h.update(np.ascontiguousarray(arr[a:b]))
    else:
        for r in range(arr.shape[0]):
            h.update(np.ascontiguousarray(arr[r, a:b]))
    return h.hexdigest()


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
    up to 32,768 slots, int32 above."""
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
        s_shape, e_shape = self._record_layout(out, dtype)
        self._digests: dict[str, list[str]] = {name: [] for name in self._block}
        self._dirty: dict[str, int] = {}
        if out is None:
            self.samples = np.zeros(s_shape, dtype=dtype)
            self.energies = np.zeros(e_shape, dtype=dtype)
            self.index = np.zeros((self.K + 1 if self.store else 0, R, P), dtype=index_dtype(P))
        elif resume:  # checked now, reopened by load_state_dict once the rows needed are known
            self._disk = {name: _check(*spec) for name, spec in self._paths.items()}
            self.samples = self.energies = self.index = self._s = self._e = None
        else:
            self.samples, self.energies, self.index = (
                _create(path, shape, dt) for path, shape, dt, _ in self._paths.values())
        if self.samples is not None:
            self._views()
        self._buf_x: list[torch.Tensor] = []
        self._buf_v: list[torch.Tensor] = []
        # index rows [n, R, P], draws [n, R, (P,) dim] and energies [n, R, (P)] per entry
        self._buf_i: list[torch.Tensor] = []
        self._buf_rows = 0
        self._unsynced = 0  # rows written into the arrays since the last _settle
        self._next_draw = 0
        self._next_row = 0

    def _record_layout(self, out: Path | None, dtype) -> tuple[tuple, tuple]:
        """The shapes of the samples and energies records; the record files' paths, shapes,
        dtypes and row axes (``_paths``); rows per checksum block (``_block``)."""
        R, P, dim = self.R, self.P, self.dim
        tail = (dim,) if self.slots == "target" else (P, dim)
        e_tail = () if self.slots == "target" else (P,)
        s_shape = (self.n_draws, *tail) if R == 1 else (R, self.n_draws, *tail)
        e_shape = (self.n_draws, *e_tail) if R == 1 else (R, self.n_draws, *e_tail)
        row_axis = 0 if R == 1 else 1
        self._paths = None if out is None else {
            "samples": (out / "samples.npy", s_shape, dtype, row_axis),
            "energies": (out / "energies.npy", e_shape, dtype, row_axis),
            "index": (out / "index.npy", (self.K + 1, R, P), index_dtype(P), 0)}
        self._disk: dict[str, int] | None = None
        self._tail, self._e_tail = tail, e_tail
        #: the checksums of the record files' valid rows (state_dict): rows per block, the
        #: digests of the complete blocks hashed so far, and the first row written since
        self._block = {} if self._paths is None else {
            name: max(1, BLOCK_BYTES // max(1, int(np.prod([n for i, n in enumerate(shape)
                                                            if i != ax])) * np.dtype(dt).itemsize))
            for name, (_, shape, dt, ax) in self._paths.items()}
        return s_shape, e_shape

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
        self._roll()

    def record_block(self, block: IterationBlock) -> None:
        """Record ``U`` iterations at once: the block's index rows, and its draws (the
        iterations ``k`` with ``(k + 1) % thin == 0``: one strided slice) copied out of the
        block; the files end as with ``U`` calls of :meth:`record`.  A block on the CPU is
        copied straight into the record arrays (one copy, no buffer: :meth:`_write`); one on
        an accelerator is buffered on its device and copied to the host once per ``chunk``
        rows."""
        if not self.store:
            return
        first = (self.thin - (block.k0 + 1) % self.thin) % self.thin
        x = v = None
        if first < block.U:
            x = block.watched_x(self.reads_slots, view=True)[first::self.thin]  # [D, R, S, dim]
            v = block.slot_energies[first::self.thin]  # [D, R, P]
            if self.slots == "target":
                x, v = x[:, :, 0], v[:, :, 0]
        if self._direct(block.slot_of):
            self._drain()  # (rows that record() buffered come first)
            self._write(block.slot_of.detach().numpy(), None if x is None else (
                x.detach().numpy(), v.detach().numpy()))
            self._unsynced += block.U
            self._roll()
            return
        self._buffer(block.slot_of.to(index_torch_dtype(self.P), copy=True))
        if x is not None:  # copies: the buffers must not hold views of the block
            self._buf_x.append(x.detach().clone())
            self._buf_v.append(v.detach().clone())
        self._roll()

    def _roll(self) -> None:
        """Every ``chunk`` rows: the buffered ones into the record arrays, and the written
        pages released (no sync: :meth:`flush` forces them to disk)."""
        if self._buf_rows >= self.chunk:
            self._drain()
        if self._unsynced >= self.chunk:
            self._settle(sync=False)

    def _direct(self, t: torch.Tensor) -> bool:
        """Whether a block with tensors like ``t`` is copied straight into the record arrays
        (on the CPU, the arrays open) rather than buffered."""
        return t.device.type == "cpu" and self.index is not None

    def _buffer(self, rows: torch.Tensor) -> None:
        """Hold index rows ``[n, R, P]`` (:func:`index_dtype`) until the next flush."""
        self._buf_i.append(rows)
        self._buf_rows += rows.shape[0]

    def follow_ladder(self, m) -> None:
        """The ladder grew (``chains = "auto"``; only with ``slots = "target"``): the index
        process gets a column per new replica.  Its rows so far are relabelled to the new
        slots (old slot ``s`` -> ``m.primary[s]``, so that slot ``0`` and the top stay the
        ends), and a replica that did not exist yet has slot ``-1`` there.  It shrank
        (``min_chains``): the columns of the kept replicas (``m.replicas``, per system) in
        their new order, a kept slot relabelled to its new number and a dropped one ``-1``
        (the dropped replicas' columns are gone).  (In a run folder
        ``index.npy`` is written again at the new width.)"""
        if self.slots != "target":
            raise ValueError("the draws of every slot (record='all') cannot follow a growing "
                             "ladder")
        self.flush()
        old_p, new_p = self.P, int(m.new)
        dt = index_dtype(new_p)
        self.P = new_p
        if not self.store:
            return
        rows = self._next_row
        relabel = np.asarray(m.primary, dtype=np.int64)
        head = np.full((rows, self.R, new_p), -1, dtype=dt)
        if rows and m.shrinks:  # the kept replicas' columns; a dropped slot reads -1
            relabel = np.full(old_p, -1, dtype=np.int64)
            relabel[list(m.source)] = np.arange(new_p)
            old = np.asarray(self.index[:rows], dtype=np.int64)
            old = np.take_along_axis(old, np.asarray(m.replicas, dtype=np.int64)[None], 2)
            head[:] = np.where(old >= 0, relabel[np.maximum(old, 0)], -1)
        elif rows:
            old = np.asarray(self.index[:rows], dtype=np.int64)
            head[:, :, :old_p] = np.where(old >= 0, relabel[np.maximum(old, 0)], -1)
        shape = (self.K + 1, self.R, new_p)
        if self._paths is None:
            self.index = np.zeros(shape, dtype=dt)
        else:
            path = self._paths["index"][0]
            self.index = None  # (no map of the file may outlive its rewrite)
            self.index = _create(path, shape, dt)
            self._paths["index"] = (path, shape, dt, 0)
            self._block["index"] = max(1, BLOCK_BYTES // max(1, self.R * new_p * dt.itemsize))
            self._digests["index"] = []
            self._dirty["index"] = 0
        self.index[:rows] = head

    def state_dict(self) -> dict:
        self.flush()
        sd = {"next_row": self._next_row, "next_draw": self._next_draw}
        if self._paths is not None:
            sd["checksums"] = self._checksums()
        return sd

    def _checksums(self) -> dict[str, dict]:
        """For each record file: the sha256 of each block of ``block_rows`` of its valid
        ``rows`` (the last block may be short).  Only the blocks written since the last call
        are hashed again: the cost of a checkpoint follows the rows it adds, not the file."""
        arrays = {"samples": self._s, "energies": self._e, "index": self.index}
        rows = self.valid_rows()
        found = {}
        for name in self._paths:
            B, n, done = self._block[name], rows[name], self._digests[name]
            arr, ax = arrays[name], (0 if name == "index" else 1)
            keep = min(len(done), n // B, self._dirty.get(name, n) // B)
            del done[keep:]
            done.extend(_digest(arr, ax, j * B, (j + 1) * B) for j in range(keep, n // B))
            tail = [_digest(arr, ax, n - n % B, n)] if n % B else []
            found[name] = {"rows": n, "block_rows": B, "sha256": done + tail}
        self._dirty = {}
        return found

    def _verify(self, sums: dict[str, dict]) -> None:
        """Check the rows a resumption keeps against the checkpoint's checksums (before the
        files are changed): a damaged row or a file from another run is refused, never carried
        into the results.  Rows after the checkpoint's are not kept: the resumed run writes
        them again."""
        for name, (path, _, _, axis) in self._paths.items():
            entry = sums.get(name)
            if entry is None:
                continue
            B, n = int(entry["block_rows"]), int(entry["rows"])
            arr = _map(path, "r")
            if name != "index":  # systems first, as the checksums were taken (_views)
                arr = arr.reshape(self.R, arr.shape[axis],
                                  *(self._tail if name == "samples" else self._e_tail))
            ax = 0 if name == "index" else 1
            try:
                for j, want in enumerate(entry["sha256"]):
                    a, b = j * B, min((j + 1) * B, n)
                    if _digest(arr, ax, a, b) != want:
                        raise ValueError(
                            f"cannot resume: {path} rows {a}..{b - 1} do not match the "
                            f"checksum the checkpoint recorded for them: the file is damaged "
                            f"or comes from another run; restore the run's own file or start a "
                            f"new run (overwrite=True / --overwrite)")
            finally:
                del arr
            self._block[name] = B
            self._digests[name] = list(entry["sha256"][:n // B])

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
            if sd.get("checksums"):  # (checkpoints from before checksums: rows unchecked)
                self._verify(sd["checksums"])
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
            _map(self._paths[n][0], mode) for n in ("samples", "energies", "index"))
        self._views()

    def flush(self) -> None:
        """Every recorded row into the record arrays, and a run folder's files forced to disk
        (``msync``): the checkpoint (:meth:`state_dict`) and :meth:`close` call it, so a
        checkpoint never describes rows that an operating-system crash could lose.  Between
        them rows go into the memory maps (the page cache) without a sync: a crash of the
        process loses none of them, and a resumption rewrites any after its checkpoint."""
        self._drain()
        self._settle(sync=True)

    def _drain(self) -> None:
        """The buffered rows (:meth:`record`, or blocks off the CPU) into the record arrays."""
        if self._buf_i:
            rows = torch.cat(self._buf_i).cpu().numpy()
            xv = None
            if self._buf_x:
                xv = (torch.cat(self._buf_x).cpu().numpy(), torch.cat(self._buf_v).cpu().numpy())
            self._write(rows, xv)
            self._unsynced += len(rows)
            self._buf_i.clear()
            self._buf_x.clear()
            self._buf_v.clear()
            self._buf_rows = 0

    def _write(self, rows: np.ndarray, xv: tuple[np.ndarray, np.ndarray] | None) -> None:
        """Index rows ``[n, R, P]`` and draws ``[c, R, (P,) dim]`` with their energies
        ``[c, R, (P)]`` (``xv``, or None) into the record arrays at the next free rows (NumPy
        assignments: each value copied once, cast to the record's dtype)."""
        n = len(rows)
        self._dirty["index"] = min(self._dirty.get("index", self._next_row), self._next_row)
        self.index[self._next_row:self._next_row + n] = rows
        self._next_row += n
        if xv is not None:
            xs, vs = xv
            c = xs.shape[0]
            for name in ("samples", "energies"):
                self._dirty[name] = min(self._dirty.get(name, self._next_draw), self._next_draw)
            self._s[:, self._next_draw:self._next_draw + c] = xs.swapaxes(0, 1)
            self._e[:, self._next_draw:self._next_draw + c] = vs.swapaxes(0, 1)
            self._next_draw += c

    def _settle(self, sync: bool) -> None:
        """A run folder's record maps: forced to disk (``sync``: ``msync``), and their written
        pages released from the resident set (:func:`_release`; a dirty page of a shared map
        stays in the page cache, written back by the kernel)."""
        self._unsynced = 0
        for name, arr in (("samples", self.samples), ("energies", self.energies),
                          ("index", self.index)):
            if isinstance(arr, np.memmap):
                if sync:
                    try:
                        arr.flush()
                    except OSError as err:  # (msync: an I/O error of the file system) name it
                        if err.filename is None and self._paths is not None:
                            err.filename = str(self._paths[name][0])
                        raise
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
