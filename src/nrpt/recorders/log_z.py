r"""Normalizing constants by bridge sampling, accumulated online (the ``log_z`` recorder).

Slot densities ``pi_p ∝ exp(base - b_p V)``, ``b_0 = 1 > ... > b_{P-1}``; per adjacent pair,
with ``Delta = b_p - b_{p+1} > 0`` (Syed et al. 2021, Sec. 6.2; Xie et al. 2011; Meng & Wong
1996)::

    Z_p / Z_{p+1}  =  E_{pi_{p+1}} [ exp(-Delta V) ]                             (forward)
    Z_{p+1} / Z_p  =  E_{pi_p}     [ exp(+Delta V) ]                             (reverse)
    Z_p / Z_{p+1}  =  E_{pi_{p+1}} [ exp(-Delta V / 2) ] / E_{pi_p} [ exp(+Delta V / 2) ]  (bridge)

Each iteration adds one term per pair to each mean (streaming log-sum-exp,
:class:`StreamingLogSumExp`).  ``log Z_0 - log Z_{P-1}`` is reported from the bridge sum
(``log_normalizer``): its weights have finite variance whenever the ``Z``'s are finite, unlike
the reverse half's, which can be infinite at the hottest pair (a likelihood vanishing faster
than the reference) and is then biased upward.  The forward and reverse halves are kept and
compared (``halves_z``): apart in their expected order (forward below reverse) they are a
note, which says nothing about the bridge that the ``log-z-overlap`` finding does not say
better; in the wrong order they are a ``log-z-halves`` warning (:data:`HALVES_Z`).

Errors are batch means (:meth:`SteppingStone.estimate`, ``BATCHES``) through the delta method;
they assume nearly independent batches and finite-variance weights.

With a normalized reference (``Z_{P-1} = 1``) the result is ``log Z`` of the target; otherwise
only the ratio ``log(Z_0 / Z_{P-1})``.  Per-slot values ``log Z_p - log Z_{P-1}`` are also given.
The schedule must be fixed while accumulating: ``start_segment(reset=True)`` starts afresh.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from nrpt.host import viewable
from nrpt.recorders.stats import per_system
from nrpt.roles import IterationBlock, RecorderBase

__all__ = ["SteppingStone", "StreamingLogSumExp", "BATCHES", "HALVES_Z", "OVERLAP_DRAWS",
           "SPREAD_P", "pooled_log_z", "systems_spread"]


class StreamingLogSumExp:
    """Per-entry ``log sum_i exp(t_i)`` over a stream of tensors ``t`` of a fixed shape.

    Terms are buffered and reduced every ``chunk`` terms (``logsumexp``, ``logaddexp``).
    ``-inf`` terms are counted in ``zeros``; NaN and ``+inf`` in ``invalid`` and skipped.

    ``batches = K > 0``: also keeps ``K`` to ``2K`` equal consecutive batches (neighbours merged
    when ``2K`` are complete) for batch means (:meth:`batch_log_means`); cut at chunk
    boundaries, so :meth:`add` and :meth:`add_many` agree bit for bit.
    """

    def __init__(self, shape, dtype=torch.float64, device="cpu", chunk: int = 64,
                 batches: int = 0):
        self.shape = tuple(shape)
        self.total = torch.full(self.shape, -math.inf, dtype=dtype, device=device)
        self._invalid = torch.zeros(self.shape, dtype=torch.int64, device=device)
        self._zeros = torch.zeros(self.shape, dtype=torch.int64, device=device)
        self.buffer = torch.empty((int(chunk), *self.shape), dtype=dtype, device=device)
        self.pending = 0
        self.n = 0
        self.K = int(batches)
        if self.K:
            self._batch = torch.full((2 * self.K, *self.shape), -math.inf, dtype=dtype,
                                     device=device)
            self._current = torch.full(self.shape, -math.inf, dtype=dtype, device=device)
        self.n_batches = 0  # complete batches
        self.batch_chunks = 1  # chunks per batch
        self._current_chunks = 0  # chunks in the current (incomplete) batch

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

    def _chunk(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(log sum exp, invalid, zeros)`` of the buffered terms."""
        return _reduce_terms(self.buffer[:self.pending], 0)

    def _pending(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(total, invalid, zeros)`` with the buffered terms merged in, the state unchanged:
        reading an estimate mid-run (a segment's report row) must not regroup the terms, or a
        run read at other times (resumed, extended) would differ in the last bits."""
        if self.pending == 0:
            return self.total, self._invalid, self._zeros
        lse, bad, zeros = self._chunk()
        if bad is None:  # (every term finite)
            return torch.logaddexp(self.total, lse), self._invalid, self._zeros
        return (torch.logaddexp(self.total, lse), self._invalid + bad, self._zeros + zeros)

    def _flush(self) -> None:
        if not self.pending:
            return
        self._absorb(*self._chunk())

    def _absorb(self, lse: torch.Tensor, bad: torch.Tensor | None,
                zeros: torch.Tensor | None) -> None:
        """Merge the buffered terms' ``(log sum exp, invalid, zeros)`` (counts ``None``: none)
        and empty the buffer."""
        if self.K and self.pending == self.buffer.shape[0]:
            self._current = torch.logaddexp(self._current, lse)
            self._current_chunks += 1
            if self._current_chunks == self.batch_chunks:
                self._batch[self.n_batches] = self._current
                self._current = torch.full_like(self._current, -math.inf)
                self._current_chunks = 0
                self.n_batches += 1
                if self.n_batches == 2 * self.K:  # merge neighbours: K batches of twice the size
                    merged = torch.logaddexp(self._batch[0::2], self._batch[1::2])
                    self._batch.fill_(-math.inf)
                    self._batch[:self.K] = merged
                    self.n_batches, self.batch_chunks = self.K, 2 * self.batch_chunks
        self.total = torch.logaddexp(self.total, lse)
        if bad is not None:  # (None: every term finite, the counts unchanged)
            self._invalid, self._zeros = self._invalid + bad, self._zeros + zeros
        self.pending = 0

    def batch_log_means(self) -> torch.Tensor:
        """``[B, *shape]``: ``log`` of the mean of ``exp(t)`` over each complete batch (``B =
        n_batches``, every batch of ``batch_chunks * chunk`` terms; the terms after the last
        complete batch are left out)."""
        if not self.K:
            raise ValueError("StreamingLogSumExp: batches = 0 keeps no batches")
        size = self.batch_chunks * self.buffer.shape[0]
        return self._batch[:self.n_batches] - math.log(size)

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
        sd = {"total": self.total.clone(), "n": self.n, "invalid": self._invalid.clone(),
              "zeros": self._zeros.clone(), "buffer": self.buffer[:self.pending].clone()}
        if self.K:
            sd["batches"] = {"K": self.K, "batch": self._batch[:self.n_batches].clone(),
                             "current": self._current.clone(),
                             "current_chunks": self._current_chunks,
                             "batch_chunks": self.batch_chunks}
        return sd

    def load_state_dict(self, sd: dict) -> None:
        self.total = sd["total"].to(self.total)
        self.n = int(sd["n"])
        self._invalid, self._zeros = sd["invalid"].to(self._invalid), sd["zeros"].to(self._zeros)
        buf = sd.get("buffer")
        self.pending = 0 if buf is None else int(buf.shape[0])
        if self.pending:
            self.buffer[:self.pending] = buf.to(self.buffer)
        if self.K:
            bt = sd.get("batches")
            if bt is None or int(bt["K"]) != self.K:
                raise ValueError("StreamingLogSumExp.load_state_dict: the state has no batches "
                                 f"of K = {self.K} (written with batches = "
                                 f"{0 if bt is None else bt['K']})")
            self.n_batches = int(bt["batch"].shape[0])
            self._batch.fill_(-math.inf)
            self._batch[:self.n_batches] = bt["batch"].to(self._batch)
            self._current = bt["current"].to(self._current)
            self._current_chunks = int(bt["current_chunks"])
            self.batch_chunks = int(bt["batch_chunks"])


def _reduce_terms(terms: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor,
                                                          torch.Tensor]:
    """``(log sum exp, invalid, zeros)`` of ``terms`` along ``dim``: NaN and ``+inf`` terms
    skipped and counted, ``-inf`` terms counted.  On the CPU, where every term is finite (the
    usual case, checked by one reduction), ``(log sum exp, None, None)``: no masking (the same
    numbers: the mask would change none) and no counts to add."""
    if terms.device.type == "cpu" and bool(terms.isfinite().all()):
        return torch.logsumexp(terms, dim), None, None
    bad = ~(terms < math.inf)  # NaN or +inf
    return (torch.logsumexp(terms.masked_fill(bad, -math.inf), dim), bad.sum(dim),
            (terms == -math.inf).sum(dim))


def _terms_numpy(b: np.ndarray, v: np.ndarray) -> np.ndarray:
    """:meth:`SteppingStone.record_block`'s terms ``[4, U, R, P-1]`` (forward, reverse and
    their halves) of float64 CPU blocks on NumPy views (a small NumPy op costs a third to a
    half of a torch op): the same IEEE differences, negations and products by the same
    operands in the same order (halving is a product by 0.5), so the same numbers; no warning
    where an energy is infinite (``inf * 0`` is NaN without one, as torch's)."""
    terms = np.empty((4, *v.shape[:-1], v.shape[-1] - 1))
    with np.errstate(all="ignore"):
        db = b[..., :-1] - b[..., 1:]
        np.multiply(-db, v[..., 1:], out=terms[0])
        np.multiply(db, v[..., :-1], out=terms[1])
        np.multiply(terms[:2], 0.5, out=terms[2:])
    return terms


def add_many_together(streams: list[StreamingLogSumExp], terms: torch.Tensor) -> None:
    """``s.add_many(terms[j])`` for every stream ``s = streams[j]`` (``terms`` ``[S, U,
    *shape]``), bit for bit.  Streams in step (the same shape, buffer length and count pending,
    as :class:`SteppingStone`'s four always are) reduce a full buffer's worth of terms together:
    one ``logsumexp`` (and one of each count) along the terms' axis of ``terms`` itself where a
    buffer's worth lies inside it (nothing copied), else of the stacked buffers, instead of one
    per stream; each entry's terms are reduced in the same order (the streams only add an
    outer axis; ``tests/test_record_block.py`` checks it).  Else one stream at a time."""
    s0 = streams[0]
    size = s0.buffer.shape[0]
    if any(s.pending != s0.pending or s.buffer.shape != s0.buffer.shape
           or s.buffer.dtype != s0.buffer.dtype for s in streams) or \
            terms.dtype != s0.buffer.dtype:
        for s, t in zip(streams, terms, strict=True):
            s.add_many(t)
        return
    i, U = 0, terms.shape[1]
    while i < U:
        p = s0.pending
        m = min(size - p, U - i)
        if m == size:  # (a whole buffer's worth: reduced where it lies)
            done = _reduce_terms(terms[:, i:i + m], 1)
        else:
            for s, t in zip(streams, terms, strict=True):
                s.buffer[p:p + m] = t[i:i + m]
            done = None
        for s in streams:
            s.pending += m
            s.n += m
        i += m
        if s0.pending == size:
            if done is None:
                done = _reduce_terms(torch.stack([s.buffer for s in streams]), 1)
            lse, bad, zeros = (r if r is None else r.unbind(0) for r in done)
            for j, s in enumerate(streams):
                s._absorb(lse[j], None if bad is None else bad[j],
                          None if zeros is None else zeros[j])


#: Batches kept for the batch-means errors (between ``BATCHES`` and ``2 * BATCHES``).
BATCHES = 32

#: The halves' gap ``z`` (forward minus reverse, in units of its batch-means error; per system,
#: or the systems' combined ``sum z / sqrt(R)``) beyond which it is reported.  Each half's own
#: bias has a known sign (Jensen: the forward half reads low, the reverse half high, whatever
#: the weights' tails), so the two directions mean different things:
#:
#: * ``z < -HALVES_Z`` (the expected order): a summary note (``log_normalizer_halves_note``),
#:   not a warning.  The reverse half's weights have infinite variance wherever a slot is more
#:   than ``sqrt 2`` times as spread as its colder neighbour (Gaussians) or the likelihood
#:   vanishes faster than the reference, which short ladders make common, and its error then
#:   understates it.  Measured (``benchmarks/log_z_warnings.py``: 100 sets of 4 systems, 1024
#:   iterations, RWMH, known log Z), the former two-sided warning fired on 51 % of sets with 10
#:   chains and 100 % with 6 on ScaledGaussianPath(d=5, c=1e4), 64 % with 2 chains at c = 3,
#:   90 % with 3 at c = 30, 95 % on the Uniform/HalfNormal prior path, 41 % with 2 chains on
#:   ShiftedGaussianPath(d=2, m=3); wherever it fired without ``log-z-overlap`` the bridge was
#:   covered by its pooled error at the nominal rate (> 3 se off in 0-1.6 % of sets).  Where
#:   the bridge really read low (4 chains at c = 1e4: 0.76 low; 5 chains: 0.17 low)
#:   ``log-z-overlap`` fired on 98-100 % of the sets; its message shows the halves.
#: * ``z > +HALVES_Z`` (the wrong order): the ``log-z-halves`` warning -- the slots' draws are
#:   not their path distributions.  With Metropolis swaps it came in about 3e-4 of systems
#:   (4000 systems each at c = 1.5, 3, 6 with 2 chains, c = 30 with 3, c = 1e4 with 6 and 10;
#:   largest z 6.1); with every swap accepted (DEO_W, rule "always") it fired on 100 % of sets,
#:   the bridge 69 nats off at c = 30 and 6 chains, where ``log-z-overlap`` is silent.
HALVES_Z = 4.0
#: a pair of neighbours is flagged (``log-z-overlap``) when its bridge weights' relative
#: variance per draw, ``v = 1 / BC^2 - 1`` (:meth:`SteppingStone.pair_overlap`), exceeds the
#: round's draws ``n`` over this: the pair's means then carry a relative variance ``v / n > 1 /
#: 50`` (a relative error above ~0.14 before autocorrelation), where the log of a mean is skewed
#: and biased low.  Measured on ScaledGaussianPath(d=5, c=1e4), 1024 iterations, 100 sets of 4
#: systems: 4 chains (exact v / n = 0.08) read 0.76 low with errors covering 59 %; 6 and 10
#: chains (0.005, 0.001) were unbiased.  posteriordb's kidscore_mom_work with the fixed broad
#: reference, the worst pair per system: v / n 0.8 to 5e6 with 10 chains (1-2 nats low),
#: ~0.001 with 32 (agrees).
OVERLAP_DRAWS = 50.0
#: the systems' log Z estimates are flagged when their spread around the error-weighted mean
#: has a chi-square tail probability below this under their reported errors
SPREAD_P = 1e-3


def _chi2_quantile(k: int, z: float) -> float:
    """The chi-square quantile with ``k`` degrees of freedom at standard-normal quantile ``z``
    (Wilson-Hilferty; within ~1 % at ``k >= 1`` in the upper tail used here)."""
    h = 2.0 / (9.0 * k)
    return k * (1.0 - h + z * math.sqrt(h)) ** 3


def _floats(v) -> torch.Tensor:
    """A flat float64 tensor of ``v`` (a tensor, an array, a number or a list; ``None``, which a
    JSON-ready summary writes for NaN, as NaN)."""
    if torch.is_tensor(v):
        return v.detach().to("cpu", torch.float64).reshape(-1)
    if isinstance(v, list | tuple):
        v = [math.nan if x is None else float(x) for x in v]
    elif v is None:
        v = math.nan
    return torch.as_tensor(v, dtype=torch.float64).reshape(-1)


def pooled_log_z(log_z, se) -> dict[str, float]:
    """The systems' estimates ``log_z[R]`` pooled into one, with an error that holds whether or
    not the systems' reported errors ``se[R]`` are honest.

    ``estimate``: the plain mean over the systems with finite estimates (not error-weighted: a
    system that mixed badly tends to under-report its error and would get the largest weight).
    ``within_se = sqrt(sum se_i^2) / R``: the error the batch means imply.  ``between_se =
    sd(log_z) / sqrt(R)``: the error the systems' own spread implies (independent systems, so
    unbiased whatever ``se`` says, but with only ``R - 1`` degrees of freedom).  ``se``: the
    larger of the two.  Simulated calibration (tests/test_lognorm.py): with honest ``se`` the
    interval ``estimate ± 1.96 se`` covers the truth ~97 % of the time (4 systems); with
    errors 3x too small it covers ~87 % where ``within_se`` alone covers ~49 %.  What neither
    can see is a bias every system shares (too few chains for the path's barrier: the bridge
    then reads low): the ``log-z-overlap`` finding is the sign of that.  One system: ``se`` is
    its own error; NaN where nothing is finite."""
    lz, e = _floats(log_z), _floats(se)
    ok = torch.isfinite(lz)
    R = int(ok.sum())
    if R == 0:
        return {"estimate": math.nan, "se": math.nan, "within_se": math.nan,
                "between_se": math.nan, "systems": 0}
    lz, e = lz[ok], e[ok]
    within = float(e.square().sum().sqrt()) / R if bool(torch.isfinite(e).all()) else math.nan
    between = float(lz.std()) / math.sqrt(R) if R > 1 else math.nan
    known = [v for v in (within, between) if not math.isnan(v)]
    return {"estimate": float(lz.mean()), "se": max(known) if known else math.nan,
            "within_se": within, "between_se": between, "systems": R}


def systems_spread(log_z, se, what: str = "log Z"):
    """A :class:`nrpt.report.health.Finding` (code ``log-z-systems``) when independent systems'
    estimates ``log_z[R]`` disagree beyond their reported errors ``se[R]``: ``Q = sum ((log_z_i
    - m) / se_i)^2`` around the error-weighted mean ``m`` exceeds the chi-square quantile with
    ``R - 1`` degrees of freedom at :data:`SPREAD_P` (honest errors: a false alarm in 1 run of
    1000).  The message gives the factor ``sqrt(Q / (R - 1))`` by which the errors look too
    small and the error the systems' own spread implies.  None otherwise (fewer than 2 systems
    with finite estimates and positive errors)."""
    from nrpt.report.health import Finding

    lz = torch.as_tensor(log_z, dtype=torch.float64).reshape(-1)
    e = torch.as_tensor(se, dtype=torch.float64).reshape(-1)
    ok = torch.isfinite(lz) & torch.isfinite(e) & (e > 0)
    if int(ok.sum()) < 2:
        return None
    lz, e = lz[ok], e[ok]
    R = int(lz.numel())
    w = e.pow(-2)
    m = float((w * lz).sum() / w.sum())
    q = float((((lz - m) / e) ** 2).sum())
    limit = _chi2_quantile(R - 1, 3.0902)  # the standard normal's 1 - SPREAD_P quantile
    if q <= limit:
        return None
    factor = math.sqrt(q / (R - 1))
    spread_se = float(lz.std()) / math.sqrt(R)
    return Finding("log-z-systems", (
        f"the {R} systems' {what} estimates ({float(lz.min()):.5g} to {float(lz.max()):.5g}) "
        f"disagree beyond their batch-means errors ({float(e.min()):.2g} to "
        f"{float(e.max()):.2g}): chi-square {q:.1f} on {R - 1} degrees of freedom (limit "
        f"{limit:.1f} at p = {SPREAD_P:g}), so the errors look about {factor:.1f} times too "
        f"small; the systems' own spread puts the error of their mean at {spread_se:.2g} "
        f"(the pooled error, log_normalizer_pooled_se, takes the larger of the two)"),
        "iterations (more draws per round) / systems (more independent estimates) / chains")


class SteppingStone(RecorderBase):
    """Recorder (``log_z``, :mod:`nrpt.roles`) of the online log ``Z`` estimates (module
    docstring: the bridge, reported, and the two stepping-stone halves, with batch-means
    errors); its statistics restart with every segment that resets (a new round), because the
    estimates assume a fixed schedule.

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

        def acc():
            return StreamingLogSumExp(shape, self.dtype, self.device, batches=BATCHES)

        self.forward, self.reverse = acc(), acc()
        self.bridge_num, self.bridge_den = acc(), acc()
        self.legacy = False  # resumed from a checkpoint without the bridge (see load_state_dict)

    name = "log_z"

    def start_segment(self, reset: bool, length: int = 0) -> None:
        if reset:
            self.reset()

    def follow_ladder(self, m) -> None:
        """The ladder grew: fresh estimates on the new ladder (a new round starts anyway)."""
        self.P = int(m.new)
        self.reset()

    def record(self, it) -> None:
        b = it.schedule  # [R, P]
        v = it.slot_energies  # V of the replica at each slot
        db = b[:, :-1] - b[:, 1:]  # > 0
        fw, rv = -db * v[:, 1:], db * v[:, :-1]
        self.forward.add(fw)
        self.reverse.add(rv)
        self.bridge_num.add(0.5 * fw)  # exact halving: the bridge's terms are half the halves'
        self.bridge_den.add(0.5 * rv)

    def record_block(self, block: IterationBlock) -> None:
        """``U`` iterations at once (:meth:`StreamingLogSumExp.add_many`): the same terms, in
        the same groups, as ``U`` calls of :meth:`record`."""
        b = block.schedule  # [U, R, P]
        v = block.slot_energies
        streams = [self.forward, self.reverse, self.bridge_num, self.bridge_den]
        if viewable(b, v):
            add_many_together(streams, torch.from_numpy(_terms_numpy(b.numpy(), v.numpy())))
            return
        db = b[..., :-1] - b[..., 1:]
        halves = torch.stack([-db * v[..., 1:], db * v[..., :-1]])  # forward, reverse
        add_many_together(streams, torch.cat([halves, 0.5 * halves]))

    def summary(self) -> dict:
        est = self.estimate()
        R = self.R
        out = {"log_normalizer": per_system(est["log_normalizer"], R),
               "log_normalizer_se": per_system(est["se"], R),
               "log_normalizer_forward": per_system(est["forward"], R),
               "log_normalizer_forward_se": per_system(est["forward_se"], R),
               "log_normalizer_reverse": per_system(est["reverse"], R),
               "log_normalizer_reverse_se": per_system(est["reverse_se"], R),
               "log_normalizer_halves_z": per_system(est["halves_z"], R),
               "log_normalizer_per_slot": per_system(est["per_slot"], R),
               "log_normalizer_overlap": per_system(self.pair_overlap(), R),
               "log_normalizer_kind": "log Z" if self.reference_normalized else "ratio",
               "log_normalizer_method": "bridge" if not self.legacy else "stepping-stone average"}
        halves = self.halves_note()
        if halves is not None:
            out["log_normalizer_halves_note"] = halves
        if self.legacy:
            out["log_normalizer_note"] = (
                "resumed from a checkpoint written before the bridge estimator: until the next "
                "round log_normalizer is the old average of the stepping-stone halves (biased "
                "upward where the reverse half's weights have infinite variance), without error")
        elif not bool(est["reverse_valid"].all()):
            out["log_normalizer_note"] = (
                "the target is zero on part of the reference's support, where the reverse "
                "(1/Z) half cannot see the lost mass: the reverse half is not used there")
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

    def bridge_log_ratios(self) -> torch.Tensor:
        """The bridge's estimates of ``log(Z_p / Z_{p+1})`` per pair, ``[R, P-1]``."""
        return self.bridge_num.log_mean() - self.bridge_den.log_mean()

    def pair_overlap(self) -> torch.Tensor:
        """``[R, P-1]``: the Bhattacharyya coefficient ``BC = int sqrt(pi_p pi_{p+1})`` of each
        pair of neighbours, from the bridge's own sums: ``E_{p+1}[exp(-Delta V / 2)] E_p[exp(
        +Delta V / 2)] = Z_{p+1/2}^2 / (Z_p Z_{p+1}) = BC^2``.  Each side's bridge weights have
        relative variance ``v = 1 / BC^2 - 1`` per draw, so a round of ``n`` draws leaves the
        pair's means a relative variance of about ``v / n``; where that is not small the
        bridge is in the rare-event regime (biased low, its error too small).  Estimated from
        the same weights, so it is itself read low there (the finding errs towards warning).
        NaN before the first term."""
        return (0.5 * (self.bridge_num.log_mean() + self.bridge_den.log_mean())).exp()

    def _batch_ses(self) -> dict[str, torch.Tensor]:
        """Batch-means standard errors (``[R]`` each) of the bridge, the two halves and the
        halves' gap, by the delta method: ``log`` of a mean ``m`` moves by ``(m_j - m) / m``
        for a batch mean ``m_j``, summed over the pairs (so the pairs' and the two sides'
        correlations are counted), and the variance of the mean of ``B`` batches is the
        batches' sample variance over ``B``.  NaN with fewer than 2 complete batches."""
        def rel(acc):  # [B, R, P-1]: m_j / m - 1, m the mean over the complete batches
            lb = acc.batch_log_means()
            B = lb.shape[0]
            centre = torch.logsumexp(lb, 0) - math.log(max(B, 1))
            return torch.expm1(lb - centre)

        f, r = rel(self.forward), rel(self.reverse)
        bn, bd = rel(self.bridge_num), rel(self.bridge_den)
        B = f.shape[0]

        def se(d):  # d: [B, R] linearized deviations of one estimate
            if B < 2:
                return torch.full(d.shape[1:], math.nan, dtype=d.dtype, device=d.device)
            d = d - d.mean(0)
            return (d.square().sum(0) / (B - 1) / B).sqrt()

        return {"se": se((bn - bd).sum(2)), "forward_se": se(f.sum(2)),
                "reverse_se": se(r.sum(2)), "gap_se": se((f + r).sum(2)), "batches": B}

    def estimate(self) -> dict[str, torch.Tensor]:
        """``log_normalizer`` (the bridge), ``forward``, ``reverse`` (the stepping-stone halves),
        their batch-means standard errors ``se``, ``forward_se``, ``reverse_se``, the halves'
        gap in units of its error ``halves_z`` (``[R]`` each), ``per_slot`` (``[R, P]``:
        ``log Z_p - log Z_{P-1}`` by the bridge) and ``reverse_valid`` (``[R]``, bool).

        The reverse identity needs ``pi_p > 0`` wherever ``pi_{p+1} > 0``.  When the forward
        stream of a pair met states of weight zero (``V = +inf`` at slot ``p+1``: the target
        vanishes on part of the reference's support) that fails -- the reverse half cannot see
        the missing mass -- so ``reverse_valid`` is false for the system and its ``halves_z``
        is NaN.  The bridge needs only that the neighbours overlap."""
        fwd, rev = self.pair_log_ratios()
        pair_ok = self.forward.zeros == 0
        if self.legacy:  # no bridge statistics for this segment: the old estimate
            per_pair = torch.where(pair_ok, 0.5 * (fwd + rev), fwd)
        else:
            per_pair = self.bridge_log_ratios()
        tail = torch.flip(torch.cumsum(torch.flip(per_pair, [1]), 1), [1])  # sum_{q >= p}
        per_slot = torch.cat([tail, torch.zeros_like(tail[:, :1])], dim=1)
        ses = self._batch_ses()
        if self.legacy:  # batches cover only the iterations since the resume: no errors
            ses = {k: torch.full_like(v, math.nan) if torch.is_tensor(v) else v
                   for k, v in ses.items()}
        valid = pair_ok.all(1)
        f, r = fwd.sum(1), rev.sum(1)
        z = torch.where(valid, (f - r) / ses["gap_se"], torch.full_like(f, math.nan))
        return {"log_normalizer": per_pair.sum(1), "forward": f, "reverse": r,
                "se": ses["se"], "forward_se": ses["forward_se"],
                "reverse_se": ses["reverse_se"], "halves_z": z, "per_slot": per_slot,
                "reverse_valid": valid}

    def findings(self, label=None, across: bool = False) -> list:
        """:class:`nrpt.report.health.Finding` s: ``log-z-halves`` where the stepping-stone
        halves are in the wrong order (forward above reverse) beyond :data:`HALVES_Z`, in some
        system or in the systems' z combined -- against both halves' own biases, so the slots'
        draws are not their path distributions; ``log-z-overlap`` where a pair of neighbours
        overlaps too little for the bridge (:data:`OVERLAP_DRAWS`; the message gives that
        system's halves beside it); and, with ``across`` (the engine's systems estimate one
        quantity), ``log-z-systems`` where the systems' bridge estimates disagree beyond their
        errors (:func:`systems_spread`).  The halves apart in their expected order are a
        summary note (:meth:`halves_note`), not a finding.  ``label(i)`` names engine system
        ``i`` in the message (default ``"system i"``)."""
        if self.n == 0:
            return []
        label = label or (lambda i: f"system {i}")
        est = {k: v.detach().cpu().double() for k, v in self.estimate().items()}
        halves = self._wrong_order_finding(label, est)
        overlap = self._overlap_finding(label, est)
        spread = systems_spread(est["log_normalizer"], est["se"]) if across else None
        return [f for f in (halves, overlap, spread) if f is not None]

    @staticmethod
    def _halves_apart(z: torch.Tensor, sign: float) -> tuple[list[int], float, int]:
        """The systems whose halves' gap ``sign * z`` exceeds :data:`HALVES_Z`, the systems'
        combined ``sign * sum z / sqrt(k)`` over the ``k`` finite ones (NaN below 2), and ``k``."""
        ok = torch.isfinite(z)
        k = int(ok.sum())
        bad = [i for i in range(z.numel()) if bool(ok[i]) and sign * float(z[i]) > HALVES_Z]
        comb = sign * float(z[ok].sum()) / math.sqrt(k) if k >= 2 else math.nan
        return bad, comb, k

    def _wrong_order_finding(self, label, est):
        """``log-z-halves`` where the forward half exceeds the reverse by more than
        :data:`HALVES_Z` errors (some system, or the systems combined); None otherwise."""
        from nrpt.report.health import Finding

        bad, comb, k = self._halves_apart(est["halves_z"], +1.0)
        if not bad and not comb > HALVES_Z:
            return None
        if bad:
            i = max(bad, key=lambda j: float(est["halves_z"][j]))
            more = f" ({len(bad)} systems in all)" if len(bad) > 1 else ""
            where = (f"in {label(i)}{more}: forward {float(est['forward'][i]):.4g} above reverse "
                     f"{float(est['reverse'][i]):.4g} by {float(est['halves_z'][i]):.1f} times "
                     f"its batch-means error (threshold {HALVES_Z:g}; bridge "
                     f"{float(est['log_normalizer'][i]):.4g} ± {float(est['se'][i]):.2g})")
        else:
            gap = float((est["forward"] - est["reverse"])[torch.isfinite(est["halves_z"])].mean())
            where = (f"over the {k} systems together: forward minus reverse is {gap:.3g} on "
                     f"average, combined z = {comb:.1f} (threshold {HALVES_Z:g})")
        return Finding("log-z-halves", (
            f"the stepping-stone halves of log Z are in the wrong order {where}. Each half's "
            "own bias runs the other way (the forward half reads low and the reverse half high, "
            "by Jensen's inequality, however heavy their weights' tails), so the slots' draws "
            "are not from their path distributions: the run is not yet stationary, an explorer "
            "does not mix, or the swaps do not keep each slot's distribution (a swap rule that "
            "accepts every swap); log_normalizer, the bridge, is then wrong too (measured on a "
            "Gaussian path with every swap accepted: 69 nats off, z up to 83; with Metropolis "
            "swaps this order beyond 4 errors came in ~3e-4 of systems)"),
            "burn-in / iterations / swap_rule (metropolis) / explorer")

    def halves_note(self) -> str | None:
        """The summary's ``log_normalizer_halves_note`` where the stepping-stone halves are
        apart in their expected order (forward below reverse) beyond :data:`HALVES_Z` (in some
        system, or the systems' z combined) and no pair overlaps too little for the bridge
        (then the ``log-z-overlap`` warning shows the halves); None otherwise."""
        if self.n == 0 or self.legacy:
            return None
        est = {k: v.detach().cpu().double() for k, v in self.estimate().items()}
        if self._overlap_finding(lambda i: "", est) is not None:
            return None
        bad, comb, k = self._halves_apart(est["halves_z"], -1.0)
        if not bad and not comb > HALVES_Z:
            return None
        where = (f"in {len(bad)} of {self.R} systems (z down to "
                 f"{min(float(est['halves_z'][i]) for i in bad):.1f})" if bad else
                 f"over the {k} systems together (combined z = {-comb:.1f})")
        return (f"the stepping-stone halves (log_normalizer_forward / _reverse) are apart beyond "
                f"{HALVES_Z:g} times their batch-means error {where}, forward below reverse. "
                "That is common and says nothing against log_normalizer, the bridge: the reverse "
                "half is biased upward and its error too small wherever its weights have "
                "infinite variance (a slot more than sqrt(2) times as spread as its colder "
                "neighbour, or a likelihood vanishing faster than the reference). On exact "
                "Gaussian paths the halves were apart in 41-100 % of runs whose bridge was "
                "unbiased and covered by its error; the bridge's own check is the log-z-overlap "
                "warning")

    def _overlap_finding(self, label, est):
        """``log-z-overlap`` where some pair's relative variance of its bridge means, ``(1 /
        BC^2 - 1) / n`` (:meth:`pair_overlap`), exceeds ``1 /`` :data:`OVERLAP_DRAWS` in some
        system (the message gives that system's halves from ``est``, :meth:`estimate`, where
        they are finite); None otherwise."""
        from nrpt.report.health import Finding

        if self.legacy or self.P < 2:
            return None
        bc = self.pair_overlap().detach().cpu().double()
        ratio = (1.0 / bc.clamp_min(1e-150).square() - 1.0) / max(self.n, 1)  # v / n per pair
        ratio = torch.where(torch.isnan(bc), torch.zeros_like(ratio), ratio)
        high = ratio.max(1)
        bad = [i for i in range(self.R) if float(high.values[i]) * OVERLAP_DRAWS > 1.0]
        if not bad:
            return None
        i = max(bad, key=lambda j: float(high.values[j]))
        p = int(high.indices[i])
        b = float(bc[i, p])
        more = f" ({len(bad)} systems in all)" if len(bad) > 1 else ""
        pairs = int((ratio[i] * OVERLAP_DRAWS > 1.0).sum())
        return Finding("log-z-overlap", (
            f"neighbouring slots {p} and {p + 1} overlap too little for the log Z bridge in "
            f"{label(i)}{more}: Bhattacharyya coefficient {b:.2g}, so each draw's bridge "
            f"weight has relative variance v = 1/BC^2 - 1 = {1.0 / max(b * b, 1e-300) - 1.0:.2g}"
            f" and this round's {self.n} draws leave the pair's means a relative variance v/n "
            f"= {float(high.values[i]):.2g}, above 1/{OVERLAP_DRAWS:g} ({pairs} of "
            f"{self.P - 1} pairs): the log of such a mean is skewed and reads low, in every "
            f"system alike, which neither its error nor the systems' spread can show (on a "
            f"Gaussian path with exact log Z, v/n = 0.08 read 0.76 low with errors covering "
            f"59 %){self._halves_beside(i, est)}"),
            "chains (closer neighbours: about 2Λ̂ where Λ̂ is not saturated) / iterations")

    @staticmethod
    def _halves_beside(i: int, est: dict) -> str:
        """``; its stepping-stone halves: ...`` for system ``i`` of ``est`` (empty when its gap
        is not finite)."""
        z = float(est["halves_z"][i])
        if not math.isfinite(z):
            return ""
        return (f"; its stepping-stone halves: forward {float(est['forward'][i]):.4g}, reverse "
                f"{float(est['reverse'][i]):.4g}, bridge {float(est['log_normalizer'][i]):.4g} "
                f"(forward minus reverse: {z:+.1f} times its batch-means error)")

    def state_dict(self) -> dict:
        return {"forward": self.forward.state_dict(), "reverse": self.reverse.state_dict(),
                "bridge_num": self.bridge_num.state_dict(),
                "bridge_den": self.bridge_den.state_dict(), "legacy": self.legacy}

    def load_state_dict(self, sd: dict) -> None:
        """Restore; a checkpoint written before the bridge (no ``bridge_num``) loads its halves
        and marks the segment ``legacy``: until the next reset the headline is the old average
        of the halves and the summary says so (the bridge cannot be rebuilt from the sums)."""
        if "bridge_num" not in sd:
            self.reset()
            for name in ("forward", "reverse"):
                old = dict(sd[name])
                acc = getattr(self, name)
                acc.K, keep = 0, acc.K  # no batches in the old state
                acc.load_state_dict(old)
                acc.K = keep  # its batch store stays empty: errors NaN (fewer than 2 batches)
            self.legacy = True
            return
        self.forward.load_state_dict(sd["forward"])
        self.reverse.load_state_dict(sd["reverse"])
        self.bridge_num.load_state_dict(sd["bridge_num"])
        self.bridge_den.load_state_dict(sd["bridge_den"])
        self.legacy = bool(sd.get("legacy", False))
