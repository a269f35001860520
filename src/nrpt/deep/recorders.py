"""The recorders of a deep run: the collected models and their average (:class:`BMARecorder`),
SWAG's moments (:class:`SWAGRecorder`), the per-epoch rows (:class:`EpochMetrics`) and the
index process (:class:`IndexRecorder`)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nrpt.deep.replicas import FunctionalNet
from nrpt.host import viewable
from nrpt.recorders.draws import index_dtype
from nrpt.recorders.pending import PendingRows
from nrpt.recorders.stats import json_ready
from nrpt.roles import RecorderBase

__all__ = ["BMARecorder", "SWAGRecorder", "EpochMetrics", "IndexRecorder", "INDEX_FILE"]

#: the index process in a run folder
INDEX_FILE = "index.npy"


class BMARecorder(RecorderBase):
    """Collects the models at ``slots`` every ``every`` iterations from iteration ``start`` on
    (and, if ``stage(k)`` is given, only when it is true) and accumulates their test-set
    probabilities and logits; appends the collected models to ``store``
    (:class:`nrpt.deep.store.ModelStore`: streamed to the run folder, or in memory without one)
    for :meth:`DeepResult.predict_proba`.  Its checkpoint state is the running sums and the
    store's fixed-size head, whatever the number of models collected."""

    name = "bma"

    def __init__(self, net: FunctionalNet, x_test, y_test, *, every: int, start: int,
                 slots: list[int], strategy: str, stage=None, store=None, placement=None,
                 classes: int | None = None):
        from nrpt.deep.metrics import BMA
        from nrpt.deep.store import ModelStore

        self.net, self.x, self.y = net, x_test, y_test
        # where the replicas live (nrpt.deep.placement.Placement; set by nrpt.deep.fit): the
        # logits are computed there, each replica alone, and gathered in slot order
        self.placement, self.classes = placement, classes
        self.every, self.start, self.slots = int(every), int(start), list(slots)
        self.reads_slots = tuple(self.slots)
        self.strategy, self.stage = strategy, stage
        self.bma = BMA()
        self.store = ModelStore() if store is None else store

    def due(self, k: int) -> bool:
        return ((k + 1) % self.every == 0 and k + 1 > self.start
                and (self.stage is None or self.stage(k)))

    def record(self, it) -> None:
        if not self.due(it.k):
            return
        if self.placement is None:
            raise ValueError("BMARecorder needs placement=nrpt.deep.placement.Placement(engine) "
                             "and classes= to evaluate the collected models")
        theta, buf = self.placement.models(it.replica_at, self.slots)  # [S, dim] (one system)
        logits = self.placement.logits(it.replica_at, self.slots, self.net, self.x,
                                       self.strategy, self.classes)
        for row in logits:  # in slot order, whatever the number of processes
            self.bma.add(row)
        self.store.append(theta, buf, it.k + 1)

    def summary(self) -> dict[str, Any]:
        return {"models_collected": int(self.bma.count)}

    def state_dict(self) -> dict:
        return {"bma": self.bma.state_dict(), "store": self.store.state_dict()}

    def load_state_dict(self, sd: dict) -> None:
        if "store" not in sd:
            raise ValueError("this checkpoint keeps its collected models inline (written by an "
                             "nrpt before the model store); finish it with that version or "
                             "start a new run")
        self.store.load_state_dict(sd["store"])
        if self.store.n_models != int(sd["bma"]["count"]):
            raise ValueError(f"the checkpoint's model average counts {int(sd['bma']['count'])} "
                             f"models but its store {self.store.n_models}: it is damaged")
        self.bma.load_state_dict(sd["bma"])


class SWAGRecorder(RecorderBase):
    """SWAG moments of slot 0 every ``every`` iterations from ``start`` on."""

    name = "swag"

    def __init__(self, dim: int, rank: int, *, every: int, start: int):
        from nrpt.deep.swag import SWAG

        self.swag = SWAG(dim, rank=rank)
        self.every, self.start = int(every), int(start)
        self.reads_slots = (0,)

    def record(self, it) -> None:
        if (it.k + 1) % self.every == 0 and it.k + 1 > self.start:
            self.swag.collect(it.slot_x([0])[0, 0].double())

    def summary(self):
        return {"swag_collected": int(self.swag.n_collected)}

    def state_dict(self):
        return {"swag": self.swag.state_dict()}

    def load_state_dict(self, sd):
        self.swag.load_state_dict(sd["swag"])


class EpochMetrics(RecorderBase):
    """Per-epoch rows: the running BMA's test metrics, slot 0's current model accuracy, swap
    rate, ``C`` and learning rates (what the progress bar shows)."""

    #: the models' part of the per-epoch line: (label, row key, format)
    LINE = (("slot-0 acc", "slot_accuracy", ".4f"), ("BMA acc", "bma_accuracy", ".4f"),
            ("BMA NLL", "bma_nll_mean", ".4f"))

    name = "epochs"

    def __init__(self, bma: BMARecorder, net, x_test, y_test, *, every: int, lr_unit: float,
                 strategy: str, per_epoch: int = 1, say=None):
        self.bma, self.net, self.x, self.y = bma, net, x_test, y_test
        self.every, self.lr_unit, self.strategy = int(every), float(lr_unit), strategy
        self.rows: list[dict[str, Any]] = []
        self._acc = None  # sums of [swaps, attempts, verdicts, listed pairs] per pair
        self._rows: tuple[torch.Tensor, ...] | None = None  # its rows, as views
        self.reads_slots = ()
        self.per_epoch, self.say = int(per_epoch), say

    def record(self, it) -> None:
        A, attempted = it.attempted_indicators  # swaps per attempt: what S is about
        V, listed = it.pair_indicators  # the verdict of every pair
        if self._acc is None:
            self._acc = torch.zeros(4, *A.shape, dtype=A.dtype, device=A.device)
        if self._rows is None:  # (views of _acc's rows, taken once: no indexing per iteration)
            self._rows = (tuple(self._acc.numpy()) if viewable(self._acc, dtypes=None)
                          else self._acc.unbind(0))
        host = type(self._rows[0]) is np.ndarray  # (CPU: NumPy views, a third of a torch op's
        for acc, add in zip(self._rows, (A, attempted, V, listed), strict=True):  # cost; sums
            acc += add.numpy() if host else add  # of 0/1 verdicts: exact either way)
        if (it.k + 1) % self.every:
            return
        row: dict[str, Any] = {"iteration": it.k + 1}
        a, n, v, m = self._acc.sum(dim=(1, 2)).tolist()
        row["swap_rate"] = a / n if n > 0 else None
        # verdicts of the pairs that could not swap (other parity, closed gate): under DEO_W
        # they hold their configuration for a window (docs/deep.md, "Which verdicts adapt C")
        row["verdict_rate_others"] = (v - a) / (m - n) if m > n else None
        P = it.slot_of.shape[1]
        placement = self.bma.placement
        # (the test logits of the replica the model average collected at this iteration, if
        # it did, are read back, not evaluated again)
        logits = placement.test_logits(self.net, self.x, self.strategy)

        def metric(theta, bn, row):  # where the replica lives; only the number is gathered
            return self._slot_metric(logits(theta, bn, row)).reshape(1)

        per_slot = placement.per_slot(it.replica_at, range(P), metric, (1,), torch.float64,
                                      rows=True)
        placement.forget()
        self._model_rows(row, per_slot[:, 0])
        row["epoch"] = (it.k + 1) / self.per_epoch
        row["learning_rates"] = (it.step_size[0] * self.lr_unit).tolist()
        if "C" in it.params:
            row["C"] = float(it.params["C"][0, 0])
        self.rows.append(row)
        if self.say is not None:
            self.say(self._line(row))
        self._acc.zero_()

    def _slot_metric(self, out: torch.Tensor) -> torch.Tensor:
        """One slot's current model on the test set (``out[n, C]``): its accuracy."""
        return (out.argmax(-1) == self.y).double().mean()

    def _model_rows(self, row: dict[str, Any], per_slot: torch.Tensor) -> None:
        """The row's model metrics: the running BMA's and each slot's (:meth:`_slot_metric`)."""
        from nrpt.deep.metrics import evaluate

        if self.bma.bma.count:
            row.update({f"bma_{k}": v for k, v in
                        evaluate(self.bma.bma.probs(), self.y).items()})
        row["slot_accuracy"] = per_slot.tolist()

    def _line(self, row: dict[str, Any]) -> str:
        return _line(row, self.LINE)

    def summary(self):
        return {}

    def state_dict(self):
        return {"rows": json.dumps(json_ready(self.rows)), "acc": self._acc}

    def load_state_dict(self, sd):
        self.rows = json.loads(sd["rows"])
        self._acc, self._rows = sd["acc"], None


def _line(row: dict[str, Any], columns) -> str:
    """One per-epoch line: the swap rate, ``C`` and ``columns`` (``(label, row key, format)``;
    a per-slot list shows slot 0); "-" for what the row does not hold yet."""
    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    parts = [f"epoch {row['epoch']:7.2f}", f"swap rate {f(row.get('swap_rate'), '.3f')}",
             f"C {f(row.get('C'), '.4g')}"]
    for label, key, fmt in columns:
        v = row.get(key)
        parts.append(f"{label} {f(v[0] if isinstance(v, list) else v, fmt)}")
    return "  ".join(parts)


class IndexRecorder(RecorderBase):
    """The index process ``[K, P]`` (slot of every replica after each iteration) of a one-system
    run, stored once: with a run folder, rows are written in place into ``index.npy`` (a
    ``.npy`` of the whole plan's ``rows``, memory-mapped) and the checkpoint keeps only the
    number of rows written and their sha256 (a resume verifies them, and refuses a changed or
    truncated ``index.npy`` naming it); without one, a preallocated tensor in memory.  (It was
    kept as a list in memory, written whole into every checkpoint and again as ``index.npy``.)
    """

    name = "index"
    #: iterations whose rows are copied to the store at once
    PENDING = 64

    def __init__(self, P: int, rows: int, folder: Path | None = None):
        self.P, self.capacity = int(P), int(rows)
        self.dtype = index_dtype(self.P)
        self.path = None if folder is None else Path(folder) / INDEX_FILE
        self.n = 0
        self._arr: np.ndarray | None = None
        self.reads_slots = ()
        #: rows recorded but not yet in the store (``n`` counts them): copied to the host
        #: :data:`PENDING` at a time, not one small device-to-host copy per iteration
        self._pending = PendingRows(self.PENDING)

    def _open(self, keep: int = 0) -> np.ndarray:
        """The row store; ``keep`` rows of an existing ``index.npy`` carried over."""
        if self._arr is not None:
            return self._arr
        if self.path is None:
            self._arr = np.zeros((self.capacity, self.P), self.dtype)
            return self._arr
        old = self._existing() if keep else None
        with contextlib.suppress(FileNotFoundError):  # (a link is removed, never written through)
            os.unlink(self.path)
        self._arr = np.lib.format.open_memmap(self.path, mode="w+", dtype=self.dtype,
                                              shape=(self.capacity, self.P))
        if keep:
            self._arr[:keep] = old[:keep]
        return self._arr

    def _existing(self) -> np.ndarray:
        """``index.npy`` as written (read whole: a resume only), refused if it is a link."""
        from nrpt.files import UnsafeFile, open_fd

        try:
            fd = open_fd(self.path, os.O_RDONLY)
        except FileNotFoundError:
            raise ValueError(f"{self.path} is missing (the checkpoint records {self.n} rows of "
                             f"the index process in it); restore it or start a new run") from None
        except UnsafeFile:
            raise
        with os.fdopen(fd, "rb") as fh:
            try:
                arr = np.load(fh, allow_pickle=False)
            except (ValueError, OSError, EOFError) as err:
                raise ValueError(f"{self.path} cannot be read ({err}); restore it or start a "
                                 f"new run") from None
        if arr.ndim != 2 or arr.shape[1] != self.P or arr.dtype != self.dtype:
            raise ValueError(f"{self.path} holds a {arr.dtype} array {list(arr.shape)}, not "
                             f"the index process [rows, {self.P}] of this run; restore it or "
                             f"start a new run")
        return arr

    def record(self, it) -> None:
        if self.n >= self.capacity:
            raise RuntimeError(f"the index process has room for {self.capacity} rows (the "
                               f"plan's iterations); iteration {it.k + 1} is beyond it")
        self.n += 1
        if self._pending.add(it.slot_of[:1].clone()):
            self._flush()

    def _flush(self) -> None:
        """Write the pending rows into the store (rows ``n - len(pending) .. n - 1``)."""
        arr = self._open()
        rows = self._pending.take()
        if rows is not None:
            block = rows[0].cpu().numpy()
            arr[self.n - block.shape[0]:self.n] = block

    def array(self) -> np.ndarray:
        if not self.n:
            return np.zeros((0, self.P), self.dtype)
        self._flush()
        return np.array(self._open()[:self.n])

    def _digest(self) -> str:
        self._flush()
        arr = self._open()
        return hashlib.sha256(np.ascontiguousarray(arr[:self.n]).tobytes()).hexdigest()

    def summary(self):
        return {}

    def state_dict(self):
        if self.path is None:  # (no folder: nothing is ever resumed from it)
            return {"n": self.n, "rows": torch.from_numpy(self.array())}
        self._flush()
        if self._arr is not None and hasattr(self._arr, "flush"):
            self._arr.flush()
        return {"n": self.n, "sha256": self._digest()}

    def load_state_dict(self, sd):
        n = int(sd["n"])
        self._pending.clear()
        if self.path is None:
            self.n = 0
            arr = self._open()
            if "rows" in sd:  # (absent: a rank > 0 reading rank 0's folder checkpoint; the
                arr[:n] = sd["rows"].numpy()  # rows there are rank 0's to keep)
            self.n = n
            return
        self.n = n
        existing = self._existing()
        if existing.shape[0] < n:
            raise ValueError(f"{self.path} holds {existing.shape[0]} rows of the index process, "
                             f"the checkpoint records {n}: it was truncated; restore it or "
                             f"start a new run")
        got = hashlib.sha256(np.ascontiguousarray(existing[:n]).tobytes()).hexdigest()
        if got != sd["sha256"]:
            raise ValueError(f"{self.path} fails its checksum (its first {n} rows hash to "
                             f"{got[:16]}..., the checkpoint records {str(sd['sha256'])[:16]}"
                             f"...): it was changed; restore it or start a new run")
        self._arr = None
        self._open(keep=n)
