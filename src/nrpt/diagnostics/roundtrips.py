"""Round-trip and restart counting for index processes ``[K, R, P]`` (slot ``0`` the target,
``P-1`` the reference; rows permutations of ``0..P-1``).

**Restart** (Syed et al. 2021, JRSS-B, Sec. 3.3): first arrival at ``0`` after a visit to
``P-1``.  **Round trip (Syed)**: a restart followed by arrival at ``P-1``.  One phase per
replica in ``{NONE, AT_TOP_SIDE, DOWN_DONE}``::

    at slot P-1:  if phase == DOWN_DONE: round_trips += 1
                  phase = AT_TOP_SIDE
    at slot 0:    if phase == AT_TOP_SIDE: restarts += 1
                  if phase != NONE: phase = DOWN_DONE

A replica starting at ``P-1`` begins in ``AT_TOP_SIDE``, every other in ``NONE``.

**Round trip (Deng et al. 2023, AAAI, App. A.5)**: from its origin (slot when tracking
began) a replica hits both ends and returns to the origin; flags ``hit0`` / ``hit_top`` (set
at start on an end) are cleared on completion except the origin's own end.

One definition of a replica's step, :func:`_transition` (arithmetic and bitwise ops: tensors
and Python ints alike), serves the three ways :class:`RoundTripTracker` advances: the
per-iteration :meth:`~RoundTripTracker.advance` calls it on the ``[R, P]`` tensors; the events
loop of :meth:`~RoundTripTracker.update_block` (CPU) and its table scan (GPUs) look it up in
:data:`_EVENT_TABLE`, the definition evaluated once on its 12 states x 8 inputs.  A change of
the rules is a change of :func:`_transition` alone.  :func:`count_round_trips` is the
independent loop-based reference (the tests' oracle; it does not use the definition)."""

from __future__ import annotations

import operator

import numpy as np
import torch

__all__ = ["RoundTripTracker", "count_round_trips"]

# Phases of the Syed et al. restart / round-trip state machine.
NONE = 0
"""The replica has not visited the reference slot ``P-1`` yet."""
AT_TOP_SIDE = 1
"""The last end slot the replica visited is the reference slot ``P-1``."""
DOWN_DONE = 2
"""The replica visited slot ``0`` after slot ``P-1`` (a restart happened)."""


def _transition(phase, hit0, hit_top, at0, at_top, at_origin):
    """One iteration of one replica's state machine, the one definition of the rules:
    :meth:`RoundTripTracker.advance` calls it on tensors ``[R, P]``; :data:`_EVENT_TABLE`, which
    the events loop and the table scan look up, is it evaluated on Python ints.

    ``phase`` (``NONE`` / ``AT_TOP_SIDE`` / ``DOWN_DONE``), ``hit0``, ``hit_top``: the state
    before; ``at0``, ``at_top``, ``at_origin``: whether the replica's new slot is ``0``, ``P-1``,
    its origin (never both ends: ``P >= 2``).  Returns ``(phase, hit0, hit_top, restart, trip,
    trip_a5)``: the state after and what the iteration counts (0 / 1 each).  Arithmetic and
    bitwise ops only, so that ints and bools (``~`` is then ``-x - 1``: every ``&`` keeps it to
    0 / 1), and tensors of any broadcastable shapes, go through the same lines.

    The rules of the module docstring, folded: a restart (``at0`` in ``AT_TOP_SIDE``) is the
    only arrival at ``0`` that moves the phase (``+1`` to ``DOWN_DONE``; ``NONE`` and
    ``DOWN_DONE`` stay); an arrival at ``P-1`` moves it to ``AT_TOP_SIDE`` (``+ 1 - phase``).
    A completed A.5 trip happens at the origin, so "except the origin's own end" is "except the
    end it is at": a flag is set after the iteration if the replica is at its end now, else if
    it was set before and no trip completed."""
    restart = at0 & (phase == AT_TOP_SIDE)
    trip = at_top & (phase == DOWN_DONE)
    new_phase = phase + restart + at_top * (AT_TOP_SIDE - phase)
    trip_a5 = (hit0 | at0) & (hit_top | at_top) & at_origin
    not_done = ~trip_a5
    new_hit0 = at0 | (hit0 & not_done)
    new_hit_top = at_top | (hit_top & not_done)
    return new_phase, new_hit0, new_hit_top, restart, trip, trip_a5


def _event_table() -> list[int]:
    """:func:`_transition` on every state ``phase * 4 + hit0 * 2 + hit_top`` (12) and input
    ``at0 + 2 at_top + 4 at_origin`` (8; the two with both ends never occur), as the ints
    ``state_after * 8 + restart + 2 trip + 4 trip_a5`` at ``state * 8 + input``."""
    table = []
    for state in range(12):
        phase, hit0, hit_top = state >> 2, (state >> 1) & 1, state & 1
        for code in range(8):
            ph, h0, ht, restart, trip, trip_a5 = _transition(
                phase, hit0, hit_top, code & 1, (code >> 1) & 1, (code >> 2) & 1)
            table.append((int(ph) * 4 + int(h0) * 2 + int(ht)) * 8
                         + int(restart) + 2 * int(trip) + 4 * int(trip_a5))
    return table


#: :func:`_transition` as a lookup table (:func:`_event_table`), built once: the events loop
#: indexes it, the table scan gathers from it (as a tensor ``[8, 12]`` per device,
#: :data:`_TABLES`)
_EVENT_TABLE = _event_table()
_TABLES: dict[torch.device, torch.Tensor] = {}


#: the most elements of the per-block transition tables of
#: :meth:`RoundTripTracker.update_block` (``12 R P`` per iteration)
_BLOCK_ELEMENTS = 1 << 16
#: above this many replicas ``R P``, :meth:`RoundTripTracker.update_block` updates iteration by
#: iteration: the tables' work (12 states, a prefix scan) grows with ``R P`` while the
#: per-iteration update's ~20 small ops cost about the same whatever it is (CPU, one thread,
#: us per iteration, table / per iteration: R P = 16: 8 / 53, 64: 35 / 53, 128: 80 / 55,
#: 256: 119 / 58, 1024: 434 / 69; since the tables are gathered from :data:`_EVENT_TABLE`,
#: ``benchmarks/roundtrip_paths.py``: 16: 4.3 / 50, 64: 18 / 51, 256: 70 / 53 -- the bound
#: is not re-tuned)
TABLE_MAX_REPLICAS = 96

_STATE_KEYS = (
    "phase",
    "restarts",
    "round_trips",
    "round_trips_a5",
    "origin",
    "hit0",
    "hit_top",
)


def _check_n_slots(n_slots) -> int:
    try:
        n = operator.index(n_slots)
    except TypeError:
        raise ValueError(f"n_slots must be an integer >= 2, got {n_slots!r}") from None
    if n < 2:
        raise ValueError(f"n_slots must be an integer >= 2, got {n}")
    return n


class RoundTripTracker:
    """Batched online restart / round-trip counters for ``R`` PT systems of ``P`` slots, with a
    fixed number of tensor ops and no host sync per :meth:`update`.

    Args:
        slot_of: initial index ``[R, P]`` (rows permutations of ``0..P-1``; ``[P]``: one
            system); the tracker lives on its device.
        n_slots: ``P >= 2``.

    ``restarts``, ``round_trips`` (Syed et al. 2021) and ``round_trips_a5`` (Deng et al. 2023,
    App. A.5) are ``int64 [R]``; :meth:`per_replica` gives the ``[R, P]`` counters."""

    def __init__(self, slot_of: torch.Tensor, n_slots: int) -> None:
        self.n_slots = _check_n_slots(n_slots)
        s = torch.as_tensor(slot_of)
        if s.dtype.is_floating_point or s.dtype.is_complex or s.dtype == torch.bool:
            raise ValueError(f"slot_of must be an integer tensor, got dtype {s.dtype}")
        s = s.to(torch.long)
        if s.dim() == 1:
            s = s.unsqueeze(0)
        if s.dim() != 2 or s.shape[-1] != self.n_slots:
            raise ValueError(
                f"slot_of must have shape [R, n_slots] or [n_slots] with n_slots="
                f"{self.n_slots}, got {tuple(torch.as_tensor(slot_of).shape)}"
            )
        # One-off validation (host sync is fine in the constructor, not in update()).
        expected = torch.arange(self.n_slots, device=s.device).expand_as(s)
        if not torch.equal(torch.sort(s, dim=-1).values, expected):
            raise ValueError("slot_of: every row must be a permutation of 0..n_slots-1")

        self._shape = tuple(s.shape)
        self._top = self.n_slots - 1
        at0 = s == 0
        at_top = s == self._top
        phase = torch.full(self._shape, NONE, dtype=torch.int8, device=s.device)
        self._phase = phase.masked_fill(at_top, AT_TOP_SIDE)
        self._restarts = torch.zeros(self._shape, dtype=torch.long, device=s.device)
        self._round_trips = torch.zeros_like(self._restarts)
        self._round_trips_a5 = torch.zeros_like(self._restarts)
        self._origin = s.clone()
        self._hit0 = at0
        self._hit_top = at_top
        self._n_updates = 0
        #: counts of replicas a shrinking ladder dropped, ``int64 [R, 3]`` (restarts, round
        #: trips, A.5 round trips; kept in the per-system totals), None before any shrink
        self._retired: torch.Tensor | None = None

    # ------------------------------------------------------------------ update
    @property
    def device(self) -> torch.device:
        """Device holding the counters."""
        return self._origin.device

    @property
    def n_systems(self) -> int:
        """Number ``R`` of independent PT systems."""
        return self._shape[0]

    @property
    def n_updates(self) -> int:
        """Iterations the counters advanced since construction (or loaded state): the
        :meth:`update` calls, plus the counts given to :meth:`set_carry`."""
        return self._n_updates

    def update(self, slot_of: torch.Tensor) -> None:
        """Advance all counters by one iteration given the new index ``[R, P]`` (shape checked, not
        re-validated as a permutation)."""
        s = torch.as_tensor(slot_of, device=self.device)
        if s.dim() == 1:
            s = s.unsqueeze(0)
        if tuple(s.shape) != self._shape:
            raise ValueError(f"slot_of must have shape {self._shape}, got {tuple(s.shape)}")
        if s.dtype != torch.long:
            s = s.to(torch.long)
        self.set_carry(self.advance(self.carry(), s, self._top), 1)

    def update_block(self, slots: torch.Tensor) -> None:
        """Advance all counters by ``U`` iterations given their indices ``slots`` ``[U, R, P]``:
        the same counts and state as ``U`` calls of :meth:`update`, in a fixed number of
        tensor ops per block rather than per iteration (docs/benchmarks.md, "Outputs and the
        fixed cost").

        On the CPU by events (:meth:`_advance_events`).  Elsewhere by tables: each replica's
        state (Syed phase, ``hit0``, ``hit_top``) is one of 12; every iteration maps each of
        the 12 states to the next (a table ``[U, R, P, 12]`` gathered from
        :data:`_EVENT_TABLE` by the iteration's input, with the counts it adds), the tables
        are composed by a prefix scan (``log2 U`` gathers), and the states before each
        iteration read off them.  Us per iteration, events / tables (``benchmarks/
        roundtrip_paths.py``, one thread): R P = 16: 2.2 / 4.3, 64: 3.6 / 18, 256:
        10.6 / 70."""
        S = torch.as_tensor(slots, device=self.device)
        if S.dim() != 3 or tuple(S.shape[1:]) != self._shape:
            raise ValueError(f"slots must have shape [U, *{self._shape}], got "
                             f"{tuple(S.shape)}")
        R, P = self._shape
        if S.dtype != torch.long:
            S = S.to(torch.long)
        if S.device.type == "cpu" and S.shape[0] > 1 and self._advance_events(S):
            return  # (events: no host sync on a GPU)
        step = max(1, min(64, _BLOCK_ELEMENTS // (12 * R * P)))
        if step < 4 or R * P > TABLE_MAX_REPLICAS:  # (the per-iteration update is cheaper)
            for u in range(S.shape[0]):
                self.update(S[u])
            return
        for a in range(0, S.shape[0], step):
            self._advance_block(S[a:a + step])

    #: :meth:`_advance_events` leaves a block to the tables past this many events per system
    #: and iteration (~3 in a mixing run; up to ``P`` when replicas that have hit both ends sit
    #: at their origins)
    EVENTS_MAX = 16

    def _advance_events(self, S: torch.Tensor) -> bool:
        """:meth:`update_block` on the CPU, by events: a replica's state changes only at an
        iteration where it arrives (it was elsewhere the iteration before, or it is the
        block's first) at slot 0, at the top slot, or at its origin after both ends were hit
        (found by a few tensor ops over the block: ``hit`` flags as the block's running "seen"
        marks, a superset since they ignore the clears).  Those are listed in iteration order
        and each replica's state is stepped through them in Python by :data:`_EVENT_TABLE`
        (the definition :meth:`advance` calls).  (An iteration where a replica stays where it
        was changes nothing: the phase is already the one its slot sets, the flags already
        hold its slot's marks, and a completed trip at a slot cleared a flag that staying
        there does not set again; the tests check this of the definition.)  Returns False,
        changing nothing, past :attr:`EVENTS_MAX` events per system and iteration."""
        U = S.shape[0]
        R, P = self._shape
        # (on NumPy views: a small NumPy op costs a third to a half of a torch op; integers)
        Sn, top, origin = S.numpy(), self._top, self._origin.numpy()
        at0, att = Sn == 0, Sn == top
        seen0 = self._hit0.numpy() | np.logical_or.accumulate(at0, 0)
        seen_top = self._hit_top.numpy() | np.logical_or.accumulate(att, 0)
        code = at0 + 2 * att + 4 * ((Sn == origin) & seen0 & seen_top)  # int64 [U, R, P]
        code[1:] *= Sn[1:] != Sn[:-1]  # (arrivals only)
        flat = code.reshape(-1)
        pos = flat.nonzero()[0]
        if pos.size > self.EVENTS_MAX * U * R:
            return False
        RP = R * P
        # each replica's state times 8 (the table's key; lists: fewer small array ops)
        state = (self._phase.numpy().astype(np.int64) * 32 + self._hit0.numpy() * 16
                 + self._hit_top.numpy() * 8).reshape(-1).tolist()
        table, counted = _EVENT_TABLE, []
        for i, c in zip((pos % RP).tolist(), flat[pos].tolist(), strict=True):
            v = table[state[i] | c]
            state[i] = v & -8
            if v & 7:
                counted.append(i << 3 | v & 7)
        if counted:
            more = [0] * (3 * RP)  # restarts, round trips, A.5 round trips
            for x in counted:
                i = x >> 3
                more[i] += x & 1
                more[RP + i] += (x >> 1) & 1
                more[2 * RP + i] += (x >> 2) & 1
            add = np.array(more, dtype=np.int64).reshape(3, R, P)
            self._restarts = torch.from_numpy(self._restarts.numpy() + add[0])
            self._round_trips = torch.from_numpy(self._round_trips.numpy() + add[1])
            self._round_trips_a5 = torch.from_numpy(self._round_trips_a5.numpy() + add[2])
        last = np.array(state, dtype=np.uint8).reshape(R, P)
        self._phase = torch.from_numpy((last >> 5).view(np.int8))
        self._hit0 = torch.from_numpy((last & 16).astype(bool))
        self._hit_top = torch.from_numpy((last & 8).astype(bool))
        self._n_updates += U
        return True

    def _state(self) -> torch.Tensor:
        """Each replica's state ``phase * 4 + hit0 * 2 + hit_top`` (one of 12), ``long [R, P]``."""
        return self._phase * 4 + self._hit0 * 2 + self._hit_top  # (int8 * 4 + long: long)

    def _set_state(self, state: torch.Tensor) -> None:
        """Take the 12-state codes ``state`` ``long [R, P]`` as the state."""
        self._phase = (state >> 2).to(torch.int8)
        self._hit0 = (state & 2).bool()
        self._hit_top = (state & 1).bool()

    def _advance_block(self, S: torch.Tensor) -> None:
        U = S.shape[0]
        lut = _TABLES.get(S.device)
        if lut is None:  # :data:`_EVENT_TABLE` as [input, state]
            lut = _TABLES[S.device] = torch.tensor(
                _EVENT_TABLE, dtype=torch.long, device=S.device).reshape(12, 8).T.contiguous()
        code = (S == 0) + 2 * (S == self._top) + 4 * (S == self._origin)  # [U, R, P]
        step = lut[code]  # [U, R, P, 12]: from each state, the state after * 8 + the counts
        table = step >> 3
        comp, d = table, 1  # comp[t]: the composition of iterations 0..t
        while d < U:
            comp = torch.cat([comp[:d], comp[d:].gather(-1, comp[:-d])])
            d *= 2
        s0 = self._state()[None]  # [1, R, P]
        after = comp.gather(-1, s0.expand(U, -1, -1)[..., None])[..., 0]  # [U, R, P]
        before = torch.cat([s0, after[:-1]])
        a = step.gather(-1, before[..., None])  # [U, R, P, 1]: what each iteration added
        add = ((a >> torch.arange(3, device=S.device)) & 1).sum(0)  # [R, P, 3]
        self._restarts = self._restarts + add[..., 0]
        self._round_trips = self._round_trips + add[..., 1]
        self._round_trips_a5 = self._round_trips_a5 + add[..., 2]
        self._set_state(after[-1])
        self._n_updates += U

    @staticmethod
    def advance(state: tuple[torch.Tensor, ...], s: torch.Tensor, top: int
                ) -> tuple[torch.Tensor, ...]:
        """One iteration of the counters as a pure function: ``state`` is
        ``(phase, restarts, round_trips, round_trips_a5, hit0, hit_top, origin)`` (the order of
        :meth:`carry`), ``s`` the new index ``long [R, P]`` and ``top = P - 1``; returns the new
        state tuple.  No in-place op and no host sync, so it can be traced or compiled (today
        only :meth:`update` calls it: the round-trip recorder of a chunked run hands its index
        rows to :meth:`update_block` after each chunk instead of carrying this state)."""
        phase, restarts, round_trips, round_trips_a5, hit0, hit_top, origin = state
        phase, hit0, hit_top, restart, trip, trip_a5 = _transition(
            phase, hit0, hit_top, s == 0, s == top, s == origin)
        return (phase, restarts + restart, round_trips + trip, round_trips_a5 + trip_a5, hit0,
                hit_top, origin)

    def carry(self) -> tuple[torch.Tensor, ...]:
        """The counters' state as the tuple :meth:`advance` takes: ``(phase, restarts,
        round_trips, round_trips_a5, hit0, hit_top, origin)`` (the tracker's own tensors)."""
        return (self._phase, self._restarts, self._round_trips, self._round_trips_a5,
                self._hit0, self._hit_top, self._origin)

    def set_carry(self, state: tuple[torch.Tensor, ...], n_updates_added: int) -> None:
        """Take ``state`` (a tuple as :meth:`carry` returns, advanced ``n_updates_added``
        iterations by :meth:`advance`) as the tracker's state."""
        (self._phase, self._restarts, self._round_trips, self._round_trips_a5,
         self._hit0, self._hit_top, self._origin) = state
        self._n_updates += int(n_updates_added)

    def grow(self, primary, added) -> None:
        """The ladder grew (``chains = "auto"``) from ``P`` to ``P + len(added)`` slots: the
        replicas keep their counters and phases (old slot ``s`` is now ``primary[s]``: an
        origin moves with it), new replicas ``P ..`` start at the slots ``added`` with no
        visit yet (phase NONE, zero counters, their slot as origin)."""
        primary = torch.as_tensor(list(primary), dtype=torch.long, device=self.device)
        added = torch.as_tensor(list(added), dtype=torch.long, device=self.device)
        R, n_new = self._shape[0], int(added.numel())
        if primary.numel() != self.n_slots:
            raise ValueError(f"primary must map the {self.n_slots} old slots; got "
                             f"{primary.numel()}")

        def more(t, fill):
            return torch.cat([t, torch.full((R, n_new), fill, dtype=t.dtype, device=t.device)], 1)

        self._phase = more(self._phase, NONE)
        self._restarts = more(self._restarts, 0)
        self._round_trips = more(self._round_trips, 0)
        self._round_trips_a5 = more(self._round_trips_a5, 0)
        self._hit0 = more(self._hit0, False)
        self._hit_top = more(self._hit_top, False)
        self._origin = torch.cat([primary[self._origin], added.expand(R, n_new)], 1)
        self.n_slots += n_new
        self._shape = (R, self.n_slots)
        self._top = self.n_slots - 1

    def shrink(self, replicas, primary) -> None:
        """The ladder shrank (``min_chains``) to ``P'`` slots: new replica ``j`` of system ``r``
        was old replica ``replicas[r][j]`` and keeps its counters and phase (its origin moves to
        ``primary[origin]``, the new slot its old slot folds into); the dropped replicas' counts
        stay in the per-system totals (:attr:`restarts`, ...), not in :meth:`per_replica`."""
        ids = torch.as_tensor([list(r) for r in replicas], dtype=torch.long, device=self.device)
        primary = torch.as_tensor(list(primary), dtype=torch.long, device=self.device)
        R, Pn = ids.shape
        if R != self._shape[0] or primary.numel() != self.n_slots or not 2 <= Pn < self.n_slots:
            raise ValueError(f"shrink: replicas must be [{self._shape[0]}, P' < {self.n_slots}] "
                             f"and primary map the {self.n_slots} old slots; got "
                             f"{list(ids.shape)} and {primary.numel()}")
        counts = torch.stack([self._restarts, self._round_trips, self._round_trips_a5], -1)
        gone = counts.sum(1) - counts.gather(1, ids[..., None].expand(R, Pn, 3)).sum(1)
        self._retired = gone if self._retired is None else self._retired + gone
        self._phase, self._restarts, self._round_trips, self._round_trips_a5, \
            self._hit0, self._hit_top, origin = (
                t.gather(1, ids) for t in (self._phase, self._restarts, self._round_trips,
                                           self._round_trips_a5, self._hit0, self._hit_top,
                                           self._origin))
        self._origin = primary[origin]
        self.n_slots = Pn
        self._shape = (R, Pn)
        self._top = Pn - 1

    def _total(self, counts: torch.Tensor, column: int) -> torch.Tensor:
        total = counts.sum(dim=-1)
        return total if self._retired is None else total + self._retired[:, column]

    # ----------------------------------------------------------------- results
    @property
    def restarts(self) -> torch.Tensor:
        """Restarts per system, ``int64 [R]`` (Syed et al. 2021)."""
        return self._total(self._restarts, 0)

    @property
    def round_trips(self) -> torch.Tensor:
        """Round trips ``P-1 -> 0 -> P-1`` per system, ``int64 [R]`` (Syed et al. 2021)."""
        return self._total(self._round_trips, 1)

    @property
    def round_trips_a5(self) -> torch.Tensor:
        """Origin-to-origin round trips per system, ``int64 [R]`` (Deng et al. 2023, A.5)."""
        return self._total(self._round_trips_a5, 2)

    def per_replica(self) -> dict[str, torch.Tensor]:
        """Per-replica counters, each ``int64 [R, P]`` indexed by replica (not slot)."""
        return {
            "restarts": self._restarts.clone(),
            "round_trips": self._round_trips.clone(),
            "round_trips_a5": self._round_trips_a5.clone(),
        }

    # ------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, torch.Tensor]:
        """Checkpointable state (tensors only; copies, safe to mutate)."""
        state = {
            "phase": self._phase,
            "restarts": self._restarts,
            "round_trips": self._round_trips,
            "round_trips_a5": self._round_trips_a5,
            "origin": self._origin,
            "hit0": self._hit0,
            "hit_top": self._hit_top,
        }
        state = {k: v.clone() for k, v in state.items()}
        if self._retired is not None:
            state["retired"] = self._retired.clone()
        state["n_slots"] = torch.tensor(self.n_slots, dtype=torch.long)
        state["n_updates"] = torch.tensor(self._n_updates, dtype=torch.long)
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore counters from :meth:`state_dict` (moved to this tracker's device)."""
        missing = [k for k in (*_STATE_KEYS, "n_slots", "n_updates") if k not in state]
        if missing:
            raise KeyError(f"state dict is missing keys {missing}")
        n_slots = int(state["n_slots"])
        if n_slots != self.n_slots:
            raise ValueError(f"state has n_slots={n_slots}, tracker has {self.n_slots}")
        dtypes = {"phase": torch.int8, "hit0": torch.bool, "hit_top": torch.bool}
        loaded = {}
        for key in _STATE_KEYS:
            value = torch.as_tensor(state[key])
            if tuple(value.shape) != self._shape:
                raise ValueError(
                    f"state[{key!r}] has shape {tuple(value.shape)}, expected {self._shape}"
                )
            loaded[key] = value.to(device=self.device, dtype=dtypes.get(key, torch.long)).clone()
        self._phase = loaded["phase"]
        self._restarts = loaded["restarts"]
        self._round_trips = loaded["round_trips"]
        self._round_trips_a5 = loaded["round_trips_a5"]
        self._origin = loaded["origin"]
        self._hit0 = loaded["hit0"]
        self._hit_top = loaded["hit_top"]
        self._n_updates = int(state["n_updates"])
        retired = state.get("retired")
        self._retired = None if retired is None else torch.as_tensor(retired).to(
            device=self.device, dtype=torch.long).clone()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(n_systems={self.n_systems}, n_slots={self.n_slots}, "
            f"n_updates={self._n_updates})"
        )


def count_round_trips(index: np.ndarray) -> dict[str, np.ndarray]:
    """Reference (loop-based) counts of a recorded index process ``[K, R, P]`` or ``[K, P]``
    (row 0 the initial index): ``{"restarts", "round_trips", "round_trips_a5"}``, each an
    ``int64`` array ``[R]``."""
    idx = _checked_index(index)
    n_systems, n_slots = idx.shape[1:]
    restarts = np.zeros(n_systems, dtype=np.int64)
    round_trips = np.zeros(n_systems, dtype=np.int64)
    round_trips_a5 = np.zeros(n_systems, dtype=np.int64)
    for r in range(n_systems):
        for replica in range(n_slots):
            path = [int(p) for p in idx[:, r, replica]]
            n_restarts, n_trips = _syed_counts(path, n_slots - 1)
            restarts[r] += n_restarts
            round_trips[r] += n_trips
            round_trips_a5[r] += _deng_count(path, n_slots - 1)
    return {"restarts": restarts, "round_trips": round_trips, "round_trips_a5": round_trips_a5}


def _checked_index(index: np.ndarray) -> np.ndarray:
    """``index`` as an integer ``[K, R, P]`` array (a ``[K, P]`` one gets ``R = 1``), every
    row a permutation of ``0..P-1``; a ``ValueError`` otherwise."""
    idx = np.asarray(index)
    if idx.ndim == 2:
        idx = idx[:, None, :]
    if idx.ndim != 3 or idx.shape[0] < 1 or idx.shape[2] < 2:
        raise ValueError(f"index must have shape [K, R, P] or [K, P] with P >= 2, got {idx.shape}")
    if not np.issubdtype(idx.dtype, np.integer):
        raise ValueError(f"index must be an integer array, got dtype {idx.dtype}")
    n_slots = idx.shape[2]
    if not np.array_equal(np.sort(idx, axis=-1), np.broadcast_to(np.arange(n_slots), idx.shape)):
        raise ValueError("index: every [k, r] row must be a permutation of 0..P-1")
    return idx


def _syed_counts(path: list[int], top: int) -> tuple[int, int]:
    """Syed et al. (2021): ``(restarts, round trips P-1 -> 0 -> P-1)`` of one replica's slots
    ``path`` (its initial slot first)."""
    restarts = round_trips = 0
    phase = AT_TOP_SIDE if path[0] == top else NONE
    for slot in path[1:]:
        if slot == top:
            if phase == DOWN_DONE:
                round_trips += 1
            phase = AT_TOP_SIDE
        elif slot == 0 and phase != NONE:  # 0 before any visit to P-1: ignored
            if phase == AT_TOP_SIDE:
                restarts += 1
            phase = DOWN_DONE
    return restarts, round_trips


def _deng_count(path: list[int], top: int) -> int:
    """Deng et al. (2023), App. A.5: the round trips of one replica's slots ``path`` (hit both
    ends, then return to the origin ``path[0]``)."""
    origin, count = path[0], 0
    hit0, hit_top = origin == 0, origin == top
    for slot in path[1:]:
        hit0 = hit0 or slot == 0
        hit_top = hit_top or slot == top
        if hit0 and hit_top and slot == origin:
            count += 1
            hit0, hit_top = origin == 0, origin == top
    return count
