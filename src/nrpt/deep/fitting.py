"""``nrpt.deep.fit`` (this module, ``nrpt.deep.fitting``): tempered network replicas, and the
baselines of the AAAI paper's Table 2, run by the one loop and evaluated as a Bayesian model
average.

Methods, each charged the same number of minibatch gradient evaluations
``epochs * chains * ceil(N / batch_size)`` after the same pretraining:

============  ================================================================================
``deo-star``  DEO*-mSGD x P: momentum SGD at learning rates ``lr_min < ... < lr_max`` (slot 0
              the smallest), the deterministic swap rule ``Ũ_{p+1} + C < Ũ_p``, DEO_W with
              ``W* = ceil((log P + log log P) / -log(1 - S))``, ``C`` and the inner learning
              rates adapted toward the target swap rate ``S`` (Deng et al. 2023, Algorithm 1)
``deo``       the same with ``W = 1`` (DEO-mSGD x P)
``ensemble``  mSGD x P: ``chains`` independent momentum-SGD runs at learning rate ``lr``
``cyclical``  cycSGHMC x T: one SGHMC chain for ``chains`` times the iterations, cosine
              learning-rate cycles from ``lr_max`` (Zhang et al. 2020)
``swag``      SWAG x T: one momentum-SGD chain at learning rate ``lr`` for ``chains`` times the
              iterations; first/second moments and a low-rank deviation matrix collected; the
              average is over ``swag_samples`` draws, each with BatchNorm statistics refreshed
              on the training data (Maddox et al. 2019)
============  ================================================================================

Pretraining (``pretrain_epochs``; the paper pretrains its 10 models for 300 epochs): every
replica from its own initialisation, one cosine cycle of momentum SGD from ``lr_max`` (no swaps),
run by the same loop.  Single-chain methods continue from replica 0.

Collection: every ``collect_every`` iterations (default one epoch) after ``burn_in`` (a fraction
of the main run), the models at ``collect_slots`` (PT methods: slot 0; the ensemble: every
chain; the cyclical chain only in the sampling stage of its cycles) are evaluated on the test
set and their softmax probabilities (and logits) accumulated.  The summary is the final-epoch
average (no selection on the test set); ``average="logits"`` averages logits instead, as the
authors' released code does.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from nrpt import rng
from nrpt.adapt.sa import (
    CorrectionAdaptor,
    LearningRateAdaptor,
    SAStepSize,
    window_from_swap_rate,
)
from nrpt.core.engine import PTEngine
from nrpt.core.loop import Plan, Run, execute
from nrpt.deep.energy import NetworkEnergy, NetworkTarget
from nrpt.deep.replicas import STRATEGIES, FunctionalNet, choose_strategy
from nrpt.explorers.sgmcmc import SGHMC, Cyclical, MomentumSGD
from nrpt.paths.ladders import NoiseLadder, geometric_ladder
from nrpt.recorders.draws import index_torch_dtype
from nrpt.recorders.stats import RoundTrips, SwapStats, Trace, json_ready
from nrpt.report.health import SamplingWarning
from nrpt.roles import RecorderBase
from nrpt.run import folder as rf
from nrpt.swap import DEOW, Deterministic, NoSwap

__all__ = ["fit", "DeepConfig", "DeepResult", "METHODS", "BMARecorder"]

METHODS = ("deo-star", "deo", "ensemble", "cyclical", "swag")
PT_METHODS = ("deo-star", "deo")
SINGLE_CHAIN = ("cyclical", "swag")
AVERAGES = ("probabilities", "logits")
STRATEGY_FILE = "strategy.json"


@dataclass
class DeepConfig:
    """Every setting of a deep run (validated on construction; written to ``config.json``).
    Learning rates are per *mean* batch loss, as in PyTorch (the engine uses ``lr / N``)."""

    method: str = "deo-star"
    chains: int = 4
    epochs: float = 10.0
    batch_size: int = 128
    lr_min: float = 0.005
    lr_max: float = 0.02
    lr: float | None = None            # ensemble / swag (default lr_min)
    momentum: float = 0.9
    weight_decay: float = 5e-4
    swap_rate: float = 0.005           # S (the paper's CIFAR-100 optimum)
    window: int | str = "optimal"      # "optimal" = W* from S; deo forces 1
    correction: float = 0.0            # initial C
    sa_scale: float = 25.0             # C's SA gain per unit of the energy noise sd
    sa_pairs: str = "attempted"        # verdicts that adapt C and the rates: "attempted" pairs,
                                       # or "all" pairs every iteration (Algorithm 1, Eq. 13)
    pretrain_epochs: float = 2.0
    burn_in: float = 0.25              # fraction of the main run before collection
    collect_every: int | None = None   # iterations (default: one epoch)
    average: str = "probabilities"
    cycles: int | None = None          # cyclical: default one cycle per 10 epochs of its budget
    temperature: float = 1.0           # cyclical SGHMC noise temperature
    swag_rank: int = 20
    swag_samples: int = 20
    seed: int = 0
    device: str | None = None          # default: where the model's parameters are
    strategy: str = "auto"
    eval_every: float = 1.0            # epochs between per-epoch metric rows
    checkpoint_every: int = 2000

    def __post_init__(self):
        from dataclasses import fields as _fields

        from nrpt.scalars import plain as _plain

        for f in _fields(self):  # NumPy / 0-d torch scalars are numbers like any other
            setattr(self, f.name, _plain(getattr(self, f.name)))

        def bad(name, allowed):
            raise ValueError(f"{name} must be {allowed}; got {getattr(self, name)!r}")

        if self.method not in METHODS:
            bad("method", f"one of {METHODS}")
        if self.average not in AVERAGES:
            bad("average", f"one of {AVERAGES}")
        if self.strategy not in STRATEGIES:
            bad("strategy", f"one of {STRATEGIES}")
        if self.sa_pairs not in ("all", "attempted"):
            bad("sa_pairs", "'all' or 'attempted'")
        if not (isinstance(self.chains, int) and self.chains >= 2):
            bad("chains", "an integer >= 2 (P replicas; single-chain methods run chains x the "
                "iterations)")
        for name in ("epochs", "lr_min", "lr_max", "eval_every"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                bad(name, "a finite number > 0")
        if not self.lr_min < self.lr_max:
            raise ValueError(f"lr_min must be < lr_max; got {self.lr_min} and {self.lr_max}")
        def finite(v) -> bool:
            return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)

        if not (isinstance(self.seed, int) and not isinstance(self.seed, bool)
                and 0 <= self.seed < 2 ** 64):
            bad("seed", "an integer in [0, 2^64)")
        if self.lr is not None and not (finite(self.lr) and self.lr > 0):
            bad("lr", "a finite number > 0 (or None: lr_min)")
        if not finite(self.correction):
            bad("correction", "a finite number")
        if not (finite(self.sa_scale) and self.sa_scale > 0):
            bad("sa_scale", "a finite number > 0")
        if not 0 <= self.momentum < 1:
            bad("momentum", "in [0, 1)")
        if not (finite(self.weight_decay) and self.weight_decay >= 0):
            bad("weight_decay", "a finite number >= 0")
        if not 0 < self.swap_rate < 1:
            bad("swap_rate", "in (0, 1)")
        if not (self.window == "optimal" or (isinstance(self.window, int) and self.window >= 1)):
            bad("window", "'optimal' or an integer >= 1")
        if not (isinstance(self.batch_size, int) and self.batch_size >= 2):
            bad("batch_size", "an integer >= 2")
        if not 0 <= self.burn_in < 1:
            bad("burn_in", "a fraction in [0, 1)")
        if not (finite(self.pretrain_epochs) and self.pretrain_epochs >= 0):
            bad("pretrain_epochs", "a finite number >= 0")
        if self.collect_every is not None and not (isinstance(self.collect_every, int)
                                                   and self.collect_every >= 1):
            bad("collect_every", "an integer >= 1 (iterations) or None (one epoch)")
        if self.cycles is not None and not (isinstance(self.cycles, int) and self.cycles >= 1):
            bad("cycles", "an integer >= 1")
        if not (finite(self.temperature) and self.temperature >= 0):
            bad("temperature", "a finite number >= 0")
        for name in ("swag_rank", "swag_samples", "checkpoint_every"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                bad(name, "an integer >= 1")

    @property
    def constant_lr(self) -> float:
        return float(self.lr if self.lr is not None else self.lr_min)


# ---------------------------------------------------------------------------------- data checks
def _check_data(name: str, data, classes: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    if not (isinstance(data, tuple | list) and len(data) == 2):
        raise ValueError(f"{name} must be a pair (X, y) of tensors")
    X, y = (torch.as_tensor(t) for t in data)
    if X.shape[0] != y.shape[0] or y.dim() != 1:
        raise ValueError(f"{name}: X has {X.shape[0]} rows but y has shape {list(y.shape)} "
                         f"(y must be [n] class labels, one per row of X)")
    if X.shape[0] < 2:
        raise ValueError(f"{name} needs at least 2 examples")
    if y.dtype.is_floating_point or y.dtype == torch.bool:
        raise ValueError(f"{name}: y must hold integer class labels; got {y.dtype}")
    y = y.long()
    if int(y.min()) < 0 or (classes is not None and int(y.max()) >= classes):
        raise ValueError(f"{name}: labels must be in [0, {classes}); got min {int(y.min())}, "
                         f"max {int(y.max())}")
    if not torch.isfinite(X.float()).all():
        raise ValueError(f"{name}: X holds NaN or inf")
    return X, y


def _classes_of(net: FunctionalNet, X: torch.Tensor) -> int:
    theta, buf = net.pack()
    try:
        out = net.logits(theta[None], buf[None], X[:2], strategy="loop")
    except Exception as err:
        raise ValueError(f"train: X rows of shape {list(X.shape[1:])} do not fit the model "
                         f"({type(err).__name__}: {str(err).splitlines()[0][:200]})") from err
    if out.dim() != 3:
        raise ValueError(f"the model must return logits [batch, classes]; got "
                         f"{list(out.shape[1:])}")
    return int(out.shape[-1])


# ---------------------------------------------------------------------------------- recorders
class BMARecorder(RecorderBase):
    """Collects the models at ``slots`` every ``every`` iterations from iteration ``start`` on
    (and, if ``stage(k)`` is given, only when it is true) and accumulates their test-set
    probabilities and logits; keeps the collected models (float32, CPU) for
    :meth:`DeepResult.predict_proba`; tracks each slot's current test accuracy."""

    name = "bma"

    def __init__(self, net: FunctionalNet, x_test, y_test, *, every: int, start: int,
                 slots: list[int], strategy: str, stage=None):
        from nrpt.deep.metrics import BMA

        self.net, self.x, self.y = net, x_test, y_test
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
        theta = it.slot_x(self.slots)[0]  # [S, dim] (one system)
        reps = it.replica_at[0, self.slots]
        buf = it.state.extras["bn"][0, reps]
        logits = self.net.logits(theta.to(self.net.dtype), buf.to(self.net.dtype), self.x,
                                 self.strategy)
        for row in logits:
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
        theta = it.slot_x(list(range(P)))[0]
        buf = it.state.extras["bn"][0, it.replica_at[0]]
        logits = self.net.logits(theta.to(self.net.dtype), buf.to(self.net.dtype), self.x,
                                 self.strategy)
        row["slot_accuracy"] = (logits.argmax(-1) == self.y).double().mean(-1).tolist()
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


# ---------------------------------------------------------------------------------- result
@dataclass
class DeepResult:
    """What :func:`fit` returns: ``summary`` (also as attributes), per-epoch ``metrics`` rows,
    the index process ``index[K + 1, P]`` (PT methods), and the collected models."""

    summary: dict[str, Any]
    config: DeepConfig
    metrics: list[dict[str, Any]] = field(default_factory=list)
    index: np.ndarray | None = None
    trace: dict[str, Any] = field(default_factory=dict)
    net: FunctionalNet | None = field(default=None, repr=False)
    models: torch.Tensor | None = field(default=None, repr=False)
    buffers: torch.Tensor | None = field(default=None, repr=False)
    out: Path | None = None

    def __getattr__(self, name):
        summary = self.__dict__.get("summary", {})
        if name in summary:
            return summary[name]
        raise AttributeError(name)

    @torch.no_grad()
    def predict_proba(self, X, average: str | None = None) -> torch.Tensor:
        """The Bayesian model average's class probabilities ``[n, classes]`` on ``X``."""
        average = average or self.config.average
        if average not in AVERAGES:
            raise ValueError(f"average must be one of {AVERAGES}; got {average!r}")
        if self.models is None or len(self.models) == 0:
            raise ValueError("no models were collected (raise epochs or lower burn_in)")
        net = self.net
        X = torch.as_tensor(X).to(net.device)
        theta = self.models.to(net.device, net.dtype)
        buf = self.buffers.to(net.device, net.dtype)
        logits = net.logits(theta, buf, X.to(net.dtype), self.summary.get("strategy", "vmap"))
        if average == "logits":
            return torch.softmax(logits.double().mean(0), -1)
        return torch.softmax(logits.double(), -1).mean(0)


# ---------------------------------------------------------------------------------- building
def _initial_replicas(net: FunctionalNet, model: nn.Module, n: int, seed: int):
    """``n`` replicas: replica 0 the given model, the others re-initialised (``reset_parameters``
    of every layer, seeded from ``(seed, replica)`` inside ``fork_rng``)."""
    thetas, bufs = [], []
    for r in range(n):
        m = net.load(*net.pack(model))
        if r > 0:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(rng.key(seed, rng.Stream.INIT, 0xDEE9, r))
                for mod in m.modules():
                    if hasattr(mod, "reset_parameters"):
                        mod.reset_parameters()
        t, b = net.pack(m)
        thetas.append(t)
        bufs.append(b)
    return torch.stack(thetas), torch.stack(bufs)


def _engine(target, estimator, explorer, P: int, temps, step, scheme, rule, seed: int, x0, bn0,
            dtype, device):
    target.initial_buffers = bn0.reshape(P, -1)
    return PTEngine(target, NoiseLadder(temps, min_slots=1), explorer, scheme, rule,
                    step_size=step, systems=1, seed=seed, dtype=dtype, device=device,
                    initial_states=x0.reshape(1, P, -1))


#: run folders whose lock this process holds (resolved path -> depth): ``nrpt deep`` takes the
#: lock before it writes cli.json and :func:`fit` takes it again (a second flock of the same
#: file from this process would refuse it)
_HELD: dict[str, int] = {}


@contextlib.contextmanager
def folder_lock(out: str | Path | None):
    """The run folder's lock (:class:`nrpt.run.folder.RunLock`, ``.nrpt.lock``) for a deep run:
    a second run or resume of ``out`` while this one goes on fails at once with
    :class:`nrpt.run.folder.RunFolderBusy`.  Re-entrant within this process; creates ``out``."""
    if out is None:
        yield
        return
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    key = str(out.resolve())
    if key in _HELD:
        _HELD[key] += 1
        try:
            yield
        finally:
            _HELD[key] -= 1
        return
    with rf.RunLock(out):
        _HELD[key] = 1
        try:
            yield
        finally:
            del _HELD[key]


def fit(model: nn.Module, train, test, *, method: str = "deo-star", chains: int = 4,
        epochs: float = 10.0, seed: int = 0, out: str | Path | None = None,
        progress: bool = False, augment=None, classes: int | None = None, resume: bool = False,
        callback=None, say=None, **options) -> DeepResult:
    """Tempered replicas of ``model`` on ``train = (X, y)``, evaluated on ``test = (X, y)``.

    ``method`` is one of :data:`METHODS`; every other setting is a :class:`DeepConfig` field
    (``lr_min``, ``lr_max``, ``batch_size``, ``swap_rate``, ``pretrain_epochs``, ``burn_in``,
    ``collect_every``, ``average``, ``strategy``, ...).  ``augment(x, generator)`` is applied to
    every training batch.  With ``out`` the run folder gets ``config.json``, ``summary.json``,
    ``metrics.csv``, ``index.npy``, checkpoints and figures; ``resume=True`` continues the
    interrupted run in ``out`` (give the same model and data).  ``callback(engine)`` is called
    every 256 iterations of the pretraining and of the main run; raising ``KeyboardInterrupt``
    there stops it cleanly (as Ctrl-C does), with a checkpoint to resume from.  ``say(line)``
    receives one line per evaluation epoch (swap rate, ``C``, slot-0 and BMA accuracy).

    The folder ``out`` is locked for the whole call (:func:`folder_lock`): a concurrent run or
    resume of the same folder is refused (:class:`nrpt.run.folder.RunFolderBusy`)."""
    cfg = DeepConfig(method=method, chains=chains, epochs=epochs, seed=seed, **options)
    with folder_lock(out):
        return _fit(cfg, model, train, test, out=out, progress=progress, augment=augment,
                    classes=classes, resume=resume, callback=callback, say=say)


def _fit(cfg, model, train, test, *, out, progress, augment, classes, resume, callback,
         say) -> DeepResult:
    net = FunctionalNet(model)
    dev, dtype = net.device, net.dtype
    if cfg.device is not None and torch.device(cfg.device) != dev:
        model = copy.deepcopy(model).to(cfg.device)  # the caller's model stays where it is
        net = FunctionalNet(model)
        dev = net.device
    Xtr, ytr = _check_data("train", train)
    n_classes = _classes_of(net, Xtr.to(dev, dtype))
    if classes is not None and classes > n_classes:
        raise ValueError(f"classes ({classes}) is larger than the model's {n_classes} outputs")
    Xtr, ytr = _check_data("train", (Xtr, ytr), n_classes)
    Xte, yte = _check_data("test", test, n_classes)
    if Xte.shape[1:] != Xtr.shape[1:]:
        raise ValueError(f"test: X rows have shape {list(Xte.shape[1:])}, train rows "
                         f"{list(Xtr.shape[1:])}")
    Xtr, Xte = Xtr.to(dev, dtype), Xte.to(dev, dtype)
    ytr, yte = ytr.to(dev), yte.to(dev)
    out = Path(out) if out is not None else None
    header = {"deep_config": json.dumps(asdict(cfg))}
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        started = any((out / f).exists() for f in ("checkpoint.pt", STRATEGY_FILE,
                                                    "pretrained.pt"))
        if not resume and started:
            raise FileExistsError(f"{out} already holds a deep run: resume it (resume=True / "
                                  f"`nrpt deep --resume {out}`) or choose another folder")
        if resume and not started:
            raise FileNotFoundError(f"{out} holds no deep run to resume")
    elif resume:
        raise ValueError("resume=True needs out (the run folder)")

    N, B, P = int(ytr.shape[0]), cfg.batch_size, cfg.chains
    if B > N:
        raise ValueError(f"batch_size ({B}) is larger than the training data (N = {N})")
    per_epoch = math.ceil(N / B)
    main_iters = max(1, round(cfg.epochs * per_epoch))
    target = NetworkTarget(net, Xtr, ytr, weight_decay=cfg.weight_decay, augment=augment,
                           strategy="loop")
    estimator = NetworkEnergy(target, B)
    t_start = time.perf_counter()
    # the wall time of the sessions before this one (an interrupted run's summary.json holds
    # it), so that a resumption adds to the run's time instead of replacing it
    earlier = _earlier_wall_time(out) if resume else 0.0

    # execution strategy, measured on one step of the real batch (a resumption reuses the
    # run's own: strategies agree only to rounding)
    theta0, buf0 = _initial_replicas(net, model, P, cfg.seed)
    pre_iters = round(cfg.pretrain_epochs * per_epoch)
    pre_path = out / "pretrained.pt" if out is not None else None
    if resume and (out / STRATEGY_FILE).exists():
        strategy, timings = json.loads((out / STRATEGY_FILE).read_text())["strategy"], {}
    else:
        probe_idx = torch.arange(P * B, device=dev).reshape(P, B) % N
        # steps of P replicas (single-chain methods take P x as many steps of one replica,
        # which cost no less: a lower bound of their time)
        total = pre_iters + main_iters
        strategy, timings = choose_strategy(net, theta0.to(dev), buf0.to(dev), Xtr[probe_idx],
                                            ytr[probe_idx], cfg.strategy, iterations=total)
        if out is not None:
            rf.atomic_write(out / STRATEGY_FILE, json.dumps({"strategy": strategy,
                                                             "timings_s": timings}))
    target.strategy = strategy

    # pretraining: every replica, one cosine cycle from lr_max, no swaps (checkpointed in
    # out/pretrain, so an interruption here loses nothing either)
    if resume and pre_path.exists():
        saved = rf.load_weights(pre_path)
        theta0, buf0 = saved["theta"].to(dev), saved["buffers"].to(dev)
    else:
        if pre_iters > 0:
            explorer = Cyclical(MomentumSGD(estimator, momentum=cfg.momentum), 1, pre_iters)
            eng = _engine(target, estimator, explorer, P, [0.0] * P, cfg.lr_max / N, NoSwap(),
                          Deterministic(0.0), rng.key(cfg.seed, 0x9E7), theta0, buf0, dtype,
                          dev)
            pre_dir = out / "pretrain" if out is not None else None
            ck = None
            if pre_dir is not None:
                pre_dir.mkdir(exist_ok=True)
                if resume and rf.checkpoint_exists(pre_dir):
                    ck = _resumable(pre_dir, header)
            pre = execute(Run(eng, [], {}, Plan.fixed(pre_iters)), out=pre_dir,
                          checkpoint_every=cfg.checkpoint_every, progress=progress, resume=ck,
                          header=header, callback=callback)
            if pre.interrupted:
                return DeepResult(summary={"method": cfg.method, "interrupted": True,
                                           "phase": "pretraining",
                                           "iterations": int(eng.k)}, config=cfg, out=out)
            theta0, buf0 = eng.state.x[0].detach().clone(), eng.state.extras["bn"][0].clone()
        if pre_path is not None:
            with rf.atomic_path(pre_path) as tmp:
                torch.save({"theta": theta0.cpu(), "buffers": buf0.cpu()}, tmp)

    # the main run
    single = cfg.method in SINGLE_CHAIN
    n_slots = 1 if single else P
    iters = main_iters * (P if single else 1)
    every = cfg.collect_every or per_epoch
    start = int(cfg.burn_in * iters)
    x0, bn0 = (theta0[:1], buf0[:1]) if single else (theta0, buf0)
    facts: dict[str, Any] = {"strategy": strategy, "strategy_timings_s": timings}
    adaptors: list = []
    stage = None
    if cfg.method in PT_METHODS:
        W = 1 if cfg.method == "deo" else (
            window_from_swap_rate(P, cfg.swap_rate) if cfg.window == "optimal" else cfg.window)
        facts["window"] = W
        if iters < 4 * P * W:  # a replica crosses at most one pair per window
            warnings.warn(
                f"the main run holds {iters / W:.1f} windows of W = {W} iterations, but a round "
                f"trip of {P} replicas needs at least {2 * (P - 1)}: expect few or no round "
                f"trips; raise epochs or swap_rate (W* = ceil((log P + log log P) / -log(1 - S)))",
                SamplingWarning, stacklevel=2)
        explorer = MomentumSGD(estimator, momentum=cfg.momentum)
        step = [v / N for v in geometric_ladder(cfg.lr_min, cfg.lr_max, P)]
        eng = _engine(target, estimator, explorer, P, [0.0] * P, step, DEOW(W),
                      Deterministic(cfg.correction), cfg.seed, x0, bn0, dtype, dev)
        # C's gain scales with the energy noise (the paper's simulation: sd 2, a = 50)
        key = rng.Key((cfg.seed, 0x5CA1E))
        noise_sd = float(estimator(eng.state.x, key, estimator.init_extras(eng.state.x, key),
                                   need_grad=False).var.mean().sqrt())
        facts["energy_noise_sd"] = noise_sd
        gain = SAStepSize(cfg.sa_scale * max(noise_sd, 1e-12))
        adaptors = [CorrectionAdaptor(cfg.swap_rate, gain, pairs=cfg.sa_pairs),
                    LearningRateAdaptor(cfg.swap_rate, SAStepSize(), pairs=cfg.sa_pairs)]
        slots = [0]
    elif cfg.method == "ensemble":
        explorer = MomentumSGD(estimator, momentum=cfg.momentum)
        eng = _engine(target, estimator, explorer, P, [0.0] * P, cfg.constant_lr / N, NoSwap(),
                      Deterministic(0.0), cfg.seed, x0, bn0, dtype, dev)
        slots = list(range(P))
    elif cfg.method == "cyclical":
        cycles = cfg.cycles or max(1, round(cfg.epochs * P / 10))
        explorer = Cyclical(SGHMC(estimator, momentum=cfg.momentum), cycles, iters)
        eng = _engine(target, estimator, explorer, 1, [cfg.temperature], cfg.lr_max / N,
                      NoSwap(), Deterministic(0.0), cfg.seed, x0, bn0, dtype, dev)
        stage, slots = explorer.in_sampling_stage, [0]
        every = cfg.collect_every or max(1, per_epoch // 2)
        facts["cycles"] = cycles
    else:  # swag
        explorer = MomentumSGD(estimator, momentum=cfg.momentum)
        eng = _engine(target, estimator, explorer, 1, [0.0], cfg.constant_lr / N, NoSwap(),
                      Deterministic(0.0), cfg.seed, x0, bn0, dtype, dev)
        slots = [0]

    bma = BMARecorder(net, Xte, yte, every=every, start=start, slots=slots, strategy=strategy,
                      stage=stage)
    recorders: dict[str, Any] = {"bma": bma}
    if cfg.method == "swag":
        recorders = {"swag": SWAGRecorder(net.dim, cfg.swag_rank, every=every, start=start)}
    recorders["epochs"] = EpochMetrics(bma, net, Xte, yte,
                                       every=max(1, round(cfg.eval_every * per_epoch)),
                                       lr_unit=N, strategy=strategy, per_epoch=per_epoch,
                                       say=say)
    if n_slots > 1:
        recorders["swaps"] = SwapStats(1, n_slots, dtype=eng.dtype)
        recorders["round_trips"] = RoundTrips(eng.slot_of, n_slots)
        recorders["trace"] = Trace(every=max(1, iters // 500))
        recorders["index"] = IndexRecorder()
    for r in recorders.values():
        eng.watch(getattr(r, "reads_slots", ()))

    checkpoint = None
    if resume and rf.checkpoint_exists(out):
        checkpoint = _resumable(out, header)
    outcome = execute(Run(eng, adaptors, recorders, Plan.fixed(iters), facts), out=out,
                      checkpoint_every=cfg.checkpoint_every, progress=progress,
                      resume=checkpoint, header=header, callback=callback)

    # the average
    if cfg.method == "swag":
        average, models, buffers = _swag_average(recorders["swag"].swag, net, bn0[0], target,
                                                 Xte, cfg, strategy, dev)
    else:
        average, models, buffers = bma.bma, bma.models, bma.buffers
    summary = _summary(cfg, average, yte, recorders, eng, N, B, per_epoch, pre_iters, facts,
                       outcome, earlier + time.perf_counter() - t_start)
    res = DeepResult(summary=summary, config=cfg, metrics=recorders["epochs"].rows,
                     index=recorders["index"].array() if "index" in recorders else None,
                     trace=recorders["trace"].arrays() if "trace" in recorders else {},
                     net=net, out=out,
                     models=torch.cat(models) if models else None,
                     buffers=torch.cat(buffers) if buffers else None)
    if out is not None:
        from nrpt.deep.report import write_folder

        write_folder(res, out, Xte, yte)
    return res


def _earlier_wall_time(folder: Path) -> float:
    """``wall_time_s`` of ``folder``'s ``summary.json`` (0 when there is none: a run killed
    before writing it; its loop time still counts through the checkpoint, see _summary)."""
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        return float(json.loads((folder / "summary.json").read_text())["wall_time_s"])
    return 0.0


def _resumable(folder: Path, header: dict) -> dict:
    """The checkpoint of ``folder``, refused if its settings differ from ``header``'s."""
    checkpoint, _ = rf.read_checkpoint(folder)
    then = json.loads(checkpoint.get("header", {}).get("deep_config", "{}"))
    now = json.loads(header["deep_config"])
    changed = sorted(k for k in set(then) | set(now) if then.get(k) != now.get(k))
    if changed:
        diff = ", ".join(f"{k}: {then.get(k)!r} -> {now.get(k)!r}" for k in changed)
        raise ValueError(f"cannot resume {folder}: settings differ from the run's own ({diff})")
    return checkpoint


def _swag_average(swag, net, buf0, target, Xte, cfg, strategy, dev):
    """``swag_samples`` SWAG draws, each with its BatchNorm statistics refreshed on the
    training data: ``(BMA, models, buffers)``."""
    from nrpt.deep.metrics import BMA

    average, models, buffers = BMA(), [], []
    if swag.n_collected < 2:
        return average, models, buffers
    g = rng.generator_for(cfg.seed, 0x5A6, device="cpu")
    for _ in range(cfg.swag_samples):
        theta = swag.sample(g).to(dev, net.dtype)
        buf = net.refreshed_buffers(theta, buf0.to(net.dtype), (
            x for x in target.x.split(cfg.batch_size) if x.shape[0] > 1))
        average.add(net.logits(theta[None], buf[None], Xte, strategy)[0])
        models.append(theta[None].to("cpu", torch.float32))
        buffers.append(buf[None].to("cpu", torch.float32))
    return average, models, buffers


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


def _summary(cfg, average, y_test, recorders, eng, N, B, per_epoch, pre_iters, facts,
             outcome, wall) -> dict[str, Any]:
    from nrpt.deep.metrics import evaluate

    s: dict[str, Any] = {"method": cfg.method, "chains": cfg.chains, "epochs": cfg.epochs,
                         "n_train": N, "batch_size": B, "iterations": int(eng.k),
                         "iterations_per_epoch": per_epoch}
    if average.count:
        s.update(evaluate(average.probs(cfg.average), y_test))
        other = "logits" if cfg.average == "probabilities" else "probabilities"
        s[f"{other}_average"] = evaluate(average.probs(other), y_test)
    else:
        s.update({k: None for k in ("accuracy", "nll_mean", "nll_sum", "ece", "brier")})
    s["models_collected"] = int(average.count)
    s["average"] = cfg.average
    n_rep = eng.P
    s["gradient_evaluations"] = int(eng.k) * n_rep
    s["examples_seen"] = int(eng.k) * n_rep * B
    s["pretrain_gradient_evaluations"] = int(pre_iters) * cfg.chains
    if "swaps" in recorders:
        sw = recorders["swaps"].summary()
        s["swap_rates"] = sw["swap_acceptance"]
        # the per-pair rate of the swap condition over every iteration: what C and the
        # learning rates are adapted to bring to S (the paper's "acceptance rates")
        s["indicator_rates"] = recorders["trace"].summary().get("indicator_rate")
        rt = recorders["round_trips"].summary()
        s["round_trips"] = rt["round_trips"]
        s["round_trips_per_100_epochs"] = (float(s["round_trips"]) * 100 * per_epoch
                                           / max(1, int(eng.k)))
    else:
        s["swap_rates"], s["round_trips"] = [], 0
    s["learning_rates"] = (eng.step_size[0] * N).tolist()
    s["correction"] = float(eng.params["C"][0, 0]) if cfg.method in PT_METHODS else None
    s.update(json_ready(facts))
    s["interrupted"] = bool(outcome.interrupted)
    # every session's time (a run killed before its summary: at least its loops' time)
    s["wall_time_s"] = max(wall, outcome.wall_time_s)
    s["loop_time_s"] = outcome.wall_time_s
    return json_ready(s)

