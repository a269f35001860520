"""The parallel-tempering engine: one iteration.

    states[R, P, ...]  --explorer(slot params)-->  states'      (one batched call)
    reference slot of a geometric path           -->  iid draw from the reference
    energies v[R, P], slot_of[R, P], k  --scheme-->  phases of disjoint pairs
    each phase  --rule(params)-->  accepted pairs  -->  new slot_of (a permutation)
    everything above  -->  an :class:`~nrpt.roles.Iteration` for adaptors and recorders

Replica-major: ``state.x[s, r]`` is replica ``r`` of system ``s``; ``slot_of[s, r]`` its slot,
``replica_at[s, p]`` the inverse.  The engine holds the states, the permutation, the scheme's
state and the tunable tables (``schedule``, ``step_size``, rule ``params``), changed only by
:meth:`PTEngine.apply`; statistics are recorders, the loop is :mod:`nrpt.core.loop`.

:class:`nrpt.core.sharding.ShardedEngine` overrides the hooks ``_local``, ``_noise``,
``_gather``, ``rows`` and ``_full_state`` (single-process identities here).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch

from nrpt import rng
from nrpt.explorers import Density, Explorer, Noise, ReplicaState
from nrpt.paths.ladders import Path
from nrpt.rng import Stream, generator_for
from nrpt.roles import Iteration, PhaseDecision, SlotMap, Update
from nrpt.swap import DEOW, Rule, Scheme, SwapContext
from nrpt.swap.schemes import is_sweep

__all__ = ["PTEngine", "explore", "slot_metric", "check_metric", "slot_stats", "sweep_exchange",
           "swap_source", "shift_matrix", "slot_order", "refresh_top"]


def explore(explorer: Explorer, state: ReplicaState, b: torch.Tensor, h: torch.Tensor,
            density: Density, noise, n_explore: int, metric: torch.Tensor | None = None):
    """``n_explore`` explorer steps of ``state`` at the per-replica parameters ``b``, ``h``
    (and preconditioner ``metric``, passed only when not ``None``); returns ``(state, accept,
    nonfinite)``: the summed acceptance probabilities and non-finite counts, per replica (the
    engine's step and the fused chunk both call it)."""
    kw = {} if metric is None else {"metric": metric}
    for i in range(n_explore):
        state, info = explorer.step(state, b, h, density, noise, sub=i * explorer.substeps,
                                    **kw)
        if i == 0:
            accept, nonfinite = info.accept_prob, info.nonfinite.long()
        else:
            accept, nonfinite = accept + info.accept_prob, nonfinite + info.nonfinite
    return state, accept, nonfinite


def slot_metric(metric: torch.Tensor | None, slot_of: torch.Tensor) -> torch.Tensor | None:
    """Per-replica view ``[R, P, dim(, dim)]`` of a per-slot preconditioner table (``None``
    stays ``None``), gathered by ``slot_of[R, P]`` as the step sizes are."""
    if metric is None:
        return None
    idx = slot_of.reshape(*slot_of.shape, *(1,) * (metric.dim() - 2)).expand_as(metric)
    return metric.gather(1, idx)


def check_metric(metric, R: int, P: int, dim: int, dtype, device) -> torch.Tensor | None:
    """A per-slot preconditioner table as the engine keeps it: ``None`` (identity), ``[R, P,
    dim]`` positive finite diagonal scales, or ``[R, P, dim, dim]`` lower-triangular factors
    with a positive finite diagonal (a ``[P, ...]`` table is broadcast over the systems)."""
    if metric is None:
        return None
    m = torch.as_tensor(metric).to(device, dtype)
    if m.dim() in (2, 3) and m.shape[0] == P and m.shape[1:] in ((dim,), (dim, dim)):
        m = m.expand(R, *m.shape)
    if m.shape not in ((R, P, dim), (R, P, dim, dim)):
        raise ValueError(f"metric must be None, [systems, chains, dim] = [{R}, {P}, {dim}] "
                         f"(diagonal scales) or [{R}, {P}, {dim}, {dim}] (lower-triangular "
                         f"factors); got {list(m.shape)}")
    diag = m if m.dim() == 3 else m.diagonal(dim1=-2, dim2=-1)
    if not (bool(torch.isfinite(m).all()) and bool((diag > 0).all())):
        raise ValueError("metric must be finite with a positive diagonal (scales or the "
                         "Cholesky factors' diagonal)")
    if m.dim() == 4:
        m = torch.tril(m)
    return m.contiguous().clone()


def slot_stats(accept: torch.Tensor, nonfinite: torch.Tensor, explored_at: torch.Tensor,
               n_explore: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-slot explorer statistics ``(mean acceptance, non-finite count)`` ``[R, P]``, at
    the slots where the moves were made (``explored_at``: slot -> replica during them); also
    of a block of iterations at once (each ``[U, R, P]``)."""
    by_slot = accept.gather(-1, explored_at)
    if n_explore > 1:
        by_slot = by_slot / n_explore
    return by_slot, nonfinite.gather(-1, explored_at)


#: up to this many slots on the CPU, :func:`swap_source` makes the permutation with one integer
#: matrix product (one op instead of four)
SHIFT_MATRIX_MAX = 64
_SHIFT: dict[tuple, torch.Tensor] = {}


def shift_matrix(P: int, device) -> torch.Tensor:
    """``D[P-1, P]`` with ``D[p, p] = 1``, ``D[p, p+1] = -1`` (long; made once per shape)."""
    key = (P, str(device))
    got = _SHIFT.get(key)
    if got is None:
        with torch.inference_mode(False):  # a cache outlives the run: never inference tensors
            p = torch.arange(P - 1, device=device)
            got = torch.zeros(P - 1, P, dtype=torch.long, device=device)
            got[p, p], got[p, p + 1] = 1, -1
            _SHIFT[key] = got
    return got


def swap_source(accepted: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``src[R, P]``: the slot whose replica slot ``p`` takes after the swaps ``accepted[R,
    P-1]`` of disjoint adjacent pairs: ``p + 1`` if pair ``(p, p + 1)`` swapped, ``p - 1`` if
    pair ``(p - 1, p)`` did, else ``p`` (``ids``: ``arange(P)`` as ``[R, P]``).  Integer ops, so
    both ways of making it (a product with :func:`shift_matrix` on the CPU up to
    :data:`SHIFT_MATRIX_MAX` slots, else the difference of the padded verdicts) give the same
    numbers."""
    P = ids.shape[-1]
    if accepted.device.type == "cpu" and P <= SHIFT_MATRIX_MAX and \
            not torch.compiler.is_compiling():  # (eager: a compiled chunk fuses the other)
        return torch.addmm(ids, accepted.long(), shift_matrix(P, accepted.device))
    return ids + torch.nn.functional.pad(accepted.long(), (1, 1)).diff(dim=1)


def sweep_exchange(rule: Rule, v: torch.Tensor, replica_at: torch.Tensor,
                   schedule: torch.Tensor, params: dict, active: torch.Tensor, uniforms, k: int,
                   lo: torch.Tensor, hi: torch.Tensor, ids: torch.Tensor | None = None,
                   b_pairs: tuple[torch.Tensor, torch.Tensor] | None = None,
                   slot_of: torch.Tensor | None = None):
    """One phase over all ``P - 1`` adjacent pairs in slot order (DEO, DEO_W, SEO): the rule's
    verdicts from the energies ``v[R, P]`` (replica order) put in slot order, the swaps of the
    ``active`` pairs made on the permutation.  Returns ``(replica_at, slot_of, decision,
    accepted, prob)``; pure (the engine and the fused loop, :mod:`nrpt.core.fused`, both call it).
    ``uniforms``: the pairs' uniforms ``[R, P-1]`` or a function drawing them; ``ids``:
    ``arange(P)`` as ``[R, P]``, ``b_pairs``: ``(schedule[:, :-1], schedule[:, 1:])``, if the
    caller keeps them; ``slot_of``: the inverse of ``replica_at``, if the caller keeps it (the
    swaps are disjoint, so the slot map ``src`` is its own inverse and the new ``slot_of`` is
    ``src[slot_of]``: one gather instead of :func:`slot_order`'s two ops)."""
    v_at = v.gather(1, replica_at)
    b_lo, b_hi = (schedule[:, :-1], schedule[:, 1:]) if b_pairs is None else b_pairs
    ctx = SwapContext(b_lo=b_lo, b_hi=b_hi, v_lo=v_at[:, :-1], v_hi=v_at[:, 1:],
                      uniform_or_draw=uniforms, iteration=k, lo=lo, hi=hi, params=params)
    decision, prob = rule.decide(ctx)
    accepted = decision & active
    if ids is None:
        ids = torch.arange(replica_at.shape[1], device=replica_at.device).expand_as(replica_at)
    src = swap_source(accepted, ids)
    replica_at = replica_at.gather(1, src)
    slot_of = slot_order(replica_at, ids) if slot_of is None else src.gather(1, slot_of)
    return replica_at, slot_of, decision, accepted, prob


def slot_order(replica_at: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
    """The inverse permutation ``slot_of[R, P]`` of ``replica_at[R, P]`` (and the other way
    round); ``ids``: ``arange(P)`` broadcast to ``[R, P]``, if the caller keeps one."""
    if ids is None:
        ids = torch.arange(replica_at.shape[1], device=replica_at.device).expand_as(replica_at)
    return torch.empty_like(replica_at).scatter_(1, replica_at, ids)


def refresh_top(state: ReplicaState, slot_of: torch.Tensor, fresh: ReplicaState,
                top: int) -> ReplicaState:
    """``state`` with the replica at slot ``top`` (one per system) replaced by ``fresh``
    (``[R, 1, ...]`` rows: the reference's exact draws)."""
    R, w = state.v.shape
    full = ReplicaState(fresh.x.expand_as(state.x), fresh.v.expand(R, w),
                        fresh.base.expand(R, w),
                        {n: t.expand(R, w, *t.shape[2:]) for n, t in fresh.extras.items()})
    return state.where(slot_of == top, full)


def _joined(parts: list[ReplicaState], join) -> ReplicaState:
    """The replica states ``parts`` joined field by field (``join``: ``torch.stack`` or
    ``torch.cat``)."""
    return ReplicaState(join([r.x for r in parts]), join([r.v for r in parts]),
                        join([r.base for r in parts]),
                        {m: join([r.extras[m] for r in parts]) for m in parts[0].extras})


class PTEngine:
    """Batched PT over ``systems`` independent copies of a ``P``-slot ladder.

    Parameters
    ----------
    target, path, explorer, scheme, rule
        The roles (:mod:`nrpt.roles`).
    step_size
        Per-slot step sizes, a float (all slots) or a sequence of ``P`` floats, all > 0.
    systems
        Number ``R`` of independent PT systems run side by side (for repeats / error bars).
    seed
        The run seed; every random number is keyed from it (:mod:`nrpt.rng`).
    n_explore
        Explorer steps per iteration (between swap rounds).
    initial_states
        Optional ``[R, P, dim]`` tensor; otherwise ``target.initial_states(n, generator)`` if
        defined, the reference for a geometric path, or N(0, I).
    """

    #: evaluates the path components (a subclass may bring its own)
    density_class = Density

    def __init__(self, target, path: Path, explorer: Explorer, scheme: Scheme, rule: Rule, *,
                 step_size: float | list[float] = 0.5, systems: int = 1, seed: int = 0,
                 n_explore: int = 1, dtype: torch.dtype = torch.float64,
                 device: str | torch.device = "cpu",
                 initial_states: torch.Tensor | None = None):
        if isinstance(systems, bool) or int(systems) != systems or systems < 1:
            raise ValueError(f"systems must be an integer >= 1; got {systems!r}")
        if isinstance(n_explore, bool) or int(n_explore) != n_explore or n_explore < 1:
            raise ValueError(f"n_explore must be an integer >= 1; got {n_explore!r}")
        self.target, self.path, self.explorer = target, path, explorer
        self.scheme, self.rule = scheme, rule
        self.R, self.P, self.dim = int(systems), path.n_slots, int(target.dim)
        self.seed, self.n_explore = int(seed), int(n_explore)
        self.dtype, self.device = dtype, torch.device(device)
        R, P, dev = self.R, self.P, self.device

        self.schedule = path.schedule.to(dev, dtype).expand(R, P).clone()  # b per slot [R, P]
        self.step_size = self._per_slot("step_size", step_size)
        #: per-slot preconditioner (``None``: identity; ``[R, P, dim]`` diagonal scales or
        #: ``[R, P, dim, dim]`` lower-triangular factors), changed only by :meth:`apply`
        self.metric: torch.Tensor | None = None
        self.params = {k: v.to(dev, dtype) for k, v in rule.initial_params(R, P, dtype).items()}
        self.density = self.density_class(target, path)
        self.system_ids = torch.arange(R, device=dev).reshape(R, 1)
        self.replica_ids = torch.arange(P, device=dev).reshape(1, P)
        #: slots whose positions recorders read every iteration (:meth:`watch`)
        self.watched: list[int] = []
        # a block of reference draws and its parts evaluated so far (:meth:`_reference_rows`)
        self._ref_rows: tuple[int, torch.Tensor, dict[int, ReplicaState]] | None = None

        # replica r starts at slot r
        self.slot_of = torch.arange(P, device=dev).expand(R, P).clone()
        self.replica_at = self.slot_of.clone()
        x0 = self._local(self._initial_states(initial_states))
        v, base = self.density(x0)
        if not torch.isfinite(v).all() or not torch.isfinite(base).all():
            bad = int((~torch.isfinite(v) | ~torch.isfinite(base)).sum())
            raise ValueError(
                f"{bad} initial state(s) have a non-finite energy / log density: the chains "
                f"must start inside the target's support. Give the target a method "
                f"initial_states(n, generator) returning [n, dim] states where the energy is "
                f"finite (for `nrpt run --target file.py:NAME`: on NAME, in that file; see "
                f"docs/examples/my_model.py), or pass initial_states=[systems, chains, dim] "
                f"to PTEngine")
        self.state = explorer.prepare(ReplicaState(x0, v, base), self.density)
        self.scheme_state = scheme.init_state(R, P, dev)
        self.k = 0

    @property
    def autograd_free(self) -> bool:
        """No step of this engine needs autograd: the explorer uses no gradient (RWMH, slice),
        or the target declares ``analytic_gradients = True`` (its gradient methods are
        closed forms).  The loop then runs in ``torch.inference_mode`` (:mod:`nrpt.core.loop`)."""
        return (not getattr(self.explorer, "uses_gradient", True)
                or bool(getattr(self.target, "analytic_gradients", False)))

    # ------------------------------------------------------------------ set-up helpers
    def _per_slot(self, name: str, value) -> torch.Tensor:
        vals = [float(value)] * self.P if np.ndim(value) == 0 else [float(v) for v in value]
        if len(vals) != self.P:
            raise ValueError(f"{name} must be one number or {self.P} numbers (one per slot); "
                             f"got {len(vals)}")
        if not all(v > 0 and math.isfinite(v) for v in vals):
            raise ValueError(f"{name} must be > 0 and finite for every slot; got {vals}")
        return torch.tensor(vals, dtype=self.dtype, device=self.device).expand(self.R,
                                                                              self.P).clone()

    def _initial_states(self, given):
        R, P, d = self.R, self.P, self.dim
        if given is not None:
            x = torch.as_tensor(given, dtype=self.dtype, device=self.device)
            if x.shape == (P, d):
                x = x.expand(R, P, d)
            if x.shape != (R, P, d):
                raise ValueError(f"initial_states must have shape [systems, chains, dim] = "
                                 f"[{R}, {P}, {d}] or [{P}, {d}]; got {list(x.shape)}")
            return x.clone()
        g = generator_for(self.seed, Stream.INIT)
        if hasattr(self.target, "initial_states"):
            x = self.target.initial_states(R * P, g)
        elif self.path.kind == "geometric":
            x = self.target.reference_sample(R * P, g)
        else:
            x = torch.randn(R * P, d, generator=g, dtype=self.dtype)
        return torch.as_tensor(x).to(self.device, self.dtype).reshape(R, P, d).clone()

    def set_scheme(self, scheme: Scheme) -> None:
        self.scheme = scheme
        self.scheme_state = scheme.init_state(self.R, self.P, self.device)

    def apply(self, update: Update | None) -> SlotMap | None:
        """Make the changes an adaptor asked for (the only way tunable tables change); returns
        the completed slot map of an ``update.resize`` (:meth:`resize`), else None."""
        if update is None:
            return None
        if update.schedule is not None:
            self.schedule = self._table(update.schedule)
        if update.step_size is not None:
            self.step_size = self._table(update.step_size)
        if update.metric is not None:
            self.set_metric(update.metric)
        for name, value in update.params.items():
            if name not in self.params:
                raise KeyError(f"rule {self.rule.name!r} has no parameter {name!r} "
                               f"(it has {sorted(self.params)})")
            self.params[name] = value.to(self.device, self.dtype)
        if update.window is not None:
            self.set_scheme(DEOW(update.window))
        if update.reference is not None:  # an engine whose path has one installs it itself
            raise ValueError("this run's reference is fixed (reference 'prior'): an "
                             "Update.reference needs a run whose `reference` setting fits one")
        return self.resize(*update.resize) if update.resize is not None else None

    def set_metric(self, metric) -> None:
        """Install a per-slot preconditioner (:func:`check_metric`); refused for an explorer
        that does not declare ``preconditionable``."""
        ex = self.explorer
        if metric is not None and not getattr(getattr(ex, "inner", ex), "preconditionable",
                                              False):
            raise ValueError(f"explorer {getattr(ex, 'name', ex)!r} takes no preconditioner "
                             f"(it does not declare preconditionable = True); use precondition "
                             f"= 'none' or a preconditionable explorer (rwmh, mala, hmc, slice, "
                             f"automala, nuts)")
        self.metric = check_metric(metric, self.R, self.P, self.dim, self.dtype, self.device)

    def resize(self, schedule: torch.Tensor, m: SlotMap) -> SlotMap:
        """Grow the ladder from ``m.old`` to ``m.new`` slots (``chains = "auto"``, between
        rounds) at the new ``schedule`` ``[R, P']``, or shrink it; returns the completed map
        for the followers (``m`` itself for a growth).  The replicas keep their states and
        identities, each moving to its old slot's primary new slot; the added slots get new
        replicas ``P .. P' - 1`` whose states (and explorer buffers) copy the replica at their
        source slot.  Per-slot tables follow: a slot's step size is its source slot's (on a
        temperature ladder scaled by ``sqrt(b_source / b_new)``, as the schedule adaptor scales
        moved slots), a rule parameter ``[R, P]`` its source's; the scheme restarts on the
        new ladder.  What else keeps per-slot tables follows through ``follow_ladder(m)``
        (the loop calls it, with the returned map).

        A shrink (``m.new < m.old``, :meth:`SlotMap.shrink`): the replicas at the kept slots
        ``m.source`` keep their states and move to the new slots in order, renumbered ``0 ..
        P' - 1`` by their new slot; the others are dropped.  The returned map is ``m`` with
        ``replicas`` (per system, each new replica's old number) for the followers."""
        if m.old != self.P:
            raise ValueError(f"resize: the slot map is for a ladder of {m.old} slots; this one "
                             f"has {self.P}")
        R, P, Pn, dev = self.R, self.P, m.new, self.device
        new_b = torch.as_tensor(schedule, dtype=self.dtype, device=dev)
        if new_b.shape != (R, Pn):
            raise ValueError(f"resize: schedule must be [{R}, {Pn}]; got {list(new_b.shape)}")
        src = torch.tensor(m.source, device=dev)
        st = self._full_state()

        def rows(t: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
            idx = ids.reshape(R, -1, *([1] * (t.dim() - 2))).expand(R, -1, *t.shape[2:])
            return t.gather(1, idx)

        if m.shrinks:
            # the replicas at the kept slots, renumbered by their new slot (replica j at slot
            # j); the others are dropped
            kept = self.replica_at[:, src]  # [R, P']: old replica ids
            self.state = ReplicaState(rows(st.x, kept), rows(st.v, kept), rows(st.base, kept),
                                      {k: rows(v, kept) for k, v in st.extras.items()})
            self.slot_of = torch.arange(Pn, device=dev).expand(R, Pn).clone()
            m = replace(m, replicas=tuple(tuple(int(i) for i in row) for row in kept.tolist()))
        else:
            primary = torch.tensor(m.primary, device=dev)
            added = torch.tensor(m.added, dtype=torch.long, device=dev)
            # the replicas copied into the added slots: those at their source slots, per system
            copied = self.replica_at[:, src[added]]  # [R, P' - P]

            def extend(t: torch.Tensor) -> torch.Tensor:
                return torch.cat([t, rows(t, copied)], 1)

            self.state = ReplicaState(extend(st.x), extend(st.v), extend(st.base),
                                      {k: extend(v) for k, v in st.extras.items()})
            self.slot_of = torch.cat([primary[self.slot_of], added.expand(R, -1)], 1)
        self.replica_ids = torch.arange(Pn, device=dev).reshape(1, Pn)
        self.replica_at = slot_order(self.slot_of, self.replica_ids.expand(R, Pn))
        h = self.step_size[:, src]
        if self.path.kind == "temperature":
            with np.errstate(all="ignore"):
                scale = torch.sqrt(self.schedule[:, src] / new_b)
            h = h * torch.where(torch.isfinite(scale) & (scale > 0), scale,
                                torch.ones_like(scale))
        self.step_size = h.contiguous()
        if self.metric is not None:  # a new slot's preconditioner is its source slot's
            self.metric = self.metric[:, src].contiguous()
        self.schedule = new_b.clone()
        for name, value in list(self.params.items()):
            if value.dim() >= 2 and value.shape[1] == P and P > 1:
                self.params[name] = value[:, src].contiguous()
        self.P = Pn
        self.watched = sorted({m.primary[s] for s in self.watched})
        self.scheme_state = self.scheme.init_state(R, Pn, dev)
        self._ref_rows = None
        return m

    def _table(self, value) -> torch.Tensor:
        """A per-slot table ``[R, P]`` of the engine's dtype and device: an ``[R, P]`` tensor
        is taken as it is (the engine owns an :class:`Update`'s tables), anything else is
        broadcast and copied."""
        t = torch.as_tensor(value, dtype=self.dtype, device=self.device)
        return t if t.shape == (self.R, self.P) else t.expand(self.R, self.P).clone()

    # ------------------------------------------------------------------ one iteration
    def slot_params(self, table: torch.Tensor) -> torch.Tensor:
        """Per-replica view of a per-slot table ``[R, P]``."""
        return table.gather(1, self.slot_of)

    def step(self) -> Iteration:
        k = self.k
        b = self._local(self.slot_params(self.schedule))
        h = self._local(self.slot_params(self.step_size))
        per_replica = slot_metric(self.metric, self.slot_of)
        m = None if per_replica is None else self._local(per_replica)
        # 1. explore: every replica at its slot's parameters, in one batched call per step
        self.state, accept, nonfinite = explore(self.explorer, self.state, b, h, self.density,
                                                self._noise(k), self.n_explore, m)
        explored_at = self.replica_at  # slot -> replica during the moves

        # 2. the reference end of a geometric path is sampled exactly
        if self.path.has_reference:
            self._refresh_reference(k)
        view, accept, nonfinite = self._gather(accept, nonfinite)

        # 3. swaps: phases of disjoint pairs, each decided from scalars only
        phases = self.scheme.phases(k, self.R, self.P, self.seed, self.system_ids,
                                    self.scheme_state)
        decisions = [self._swap_phase(k, phase, lo, hi, active, view.v)
                     for phase, (lo, hi, active) in enumerate(phases)]
        self.k += 1
        by_slot, nf = slot_stats(accept, nonfinite, explored_at, self.n_explore)
        return Iteration(k=k, state=view, slot_of=self.slot_of,
                         replica_at=self.replica_at, schedule=self.schedule,
                         step_size=self.step_size, params=self.params, explore_accept=by_slot,
                         nonfinite=nf, decisions=decisions,
                         has_reference=self.path.has_reference)

    # ------------------------------------------------------------------ hooks of one process
    # (:class:`nrpt.core.sharding.ShardedEngine` overrides them)
    def _local(self, t: torch.Tensor) -> torch.Tensor:
        """This process's block of a per-replica tensor ``[R, P, ...]`` (here: all of it)."""
        return t

    def _noise(self, k: int) -> Noise:
        return Noise(self.seed, k, self.R, self.P, self.device)

    def _gather(self, accept: torch.Tensor, nonfinite: torch.Tensor):
        """``(scalars, accept, nonfinite)`` at full width ``[R, P]``."""
        return self.state, accept, nonfinite

    def should_stop(self, flag: bool) -> bool:
        """Whether the loop stops before the next iteration, given this process's stop
        ``flag`` (sharded: whether the ranks agreed to, from the last gathered flags)."""
        return flag

    def watch(self, slots) -> None:
        """Declare that recorders read the positions at ``slots`` every iteration."""
        self.watched = sorted(set(self.watched) | {int(s) for s in slots})

    def rows(self, replicas: torch.Tensor) -> torch.Tensor:
        """Positions ``[R, S, dim]`` of the replicas ``replicas[R, S]``."""
        R, S = replicas.shape
        return self.state.x.gather(1, replicas[..., None].expand(R, S, self.dim))

    def _full_state(self) -> ReplicaState:
        """The whole state ``[R, P, ...]``."""
        return self.state

    #: the reference draws of a block (up to 512 iterations, one generator keyed by the block)
    #: are evaluated -- the target's energy and, for a gradient explorer, its gradient -- this
    #: many iterations at a time, as the iterations reach them: a fitted reference draws its
    #: block anew after every refit (each round), and a round shorter than the block paid for
    #: all of its rows (low_dim_gauss_mix, Stan: 4.5 s of a 7.7 s six-round loop).  The draws
    #: are the block's either way.
    REFERENCE_ROWS = 64

    def _reference_rows(self, k: int, count: int = 0) -> ReplicaState:
        """The prepared reference draws ``[R, 1, ...]`` of iteration ``k``.  Small draws are
        made for a block of iterations at once, from one generator keyed by the block (as
        :func:`nrpt.rng.iteration_draw`; resuming mid-block redraws it), and evaluated and
        prepared :attr:`REFERENCE_ROWS` iterations at a time as they are reached.  ``count >
        0``: those of iterations ``k .. k + count - 1``, stacked ``[count, R, 1, ...]``
        (:mod:`nrpt.core.fused`)."""
        B = rng.block_length(self.R * self.dim)
        E, i, n = min(B, self.REFERENCE_ROWS), k % B, max(int(count), 1)
        if i + n > B:  # across two blocks (rare): row by row
            return _joined([self._reference_rows(j) for j in range(k, k + n)], torch.stack)
        if self._ref_rows is None or self._ref_rows[0] != k // B:
            self._ref_rows = (k // B, self._reference_block(k, B)[:, :, None], {})
        _, xr, done = self._ref_rows
        first, last = i // E, (i + n - 1) // E
        for part in range(first, last + 1):
            if part not in done:
                x = xr[part * E:(part + 1) * E]
                v, base = self.density(x)
                done[part] = self.explorer.prepare(ReplicaState(x, v, base), self.density)
        rows = done[first] if first == last else _joined(
            [done[p] for p in range(first, last + 1)], torch.cat)
        j = i - first * E
        sl = slice(j, j + n) if count else j
        return ReplicaState(rows.x[sl], rows.v[sl], rows.base[sl],
                            {m: t[sl] for m, t in rows.extras.items()})

    def _reference_block(self, k: int, B: int) -> torch.Tensor:
        """The reference draws ``[B, R, d]`` of the block of ``B`` iterations holding ``k``."""
        return self._prior_draws(k, B, self.R)

    def _prior_draws(self, k: int, B: int, rows: int) -> torch.Tensor:
        """``[B, rows, d]`` draws of ``target.reference_sample`` keyed by the block of ``k``."""
        g = rng.block_generator(self.seed, Stream.REFERENCE, k, B)
        xr = torch.as_tensor(self.target.reference_sample(B * rows, g))
        return xr.to(self.device, self.dtype).reshape(B, rows, self.dim)

    def _refresh_reference(self, k: int) -> None:
        self.state = refresh_top(self.state, self._local(self.slot_of),
                                 self._reference_rows(k), self.P - 1)

    def _swap_phase(self, k: int, phase: int, lo, hi, active, v) -> PhaseDecision:
        """Decide and execute one phase of disjoint pairs ``(lo, hi)`` ``[R, M]``."""
        def u():  # drawn only for rules that read them
            return rng.iteration_uniform(lo.shape, self.seed, Stream.SWAP, k, phase,
                                         dtype=self.dtype, device=self.device)

        if is_sweep(lo, self.R, self.P):  # all P-1 pairs, in order (DEO, DEO_W, SEO)
            self.replica_at, self.slot_of, decision, accepted, prob = sweep_exchange(
                self.rule, v, self.replica_at, self.schedule, self.params, active, u,
                k, lo, hi, self.replica_ids.expand(self.R, self.P), slot_of=self.slot_of)
        else:
            b_lo, b_hi = self.schedule.gather(1, lo), self.schedule.gather(1, hi)
            v_lo = v.gather(1, self.replica_at.gather(1, lo))
            v_hi = v.gather(1, self.replica_at.gather(1, hi))
            ctx = SwapContext(b_lo=b_lo, b_hi=b_hi, v_lo=v_lo, v_hi=v_hi, uniform_or_draw=u,
                              iteration=k, lo=lo, hi=hi, params=self.params)
            decision, prob = self.rule.decide(ctx)
            accepted = decision & active
            # sigma: slot -> new slot; pairs in a phase are disjoint, so the adds never collide
            ids = self.replica_ids.expand(self.R, self.P)
            step = (hi - lo) * accepted.long()
            sigma = ids.clone()
            sigma.scatter_add_(1, lo, step)
            sigma.scatter_add_(1, hi, -step)
            self.slot_of = sigma.gather(1, self.slot_of)
            self.replica_at = slot_order(self.slot_of, ids)
        self.scheme.after_phase(k, self.scheme_state, lo, accepted)
        return PhaseDecision(lo, hi, active, decision, accepted, prob)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """The whole engine state (:meth:`_full_state`)."""
        st = self._full_state()
        return {
            "k": self.k, "x": st.x, "v": st.v, "base": st.base,
            "extras": dict(st.extras),
            "slot_of": self.slot_of, "schedule": self.schedule, "step_size": self.step_size,
            "params": dict(self.params), "scheme": self.scheme.describe(),
            "scheme_state": dict(self.scheme_state),
            **({} if self.metric is None else {"metric": self.metric}),
        }

    def load_state_dict(self, sd: dict) -> None:
        dev = self.device
        self.k = int(sd["k"])
        take = self._local  # a checkpoint holds every replica (sharded: keep this block)
        self.state = ReplicaState(take(sd["x"].to(dev)), take(sd["v"].to(dev)),
                                  take(sd["base"].to(dev)),
                                  {k: take(v.to(dev)) for k, v in sd.get("extras", {}).items()})
        self.slot_of = sd["slot_of"].to(dev)
        self.replica_at = slot_order(self.slot_of, self.replica_ids.expand(self.R, self.P))
        self.schedule = sd["schedule"].to(dev)
        self.step_size = sd["step_size"].to(dev)
        self.metric = None if sd.get("metric") is None else sd["metric"].to(dev)
        self.params = {k: v.to(dev) for k, v in sd.get("params", {}).items()}
        window = sd.get("scheme", {}).get("window")
        if sd.get("scheme", {}).get("scheme") == "deo-w" and window not in (None, 1):
            self.set_scheme(DEOW(window))
        self.scheme_state = {k: v.to(dev) for k, v in sd["scheme_state"].items()}
