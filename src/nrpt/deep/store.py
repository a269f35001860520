"""Where the collected models of a deep run live: :class:`ModelStore`.

With a run folder the models are streamed to disk, one file per collection
(``models/000001.pt``, ``models/000002.pt``, ...: ``torch.save`` of ``{"theta": [S, dim],
"buffers": [S, buffer_dim], "iteration": k}``, float32, written atomically and fsynced), and
only a few bytes per collection stay in memory (file name, size, sha256).  The checkpoint
holds the number of collections and a *chain* hash ``h_k = sha256(h_{k-1} || sha256(file_k))``
-- a fixed size whatever the number of collected models.  Resuming from a checkpoint written
at collection ``k`` re-reads files ``1..k``, refuses the folder with an error naming the file
if one is missing, truncated or changed (a run folder is untrusted input), and removes the
files after ``k`` (written between the last checkpoint and an interruption: the resumed run
writes them again, identically).  Files are opened with ``O_NOFOLLOW`` (never through a link)
and loaded with ``torch.load(weights_only=True)``.  ``models/index.json`` lists the files
(with their sha256) when the run ends, for readers after the fact (:meth:`ModelStore.open`).

Without a run folder (``fit(..., out=None)``) the models are kept in memory (float32, CPU),
as before: such a run cannot be resumed, and a user who wants a notebook's ``predict_proba``
without a folder to clean up gets it; memory then grows with the number of collected models
(pass ``out`` for flat memory).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

import torch

from nrpt.files import UnsafeFile, atomic_write, open_fd

__all__ = ["ModelStore", "ModelTally", "MODELS_DIR", "INDEX"]

#: the store's folder inside a run folder
MODELS_DIR = "models"
#: the listing written when a run ends
INDEX = "index.json"
_ENTRY = re.compile(r"^(\d{6,})\.pt$")
_START = hashlib.sha256(b"nrpt model store v1").hexdigest()


def _chain(prev: str, digest: str) -> str:
    return hashlib.sha256(bytes.fromhex(prev) + bytes.fromhex(digest)).hexdigest()


def _name(i: int) -> str:
    return f"{i:06d}.pt"


class ModelStore:
    """The collected models of one run, appended one collection at a time and streamed back
    in chunks; on disk in ``folder`` or, with ``folder=None``, in memory (see the module
    docstring)."""

    def __init__(self, folder: str | os.PathLike | None = None):
        self.folder = None if folder is None else Path(folder)
        self.count = 0          # collections
        self.n_models = 0       # models (rows) over all collections
        self.chain = _START
        self._entries: list[dict] = []   # per collection: file, size, sha256, models, iteration
        self._memory: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._tidy = False      # files after `count` removed (lazily: a resume loads first)

    # ------------------------------------------------------------------ writing
    def _dir(self) -> Path:
        d = self.folder
        try:
            st = os.lstat(d)
        except FileNotFoundError:
            d.mkdir(parents=False, exist_ok=True)
            st = os.lstat(d)
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise UnsafeFile(f"refusing to use {d} as the model store: it is "
                             f"{'a symbolic link' if stat.S_ISLNK(st.st_mode) else 'not a folder'}"
                             f"; remove it, or use another run folder")
        return d

    def _remove_after(self, k: int) -> None:
        """Remove the entries numbered after ``k`` and stale temporaries."""
        d = self._dir()
        for p in d.iterdir():
            m = _ENTRY.match(p.name)
            if (m and int(m.group(1)) > k) or (p.name.startswith(".") and ".tmp" in p.name) \
                    or p.name == INDEX:
                p.unlink()
        self._tidy = True

    def append(self, theta: torch.Tensor, buffers: torch.Tensor, iteration: int) -> None:
        """One collection: ``theta[S, dim]`` and ``buffers[S, buffer_dim]`` (stored float32)."""
        theta = theta.detach().to("cpu", torch.float32).contiguous().clone()
        buffers = buffers.detach().to("cpu", torch.float32).contiguous().clone()
        if theta.dim() != 2 or buffers.dim() != 2 or theta.shape[0] != buffers.shape[0]:
            raise ValueError(f"a collection is theta [S, dim] and buffers [S, buffer_dim]; got "
                             f"{list(theta.shape)} and {list(buffers.shape)}")
        S = int(theta.shape[0])
        if self.folder is None:
            self._memory.append((theta, buffers))
            entry = {"models": S, "iteration": int(iteration)}
        else:
            if not self._tidy:
                self._remove_after(self.count)
            buf = io.BytesIO()
            torch.save({"theta": theta, "buffers": buffers, "iteration": int(iteration)}, buf)
            data = buf.getvalue()
            name = _name(self.count + 1)
            digest = hashlib.sha256(data).hexdigest()
            atomic_write(self._dir() / name, data)
            entry = {"file": name, "size": len(data), "sha256": digest, "models": S,
                     "iteration": int(iteration)}
            self.chain = _chain(self.chain, digest)
        self._entries.append(entry)
        self.count += 1
        self.n_models += S

    def clear(self) -> None:
        """Forget every collection (and remove the files)."""
        self.count, self.n_models, self.chain = 0, 0, _START
        self._entries, self._memory = [], []
        if self.folder is not None and self.folder.exists():
            self._remove_after(0)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """``{"count", "models", "chain"}``: a fixed size whatever the number of models.  An
        in-memory store also holds its models (a run without a folder is never resumed from
        a checkpoint file)."""
        sd = {"count": self.count, "models": self.n_models, "chain": self.chain}
        if self.folder is None:
            sd["memory"] = [t for pair in self._memory for t in pair]
        return sd

    def load_state_dict(self, sd: dict) -> None:
        """Back to the collection ``sd`` records: files ``1..count`` verified against its chain
        hash (an error naming the first bad file), the later ones removed."""
        count, models, chain = int(sd["count"]), int(sd["models"]), str(sd["chain"])
        self.count, self.n_models, self.chain = 0, 0, _START
        self._entries, self._memory = [], []
        if self.folder is None:
            mem = list(sd.get("memory", []))
            for i in range(0, len(mem), 2):
                self._memory.append((mem[i], mem[i + 1]))
                self._entries.append({"models": int(mem[i].shape[0]), "iteration": None})
            self.count, self.n_models, self.chain = count, models, chain
            return
        d = self._dir()
        entries, h, n = [], _START, 0
        for i in range(1, count + 1):
            name = _name(i)
            data = self._read(d / name, what=f"collection {i} of the {count} the checkpoint "
                                             f"records")
            digest = hashlib.sha256(data).hexdigest()
            h = _chain(h, digest)
            payload = self._load(data, d / name)
            S = int(payload["theta"].shape[0])
            n += S
            entries.append({"file": name, "size": len(data), "sha256": digest, "models": S,
                            "iteration": int(payload["iteration"])})
        if h != chain or n != models:
            raise ValueError(f"the model store {d} does not match the checkpoint: its "
                             f"{count} collections ({n} models) hash to {h[:16]}..., the "
                             f"checkpoint records {models} models hashing to {chain[:16]}...; "
                             f"a file of it was replaced or changed: restore the run folder "
                             f"or start a new run")
        self._entries, self.count, self.n_models, self.chain = entries, count, n, h
        self._remove_after(count)

    # ------------------------------------------------------------------ reading
    @staticmethod
    def _read(path: Path, what: str = "") -> bytes:
        try:
            fd = open_fd(path, os.O_RDONLY)
        except FileNotFoundError:
            raise ValueError(f"the model store is missing {path} ({what}); the run folder was "
                             f"damaged: restore it or start a new run") from None
        with os.fdopen(fd, "rb") as fh:
            return fh.read()

    @staticmethod
    def _load(data: bytes, path: Path) -> dict:
        try:
            payload = torch.load(io.BytesIO(data), weights_only=True)
            if not isinstance(payload, dict) or not {"theta", "buffers"} <= set(payload):
                raise ValueError("not a collection")
            return payload
        except Exception as err:  # noqa: BLE001 - a damaged file fails in many ways
            raise ValueError(f"{path} is not a readable collection of models "
                             f"({type(err).__name__}: {str(err)[:200]}); the run folder was "
                             f"damaged: restore it or start a new run") from None

    def _collection(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.folder is None:
            return self._memory[i]
        e = self._entries[i]
        path = self.folder / e["file"]
        data = self._read(path, what=f"collection {i + 1}")
        digest = hashlib.sha256(data).hexdigest()
        if (len(data), digest) != (e["size"], e["sha256"]):
            raise ValueError(f"{path} fails its checksum ({len(data)} bytes, sha256 "
                             f"{digest[:16]}...; the store recorded {e['size']} bytes, "
                             f"{e['sha256'][:16]}...): it was changed after it was written; "
                             f"restore the run folder or start a new run")
        payload = self._load(data, path)
        return payload["theta"], payload["buffers"]

    def chunks(self, max_models: int = 16) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(theta[m, dim], buffers[m, buffer_dim])`` of consecutive collections, ``m`` up to
        ``max_models`` (at least one collection): at most one chunk in memory at a time."""
        th: list[torch.Tensor] = []
        bu: list[torch.Tensor] = []
        m = 0
        for i in range(self.count):
            t, b = self._collection(i)
            if th and m + t.shape[0] > max_models:
                yield torch.cat(th), torch.cat(bu)
                th, bu, m = [], [], 0
            th.append(t)
            bu.append(b)
            m += int(t.shape[0])
        if th:
            yield torch.cat(th), torch.cat(bu)

    def all(self) -> tuple[torch.Tensor, torch.Tensor] | tuple[None, None]:
        """Every model at once (memory grows with their number: prefer :meth:`chunks`)."""
        parts = list(self.chunks(max_models=1 << 62))
        return parts[0] if parts else (None, None)

    def __len__(self) -> int:
        return self.n_models

    @property
    def iterations(self) -> list[int | None]:
        """The iteration of each collection."""
        return [e["iteration"] for e in self._entries]

    # ------------------------------------------------------------------ after the run
    def write_index(self) -> None:
        """``models/index.json``: the files, their sha256 and sizes (nothing without a folder)."""
        if self.folder is None:
            return
        atomic_write(self._dir() / INDEX, json.dumps(
            {"format": 1, "count": self.count, "models": self.n_models, "chain": self.chain,
             "entries": self._entries}, indent=1) + "\n")

    @classmethod
    def open(cls, folder: str | os.PathLike) -> ModelStore:
        """The store of a finished run (its ``index.json``), each file verified when read."""
        folder = Path(folder)
        try:
            index = json.loads(cls._read(folder / INDEX, what="the listing").decode())
            entries = list(index["entries"])
            count, models, chain = int(index["count"]), int(index["models"]), str(index["chain"])
            h = _START
            for e in entries:
                h = _chain(h, str(e["sha256"]))
                if not _ENTRY.match(str(e["file"])):
                    raise ValueError(f"bad file name {e['file']!r}")
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{folder / INDEX} is not a model store listing ({err})") from None
        if h != chain or len(entries) != count or sum(int(e["models"]) for e in entries) != models:
            raise ValueError(f"{folder / INDEX} is inconsistent (its entries do not hash to its "
                             f"chain or count): it was edited; restore the run folder")
        store = cls(folder)
        store._entries, store.count, store.n_models, store.chain = entries, count, models, chain
        store._tidy = True
        return store

    def __repr__(self) -> str:
        where = "memory" if self.folder is None else str(self.folder)
        return f"ModelStore({where}, collections={self.count}, models={self.n_models})"


class ModelTally(ModelStore):
    """The collections' count on a process that does not own the run folder (a rank > 0 of a
    multi-process run): the models are kept by rank 0's store, so this keeps none; its state
    is the same fixed-size head, read from rank 0's checkpoint."""

    def append(self, theta: torch.Tensor, buffers: torch.Tensor, iteration: int) -> None:
        self.count += 1
        self.n_models += int(theta.shape[0])

    def state_dict(self) -> dict:
        return {"count": self.count, "models": self.n_models, "chain": self.chain}

    def load_state_dict(self, sd: dict) -> None:
        self.count, self.n_models = int(sd["count"]), int(sd["models"])
        self.chain = str(sd["chain"])
        self._entries, self._memory = [], []
