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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol, runtime_checkable

import torch

from nrpt.explorers.base import Density, ExploreInfo, Explorer, Noise, ReplicaState
from nrpt.paths.ladders import Path
from nrpt.swap.rules import Rule, SwapContext
from nrpt.swap.schemes import Scheme, adjacent_pairs, is_sweep

__all__ = ["Explorer", "Scheme", "Rule", "Path", "SwapContext", "ReplicaState", "ExploreInfo",
           "Density", "Noise", "PhaseDecision", "Iteration", "IterationBlock", "Update",
           "SegmentView", "Adaptor", "Recorder", "RowMap", "BlockAdaptor", "BLOCK"]

#: iterations per block: the fused loop's chunk (:mod:`nrpt.core.fused`), and the groups in
#: which :class:`nrpt.recorders.stats.SlotSpread` merges its rows
BLOCK = 8


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

    Positions are read with :meth:`slot_x` (never ``state.x`` directly): when replicas are
    spread over processes (:mod:`nrpt.core.sharding`), ``state`` holds the gathered per-replica
    scalars (``v``, ``base``, ``[R, P]`` buffers of ``extras``) but not the positions, and
    :meth:`slot_x` fetches the rows it is asked for (a collective: every process's recorders
    ask for the same rows)."""

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
    :class:`Iteration` objects.  Only single-phase sweep schemes (SEO, DEO, DEO_W) are fused, so
    there is one phase per iteration and its pairs are all ``P - 1`` adjacent pairs in order.

    Every field has the meaning of the :class:`Iteration` field of the same name, per iteration
    ``u``: ``v``, ``base`` ``[U, R, P]`` (replica order, after the swaps), ``slot_of``,
    ``replica_at`` ``[U, R, P]``, ``schedule`` and ``step_size`` ``[U, R, P]`` (the tables the
    iteration ran with), ``params`` (name -> ``[U, ...]``, after the iteration's adaptors, as
    ``Iteration.params`` is read by recorders), ``explore_accept`` and ``nonfinite``
    ``[U, R, P]`` (by slot); the phase's ``active``, ``decision``, ``accepted`` (bool) and
    ``prob`` ``[U, R, P - 1]``; ``slot_x[U, R, S, dim]`` the positions at the engine's
    ``watched`` slots (after the swaps)."""

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

    def watched_x(self, slots: Sequence[int]) -> torch.Tensor:
        """Positions ``[U, R, S, dim]`` at ``slots`` (all of them watched slots)."""
        pos = [self.watched.index(int(s)) for s in slots]
        if pos == list(range(len(self.watched))):
            return self.slot_x
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
class Update:
    """Changes an adaptor asks the engine to make (``None`` fields: no change).

    ``schedule`` / ``step_size``: new per-slot tables ``[R, P]``; ``params``: new values of the
    rule's parameters (e.g. ``{"C": [R, 1]}``); ``window``: switch the scheme to DEO_W with this
    window (the tuning segment of ``window = "auto"``); ``note``: free-form facts for the report
    (e.g. the measured rejection rate behind a window); ``reference``: a newly fitted reference
    for the hot end, installed by the engine of a path that has one (any other refuses it).
    The engine takes the tables it is
    given as its own (no copy): an adaptor must not change a tensor in place after handing it
    over."""

    schedule: torch.Tensor | None = None
    step_size: torch.Tensor | None = None
    params: dict[str, torch.Tensor] = field(default_factory=dict)
    window: int | None = None
    note: dict[str, Any] = field(default_factory=dict)
    #: a fitted reference ``(q, refitted[R])``
    reference: tuple[Any, torch.Tensor] | None = None


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
