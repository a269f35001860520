"""Recorders: one object per measured quantity (the recorder role, :mod:`nrpt.roles`).

A recorder sees every :class:`~nrpt.roles.Iteration` (or a fused :class:`~nrpt.roles.IterationBlock`
through ``record_block``, ending in the same state bit for bit), keeps running statistics on
the engine's device, reduces them to JSON-ready summary fields since the last
``start_segment(reset=True)``, and checkpoints itself.

=================  =============================================================================
``swaps``          per-pair swap acceptance, swaps executed, explorer acceptance per slot,
                   rejected non-finite proposals                          (:class:`SwapStats`)
``round_trips``    restarts and round trips (Syed et al.; Deng et al. A.5) (:class:`RoundTrips`)
``spread``         running mean / sd of the states at chosen slots        (:class:`SlotSpread`)
``trace``          adapted tables and per-pair swap-indicator rate        (:class:`Trace`)
``log_z``          online log Z       (:class:`nrpt.recorders.log_z.SteppingStone`)
``slot_energies``  energies by slot for the local barrier
                   (:class:`nrpt.diagnostics.barrier.SlotEnergyRecorder`)
``draws``          slot-0 draws, energies, index process (:class:`nrpt.recorders.draws.Draws`)
=================  =============================================================================
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from nrpt.diagnostics import RoundTripTracker
from nrpt.host import viewable
from nrpt.recorders.pending import PendingRows
from nrpt.roles import BLOCK, Iteration, IterationBlock, RecorderBase
from nrpt.swap.schemes import is_sweep

__all__ = ["SwapStats", "RoundTrips", "SlotSpread", "Trace", "per_system", "json_ready"]


def json_ready(v):
    """Tensors/arrays to lists, non-finite floats to None (JSON has no NaN), recursively."""
    if isinstance(v, torch.Tensor):
        v = v.detach().cpu().tolist()
    elif isinstance(v, np.ndarray):
        v = v.tolist()
    elif isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, dict):
        return {k: json_ready(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [json_ready(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def ordered_sum(total: torch.Tensor, terms: torch.Tensor) -> torch.Tensor:
    """``total + terms[0] + terms[1] + ...`` added in that order, as ``U`` in-place adds of
    ``record`` would make them, so the result is the one-by-one sum bit for bit: float64 on the
    CPU as one cumulative sum along the leading axis (a sequential scan), anything else as
    ``U`` adds (torch's CPU cumsum accumulates float32 in float64, which rounds differently,
    and the adaptors that read these sums between rounds would then steer a fused run away
    from the plain one).  Returns a tensor of ``total``'s shape and dtype."""
    terms = terms.to(total.dtype)
    if total.dtype == torch.float64 and total.device.type == "cpu":
        return torch.cat([total[None], terms]).cumsum(0)[-1]
    for t in terms:
        total = total + t
    return total


def per_system(t, R: int):
    """A per-system quantity for the summary: the value itself when R = 1, else a list."""
    vals = json_ready(t)
    return vals[0] if R == 1 and isinstance(vals, list) else vals


class SwapStats(RecorderBase):
    """Per-pair swap and per-slot explorer statistics since the last reset.

    Only adjacent pairs proposed by the scheme count as attempts (APE's non-adjacent pairs do
    not enter the per-pair table)."""

    name = "swaps"

    def __init__(self, R: int, P: int, dtype=torch.float64, device="cpu"):
        self.R, self.P, self.dtype, self.device = R, P, dtype, device
        self.nonfinite_total = torch.zeros(R, P, dtype=torch.int64, device=device)
        self.start_segment(True)

    def start_segment(self, reset: bool, length: int = 0) -> None:
        if not reset:
            return
        R, P, dev, dt = self.R, self.P, self.device, self.dtype
        self.attempts = torch.zeros(R, P - 1, dtype=torch.int64, device=dev)
        self.swaps = torch.zeros(R, P - 1, dtype=torch.int64, device=dev)
        self.accept_sum = torch.zeros(R, P - 1, dtype=dt, device=dev)
        self.explore_sum = torch.zeros(R, P, dtype=dt, device=dev)
        self.nonfinite = torch.zeros(R, P, dtype=torch.int64, device=dev)
        self.n = 0

    def record(self, it: Iteration) -> None:
        for d in it.decisions:
            if is_sweep(d.lo, self.R, self.P):  # pairs in slot order: plain adds
                self.attempts += d.active
                self.accept_sum += torch.where(d.active, d.prob, torch.zeros_like(d.prob))
                self.swaps += d.accepted
                continue
            adjacent = d.active & (d.hi - d.lo == 1)
            self.attempts.scatter_add_(1, d.lo, adjacent.long())
            self.accept_sum.scatter_add_(1, d.lo, torch.where(adjacent, d.prob,
                                                              torch.zeros_like(d.prob)))
            self.swaps.scatter_add_(1, d.lo, (d.accepted & adjacent).long())
        self.explore_sum += it.explore_accept
        self.nonfinite += it.nonfinite
        self.nonfinite_total += it.nonfinite
        self.n += 1

    def record_block(self, block: IterationBlock) -> None:
        """``U`` iterations of a sweep scheme (pairs in slot order) at once: counts summed over
        the block, float sums added in iteration order (:func:`ordered_sum`)."""
        active = block.active
        self.attempts += active.sum(0)
        self.swaps += block.accepted.sum(0)
        accept = torch.where(active, block.prob, torch.zeros_like(block.prob))
        self.accept_sum.copy_(ordered_sum(self.accept_sum, accept))
        self.explore_sum.copy_(ordered_sum(self.explore_sum, block.explore_accept))
        nonfinite = block.nonfinite.sum(0)
        self.nonfinite += nonfinite
        self.nonfinite_total += nonfinite
        self.n += block.U

    def acceptance(self) -> torch.Tensor:
        """Mean of min(1, alpha) per adjacent pair ``[R, P-1]`` (NaN where never attempted)."""
        return self.accept_sum / self.attempts.to(self.dtype)

    def rejection(self) -> torch.Tensor:
        """Estimated rejection rate per pair, ``1 - acceptance`` (NaN if never attempted)."""
        return 1.0 - self.acceptance()

    def explorer_acceptance(self) -> torch.Tensor:
        """Mean explorer acceptance probability per slot ``[R, P]``."""
        return self.explore_sum / max(self.n, 1)

    def barrier(self) -> torch.Tensor:
        """``Lambda-hat = sum_p r_p`` per system (pairs never attempted count 0)."""
        return self.rejection().nan_to_num(nan=0.0).sum(1)

    def summary(self) -> dict[str, Any]:
        R = self.R
        return {"swap_acceptance": per_system(self.acceptance(), R),
                "swaps_executed": per_system(self.swaps, R),
                "swap_attempts": per_system(self.attempts, R),
                "explorer_acceptance": per_system(self.explorer_acceptance(), R),
                "nonfinite_proposals": int(self.nonfinite_total.sum())}

    def segment_row(self) -> dict[str, Any]:
        acc = self.acceptance().cpu().double().numpy()
        with np.errstate(all="ignore"):
            lo = np.nanmin(np.where(np.isnan(acc), np.inf, acc), axis=1)
            finite = np.isfinite(acc)
            mean = np.where(finite.any(1), np.nansum(np.where(finite, acc, 0), 1)
                            / np.maximum(finite.sum(1), 1), np.nan)
        lo = np.where(np.isinf(lo), np.nan, lo)
        return {"min_swap_acceptance": float(np.mean(lo)),
                "mean_swap_acceptance": float(np.mean(mean)),
                "barrier": float(self.barrier().mean())}

    def follow_ladder(self, m) -> None:
        """The ladder grew or shrank: fresh per-pair statistics for the new ladder (a new round
        starts anyway); the run's non-finite counts stay at their slots' new places (a dropped
        slot's fold into the nearest kept slot, :meth:`~nrpt.roles.SlotMap.shrink`)."""
        total = torch.zeros(self.R, m.new, dtype=torch.int64, device=self.device)
        total.index_add_(1, torch.as_tensor(m.primary, device=self.device),
                         self.nonfinite_total.to(torch.int64))
        self.P, self.nonfinite_total = m.new, total
        self.start_segment(True)

    def state_dict(self) -> dict:
        return {"attempts": self.attempts, "swaps": self.swaps, "accept_sum": self.accept_sum,
                "explore_sum": self.explore_sum, "nonfinite": self.nonfinite,
                "nonfinite_total": self.nonfinite_total, "n": self.n}

    def load_state_dict(self, sd: dict) -> None:
        for k, v in sd.items():
            setattr(self, k, v.to(self.device) if isinstance(v, torch.Tensor) else v)


class RoundTrips(RecorderBase):
    """Restarts and round trips (:class:`nrpt.diagnostics.RoundTripTracker`, tracked over the
    whole run; the summary reports the counts since the last reset, and ``*_total`` over the
    whole run when the two differ)."""

    name = "round_trips"

    #: iterations of index rows a chunked run hands over before the tracker advances (one
    #: prefix scan per :data:`PENDING` iterations instead of one per chunk)
    PENDING = 64

    def __init__(self, slot_of: torch.Tensor, P: int):
        self.tracker = RoundTripTracker(slot_of, P)
        self.R = slot_of.shape[0]
        #: the index rows ``[U, R, P]`` not yet given to the tracker
        self._pending = PendingRows(self.PENDING)
        self.start_segment(True)

    def _flush(self) -> None:
        """Advance the tracker over the pending rows (the same counts and state as advancing it
        chunk by chunk, or iteration by iteration: :meth:`RoundTripTracker.update_block`)."""
        rows = self._pending.take()
        if rows is not None:
            self.tracker.update_block(rows[0])

    def _counts(self) -> dict[str, torch.Tensor]:
        self._flush()
        t = self.tracker
        return {"restarts": t.restarts.clone(), "round_trips": t.round_trips.clone(),
                "round_trips_a5": t.round_trips_a5.clone()}

    def start_segment(self, reset: bool, length: int = 0) -> None:
        if reset:
            self.base = self._counts()
            self.n = 0

    def record(self, it: Iteration) -> None:
        # (buffered as a chunk's rows are: one prefix scan per PENDING iterations instead of
        # some twenty small ops per iteration, the same counts; a copy: the engine's slot_of
        # may be replaced in place by a resize)
        self.n += 1
        if self._pending.add(it.slot_of[None].clone()):
            self._flush()

    def record_block(self, block: IterationBlock) -> None:
        # (= U updates, in a few ops per PENDING iterations; a copy: the block's tensors are
        # the caller's, which may reuse them)
        self.n += block.U
        if self._pending.add(block.slot_of.clone(), n=block.U):
            self._flush()

    def counts(self) -> dict[str, torch.Tensor]:
        """Counts per system since the last reset."""
        now = self._counts()
        return {k: now[k] - self.base[k] for k in now}

    def summary(self) -> dict[str, Any]:
        R, n = self.R, max(self.n, 1)
        c = self.counts()
        out = {k: per_system(v, R) for k, v in c.items()}
        out.update({f"{k}_per_1000": per_system(v.double() * 1000.0 / n, R) for k, v in c.items()})
        total = self._counts()
        if any(bool((total[k] != c[k]).any()) for k in c):
            out.update({f"{k}_total": per_system(v, R) for k, v in total.items()})
        return out

    def segment_row(self) -> dict[str, Any]:
        c = self.counts()
        return {"restarts": float(c["restarts"].double().mean()),
                "round_trips": float(c["round_trips"].double().mean())}

    def follow_ladder(self, m) -> None:
        """The ladder grew or shrank: the tracker follows (its counts per system are kept)."""
        self._flush()
        if m.shrinks:
            self.tracker.shrink(m.replicas, m.primary)
        else:
            self.tracker.grow(m.primary, m.added)

    def state_dict(self) -> dict:
        self._flush()
        return {"tracker": self.tracker.state_dict(), "base": self.base, "n": self.n}

    def load_state_dict(self, sd: dict) -> None:
        self._pending.clear()
        self.tracker.load_state_dict(sd["tracker"])
        self.base, self.n = sd["base"], int(sd["n"])


class SlotSpread(RecorderBase):
    """Running mean and variance of the states at ``slots`` (default all) since the last reset,
    ``[R, S, dim]``.  The slice explorer's width adaptor reads :meth:`scale`; the health checks
    read the hottest slot's spread.

    The rows are taken in groups of :data:`GROUP` consecutive iterations (counted since the
    reset): a full group's mean and sum of squared deviations are merged into the running
    ones (Chan, Golub and LeVeque's pairwise update), a partial group waits (and is part of the
    checkpoint).  The grouping depends on the rows alone, not on whether they come one by one
    (:meth:`record`) or in chunks (:meth:`record_block`, the fused loop): both give the same
    numbers bit for bit, wherever a run's chunks fall; and a chunk costs one merge per group
    instead of a Welford step per iteration.

    ``covariance``: also the co-moment ``[R, S, dim, dim]`` (:meth:`covariance`, merged the
    same way, batched over slots), for the per-slot preconditioner
    (:class:`nrpt.adapt.metric.MetricAdaptor`); the recorder then keeps every statistic in
    float64 whatever the run's dtype."""

    name = "spread"
    #: iterations per merged group (the contracts' block length: the fused loop's chunk)
    GROUP = BLOCK

    def __init__(self, R: int, P: int, dim: int, slots: list[int] | None = None,
                 dtype=torch.float64, device="cpu", covariance: bool = False):
        self.slots = list(range(P)) if slots is None else [int(s) for s in slots]
        self.shape = (R, len(self.slots), dim)
        self.reads_slots = tuple(self.slots)
        self.with_cov = bool(covariance)
        self.dtype, self.device = (torch.float64 if self.with_cov else dtype), device
        self.start_segment(True)

    def start_segment(self, reset: bool, length: int = 0) -> None:
        if reset:
            self._n = 0
            self._mean = torch.zeros(self.shape, dtype=self.dtype, device=self.device)
            self._m2 = torch.zeros_like(self._mean)
            self._c2 = (torch.zeros((*self.shape, self.shape[-1]), dtype=self.dtype,
                                    device=self.device) if self.with_cov else None)
            # the partial group: its first ``_k`` rows of ``_part [GROUP, R, S, dim]`` (copies,
            # allocated once: no view of a caller's block is kept)
            self._k, self._part = 0, None

    def record(self, it: Iteration) -> None:
        self._take(it.slot_x(self.slots).to(self.dtype)[None])

    def record_block(self, block: IterationBlock) -> None:
        """``U`` iterations at once: the same groups and merges as ``U`` calls of
        :meth:`record`."""
        self._take(block.watched_x(self.slots, view=True).to(self.dtype))

    def _take(self, x: torch.Tensor) -> None:
        """Rows ``x[m, R, S, dim]``, in iteration order."""
        G, i, m = self.GROUP, 0, x.shape[0]
        while i < m:
            if not self._k and m - i >= G:  # whole groups inside x (views: no copy)
                whole = (m - i) // G
                if whole > 1 and not self.with_cov and x[0].numel() < WELFORD_ROWS:
                    self._merge_groups(x[i:i + whole * G])
                else:
                    self._merge(x[i:i + G])
                    whole = 1
                i += whole * G
                continue
            take = min(G - self._k, m - i)
            self._pending()[self._k:self._k + take] = x[i:i + take]
            self._k += take
            i += take
            if self._k == G:
                self._merge(self._part)  # (its statistics are new tensors: the buffer is free)
                self._k = 0

    def _pending(self) -> torch.Tensor:
        """The partial group's buffer ``[GROUP, R, S, dim]``."""
        if self._part is None:
            self._part = torch.empty((self.GROUP, *self.shape), dtype=self.dtype,
                                     device=self.device)
        return self._part

    def _merge(self, group: torch.Tensor) -> None:
        if self.with_cov:
            self._c2 = _chan_merge_cov(self._n, self._mean, self._c2, group)
        self._n, self._mean, self._m2 = _chan_merge(self._n, self._mean, self._m2, group)

    def _merge_groups(self, rows: torch.Tensor) -> None:
        """:meth:`_merge` of each group of ``GROUP`` consecutive ``rows`` in turn, the groups'
        variances and means by one ``torch.var_mean`` over the stacked groups (each group's
        numbers as its own call gives them: the groups only add an outer axis;
        ``tests/test_record_block.py`` checks it)."""
        G = self.GROUP
        groups = rows.contiguous().view(rows.shape[0] // G, G, *rows.shape[1:])
        var, mean = torch.var_mean(groups, 1, correction=0)
        m2 = var * G
        # float64 on the CPU: the merges on NumPy views (a small NumPy op costs a third to a
        # half of a torch op; IEEE sums, differences, squares and products by the same Python
        # floats, in the same order: the same numbers)
        host = viewable(rows)
        if host:
            mean, m2 = mean.numpy(), m2.numpy()
            n, mean_a, m2_a = self._n, self._mean.numpy(), self._m2.numpy()
        else:
            n, mean_a, m2_a = self._n, self._mean, self._m2
        for j in range(groups.shape[0]):
            mean_b, m2_b = (mean[j], m2[j]) if n else (mean[j].copy(), m2[j].copy()) if host \
                else (mean[j].clone(), m2[j].clone())
            n, mean_a, m2_a = _chan_combine(n, mean_a, m2_a, G, mean_b, m2_b)
        if host:
            mean_a, m2_a = torch.from_numpy(mean_a), torch.from_numpy(m2_a)
        self._n, self._mean, self._m2 = n, mean_a, m2_a

    def _stats(self) -> tuple[int, torch.Tensor, torch.Tensor]:
        """``(n, mean, m2)`` of every row so far (the partial group merged, not stored)."""
        if not self._k:
            return self._n, self._mean, self._m2
        return _chan_merge(self._n, self._mean, self._m2, self._part[:self._k])

    def moments(self) -> tuple[int, torch.Tensor, torch.Tensor]:
        """``(n, mean [R, S, dim], co-moment [R, S, dim, dim])`` of every row since the reset
        (``covariance`` recorders only; the co-moment is ``sum (x - mean)(x - mean)^T``)."""
        if not self.with_cov:
            raise ValueError("this spread recorder keeps no covariance (covariance=False)")
        if not self._k:
            return self._n, self._mean, self._c2
        group = self._part[:self._k]
        c2 = _chan_merge_cov(self._n, self._mean, self._c2, group)
        return self._n + group.shape[0], _chan_merge(self._n, self._mean, self._m2, group)[1], c2

    @property
    def n(self) -> int:
        """Rows recorded since the reset."""
        return self._n + self._k

    @property
    def mean(self) -> torch.Tensor:
        """Per-coordinate mean ``[R, S, dim]``."""
        return self._stats()[1]

    def sd(self) -> torch.Tensor:
        """Per-coordinate standard deviation ``[R, S, dim]`` (NaN before two iterations)."""
        n, _, m2 = self._stats()
        if n < 2:
            return torch.full(self.shape, math.nan, dtype=self.dtype, device=self.device)
        return (m2 / (n - 1)).sqrt()

    def scale(self) -> torch.Tensor:
        """Mean over coordinates of the standard deviation, ``[R, S]``."""
        return self.sd().mean(-1)

    def follow_ladder(self, m) -> None:
        """The ladder grew: the watched slots move to their new places (the hottest stays the
        hottest; ``slots = None`` at build: every slot of the new ladder), fresh statistics."""
        every = self.slots == list(range(m.old))
        self.slots = list(range(m.new)) if every else \
            list(dict.fromkeys(m.primary[s] for s in self.slots))
        self.shape = (self.shape[0], len(self.slots), self.shape[2])
        self.reads_slots = tuple(self.slots)
        self.start_segment(True)

    def state_dict(self) -> dict:
        rows = (self._part[:self._k].clone() if self._k
                else torch.zeros((0, *self.shape), dtype=self.dtype, device=self.device))
        return {"n": self._n, "mean": self._mean, "m2": self._m2, "rows": rows,
                **({"c2": self._c2} if self.with_cov else {})}

    def load_state_dict(self, sd: dict) -> None:
        self._n, self._mean, self._m2 = int(sd["n"]), sd["mean"], sd["m2"]
        if self.with_cov:
            self._c2 = sd["c2"]
        rows = sd.get("rows")  # (checkpoints before the grouping: none pending)
        self._k = 0 if rows is None else int(rows.shape[0])
        if self._k:
            self._pending()[:self._k] = rows


#: a group whose rows hold at least this many float64 numbers (on the CPU) takes its variance
#: and mean from :func:`_welford` rather than ``torch.var_mean``: torch's CPU Welford reduction
#: over the leading axis runs element by element (4.6 ms for ``[8, 1, 2, 10^4]``, 9x the
#: eight elementwise steps; below ~500 numbers a row the one call is cheaper)
WELFORD_ROWS = 1024


def _welford(group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.var_mean(group, 0, correction=0)`` as torch's CPU kernel computes it (Welford's
    update per row, in row order, no fused multiply-add), by elementwise ops over the rows:
    the same numbers (``tests/test_record_block.py`` checks them bit for bit)."""
    group = group.detach()  # (statistics of recorded values: no graph, and out= needs none)
    mean = torch.zeros_like(group[0], memory_format=torch.contiguous_format)
    m2, delta, t = torch.zeros_like(mean), torch.empty_like(mean), torch.empty_like(mean)
    for k in range(group.shape[0]):  # (in place: the same IEEE operations, no allocation)
        x = group[k]
        torch.sub(x, mean, out=delta)
        mean.add_(torch.div(delta, float(k + 1), out=t))  # mean + delta / (k + 1)
        m2.add_(torch.sub(x, mean, out=t).mul_(delta))  # m2 + (x - mean) delta
    return m2.div_(group.shape[0]), mean


def _var_mean(group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.var_mean(group, 0, correction=0)``; by :func:`_welford` for long float64 rows on
    the CPU (:data:`WELFORD_ROWS`: elementwise, so any memory layout gives its numbers; torch's
    reduction gets contiguous rows, one layout and so one rounding however they were built)."""
    if group.dtype == torch.float64 and group.device.type == "cpu" and \
            group[0].numel() >= WELFORD_ROWS:
        return _welford(group)
    return torch.var_mean(group.contiguous(), 0, correction=0)


def _chan_merge(n_a: int, mean_a: torch.Tensor, m2_a: torch.Tensor, group: torch.Tensor):
    """``(n, mean, m2)`` of ``n_a`` rows summarized by ``(mean_a, m2_a)`` and the rows of
    ``group[m, ...]`` (Chan, Golub and LeVeque's pairwise update)."""
    n_b = group.shape[0]
    var_b, mean_b = _var_mean(group)
    return _chan_combine(n_a, mean_a, m2_a, n_b, mean_b, var_b * n_b)


def _chan_combine(n_a: int, mean_a: torch.Tensor, m2_a: torch.Tensor, n_b: int,
                  mean_b: torch.Tensor, m2_b: torch.Tensor):
    """``(n, mean, m2)`` of two sets of rows summarized by ``(n, mean, m2)`` each (tensors, or
    NumPy arrays: torch's ``square`` of a float64 is the product ``x x``, as ``np.square``)."""
    if n_a == 0:
        return n_b, mean_b, m2_b
    n = n_a + n_b
    delta = mean_b - mean_a
    square = delta.square() if isinstance(delta, torch.Tensor) else np.square(delta)
    return n, mean_a + delta * (n_b / n), m2_a + m2_b + square * (n_a * n_b / n)


def _chan_merge_cov(n_a: int, mean_a: torch.Tensor, c2_a: torch.Tensor, group: torch.Tensor):
    """The co-moment ``[..., dim, dim]`` of ``n_a`` rows summarized by ``(mean_a, c2_a)`` and
    the rows of ``group[m, ..., dim]`` (the pairwise update of :func:`_chan_merge`, batched over
    every leading index: no loop over slots)."""
    group = group.contiguous()
    n_b = group.shape[0]
    mean_b = group.mean(0)
    dev = group - mean_b
    c2_b = torch.einsum("m...i,m...j->...ij", dev, dev)
    if n_a == 0:
        return c2_b
    delta = mean_b - mean_a
    return c2_a + c2_b + delta[..., :, None] * delta[..., None, :] * (n_a * n_b / (n_a + n_b))


def _stacked(records: list[torch.Tensor]) -> list[torch.Tensor] | torch.Tensor:
    """``records`` as one tensor (``torch.stack``), or as the list itself when empty or when
    their shapes differ (a ladder that grew or shrank)."""
    if not records or any(r.shape != records[0].shape for r in records):
        return list(records)
    return torch.stack(records)


class Trace(RecorderBase):
    """Every ``every`` iterations: the iteration, the rule's ``C`` (if it has one), the per-slot
    ``values`` being adapted (the learning rates for stochastic-gradient runs, else the
    schedule) and the mean swap indicator per adjacent pair since the previous record (all
    listed pairs, active or not: what the stochastic-approximation adaptors drive to ``S``)."""

    name = "trace"

    def __init__(self, every: int = 20, values: str = "step_size"):
        if int(every) != every or every < 1:
            raise ValueError(f"every must be an integer >= 1; got {every!r}")
        self.every, self.values = int(every), values
        self.k: list[int] = []
        self.C: list[torch.Tensor] = []
        self.table: list[torch.Tensor] = []
        self.rate: list[torch.Tensor] = []
        self._sum = self._n = self.total_sum = self.total_n = None

    def record(self, it: Iteration) -> None:
        A, listed = it.pair_indicators
        if self._sum is None:
            self._sum, self._n = torch.zeros_like(A), torch.zeros_like(A)
            self.total_sum, self.total_n = torch.zeros_like(A), torch.zeros_like(A)
        self._sum += A
        self._n += listed
        self.total_sum += A
        self.total_n += listed
        if (it.k + 1) % self.every == 0:
            self.k.append(it.k + 1)
            if "C" in it.params:
                self.C.append(it.params["C"][:, 0].clone())
            self.table.append((it.step_size if self.values == "step_size"
                               else it.schedule).clone())
            self.rate.append(self._sum / self._n.clamp_min(1))
            self._sum.zero_()
            self._n.zero_()

    def record_block(self, block: IterationBlock) -> None:
        """``U`` iterations of a sweep scheme (every pair listed) at once: the indicators summed
        segment by segment between the record points inside the block (a Python loop over those
        points only), the rest carried.  The sums count 0/1 verdicts, exact in any order, so
        the records equal those of ``U`` calls of :meth:`record` bit for bit."""
        A = block.decision.to(block.schedule.dtype)  # [U, R, P-1]; listed: all ones
        if self._sum is None:
            self._sum, self._n = torch.zeros_like(A[0]), torch.zeros_like(A[0])
            self.total_sum, self.total_n = torch.zeros_like(A[0]), torch.zeros_like(A[0])
        U, k0, every = block.U, block.k0, self.every
        self.total_sum += A.sum(0)
        self.total_n += U
        start = 0
        table = block.step_size if self.values == "step_size" else block.schedule
        for u in range((every - (k0 + 1) % every) % every, U, every):  # (k0 + u + 1) % every == 0
            self.k.append(k0 + u + 1)
            if "C" in block.params:
                self.C.append(block.params["C"][u][:, 0].clone())
            self.table.append(table[u].clone())
            self._sum += A[start:u + 1].sum(0)
            self._n += u + 1 - start
            self.rate.append(self._sum / self._n.clamp_min(1))
            self._sum.zero_()
            self._n.zero_()
            start = u + 1
        if start < U:
            self._sum += A[start:].sum(0)
            self._n += U - start

    def indicator_rate(self) -> torch.Tensor | None:
        """Mean 0/1 verdict per adjacent pair over the run ``[R, P-1]``."""
        if self.total_sum is None:
            return None
        return self.total_sum / self.total_n.clamp_min(1)

    def arrays(self) -> dict[str, np.ndarray]:
        """``k[T]``, ``C[T, R]``, ``values[T, R, P]`` (named ``learning_rates`` or
        ``schedule``), ``pair_rate[T, R, P-1]``."""
        out = {"k": np.asarray(self.k, dtype=np.int64)}
        if self.C:
            out["C"] = torch.stack(self.C).cpu().numpy()
        if self.table:
            name = "learning_rates" if self.values == "step_size" else "schedule"
            out[name] = torch.stack(self.table).cpu().numpy()
            out["pair_rate"] = torch.stack(self.rate).cpu().numpy()
        return out

    def summary(self) -> dict[str, Any]:
        rate = self.indicator_rate()
        if rate is None:
            return {}
        return {"indicator_rate": per_system(rate, rate.shape[0])}

    def state_dict(self) -> dict:
        # each record list as one stacked tensor (a checkpoint stores every tensor as a file of
        # its own: a headline run's 3000 small ones were ~0.3 s CPU of its six checkpoints)
        return {"k": list(self.k), "C": _stacked(self.C), "table": _stacked(self.table),
                "rate": _stacked(self.rate), "sum": self._sum, "n": self._n,
                "total_sum": self.total_sum, "total_n": self.total_n}

    def load_state_dict(self, sd: dict) -> None:
        # (a stacked tensor gives its rows; a list: a checkpoint from before the stacking)
        self.k, self.C = list(sd["k"]), list(sd["C"])
        self.table, self.rate = list(sd["table"]), list(sd["rate"])
        self._sum, self._n = sd["sum"], sd["n"]
        self.total_sum, self.total_n = sd["total_sum"], sd["total_n"]
