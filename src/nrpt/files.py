"""The files of a run folder that the layers below :mod:`nrpt.run` write: atomic writes, opens
that never follow a link, and the checkpoint writer.

Every file is written to a unique temporary name in the folder and renamed into place
(:func:`atomic_write`, :func:`atomic_path`), so a crash leaves either the old or the new
version, never half a file.  Files changed in place (the lock, the record files) are opened by
:func:`open_fd`: never through a symbolic link, only a regular file with one name.  Only
:func:`write_checkpoint` writes checkpoints.  The rest of the run folder's bookkeeping (the
lock, run.json, reading and verifying checkpoints) is :mod:`nrpt.run.folder`, which re-exports
these names.  This module imports nothing of nrpt.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

__all__ = ["CHECKPOINT", "PREV_CHECKPOINT", "SIDECAR", "PREV_SIDECAR", "UnsafeFile", "open_fd",
           "temporary", "atomic_write", "atomic_path", "write_checkpoint"]

CHECKPOINT = "checkpoint.pt"
PREV_CHECKPOINT = "checkpoint.prev.pt"
SIDECAR = "checkpoint.json"
PREV_SIDECAR = "checkpoint.prev.json"


class UnsafeFile(ValueError):
    """A file of a run folder that nrpt will not open: a symbolic link, a file with other hard
    links, or not a regular file (writing through it would change a file outside the folder)."""


#: ``O_NOFOLLOW`` where the platform has it (a symlink as the last component fails with ELOOP)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def open_fd(path: str | os.PathLike, flags: int, mode: int = 0o644) -> int:
    """``os.open(path, flags)`` that never follows a symbolic link at ``path`` and refuses
    anything but a regular file with a single name (a hard link, a FIFO, a device): the one way
    nrpt opens a run folder's files in place (the lock, the record files).  Files written whole
    go through :func:`atomic_write` / :func:`atomic_path` (a new ``mkstemp`` name, created with
    ``O_EXCL``: never a link, then renamed -- a rename replaces a link, never writes through
    it).  Raises :class:`UnsafeFile` naming the file."""
    path = Path(path)
    try:
        fd = os.open(path, flags | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
                     | getattr(os, "O_NONBLOCK", 0), mode)
    except OSError as err:
        # (ELOOP on Linux; EMLINK / EFTYPE on some BSDs)
        if err.errno == errno.ELOOP or (err.errno == errno.EMLINK and path.is_symlink()) or \
                err.errno == getattr(errno, "EFTYPE", -1):
            try:
                where = os.readlink(path)
            except OSError:
                where = "?"
            raise UnsafeFile(f"refusing to open {path}: it is a symbolic link (to {where}); "
                             f"nrpt never writes through a link in a run folder (it would "
                             f"change a file outside it): remove the link, or use another "
                             f"folder") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(f"refusing to open {path}: not a regular file (a FIFO, socket or "
                             f"device); remove it, or use another folder")
        if st.st_nlink > 1:
            raise UnsafeFile(f"refusing to open {path}: it has {st.st_nlink} hard links (it is "
                             f"also a file elsewhere, which writing would change); remove it, "
                             f"or use another folder")
        if hasattr(os, "set_blocking"):  # (opened non-blocking: a FIFO never hangs the open)
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _named(err: OSError, path: str | os.PathLike) -> OSError:
    """``err`` with ``filename`` set (an error from a write or an mmap names no file)."""
    if err.filename is None:
        err.filename = str(path)
    return err


# ------------------------------------------------------------------------------ atomic writes
def _umask() -> int:
    try:  # Linux: read it without changing it
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def temporary(path: str | os.PathLike) -> tuple[int, str]:
    """``(fd, name)`` of a new unique file beside ``path`` (``.NAME.XXXX.tmpSUFFIX``) with the
    permissions a plain ``open`` would give it (mkstemp's are owner-only)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.",
                               suffix=f".tmp{path.suffix}")
    with contextlib.suppress(OSError):
        os.fchmod(fd, 0o666 & ~_umask())
    return fd, tmp


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _discard(tmp: str, err: BaseException, path: Path) -> None:
    """After a failed atomic write: remove the temporary file; an OS error names ``path``."""
    with contextlib.suppress(OSError):
        os.unlink(tmp)
    if isinstance(err, OSError):
        _named(err, path)


def atomic_write(path: str | os.PathLike, data: bytes | str, *, sync: bool = True) -> None:
    """Write ``data`` to a unique temporary file beside ``path`` (fsynced), then rename it."""
    path = Path(path)
    fd, tmp = temporary(path)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
            fh.flush()
            if sync:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        _discard(tmp, err, path)
        raise


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A unique temporary path beside ``path`` (same suffix) for writers that need a file name
    (figures, netCDF, ``np.savez``); renamed to ``path`` when the block succeeds."""
    path = Path(path)
    fd, tmp = temporary(path)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException as err:
        _discard(tmp, err, path)
        raise


def _keep_as_previous(current: Path, previous: Path) -> None:
    """Make ``previous`` a second name of ``current`` (a hard link under a temporary name,
    renamed over ``previous``), leaving ``current`` in place; where the file system has no hard
    links, ``current`` is moved (the old behaviour: a moment without ``current``)."""
    link = previous.with_name(previous.name + ".link")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(link)
    try:
        os.link(current, link)
    except OSError:
        os.replace(current, previous)
        return
    os.replace(link, previous)


def write_checkpoint(payload: dict[str, Any], out: Path) -> None:
    """Write ``payload`` (assembled by :func:`nrpt.core.loop.execute`) as ``checkpoint.pt``, keeping
    the one before as ``checkpoint.prev.pt``; each with a sidecar holding its size and sha256,
    the iteration and the valid rows of the record files.  The one function that writes
    checkpoints: call it on one process only."""
    import io

    buf = io.BytesIO()
    torch.save(payload, buf)
    data = buf.getvalue()
    header = payload.get("header") or {}
    draws = (payload.get("recorders") or {}).get("draws") or {}
    side = {"file": CHECKPOINT, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "iteration": int(payload["engine"]["k"]), "segment": int(payload["segment"]),
            "run_id": header.get("run_id"), "seed": header.get("seed"),
            "config_hash": header.get("config_hash")}
    if draws:
        side["rows"] = {"index": int(draws["next_row"]), "samples": int(draws["next_draw"]),
                        "energies": int(draws["next_draw"])}
    fd, tmp = temporary(out / CHECKPOINT)
    side_tmp = None
    writing = out / CHECKPOINT
    try:
        # both new files written in full first: a full disk fails here, before any rename,
        # and the folder keeps its last checkpoint as it was
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        writing = out / SIDECAR
        side_fd, side_tmp = temporary(out / SIDECAR)
        with os.fdopen(side_fd, "wb") as fh:
            fh.write((json.dumps(side, indent=2) + "\n").encode())
            fh.flush()
            os.fsync(fh.fileno())
        # the sidecars list the hashes of good checkpoints; any one of them vouches for a file
        # (read_checkpoint), so a crash between these renames never strands a good checkpoint.
        # The current checkpoint becomes the previous one through a hard link, so that
        # checkpoint.pt exists at every instant (moving it left a window in which a kill -9
        # made the next resume fall back to checkpoint.prev.pt with a warning)
        if (out / CHECKPOINT).exists():
            _keep_as_previous(out / CHECKPOINT, out / PREV_CHECKPOINT)
        if (out / SIDECAR).exists():
            os.replace(out / SIDECAR, out / PREV_SIDECAR)
        os.replace(side_tmp, out / SIDECAR)
        os.replace(tmp, out / CHECKPOINT)
    except BaseException as err:
        for name in (tmp, side_tmp):
            if name is not None:
                with contextlib.suppress(OSError):
                    os.unlink(name)
        if isinstance(err, OSError):
            _named(err, writing)
        raise
    _fsync_dir(out)
