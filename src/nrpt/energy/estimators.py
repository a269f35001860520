"""Energy estimators for stochastic-gradient parallel tempering.

For states ``x[R, P, dim]`` an estimator returns an unbiased energy estimate ``Ũ(x)`` ``[R, P]``
(``U = -log pi``), a gradient estimate ``∇Ũ(x)`` ``[R, P, dim]`` and, where it can, an estimate
of ``Var Ũ(x)`` ``[R, P]`` (for the bias-corrected swap rule).

==============================  ============================================================
:class:`ExactEnergy`            ``U`` and ``∇U`` by autograd, variance 0 (full batch)
:class:`NoisyOracle`            ``U + sd_e N(0, 1)``, ``∇U + sd_g N(0, I)`` (Deng et al. 2023,
                                Sec. 5.1)
:class:`MinibatchEnergy`        ``Ũ = (N / n) sum_{i in B} l_i(x) + prior(x)``, a batch ``B``
                                of ``n`` of ``N`` data per replica and iteration
:class:`ControlVariateEnergy`   VR-reSGLD (Deng et al. 2021):
                                ``Ũ_vr(x) = Ũ_B(x) - c (Ũ_B(x̂) - U(x̂))``, anchor ``x̂``
                                refreshed every ``m`` iterations
==============================  ============================================================

Every call receives a :class:`~nrpt.rng.Key` and draws full ``[R, P, ...]`` tensors
(:mod:`nrpt.rng`).  Per-replica buffers (the anchor) are returned in ``Estimate.extras`` and
travel with their replica in :attr:`nrpt.roles.ReplicaState.extras`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from nrpt import rng
from nrpt.host import viewable
from nrpt.targets.protocol import capabilities, optional_value

__all__ = ["make_estimator", "Estimate", "EnergyEstimator", "ExactEnergy", "NoisyOracle",
           "MinibatchEnergy", "ControlVariateEnergy", "SG_STREAMS", "energy_and_grad",
           "batch_indices"]


class SG_STREAMS:  # noqa: N801 - a namespace of constants, like rng.Stream
    """Stream tags of the stochastic-gradient code (kept far from other ``Stream.USER`` uses)."""

    ORACLE_ENERGY = rng.Stream.USER + 401
    ORACLE_GRAD = rng.Stream.USER + 402
    BATCH = rng.Stream.USER + 403


@dataclass
class Estimate:
    """``u[R, P]``, ``grad[R, P, dim]`` (None if not requested), ``var[R, P]`` (estimated
    variance of ``u``; None if unknown) and per-replica ``extras`` to store with the state."""

    u: torch.Tensor
    grad: torch.Tensor | None
    var: torch.Tensor | None
    extras: dict[str, torch.Tensor] = field(default_factory=dict)


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` in ``dtype`` (converted only when it differs: a no-op ``.to`` costs as much as a
    small op, and this runs every step)."""
    return t if t.dtype == dtype else t.to(dtype)


def _analytic(target):
    """A closed-form ``(U, ∇U)`` for ``x[..., dim]``: from the target's
    ``energy_and_grad(x[n, dim]) -> ([n], [n, dim])`` if it has one, else from ``energy`` and
    ``grad_energy(x[n, dim]) -> [n, dim]`` (the member the full-batch explorers use; they
    ignore ``energy_and_grad``); ``None`` (neither): autograd."""
    caps = capabilities(target)
    if caps.has("energy_and_grad"):
        fused = target.energy_and_grad

        def fn_fused(x):
            u, g = fused(x.reshape(-1, x.shape[-1]))
            return _as(u, x.dtype).reshape(x.shape[:-1]), _as(g, x.dtype).reshape(x.shape)
        return fn_fused
    if caps.has("grad_energy"):
        grad = target.grad_energy

        def fn(x):
            flat = x.reshape(-1, x.shape[-1])
            u = target.energy(flat).to(x.dtype)
            return u.reshape(x.shape[:-1]), grad(flat).to(x.dtype).reshape(x.shape)
        return fn
    return None


def energy_and_grad(fn, x: torch.Tensor, need_grad: bool = True):
    """``(fn(x), ∇fn(x))`` for ``fn: [n, dim] -> [n]`` applied to ``x[..., dim]`` (autograd)."""
    lead = x.shape[:-1]
    flat = x.reshape(-1, x.shape[-1])
    if not need_grad:
        with torch.no_grad():
            return fn(flat).reshape(lead), None
    with torch.enable_grad():
        xg = flat.detach().requires_grad_(True)
        u = fn(xg)
        (g,) = torch.autograd.grad(u.sum(), xg)
    return u.detach().reshape(lead), g.detach().reshape(x.shape)


class EnergyEstimator:
    """Base class.  ``__call__(x, key, extras, need_grad)`` returns an :class:`Estimate`;
    :meth:`full` is the exact (full-data) energy used for initial states and diagnostics."""

    #: names of ``extras`` entries this estimator needs (created by :meth:`init_extras`)
    extras_keys: tuple[str, ...] = ()

    def full(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def init_extras(self, x: torch.Tensor, key: tuple[int, ...]) -> dict[str, torch.Tensor]:
        return {}

    def numpy_gradients(self, x, key):
        """``(u, grad, var)`` as NumPy arrays for float64 states ``x[..., dim]`` (a C-contiguous
        array), the numbers :meth:`__call__` gives with ``need_grad`` (an estimator that keeps
        no ``extras``), or ``None``: this estimator has no such path (the default).  NumPy's
        floating-point warnings are the caller's to silence (``np.errstate``; torch gives
        none).  :class:`nrpt.explorers.sgmcmc.SGLD`'s CPU step calls it."""
        return None

    def has_numpy_gradients(self) -> bool:
        """Whether :meth:`numpy_gradients` gives arrays (not ``None``) for float64 states."""
        return False

    def __call__(self, x, key, extras, need_grad=True) -> Estimate:  # pragma: no cover
        raise NotImplementedError

    def describe(self) -> dict:
        return {"energy": type(self).__name__}


class ExactEnergy(EnergyEstimator):
    """Full-batch energy ``U`` and gradient ``∇U`` of an energy target (no noise)."""

    def __init__(self, target):
        self.target = target
        self._closed_form = _analytic(target)
        #: the target's closed form on NumPy arrays (float64 CPU states), if it has one
        self._numpy = target.energy_and_grad_numpy if self._closed_form is not None and \
            capabilities(target).has("energy_and_grad_numpy") else None

    def full(self, x):
        with torch.no_grad():
            return _flat(self.target.energy, x)

    def exact(self, x, need_grad):
        if need_grad and self._closed_form is not None:
            return self._closed_form(x)
        return energy_and_grad(self.target.energy, x, need_grad)

    def __call__(self, x, key, extras, need_grad=True):
        u, g = self.exact(x, need_grad)
        return Estimate(u, g, torch.zeros_like(u))

    def describe(self):
        return {"energy": "exact"}


class NoisyOracle(EnergyEstimator):
    """Exact ``U`` and ``∇U`` plus independent Gaussian noise (Deng et al. 2023, Sec. 5.1):

        Ũ(x) = U(x) + energy_sd * N(0, 1),     ∇Ũ(x) = ∇U(x) + grad_sd * N(0, I).

    ``var`` is reported exactly (``energy_sd**2``).  Both sds may also be sequences of one value
    per system (``[R]``, e.g. to study several noise levels in one engine).  The energy and
    gradient noises are columns of one keyed draw.
    """

    def __init__(self, target, energy_sd=2.0, grad_sd=None):
        grad_sd = energy_sd if grad_sd is None else grad_sd
        self.target = target
        self.energy_sd, self.grad_sd = _sds("energy_sd", energy_sd), _sds("grad_sd", grad_sd)
        self._exact = ExactEnergy(target)
        self._numpy = self._exact._numpy is not None and isinstance(self.energy_sd, float) \
            and isinstance(self.grad_sd, float)

    def full(self, x):
        with torch.no_grad():
            return _flat(self.target.energy, x)

    def __call__(self, x, key, extras, need_grad=True):
        if need_grad and self._numpy and viewable(x) and x.is_contiguous():
            with np.errstate(all="ignore"):  # (torch does not warn of overflow either)
                u, g, var = self.numpy_gradients(x.numpy(), key)
            return Estimate(torch.from_numpy(u), torch.from_numpy(g), torch.from_numpy(var))
        u, g = self._exact.exact(x, need_grad)
        # one draw [R, P, 1 + dim]: column 0 is the energy noise, the rest the gradient noise
        z = rng.as_key(key).normal((*u.shape, 1 + x.shape[-1]), SG_STREAMS.ORACLE_ENERGY,
                                   dtype=u.dtype, device=u.device)
        e_sd, g_sd = self._per_system(self.energy_sd, u), self._per_system(self.grad_sd, u)
        u = u + e_sd * z[..., 0]
        if g is not None:
            g = g + g_sd[..., None] * z[..., 1:]
        return Estimate(u, g, (e_sd * e_sd).expand_as(u).clone())

    def has_numpy_gradients(self) -> bool:
        return self._numpy

    def numpy_gradients(self, x, key):
        """Where the target has ``energy_and_grad_numpy`` and the sds are numbers: its closed
        form and the noise on NumPy arrays (a small NumPy op costs a third to a half of a small
        torch op), the same IEEE products and sums as :meth:`__call__`'s torch path, bit for
        bit (``tests/test_sa_host.py``); else ``None``.  The key's draw may be a NumPy array
        (the eager fused chunk's host iteration replays its draws as arrays)."""
        if not self._numpy:
            return None
        lead, dim = x.shape[:-1], x.shape[-1]
        z = rng.as_key(key).normal((*lead, 1 + dim), SG_STREAMS.ORACLE_ENERGY,
                                   dtype=torch.float64)
        z = z if type(z) is np.ndarray else z.numpy()  # (a replayed array as it is)
        u, g = self._exact._numpy(x.reshape(-1, dim))
        e_sd = self.energy_sd
        return (u.reshape(lead) + e_sd * z[..., 0], g.reshape(x.shape) + self.grad_sd * z[..., 1:],
                np.full(lead, e_sd * e_sd))

    def _per_system(self, sd, u):
        if isinstance(sd, float) and torch.compiler.is_compiling():
            return torch.full((1,) * u.dim(), sd, dtype=u.dtype, device=u.device)
        if isinstance(sd, float):  # (one 1-element tensor per kind of u, made once, eager)
            key = (sd, u.dim(), u.dtype, u.device, torch.is_inference_mode_enabled())
            cache = self.__dict__.setdefault("_sd_cache", {})
            t = cache.get(key)
            if t is None:
                t = cache[key] = torch.full((1,) * u.dim(), sd, dtype=u.dtype, device=u.device)
            return t
        if u.dim() < 1 or sd.numel() != u.shape[0]:
            raise ValueError(f"{sd.numel()} per-system noise sds for {u.shape[0]} systems")
        return sd.to(u.dtype).to(u.device).reshape(-1, *([1] * (u.dim() - 1)))

    def describe(self):
        sd = lambda v: v if isinstance(v, float) else v.tolist()  # noqa: E731
        return {"energy": "noisy-oracle", "energy_sd": sd(self.energy_sd),
                "grad_sd": sd(self.grad_sd)}


def _sds(name, value):
    """A noise sd: a finite number >= 0, or a sequence of them (one per system)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        vals, scalar = [float(value)], True
    else:
        try:
            vals, scalar = [float(v) for v in value], False
        except (TypeError, ValueError):
            vals, scalar = [], False
    if not vals or not all(math.isfinite(v) and v >= 0 for v in vals):
        raise ValueError(f"{name} must be a finite number >= 0 (or one per system); got {value!r}")
    return vals[0] if scalar else torch.tensor(vals, dtype=torch.float64)


def _flat(fn, x):
    return fn(x.reshape(-1, x.shape[-1])).reshape(x.shape[:-1])


def batch_indices(shape, n_data: int, batch: int, replacement: bool, key, device):
    """Keyed minibatch indices ``[*shape, batch]`` (without replacement: the first ``batch``
    entries of a uniformly random permutation per replica).  ``key = (seed, iteration, ...)``;
    small draws are made in blocks of iterations (:func:`nrpt.rng.iteration_draw`)."""
    # a process's block of replicas (rng.Block, carried by the key): drawn at full width,
    # sliced to the block
    key = rng.as_key(key)
    if replacement:
        return key.draw(lambda sh, g: torch.randint(n_data, sh, generator=g, device=device),
                        ("randint", n_data), (*shape, batch), SG_STREAMS.BATCH, device=device)
    u = key.draw(lambda sh, g: torch.rand(sh, generator=g, device=device),
                 ("uniform", torch.float32), (*shape, n_data), SG_STREAMS.BATCH, device=device)
    if batch == n_data:
        return u.argsort(-1)
    return u.topk(batch, dim=-1, largest=False, sorted=False).indices


class MinibatchEnergy(EnergyEstimator):
    """Minibatch energy of a data target (:class:`nrpt.targets.minibatch.MinibatchTarget`):

        Ũ_B(x) = (N / n) * sum_{i in B} loss_i(x) + prior(x),      E_B Ũ_B(x) = U(x),

    with a fresh batch ``B`` of ``n = batch_size`` data per replica and evaluation (without
    replacement unless ``replacement=True``).  ``var`` is the usual plug-in estimate
    ``N^2 s^2 / n * (1 - n / N)`` from the sample variance ``s^2`` of the batch losses (the factor
    is the finite-population correction; drop it with replacement).
    """

    def __init__(self, target, batch_size: int, replacement: bool = False):
        n_data = int(target.n_data)
        if isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1; got {batch_size!r}")
        if batch_size > n_data and not replacement:
            raise ValueError(f"batch_size ({batch_size}) is larger than the data "
                             f"(N = {n_data}); use batch_size <= {n_data}")
        if batch_size < 2:
            raise ValueError("batch_size must be >= 2 to estimate the energy variance")
        self.target, self.n_data = target, n_data
        self.batch_size, self.replacement = int(batch_size), bool(replacement)

    def full(self, x):
        with torch.no_grad():
            return _flat(self.target.energy, x)

    def batch(self, x, key):
        idx = batch_indices(x.shape[:-1], self.n_data, self.batch_size, self.replacement, key,
                             x.device)
        return self.target.data[idx]  # [R, P, n, ...]

    def _losses(self, x, data):
        """Per-datum losses ``[R, P, n]`` and the prior energy ``[R, P]``."""
        lead = x.shape[:-1]
        flat = x.reshape(-1, x.shape[-1])
        losses = self.target.loss(flat, data.reshape(flat.shape[0], *data.shape[len(lead):]))
        return losses.reshape(*lead, -1), _flat(self.target.prior_energy, x)

    def _scale_var(self, per_datum: torch.Tensor) -> torch.Tensor:
        n, N = self.batch_size, self.n_data
        fpc = 1.0 if self.replacement else (1.0 - n / N)
        return N * N * per_datum.var(-1) / n * fpc

    def __call__(self, x, key, extras, need_grad=True):
        data = self.batch(x, key)
        scale = self.n_data / self.batch_size

        def fn(xx):
            losses, prior = self._losses(xx, data)
            return scale * losses.sum(-1) + prior, losses

        if need_grad:
            with torch.enable_grad():
                xg = x.detach().requires_grad_(True)
                u, losses = fn(xg)
                (g,) = torch.autograd.grad(u.sum(), xg)
            u, losses, g = u.detach(), losses.detach(), g.detach()
        else:
            with torch.no_grad():
                u, losses = fn(x)
            g = None
        return Estimate(u, g, self._scale_var(losses))

    def describe(self):
        return {"energy": "minibatch", "batch_size": self.batch_size, "n_data": self.n_data,
                "replacement": self.replacement}


class ControlVariateEnergy(MinibatchEnergy):
    """Variance-reduced minibatch energy (VR-reSGLD, Deng et al. 2021):

        Ũ_vr(x) = (N / n) sum_{i in B} [loss_i(x) - c loss_i(x̂)] + c U_data(x̂) + prior(x),

    unbiased for ``U(x)`` for any ``c`` fixed given the past.  Each replica's anchor ``x̂`` is
    its own state, refreshed every ``anchor_every`` (``m``) iterations (a full-data ``U_data(x̂)``
    then).  Only the energy is variance-reduced; the gradient is the plain minibatch gradient.

    ``coefficient``: a number ``c`` (1: the classical control variate), or ``"adaptive"``:
    ``c = Cov(l(x), l(x̂)) / Var(l(x̂))`` from the replica's previous batch, clipped to [0, 2].

    ``extras``: ``cv_anchor [R, P, dim]``, ``cv_anchor_u [R, P]``, ``cv_coef [R, P]`` and
    ``energy_var_plain [R, P]`` (the plain minibatch estimate's variance at the same batch).
    """

    extras_keys = ("cv_anchor", "cv_anchor_u", "cv_coef")

    def __init__(self, target, batch_size: int, anchor_every: int = 100,
                 coefficient: float | str = 1.0, replacement: bool = False):
        super().__init__(target, batch_size, replacement)
        if isinstance(anchor_every, bool) or int(anchor_every) != anchor_every or anchor_every < 1:
            raise ValueError(f"anchor_every must be an integer >= 1; got {anchor_every!r}")
        if coefficient != "adaptive" and not (isinstance(coefficient, int | float)
                                              and math.isfinite(coefficient)):
            raise ValueError(f"coefficient must be a number or 'adaptive'; got {coefficient!r}")
        self.anchor_every = int(anchor_every)
        self.coefficient = coefficient

    def init_extras(self, x, key):
        c0 = 1.0 if self.coefficient == "adaptive" else float(self.coefficient)
        return {"cv_anchor": x.clone(), "cv_anchor_u": self._data_energy(x),
                "cv_coef": torch.full(x.shape[:-1], c0, dtype=x.dtype, device=x.device)}

    def _data_energy(self, x):
        """``U_data(x) = sum_i loss_i(x)`` over all data (no prior), ``[R, P]``."""
        with torch.no_grad():
            return _flat(self.target.energy, x) - _flat(self.target.prior_energy, x)

    def __call__(self, x, key, extras, need_grad=True):
        seed, k, *_ = key
        anchor, anchor_u, coef = extras["cv_anchor"], extras["cv_anchor_u"], extras["cv_coef"]
        if k % self.anchor_every == 0:  # refresh every m iterations: the anchor is the state
            anchor, anchor_u = x.detach().clone(), self._data_energy(x)
        data = self.batch(x, key)
        scale = self.n_data / self.batch_size
        with torch.no_grad():
            anchor_losses, _ = self._losses(anchor, data)
        if need_grad:
            with torch.enable_grad():
                xg = x.detach().requires_grad_(True)
                losses, prior = self._losses(xg, data)
                (g,) = torch.autograd.grad((scale * losses.sum(-1) + prior).sum(), xg)
            losses, prior, g = losses.detach(), prior.detach(), g.detach()
        else:
            with torch.no_grad():
                losses, prior = self._losses(x, data)
            g = None
        diff = losses - coef[..., None] * anchor_losses
        u = scale * diff.sum(-1) + coef * anchor_u + prior
        new = {"cv_anchor": anchor, "cv_anchor_u": anchor_u,
               "energy_var_plain": self._scale_var(losses)}
        if self.coefficient == "adaptive":
            la = anchor_losses - anchor_losses.mean(-1, keepdim=True)
            lx = losses - losses.mean(-1, keepdim=True)
            va = (la * la).sum(-1)
            c = torch.where(va > 0, (la * lx).sum(-1) / va.clamp_min(1e-300), coef)
            new["cv_coef"] = c.clamp(0.0, 2.0)
        else:
            new["cv_coef"] = coef
        return Estimate(u, g, self._scale_var(diff), new)

    def describe(self):
        return {**super().describe(), "energy": "control-variate",
                "anchor_every": self.anchor_every, "coefficient": self.coefficient}


def make_estimator(target, *, batch_size: int | None = None, vr_every: int | None = None,
                   noise_sd: float | None = None, grad_noise_sd: float | None = None
                   ) -> EnergyEstimator:
    """The energy estimator of a stochastic-gradient run: minibatch (``batch_size``; with
    control variates if ``vr_every > 0``), noisy oracle (``noise_sd > 0`` or
    ``grad_noise_sd > 0``) or exact."""
    if batch_size is not None:
        caps = capabilities(target)
        if optional_value(target, "n_data") is None or not caps.has("loss"):
            raise ValueError(f"batch_size needs a data target (with data, n_data, loss); "
                             f"{caps.name!r} has none")
        if vr_every:
            return ControlVariateEnergy(target, batch_size, anchor_every=vr_every)
        return MinibatchEnergy(target, batch_size)
    if vr_every:
        raise ValueError("vr_every (variance reduction) needs a minibatch energy: set batch_size")
    noise_sd = noise_sd or 0.0
    grad_sd = noise_sd if grad_noise_sd is None else grad_noise_sd
    if noise_sd > 0 or grad_sd > 0:
        return NoisyOracle(target, noise_sd, grad_sd)
    return ExactEnergy(target)
