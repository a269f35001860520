"""Where the network replicas live, for the deep recorders: per-slot quantities (test logits,
accuracies) are computed by the process that holds the slot's replica and gathered, in slot
order, to every process (:class:`Placement`).

One process (a :class:`nrpt.core.engine.PTEngine`): every replica is here.  Several (a
:class:`nrpt.core.sharding.ShardedEngine`): each process evaluates the replicas of its block,
and one ``all_gather`` of the ``[S, ...]`` results (zeros where another process owns the slot)
gives every process the owners' rows.  Each replica is evaluated alone (one row at a time),
so its result does not depend on which or how many replicas a process holds: the model
average, summed in slot order, is bit for bit that of one process on CPU."""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["Placement"]


class Placement:
    """The replicas of ``engine`` (one system) as the deep recorders read them."""

    def __init__(self, engine):
        self.engine = engine
        #: test logits computed at the engine's current iteration, by (local row, net, input,
        #: strategy): the model average and the per-epoch rows both evaluate slot 0 at an
        #: epoch's end, and the second reads the first's (the same call, the same numbers)
        self._memo: tuple[int, dict] = (-1, {})

    @property
    def comm(self):
        return getattr(self.engine, "comm", None)

    def _local_of(self, replica_at: torch.Tensor, slots) -> list[int | None]:
        """The local row of each slot's replica, ``None`` where another process holds it."""
        eng = self.engine
        block = getattr(eng, "block", None)
        lo, hi = (0, eng.P) if block is None else (block.lo, block.hi)
        out: list[int | None] = []
        for s in slots:
            r = int(replica_at[0, s])
            out.append(r - lo if lo <= r < hi else None)
        return out

    def per_slot(self, replica_at: torch.Tensor, slots, fn: Callable, shape, dtype,
                 rows: bool = False) -> torch.Tensor:
        """``fn(theta[dim], bn[buffer_dim]) -> [*shape]`` of the replica at each of ``slots``,
        stacked ``[S, *shape]`` in slot order on every process (a collective when sharded:
        every process calls it with the same ``slots``); ``rows=True``: ``fn(theta, bn,
        row)`` is also told the replica's local row."""
        eng, slots = self.engine, [int(s) for s in slots]
        x, bn = eng.state.x[0], eng.state.extras["bn"][0]
        out = torch.zeros((len(slots), *shape), dtype=dtype, device=x.device)
        for i, row in enumerate(self._local_of(replica_at, slots)):
            if row is not None:
                out[i] = fn(x[row], bn[row], row) if rows else fn(x[row], bn[row])
        comm = self.comm
        if comm is None:
            return out
        reps = replica_at[:, slots]
        return comm.gather_rows(out[None], comm.owner(reps, eng.P))[0]

    def models(self, replica_at: torch.Tensor, slots) -> tuple[torch.Tensor, torch.Tensor]:
        """``(theta[S, dim], bn[S, buffer_dim])`` of the replicas at ``slots`` on every process
        (sharded: gathered; the collected models are stored)."""
        eng = self.engine
        dim, bdim = eng.state.x.shape[-1], eng.state.extras["bn"].shape[-1]
        both = self.per_slot(replica_at, slots,
                             lambda t, b: torch.cat([t, b.to(t.dtype)]), (dim + bdim,),
                             eng.state.x.dtype)
        return both[:, :dim], both[:, dim:].to(eng.state.extras["bn"].dtype)

    def logits(self, replica_at: torch.Tensor, slots, net, x_test, strategy: str,
               classes: int) -> torch.Tensor:
        """Eval-mode test logits ``[S, n, classes]`` of the replicas at ``slots``, each replica
        evaluated alone where it lives."""
        return self.per_slot(replica_at, slots, self.test_logits(net, x_test, strategy),
                             (x_test.shape[0], classes), net.dtype, rows=True)

    def forget(self) -> None:
        """Drop the kept test logits (the per-epoch rows call it when done with them: the
        logits of every slot need not stay in memory until the next evaluation)."""
        self._memo = (-1, {})

    def test_logits(self, net, x_test, strategy: str) -> Callable:
        """``fn(theta, bn, row) -> logits[n, classes]`` of one replica (eval mode, evaluated
        alone), for :meth:`per_slot` with ``rows=True``; kept for the rest of the engine's
        iteration, so that another recorder asking for the same replica's logits at the same
        iteration reads them instead of evaluating them again."""
        def one(theta, bn, row):
            k, done = self._memo
            if k != self.engine.k:
                done = {}
                self._memo = (self.engine.k, done)
            key = (row, id(net), id(x_test), strategy)
            if key not in done:
                done[key] = net.logits(theta[None].to(net.dtype), bn[None].to(net.dtype),
                                       x_test, strategy)[0]
            return done[key]

        return one
