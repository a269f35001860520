"""``nrpt.deep.fit``: tempered network replicas and the baselines of the AAAI paper's Table 2
(:data:`nrpt.deep.methods.BUILDERS`), run by the one loop after the same pretraining
(``pretrain_epochs``: one cosine cycle from ``lr_max`` per replica, no swaps) with the same
budget ``epochs * chains * ceil(N / batch_size)`` gradient evaluations, evaluated as a
Bayesian model average of the models at ``collect_slots`` every ``collect_every`` iterations
after ``burn_in`` (``average``: ``"probabilities"`` or ``"logits"``)."""


from __future__ import annotations

import contextlib
import copy
import datetime
import functools
import hashlib
import json
import math
import os
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from nrpt import rng
from nrpt.core.loop import Interrupt, Plan, Run, execute
from nrpt.deep.config import AVERAGES, DeepConfig
from nrpt.deep.energy import NetworkEnergy, NetworkTarget
from nrpt.deep.methods import BUILDERS, METHODS, Context, Method, Setup, make_engine
from nrpt.deep.metrics import all_finite
from nrpt.deep.placement import Placement
from nrpt.deep.recorders import BMARecorder, EpochMetrics, IndexRecorder, SWAGRecorder
from nrpt.deep.replicas import FunctionalNet, choose_strategy
from nrpt.deep.store import MODELS_DIR, ModelStore, ModelTally
from nrpt.explorers.sgmcmc import Cyclical, MomentumSGD
from nrpt.recorders.stats import RoundTrips, SwapStats, Trace, json_ready
from nrpt.run import folder as rf
from nrpt.swap import Deterministic, NoSwap

__all__ = ["fit", "DeepConfig", "DeepResult", "METHODS", "BMARecorder", "Deadline", "folder_lock"]

STRATEGY_FILE = "strategy.json"
PRETRAINED = "pretrained.pt"
#: what run.json's ``kind`` says of a deep run (``nrpt resume`` dispatches on it)
KIND = "deep"


# ---------------------------------------------------------------------------------- data checks
def _check_data(name: str, data, classes: int | None = None, finite: bool = True
                ) -> tuple[torch.Tensor, torch.Tensor]:
    if not (isinstance(data, tuple | list) and len(data) == 2):
        raise ValueError(f"{name} must be a pair (X, y) of tensors")
    X, y = (torch.as_tensor(t) for t in data)
    if X.shape[0] != y.shape[0] or y.dim() != 1:
        raise ValueError(f"{name}: X has {X.shape[0]} rows but y has shape {list(y.shape)} "
                         f"(y must be [n] class labels, one per row of X)")
    if X.shape[0] < 2:
        raise ValueError(f"{name} needs at least 2 examples")
    if y.dtype.is_floating_point or y.dtype == torch.bool:
        raise ValueError(f"{name}: y must hold integer class labels; got {y.dtype} (float "
                         f"targets of a regression take likelihood='gaussian')")
    y = y.long()
    if int(y.min()) < 0 or (classes is not None and int(y.max()) >= classes):
        raise ValueError(f"{name}: labels must be in [0, {classes}); got min {int(y.min())}, "
                         f"max {int(y.max())}")
    if finite and not all_finite(X.float()):  # (finite=False: checked already)
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
    store: ModelStore | None = field(default=None, repr=False)
    out: Path | None = None
    #: a regression run's targets (:meth:`nrpt.deep.regression.Targets.state`); None: classes
    targets: dict[str, Any] | None = None

    def __getattr__(self, name):
        summary = self.__dict__.get("summary", {})
        if name in summary:
            return summary[name]
        raise AttributeError(name)

    @property
    def models(self) -> torch.Tensor | None:
        """Every collected model ``[S, dim]`` at once (float32, CPU; memory grows with their
        number: :meth:`predict_proba` streams them from the store instead)."""
        return None if self.store is None else self.store.all()[0]

    @property
    def buffers(self) -> torch.Tensor | None:
        """The BatchNorm statistics ``[S, buffer_dim]`` of :attr:`models`."""
        return None if self.store is None else self.store.all()[1]

    @torch.no_grad()
    def predict_proba(self, X, average: str | None = None, chunk: int = 16) -> torch.Tensor:
        """The Bayesian model average's class probabilities ``[n, classes]`` on ``X``; the
        models are read from the store ``chunk`` at a time (float64 sums)."""
        if self.targets is not None:
            raise ValueError("predict_proba is for likelihood='categorical'; a regression "
                             "run's predictive is predict(X) -> (mean, sd)")
        average = average or self.config.average
        if average not in AVERAGES:
            raise ValueError(f"average must be one of {AVERAGES}; got {average!r}")
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ValueError(f"chunk must be an integer >= 1 (models per batch); got {chunk!r}")
        if self.store is None or len(self.store) == 0:
            raise ValueError("no models were collected (raise epochs or lower burn_in)")
        net = self.net
        X = torch.as_tensor(X).to(net.device)
        strategy = self.summary.get("strategy", "vmap")
        total, n = None, 0
        for theta, buf in self.store.chunks(chunk):
            logits = net.logits(theta.to(net.device, net.dtype), buf.to(net.device, net.dtype),
                                X.to(net.dtype), strategy).double()
            part = (logits if average == "logits" else torch.softmax(logits, -1)).sum(0)
            total = part if total is None else total + part
            n += logits.shape[0]
        total = total / n
        return torch.softmax(total, -1) if average == "logits" else total

    @torch.no_grad()
    def predict(self, X, chunk: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
        """A regression run's predictive on ``X``: the mean and sd of the mixture of the
        collected Gaussians, float64 in the targets' original units, ``[n]`` (targets were
        ``[n]``) or ``[n, k]``; the models are read from the store ``chunk`` at a time."""
        from nrpt.deep.regression import targets_from_state

        if self.targets is None:
            raise ValueError("predict is for likelihood='gaussian'; a classifier's predictive "
                             "is predict_proba(X)")
        if self.store is None or not len(self.store):
            raise ValueError("no models were collected (raise epochs or lower burn_in)")
        t, net = targets_from_state(self.targets), self.net
        X = torch.as_tensor(X).to(net.device, net.dtype)
        strategy = self.summary.get("strategy", "vmap")
        s1 = s2 = 0.0
        n = 0
        for theta, buf in self.store.chunks(chunk):
            out = net.logits(theta.to(net.device, net.dtype), buf.to(net.device, net.dtype), X,
                             strategy).double().cpu()
            mu, log_sd = t.split(out)  # [S, n, k]
            s1 = s1 + mu.sum(0)
            s2 = s2 + (mu * mu + torch.exp(2 * log_sd)).sum(0)
            n += mu.shape[0]
        mean = s1 / n
        var = s2 / n - mean * mean
        mean, sd = mean * t.scale + t.mean, var.clamp(min=0).sqrt() * t.scale
        return (mean[:, 0], sd[:, 0]) if t.vector else (mean, sd)


# ---------------------------------------------------------------------------------- building
def _initial_replicas(net: FunctionalNet, model: nn.Module, n: int, seed: int):
    """``n`` replicas: replica 0 the given model, the others re-initialised (``reset_parameters``
    of every layer, seeded from ``(seed, replica)`` inside ``fork_rng``, each starting from the
    given model's values)."""
    theta0, buf0 = net.pack(model)
    thetas, bufs = [theta0], [buf0]
    if n > 1:
        # the layers reset are the net's own copy of the model (no deep copy of the model per
        # fit: ~0.5 ms of a small model's set-up), given back its tensors and values after
        m = net.module
        stores = [(store, dict(store)) for mod in m.modules()
                  for store in (mod._parameters, mod._buffers, mod._modules)]
        values = [(t, t.detach().clone()) for mod in m.modules()
                  for store in (mod._parameters, mod._buffers) for t in store.values()
                  if t is not None]
        try:
            for r in range(1, n):
                net.assign(m, theta0, buf0)
                _reset(m, net.device, rng.key(seed, rng.Stream.INIT, 0xDEE9, r))
                t, b = net.pack(m)
                thetas.append(t)
                bufs.append(b)
        finally:  # (the slots as they were, a tensor or submodule a reset replaced or
            # added included; plain attributes a custom reset sets are its own)
            for store, slots in stores:
                store.clear()
                store.update(slots)
            with torch.no_grad():
                for t, value in values:
                    t.copy_(value)
    return torch.stack(thetas), torch.stack(bufs)


def _reset(m: nn.Module, device: torch.device, key: int) -> None:
    """``reset_parameters`` of every layer of ``m`` that has one, its draws seeded from ``key``
    (the caller's generator state kept)."""
    with torch.random.fork_rng(devices=[]):
        # a CPU model's layers draw from the CPU generator alone: seeding it is what
        # torch.manual_seed does for them, without the lazy seeding of every other device kind
        # (which formats the caller's stack each call: ~0.2-0.8 ms per replica)
        if device.type == "cpu":
            torch.default_generator.manual_seed(key)
        else:
            torch.manual_seed(key)
        for mod in m.modules():
            if hasattr(mod, "reset_parameters"):
                mod.reset_parameters()





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


@torch.inference_mode(False)  # (training needs autograd, whatever the caller's mode)
def fit(model: nn.Module, train, test, *, method: str = "deo-star", chains: int = 4,
        epochs: float = 10.0, seed: int = 0, out: str | Path | None = None,
        progress: bool = False, augment=None, classes: int | None = None, resume: bool = False,
        callback=None, say=None, max_seconds: float | None = None,
        **options) -> DeepResult:
    """Tempered replicas of ``model`` on ``train = (X, y)``, evaluated on ``test = (X, y)``.

    ``method``: one of :data:`METHODS`; other settings are :class:`DeepConfig` fields.
    ``augment(x, generator)``: applied to training batches.  ``out``: the run folder (locked for
    the call, :class:`nrpt.run.folder.RunFolderBusy` otherwise); ``resume=True`` continues it
    (same model and data).  ``callback(engine)``: every 256 iterations; raising
    ``KeyboardInterrupt`` stops cleanly with a checkpoint.  ``say(line)``: one line per
    evaluation epoch.

    Under ``torchrun`` (or ``nrpt deep --nproc N``: ``WORLD_SIZE`` > 1) the replicas are
    spread over the processes (:mod:`nrpt.core.sharding`; gloo on CPU, NCCL and one GPU per
    process with ``device="cuda"``): every process calls ``fit`` with the same model, data
    and settings; rank 0 owns the run folder and returns the result, the other ranks return a
    :class:`DeepResult` whose ``summary`` holds only ``rank`` and ``interrupted``.  For a fixed
    seed the results do not depend on the number of processes (bit for bit on CPU with the
    ``loop`` strategy, which ``auto`` resolves to there).

    ``max_seconds``: this call's wall-clock budget, pretraining included
    (not a setting of the run: each resumption may give its own); when it is spent the run
    stops at the next iteration as an interrupted one does (a checkpoint, and after
    pretraining the outputs of the models collected so far; ``summary["stopped_by"] ==
    "max_seconds"``), and ``resume=True`` continues it."""
    if max_seconds is not None and not (isinstance(max_seconds, int | float)
                                        and not isinstance(max_seconds, bool)
                                        and max_seconds > 0 and math.isfinite(max_seconds)):
        raise ValueError(f"max_seconds must be a number of seconds > 0 (or None: no budget); "
                         f"got {max_seconds!r}")
    cfg = DeepConfig(method=method, chains=chains, epochs=epochs, seed=seed, **options)
    comm = _join(cfg)
    lead = comm is None or comm.rank == 0
    with folder_lock(out if lead else None), warnings.catch_warnings(), \
            Deadline(max_seconds) as stop:
        if not lead:  # (rank 0 warns for the run)
            warnings.simplefilter("ignore")
        return _fit(cfg, model, train, test, out=out, progress=progress, augment=augment,
                    classes=classes, resume=resume, callback=callback, say=say, comm=comm,
                    stop=stop)


def _join(cfg: DeepConfig):
    """The :class:`nrpt.core.sharding.Comm` of a multi-process launch (``None``: one
    process), once the run can be spread: at most one process per chain, a method of
    several chains."""
    from nrpt.core import sharding

    device = str(cfg.device or "cpu")
    if device.startswith("cuda") and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # one GPU per process (NCCL's collectives and broadcast_object_list use the current one)
        torch.cuda.set_device(torch.device(sharding.local_device(device)))
    comm = sharding.from_env(device)
    if comm is None:
        return None
    if BUILDERS[cfg.method].single:
        raise ValueError(f"method {cfg.method!r} runs one chain, in one process; got "
                         f"{comm.world} processes (run it without --nproc / torchrun, or use "
                         f"{', '.join(m for m, b in BUILDERS.items() if not b.single)})")
    sharding.check_world(comm.world, int(cfg.chains))
    comm.check_same(json.dumps(cfg.to_dict(), sort_keys=True, default=str), "setting")
    return comm


def _agree(comm, lead_part):
    """``lead_part()`` run by rank 0 and its value given to every rank (``comm`` None: just
    run it); an error on rank 0 stops every rank (no rank waits in a collective for it)."""
    if comm is None:
        return lead_part()
    if comm.rank == 0:
        try:
            value = lead_part()
        except BaseException as err:
            comm.share({"error": f"{type(err).__name__}: {err}"})
            raise
        return comm.share({"error": None, "value": value})["value"]
    told = comm.share(None)
    if told["error"] is not None:
        raise ValueError(f"rank 0 stopped the run: {told['error']}")
    return told["value"]


class Deadline(Interrupt):
    """:class:`nrpt.core.loop.Interrupt` (SIGINT / SIGTERM stop the loop between iterations)
    whose flag also rises once ``seconds`` have passed since it was made (``None``: never);
    ``expired`` says whether the time did it."""

    #: the clock (seconds; tests replace it)
    clock = time.perf_counter

    def __init__(self, seconds: float | None):
        self.deadline = None if seconds is None else type(self).clock() + float(seconds)
        self.expired = False
        super().__init__()

    @property
    def flag(self) -> bool:
        if self._flag:
            return True
        if self.deadline is not None and type(self).clock() >= self.deadline:
            self.expired = True
        return self.expired

    @flag.setter
    def flag(self, value: bool) -> None:
        self._flag = bool(value)

    def stopped_by(self) -> str | None:
        """``"max_seconds"``, ``"signal"`` or ``None`` (not stopped)."""
        return "signal" if self._flag else "max_seconds" if self.expired else None




# ---------------------------------------------------------------------------------- one run
@dataclass
class _Job:
    """What the phases of one :func:`fit` call share."""

    cfg: DeepConfig
    model: nn.Module
    net: FunctionalNet
    data: tuple  # (Xtr, ytr, Xte, yte) on the run's device
    #: ``() -> {"train", "test", "model"}`` digests (:func:`_digest`), taken on first use:
    #: only a run folder or several processes read them (sha256 of the data costs ~2 s per GB)
    fingerprint_of: Any
    target: NetworkTarget
    estimator: NetworkEnergy
    per_epoch: int
    main_iters: int
    pre_iters: int
    out: Path | None = None
    header: dict[str, Any] = field(default_factory=dict)
    resume: bool = False
    progress: bool = False
    callback: Any = None
    say: Any = None
    stop: Any = None
    strategy: str = "loop"
    timings: dict[str, Any] = field(default_factory=dict)
    #: a regression run's targets (:class:`nrpt.deep.regression.Targets`); None: classes
    targets: Any = None
    #: outputs per example (classes, or a regression's means and log-sds)
    classes: int = 0
    comm: Any = None  # nrpt.core.sharding.Comm of a multi-process run

    @property
    def lead(self) -> bool:
        """Whether this process owns the run folder (rank 0, or the only process)."""
        return self.comm is None or self.comm.rank == 0

    def __post_init__(self):
        self.N, self.dev, self.dtype = int(self.data[1].shape[0]), self.net.device, self.net.dtype

    @functools.cached_property
    def fingerprint(self) -> dict[str, Any]:
        """sha256 of the training and test data as given and of the model (run.json's
        ``data``; several processes check that they were given the same)."""
        return self.fingerprint_of()

    def execute(self, run: Run, out: Path | None, resume: dict | None):
        return execute(run, out=out if self.lead else None,
                       checkpoint_every=self.cfg.checkpoint_every,
                       progress=self.progress and self.lead, resume=resume,
                       header=self.header, callback=self.callback, stop=self.stop)


def _fit(cfg, model, train, test, *, out, progress, augment, classes, resume, callback,
         say, comm=None, stop=None) -> DeepResult:
    job = _prepare(cfg, model, train, test, classes, augment, comm)
    job.resume, job.progress, job.callback, job.say = resume, progress, callback, say
    job.stop = stop
    if comm is not None:
        comm.check_same(json.dumps(job.fingerprint, sort_keys=True), "model and data")
        if not job.lead:
            job.say = None
    out = Path(out) if out is not None else None

    def open_folder():
        _open_folder(job, out)
        return job.header

    job.header = _agree(comm, open_folder)
    job.out = out if job.lead else None  # (rank 0 owns the folder: the others write nothing)
    t_start = time.perf_counter()
    # the wall time of the sessions before this one (an interrupted run's summary.json holds
    # it), so that a resumption adds to the run's time instead of replacing it
    earlier = _earlier_wall_time(job.out) if resume and job.lead else 0.0
    theta0, buf0 = _initial_replicas(job.net, job.model, cfg.chains, cfg.seed)
    _choose_strategy(job, theta0, buf0)
    started = _pretrain(job, theta0, buf0)
    if isinstance(started, DeepResult):
        return started
    return _main(job, *started, t_start - earlier)


def _prepare(cfg, model, train, test, classes, augment, comm=None) -> _Job:
    """The model on the run's device, the data checked (and fingerprinted), the target."""
    from nrpt.core.sharding import local_device

    net = FunctionalNet(model)
    # (several processes: cuda is each process's own GPU, cuda:LOCAL_RANK)
    device = None if cfg.device is None else (
        local_device(str(cfg.device)) if comm is not None else cfg.device)
    if device is not None and torch.device(device) != net.device:
        model = copy.deepcopy(model).to(device)  # the caller's model stays where it is
        net = FunctionalNet(model)
    if cfg.likelihood == "gaussian":
        if classes is not None:
            raise ValueError(f"classes applies to likelihood='categorical' only; got "
                             f"classes={classes!r} with likelihood='gaussian'")
        return _prepare_regression(cfg, model, train, test, augment, comm)
    dev, dtype = net.device, net.dtype
    Xtr, ytr = _check_data("train", train)
    n_classes = _classes_of(net, Xtr[:2].to(dev, dtype))
    if classes is not None and classes > n_classes:
        raise ValueError(f"classes ({classes}) is larger than the model's {n_classes} outputs")
    Xtr, ytr = _check_data("train", (Xtr, ytr), n_classes, finite=False)
    Xte, yte = _check_data("test", test, n_classes)
    return _assemble(cfg, model, net, (Xtr, ytr, Xte, yte), augment, comm, classes=n_classes)


def _prepare_regression(cfg, model, train, test, augment, comm=None) -> _Job:
    """:func:`_prepare` of ``likelihood="gaussian"`` (:mod:`nrpt.deep.regression`): targets
    standardised on the training split, a learned ``log_sd`` appended to the model's output
    unless ``noise`` fixes it."""
    from nrpt.deep.regression import GaussianLoss, NoiseHead, Targets, check_regression_data

    Xtr, ytr = check_regression_data("train", train)
    Xte, yte = check_regression_data("test", test)
    targets = Targets(ytr, cfg.noise)
    if yte.reshape(yte.shape[0], -1).shape[1] != targets.k or yte.dim() != ytr.dim():
        raise ValueError(f"test: y has shape {list(yte.shape)}, train y {list(ytr.shape)} "
                         f"(the same number of target columns)")
    plain = FunctionalNet(model)
    width = _classes_of(plain, Xtr[:2].to(plain.device, plain.dtype))
    if width != targets.k:
        raise ValueError(f"the model returns {width} outputs per example but y has "
                         f"{targets.k} target column(s): give the model {targets.k} output(s) "
                         f"(the predicted means)")
    if targets.learned:
        model = NoiseHead(model, targets.k)
    net = FunctionalNet(model, loss=GaussianLoss(targets))
    outputs = width + (targets.k if targets.learned else 0)  # means, then the log-sds
    return _assemble(cfg, model, net, (Xtr, ytr, Xte, yte), augment, comm, classes=outputs,
                     targets=targets)


def _assemble(cfg, model, net: FunctionalNet, data, augment, comm, *, classes: int,
              targets=None) -> _Job:
    """The part of :func:`_prepare` both likelihoods share, given checked ``data = (Xtr, ytr,
    Xte, yte)`` on any device: the net's precision and memory format, the batch size against
    the data, the fingerprint (of the data as given), the data on the run's device (a
    regression's targets standardised), the target and its minibatch energy."""
    Xtr, ytr, Xte, yte = data
    if Xte.shape[1:] != Xtr.shape[1:]:
        raise ValueError(f"test: X rows have shape {list(Xte.shape[1:])}, train rows "
                         f"{list(Xtr.shape[1:])}")
    net.set_execution(cfg.precision, cfg.memory_format, Xtr[:2])
    N, B = int(ytr.shape[0]), cfg.batch_size
    if B > N:
        raise ValueError(f"batch_size ({B}) is larger than the training data (N = {N})")
    given = (Xtr, ytr, Xte, yte)

    def fingerprint() -> dict[str, Any]:  # (the net's copy of the model holds its values)
        return {"train": _digest(*given[:2]), "test": _digest(*given[2:]),
                "model": _digest(*net.pack())}

    dev, dtype = net.device, net.dtype
    Xtr, Xte = Xtr.to(dev, dtype), Xte.to(dev, dtype)
    if targets is not None:
        ytr, yte = targets.standardise(ytr, dtype), targets.standardise(yte, dtype)
    ytr, yte = ytr.to(dev), yte.to(dev)
    per_epoch = math.ceil(N / B)
    target = NetworkTarget(net, Xtr, ytr, weight_decay=cfg.weight_decay, augment=augment,
                           strategy="loop")
    return _Job(cfg, model, net, (Xtr, ytr, Xte, yte), fingerprint, target,
                NetworkEnergy(target, B), per_epoch,
                main_iters=max(1, round(cfg.epochs * per_epoch)),
                pre_iters=round(cfg.pretrain_epochs * per_epoch), targets=targets,
                classes=classes, comm=comm)


def _digest(*tensors: torch.Tensor) -> dict[str, Any]:
    """sha256 of the tensors' dtypes, shapes and bytes (what run.json keeps of the data and
    the model, to refuse a resumption given others)."""
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().cpu().contiguous()
        h.update(f"{t.dtype}{list(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return {"shape": list(tensors[0].shape), "sha256": h.hexdigest()}


# ---------------------------------------------------------------------------------- run folder
def _open_folder(job: _Job, out: Path | None) -> None:
    """Start (``run.json``) or reopen (checked against ``run.json``) the run folder; sets the
    checkpoint header: the settings, the run id, the seed and the settings' hash."""
    cfg = job.cfg
    job.out = out
    job.header = {"deep_config": json.dumps(cfg.to_dict())}
    if out is None:
        if job.resume:
            raise ValueError("resume=True needs out (the run folder)")
        return
    out.mkdir(parents=True, exist_ok=True)
    started = any((out / f).exists() for f in (rf.RUN_JSON, rf.CHECKPOINT, STRATEGY_FILE,
                                                PRETRAINED))
    if not job.resume and started:
        raise FileExistsError(f"{out} already holds a deep run: resume it (resume=True / "
                              f"`nrpt resume {out}`) or choose another folder")
    if job.resume and not started:
        raise FileNotFoundError(f"{out} holds no deep run to resume")
    if job.resume:
        record = _check_record(out, cfg, job.fingerprint)
    else:
        record = _new_record(cfg, job.fingerprint)
        rf.write_run_record(out, record)
    job.header.update(run_id=record["run_id"], seed=cfg.seed,
                      config_hash=record["config_hash"])


def _settings_hash(settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def _new_record(cfg: DeepConfig, fingerprint: dict[str, Any]) -> dict[str, Any]:
    """``run.json`` of a deep run: who it is (run id, seed, settings and their hash, the nrpt
    version) and what it ran on (sha256 of the training and test data and of the model)."""
    from nrpt import __version__

    settings = json.loads(json.dumps(cfg.to_dict()))
    return {"format": 1, "kind": KIND, "run_id": uuid.uuid4().hex, "seed": cfg.seed,
            "config_hash": _settings_hash(settings), "settings": settings,
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "nrpt_version": __version__, "data": fingerprint}


def _check_record(out: Path, cfg: DeepConfig, fingerprint: dict[str, Any]) -> dict[str, Any]:
    """``run.json`` of ``out``, refused unless it is a deep run with these settings, data and
    model."""
    record = rf.read_run_record(out)
    if record is None or record.get("kind") != KIND:
        raise ValueError(f"cannot resume {out} as a deep run: {out / rf.RUN_JSON} "
                         f"{'is missing' if record is None else 'records another kind of run'}"
                         f"; restore it or start a new run")
    _same_settings(out, record.get("settings") or {}, json.loads(json.dumps(cfg.to_dict())))
    then = record.get("data") or {}
    for part, what in (("train", "training data"), ("test", "test data"), ("model", "model")):
        if then.get(part) != fingerprint[part]:
            raise ValueError(f"cannot resume {out}: the {what} given is not the run's own "
                             f"(sha256 {str((then.get(part) or {}).get('sha256'))[:16]}... in "
                             f"{rf.RUN_JSON}, {fingerprint[part]['sha256'][:16]}... now): give "
                             f"the model and data the run started with, or start a new run")
    return record


#: settings added after deep runs were first recorded, with the value a run that predates
#: them ran with (so that such a run still resumes)
_ADDED_SETTINGS = {"likelihood": "categorical"}


def _same_settings(out: Path, then: dict, now: dict) -> None:
    def get(d, k):
        return d.get(k, _ADDED_SETTINGS.get(k))

    changed = sorted(k for k in set(then) | set(now) if get(then, k) != get(now, k))
    if changed:
        diff = ", ".join(f"{k}: {then.get(k)!r} -> {now.get(k)!r}" for k in changed)
        raise ValueError(f"cannot resume {out}: settings differ from the run's own ({diff})")


def _resumable(folder: Path, header: dict) -> dict:
    """The checkpoint of ``folder`` (its sidecar's sha256 verified), refused if it belongs to
    another run or its settings differ from ``header``'s."""
    checkpoint, path = rf.read_checkpoint(folder)
    head = checkpoint.get("header", {})
    _same_settings(folder, json.loads(head.get("deep_config", "{}")),
                   json.loads(header["deep_config"]))
    if head.get("run_id") != header.get("run_id"):
        raise ValueError(f"{path} belongs to another run (run id {head.get('run_id')}) than "
                         f"{rf.RUN_JSON} (run id {header.get('run_id')}): it was copied from "
                         f"another run folder; restore this run's own checkpoint")
    return checkpoint


def _earlier_wall_time(folder: Path) -> float:
    """``wall_time_s`` of ``folder``'s ``summary.json`` (0 when there is none: a run killed
    before writing it; its loop time still counts through the checkpoint, see _summary)."""
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        return float(json.loads((folder / "summary.json").read_text())["wall_time_s"])
    return 0.0


# ---------------------------------------------------------------------------------- phases
def _choose_strategy(job: _Job, theta0, buf0) -> None:
    """The execution strategy, measured on one step of the real batch (a resumption reuses the
    run's own: strategies agree only to rounding)."""
    job.strategy, job.timings = _agree(job.comm, lambda: _strategy(job, theta0, buf0))
    job.target.strategy = job.strategy


def _strategy(job: _Job, theta0, buf0) -> tuple[str, dict]:
    """(rank 0's part of :func:`_choose_strategy`)"""
    cfg, out = job.cfg, job.out
    if job.resume and (out / STRATEGY_FILE).exists():
        job.strategy = json.loads((out / STRATEGY_FILE).read_text())["strategy"]
    elif job.comm is not None and cfg.strategy == "auto":
        # several processes: each replica evaluated alone, whatever the block a process
        # holds (vmap's batched rows can depend on the block's size: then the results would
        # depend on the number of processes)
        job.strategy, job.timings = "loop", {}
        if out is not None:
            rf.atomic_write(out / STRATEGY_FILE, json.dumps({
                "strategy": "loop", "timings_s": {},
                "why": f"auto with {job.comm.world} processes: per-replica evaluation, "
                       f"independent of the number of processes"}))
    else:
        P, B, (Xtr, ytr, _, _) = cfg.chains, cfg.batch_size, job.data
        probe_idx = torch.arange(P * B, device=job.dev).reshape(P, B) % job.N
        # steps of P replicas (single-chain methods take P x as many steps of one replica,
        # which cost no less: a lower bound of their time)
        job.strategy, job.timings = choose_strategy(
            job.net, theta0.to(job.dev), buf0.to(job.dev), Xtr[probe_idx], ytr[probe_idx],
            cfg.strategy, iterations=job.pre_iters + job.main_iters, remember=True)
        if out is not None:
            rf.atomic_write(out / STRATEGY_FILE, json.dumps({"strategy": job.strategy,
                                                             "timings_s": job.timings}))
    return job.strategy, job.timings


def _pretrain(job: _Job, theta0, buf0):
    """Every replica, one cosine cycle from lr_max, no swaps (checkpointed in out/pretrain,
    so an interruption here loses nothing either): the replicas it ends at, or the
    :class:`DeepResult` of an interrupted pretraining."""
    cfg, out, dev = job.cfg, job.out, job.dev
    pre_path = out / PRETRAINED if out is not None else None
    pre_dir = out / "pretrain" if out is not None else None

    def saved():  # (rank 0 reads the folder; several processes: it hands the others what it read)
        if job.resume and pre_path.exists():
            return "pretrained", rf.load_verified(pre_path)
        if job.pre_iters > 0 and pre_dir is not None:
            pre_dir.mkdir(exist_ok=True)
            if job.resume and rf.checkpoint_exists(pre_dir):
                return "checkpoint", _resumable(pre_dir, job.header)
        return None, None

    what, content = _agree(job.comm, saved)
    if what == "pretrained":
        return content["theta"].to(dev), content["buffers"].to(dev)
    if job.pre_iters > 0:
        P = cfg.chains
        explorer = Cyclical(MomentumSGD(job.estimator, momentum=cfg.momentum), 1, job.pre_iters)
        eng = make_engine(job.target, explorer, [0.0] * P, cfg.lr_max / job.N, NoSwap(),
                          Deterministic(0.0), rng.key(cfg.seed, 0x9E7), theta0, buf0,
                          job.dtype, dev, comm=job.comm)
        pre = job.execute(Run(eng, [], {}, Plan.fixed(job.pre_iters)), pre_dir, content)
        if pre.interrupted:
            return DeepResult(summary={"method": cfg.method, "interrupted": True,
                                       "phase": "pretraining", "iterations": int(eng.k),
                                       "stopped_by": _stopped_by(job),
                                       **({} if job.lead else {"rank": job.comm.rank})},
                              config=cfg, out=out)
        full = eng._full_state()  # (sharded: gathered from every process, a collective)
        theta0, buf0 = full.x[0].detach().clone(), full.extras["bn"][0].clone()
    if pre_path is not None:
        rf.save_verified({"theta": theta0.cpu(), "buffers": buf0.cpu()}, pre_path)
    return theta0, buf0


def _main(job: _Job, theta0, buf0, t0: float) -> DeepResult:
    """The method's main run (:data:`nrpt.deep.methods.BUILDERS`), its average, the summary
    and the run folder's outputs; ``t0``: when the run's time started counting."""
    cfg, out = job.cfg, job.out
    method = BUILDERS[cfg.method]
    iters = job.main_iters * (cfg.chains if method.single else 1)
    x0, bn0 = (theta0[:1], buf0[:1]) if method.single else (theta0, buf0)
    setup = method.build(Context(cfg, job.target, job.estimator, job.N, job.per_epoch, iters,
                                 x0, bn0, job.dtype, job.dev, job.comm))
    facts: dict[str, Any] = {"strategy": job.strategy, "strategy_timings_s": job.timings,
                             **setup.facts}
    recorders = _recorders(job, method, setup, iters)
    eng = setup.engine
    checkpoint = _agree(job.comm, lambda: _resumable(out, job.header) if (
        job.resume and rf.checkpoint_exists(out)) else None)
    outcome = job.execute(Run(eng, setup.adaptors, recorders, Plan.fixed(iters), facts), out,
                          checkpoint)
    if not job.lead:  # rank 0 owns the folder and the result
        return DeepResult(summary={"rank": job.comm.rank,
                                   "interrupted": bool(outcome.interrupted)}, config=cfg)
    Xte, yte = job.data[2], job.data[3]
    if method.swag:
        average, store = _swag_average(recorders["swag"].swag, job.net, bn0[0], job.target,
                                       Xte, cfg, job.strategy, job.dev, _store(out),
                                       _new_average(job))
    else:
        average, store = recorders["bma"].bma, recorders["bma"].store
    summary = _summary(job, method, average, recorders, eng, facts, outcome,
                       time.perf_counter() - t0)
    job.net.drop_kept()  # (the result keeps the net for evaluations, not its training buffer)
    res = DeepResult(summary=summary, config=cfg, metrics=recorders["epochs"].rows,
                     index=recorders["index"].array() if "index" in recorders else None,
                     trace=recorders["trace"].arrays() if "trace" in recorders else {},
                     net=job.net, out=out, store=store,
                     targets=job.targets.state() if job.targets is not None else None)
    if out is not None:
        from nrpt.deep.report import write_folder

        write_folder(res, out, Xte, yte)
    return res


def _recorders(job: _Job, method: Method, setup: Setup, iters: int) -> dict[str, Any]:
    """The main run's recorders: the collected models (or SWAG's moments), the per-epoch rows,
    and for more than one slot the swaps, round trips, trace and index process."""
    cfg, eng = job.cfg, setup.engine
    every = setup.every or cfg.collect_every or job.per_epoch
    start = int(cfg.burn_in * iters)
    Xte, yte = job.data[2], job.data[3]
    bma_class, epochs_class, more = BMARecorder, EpochMetrics, {}
    if job.targets is not None:
        from nrpt.deep.regression import RegressionBMARecorder, RegressionEpochMetrics

        bma_class, epochs_class = RegressionBMARecorder, RegressionEpochMetrics
        more = {"targets": job.targets}
    bma = bma_class(job.net, Xte, yte, every=every, start=start, slots=setup.slots,
                    strategy=job.strategy, stage=setup.stage,
                    store=None if method.swag else _store(job.out if job.lead else None,
                                                          job.lead),
                    placement=Placement(eng), classes=job.classes, **more)
    recorders: dict[str, Any] = {"bma": bma}
    if method.swag:
        recorders = {"swag": SWAGRecorder(job.net.dim, cfg.swag_rank, every=every,
                                          start=start)}
    recorders["epochs"] = epochs_class(bma, job.net, Xte, yte,
                                       every=max(1, round(cfg.eval_every * job.per_epoch)),
                                       lr_unit=job.N, strategy=job.strategy,
                                       per_epoch=job.per_epoch, say=job.say, **more)
    if not method.single:
        n_slots = cfg.chains
        recorders["swaps"] = SwapStats(1, n_slots, dtype=eng.dtype, device=eng.device)
        recorders["round_trips"] = RoundTrips(eng.slot_of, n_slots)
        recorders["trace"] = Trace(every=max(1, iters // 500))
        recorders["index"] = IndexRecorder(n_slots, iters, job.out if job.lead else None)
    for r in recorders.values():
        eng.watch(getattr(r, "reads_slots", ()))
    return recorders


def _store(out: Path | None, lead: bool = True) -> ModelStore:
    """The run's model store: ``out/models`` (streamed to disk), in memory without a folder;
    on a process that does not own the run folder, a tally that keeps no model."""
    if not lead:
        return ModelTally()
    return ModelStore(None if out is None else out / MODELS_DIR)


def _new_average(job: _Job):
    """An empty model average: :class:`nrpt.deep.metrics.BMA`, or a regression run's
    :class:`nrpt.deep.regression.GaussianMixture`."""
    if job.targets is not None:
        from nrpt.deep.regression import GaussianMixture

        return GaussianMixture(job.targets, job.data[3])
    from nrpt.deep.metrics import BMA

    return BMA()


def _swag_average(swag, net, buf0, target, Xte, cfg, strategy, dev, store: ModelStore,
                  average):
    """``swag_samples`` SWAG draws, each with its BatchNorm statistics refreshed on the
    training data, added to ``average`` (empty): ``(average, store)`` (the store emptied
    first: each session draws them anew)."""
    store.clear()
    if swag.n_collected < 2:
        return average, store
    g = rng.generator_for(cfg.seed, 0x5A6, device="cpu")
    for _ in range(cfg.swag_samples):
        theta = swag.sample(g).to(dev, net.dtype)
        buf = net.refreshed_buffers(theta, buf0.to(net.dtype), (
            x for x in target.x.split(cfg.batch_size) if x.shape[0] > 1))
        average.add(net.logits(theta[None], buf[None], Xte, strategy)[0])
        store.append(theta[None], buf[None], 0)
    return average, store


def _stopped_by(job: _Job) -> str | None:
    """Why an interrupted loop stopped: ``"max_seconds"`` (the call's budget), ``"signal"``,
    or ``None`` (a callback raised ``KeyboardInterrupt``)."""
    return job.stop.stopped_by() if isinstance(job.stop, Deadline) else None


def _summary(job: _Job, method: Method, average, recorders, eng, facts, outcome,
             wall) -> dict[str, Any]:
    from nrpt.deep.metrics import evaluate

    cfg, y_test, N, B, per_epoch = job.cfg, job.data[3], job.N, job.cfg.batch_size, job.per_epoch

    s: dict[str, Any] = {"method": cfg.method, "chains": cfg.chains, "epochs": cfg.epochs,
                         "n_train": N, "batch_size": B, "iterations": int(eng.k),
                         "iterations_per_epoch": per_epoch}
    if job.targets is not None:
        from nrpt.deep.regression import describe

        s.update(describe(job.targets))
        s.update(average.evaluate() if average.count else
                 {k: None for k in ("test_ll", "nll_mean", "nll_sum", "rmse",
                                    "test_ll_standardised")})
    elif average.count:
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
    s["pretrain_gradient_evaluations"] = int(job.pre_iters) * cfg.chains
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
    s["correction"] = float(eng.params["C"][0, 0]) if method.tempered else None
    s.update(json_ready(facts))
    s["interrupted"] = bool(outcome.interrupted)
    if outcome.interrupted:  # (a complete run's summary keeps its keys)
        s["stopped_by"] = _stopped_by(job)
    # every session's time (a run killed before its summary: at least its loops' time)
    s["wall_time_s"] = max(wall, outcome.wall_time_s)
    s["loop_time_s"] = outcome.wall_time_s
    return json_ready(s)

