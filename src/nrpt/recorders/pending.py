"""Rows of the plain loop's iterations, buffered and taken a block at a time (a recorder's
"buffer rows, take them every 64 iterations").

Why: a recorder that does a handful of tensor ops per iteration costs more than the ops
themselves at small ``R x d`` (the per-iteration tail-acceptance recorder cost 28 % of a 2-d
MALA rounds run's CPU; buffered, 2.5 %).  A recorder that can take a block of ``U`` iterations
at once (as it does for a fused chunk's :class:`~nrpt.roles.IterationBlock`) buffers the plain
loop's rows here and takes them when :data:`EVERY` iterations are pending, and before anything
reads its state (summary, checkpoint, ladder change).

The rows are concatenated along their first (iteration) axis with :func:`torch.cat`, a copy: the
values are exactly the rows given, so taking them in one block or in several gives the same
numbers wherever the recorder's block update does (its own grouping of sums is its business).
The caller hands over tensors it owns: the engine's tensors may be overwritten in place by the
next iteration, so pass a copy (``.clone()``) unless the tensor is freshly made (an index or a
gather).
"""

from __future__ import annotations

import torch

__all__ = ["EVERY", "PendingRows"]

#: iterations buffered before a recorder takes them (RoundTrips, TailAcceptance and the deep
#: IndexRecorder: 64)
EVERY = 64


class PendingRows:
    """Buffered rows of one or more streams, each with a leading iteration axis.

    ``add(*rows, n=1)`` appends one tensor per stream (``[n, ...]``: ``n`` iterations) and says
    whether :attr:`every` iterations are now pending; :meth:`take` returns the streams
    concatenated (``None`` when nothing is pending) and empties the buffer."""

    def __init__(self, every: int = EVERY):
        if isinstance(every, bool) or int(every) != every or every < 1:
            raise ValueError(f"PendingRows: every must be an integer >= 1; got {every!r}")
        self.every = int(every)
        self._rows: list[tuple[torch.Tensor, ...]] = []
        self.n = 0  # iterations pending

    def __len__(self) -> int:
        return self.n

    def add(self, *rows: torch.Tensor, n: int = 1) -> bool:
        """Append ``rows`` (one tensor per stream, ``n`` iterations each); True when at least
        :attr:`every` iterations are pending (the caller then takes them)."""
        self._rows.append(rows)
        self.n += n
        return self.n >= self.every

    def take(self) -> tuple[torch.Tensor, ...] | None:
        """The pending rows, one tensor per stream concatenated along the iteration axis (a
        single addition is returned as it was given), or None; the buffer is emptied."""
        if not self._rows:
            return None
        rows, self._rows, self.n = self._rows, [], 0
        if len(rows) == 1:
            return rows[0]
        return tuple(torch.cat(parts) for parts in zip(*rows, strict=True))

    def clear(self) -> None:
        """Drop the pending rows (a state loaded from a checkpoint replaces them)."""
        self._rows, self.n = [], 0
