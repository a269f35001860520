"""The deep methods as a table of builders, registered with ``@method(NAME, options=(...))``:
a builder takes a run's :class:`Context` and returns the :class:`Setup` of its main run
(engine, adaptors, collected slots, summary additions); the ``options`` join
:class:`nrpt.deep.DeepConfig` and ``nrpt deep``'s flags."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from nrpt import rng
from nrpt.adapt.sa import (
    CorrectionAdaptor,
    LearningRateAdaptor,
    SAStepSize,
    window_from_swap_rate,
)
from nrpt.core.engine import PTEngine
from nrpt.explorers.sgmcmc import SGHMC, Cyclical, MomentumSGD
from nrpt.options import Option, choice, integer, number, parse_float, parse_int
from nrpt.paths.ladders import NoiseLadder, geometric_ladder
from nrpt.report.health import SamplingWarning
from nrpt.swap import DEOW, Deterministic, NoSwap

__all__ = ["Context", "Setup", "Method", "BUILDERS", "METHODS", "method", "make_engine"]


@dataclass
class Context:
    """What a builder is given: ``cfg`` (a :class:`nrpt.deep.config.DeepConfig`), the network
    target and its minibatch ``estimator``, ``N`` training examples, ``per_epoch`` iterations,
    ``iters`` iterations of the main run, the starting replicas ``x0`` and BatchNorm buffers
    ``bn0`` (one row for a single-chain method), ``dtype`` and ``device``; ``comm`` (a
    :class:`nrpt.core.sharding.Comm`, ``None`` for one process): the processes the replicas
    are spread over."""

    cfg: Any
    target: Any
    estimator: Any
    N: int
    per_epoch: int
    iters: int
    x0: Any
    bn0: Any
    dtype: Any
    device: Any
    comm: Any = None

    def engine(self, explorer, temps, step, scheme, rule) -> PTEngine:
        P = len(temps)
        return make_engine(self.target, explorer, temps, step, scheme, rule, self.cfg.seed,
                           self.x0, self.bn0.reshape(P, -1), self.dtype, self.device,
                           comm=self.comm)


@dataclass
class Setup:
    """A method's main run: ``engine``, ``adaptors``, the ``slots`` whose models are
    collected, ``stage(k)`` (collect only where true), ``every`` (collection interval, None:
    the run's default) and ``facts`` (added to the summary)."""

    engine: PTEngine
    slots: list[int]
    adaptors: list = field(default_factory=list)
    stage: Callable[[int], bool] | None = None
    every: int | None = None
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Method:
    """A registered method: its builder; ``single`` (one chain run ``chains`` times as long);
    ``tempered`` (the PT methods: a correction ``C`` in the summary); ``swag`` (the average is
    SWAG's fitted Gaussian instead of the collected models); ``options``: the settings only
    it reads."""

    build: Callable[[Context], Setup]
    single: bool = False
    tempered: bool = False
    swag: bool = False
    options: tuple[Option, ...] = ()


#: method name -> :class:`Method`, in registration order
BUILDERS: dict[str, Method] = {}


def method(name: str, **flags) -> Callable:
    """Register the decorated builder as the method ``name`` (``flags``: :class:`Method`)."""
    def register(build: Callable[[Context], Setup]) -> Callable[[Context], Setup]:
        BUILDERS[name] = Method(build, **flags)
        return build
    return register


#: the key tag of the one-batch pass at an engine's start (forward and backward): the ladder's
#: first energies (:class:`MinibatchLadder`), the explorer's first move (its gradient,
#: :func:`make_engine`) and the tempered methods' energy noise sd (:func:`_tempered`) all read
#: it, so an engine makes it once
START = 0x5CA1E


class MinibatchLadder(NoiseLadder):
    """:class:`NoiseLadder` whose energies of states not yet explored (the engine's start) are
    the minibatch estimate ``Ũ_B`` of one keyed batch (a forward pass; with ``gradient`` its
    backward pass too), not the full-data energy: every later energy is such an estimate, the
    first explorer step replaces these before anything reads them (only their finiteness is
    checked), and the full-data pass
    cost an epoch of forward and backward passes per engine (two per run: pretraining and the
    main run).  The pass is :data:`START`'s, kept (:meth:`start_estimate`) for the other
    readers of the start: the noise sd of :func:`_tempered`, and with ``gradient`` (the pass
    then makes the gradient too) the explorer's first step (:func:`make_engine`), which moves
    with it instead of making a forward and backward pass of its own on another batch."""

    def __init__(self, temperatures, estimator, seed: int, min_slots: int = 1,
                 gradient: bool = False):
        super().__init__(temperatures, min_slots=min_slots)
        self.estimator, self.seed = estimator, int(seed)
        self.gradient = bool(gradient)
        self.block = None  # several processes: this process's block (keys by global replica)
        # (a weak reference to x, key, block, estimate) of the last start_estimate: the memo
        # does not keep the start state alive once the engine has moved on from it
        self._start = None

    def start_estimate(self, x, key):
        """The estimator's pass (the starting BatchNorm statistics; the gradient too with
        ``gradient``) at ``x`` with ``key``: the one made for the same tensor ``x`` and key, if
        the last call made it (then forgotten), else a new one.  With ``gradient`` it is made
        with autograd on whatever the caller's grad mode (the engine evaluates its start under
        ``no_grad``): a compiled strategy then traces it as it traces every training step, and
        compiles once, not twice."""
        hit, self._start = self._start, None
        where = _block(key)
        if hit is not None and hit[0]() is x and tuple(hit[1]) == tuple(key) and \
                hit[2] == where:
            return hit[3]
        est = self.estimator
        with torch.enable_grad() if self.gradient else contextlib.nullcontext():
            out = est(x, key, est.init_extras(x, key), need_grad=self.gradient)
        self._start = (weakref.ref(x), key, where, out)
        return out

    def hand_over(self, x):
        """The last start pass's estimate, with its gradient, if it was made at ``x`` (this
        tensor) with one: for the explorer's first move (:func:`make_engine`), which then holds
        the gradient; the memo keeps the estimate without it for :meth:`start_estimate`'s next
        reader (energies and variances: a ``[P, dim]`` tensor less held for the engine's life
        where no such reader comes).  Else ``None``."""
        hit = self._start
        if hit is None or hit[0]() is not x or hit[3].grad is None:
            return None
        self._start = (*hit[:3], dataclasses.replace(hit[3], grad=None))
        return hit[3]

    def components(self, target, x):
        v = self.start_estimate(x, rng.Key((self.seed, START), self.block)).u.to(x.dtype)
        return v, torch.zeros_like(v)


def _block(key) -> tuple[int, int, int] | None:
    b = getattr(key, "block", None)
    return None if b is None else (b.lo, b.hi, b.P)


def make_engine(target, explorer, temps, step, scheme, rule, seed, x0, bn0, dtype,
                device, comm=None) -> PTEngine:
    """One system of ``len(temps)`` network replicas starting at ``x0`` (buffers ``bn0``);
    with ``comm`` (more than one process) a :class:`nrpt.core.sharding.ShardedEngine` whose
    process holds its block of the replicas (their BatchNorm and momentum extras too)."""
    P = len(temps)
    bn0 = bn0.reshape(P, -1)
    estimator = getattr(explorer, "inner", explorer).estimator
    # the start pass makes the gradient too, and the explorer's first step moves with it
    # (SGExplorer.start_with): one forward and backward pass of the replicas fewer per engine
    ladder = MinibatchLadder(temps, estimator, seed, gradient=True)
    if comm is None:
        target.initial_buffers = bn0
        eng = PTEngine(target, ladder, explorer, scheme, rule,
                       step_size=step, systems=1, seed=seed, dtype=dtype, device=device,
                       initial_states=x0.reshape(1, P, -1))
    else:
        from nrpt.core.sharding import ShardedEngine

        target.initial_buffers = comm.block(P).take(bn0[None])[0]  # this block's replicas
        ladder.block = comm.block(P)
        eng = ShardedEngine(target, ladder, explorer, scheme, rule,
                            step_size=step, systems=1, seed=seed, dtype=dtype, device=device,
                            initial_states=x0.reshape(1, P, -1), comm=comm)
    start = ladder.hand_over(eng.state.x)  # (the engine's start: the ladder's pass at x)
    if start is not None:
        eng.state = explorer.start_with(eng.state, start)
    return eng


# ------------------------------------------------------------------------------ their options
def real(low: float | None = None, **bounds: Any) -> Callable[..., Any]:
    """:func:`nrpt.options.number`'s check, the value kept as given (an integer number of
    ``epochs`` stays one, in the summary too)."""
    check = number(low, **bounds)

    def keep(name: str, value: Any, cfg: Any = None) -> Any:
        check(name, value)
        return value
    return keep


def _window(name: str, value: Any, cfg: Any = None) -> int | str:
    if value == "optimal" or (isinstance(value, int) and not isinstance(value, bool)
                              and value >= 1):
        return value
    raise ValueError(f"{name} must be 'optimal' or an integer >= 1; got {value!r}")


def _parse_window(text: str) -> int | str:
    return text if text == "optimal" else int(text)


_parse_window.what = "an integer >= 1 or optimal"  # type: ignore[attr-defined]

#: the settings of the tempered methods (deo-star, deo)
TEMPERED = (
    Option("swap_rate", real(0, strict=True, high=1), 0.005, parse=parse_float,
           help="target swap rate S of adjacent pairs, in (0, 1): C and the learning rates "
                "are adapted to it"),
    Option("correction", real(), 0.0, parse=parse_float,
           help="initial correction buffer C of the deterministic swap condition"),
    Option("sa_scale", real(0, strict=True), 25.0, parse=parse_float,
           help="stochastic-approximation gain of C per unit of the energy noise sd"),
    Option("sa_pairs", choice(("attempted", "all")), "attempted", choices=("attempted", "all"),
           help="verdicts that adapt C and the learning rates: 'attempted' pairs, or 'all' "
                "pairs every iteration (Algorithm 1, Eq. 13)"),
)
WINDOW = Option("window", _window, "optimal", parse=_parse_window,
                help="swap window W: an integer >= 1 or 'optimal' (W* from the swap rate)")
#: the constant learning rate of ensemble and swag
LR = Option("lr", real(0, strict=True), parse=parse_float,
            help="the learning rate (default: lr-min)")


# ------------------------------------------------------------------------------ the methods
def _tempered(ctx: Context, W: int) -> Setup:
    """DEO_W with the deterministic swap rule, ``C`` and the learning rates adapted toward the
    target swap rate (Deng et al. 2023, Algorithm 1)."""
    cfg, P, iters = ctx.cfg, ctx.cfg.chains, ctx.iters
    if iters < 4 * P * W:  # a replica crosses at most one pair per window
        warnings.warn(
            f"the main run holds {iters / W:.1f} windows of W = {W} iterations, but a round "
            f"trip of {P} replicas needs at least {2 * (P - 1)}: expect few or no round "
            f"trips; raise epochs or swap_rate (W* = ceil((log P + log log P) / -log(1 - S)))",
            SamplingWarning, stacklevel=4)
    step = [v / ctx.N for v in geometric_ladder(cfg.lr_min, cfg.lr_max, P)]
    eng = ctx.engine(MomentumSGD(ctx.estimator, momentum=cfg.momentum), [0.0] * P, step,
                     DEOW(W), Deterministic(cfg.correction))
    # C's gain scales with the energy noise (the paper's simulation: sd 2, a = 50)
    # (sharded: each process its block, the variances gathered: the same number everywhere)
    key = rng.Key((cfg.seed, START), getattr(eng, "block", None))
    start = getattr(eng.path, "start_estimate", None)  # (the ladder's own pass: made once)
    est, x = ctx.estimator, eng.state.x
    var = (start(x, key) if start is not None
           else est(x, key, est.init_extras(x, key), need_grad=False)).var
    if ctx.comm is not None:
        var = ctx.comm.gather_replicas(var, P)
    noise_sd = float(var.mean().sqrt())
    if not math.isfinite(noise_sd):
        raise FloatingPointError(
            f"the minibatch energy of the replicas entering the main run is not finite (noise "
            f"sd {noise_sd}): a replica diverged in pretraining; lower lr_max (now "
            f"{cfg.lr_max}) or raise pretrain_epochs")
    gain = SAStepSize(cfg.sa_scale * max(noise_sd, 1e-12))
    adaptors = [CorrectionAdaptor(cfg.swap_rate, gain, pairs=cfg.sa_pairs),
                LearningRateAdaptor(cfg.swap_rate, SAStepSize(), pairs=cfg.sa_pairs)]
    return Setup(eng, [0], adaptors, facts={"window": W, "energy_noise_sd": noise_sd})


@method("deo-star", tempered=True, options=(*TEMPERED, WINDOW))
def deo_star(ctx: Context) -> Setup:
    """DEO*-mSGD x P: windows ``W* = ceil((log P + log log P) / -log(1 - S))`` from the
    target swap rate ``S`` (or ``window``)."""
    cfg = ctx.cfg
    W = window_from_swap_rate(cfg.chains, cfg.swap_rate) if cfg.window == "optimal" \
        else cfg.window
    return _tempered(ctx, W)


@method("deo", tempered=True, options=TEMPERED)
def deo(ctx: Context) -> Setup:
    """DEO-mSGD x P: the same with ``W = 1``."""
    return _tempered(ctx, 1)


@method("ensemble", options=(LR,))
def ensemble(ctx: Context) -> Setup:
    """mSGD x P: ``chains`` independent momentum-SGD runs at learning rate ``lr``."""
    cfg, P = ctx.cfg, ctx.cfg.chains
    eng = ctx.engine(MomentumSGD(ctx.estimator, momentum=cfg.momentum), [0.0] * P,
                     cfg.constant_lr / ctx.N, NoSwap(), Deterministic(0.0))
    return Setup(eng, list(range(P)))


@method("cyclical", single=True, options=(
    Option("cycles", integer(1), parse=parse_int,
           help="cosine cycles (default: one per 10 epochs of the budget)"),
    Option("temperature", real(0), 1.0, parse=parse_float, help="SGHMC noise temperature")))
def cyclical(ctx: Context) -> Setup:
    """cycSGHMC x T: one SGHMC chain, cosine learning-rate cycles from ``lr_max``; models
    collected in the sampling stage of each cycle, every half epoch by default (Zhang et al.
    2020)."""
    cfg = ctx.cfg
    cycles = cfg.cycles or max(1, round(cfg.epochs * cfg.chains / 10))
    explorer = Cyclical(SGHMC(ctx.estimator, momentum=cfg.momentum), cycles, ctx.iters)
    eng = ctx.engine(explorer, [cfg.temperature], cfg.lr_max / ctx.N, NoSwap(),
                     Deterministic(0.0))
    return Setup(eng, [0], stage=explorer.in_sampling_stage,
                 every=cfg.collect_every or max(1, ctx.per_epoch // 2),
                 facts={"cycles": cycles})


@method("swag", single=True, swag=True, options=(
    LR,
    Option("swag_rank", integer(1), 20, parse=parse_int, help="rank of the low-rank covariance"),
    Option("swag_samples", integer(1), 20, parse=parse_int,
           help="models drawn from the fitted Gaussian for the average")))
def swag(ctx: Context) -> Setup:
    """SWAG x T: one momentum-SGD chain at learning rate ``lr``; its moments (diagonal and a
    low-rank deviation matrix) are collected, and the average is over ``swag_samples`` draws
    of the fitted Gaussian, each with its BatchNorm statistics refreshed on the training data
    (Maddox et al. 2019)."""
    cfg = ctx.cfg
    eng = ctx.engine(MomentumSGD(ctx.estimator, momentum=cfg.momentum), [0.0],
                     cfg.constant_lr / ctx.N, NoSwap(), Deterministic(0.0))
    return Setup(eng, [0])


METHODS = tuple(BUILDERS)
