"""The contracts of nrpt's roles, in one file to read first.

A run composes six roles around one engine and one loop (:mod:`nrpt.core.loop`)::

    path       what each slot targets: log pi_p = base - b_p V           (nrpt.paths.ladders)
    explorer   moves every replica at its slot's parameters              (nrpt.explorers)
    scheme     which slot pairs may swap at iteration k                  (nrpt.swap.schemes)
    rule       how a proposed pair decides, from scalars                 (nrpt.swap.rules / noisy)
    adaptor    sees an iteration (or a finished segment), returns an Update
    recorder   records every iteration, reduces to summary fields, checkpoints itself

One iteration of the loop::

    it = engine.step()                      # explore, refresh the reference, swap -> Iteration
    for a in adaptors: engine.apply(a.observe(it))     # online adaptation (may return None)
    for r in recorders: r.record(it)

and at the end of a segment (a round, a tuning phase, the whole run)::

    for a in adaptors: engine.apply(a.end_segment(view))   # between-round changes

**No adaptor writes into another object**: the engine owns every tunable parameter (schedule,
step sizes, the rule's parameters such as the buffer ``C`` or the per-slot energy variance, the
scheme's window) and changes them only through :meth:`PTEngine.apply`.  Rules are stateless:
they read their parameters from :attr:`SwapContext.params`.

Shapes: ``R`` independent systems, ``P`` slots; per-replica tensors are ``[R, P, ...]`` in
replica order, per-slot tables ``[R, P]`` in slot order, per-pair tables ``[R, P-1]`` indexed by
the pair's lower slot.  Sign convention: energy ``U = -log pi``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Protocol, runtime_checkable

import torch

from nrpt import rng
from nrpt.options import Option

__all__ = ["Explorer", "Scheme", "Rule", "Path", "SwapContext", "ReplicaState", "ExploreInfo",
           "Density", "Noise", "PhaseDecision", "Iteration", "IterationBlock", "Update",
           "SegmentView", "Adaptor", "Recorder", "RowMap", "Phase", "adjacent_pairs", "is_sweep",
           "slot_grad", "swap_log_ratio", "BlockAdaptor", "BLOCK", "SlotMap"]

#: iterations per block: the fused loop's chunk (:mod:`nrpt.core.fused`), and the groups in
#: which :class:`nrpt.recorders.stats.SlotSpread` merges its rows
BLOCK = 8

# The roles' base types (re-exported by nrpt.explorers.base, nrpt.paths.ladders,
# nrpt.swap.rules, nrpt.swap.schemes).

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
            m = mask if a.dim() == mask.dim() else \
                mask.reshape(mask.shape + (1,) * (a.dim() - mask.dim()))
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
        if not torch.is_grad_enabled():  # (inference mode, the loop's usual state)
            return self.path.components(self.target, x)
        with torch.no_grad():
            return self.path.components(self.target, x)

    def grad_components(
        self, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(v, base, grad_v, grad_base)`` for ``x[..., dim]``: the components (shape
        ``x.shape[:-1]``) and their gradients with respect to ``x`` (shape ``x.shape``).

        Independent of ``b`` (combine with :func:`slot_grad`).  Uses the target's
        ``grad_energy`` (temperature ladder) or ``grad_log_likelihood`` and
        ``grad_reference_log_prob`` (geometric path), each ``[n, dim]`` for ``x[n, dim]``, when
        present; otherwise autograd (a component independent of ``x`` gets zeros).  Non-finite
        values are left for the caller to flag.
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
        """``(v, base, grad_x (base - b v))`` for ``x[R, P, dim]`` and ``b[R, P]`` (target-supplied
        gradients as in :meth:`grad_components`, else one backward pass); non-finite gradients
        are left for the caller."""
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

    ``block`` (a :class:`nrpt.rng.Block`): the replicas this process holds; ``P`` is then the
    local width and draws are made at full width and sliced."""

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
    #: takes a per-slot preconditioner: ``step(..., metric=M)`` with ``M`` per replica either
    #: ``[R, P, dim]`` (a diagonal scale ``s``: moves in ``z`` where ``x = s * z``) or
    #: ``[R, P, dim, dim]`` (a lower-triangular ``L``: ``x = L z``), see
    #: :func:`nrpt.explorers.base.metric_mul`; the engine passes ``metric`` only when a run
    #: has one (``None``: identity), so an explorer without the keyword keeps working
    preconditionable = False

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


def swap_log_ratio(
    b_lo: torch.Tensor, b_hi: torch.Tensor, v_lo: torch.Tensor, v_hi: torch.Tensor
) -> torch.Tensor:
    """Eq. (1): log acceptance ratio of exchanging the replicas at two slots.

    ``b_lo``/``v_lo`` belong to the slot nearer the target (larger ``b``).  Non-finite energies
    give ``-inf`` (the swap is rejected), never NaN.
    """
    out = (b_lo - b_hi) * (v_lo - v_hi)
    return torch.nan_to_num(out, nan=-math.inf, posinf=math.inf, neginf=-math.inf)


class Path:
    """Base class.  ``schedule`` is the tensor of slot coefficients ``b`` (shape [P])."""

    kind: str = ""
    has_reference: bool = False

    def __init__(self, schedule: Sequence[float]):
        self.schedule = torch.tensor(list(schedule), dtype=torch.float64)

    @property
    def n_slots(self) -> int:
        return int(self.schedule.numel())

    def components(self, target, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(V, base)`` for states ``x[..., dim]`` (leading dims are flattened for the target)."""
        raise NotImplementedError

    def describe(self) -> dict:
        raise NotImplementedError


@dataclass(frozen=True)
class SwapContext:
    b_lo: torch.Tensor  # slot coefficient of the lower slot (nearer the target)
    b_hi: torch.Tensor
    v_lo: torch.Tensor  # tempered energy of the replica at the lower slot
    v_hi: torch.Tensor
    #: Uniform(0, 1) per pair, or a function that draws them on first use of :attr:`u` (the
    #: deterministic rule never reads them, so they are not drawn for it)
    uniform_or_draw: torch.Tensor | Callable[[], torch.Tensor]
    iteration: int
    lo: torch.Tensor | None = None  # the pairs' slots [R, M] (for per-slot parameters)
    hi: torch.Tensor | None = None
    params: dict[str, torch.Tensor] = field(default_factory=dict)  # the rule's parameters

    @property
    def u(self) -> torch.Tensor:
        """The pairs' keyed Uniform(0, 1) numbers ``[R, M]``."""
        u = self.uniform_or_draw
        if callable(u):
            u = u()
            object.__setattr__(self, "uniform_or_draw", u)
        return u

    @property
    def log_ratio(self) -> torch.Tensor:
        return swap_log_ratio(self.b_lo, self.b_hi, self.v_lo, self.v_hi)


class Rule:
    name = ""
    #: the settings this rule reads (:class:`nrpt.options.Option`)
    options: tuple[Option, ...] = ()
    #: False for rules that do not target the tempered product distribution
    exact = True
    #: False for rules whose verdicts ignore the states (``always``, ``fixed-rate``): under such
    #: a rule DEO_W's one-swap-per-window gate is a fixed function of the verdicts' own coins
    #: and biases nothing (:func:`nrpt.swap.schemes.check_gate`)
    state_dependent = True

    def initial_params(self, R: int, P: int, dtype=torch.float64) -> dict[str, torch.Tensor]:
        """The rule's tunable parameters (owned by the engine), e.g. ``{"C": [R, 1]}``."""
        return {}

    def decide(self, ctx: SwapContext) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def describe(self) -> dict:
        return {"rule": self.name}


Phase = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


_ADJACENT: dict[tuple, tuple[torch.Tensor, ...]] = {}


def is_sweep(lo: torch.Tensor, R: int, P: int) -> bool:
    """Whether a phase's pairs ``lo`` are all ``P - 1`` adjacent pairs in slot order (SEO, DEO,
    DEO_W return the cached ``lo`` of :func:`adjacent_pairs` itself): per-pair tensors of such a
    phase are already in pair order, so the engine, the indicators and the swap counters use
    them as they are (slices and adds instead of gathers and scatters)."""
    return lo is adjacent_pairs(R, P, lo.device)[0]


def adjacent_pairs(R: int, P: int, device) -> tuple[torch.Tensor, ...]:
    """``(lo, hi, even, odd)``: the adjacent pairs ``[R, P-1]`` and the masks of even / odd
    ``lo``, made once per shape and device (read-only: schemes hand them out as they are)."""
    key = (R, P, str(device))
    got = _ADJACENT.get(key)
    if got is None:
        with torch.inference_mode(False):  # a cache outlives the run: never inference tensors
            lo = torch.arange(P - 1, device=device).expand(R, P - 1)
            got = _ADJACENT[key] = (lo, lo + 1, lo % 2 == 0, lo % 2 == 1)
    return got


class Scheme:
    name = ""
    #: the settings this scheme reads (:class:`nrpt.options.Option`)
    options: tuple[Option, ...] = ()
    #: False for a scheme that never proposes a swap (no swap statistics, no predictions)
    proposes_swaps = True

    def predicted_rates(self, rejection, window: int = 1) -> dict | None:
        """The theory's long-run event rates per 1000 iterations under independent swap
        rejections ``rejection[P - 1]`` (the keys of
        :func:`nrpt.diagnostics.theory.predicted_rates`), or ``None``: no prediction for this
        scheme.  The built-in schemes solve the exact chain of their clock (slow for thousands
        of slots; see :meth:`closed_form_restarts`)."""
        return None

    def closed_form_restarts(self, rejection, window: int = 1) -> float | None:
        """Restarts per 1000 iterations in closed form (cheap at any ``P``), or ``None``."""
        return None

    def init_state(self, R: int, P: int, device) -> dict[str, torch.Tensor]:
        return {}

    def phases(self, k: int, R: int, P: int, seed: int, systems: torch.Tensor,
               state: dict) -> list[Phase]:
        raise NotImplementedError

    def after_phase(self, k: int, state: dict, lo: torch.Tensor, accepted: torch.Tensor) -> None:
        """Update scheme state after a phase (``accepted[R, M]`` for pairs ``lo[R, M]``)."""

    # -- the block form (the fused loop, :mod:`nrpt.core.fused`): a scheme of one phase over
    # all adjacent pairs, run for a block of ``U`` iterations as pure functions of tensors
    def block_inputs(self, k0: int, U: int, R: int, seed: int, device) -> dict:
        """Everything :meth:`block_phase` needs for iterations ``k0 .. k0 + U - 1``, made
        outside the block (tensors with a leading ``[U]`` axis)."""
        raise NotImplementedError(f"scheme {self.name!r} has no block form")

    def block_phase(self, pairs: tuple, inputs: dict, u: int, state: dict
                    ) -> tuple[torch.Tensor, dict]:
        """``(active[R, P-1], state)`` of the block's iteration ``u``: which of the adjacent
        ``pairs`` (:func:`adjacent_pairs`) may swap, and the scheme state (out of place) the
        phase ran with; what :meth:`phases` and :meth:`after_phase` do, per iteration."""
        raise NotImplementedError(f"scheme {self.name!r} has no block form")

    def block_after(self, state: dict, accepted: torch.Tensor) -> dict:
        """The scheme state after the phase's ``accepted[R, P-1]`` (out of place)."""
        return state

    def block_active(self, pairs: tuple, inputs: dict, U: int) -> torch.Tensor | None:
        """Every iteration's ``active`` of the block at once, ``[U, R, P-1]``, where the masks
        depend on no scheme state (the eager chunk's lean form reads them per chunk;
        :func:`nrpt.core.fused.block_active` trusts it only from the class that defines
        :meth:`block_phase`); ``None``: per iteration, from :meth:`block_phase`."""
        return None

    def describe(self) -> dict:
        return {"scheme": self.name}


@dataclass(frozen=True)
class PhaseDecision:
    """One swap phase: pairs ``(lo, hi)`` ``[R, M]``, whether the scheme proposed them
    (``active``), the rule's verdict for every listed pair (``decision``, active or not), what was
    executed (``accepted = decision & active``) and the acceptance probability ``prob``."""

    lo: torch.Tensor
    hi: torch.Tensor
    active: torch.Tensor
    decision: torch.Tensor
    accepted: torch.Tensor
    prob: torch.Tensor


@dataclass
class Iteration:
    """What one engine step did, handed to adaptors and recorders (read-only by contract).

    ``k`` is the iteration just completed (0-based).  ``state``, ``slot_of``, ``replica_at``,
    ``schedule`` (b per slot), ``step_size`` (per slot) and ``params`` (the rule's parameters)
    are the engine's values *after* the swaps.  ``explore_accept`` and ``nonfinite`` are per
    slot ``[R, P]``: the mean acceptance probability of the explorer steps made at each slot
    this iteration, and the count of rejected non-finite proposals.

    Positions are read with :meth:`slot_x`, never ``state.x``: when replicas are sharded,
    ``state`` holds only the gathered scalars (``v``, ``base``, ``[R, P]`` extras) and
    :meth:`slot_x` is a collective."""

    k: int
    state: ReplicaState
    slot_of: torch.Tensor
    replica_at: torch.Tensor
    schedule: torch.Tensor
    step_size: torch.Tensor
    params: dict[str, torch.Tensor]
    explore_accept: torch.Tensor
    nonfinite: torch.Tensor
    decisions: list[PhaseDecision]
    has_reference: bool = False
    #: the engine's row fetcher when replicas are spread over processes (slots -> positions)
    rows: Callable[[list[int]], torch.Tensor] | None = None
    #: the per-iteration values below, computed once and shared by every reader (a plain dict:
    #: torch.compile cannot trace the lock of a cached property, and the fused loop's adaptors
    #: read them inside a compiled chunk)
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def _once(self, name: str, make):
        if name not in self._cache:
            self._cache[name] = make()
        return self._cache[name]

    def slot_x(self, slots: Sequence[int]) -> torch.Tensor:
        """Positions ``[R, S, dim]`` of the replicas at ``slots`` (S slot indices, the same for
        every system)."""
        slots = list(slots)
        if self.rows is not None:
            return self.rows(slots)
        rep = self.replica_at[:, slots]
        x = self.state.x
        return x.gather(1, rep[..., None].expand(*rep.shape, x.shape[-1]))

    @property
    def R(self) -> int:
        return self.slot_of.shape[0]

    @property
    def P(self) -> int:
        return self.slot_of.shape[1]

    def at_slots(self, t: torch.Tensor) -> torch.Tensor:
        """A per-replica tensor ``[R, P, ...]`` put in slot order."""
        idx = self.replica_at
        if t.dim() > 2:
            idx = idx.reshape(*idx.shape, *([1] * (t.dim() - 2))).expand_as(t)
        return t.gather(1, idx)

    @property
    def slot_energies(self) -> torch.Tensor:
        """``V`` of the replica at each slot, ``[R, P]``."""
        return self._once("slot_energies", lambda: self.at_slots(self.state.v))

    @property
    def pair_indicators(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(A[R, P-1], listed[R, P-1])``: the 0/1 verdict of every adjacent pair listed in some
        phase (active or not) and which pairs were listed.  Computed once per iteration and
        shared by every adaptor and recorder that reads it."""
        return self._once("pair_indicators", self._pair_indicators)

    def _pair_indicators(self) -> tuple[torch.Tensor, torch.Tensor]:
        R, P, dt = self.R, self.P, self.schedule.dtype
        ds = self.decisions
        if len(ds) == 1 and is_sweep(ds[0].lo, R, P):  # SEO/DEO/DEO_W: every pair, in order
            return ds[0].decision.to(dt), torch.ones_like(ds[0].active)
        dev = self.slot_of.device
        A = torch.zeros(R, P - 1, dtype=dt, device=dev)
        listed = torch.zeros(R, P - 1, dtype=torch.bool, device=dev)
        for d in ds:
            adj = (d.hi - d.lo) == 1
            lo = torch.where(adj, d.lo, torch.zeros_like(d.lo))
            A.scatter_add_(1, lo, (d.decision & adj).to(dt))
            listed.scatter_(1, lo, adj | listed.gather(1, lo))
        return A, listed

    @property
    def attempted_indicators(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(A[R, P-1], attempted[R, P-1])``: the verdicts of the adjacent pairs the scheme
        allowed to swap this iteration (active: right parity, gate open), zero elsewhere, and
        which those were.  Computed once per iteration, like :attr:`pair_indicators`."""
        return self._once("attempted_indicators", self._attempted_indicators)

    def _attempted_indicators(self) -> tuple[torch.Tensor, torch.Tensor]:
        A, _ = self.pair_indicators
        ds = self.decisions
        if len(ds) == 1 and is_sweep(ds[0].lo, self.R, self.P):
            return A * ds[0].active, ds[0].active
        attempted = torch.zeros_like(A, dtype=torch.bool)
        for d in self.decisions:
            adj = (d.hi - d.lo) == 1
            lo = torch.where(adj, d.lo, torch.zeros_like(d.lo))
            attempted.scatter_(1, lo, (d.active & adj) | attempted.gather(1, lo))
        return A * attempted, attempted


@dataclass
class IterationBlock:
    """``U`` consecutive iterations ``k0 .. k0 + U - 1`` stacked on a leading axis: what the
    fused loop (:mod:`nrpt.core.fused`) hands to :meth:`Recorder.record_block` instead of ``U``
    :class:`Iteration` objects (one phase per iteration over all ``P - 1`` adjacent pairs).

    Fields mean what the :class:`Iteration` fields of the same name mean, per iteration ``u``:
    ``v``, ``base``, ``slot_of``, ``replica_at``, ``schedule``, ``step_size``,
    ``explore_accept``, ``nonfinite`` ``[U, R, P]``; ``params`` name -> ``[U, ...]`` (after the
    iteration's adaptors); the phase's ``active``, ``decision``, ``accepted``, ``prob``
    ``[U, R, P - 1]``; ``slot_x[U, R, S, dim]`` the positions at the ``watched`` slots."""

    k0: int
    v: torch.Tensor
    base: torch.Tensor
    slot_of: torch.Tensor
    replica_at: torch.Tensor
    schedule: torch.Tensor
    step_size: torch.Tensor
    params: dict[str, torch.Tensor]
    explore_accept: torch.Tensor
    nonfinite: torch.Tensor
    active: torch.Tensor
    decision: torch.Tensor
    accepted: torch.Tensor
    prob: torch.Tensor
    slot_x: torch.Tensor
    watched: list[int]
    has_reference: bool = False

    @property
    def U(self) -> int:
        return self.v.shape[0]

    @cached_property
    def slot_energies(self) -> torch.Tensor:
        """``V`` of the replica at each slot, ``[U, R, P]``."""
        return self.v.gather(2, self.replica_at)

    def watched_x(self, slots: Sequence[int], view: bool = False) -> torch.Tensor:
        """Positions ``[U, R, S, dim]`` at ``slots`` (all of them watched slots): :attr:`slot_x`
        itself where they are all the watched slots in order, else a copy (contiguous), or
        with ``view`` a view of it where they are consecutive watched slots (for readers that
        copy the rows or reduce them elementwise: the layout does not change their numbers)."""
        pos = [self.watched.index(int(s)) for s in slots]
        if pos == list(range(len(self.watched))):
            return self.slot_x
        if view and pos and pos == list(range(pos[0], pos[0] + len(pos))):
            return self.slot_x[:, :, pos[0]:pos[0] + len(pos)]
        return self.slot_x[:, :, pos]

    def iteration(self, u: int) -> Iteration:
        """Iteration ``k0 + u`` as an :class:`Iteration` (for recorders without a block form;
        positions only at the watched slots, through ``Iteration.rows``)."""
        R, P = self.slot_of.shape[1:]
        lo, hi, _, _ = adjacent_pairs(R, P, self.slot_of.device)
        x = torch.empty((R, P, self.slot_x.shape[-1]), dtype=self.v.dtype, device="meta")
        decision = PhaseDecision(lo, hi, self.active[u], self.decision[u], self.accepted[u],
                                 self.prob[u])
        return Iteration(k=self.k0 + u, state=ReplicaState(x, self.v[u], self.base[u]),
                         slot_of=self.slot_of[u], replica_at=self.replica_at[u],
                         schedule=self.schedule[u], step_size=self.step_size[u],
                         params={n: t[u] for n, t in self.params.items()},
                         explore_accept=self.explore_accept[u], nonfinite=self.nonfinite[u],
                         decisions=[decision], has_reference=self.has_reference,
                         rows=lambda slots: self.watched_x(slots)[u])


@dataclass(frozen=True)
class SlotMap:
    """How a ladder of ``old`` slots grew to ``new`` (``chains = "auto"``, between rounds),
    or shrank to ``new < old`` (:meth:`shrink`, ``min_chains``).

    ``source[j]`` (``[new]``, non-decreasing, onto ``0 .. old - 1``): the old slot whose
    replica new slot ``j`` copies; ``primary[s]`` (``[old]``): the new slot that old slot ``s``'s
    replica moves to (``0 -> 0``, ``old - 1 -> new - 1``), keeping its identity; the other new
    slots get new replicas ``old .. new - 1`` in slot order (copies of their source's state).
    Whatever keeps a per-slot table follows the ladder through ``follow_ladder(slot_map)``
    (adaptors, recorders); a run with one that cannot is refused ``chains = "auto"``."""

    old: int
    new: int
    source: tuple[int, ...]
    primary: tuple[int, ...]
    #: a shrink only, filled in by the engine (:meth:`~nrpt.core.engine.PTEngine.resize`):
    #: per system, the old replica each new replica ``j`` was (the one at old slot
    #: ``source[j]``); ``None`` for a growth (the replicas keep their numbers)
    replicas: tuple[tuple[int, ...], ...] | None = None

    @property
    def shrinks(self) -> bool:
        """Whether this map shortens the ladder (``new < old``)."""
        return self.new < self.old

    @staticmethod
    def grow(old: int, new: int) -> SlotMap:
        """The map of ``old`` slots onto ``new >= old`` by rank: ``source[j] = round(j (old - 1)
        / (new - 1))``, every old slot kept (its first new slot its primary one, the top's
        the new top)."""
        old, new = int(old), int(new)
        if old < 2 or new < old:
            raise ValueError(f"a ladder grows from >= 2 slots to at least as many; got {old} -> "
                             f"{new}")
        source = tuple(int(math.floor(j * (old - 1) / (new - 1) + 0.5)) for j in range(new))
        primary = [source.index(s) for s in range(old)]
        primary[-1] = new - 1
        return SlotMap(old, new, source, tuple(primary))

    @staticmethod
    def shrink(old: int, new: int) -> SlotMap:
        """The map of ``old`` slots onto ``2 <= new < old`` by rank: new slot ``j`` keeps the
        replica of old slot ``source[j] = round(j (old - 1) / (new - 1))`` (strictly increasing:
        slot ``0`` and the top are kept); the other replicas are dropped.  ``primary[s]``: the
        new slot that old slot ``s``'s per-slot tables fold into (a kept slot its own, a dropped
        one the nearest kept slot by rank)."""
        old, new = int(old), int(new)
        if new < 2 or new >= old:
            raise ValueError(f"a ladder shrinks from some slots to fewer, at least 2; got {old} "
                             f"-> {new}")
        source = tuple(int(math.floor(j * (old - 1) / (new - 1) + 0.5)) for j in range(new))
        primary = tuple(int(min(range(new), key=lambda j: (abs(source[j] - s), j)))
                        for s in range(old))
        return SlotMap(old, new, source, primary)

    @property
    def added(self) -> tuple[int, ...]:
        """The new slots holding new replicas (``old .. new - 1``, in this order)."""
        keep = set(self.primary)
        return tuple(j for j in range(self.new) if j not in keep)


@dataclass(frozen=True)
class Update:
    """Changes an adaptor asks the engine to make (``None`` fields: no change).

    ``schedule`` / ``step_size``: new per-slot tables ``[R, P]``; ``params``: new values of the
    rule's parameters (e.g. ``{"C": [R, 1]}``); ``window``: switch the scheme to DEO_W with this
    window (the tuning segment of ``window = "auto"``); ``note``: free-form facts for the report
    (e.g. the measured rejection rate behind a window); ``reference``: a newly fitted reference
    for the hot end (refused by an engine whose path has none).  The engine takes the tables
    without copying: an adaptor must not change them in place afterwards."""

    schedule: torch.Tensor | None = None
    step_size: torch.Tensor | None = None
    params: dict[str, torch.Tensor] = field(default_factory=dict)
    window: int | None = None
    note: dict[str, Any] = field(default_factory=dict)
    #: a fitted reference ``(q, refitted[R])``
    reference: tuple[Any, torch.Tensor] | None = None
    #: a new per-slot preconditioner: ``[R, P, dim]`` diagonal scales or ``[R, P, dim, dim]``
    #: lower-triangular factors (the engine's ``metric``, for explorers that declare
    #: ``preconditionable``)
    metric: torch.Tensor | None = None
    #: a ladder of another length ``(schedule [R, P'], slot map)`` (``chains = "auto"``): the
    #: engine grows or shrinks to it (:meth:`~nrpt.core.engine.PTEngine.apply` returns the
    #: completed map), then everything keeping per-slot tables follows (:class:`SlotMap`)
    resize: tuple[torch.Tensor, SlotMap] | None = None


@runtime_checkable
class RowMap(Protocol):
    """How the engine's rows make up the user's systems where they are not one to one (e.g. a
    reference annealed on two ladders per system): ``Run.facts["row_map"]``, asked by the run's
    outputs instead of their slicing rows.  ``chains`` cuts the recorded draws (``samples`` /
    ``energies`` ``[E, n, ...]``, ``index`` ``[K + 1, E, P]``) to the user's chains, the engine
    rows :attr:`chain_rows`; ``row_label(i)`` names engine row ``i``; ``summary`` / ``findings``
    / ``text`` are the summary's fields, health findings and text lines of its own;
    ``posterior_parts(value, R)`` splits a per-system summary value into ``(suffix, value,
    label)`` variables of ``posterior.nc``, whose index-process statistics carry
    ``index_note``."""

    chain_rows: slice
    index_note: str

    def chains(self, arrays: dict) -> dict: ...

    def row_label(self, i: int) -> str: ...

    def summary(self, run) -> dict: ...

    def findings(self, run) -> list: ...

    def text(self, s: dict, scalar) -> list[str]: ...

    def posterior_parts(self, value, R: int) -> list: ...


@dataclass(frozen=True)
class SegmentView:
    """What adaptors see at the end of a segment: the segment's index and the recorders by
    name (read their reductions, e.g. ``recorders["swaps"].rejection()``), plus the engine's
    current tables."""

    index: int
    name: str
    iterations: int
    last: bool
    recorders: dict[str, Any]
    schedule: torch.Tensor
    step_size: torch.Tensor
    params: dict[str, torch.Tensor]
    #: the engine's per-slot preconditioner (``None``: identity)
    metric: torch.Tensor | None = None


@runtime_checkable
class Adaptor(Protocol):
    """Tunes the ladder.  ``observe`` runs after every iteration (online stochastic
    approximation), ``end_segment`` between segments (rounds); both return an :class:`Update`
    or ``None``.  ``state_dict`` / ``load_state_dict`` make it resumable."""

    name: str

    def observe(self, it: Iteration) -> Update | None: ...

    def end_segment(self, view: SegmentView) -> Update | None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, sd: dict) -> None: ...


class BlockAdaptor(Adaptor, Protocol):
    """An online adaptor's *block form* (the fused loop, :mod:`nrpt.core.fused`):
    ``block_inputs(k0, U)`` -- one number per iteration ``k0 .. k0 + U - 1`` (e.g. the
    stochastic-approximation step size), made outside the block -- and ``observe_block(it, x)``
    -- :meth:`Adaptor.observe` given that iteration's number ``x`` (a 0-d tensor), pure,
    returning ``[R, P]`` tables and rule parameters only.  ``observe(it)`` must equal
    ``observe_block(it, block_inputs(it.k, 1)[0])``."""

    def block_inputs(self, k0: int, U: int) -> list[float]: ...

    def observe_block(self, it: Iteration, x: torch.Tensor) -> Update: ...


@runtime_checkable
class Recorder(Protocol):
    """Watches every iteration.  ``start_segment(reset)`` is called before each segment
    (``reset``: the segment starts fresh statistics, e.g. a new round); ``summary()`` returns
    JSON-ready summary fields (of the statistics since the last reset; ``length`` is the
    segment's number of iterations); ``segment_row()`` the fields of the per-segment report row.
    ``state_dict`` / ``load_state_dict`` make it resumable."""

    name: str

    def start_segment(self, reset: bool, length: int) -> None: ...

    def record(self, it: Iteration) -> None: ...

    def record_block(self, block: IterationBlock) -> None: ...

    def summary(self) -> dict[str, Any]: ...

    def segment_row(self) -> dict[str, Any]: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, sd: dict) -> None: ...


class AdaptorBase:
    """Convenience base: no-op ``observe`` / ``end_segment`` and an empty state."""

    name = "adaptor"

    def observe(self, it: Iteration) -> Update | None:
        return None

    def block_inputs(self, k0: int, U: int) -> list[float]:
        """(:class:`BlockAdaptor`; an adaptor with a per-iteration ``observe`` and no block
        form is not fused)"""
        raise NotImplementedError(f"adaptor {self.name!r} has no block form")

    def observe_block(self, it: Iteration, x: torch.Tensor) -> Update:
        raise NotImplementedError(f"adaptor {self.name!r} has no block form")

    def end_segment(self, view: SegmentView) -> Update | None:
        return None

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, sd: dict) -> None:
        pass


class RecorderBase:
    """Convenience base: no-op hooks and an empty state."""

    name = "recorder"
    #: slots whose positions :meth:`record` reads every iteration (``Iteration.slot_x``); the
    #: builder declares them to the engine, which, when replicas are spread over processes,
    #: fetches all of them with one gather per iteration
    reads_slots: tuple[int, ...] = ()

    def start_segment(self, reset: bool, length: int = 0) -> None:
        pass

    def record(self, it: Iteration) -> None:
        pass

    def record_block(self, block: IterationBlock) -> None:
        """Record ``block.U`` iterations at once (the fused loop, :mod:`nrpt.core.fused`); the
        default records them one by one, and a recorder may do it with batched ops (the result
        equal to :meth:`record` per iteration, up to the order of floating-point sums)."""
        for u in range(block.U):
            self.record(block.iteration(u))

    def summary(self) -> dict[str, Any]:
        return {}

    def segment_row(self) -> dict[str, Any]:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, sd: dict) -> None:
        pass
