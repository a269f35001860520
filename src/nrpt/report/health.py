"""Run-health checks: a run's statistics (numpy arrays or floats) to :class:`Finding` s naming
the setting to turn; :func:`emit` raises them as :class:`SamplingWarning` s,
:func:`format_findings` prints them.

Codes of :func:`check_run` (each skipped when its input is ``None``): ``pair-acceptance``
(< :data:`PAIR_FLOOR`), ``no-restarts`` (zero though >= :data:`RESTARTS_EXPECTED_MIN`
predicted, Syed et al. 2021, Theorem 1), ``explorer-acceptance`` (outside
:data:`EXPLORER_BAND` of the target), ``hot-slot-stuck`` (:data:`HOT_SPREAD_MIN`,
:data:`HOT_MEAN_DISAGREEMENT`), ``r-hat`` (> :data:`R_HAT_MAX`), ``low-ess``
(< :data:`ESS_MIN_PER_SYSTEM` per system; Vehtari et al. 2021), ``ladder-collapse``
(:data:`RUNG_GAP_MIN`), ``swap-rate-off-target`` (:data:`SWAP_RATE_TOLERANCE`),
``too-few-chains`` (``2 Lambda-hat > 1.25 P``, Syed et al. 2021), ``tail-acceptance`` (slot 0's
explorer acceptance beyond ``mean +- 2 sd`` of a coordinate below :data:`TAIL_RATIO` of its
overall acceptance: a funnel or neck the step cannot enter, :mod:`nrpt.recorders.tails`)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

__all__ = [
    "SamplingWarning",
    "Finding",
    "slot0_diagnostics",
    "check_run",
    "check_tails",
    "tail_deficit_p",
    "emit",
    "format_findings",
    "PAIR_FLOOR",
    "RESTARTS_EXPECTED_MIN",
    "EXPLORER_BAND",
    "HOT_SPREAD_MIN",
    "HOT_MEAN_DISAGREEMENT",
    "R_HAT_MAX",
    "ESS_MIN_PER_SYSTEM",
    "RUNG_GAP_MIN",
    "SWAP_RATE_TOLERANCE",
    "TAIL_RATIO",
    "TAIL_MIN_DRAWS",
    "TAIL_MIN_ENTRIES",
    "TAIL_MIN_FRACTION",
]


class SamplingWarning(UserWarning):
    """The category of every warning nrpt emits about the quality of a run."""


@dataclass(frozen=True)
class Finding:
    """One problem found in a run.

    ``code`` is a stable identifier (``"pair-acceptance"``, ``"no-restarts"``,
    ``"explorer-acceptance"``, ``"hot-slot-stuck"``, ``"r-hat"``, ``"low-ess"``), ``message`` one
    plain sentence with the numbers, ``knob`` the setting(s) to turn."""

    code: str
    message: str
    knob: str


# --------------------------------------------------------------------------- thresholds

#: swap acceptance below which an adjacent pair is blocked (at 0.05 one pair caps the DEO
#: restart rate at 1/40 per iteration, Syed et al. 2021, Theorem 1)
PAIR_FLOOR = 0.05
#: zero restarts are flagged once the predicted DEO restarts after the first ``P - 1``
#: iterations reach this (Poisson: ``P(0 | mean 3) = 0.05``)
RESTARTS_EXPECTED_MIN = 3.0
#: explorer acceptance flagged below ``target * band[0]`` or rejection below
#: ``(1 - target) / band[1]``
EXPLORER_BAND = (0.25, 4.0)
#: hottest-slot sd below this fraction of the reference sd: stuck
HOT_SPREAD_MIN = 1.0 / 3.0
#: ``R >= 2``: sd of the systems' hot-slot means, in pooled within-system sds, above which
#: they disagree (about a hot-slot R-hat of 1.41)
HOT_MEAN_DISAGREEMENT = 1.0
#: rank-normalized split R-hat threshold (Vehtari et al. 2021)
R_HAT_MAX = 1.01
#: minimum bulk and tail ESS per system (Vehtari et al. 2021: 100 per chain)
ESS_MIN_PER_SYSTEM = 100.0
#: ``too-few-chains`` where ``2 Lambda-hat > SHORT_LADDER * P`` (the same margin as
#: ``nrpt.adapt.chains.SHORT_LADDER``, which grows a ``chains = "auto"`` ladder; this module
#: imports only numpy)
SHORT_LADDER = 1.25
#: adjacent SG learning rates closer than this fraction of the larger have collapsed
#: (ladders measured: docs/benchmarks.md)
RUNG_GAP_MIN = 0.01
#: a pair's swap-indicator rate further than this from the target ``S`` was not equalized
#: (rates measured: docs/benchmarks.md)
SWAP_RATE_TOLERANCE = 0.1

#: ``tail-acceptance`` where slot 0's explorer acceptance in a coordinate's tail (beyond
#: ``mean +- 2 sd``) is below this fraction of its overall acceptance.  On a Gaussian the tail's
#: acceptance is *above* the overall one (MALA at 0.574: ratio 1.1-1.5 for d = 1..50; 0.19 only
#: for d = 1 with a step 1.6x too long, acceptance 0.19); gp_pois_regr's neck: about 0.1-0.25
#: (nrpt.recorders.tails)
TAIL_RATIO = 0.35
#: ... counted only where at least this many slot-0 iterations (pooled over systems) started
#: in that tail
TAIL_MIN_DRAWS = 10
#: ... and entered it at least this many separate times (a replica stuck once in a far tail is
#: not a neck the chain keeps failing to enter)
TAIL_MIN_ENTRIES = 5
#: ... and held at least this fraction of the draws: a neck whose mouth holds less moves the
#: moments little (eight_schools_noncentered, rounds 13: log tau's upper tail, acceptance 0.034
#: against 0.57 over 19 visits, but 0.15 % of the draws, and the run passes the reference;
#: gp_pois_regr: 0.9-1.2 %, its alpha sd 12-16 % short)
TAIL_MIN_FRACTION = 0.005

KNOB_SG_LADDER = ("ladder_update = log-gaps (or the initial ladder: lr_min / lr_max / "
                  "learning_rates / chains)")
KNOB_LADDER = "chains / max_temperature (or --rounds to adapt the schedule)"
KNOB_CHAINS = "chains (or chains = 'auto' / max_chains with rounds)"
KNOB_RESTARTS = "iterations / chains / schedule (max_temperature, or --rounds to adapt it)"
KNOB_STEP = "step_size"
KNOB_HOT = "max_temperature / step_size at the hot end"
KNOB_MIXING = "iterations / systems / chains"
KNOB_TAIL = ("explorer = 'slice' or 'hmc' (moves that adapt to / travel through a narrowing "
             "region), or many more iterations (rounds); a non-centred parametrisation of the "
             "model where it has one")


# --------------------------------------------------------------------------- helpers

def _fmt(x: float) -> str:
    """Short human number: 3 significant digits, whole numbers from 1000 up."""
    x = float(x)
    if math.isfinite(x) and 1000 <= abs(x) < 1e9:
        return f"{x:.0f}"
    return f"{x:.3g}"


def _as_2d(x, name: str) -> np.ndarray:
    """``[R, K]`` float array from ``[K]`` or ``[R, K]`` input."""
    a = np.asarray(x, dtype=float)
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim != 2:
        raise ValueError(f"{name} must have shape [R, K] or [K], got {a.shape}")
    return a


def _as_3d(x, name: str) -> np.ndarray:
    """``[R, n, dim]`` float array from ``[n]``, ``[n, dim]`` or ``[R, n, dim]`` input."""
    a = np.asarray(x, dtype=float)
    if a.ndim == 1:
        a = a[None, :, None]
    elif a.ndim == 2:
        a = a[None]
    if a.ndim != 3:
        raise ValueError(f"{name} must have shape [R, n, dim], [n, dim] or [n], got {a.shape}")
    return a


def _plain(a) -> list:
    """JSON-ready list of floats with NaN / inf as ``None``."""
    return [float(v) if math.isfinite(v) else None for v in np.asarray(a, dtype=float).ravel()]


def _finite(values) -> np.ndarray:
    """Float array of the given values with ``None`` mapped to NaN."""
    if values is None:
        return np.array([], dtype=float)
    flat = np.ravel(np.asarray(values, dtype=object))
    return np.array([np.nan if v is None else v for v in flat], dtype=float)


@contextmanager
def _quiet():
    """Silence numpy floating-point warnings and Python warnings inside the block."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        yield


def _slots(idx: np.ndarray, limit: int = 4) -> str:
    s = ", ".join(str(int(i)) for i in idx[:limit])
    return s + (", ..." if len(idx) > limit else "")


# --------------------------------------------------------------------------- slot-0 summary

def slot0_diagnostics(samples) -> dict:
    """Per-coordinate summary of slot-0 draws ``[R, n, dim]`` (or ``[n, dim]`` / ``[n]``: one
    system): JSON-ready ``n_systems``, ``n_draws`` and lists ``mean``, ``sd`` (pooled,
    ``ddof=1``), ``ess_bulk``, ``ess_tail``, ``r_hat`` (rank-normalized split, Vehtari et al.
    2021, via :mod:`nrpt.diagnostics.ess`; ``None`` where undefined).  One system: split R-hat
    of its two halves."""
    x = _as_3d(samples, "samples")
    R, n, dim = x.shape
    with _quiet():
        flat = x.reshape(R * n, dim)
        mean = np.mean(flat, axis=0) if R * n else np.full(dim, np.nan)
        sd = np.std(flat, axis=0, ddof=1) if R * n >= 2 else np.full(dim, np.nan)
    from nrpt.diagnostics import ess  # (a function-level import: this module needs only numpy)

    out = {"n_systems": int(R), "n_draws": int(n), "mean": _plain(mean), "sd": _plain(sd)}
    with _quiet():
        out["ess_bulk"] = _plain(np.array([ess.ess_bulk(x[:, :, j]) for j in range(dim)]))
        out["ess_tail"] = _plain(np.array([ess.ess_tail(x[:, :, j]) for j in range(dim)]))
        if R >= 2:
            r_hat = np.array([ess.rhat(x[:, :, j]) for j in range(dim)])
        elif n >= 8:  # one system: its halves as two chains (each >= 4 draws)
            h = n // 2
            r_hat = np.array([ess.rhat(np.stack([x[0, :h, j], x[0, n - h:, j]]))
                              for j in range(dim)])
        else:
            r_hat = np.full(dim, np.nan)
        out["r_hat"] = _plain(r_hat)
    return out


# --------------------------------------------------------------------------- checks

def _check_sg_ladder(ladder, pair_rate, target: float | None, gap_min: float,
                     tolerance: float) -> list[Finding]:
    """``ladder-collapse`` and ``swap-rate-off-target`` of a learning-rate ladder ``[R, P]``
    and its per-pair indicator rates ``[R, P-1]``."""
    out: list[Finding] = []
    if ladder is not None:
        lr = _as_2d(ladder, "learning_rates")
        R = lr.shape[0]
        with _quiet():
            rel = np.diff(lr, axis=1) / np.abs(lr[:, 1:])
        bad = np.isfinite(rel) & (rel < gap_min)
        if bad.any():
            r, p = np.unravel_index(int(np.nanargmin(np.where(bad, rel, np.nan))), rel.shape)
            where = f" in system {r}" if R > 1 else ""
            n_bad = int(bad.sum())
            more = f" ({n_bad} adjacent pairs of rungs in all)" if n_bad > 1 else ""
            out.append(Finding(
                "ladder-collapse",
                f"The learning-rate ladder has collapsed{where}: slots {p} and {p + 1} sit at "
                f"{lr[r, p]:.6g} and {lr[r, p + 1]:.6g}, {100 * rel[r, p]:.2g} % apart "
                f"(below {100 * gap_min:g} %){more}, so the two rungs run the same dynamics and "
                "a slot is wasted; the adaptation (Deng et al. Eq. 11/12 as written) is stuck "
                "there.", KNOB_SG_LADDER))
    if pair_rate is not None and target is not None:
        a = _as_2d(pair_rate, "pair_rate")
        R = a.shape[0]
        with _quiet():
            off = np.abs(a - float(target))
        bad = np.isfinite(off) & (off > tolerance)
        if bad.any():
            r, p = np.unravel_index(int(np.nanargmax(np.where(bad, off, np.nan))), off.shape)
            pairs = np.flatnonzero(bad.any(axis=0))
            where = f" in system {r}" if R > 1 else ""
            more = f"; so are pairs {_slots(pairs)}" if len(pairs) > 1 else ""
            out.append(Finding(
                "swap-rate-off-target",
                f"The swap-indicator rate of pair {p} (slots {p} and {p + 1}) is "
                f"{a[r, p]:.2f}{where} against the adaptation's target S = {float(target):g} "
                f"(off by more than {tolerance:g}{more}), so the learning-rate ladder was not "
                "equalized: replicas cross that pair faster or slower than the rest.",
                KNOB_SG_LADDER))
    return out


def _check_pairs(acc: np.ndarray, floor: float) -> list[Finding]:
    with _quiet():
        low = np.isfinite(acc) & (acc < floor)
    if not low.any():
        return []
    R = acc.shape[0]
    pairs = np.flatnonzero(low.any(axis=0))
    with _quiet():
        worst_by_pair = np.nanmin(np.where(low, acc, np.nan), axis=0)
    p = int(pairs[np.argmin(worst_by_pair[pairs])])
    n_sys = int(low[:, p].sum())
    where = f" in {n_sys} of {R} systems" if R > 1 else ""
    if len(pairs) == 1:
        msg = (f"Swap acceptance between slots {p} and {p + 1} is as low as "
               f"{_fmt(worst_by_pair[p])} (below {_fmt(floor)}{where}), so replicas hardly "
               f"cross this pair and the ladder is too coarse there.")
    else:
        msg = (f"Swap acceptance is below {_fmt(floor)} for {len(pairs)} of {acc.shape[1]} "
               f"adjacent pairs (lower slots {_slots(pairs)}; worst {_fmt(worst_by_pair[p])} "
               f"between slots {p} and {p + 1}), so replicas hardly cross them and the ladder "
               f"is too coarse there.")
    return [Finding("pair-acceptance", msg, KNOB_LADDER)]


def _check_chains(acc: np.ndarray, n_chains: int | None, grown: str | None) -> list[Finding]:
    """``too-few-chains``: the barrier estimate ``Lambda-hat = sum_p (1 - a_p)`` (per system; a
    never-attempted pair counts at the mean of the others) asks for clearly more than the
    ladder's ``P`` chains, ``2 Lambda-hat >`` :data:`SHORT_LADDER` ``P`` (Syed et al. 2021:
    about ``2 Lambda`` chains, ``ceil(2 Lambda-hat)`` recommended).
    With pairs rejecting near 1 the estimate saturates at ``P - 1`` and is only a lower bound,
    so the advice is "at least".  ``grown``: what ``chains = "auto"`` did (it hit its cap)."""
    P = int(n_chains) if n_chains else acc.shape[1] + 1
    lam = []
    for row in acc:
        a = row[np.isfinite(row)]
        if a.size == 0:
            continue
        r = np.clip(1.0 - a, 0.0, 1.0)
        lam.append(float(r.mean()) * row.size)
    if not lam:
        return []
    worst = max(lam)
    need = max(2, math.ceil(2.0 * worst))  # (nrpt.adapt.chains.recommended_chains)
    if not 2.0 * worst > SHORT_LADDER * P:  # (nrpt.adapt.chains.ladder_too_short)
        return []
    saturated = worst >= 0.8 * (P - 1)
    at_least = "at least " if saturated else ""
    why = (f"the barrier estimate Λ̂ = {_fmt(worst)} is close to its maximum P - 1 = {P - 1}, "
           f"so it is only a lower bound: " if saturated else f"Λ̂ = {_fmt(worst)}: ")
    what = f" ({grown})" if grown else ""
    if grown and "cap" in grown:
        fix = f"raise max_chains to {need} or more"
    elif grown:
        fix = f"run more rounds (the ladder grows between them) or chains = {need} or more"
    else:
        fix = f"run with chains = {need} or more, or chains = \"auto\" with rounds"
    msg = (f"Too few chains: {P} chains{what}, but {why}the ladder needs {at_least}about "
           f"2Λ̂ = {need} chains for replicas to cross it (Syed et al. 2021); {fix}.")
    return [Finding("too-few-chains", msg, KNOB_CHAINS)]


def _expected_restarts(acc_row: np.ndarray | None, n_chains: int | None,
                       n_iterations: float) -> float:
    """Restarts expected in one system over the run at the observed swap acceptance (Syed et
    al. 2021, Theorem 1), after the first ``P - 1`` iterations; perfect swaps when unknown."""
    if acc_row is not None:
        a = acc_row[np.isfinite(acc_row)]
        a = np.clip(a, 0.0, 1.0)
        if np.any(a <= 0.0):
            return 0.0
        tau = 1.0 / (2.0 + 2.0 * float(np.sum((1.0 - a) / a)))
    else:
        tau = 0.5
    lead = (n_chains - 1) if n_chains else 0
    return max(float(n_iterations) - lead, 0.0) * tau


def _check_restarts(restarts, acc: np.ndarray | None, n_iterations, n_chains) -> list[Finding]:
    r = np.asarray(restarts, dtype=float)
    if r.ndim == 2:  # per-replica counters [R, P]
        r = r.sum(axis=1)
    r = np.atleast_1d(r)
    if n_chains is None and acc is not None:
        n_chains = acc.shape[1] + 1
    R = r.size
    zero, expected = [], []
    for s in range(R):
        row = None
        if acc is not None:
            row = acc[s] if acc.shape[0] == R else acc[0]
        e = _expected_restarts(row, n_chains, n_iterations)
        if r[s] == 0 and e >= RESTARTS_EXPECTED_MIN:
            zero.append(s)
            expected.append(e)
    if not zero:
        return []
    basis = "the observed swap acceptance" if acc is not None else "perfect swaps"
    who = (f"{len(zero)} of {R} systems made" if R > 1 else "The run made")
    msg = (f"{who} no restart (no replica went from the reference down to the target) in "
           f"{int(n_iterations)} iterations, where {basis} predicts about "
           f"{_fmt(min(expected))}, so the target is explored without help from the hot end.")
    return [Finding("no-restarts", msg, KNOB_RESTARTS)]


def _check_explorer(acc: np.ndarray, target: float, name: str | None, band,
                    skip_last: bool) -> list[Finding]:
    lo_factor, hi_factor = float(band[0]), float(band[1])
    low_cut = target * lo_factor
    high_cut = 1.0 - (1.0 - target) / hi_factor
    a = acc.copy()
    if skip_last and a.shape[1] > 1:
        a[:, -1] = np.nan
    with _quiet():
        low = np.isfinite(a) & (a < low_cut)
        high = np.isfinite(a) & (a > high_cut)
    who = name or "the explorer"
    out = []
    for mask, side in ((low, "low"), (high, "high")):
        if not mask.any():
            continue
        slots = np.flatnonzero(mask.any(axis=0))
        with _quiet():
            per_slot = (np.nanmin if side == "low" else np.nanmax)(np.where(mask, a, np.nan),
                                                                   axis=0)
        k = int(slots[np.argmin(per_slot[slots])] if side == "low"
                else slots[np.argmax(per_slot[slots])])
        at = (f"at slot {k}" if len(slots) == 1
              else f"at {len(slots)} slots ({_slots(slots)}; worst slot {k})")
        if side == "low":
            msg = (f"The {who} acceptance is {_fmt(per_slot[k])} {at}, below {_fmt(low_cut)} "
                   f"for a target of {_fmt(target)}, so the sampler is nearly frozen there "
                   f"(step_size too large).")
        else:
            msg = (f"The {who} acceptance is {_fmt(per_slot[k])} {at}, above {_fmt(high_cut)} "
                   f"for a target of {_fmt(target)}, so its steps are too small to travel "
                   f"(step_size too small).")
        out.append(Finding("explorer-acceptance", msg, KNOB_STEP))
    return out


def _hot_summary(hot_states) -> tuple[np.ndarray, np.ndarray, int | None]:
    """``(mean [R, dim], sd [R, dim], n)`` from raw states or a ``{"mean", "sd"}`` mapping."""
    if isinstance(hot_states, Mapping):
        mean = _as_2d(hot_states["mean"], "hot_states['mean']")
        sd = _as_2d(hot_states["sd"], "hot_states['sd']")
        if mean.shape != sd.shape:
            raise ValueError(f"hot_states mean and sd shapes differ: {mean.shape} vs {sd.shape}")
        n = hot_states.get("n")
        return mean, sd, (int(n) if n is not None else None)
    x = _as_3d(hot_states, "hot_states")
    with _quiet():
        mean = np.mean(x, axis=1)
        sd = np.std(x, axis=1, ddof=1) if x.shape[1] >= 2 else np.full(mean.shape, np.nan)
    return mean, sd, x.shape[1]


def _check_hot(hot_states, reference_spread) -> list[Finding]:
    mean, sd, n = _hot_summary(hot_states)
    R, dim = mean.shape
    out = []
    ok = np.isfinite(sd)
    frozen = ok & (sd <= 0.0)
    if reference_spread is not None:
        ref = np.broadcast_to(np.asarray(reference_spread, dtype=float), (dim,))
        with _quiet():
            ratio = sd / ref[None, :]
        bad = ok & np.isfinite(ratio) & (ref[None, :] > 0) & (ratio < HOT_SPREAD_MIN)
        if bad.any():
            worst = float(np.min(np.where(bad, ratio, np.inf)))
            r, c = np.unravel_index(int(np.argmin(np.where(bad, ratio, np.inf))), bad.shape)
            out.append(Finding("hot-slot-stuck", (
                f"The hottest slot's spread is {_fmt(worst)} of the reference sd (coordinate "
                f"{c}{f', system {r}' if R > 1 else ''}; {int(bad.sum())} of {bad.size} "
                f"system-coordinates below {_fmt(HOT_SPREAD_MIN)}), so the hot chain does not "
                f"forget its start."), KNOB_HOT))
            frozen = frozen & ~bad
    if frozen.any():
        r, c = np.argwhere(frozen)[0]
        out.append(Finding("hot-slot-stuck", (
            f"The hottest slot never moved in {int(frozen.sum())} of {frozen.size} "
            f"system-coordinates (e.g. coordinate {c}{f', system {r}' if R > 1 else ''}), so "
            f"the hot chain does not forget its start."), KNOB_HOT))
    if R >= 2 and (n is None or n >= 2):
        with _quiet():
            within = np.sqrt(np.nanmean(sd**2, axis=0))
            between = np.std(mean, axis=0, ddof=1)
            ratio = between / within
        bad = np.isfinite(between) & (
            (within > 0) & (ratio > HOT_MEAN_DISAGREEMENT) | (within == 0) & (between > 0))
        if bad.any():
            score = np.where(bad, np.where(within > 0, ratio, np.inf), -np.inf)
            c = int(np.argmax(score))
            size = "infinitely many" if not np.isfinite(score[c]) else _fmt(float(score[c]))
            out.append(Finding("hot-slot-stuck", (
                f"The {R} systems' hottest-slot means differ by {size} within-system sds "
                f"(coordinate {c}; {int(bad.sum())} of {dim} coordinates above "
                f"{_fmt(HOT_MEAN_DISAGREEMENT)}), so each hot chain stays near its own "
                f"start."), KNOB_HOT))
    return out


def tail_deficit_p(acceptance, n, overall) -> np.ndarray:
    """How likely a tail's acceptance this low is where the tail accepts like the whole chain:
    ``P(S <= acceptance n)`` for ``S`` binomial(``n``, ``overall``), continued to a real count
    (the regularized incomplete beta) since the recorded acceptances are probabilities.  A sum
    of ``n`` independent acceptances in [0, 1] with mean ``overall`` varies at most as the
    binomial does, so this is the widest such tail; consecutive steps of a stuck chain are not
    independent, so it reads as a ranking of the evidence more than as an exact level.
    Elementwise over arrays; 1 where ``n`` is 0 or the acceptance is not below ``overall``."""
    from scipy import special

    a = np.asarray(acceptance, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    p0 = float(overall)
    k = np.where(np.isfinite(a), a, p0) * n
    ok = (n > 0) & (k < n * p0) & (0.0 < p0 < 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = special.betainc(np.where(ok, n - k, 1.0), np.where(ok, k + 1.0, 1.0), 1.0 - p0)
    return np.where(ok, out, 1.0)


def check_tails(stats: Mapping, ratio: float = TAIL_RATIO, min_draws: float = TAIL_MIN_DRAWS,
                min_entries: float = TAIL_MIN_ENTRIES,
                min_fraction: float = TAIL_MIN_FRACTION,
                max_p: float | None = None) -> list[Finding]:
    """``tail-acceptance`` from :meth:`nrpt.recorders.tails.TailAcceptance.stats` (the summary's
    check, and the switch of explorer ``mala-hmc``: :class:`nrpt.adapt.metric.MetricAdaptor`).
    ``max_p``: a tail also needs its deficit significant, :func:`tail_deficit_p` below it
    (None: the ratio alone, the summary's check)."""
    a0 = float(stats["acceptance"])
    if not (math.isfinite(a0) and a0 > 0):
        return []
    worst = None  # (tail acceptance / overall, coordinate, side, acceptance, count)
    n_bad = 0
    for side in ("hi", "lo"):
        a = np.asarray(stats[f"acceptance_{side}"], dtype=np.float64)
        n = np.asarray(stats[f"n_{side}"], dtype=np.float64)
        e = np.asarray(stats.get(f"entries_{side}", n), dtype=np.float64)
        bad = (np.isfinite(a) & (n >= min_draws) & (e >= min_entries)
               & (n >= min_fraction * float(stats["n"])) & (a < ratio * a0))
        if max_p is not None:
            bad &= tail_deficit_p(a, n, a0) < max_p
        n_bad += int(bad.sum())
        if bad.any():
            c = int(np.argmin(np.where(bad, a, np.inf)))
            cand = (float(a[c]) / a0, c, side, float(a[c]), float(n[c]), float(e[c]))
            worst = cand if worst is None or cand < worst else worst
    if worst is None:
        return []
    _, c, side, a, n, e = worst
    names = stats.get("names")
    label = f"coordinate {c}" + (f" ({names[c]})" if names and c < len(names) else "")
    total = float(stats["n"])
    where = "above" if side == "hi" else "below"
    sign = "+" if side == "hi" else "-"
    k = float(stats.get("k", 2.0))
    gauss = 100.0 * 0.5 * math.erfc(k / math.sqrt(2.0))
    return [Finding("tail-acceptance", (
        f"Slot-0 explorer acceptance falls from {a0:.3g} overall to {a:.3g} where {label} "
        f"is {where} its mean {sign} {k:g} sd ({_fmt(n)} of {_fmt(total)} draws in "
        f"{_fmt(e)} visits, "
        f"{100.0 * n / total:.2g} %; a Gaussian puts {gauss:.2g} % there; {n_bad} coordinate "
        f"tail(s) so affected): the step size, tuned on the bulk, cannot move in this tail (a "
        f"funnel or neck), so the chains enter it rarely and stick there, and the tail's "
        f"weight and {label}'s spread are unreliable (too small, or too large where a chain "
        f"stuck), even where R-hat and ESS look fine."), KNOB_TAIL)]


def _check_slot0(slot0, r_hat_max: float, ess_min_per_system: float) -> list[Finding]:
    diag = slot0 if isinstance(slot0, Mapping) else slot0_diagnostics(slot0)
    R = int(diag.get("n_systems", 1) or 1)
    out = []
    rh = _finite(diag.get("r_hat"))
    bad = np.isfinite(rh) & (rh > r_hat_max)
    if bad.any():
        c = int(np.argmax(np.where(bad, rh, -np.inf)))
        across = (f"across {R} systems" if R > 1 else "between the two halves of the run")
        out.append(Finding("r-hat", (
            f"Slot-0 R-hat is {rh[c]:.3f} {across} for coordinate {c} ({int(bad.sum())} of "
            f"{rh.size} coordinates above {r_hat_max:g}), so the samples disagree about the "
            f"target and its estimates are not yet trustworthy."), KNOB_MIXING))
    sd = _finite(diag.get("sd"))
    frozen = np.isfinite(sd) & (sd == 0.0)
    if frozen.any() and R * int(diag.get("n_draws", 0) or 0) >= 2:
        out.append(Finding("low-ess", (
            f"Slot-0 draws never change in {int(frozen.sum())} of {sd.size} coordinates "
            f"(e.g. coordinate {int(np.argmax(frozen))}), so the run holds one sample "
            f"there whatever its ESS estimate says."), KNOB_MIXING))
        return out
    need = ess_min_per_system * R
    parts = []
    for key, label in (("ess_bulk", "bulk"), ("ess_tail", "tail")):
        e = _finite(diag.get(key))
        low = np.isfinite(e) & (e < need)
        if low.any():
            c = int(np.argmin(np.where(low, e, np.inf)))
            parts.append((label, float(e[c]), c, int(low.sum()), e.size))
    if parts:
        label, val, c, cnt, size = min(parts, key=lambda t: t[1])
        both = " (bulk and tail)" if len(parts) == 2 else ""
        out.append(Finding("low-ess", (
            f"Slot-0 {label} ESS is {_fmt(val)} for coordinate {c}{both}, below "
            f"{_fmt(need)} ({_fmt(ess_min_per_system)} per system; {cnt} of {size} "
            f"coordinates), so means and quantiles carry large Monte-Carlo error."),
            KNOB_MIXING))
    return out


def check_run(*, swap_acceptance=None, restarts=None, n_iterations: int | None = None,
              explorer_acceptance=None, explorer_target: float | None = None,
              explorer_name: str | None = None, hot_states=None, reference_spread=None,
              slot0=None, exact: bool = True, pair_floor: float = PAIR_FLOOR,
              explorer_band: Sequence[float] = EXPLORER_BAND, n_chains: int | None = None,
              reference_exact: bool = False, r_hat_max: float = R_HAT_MAX,
              ess_min_per_system: float = ESS_MIN_PER_SYSTEM, learning_rates=None,
              pair_rate=None, swap_rate_target: float | None = None,
              rung_gap_min: float = RUNG_GAP_MIN,
              swap_rate_tolerance: float = SWAP_RATE_TOLERANCE,
              chains_grown: str | None = None, tail_acceptance=None,
              tail_ratio: float = TAIL_RATIO,
              tail_min_draws: float = TAIL_MIN_DRAWS,
              tail_min_entries: float = TAIL_MIN_ENTRIES,
              tail_min_fraction: float = TAIL_MIN_FRACTION) -> list[Finding]:
    """Health checks of one run; the findings (empty when nothing is wrong).  Every argument is
    optional; its check is skipped when it is ``None``.

    Args:
        swap_acceptance: ``[R, P-1]`` (or ``[P-1]``; NaN = never attempted): ``pair-acceptance``
            and the rates ``no-restarts`` predicts from.
        restarts, n_iterations: per system ``[R]`` (scalar: one system; ``[R, P]`` summed) and
            the iterations covered: ``no-restarts``.
        explorer_acceptance, explorer_target, explorer_name: ``[R, P]`` (or ``[P]``), the target
            (``None`` skips) and name: ``explorer-acceptance`` with ``explorer_band``.
        hot_states, reference_spread: hottest-slot states ``[R, n, dim]`` (or ``[n, dim]``, or a
            mapping with ``"mean"``, ``"sd"`` ``[R, dim]`` and optional ``"n"``) and the reference
            sd ``[dim]`` or scalar: ``hot-slot-stuck``.
        slot0: draws ``[R, n, dim]`` or :func:`slot0_diagnostics`'s dict: ``r-hat``, ``low-ess``
            with ``r_hat_max``, ``ess_min_per_system``.
        exact: ``False`` (SG runs) skips ``explorer-acceptance``.
        n_chains: ``P`` when ``swap_acceptance`` is not given.
        reference_exact: the hottest slot is an exact reference draw: its explorer is skipped.
        learning_rates: SG ladder ``[R, P]`` (or ``[P]``): ``ladder-collapse`` with
            ``rung_gap_min``.
        pair_rate, swap_rate_target: ``[R, P-1]`` and ``S``: ``swap-rate-off-target`` with
            ``swap_rate_tolerance``.
        chains_grown: what ``chains = "auto"`` did, for the ``too-few-chains`` finding (from
            ``swap_acceptance``: ``2 Lambda-hat > 1.25 P``).
        tail_acceptance: :meth:`nrpt.recorders.tails.TailAcceptance.stats` (skipped with
            ``exact = False``): ``tail-acceptance`` with ``tail_ratio``, ``tail_min_draws``,
            ``tail_min_entries``, ``tail_min_fraction``."""
    findings: list[Finding] = []
    acc = None
    if swap_acceptance is not None:
        acc = _as_2d(swap_acceptance, "swap_acceptance")
        findings += _check_pairs(acc, float(pair_floor))
        findings += _check_chains(acc, n_chains, chains_grown)
    if restarts is not None and n_iterations is not None:
        findings += _check_restarts(restarts, acc, n_iterations, n_chains)
    if (exact and explorer_acceptance is not None and explorer_target is not None):
        target = float(explorer_target)
        if not 0.0 < target < 1.0:
            raise ValueError(f"explorer_target must be in (0, 1), got {explorer_target!r}")
        ea = _as_2d(explorer_acceptance, "explorer_acceptance")
        findings += _check_explorer(ea, target, explorer_name, explorer_band, reference_exact)
    if exact and tail_acceptance is not None:
        findings += check_tails(tail_acceptance, float(tail_ratio), float(tail_min_draws),
                                float(tail_min_entries), float(tail_min_fraction))
    if hot_states is not None:
        findings += _check_hot(hot_states, reference_spread)
    if slot0 is not None:
        findings += _check_slot0(slot0, float(r_hat_max), float(ess_min_per_system))
    if learning_rates is not None or pair_rate is not None:
        findings += _check_sg_ladder(learning_rates, pair_rate, swap_rate_target,
                                     float(rung_gap_min), float(swap_rate_tolerance))
    return findings


# --------------------------------------------------------------------------- output

def format_findings(findings: Sequence[Finding]) -> list[str]:
    """One printable line per finding: ``"[code] message (turn: knob)"``."""
    return [f"[{f.code}] {f.message} (turn: {f.knob})" for f in findings]


def emit(findings: Sequence[Finding], stacklevel: int = 2) -> None:
    """Raise each finding as a :class:`SamplingWarning` ``"message (turn: knob)"``, at
    ``stacklevel`` (2: the line calling ``emit``; one more per frame in between)."""
    for f in findings:
        warnings.warn(f"{f.message} (turn: {f.knob})", SamplingWarning, stacklevel=stacklevel)
