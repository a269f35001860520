"""Stochastic-gradient explorers (SGLD/SGD, SGHMC/momentum SGD, pSGLD/pSGD, cyclical step size),
batched over replicas with per-slot learning rates.

Conventions (Deng et al. 2023, Eqs. 5-6, App. A.1): ``U = -log pi``; a replica uses its slot's
learning rate ``eta`` (``step_size``) and noise temperature ``tau = 1 / b`` (``b = inf``:
``tau = 0``, plain SGD).  ``xi ~ N(0, I)``:

====================  =========================================================================
SGLD (tau > 0)        x <- x - eta ∇Ũ(x) + sqrt(2 eta tau) xi                      (A.1)
SGD (tau = 0)         x <- x - eta ∇Ũ(x)                                           (Eq. 5)
SGHMC                 m <- (1 - a) m - eta ∇Ũ(x) + sqrt(2 a eta tau) xi;  x <- x + m
                      (Chen et al. 2014, friction a = 1 - momentum)
pSGLD / pSGD          V <- rho V + (1 - rho) g^2;  G = 1 / (eps + sqrt V)
                      x <- x - eta G g + sqrt(2 eta tau G) xi   (Li et al. 2016, no Gamma term)
====================  =========================================================================

DEO*-SGD (Eq. 6) is SGD at every slot with Langevin noise at slot 0: noise temperatures
``[tau_1, 0, ..., 0]`` (:class:`nrpt.run.sgpt.NoiseLadder`).

One energy evaluation per step, at the new state: ``Ũ(x')`` goes to ``state.v`` (read by the
swap rule), ``∇Ũ(x')`` to ``state.extras["sg_grad"]`` for the next move.  Momentum and
preconditioner buffers live in ``extras``.  With a :class:`nrpt.explorers.domains.Domain`
(r2SGLD) the proposal is reflected into the domain before evaluation; momentum methods then
set ``m = x' - x``.  No Metropolis correction (``info.accept_prob`` is 1); a non-finite new
state or energy is not taken and is flagged in ``info.nonfinite``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from nrpt.energy.estimators import EnergyEstimator, ExactEnergy
from nrpt.explorers.base import ExploreInfo, Explorer, Noise, ReplicaState
from nrpt.host import viewable
from nrpt.options import (
    Option,
    check_numbers,
    increasing,
    integer,
    number,
    parse_float,
    parse_floats,
    parse_int,
)

__all__ = ["SGExplorer", "SGLD", "SGD", "SGHMC", "MomentumSGD", "PSGLD", "PSGD", "Cyclical",
           "cyclical_factor"]


def _increasing(name, value, cfg=None):
    return increasing(name, check_numbers(name, value, cfg.chains))


def _domain(name, value, cfg=None):
    from nrpt.explorers.domains import parse_domain

    if not isinstance(value, str):
        raise ValueError(f"domain must be box:LO,HI or ball:R; got {value!r}")
    parse_domain(value)
    return value


def _lr(name: str, default: float, help: str) -> Option:
    return Option(name, number(0.0, strict=True), default=default, section="ladder",
                  parse=parse_float, applies=lambda cfg: "learning_rates gives the whole ladder"
                  if cfg.learning_rates is not None else None, why=_SG_WHY, help=help)


_SG_WHY = "{name} is for stochastic-gradient explorers ({names})"
_ENERGY_WHY = "{name} sets the energy estimator of stochastic-gradient explorers ({names})"
#: the settings every stochastic-gradient explorer reads (its ladder of learning rates, its
#: energy estimator and its domain)
SG_OPTIONS = (
    Option("learning_rates", _increasing, section="ladder", parse=parse_floats, why=_SG_WHY,
           help="explicit learning-rate ladder, comma-separated, increasing"),
    _lr("lr_min", 0.003, "learning rate of slot 0 (stochastic-gradient explorers)"),
    _lr("lr_max", 0.6, "learning rate of slot P-1; the initial ladder is geometric in between"),
    Option("domain", _domain, section="explorer", why="domain reflects stochastic-gradient steps",
           help="reflect stochastic-gradient steps onto box:LO,HI or ball:R"),
    Option("noise_sd", number(0.0), default=0.0, section="energy", parse=parse_float,
           why=_ENERGY_WHY,
           help="noisy oracle: sd of the Gaussian noise added to the energy (and gradient)"),
    Option("grad_noise_sd", number(0.0), section="energy", parse=parse_float, why=_ENERGY_WHY,
           help="noisy oracle: gradient noise sd if different from --noise-sd"),
    Option("batch_size", integer(2), section="energy", parse=parse_int, why=_ENERGY_WHY,
           help="minibatch size (data targets); must not exceed the data"),
    Option("vr_every", integer(0), default=0, section="energy", parse=parse_int,
           why=_ENERGY_WHY, help="variance-reduced energies: refresh the control-variate "
                                 "anchor every m iterations (0: off)"),
)
#: SGD explorers (no noise above slot 0): the noise temperature of slot 0
ZERO_OPTIONS = (Option("bottom_temperature", number(0.0), default=1.0, section="ladder",
                       parse=parse_float, why="bottom_temperature is for SGD explorers {names}",
                       help="sgd/msgd/psgd: Langevin noise temperature at slot 0 "
                            "(0: plain SGD)"),)
MOMENTUM = Option("momentum", number(0.0, high=1.0), default=0.9, section="explorer",
                  parse=parse_float, help="momentum of sghmc / msgd (1 - friction)")


def keep_failed(state: ReplicaState, ok: torch.Tensor, new: ReplicaState) -> ReplicaState:
    """``new`` where ``ok``, else the replica's old state (its extras where it had them, the
    new ones it did not have yet): a step whose position, energy or gradient is not finite
    is refused."""
    old = ReplicaState(state.x, state.v, state.base,
                       {key: state.extras.get(key, val) for key, val in new.extras.items()})
    return old.where(ok, new)


class SGExplorer(Explorer):
    """Base class: the energy/gradient oracle, caching, reflection and bookkeeping.

    Args:
        estimator: an :class:`nrpt.energy.estimators.EnergyEstimator`; default the exact energy of
        the
            engine's target (full-batch Langevin / gradient descent).
        domain: optional :class:`nrpt.explorers.domains.Domain` to reflect onto.
    """

    uses_gradient = True
    compilable = True  # (not with the control-variate energy: nrpt.explorers.compiled)
    options = SG_OPTIONS
    #: extras created by the move itself (besides the estimator's)
    buffers: tuple[str, ...] = ()

    def __init__(self, estimator: EnergyEstimator | None = None, domain=None):
        if estimator is not None and not callable(estimator):
            raise ValueError("estimator must be an nrpt.energy.estimators.EnergyEstimator")
        self.estimator = estimator
        self.domain = domain

    @staticmethod
    def check_settings(cfg) -> None:
        """The learning-rate ladder runs upward: ``lr_max > lr_min``."""
        if cfg.lr_min is not None and not cfg.lr_max > cfg.lr_min:
            raise ValueError(f"lr_max ({cfg.lr_max}) must be larger than lr_min "
                             f"({cfg.lr_min})")

    def start_with(self, state: ReplicaState, estimate) -> ReplicaState:
        """``state`` holding ``estimate`` (an :class:`nrpt.energy.estimators.Estimate` at
        ``state.x``, made with its gradient from the estimator's :meth:`init_extras`) as the
        gradient at the start: the first :meth:`step` moves with it (and the estimator's
        extras it brings) instead of making its own estimate there, one gradient evaluation
        fewer per engine, where the caller has made that estimate anyway (``nrpt.deep``'s
        start pass, :class:`nrpt.deep.methods.MinibatchLadder`)."""
        if estimate.grad is None or estimate.grad.shape != state.x.shape:
            raise ValueError("start_with needs an estimate with the gradient at state.x")
        return state.replace(extras={**state.extras, **estimate.extras,
                                     "sg_grad": estimate.grad})

    def _estimator(self, density) -> EnergyEstimator:
        if self.estimator is None:
            self.estimator = ExactEnergy(density.target)
        return self.estimator

    def describe(self) -> dict:
        out = {"name": self.name}
        if self.estimator is not None:
            out.update(self.estimator.describe())
        if self.domain is not None:
            out["domain"] = self.domain.describe()
        return out

    # subclasses: (x, grad, eta[R,P,1], tau[R,P,1], extras, xi) -> (x_new, extras_new)
    def move(self, x, g, eta, tau, extras, xi):  # pragma: no cover - interface
        raise NotImplementedError

    def after_reflection(self, x, x_new, extras):
        return extras

    def step(self, state, b, step_size, density, noise, sub=0):
        est = self._estimator(density)
        extras = dict(state.extras)
        if "sg_grad" not in extras or any(key not in extras for key in est.extras_keys):
            # first step: initialise the estimator's buffers and the gradient at the start
            extras.update(est.init_extras(state.x, noise.key(sub, 0)))
            e0 = est(state.x, noise.key(sub, 0), extras, need_grad=True)
            extras.update(e0.extras)
            extras["sg_grad"] = e0.grad
        if self._host(state.x, extras["sg_grad"], b, step_size):
            return self._step_np(state, b, step_size, est, noise, sub, extras)
        eta = step_size[..., None]
        tau = torch.reciprocal(b)[..., None]  # b = inf -> tau = 0 (no noise)
        # every slot cold (plain / momentum SGD): no noise to draw (the draws are keyed by
        # iteration, so skipping them changes no other number; the move adds none)
        xi = None if _all_cold(b, noise) else noise.normal(sub, (state.x.shape[-1],),
                                                            state.x.dtype)
        x_new, extras = self.move(state.x, extras["sg_grad"], eta, tau, extras, xi)
        if self.domain is not None:
            x_new = self.domain.reflect(state.x, x_new)
            extras = self.after_reflection(state.x, x_new, extras)
        e1 = est(x_new, noise.key(sub, 1), extras, need_grad=True)
        extras.update(e1.extras)
        extras["sg_grad"] = e1.grad
        if e1.var is not None:
            extras["energy_var"] = e1.var
        # inf / nan anywhere in a replica's position, energy or gradient makes this sum non-finite
        ok = torch.isfinite(e1.u + x_new.sum(-1) + e1.grad.sum(-1))
        new = ReplicaState(x_new, e1.u, torch.zeros_like(e1.u), extras)
        if torch.compiler.is_compiling() or not _all_true(ok):  # (no host sync in a graph)
            new = keep_failed(state, ok, new)
        # (the 0/1 acceptance as e1.u's dtype: what ones_like(e1.u) * ok gave, one op fewer)
        return new, ExploreInfo(ok.to(e1.u.dtype), ok, ~ok)

    def _host(self, *ts) -> bool:
        """Whether :meth:`step` runs on NumPy views (:meth:`_step_np`): SGLD's move (the
        method of :class:`SGLD` and :class:`SGD`) without a domain, on float64 CPU tensors out
        of autograd and outside a compiled graph."""
        return type(self).move is SGLD.move and self.domain is None and viewable(*ts)

    def host_estimator(self, density) -> EnergyEstimator | None:
        """The estimator where a step may run wholly on NumPy arrays (:meth:`move_np`, the
        estimator's ``numpy_gradients``, :func:`finite_np`: the eager fused chunk's host
        iteration, ``nrpt.core.fused``): SGLD's move without a domain and an estimator with
        its NumPy path; else ``None``.  A subclass that overrides the step or either move is
        run by its own step (``None``)."""
        cls = type(self)
        if cls.move is not SGLD.move or cls.step is not SGExplorer.step or \
                cls.move_np is not SGExplorer.move_np or self.domain is not None:
            return None
        est = self._estimator(density)
        return est if est.has_numpy_gradients() else None

    def move_np(self, x, g, eta, bn, noise, sub):
        """SGLD's move on float64 arrays: ``x - eta g`` plus ``sqrt(2 eta / b) xi`` (``eta``
        ``[R, P, 1]``, ``bn`` ``[R, P]``; no noise drawn where every slot is cold, as
        :func:`_all_cold`; the noise may replay NumPy arrays).  NumPy's floating-point warnings
        are the caller's to silence."""
        x_new = x - eta * g
        if not (type(noise) is Noise and np.isinf(bn).all()):  # (_all_cold, on the view)
            xi = noise.normal(sub, (x.shape[-1],), torch.float64)
            xi = xi if type(xi) is np.ndarray else xi.numpy()  # (a replayed array as it is)
            x_new = x_new + np.sqrt(2.0 * eta * (1.0 / bn)[..., None]) * xi
        return x_new

    def _step_np(self, state, b, step_size, est, noise, sub, extras):
        """:meth:`step` on NumPy views of the same memory (a small NumPy op costs a third to a
        half of a small torch op on the CPU), op for op the same IEEE arithmetic: ``1 / b`` is
        ``reciprocal``, ``sqrt`` is correctly rounded in both, the finiteness sums of one or two
        entries are one addition in any order (longer ones are torch's own sums).  The same
        numbers bit for bit (``tests/test_sa_host.py``)."""
        with np.errstate(all="ignore"):  # (torch does not warn of overflow either)
            x = state.x.numpy()
            x_new = self.move_np(x, extras["sg_grad"].numpy(), step_size.numpy()[..., None],
                                 b.numpy(), noise, sub)
            xt = torch.from_numpy(x_new)
            parts = est.numpy_gradients(x_new, noise.key(sub, 1))
            if parts is None:  # (the estimator's own call, on tensors)
                e1 = est(xt, noise.key(sub, 1), extras, need_grad=True)
                extras.update(e1.extras)
                ut, gt, var = e1.u, e1.grad, e1.var
                u, g = ut.numpy(), gt.numpy()
            else:  # (its NumPy arrays: no tensors in between)
                u, g, var = parts
                ut, gt, var = torch.from_numpy(u), torch.from_numpy(g), torch.from_numpy(var)
            extras["sg_grad"] = gt
            if var is not None:
                extras["energy_var"] = var
            ok = finite_np(u, x_new, g)
        new = ReplicaState(xt, ut, torch.from_numpy(np.zeros(u.shape)), extras)
        okt = torch.from_numpy(ok)
        if not ok.all():
            new = keep_failed(state, okt, new)
        return new, ExploreInfo(torch.from_numpy(ok.astype(u.dtype)), okt,
                                torch.from_numpy(~ok))


def finite_np(u: np.ndarray, x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Whether each replica's energy ``u``, position ``x`` and gradient ``g`` are finite, as
    :meth:`SGExplorer.step`'s ``isfinite(u + x.sum(-1) + g.sum(-1))`` (sums of one or two
    entries: one addition in any order, NumPy's; longer ones torch's own sums)."""
    if x.shape[-1] == 2:  # (the sums of two entries: one addition, without a reduction)
        return np.isfinite(u + (x[..., 0] + x[..., 1]) + (g[..., 0] + g[..., 1]))
    if x.shape[-1] == 1:
        return np.isfinite(u + x.sum(-1) + g.sum(-1))
    return np.isfinite(u + torch.from_numpy(x).sum(-1).numpy()
                       + torch.from_numpy(g).sum(-1).numpy())


def _all_cold(b: torch.Tensor, noise) -> bool:
    """Whether every replica's noise temperature is 0 (``b = inf``): then the step draws no
    noise.  Only for the engine's own :class:`nrpt.explorers.Noise` outside a compiled graph:
    :mod:`nrpt.explorers.compiled` replays recorded draws by position (and a graph draws as
    it was traced), so there the draw is always made."""
    if type(noise) is not Noise or torch.compiler.is_compiling():
        return False
    if viewable(b, dtypes=None):  # (a NumPy view: the same answer, half the calls)
        return bool(np.isinf(b.numpy()).all())
    return bool(torch.isinf(b).all())


def _all_true(ok: torch.Tensor) -> bool:
    """``bool(ok.all())`` of a boolean tensor; read from its NumPy view where
    :func:`nrpt.host.viewable` allows."""
    return bool(ok.numpy().all()) if viewable(ok, dtypes=(torch.bool,)) else bool(ok.all())


def _within_shape(small: torch.Size, shape: torch.Size) -> bool:
    """Whether ``small`` broadcasts to ``shape`` without growing it (each of its trailing
    sizes 1 or ``shape``'s): what ``torch.broadcast_shapes(small, shape) == shape`` says, at a
    tenth of its cost (that is Python too, ~25 us: this runs every step)."""
    return len(small) <= len(shape) and all(
        a == 1 or a == b for a, b in zip(reversed(small), reversed(shape), strict=False))


def _plus_noise(t: torch.Tensor, scale, xi: torch.Tensor | None):
    """``t + sqrt(scale()) * xi``, or ``t`` itself when no noise was drawn (every slot cold:
    the term is 0, and this skips its arithmetic, the scale's included: ``scale`` is a
    function that makes it)."""
    return t if xi is None else t + torch.sqrt(scale()) * xi


class SGLD(SGExplorer):
    """Stochastic gradient Langevin dynamics; ``tau = 0`` slots take plain SGD steps."""

    name = "sgld"

    def move(self, x, g, eta, tau, extras, xi):
        return _plus_noise(x - eta * g, lambda: 2.0 * eta * tau, xi), extras


class SGD(SGLD):
    """SGD with a constant learning rate per slot (Eq. 5); the same update as :class:`SGLD`, the
    noise temperature of each slot decides whether Langevin noise is added (Eq. 6: only at slot
    0, optionally).  Kept as its own name for configurations and reports."""

    name = "sgd"
    #: the method's name in the literature, by swap rule (summaries)
    method_names = {"deterministic": "DEO*-SGD"}
    options = (*SG_OPTIONS, *ZERO_OPTIONS)


class SGHMC(SGExplorer):
    """Stochastic gradient HMC in the learning-rate / friction form of Chen et al. (2014, Eq. 15),
    one leapfrog step per iteration; ``momentum`` = ``1 - friction``.  ``tau = 0``: momentum SGD."""

    name = "sghmc"
    options = (*SG_OPTIONS, MOMENTUM)
    buffers = ("momentum",)

    def __init__(self, estimator=None, domain=None, momentum: float = 0.9):
        super().__init__(estimator, domain)
        if not (isinstance(momentum, int | float) and 0.0 <= momentum < 1.0):
            raise ValueError(f"momentum must be in [0, 1); got {momentum!r}")
        self.momentum = float(momentum)

    def move(self, x, g, eta, tau, extras, xi):
        m = extras.get("momentum")
        if m is None:
            m = torch.zeros_like(x)
        a = 1.0 - self.momentum
        # momentum * m is a new tensor: eta * g is taken from it in place by one addcmul_
        # (a pass over g that reads eta broadcast, no temporary of the state's size) where
        # the result has kept's shape and dtype (no promotion, no broadcast beyond kept's
        # shape); else the plain expression.  addcmul_ rounds once where torch's kernel fuses
        # the multiply-add (vectorized CPU bodies with FMA, CUDA), twice elsewhere
        kept = self.momentum * m
        if kept.dtype == g.dtype == eta.dtype and kept.shape == g.shape and \
                _within_shape(eta.shape, kept.shape):
            m = _plus_noise(kept.addcmul_(eta, g, value=-1.0), lambda: 2.0 * a * eta * tau, xi)
        else:
            m = _plus_noise(kept - eta * g, lambda: 2.0 * a * eta * tau, xi)
        return x + m, {**extras, "momentum": m}

    def after_reflection(self, x, x_new, extras):
        return {**extras, "momentum": x_new - x}

    def describe(self):
        return {**super().describe(), "momentum": self.momentum}


class MomentumSGD(SGHMC):
    """Momentum SGD (the paper's mSGD): :class:`SGHMC` on zero-temperature slots."""

    name = "msgd"
    options = (*SG_OPTIONS, *ZERO_OPTIONS, MOMENTUM)


class PSGLD(SGExplorer):
    """RMSprop-preconditioned SGLD (Li et al. 2016) without the ``Gamma`` correction term.

    Dropping ``Gamma`` (as Li et al. do) biases the stationary law where the preconditioner
    follows the state (less so as ``rho`` -> 1).
    """

    name = "psgld"
    buffers = ("precond_sq",)

    def __init__(self, estimator=None, domain=None, rho: float = 0.99, eps: float = 1e-5):
        super().__init__(estimator, domain)
        if not (isinstance(rho, int | float) and 0.0 <= rho < 1.0):
            raise ValueError(f"rho must be in [0, 1); got {rho!r}")
        if not (isinstance(eps, int | float) and eps > 0 and math.isfinite(eps)):
            raise ValueError(f"eps must be a number > 0; got {eps!r}")
        self.rho, self.eps = float(rho), float(eps)

    def move(self, x, g, eta, tau, extras, xi):
        v = extras.get("precond_sq")
        v = g * g if v is None else self.rho * v + (1.0 - self.rho) * g * g
        G = 1.0 / (self.eps + v.sqrt())
        x_new = _plus_noise(x - eta * G * g, lambda: 2.0 * eta * tau * G, xi)
        return x_new, {**extras, "precond_sq": v}

    def describe(self):
        return {**super().describe(), "rho": self.rho, "eps": self.eps}


class PSGD(PSGLD):
    """Preconditioned SGD (the paper's pSGD): :class:`PSGLD` on zero-temperature slots."""

    name = "psgd"
    options = (*SG_OPTIONS, *ZERO_OPTIONS)


def cyclical_factor(k: int, cycles: int, iterations: int) -> float:
    """Cosine cyclical schedule of Zhang et al. (2020, Eq. 1):
    ``eta_k / eta_0 = (cos(pi * mod(k, L) / L) + 1) / 2`` with ``L = ceil(iterations / cycles)``."""
    L = math.ceil(iterations / cycles)
    return 0.5 * (math.cos(math.pi * (k % L) / L) + 1.0)


class Cyclical(Explorer):
    """cycSGLD / cycSGHMC (Zhang et al. 2020): ``inner`` with its learning rate multiplied by the
    cosine factor :func:`cyclical_factor` of the iteration.  The samples of the *sampling stage*
    are those at cycle positions ``mod(k, L) / L >= 1 - sampling_fraction``
    (:meth:`in_sampling_stage`)."""

    uses_gradient = True

    def __init__(self, inner: SGExplorer, cycles: int, iterations: int,
                 sampling_fraction: float = 0.25):
        if int(cycles) != cycles or cycles < 1:
            raise ValueError(f"cycles must be an integer >= 1; got {cycles!r}")
        if int(iterations) != iterations or iterations < cycles:
            raise ValueError(f"iterations must be an integer >= cycles; got {iterations!r}")
        if not 0.0 < sampling_fraction <= 1.0:
            raise ValueError(f"sampling_fraction must be in (0, 1]; got {sampling_fraction!r}")
        self.inner, self.cycles, self.iterations = inner, int(cycles), int(iterations)
        self.sampling_fraction = float(sampling_fraction)
        self.name = "cyc" + inner.name

    def start_with(self, state, estimate):
        return self.inner.start_with(state, estimate)

    def in_sampling_stage(self, k: int) -> bool:
        L = math.ceil(self.iterations / self.cycles)
        return (k % L) / L >= 1.0 - self.sampling_fraction

    def step(self, state, b, step_size, density, noise, sub=0):
        f = cyclical_factor(noise.iteration, self.cycles, self.iterations)
        return self.inner.step(state, b, step_size * max(f, 1e-12), density, noise, sub)

    def describe(self):
        return {**self.inner.describe(), "name": self.name, "cycles": self.cycles,
                "iterations": self.iterations, "sampling_fraction": self.sampling_fraction}
