r"""Between rounds: a per-slot preconditioner from the states each slot saw during the round.

:class:`MetricAdaptor` reads the ``spread`` recorder (every slot; with ``dense`` its
co-moments, merged in float64 batched over slots) and pools each slot over the systems:

    S_p = (sum_r M2_{r,p} + n sum_r (m_{r,p} - m_p)(m_{r,p} - m_p)^T) / (N - 1),  N = R n,

regularised as Stan's windowed adaptation does, but in the whitened units of the slot's current
metric ``L`` (``A = L^{-1} S_p L^{-T}``; the first time, ``L = diag(S_p)^{1/2}``: ``A`` is the
correlation matrix, shrunk toward the diagonal), so that the ridge scales with the posterior
and does not swamp the narrow directions of a correlated one (Stan's absolute ``1e-3 I``
would, at sds of 1e-3):

    A <- (N / (N + 5)) A + 1e-3 (5 / (N + 5)) I,   L_new = L chol(A)   (lower triangular).

``diagonal``: the same on the diagonal, scales ``[R, P, dim]``; ``dense``: ``L_new``
``[R, P, dim, dim]`` (where the Cholesky factor of ``A`` fails: the square roots of its
diagonal).  A slot with fewer than :data:`MIN_ROWS` (or :data:`ROWS_PER_DIM` per dimension)
pooled rows, a non-positive or non-finite variance, or (``gate``) an explorer acceptance in the
round outside :data:`GATE`, keeps its old metric.

The step sizes were tuned for the old metric: :attr:`MetricAdaptor.changed` carries, per
slot, the length in the new whitened units of the longest unit step of the old ones,
``||L_new^{-1} L_old||_2`` (so the narrowest new direction keeps its old step length: the
acceptance stays about where it was, whether or not the estimate is good), clipped to
``[1e-3, 1e3]`` and taken to the power :data:`RATIO_POWER` (1/2: a round's estimate tends to
overstate the narrow directions), by which :class:`nrpt.adapt.rounds.StepSizeAdaptor`
multiplies the plain model step (no fast move, no bracket) before restarting the bracket
(:meth:`nrpt.adapt.step.StepTuner.restart`); :attr:`MetricAdaptor.z_scale` is the mean
whitened standard deviation, from which :class:`nrpt.adapt.rounds.SliceWidthAdaptor` sets the
widths (in ``z`` units).
"""

from __future__ import annotations

import torch

from nrpt.roles import AdaptorBase, SegmentView, Update

__all__ = ["MetricAdaptor", "MODES", "DENSE_MAX_DIM", "resolve_mode", "MIN_ROWS"]

#: ``precondition`` values
MODES = ("none", "diagonal", "dense", "auto")
#: ``auto``: dense up to this dimension, diagonal above
DENSE_MAX_DIM = 200
#: a slot's metric is estimated from at least this many pooled rows (else kept)
MIN_ROWS = 16
#: ... and at least this many per dimension
ROWS_PER_DIM = 10
#: a slot's metric is re-estimated only where the round's explorer acceptance (mean over
#: systems) lies inside this range (``gate``): a frozen chain's states (acceptance ~0) say
#: nothing about the slot's covariance, a crawling one's (~1) measure the step more than the
#: target; the step tuning brings the acceptance into the range first
GATE = (0.1, 1.01)
#: the step ratio applied after a change is kept inside [1 / RATIO_MAX, RATIO_MAX]
RATIO_MAX = 1e3
#: and taken to this power (a new metric estimated from a round whose states were still
#: settling tends to overstate the narrow directions: half the move in log scale, the step
#: tuner does the rest)
RATIO_POWER = 0.5
#: Stan's shrinkage: ``(n / (n + 5)) S + REG (5 / (n + 5)) D``
SHRINK, REG = 5.0, 1e-3


def resolve_mode(mode: str, dim: int) -> str:
    """``"none"``, ``"diagonal"`` or ``"dense"`` for ``precondition = mode`` at ``dim``."""
    if mode not in MODES:
        raise ValueError(f"precondition must be one of {', '.join(MODES)}; got {mode!r}")
    if mode == "auto":
        return "dense" if int(dim) <= DENSE_MAX_DIM else "diagonal"
    return mode


class MetricAdaptor(AdaptorBase):
    """Estimate each slot's preconditioner between rounds (see the module docstring).

    ``mode``: ``"diagonal"`` or ``"dense"`` (``"auto"`` resolved by ``dim``); ``phase``: act
    only at the end of segments whose name starts with it (``"warm-up"``), by default at the
    end of every segment but the last.  ``gate``: re-estimate only the slots whose explorer
    acceptance was inside :data:`GATE` (explorers with an acceptance rate to tune; the slice
    sampler has none)."""

    name = "metric"
    #: the ``spread`` recorder must watch every slot
    spread_slots = "all"

    def __init__(self, mode: str = "dense", dim: int | None = None, phase: str | None = None,
                 gate: bool = True, switch=None):
        mode = resolve_mode(mode, dim if dim is not None else 0)
        if mode == "none":
            raise ValueError("MetricAdaptor needs precondition 'diagonal', 'dense' or 'auto'")
        self.mode, self.phase, self.gate = mode, phase, bool(gate)
        #: the spread recorder keeps co-moments (dense metrics)
        self.spread_covariance = mode == "dense"
        #: ``(segment index, step ratio [R, P])`` of the last change
        self.changed: tuple[int, torch.Tensor] | None = None
        #: ``(segment index, mean whitened sd [R, P])`` of the last change
        self.z_scale: tuple[int, torch.Tensor] | None = None
        self.updates = 0
        #: per slot ``[P]``, the number of rows behind the current metric (None: the metric is
        #: re-estimated from each round alone, with Stan's shrinkage).  Set
        #: (:meth:`seed_rows`) where the run starts from a metric of its own (the Laplace start
        #: of :mod:`nrpt.paths.gaussian_reference`): each round's estimate is then pooled with
        #: the current metric weighted by these rows, ``A <- (N A + M I) / (N + M)`` in its
        #: whitened frame, and ``M <- M + N``
        self.prior_rows: torch.Tensor | None = None
        #: an explorer with a ``switched`` flag (:class:`nrpt.explorers.metropolis.MALAThenHMC`):
        #: at the end of a round where slot 0's ``tail-acceptance`` check fires, it is switched,
        #: the metric becomes the identity and is no longer estimated (:meth:`_switch`)
        self.switch = switch
        #: the segment index of the switch (None: not switched)
        self.switched_at: int | None = None

    def end_segment(self, view: SegmentView) -> Update | None:
        if self.switched_at is not None:  # (said every round: a resumed run's summary too)
            return Update(note=self._switch_note())
        if view.last or (self.phase is not None and not view.name.startswith(self.phase)):
            return None
        if self.switch is not None and _neck(view):
            return self._switch(view)
        spread = view.recorders["spread"]
        R, P = view.step_size.shape
        if len(spread.slots) != P:
            raise ValueError("the metric adaptor needs the spread of every slot")
        if self.mode == "dense":
            n, mean, c2 = spread.moments()
        else:
            n, mean, m2 = spread._stats()
            c2 = None
        N = R * n
        if N < max(MIN_ROWS, ROWS_PER_DIM * mean.shape[-1]) or n < 2:
            return None
        mean = mean.double()
        gm = mean.mean(0, keepdim=True)
        dm = mean - gm  # [R, P, d]
        if c2 is None:
            S = (m2.double().sum(0) + n * (dm * dm).sum(0)) / (N - 1)  # [P, d]
            var = S
        else:
            S = (c2.double().sum(0) + n * torch.einsum("rpi,rpj->pij", dm, dm)) / (N - 1)
            var = S.diagonal(dim1=-2, dim2=-1)
        good = torch.isfinite(var).all(-1) & (var > 0).all(-1)  # [P]
        if self.gate:
            acc = view.recorders["swaps"].explorer_acceptance().double().mean(0).cpu()
            good = good & (acc > GATE[0]) & (acc < GATE[1])
        if not bool(good.any()):
            return None
        old = view.metric
        old0 = None if old is None else old[0].double()  # pooled: every system's is the same
        pooled = self.prior_rows is not None and old0 is not None
        # the weight of the round's estimate [P]: against Stan's shrinkage toward REG, or
        # (pooled) against the current metric's rows, toward the current metric itself
        M = self.prior_rows.to(torch.float64).expand(P) if pooled else None
        w = N / (N + M) if pooled else torch.full((P,), N / (N + SHRINK), dtype=torch.float64)
        reg = 1.0 if pooled else REG
        d = var.shape[-1]
        sd = var.clamp_min(torch.finfo(var.dtype).tiny).sqrt()
        if c2 is None:
            s_old = torch.ones_like(var) if old0 is None else old0
            frame = sd if old0 is None else old0
            # in the frame's whitened units: w a + reg (1 - w), a = var / frame^2
            new = (w[:, None] * var + reg * (1.0 - w[:, None]) * frame * frame).sqrt()
            new = torch.where(good[:, None], new, s_old)
            ratio = (s_old / new).max(-1).values
            z_scale = (var.sqrt() / new).mean(-1)
        else:
            eye = torch.eye(d, dtype=S.dtype)
            L_old = (eye.expand_as(S) if old0 is None else
                     torch.diag_embed(old0) if old0.dim() == 2 else old0)
            frame = torch.diag_embed(sd) if old0 is None else L_old
            A = _whitened_var(S, frame)
            A = 0.5 * (A + A.transpose(-1, -2))
            wp = w[:, None, None]
            A = torch.where(good[:, None, None], wp * A + reg * (1.0 - wp) * eye, eye)
            C, info = torch.linalg.cholesky_ex(A)
            ok = (info == 0) & torch.isfinite(C).all((-1, -2))
            # where the Cholesky factor fails: the diagonal of A
            C = torch.where(ok[:, None, None], C,
                            torch.diag_embed(A.diagonal(dim1=-2, dim2=-1).clamp_min(REG).sqrt()))
            new = frame @ C  # lower triangular: the new covariance frame A frame^T
            new = torch.where(good[:, None, None], new, L_old)
            ratio = _stretch(new, L_old)
            z_scale = _whitened_var(S, new).diagonal(dim1=-2, dim2=-1).clamp_min(0).sqrt().mean(-1)
        ratio = torch.where(good & torch.isfinite(ratio) & (ratio > 0), ratio,
                            torch.ones_like(ratio)).clamp(1.0 / RATIO_MAX, RATIO_MAX)
        ratio = ratio ** RATIO_POWER
        z_scale = torch.where(good & torch.isfinite(z_scale) & (z_scale > 0), z_scale,
                              torch.ones_like(z_scale))
        self.changed = (view.index, ratio.expand(R, P).to(view.step_size))
        self.z_scale = (view.index, z_scale.expand(R, P).to(view.step_size))
        self.updates += 1
        if pooled:
            self.prior_rows = torch.where(good, M + N, M)
        metric = new.to(view.step_size.dtype).expand(R, *new.shape).clone()
        return Update(metric=metric)

    def _switch(self, view: SegmentView) -> Update:
        """Switch the explorer (to HMC without a metric): the metric becomes the identity, the
        steps move by the same rule as after a new metric (:attr:`changed`)."""
        R, P = view.step_size.shape
        old = view.metric
        self.switched_at = int(view.index)
        self.switch.switched = True
        self.z_scale = None
        note = self._switch_note()
        if old is None:
            return Update(note=note)
        old0 = old[0].double()
        d = old0.shape[-1]
        eye = torch.eye(d, dtype=torch.float64).expand(P, d, d)
        # the shortest old unit step's length in x (the smallest singular value of L_old):
        # HMC without a metric must resolve the narrowest direction, in which MALA's whitened
        # step was a step of that length (:class:`nrpt.adapt.rounds.StepSizeAdaptor` maps the
        # MALA step to HMC's from there, :data:`nrpt.adapt.rounds.HMC_FROM_MALA`)
        ratio = (torch.linalg.svdvals(old0)[..., -1] if old0.dim() == 3
                 else old0.min(-1).values)
        ratio = torch.where(torch.isfinite(ratio) & (ratio > 0), ratio,
                            torch.ones_like(ratio)).clamp(1.0 / RATIO_MAX, RATIO_MAX)
        self.changed = (view.index, ratio.expand(R, P).to(view.step_size))
        metric = eye if old0.dim() == 3 else torch.ones(P, d, dtype=torch.float64)
        return Update(metric=metric.to(view.step_size.dtype).expand(R, *metric.shape).clone(),
                      note=note)

    def _switch_note(self) -> dict:
        return {"explorer_switched": f"after round {self.switched_at + 1}: slot 0 cannot enter "
                                     f"a tail (tail-acceptance): HMC without a metric"}

    def seed_rows(self, rows) -> None:
        """The current metric stands for ``rows`` rows at every slot (``[P]`` or a number;
        see :attr:`prior_rows`)."""
        self.prior_rows = torch.as_tensor(rows, dtype=torch.float64)

    def follow_ladder(self, m) -> None:
        """The ladder grew (after this round's adaptors): the engine copies each new slot's
        metric from its source slot; the step ratios of this round, already used, are dropped."""
        self.changed = self.z_scale = None
        if self.prior_rows is not None and self.prior_rows.dim() == 1:
            self.prior_rows = self.prior_rows[torch.as_tensor(m.source)].clone()

    def state_dict(self) -> dict:
        out = {"updates": self.updates}
        if self.switched_at is not None:
            out["switched_at"] = self.switched_at
        if self.prior_rows is not None:
            out["prior_rows"] = self.prior_rows.tolist()
        return out

    def load_state_dict(self, sd: dict) -> None:
        self.updates = int(sd.get("updates", 0))
        at = sd.get("switched_at")
        self.switched_at = None if at is None else int(at)
        if self.switch is not None:
            self.switch.switched = self.switched_at is not None
        if sd.get("prior_rows") is not None:
            self.prior_rows = torch.as_tensor(sd["prior_rows"], dtype=torch.float64)


#: the switch of :class:`MetricAdaptor` (``switch``) reads a round's ``tail-acceptance`` check
#: only where slot 0 made at least this many steps in it (pooled over systems: round 5 of 4
#: systems).  Measured at rounds 10, 4 systems: diamonds (d = 26, seed 0) fired the check at
#: round 4 (16 iterations x 4 systems, a chain still settling), and HMC without a metric then
#: failed that badly scaled posterior (sd ratio 2.1, 15 chains); from round 5 on it fires on
#: no guard posterior.  gp_pois_regr's neck fires it at round 5 (seeds 0, 3) or 6 (1, 2);
#: with a floor of 256 seeds 0 and 3 switched only at round 8 and failed
NECK_MIN_STEPS = 128
#: ... and only on a tail whose acceptance deficit is significant given its count
#: (:func:`nrpt.report.health.tail_deficit_p` below this): a tail of 14 draws accepting 0.067
#: against 0.324 overall is not evidence of a neck.  Measured (rounds 10, 4 systems, the
#: first round the ratio check fires at): the false switches of stop 35 -- mesquite,
#: logmesquite and logmesquite_logvas seed 1 after round 6, one tail of 14 draws, p 0.029 --
#: no longer fire; gp_pois_regr's switches keep their rounds (p 1.4e-3, 4.4e-3, 1e-10 and
#: 0.012 on seeds 0-3: thin margins both ways; out of sample, seeds 4-9 keep theirs and
#: mesquite seed 4's false switch, p 2.1e-3, stays: docs/gaussian_reference.md);
#: one_comp_mm_elim_abs (p 2e-5 and 2e-7: the upper tails of K_m and coordinate 2 accept
#: 0.01-0.16 against 0.38-0.49) still switches
NECK_MAX_P = 0.02


def _neck(view: SegmentView) -> bool:
    """Whether the round's ``tail-acceptance`` check of slot 0 fires (the summary's check,
    :func:`nrpt.report.health.check_tails`, on the ``tail_acceptance`` recorder's statistics)
    on at least :data:`NECK_MIN_STEPS` steps, on a tail whose deficit is significant
    (:data:`NECK_MAX_P`)."""
    from nrpt.report import health

    rec = view.recorders.get("tail_acceptance")
    stats = None if rec is None else rec.stats()
    if stats is None or float(stats["n"]) < NECK_MIN_STEPS:
        return False
    return bool(health.check_tails(stats, max_p=NECK_MAX_P))


def _stretch(new: torch.Tensor, old: torch.Tensor | None) -> torch.Tensor:
    """``||L_new^{-1} L_old||_2`` ``[P]``: the longest old proposal direction in the new
    whitened units, so that a step ``h`` becomes ``h`` times it (``old``: ``None``, diagonal
    ``[P, d]`` or lower triangular ``[P, d, d]``)."""
    if old is None:
        old = torch.eye(new.shape[-1], dtype=new.dtype).expand_as(new)
    elif old.dim() == 2:
        old = torch.diag_embed(old)
    X = torch.linalg.solve_triangular(new, old, upper=False)
    return torch.linalg.matrix_norm(X, ord=2)


def _whitened_var(S: torch.Tensor, L: torch.Tensor | None) -> torch.Tensor:
    """``L^{-1} S L^{-T}`` ``[P, d, d]`` (``L``: ``None``, diagonal ``[P, d]`` or lower
    triangular ``[P, d, d]``)."""
    if L is None:
        return S
    if L.dim() == 2:
        return S / (L[..., :, None] * L[..., None, :])
    A = torch.linalg.solve_triangular(L, S, upper=False)
    return torch.linalg.solve_triangular(L, A.transpose(-1, -2), upper=False)
