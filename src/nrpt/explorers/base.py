"""The explorer contract.

An explorer moves every replica with a kernel that leaves its *current slot's* distribution
invariant.  It is one batched call for all replicas of all systems:

    explorer.step(state, b, step_size, density, noise) -> (state, info)

* ``state`` — :class:`ReplicaState` with ``x[R, P, dim]`` (replica-major: ``x[s, r]`` is replica r
  of system s, wherever it sits on the ladder) and the cached path components ``v``, ``base``
  (``[R, P]``, see :mod:`nrpt.paths.ladders`);
* ``b``, ``step_size`` — ``[R, P]``, the slot coefficient and step size of each replica's slot;
* ``density`` — :class:`Density`, evaluates ``(v, base)`` and, on request, gradients: of the
  two path components (:meth:`Density.grad_components`) or of the slot log density
  ``base - b v`` (:meth:`Density.with_grad`);
* ``noise`` — :class:`Noise`, keyed random numbers for this iteration (no generator state).

``info`` is an :class:`ExploreInfo` of per-replica tensors.  Proposals whose log density (or
gradient) is NaN or ±inf are rejected and flagged in ``info.nonfinite``; they never enter the
state.

Sign conventions: ``U = -log pi`` is the energy; the slot log density is
``log pi_p(x) = base(x) - b_p v(x)`` (:mod:`nrpt.paths.ladders`), so ``v = U`` and ``base = 0`` on a
temperature ladder, ``v = -log L`` and ``base = log pi_0`` on a geometric path.

Preparing a state
-----------------
``explorer.prepare(state, density) -> state`` fills the explorer's per-replica caches in
``state.extras`` (default: nothing).  The engine calls it once on the initial states and on
every state it puts into ``state`` from outside the explorer (the fresh reference draws of a
geometric path), so a cache always describes the replica's current ``x``.  ``step`` still
works when the cache is missing (it is then computed first).  Any other code that changes
``state.x`` behind the explorer's back must drop those extras or call ``prepare`` again.

Gradient cache (MALA, HMC): ``extras["grad_v"]`` and ``extras["grad_base"]`` (``[R, P, dim]``)
are the gradients of the two *components* at the replica's ``x``.  They do not depend on the
slot, so they stay valid when the replica changes slot or the schedule is adapted; the step
combines them at the replica's current ``b`` as ``grad log pi_p = grad_base - b grad_v``
(:func:`slot_grad`).

Checking an explorer
--------------------
:func:`nrpt.testing.assert_invariant` runs an explorer alone at a fixed slot (from exact draws
where the target can make them) and compares moments to the truth within a Monte Carlo error
bar: the check the test suite applies to every built-in explorer.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from nrpt import rng
from nrpt.options import Option, check_number, check_numbers, parse_floats

__all__ = ["ReplicaState", "ExploreInfo", "Density", "Noise", "Explorer", "finite_or",
           "slot_grad", "GRAD_KEYS"]

#: the ``extras`` keys of the gradient cache of MALA / HMC (see the module docstring)
GRAD_KEYS = ("grad_v", "grad_base")


@dataclass(frozen=True)
class ReplicaState:
    """Per-replica state.  ``extras`` holds explorer buffers ``[R, P, ...]`` (momentum,
    preconditioner, ...) that belong to the replica and so travel with it across slots."""

    x: torch.Tensor  # [R, P, dim]
    v: torch.Tensor  # [R, P]  tempered part (energy or minus log-likelihood)
    base: torch.Tensor  # [R, P]  untempered part (reference log density, or 0)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)

    def where(self, mask: torch.Tensor, other: ReplicaState) -> ReplicaState:
        """Take ``other`` where ``mask[R, P]`` is true (extras of ``self`` kept if absent)."""

        def pick(a, b):
            m = mask.reshape(mask.shape + (1,) * (a.dim() - mask.dim()))
            return torch.where(m, b, a)

        extras = {k: pick(v, other.extras[k]) if k in other.extras else v
                  for k, v in self.extras.items()}
        return ReplicaState(pick(self.x, other.x), pick(self.v, other.v),
                            pick(self.base, other.base), extras)

    def log_density(self, b: torch.Tensor) -> torch.Tensor:
        return self.base - b * self.v

    replace = replace


@dataclass(frozen=True)
class ExploreInfo:
    accept_prob: torch.Tensor  # [R, P] min(1, alpha) of the proposal (0 when non-finite)
    accepted: torch.Tensor  # [R, P] bool
    nonfinite: torch.Tensor  # [R, P] bool: the proposal had a non-finite density/gradient


def finite_or(t: torch.Tensor, fill: float) -> torch.Tensor:
    return torch.where(torch.isfinite(t), t, torch.full_like(t, fill))


def slot_grad(grad_v: torch.Tensor, grad_base: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``grad log pi_p = grad_base - b grad_v`` for component gradients ``[R, P, dim]`` and the
    per-replica slot coefficient ``b[R, P]``."""
    return grad_base - b[..., None] * grad_v


class Density:
    """Evaluates the path components ``(v, base)`` of a batch of states ``x[..., dim]``, with
    optional gradients (``log pi_p = base - b v``, see :mod:`nrpt.paths.ladders`)."""

    def __init__(self, target, path):
        self.target = target
        self.path = path

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(v, base)``, each of shape ``x.shape[:-1]``; no gradients."""
        with torch.no_grad():
            return self.path.components(self.target, x)

    def grad_components(
        self, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(v, base, grad_v, grad_base)`` for ``x[..., dim]``: the components (shape
        ``x.shape[:-1]``) and their gradients with respect to ``x`` (shape ``x.shape``).

        Independent of ``b``, so the gradients may be cached with a replica and combined at
        whatever slot it sits (:func:`slot_grad`).  Target-supplied gradients are used when
        present: ``grad_energy(x)`` on a temperature ladder (``grad_v = grad U``,
        ``grad_base = 0``), or ``grad_log_likelihood(x)`` and ``grad_reference_log_prob(x)`` on a
        geometric path (``grad_v = -grad log L``, ``grad_base = grad log pi_0``), each
        ``[n, dim]`` for ``x[n, dim]``.  Otherwise autograd, from one forward pass; a component
        that does not depend on ``x`` (``base`` of a temperature ladder) gets a zero gradient
        without a backward pass.  Non-finite values are left for the caller to flag.
        """
        supplied = self._supplied_components(x)
        if supplied is not None:
            return supplied
        with torch.enable_grad():
            xg = x.detach().requires_grad_(True)
            v, base = self.path.components(self.target, xg)
            grads = []
            for i, comp in enumerate((v, base)):
                if not comp.requires_grad:
                    grads.append(torch.zeros_like(x))
                    continue
                keep = i == 0 and base.requires_grad  # the base pass still needs the graph
                (g,) = torch.autograd.grad(comp.sum(), xg, retain_graph=keep, allow_unused=True)
                grads.append(torch.zeros_like(x) if g is None else g.detach())
        return v.detach(), base.detach(), grads[0], grads[1]

    def with_grad(
        self, x: torch.Tensor, b: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(v, base, grad_x (base - b v))`` for ``x[R, P, dim]`` and ``b[R, P]``; non-finite
        gradients are left for the caller.

        One backward pass of the slot log density (autograd), unless the target supplies
        gradients (see :meth:`grad_components`).  The cached explorers (MALA, HMC) use
        :meth:`grad_components` instead, whose gradients do not depend on ``b``."""
        supplied = self._supplied_grad(x, b)
        if supplied is not None:
            return supplied
        with torch.enable_grad():
            xg = x.detach().requires_grad_(True)
            v, base = self.path.components(self.target, xg)
            logp = base - b * v
            (grad,) = torch.autograd.grad(logp.sum(), xg)
        return v.detach(), base.detach(), grad.detach()

    def _supplied_components(self, x):
        """``(v, base, grad_v, grad_base)`` from target-supplied gradients, or None."""
        t, kind = self.target, self.path.kind
        flat = x.reshape(-1, x.shape[-1])
        if kind == "temperature" and hasattr(t, "grad_energy"):
            v, base = self(x)
            g_v = t.grad_energy(flat).to(x.dtype).reshape(x.shape)
            return v, base, g_v, torch.zeros_like(g_v)
        if (kind == "geometric" and hasattr(t, "grad_log_likelihood")
                and hasattr(t, "grad_reference_log_prob")):
            v, base = self(x)
            g_ref = t.grad_reference_log_prob(flat).to(x.dtype).reshape(x.shape)
            g_ll = t.grad_log_likelihood(flat).to(x.dtype).reshape(x.shape)
            return v, base, -g_ll, g_ref  # v = -log L
        return None

    def _supplied_grad(self, x, b):
        """``(v, base, grad (base - b v))`` from target-supplied gradients, or None."""
        comps = self._supplied_components(x)
        if comps is None:
            return None
        v, base, g_v, g_base = comps
        return v, base, slot_grad(g_v, g_base, b)


class Noise:
    """Random numbers for one iteration, drawn with the full ``[R, P, ...]`` shape from
    generators keyed by (seed, stream, iteration, sub-step) -- see :mod:`nrpt.rng`.

    ``block`` (a :class:`nrpt.rng.Block`) is the slice of replicas this process holds
    (:mod:`nrpt.core.sharding`); ``P`` is then the local width and every draw is made at the
    full width and sliced, so a replica gets the same numbers however replicas are spread over
    processes.  Explorers that draw through this object (or through :meth:`key`) need no other
    care."""

    def __init__(self, seed: int, iteration: int, R: int, P: int, device: torch.device,
                 block: rng.Block | None = None, count: int = 0):
        self.seed, self.iteration = int(seed), int(iteration)
        if block is not None and block.width != P:
            raise ValueError(f"noise for {P} replicas but {block!r}")
        self.R, self.P, self.device, self.block = R, P, device, block
        #: > 0: every draw is that of ``count`` consecutive iterations, stacked (the fused
        #: loop's chunks, :mod:`nrpt.core.fused`)
        self.count = int(count)

    def normal(self, sub: int, tail: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return rng.iteration_normal((self.R, self.P, *tail), self.seed, rng.Stream.EXPLORE,
                                    self.iteration, sub, dtype=dtype, device=self.device,
                                    block=self.block, count=self.count)

    def uniform(self, sub: int, dtype: torch.dtype, tail: tuple[int, ...] = (),
                parts: tuple[int, ...] = ()) -> torch.Tensor:
        """Uniforms ``[R, P, *tail]``; ``parts`` extend the key (default: the ACCEPT stream's
        ``(iteration, sub)``; with ``parts``, the EXPLORE stream's ``(iteration, sub, *parts)``)."""
        stream = rng.Stream.EXPLORE if parts else rng.Stream.ACCEPT
        return rng.iteration_uniform((self.R, self.P, *tail), self.seed, stream, self.iteration,
                                     sub, *parts, dtype=dtype, device=self.device,
                                     block=self.block, count=self.count)

    def key(self, *parts: int) -> rng.Key:
        """``(seed, iteration, *parts)`` as a :class:`nrpt.rng.Key` carrying this block (the
        key handed to stochastic-gradient energy estimators)."""
        return rng.Key((self.seed, self.iteration, *parts), self.block, self.count)


def _step_size(name, value, cfg=None):
    """A number > 0, or one per slot (``cfg.chains`` of them)."""
    if isinstance(value, list | tuple):
        out = check_numbers(name, value, cfg.chains)
        for i, v in enumerate(out):
            check_number(f"{name}[{i}]", v, 0.0, strict=True)
        return out
    return check_number(name, value, 0.0, strict=True)


def _parse_step(text: str):
    vals = parse_floats(text)
    return vals[0] if len(vals) == 1 else vals


_parse_step.what = "a number or comma-separated numbers"  # type: ignore[attr-defined]

#: the step size of the exact explorers (the slice width of ``slice``)
STEP_SIZE = Option("step_size", _step_size, default=0.35, section="explorer", parse=_parse_step,
                   why="step_size is for {who}; a stochastic-gradient explorer takes learning "
                       "rates: lr_min/lr_max or learning_rates",
                   help="exact explorers: step size at slot 0 (scaled by sqrt(tau) up a "
                        "temperature ladder), or one per slot, comma-separated")


class Explorer:
    """Base class; subclasses implement :meth:`step` and, if they keep per-replica caches,
    :meth:`prepare` (see the module docstring)."""

    name = ""
    #: the settings this explorer reads (:class:`nrpt.options.Option`)
    options: tuple[Option, ...] = ()
    uses_gradient = False
    #: how many keyed sub-streams one step consumes (so repeated steps don't reuse noise)
    substeps = 1
    #: step-size tuning (``adapt_step_size``): the acceptance aimed at by default and the order
    #: ``k`` of the step in the spread of the log acceptance ratio (:mod:`nrpt.adapt.step`);
    #: ``None``: the explorer has no acceptance to tune toward
    target_acceptance: float | None = None
    acceptance_order: int | None = None
    #: every step makes the same draws whatever the state, so :mod:`nrpt.explorers.compiled`
    #: can record and replay them (and :mod:`nrpt.core.fused` can run chunks of steps); read
    #: from the class that defines ``step`` (a subclass re-defining it declares it again)
    compilable = False

    def step_adaptor(self, target_acceptance: float | None = None, *, phase: str | None = None,
                     follow=None):
        """The adaptor that tunes this explorer's step sizes (``adapt_step_size``), or
        ``None``: the default, under which an explorer that declares :attr:`acceptance_order`
        is tuned toward :attr:`target_acceptance` (or the one given) by
        :class:`nrpt.adapt.rounds.StepSizeAdaptor` (:func:`nrpt.adapt.rounds.own_tuning`), and
        any other refuses ``adapt_step_size``.  ``phase="warm-up"``: between the warm-up
        windows of a fixed-length run; ``None``: between adaptive rounds.  ``follow``: the
        schedule adaptor whose re-fitted temperatures the steps follow."""
        return None

    def prepare(self, state: ReplicaState, density: Density) -> ReplicaState:
        """Fill this explorer's caches in ``state.extras`` for the current ``state.x``
        (``[R, P, ...]`` tensors); the default has none and returns ``state`` unchanged."""
        return state

    def step(self, state, b, step_size, density, noise, sub=0):  # pragma: no cover - interface
        """Move every replica once at its slot's ``b[R, P]`` and ``step_size[R, P]``;
        returns ``(state, ExploreInfo)``."""
        raise NotImplementedError

    def describe(self) -> dict:
        return {"name": self.name}
