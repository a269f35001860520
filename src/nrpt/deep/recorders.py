"""The recorders of a deep run: the collected models and their average (:class:`BMARecorder`),
SWAG's moments (:class:`SWAGRecorder`), the per-epoch rows (:class:`EpochMetrics`) and the
index process (:class:`IndexRecorder`)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch

from nrpt.deep.replicas import FunctionalNet
from nrpt.recorders.draws import index_torch_dtype
from nrpt.recorders.stats import json_ready
from nrpt.roles import RecorderBase

__all__ = ["BMARecorder", "SWAGRecorder", "EpochMetrics", "IndexRecorder"]


class BMARecorder(RecorderBase):
    """Collects the models at ``slots`` every ``every`` iterations from iteration ``start`` on
    (and, if ``stage(k)`` is given, only when it is true) and accumulates their test-set
    probabilities and logits; keeps the collected models (float32, CPU) for
    :meth:`DeepResult.predict_proba`; tracks each slot's current test accuracy."""

    name = "bma"

    def __init__(self, net: FunctionalNet, x_test, y_test, *, every: int, start: int,
                 slots: list[int], strategy: str, stage=None, placement=None,
                 classes: int | None = None):
        from nrpt.deep.metrics import BMA

        self.net, self.x, self.y = net, x_test, y_test
        # where the replicas live (nrpt.deep.placement.Placement; set by nrpt.deep.fit): the
        # logits are computed there, each replica alone, and gathered in slot order
        self.placement, self.classes = placement, classes
        self.every, self.start, self.slots = int(every), int(start), list(slots)
        self.reads_slots = tuple(self.slots)
        self.strategy, self.stage = strategy, stage
        self.bma = BMA()
        self.models: list[torch.Tensor] = []
        self.buffers: list[torch.Tensor] = []
        self.collected_at: list[int] = []

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
        self.collected_at.append(it.k + 1)
        self.models.append(theta.detach().to("cpu", torch.float32).clone())
        self.buffers.append(buf.detach().to("cpu", torch.float32).clone())

    def summary(self) -> dict[str, Any]:
        return {"models_collected": int(self.bma.count)}

    def state_dict(self) -> dict:
        return {"bma": self.bma.state_dict(), "models": list(self.models),
                "buffers": list(self.buffers), "collected_at": list(self.collected_at)}

    def load_state_dict(self, sd: dict) -> None:
        self.bma.load_state_dict(sd["bma"])
        self.models, self.buffers = list(sd["models"]), list(sd["buffers"])
        self.collected_at = list(sd["collected_at"])


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

    name = "epochs"

    def __init__(self, bma: BMARecorder, net, x_test, y_test, *, every: int, lr_unit: float,
                 strategy: str, per_epoch: int = 1, say=None):
        self.bma, self.net, self.x, self.y = bma, net, x_test, y_test
        self.every, self.lr_unit, self.strategy = int(every), float(lr_unit), strategy
        self.rows: list[dict[str, Any]] = []
        self._acc = None  # sums of [swaps, attempts, verdicts, listed pairs] per pair
        self.reads_slots = ()
        self.per_epoch, self.say = int(per_epoch), say

    def record(self, it) -> None:
        A, attempted = it.attempted_indicators  # swaps per attempt: what S is about
        V, listed = it.pair_indicators  # the verdict of every pair
        if self._acc is None:
            self._acc = torch.zeros(4, *A.shape, dtype=A.dtype, device=A.device)
        self._acc[0] += A
        self._acc[1] += attempted
        self._acc[2] += V
        self._acc[3] += listed
        if (it.k + 1) % self.every:
            return
        from nrpt.deep.metrics import evaluate

        row: dict[str, Any] = {"iteration": it.k + 1}
        if self.bma.bma.count:
            row.update({f"bma_{k}": v for k, v in
                        evaluate(self.bma.bma.probs(), self.y).items()})
        a, n, v, m = self._acc.sum(dim=(1, 2)).tolist()
        row["swap_rate"] = a / n if n > 0 else None
        # verdicts of the pairs that could not swap (other parity, closed gate): under DEO_W
        # they hold their configuration for a window (docs/deep.md, "Which verdicts adapt C")
        row["verdict_rate_others"] = (v - a) / (m - n) if m > n else None
        P = it.slot_of.shape[1]
        net, x, y = self.net, self.x, self.y

        def accuracy(theta, bn):  # where the replica lives; only the number is gathered
            out = net.logits(theta[None].to(net.dtype), bn[None].to(net.dtype), x,
                             self.strategy)[0]
            return (out.argmax(-1) == y).double().mean()[None]

        acc = self.bma.placement.per_slot(it.replica_at, range(P), accuracy, (1,),
                                          torch.float64)
        row["slot_accuracy"] = acc[:, 0].tolist()
        row["epoch"] = (it.k + 1) / self.per_epoch
        row["learning_rates"] = (it.step_size[0] * self.lr_unit).tolist()
        if "C" in it.params:
            row["C"] = float(it.params["C"][0, 0])
        self.rows.append(row)
        if self.say is not None:
            self.say(_line(row))
        self._acc.zero_()

    def summary(self):
        return {}

    def state_dict(self):
        return {"rows": json.dumps(json_ready(self.rows)), "acc": self._acc}

    def load_state_dict(self, sd):
        self.rows = json.loads(sd["rows"])
        self._acc = sd["acc"]


def _line(row: dict[str, Any]) -> str:
    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    return (f"epoch {row['epoch']:7.2f}  swap rate {f(row.get('swap_rate'), '.3f')}  "
            f"C {f(row.get('C'), '.4g')}  slot-0 acc {row['slot_accuracy'][0]:.4f}  "
            f"BMA acc {f(row.get('bma_accuracy'), '.4f')}  "
            f"BMA NLL {f(row.get('bma_nll_mean'), '.4f')}")




class IndexRecorder(RecorderBase):
    """The index process ``[K + 1, P]`` (slot of every replica) of a one-system run."""

    name = "index"

    def __init__(self):
        self.rows: list[torch.Tensor] = []
        self.reads_slots = ()

    def record(self, it) -> None:
        self.rows.append(it.slot_of[0].to(index_torch_dtype(it.slot_of.shape[-1])).clone())

    def array(self) -> np.ndarray:
        return torch.stack(self.rows).cpu().numpy() if self.rows else np.zeros((0, 0), np.int16)

    def summary(self):
        return {}

    def state_dict(self):
        return {"rows": torch.stack(self.rows) if self.rows else torch.zeros(0, 0,
                                                                             dtype=torch.int16)}

    def load_state_dict(self, sd):
        self.rows = list(sd["rows"])
