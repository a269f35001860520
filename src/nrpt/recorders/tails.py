"""Slot 0's explorer acceptance in the tails of each coordinate (the ``tail-acceptance``
health check, :func:`nrpt.report.health.check_run`).

Why: on a funnel (gp_pois_regr: ``f = alpha L f_tilde`` with the data pinning ``f``, so
``f_tilde``'s conditional scale shrinks like ``1 / alpha``) a step size tuned on the bulk
cannot enter the neck.  Measured there (defaults, seed 1, slot 0, last round): MALA's
acceptance is 0.30 in the bulk of ``log alpha``, 0.10 between the reference's 90 % and 97 %
quantiles, 0.05 between 97 % and 99 % and 0 above; the chain spends 0.8 % of its draws
between the 97 % and 99 % quantiles and 0.07 % above them (2 % and 1 % in the reference), so
``alpha``'s sd comes out 12 % short while R-hat (1.011) and the tail ESS barely move.  On a
Gaussian the same step gives the opposite: acceptance *higher* beyond 2 sd than overall
(ratio 1.1-1.5 for d = 1..50 at MALA's 0.574), so a tail acceptance far below the overall one
points at a neck, not at the tail being rare.

What is recorded (per system, since the last reset): the acceptance of slot 0's explorer step
paired with the position it started from (slot 0's replica after the previous iteration's
swaps), summed overall and over the iterations whose start lies beyond ``mean +- K sd`` of each
coordinate, the thresholds from the *previous* segment's slot-0 mean and sd pooled over the
systems (so a run needs ``rounds``: the first segment sets thresholds only); and the number of
*entries* into each tail (a start there whose previous start was not), so that one replica
stuck once in a far tail is not taken for a neck the chain keeps failing to enter."""

from __future__ import annotations

from typing import Any

import torch

from nrpt.recorders.pending import PendingRows
from nrpt.roles import Iteration, IterationBlock, RecorderBase

#: the tails are beyond ``mean +- K sd`` of the previous segment's slot-0 draws
K = 2.0


class TailAcceptance(RecorderBase):
    """Slot 0's explorer acceptance overall and in each coordinate's two tails."""

    name = "tail_acceptance"
    reads_slots = (0,)

    def __init__(self, R: int, dim: int, device="cpu"):
        self.R, self.dim, self.device = int(R), int(dim), device
        self._prev: torch.Tensor | None = None  # slot 0's position after the last iteration
        self._pending = PendingRows(self.PENDING)  # the plain loop's rows not yet taken
        self.lo: torch.Tensor | None = None     # thresholds [dim] (None: no previous segment)
        self.hi: torch.Tensor | None = None
        self._zero_segment()

    def _zero_segment(self) -> None:
        z = lambda *s: torch.zeros(s, dtype=torch.float64, device=self.device)  # noqa: E731
        self.n, self.acc = z(self.R), z(self.R)
        self.s1, self.s2 = z(self.R, self.dim), z(self.R, self.dim)
        self.n_hi, self.acc_hi = z(self.R, self.dim), z(self.R, self.dim)
        self.n_lo, self.acc_lo = z(self.R, self.dim), z(self.R, self.dim)
        # entries into each tail (a start in the tail whose previous start was not)
        self.in_hi, self.in_lo = z(self.R, self.dim), z(self.R, self.dim)
        self._was_hi, self._was_lo = z(self.R, self.dim), z(self.R, self.dim)

    def start_segment(self, reset: bool, length: int = 0) -> None:
        self._flush()
        if not reset:
            return
        n = float(self.n.sum())
        if n >= 2:  # the ended segment's pooled moments set the next one's tails
            mean = self.s1.sum(0) / n
            var = (self.s2.sum(0) / n - mean * mean).clamp_min(0.0)
            sd = var.sqrt()
            self.lo, self.hi = mean - K * sd, mean + K * sd
        self._zero_segment()

    def _take(self, x: torch.Tensor, a: torch.Tensor) -> None:
        """End positions ``x[U, R, dim]`` of slot 0 and its acceptances ``a[U, R]``."""
        x = x.to(torch.float64)
        a = a.to(torch.float64)
        start = x[:-1] if self._prev is None else torch.cat([self._prev[None], x[:-1]])
        if self._prev is None:  # the very first iteration has no recorded start
            a = a[1:]
        self._prev = x[-1].clone()
        if start.shape[0] == 0:
            return
        self.n += start.shape[0]
        self.acc += a.sum(0)
        self.s1 += start.sum(0)
        self.s2 += (start * start).sum(0)
        if self.hi is not None:
            hi = (start > self.hi).to(torch.float64)
            lo = (start < self.lo).to(torch.float64)
            self.n_hi += hi.sum(0)
            self.n_lo += lo.sum(0)
            self.acc_hi += (hi * a[..., None]).sum(0)
            self.acc_lo += (lo * a[..., None]).sum(0)
            # entries: the first start of the segment counts as one when it is in the tail
            self.in_hi += (hi[0] + (hi[1:] * (1.0 - hi[:-1])).sum(0)
                           - hi[0] * self._was_hi)
            self.in_lo += (lo[0] + (lo[1:] * (1.0 - lo[:-1])).sum(0)
                           - lo[0] * self._was_lo)
            self._was_hi, self._was_lo = hi[-1].clone(), lo[-1].clone()

    #: iterations of the plain loop buffered before their statistics are taken (a handful of
    #: tensor ops per :data:`PENDING` iterations instead of per iteration: on a 2-d target the
    #: per-iteration form cost 28 % of a MALA rounds run's CPU)
    PENDING = 64

    def _flush(self) -> None:
        rows = self._pending.take()
        if rows is not None:
            self._take(*rows)

    def record(self, it: Iteration) -> None:
        # (slot_x gathers: a fresh tensor; explore_accept is the caller's, so a copy)
        if self._pending.add(it.slot_x([0])[None, :, 0], it.explore_accept[None, :, 0].clone()):
            self._flush()

    def record_block(self, block: IterationBlock) -> None:
        self._flush()
        self._take(block.watched_x([0])[:, :, 0], block.explore_accept[:, :, 0])

    def follow_ladder(self, m) -> None:
        """The ladder grew: slot 0 stays slot 0, nothing to move."""

    def stats(self) -> dict[str, Any] | None:
        """The pooled statistics of the current segment for the health check: ``n``,
        ``acceptance`` (overall), per coordinate ``n_hi`` / ``n_lo`` and ``acceptance_hi`` /
        ``acceptance_lo`` (NaN where no draw), ``k``; None before any threshold exists."""
        self._flush()
        if self.hi is None or float(self.n.sum()) < 1:
            return None
        n = float(self.n.sum())
        n_hi, n_lo = self.n_hi.sum(0), self.n_lo.sum(0)
        nan = torch.tensor(float("nan"), dtype=torch.float64, device=self.device)
        a_hi = torch.where(n_hi > 0, self.acc_hi.sum(0) / n_hi.clamp_min(1), nan)
        a_lo = torch.where(n_lo > 0, self.acc_lo.sum(0) / n_lo.clamp_min(1), nan)
        return {"n": n, "acceptance": float(self.acc.sum()) / n, "k": K,
                "n_hi": n_hi.cpu().numpy(), "n_lo": n_lo.cpu().numpy(),
                "entries_hi": self.in_hi.sum(0).cpu().numpy(),
                "entries_lo": self.in_lo.sum(0).cpu().numpy(),
                "acceptance_hi": a_hi.cpu().numpy(), "acceptance_lo": a_lo.cpu().numpy()}

    _SUMS = ("n", "acc", "s1", "s2", "n_hi", "acc_hi", "n_lo", "acc_lo", "in_hi", "in_lo",
             "_was_hi", "_was_lo")

    def state_dict(self) -> dict:
        """Copies (the sums are updated in place), after taking the buffered rows."""
        self._flush()
        c = lambda t: None if t is None else t.clone()  # noqa: E731
        return {"prev": c(self._prev), "lo": c(self.lo), "hi": c(self.hi),
                **{k: c(getattr(self, k)) for k in self._SUMS}}

    def load_state_dict(self, sd: dict) -> None:
        c = lambda t: None if t is None else torch.as_tensor(t).clone()  # noqa: E731
        self._prev, self.lo, self.hi = c(sd["prev"]), c(sd["lo"]), c(sd["hi"])
        for k in self._SUMS:
            setattr(self, k, c(sd[k]))
