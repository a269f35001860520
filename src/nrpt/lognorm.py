r"""Normalizing constants by stepping stone, accumulated online (the ``log_z`` recorder).

Along a path with slot coefficients ``b_0 = 1 > b_1 > ... > b_{P-1}`` (:mod:`nrpt.paths`), the
slot densities are ``pi_p ∝ exp(base - b_p V)`` with normalizing constants ``Z_p``.  For each
adjacent pair the ratio of constants is an expectation under either neighbour
(Syed et al. 2021, Sec. 6.2; the "stepping stone" of Xie et al. 2011):

    Z_p / Z_{p+1}  =  E_{pi_{p+1}} [ exp(-(b_p - b_{p+1}) V(X)) ]          (forward)
    Z_{p+1} / Z_p  =  E_{pi_p}     [ exp(+(b_p - b_{p+1}) V(X)) ]          (reverse)

On a geometric path ``V = -l`` and ``-(b_p - b_{p+1}) V = (beta_p - beta_{p+1}) l``.  Every
iteration adds, per pair, one term to each expectation from the replica that currently sits
at slot ``p + 1`` (forward) or slot ``p`` (reverse).  The sample means are kept as streaming
log-sum-exp accumulators (:class:`StreamingLogSumExp`), so terms of
order ``10^6`` neither overflow nor underflow (terms are buffered and reduced in chunks).  Then

    log Z_0 - log Z_{P-1} = sum_p log(Z_p / Z_{p+1})

is estimated by the forward sum (its exponential is the product of unbiased means, aimed at
``Z``) and by minus the reverse sum (aimed at ``1 / Z``); the reported value is their average,
with both halves shown (their gap is a self-check).  On a geometric path with a *normalized*
reference ``Z_{P-1} = 1`` and the result is ``log Z`` of the target; otherwise (a temperature
ladder, or a reference without a normalized density) only the *ratio* ``log(Z_0 / Z_{P-1})``
is estimated.  The per-slot values ``log Z_p - log Z_{P-1}`` come for free.  Where the target
vanishes on part of the reference's support the reverse half is biased (it cannot see the
lost mass); this is detected online and only the forward half is used (:meth:`SteppingStone.
estimate`).

The accumulators assume the schedule is fixed while they run: the recorder starts fresh
statistics with every segment that resets (``start_segment(reset=True)``: each round of adaptive
NRPT, whose schedule changes between rounds).
"""

from __future__ import annotations

import math

import torch

from .recorders import per_system
from .roles import IterationBlock, RecorderBase

__all__ = ["SteppingStone", "StreamingLogSumExp"]


class StreamingLogSumExp:
    """Per-entry ``log sum_i exp(t_i)`` over a stream of tensors ``t`` of a fixed shape.

    Terms are copied into a small device buffer (one op per term); every ``chunk`` terms the
    buffer is reduced with ``logsumexp`` and merged into the running total with ``logaddexp``,
    both of which subtract the maximum first, so nothing overflows or underflows.  ``-inf``
    terms (weight 0) are allowed and counted in ``zeros``; NaN and ``+inf`` terms are counted in
    ``invalid`` and skipped (they cannot come from a finite energy and a finite coefficient).
    """

    def __init__(self, shape, dtype=torch.float64, device="cpu", chunk: int = 64):
        self.shape = tuple(shape)
        self.total = torch.full(self.shape, -math.inf, dtype=dtype, device=device)
        self._invalid = torch.zeros(self.shape, dtype=torch.int64, device=device)
        self._zeros = torch.zeros(self.shape, dtype=torch.int64, device=device)
        self.buffer = torch.empty((int(chunk), *self.shape), dtype=dtype, device=device)
        self.pending = 0
        self.n = 0

    def add(self, t: torch.Tensor) -> None:
        self.buffer[self.pending] = t
        self.pending += 1
        self.n += 1
        if self.pending == self.buffer.shape[0]:
            self._flush()

    def add_many(self, t: torch.Tensor) -> None:
        """Add ``t[0], t[1], ...`` (``t`` of shape ``[U, *shape]``): the same as ``U`` calls of
        :meth:`add`, bit for bit (the terms are copied into the buffer a slice at a time and
        the buffer is reduced exactly when it fills, so the terms are grouped as by :meth:`add`).
        """
        size, i, U = self.buffer.shape[0], 0, t.shape[0]
        while i < U:
            m = min(size - self.pending, U - i)
            self.buffer[self.pending:self.pending + m] = t[i:i + m]
            self.pending += m
            self.n += m
            i += m
            if self.pending == size:
                self._flush()

    def _pending(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(total, invalid, zeros)`` with the buffered terms merged in, the state unchanged:
        reading an estimate mid-run (a segment's report row) must not regroup the terms, or a
        run read at other times (resumed, extended) would differ in the last bits."""
        if self.pending == 0:
            return self.total, self._invalid, self._zeros
        terms = self.buffer[:self.pending]
        bad = ~(terms < math.inf)  # NaN or +inf
        total = torch.logaddexp(self.total, torch.logsumexp(terms.masked_fill(bad, -math.inf), 0))
        return total, self._invalid + bad.sum(0), self._zeros + (terms == -math.inf).sum(0)

    def _flush(self) -> None:
        if self.pending:
            self.total, self._invalid, self._zeros = self._pending()
            self.pending = 0

    @property
    def invalid(self) -> torch.Tensor:
        """Count of NaN / ``+inf`` terms (skipped), per entry."""
        return self._pending()[1].clone()

    @property
    def zeros(self) -> torch.Tensor:
        """Count of ``-inf`` terms (weight zero), per entry."""
        return self._pending()[2].clone()

    def value(self) -> torch.Tensor:
        """``log sum exp`` so far (``-inf`` if every term was ``-inf``)."""
        return self._pending()[0].clone()

    def log_mean(self) -> torch.Tensor:
        """``log((1/n) sum exp(t_i))`` (NaN before the first term)."""
        if self.n == 0:
            return torch.full(self.shape, math.nan, dtype=self.total.dtype,
                              device=self.total.device)
        return self.value() - math.log(self.n)

    def state_dict(self) -> dict:
        # the pending buffer is saved as it is (not flushed), so a resumed run groups the
        # terms exactly as an uninterrupted one and reproduces it bit for bit
        return {"total": self.total.clone(), "n": self.n, "invalid": self._invalid.clone(),
                "zeros": self._zeros.clone(), "buffer": self.buffer[:self.pending].clone()}

    def load_state_dict(self, sd: dict) -> None:
        self.total = sd["total"].to(self.total)
        self.n = int(sd["n"])
        self._invalid, self._zeros = sd["invalid"].to(self._invalid), sd["zeros"].to(self._zeros)
        buf = sd.get("buffer")
        self.pending = 0 if buf is None else int(buf.shape[0])
        if self.pending:
            self.buffer[:self.pending] = buf.to(self.buffer)


class SteppingStone(RecorderBase):
    """Recorder (``log_z``, :mod:`nrpt.roles`) of the online stepping-stone estimate of
    ``log Z``; its statistics restart with every segment that resets (a new round), because
    the estimate assumes a fixed schedule.

    Args:
        systems, slots: ``R`` and ``P`` of the engine.
        reference_normalized: whether ``Z_{P-1} = 1`` (geometric path with a normalized
            reference), which makes the estimate an absolute ``log Z``.
    """

    def __init__(self, systems: int, slots: int, *, reference_normalized: bool,
                 dtype=torch.float64, device="cpu"):
        self.R, self.P = int(systems), int(slots)
        self.reference_normalized = bool(reference_normalized)
        self.dtype, self.device = dtype, device
        self.reset()

    def reset(self) -> None:
        shape = (self.R, self.P - 1)
        self.forward = StreamingLogSumExp(shape, self.dtype, self.device)
        self.reverse = StreamingLogSumExp(shape, self.dtype, self.device)

    name = "log_z"

    def start_segment(self, reset: bool, length: int = 0) -> None:
        if reset:
            self.reset()

    def record(self, it) -> None:
        b = it.schedule  # [R, P]
        v = it.slot_energies  # V of the replica at each slot
        db = b[:, :-1] - b[:, 1:]  # > 0
        self.forward.add(-db * v[:, 1:])
        self.reverse.add(db * v[:, :-1])

    def record_block(self, block: IterationBlock) -> None:
        """``U`` iterations at once (:meth:`StreamingLogSumExp.add_many`): the same terms, in
        the same groups, as ``U`` calls of :meth:`record`."""
        b = block.schedule  # [U, R, P]
        v = block.slot_energies
        db = b[..., :-1] - b[..., 1:]
        self.forward.add_many(-db * v[..., 1:])
        self.reverse.add_many(db * v[..., :-1])

    def summary(self) -> dict:
        est = self.estimate()
        R = self.R
        out = {"log_normalizer": per_system(est["log_normalizer"], R),
               "log_normalizer_forward": per_system(est["forward"], R),
               "log_normalizer_reverse": per_system(est["reverse"], R),
               "log_normalizer_per_slot": per_system(est["per_slot"], R),
               "log_normalizer_kind": "log Z" if self.reference_normalized else "ratio"}
        if not bool(est["reverse_valid"].all()):
            out["log_normalizer_note"] = (
                "the target is zero on part of the reference's support, where the reverse "
                "(1/Z) half cannot see the lost mass: log_normalizer is the forward half")
        return out

    def segment_row(self) -> dict:
        return {"log_normalizer": float(self.estimate()["log_normalizer"].mean())}

    # ------------------------------------------------------------------ estimates
    @property
    def n(self) -> int:
        return self.forward.n

    def pair_log_ratios(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Estimates of ``log(Z_p / Z_{p+1})`` per pair, ``[R, P-1]``: (forward, reverse)."""
        return self.forward.log_mean(), -self.reverse.log_mean()

    def estimate(self) -> dict[str, torch.Tensor]:
        """``log_normalizer`` (average of the halves), ``forward``, ``reverse`` (``[R]``
        each), ``per_slot`` (``[R, P]``: ``log Z_p - log Z_{P-1}``) and ``reverse_valid``
        (``[R]``, bool).

        The reverse identity needs ``pi_p > 0`` wherever ``pi_{p+1} > 0``.  When the forward
        stream of a pair met states of weight zero (``V = +inf`` at slot ``p+1``: the target
        vanishes on part of the reference's support) that fails -- the reverse half cannot see
        the missing mass -- so for that pair the forward half alone is used, and
        ``reverse_valid`` is false for the system."""
        fwd, rev = self.pair_log_ratios()
        pair_ok = self.forward.zeros == 0
        avg = torch.where(pair_ok, 0.5 * (fwd + rev), fwd)
        tail = torch.flip(torch.cumsum(torch.flip(avg, [1]), 1), [1])  # sum_{q >= p}
        per_slot = torch.cat([tail, torch.zeros_like(tail[:, :1])], dim=1)
        return {"log_normalizer": avg.sum(1), "forward": fwd.sum(1), "reverse": rev.sum(1),
                "per_slot": per_slot, "reverse_valid": pair_ok.all(1)}

    def state_dict(self) -> dict:
        return {"forward": self.forward.state_dict(), "reverse": self.reverse.state_dict()}

    def load_state_dict(self, sd: dict) -> None:
        self.forward.load_state_dict(sd["forward"])
        self.reverse.load_state_dict(sd["reverse"])
