r"""Round-based adaptive non-reversible PT (Syed, Bouchard-Côté, Deligiannidis & Doucet 2021).

Sampling proceeds in rounds ``r = 1, 2, ..., N`` of ``2^r`` iterations each (``2^(N+1) - 2`` in
all).  Each round runs the ordinary engine (:class:`nrpt.engine.PTEngine`: explore, refresh the
reference, swap) on a schedule that is fixed during the round; between rounds:

    rejection rates r_p of the round  -->  fitted cumulative barrier Lambda(b)  -->
    new schedule equally spaced in Lambda                       (:mod:`nrpt.adapt.schedule`)
    explorer acceptance of the round  -->  new step sizes (rwmh, mala, hmc)

Statistics used for adaptation come from the round just finished, and everything reported at
the end -- barrier, local barrier, ``log Z``, restart rates, samples -- comes from the *last*
round, whose schedule is the best one available (earlier rounds are adaptation).

Per round the driver keeps a row (iterations, restarts, round trips, ``Lambda-hat``, ``log Z``,
min / mean swap acceptance, time; printed with ``progress`` and written to ``rounds.csv``),
and the statistics behind it (:class:`RoundStats`).  ``log Z`` is the online stepping-stone
estimate of :mod:`nrpt.lognorm`; the Method I local barrier comes from
:mod:`nrpt.diagnostics.barrier`.

Run folder (``out``): ``config.toml``, ``summary.json``, ``rounds.csv``, ``rounds.json`` (all
per-round statistics), ``report.txt`` (the printed rows), ``samples.npy`` / ``energies.npy``
(slot-0 draws of the **last completed round**, ``[n, dim]`` or ``[R, n, dim]``),
``index.npy`` (the index process of **all** rounds, ``[K + 1, R, P]``), ``checkpoint.pt``
(written at every round boundary; :func:`nrpt.resume` continues from the last completed
round, bit for bit), and with ``figures`` the plots and ``posterior.nc`` of
:mod:`nrpt.report`.
"""

from __future__ import annotations

import copy
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import report
from .adapt.schedule import (
    fit_barrier,
    recommended_chains,
    restart_rate_curve,
    update_schedule,
)
from .adapt.step import ACCEPTANCE_ORDER, step_size_factor
from .api import _DTYPES, Result, _atomic_save, build_engine, format_summary, summarize
from .config import RunConfig
from .diagnostics import theory
from .diagnostics.barrier import SlotEnergyRecorder
from .engine import PTEngine
from .lognorm import SteppingStone
from .record import Recorder
from .rng import Stream, generator_for
from .target import TargetError, load_target

__all__ = ["RoundStats", "RoundsResult", "run_rounds", "run_config", "sample_adaptive",
           "build_round_engine", "DEFAULT_ACCEPTANCE", "round_lengths"]

#: explorer acceptance aimed at when adapting step sizes (``target_acceptance`` overrides)
DEFAULT_ACCEPTANCE = {"rwmh": 0.3, "mala": 0.574, "hmc": 0.65}
_CALLBACK_EVERY = 256
_SLICE_WIDTH = 2.5


def round_lengths(n_rounds: int) -> list[int]:
    """``[2, 4, ..., 2^N]``: round ``r`` (1-based) has ``2^r`` iterations."""
    return [2**r for r in range(1, int(n_rounds) + 1)]


# ------------------------------------------------------------------------------ statistics
@dataclass
class RoundStats:
    """What one round measured (per system: leading axis ``R``)."""

    round: int
    iterations: int
    first_iteration: int
    schedule: np.ndarray  # [R, P] coefficients b used during the round
    step_size: np.ndarray  # [R, P]
    rejection: np.ndarray  # [R, P-1] mean of 1 - min(1, alpha)
    explorer_acceptance: np.ndarray  # [R, P]
    restarts: np.ndarray  # [R] in this round
    round_trips: np.ndarray  # [R] in this round
    log_normalizer: np.ndarray  # [R]
    log_normalizer_forward: np.ndarray  # [R]
    log_normalizer_reverse: np.ndarray  # [R]
    log_normalizer_per_slot: np.ndarray  # [R, P]
    method_one: np.ndarray  # [R, P] Method I local barrier at the slots
    wall_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def barrier(self) -> np.ndarray:
        """``Lambda-hat = sum_p r_p`` per system ``[R]``."""
        return np.nansum(self.rejection, axis=1)

    def predicted_restart_rate(self) -> np.ndarray:
        """Finite-P DEO restart rate ``1 / (2 + 2 sum r/(1-r))`` per system."""
        return np.array([theory.predicted_restart_rate(np.clip(np.nan_to_num(r, nan=0.0), 0, 1))
                         for r in self.rejection])

    def row(self) -> dict[str, Any]:
        """The report row (means over systems)."""
        acc = 1.0 - self.rejection
        return {
            "round": self.round,
            "iterations": self.iterations,
            "restarts": float(np.mean(self.restarts)),
            "round_trips": float(np.mean(self.round_trips)),
            "barrier": float(np.mean(self.barrier)),
            "log_normalizer": float(np.mean(self.log_normalizer)),
            "min_swap_acceptance": float(np.mean(np.nanmin(acc, axis=1))),
            "mean_swap_acceptance": float(np.mean(np.nanmean(acc, axis=1))),
            "wall_s": self.wall_s,
        }

    def to_json(self) -> dict[str, Any]:
        out = {}
        for k, v in self.__dict__.items():
            out[k] = v.tolist() if isinstance(v, np.ndarray) else v
        return _nan_to_none_deep(out)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RoundStats:
        scalars = {"round": int, "iterations": int, "first_iteration": int, "wall_s": float}
        kw = {k: conv(data[k]) for k, conv in scalars.items()}
        kw["extra"] = dict(data.get("extra") or {})
        for k, v in data.items():
            if k not in kw:
                kw[k] = np.array(v, dtype=float)  # None (a NaN in JSON) becomes NaN
        return cls(**kw)


def _nan_to_none_deep(v):
    if isinstance(v, dict):
        return {k: _nan_to_none_deep(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_nan_to_none_deep(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


# ------------------------------------------------------------------------------ the driver
class SlotSpread:
    """Engine hook: running mean and variance (Welford) of the state at every slot over a
    round, ``[R, P, dim]``; its :meth:`scale` (mean over coordinates of the standard
    deviation, ``[R, P]``) sets the slice explorer's interval width between rounds."""

    def __init__(self, systems: int, slots: int, dim: int, dtype=torch.float64, device="cpu"):
        self.shape = (int(systems), int(slots), int(dim))
        self.dtype, self.device = dtype, device
        self.reset()

    def reset(self) -> None:
        self.n = 0
        self.mean = torch.zeros(self.shape, dtype=self.dtype, device=self.device)
        self.m2 = torch.zeros_like(self.mean)

    def after_iteration(self, engine, k, decisions) -> None:
        x = engine.state.x.gather(1, engine.replica_at[..., None].expand(self.shape))
        self.n += 1
        delta = x - self.mean
        self.mean = self.mean + delta / self.n
        self.m2 = self.m2 + delta * (x - self.mean)

    def scale(self) -> torch.Tensor:
        if self.n < 2:
            return torch.full(self.shape[:2], math.nan, dtype=self.dtype, device=self.device)
        return (self.m2 / (self.n - 1)).sqrt().mean(-1)


class RoundDriver:
    """Runs rounds on one engine and adapts it between rounds.

    Args:
        engine: the engine (its hooks list gets a :class:`~nrpt.lognorm.SteppingStone`, a
            :class:`~nrpt.diagnostics.barrier.SlotEnergyRecorder` and, for the slice explorer,
            a :class:`SlotSpread`).
        adapt_schedule: re-fit the schedule between rounds (per system).
        adapt_step_size: tune step sizes of rwmh / mala / hmc towards ``target_acceptance``
            (:func:`nrpt.adapt.step.step_size_factor`); for the slice explorer, set each slot's
            interval width to 2.5 times the mean standard deviation of the states seen at that
            slot (the mean width of a Gaussian slice).
        target_acceptance: defaults to :data:`DEFAULT_ACCEPTANCE` of the explorer.
        reference_normalized: whether the stepping-stone estimate is an absolute ``log Z``.
        thin: keep every ``thin``-th slot-0 draw of a round.
    """

    def __init__(self, engine: PTEngine, *, adapt_schedule: bool = True,
                 adapt_step_size: bool = True, target_acceptance: float | None = None,
                 reference_normalized: bool = True, thin: int = 1):
        self.engine = engine
        self.adapt_schedule = bool(adapt_schedule)
        name = getattr(engine.explorer, "name", "")
        self.explorer_name = name
        self.adapt_step_size = bool(adapt_step_size) and name in DEFAULT_ACCEPTANCE
        self.adapt_width = bool(adapt_step_size) and name == "slice"
        self.target_acceptance = (float(target_acceptance) if target_acceptance is not None
                                  else DEFAULT_ACCEPTANCE.get(name, 0.5))
        self.thin = int(thin)
        kw = {"dtype": engine.dtype, "device": engine.device}
        self.stone = SteppingStone(engine.R, engine.P, reference_normalized=reference_normalized,
                                   **kw)
        self.energies = SlotEnergyRecorder(engine.R, engine.P, **kw)
        engine.hooks.extend([self.stone, self.energies])
        self.spread = None
        if name == "slice":  # the slice width follows the spread of each slot's states
            self.spread = SlotSpread(engine.R, engine.P, engine.dim, **kw)
            engine.hooks.append(self.spread)

    def run_round(self, r: int, callback=None, on_step=None) -> tuple[RoundStats, Recorder]:
        """Run round ``r`` (``2^r`` iterations); returns its statistics and its recorder."""
        eng = self.engine
        n = 2**r
        eng.reset_statistics()
        self.stone.reset()
        self.energies.start(n)
        if self.spread is not None:
            self.spread.reset()
        restarts0 = eng.tracker.restarts.clone()
        trips0 = eng.tracker.round_trips.clone()
        first = eng.k
        schedule = eng.schedule.detach().cpu().numpy().copy()
        step = eng.step_size.detach().cpu().numpy().copy()
        rec = Recorder(n, eng.R, eng.P, eng.dim, thin=min(self.thin, n), out_dir=None,
                       dtype=np.float64 if eng.dtype == torch.float64 else np.float32)
        rec.initial(eng.slot_of)
        t0 = time.perf_counter()
        for i in range(n):
            eng.step()
            x0, v0 = eng.target_slot()
            rec.record(i, x0, v0, eng.slot_of)
            if on_step is not None:
                on_step()
            if callback is not None and (i + 1) % _CALLBACK_EVERY == 0:
                callback(eng)
        rec.flush()
        wall = time.perf_counter() - t0
        est = self.stone.estimate()
        np_ = lambda t: t.detach().cpu().double().numpy()  # noqa: E731
        stats = RoundStats(
            round=r, iterations=n, first_iteration=first, schedule=schedule, step_size=step,
            rejection=np_(eng.rejection_rates()), explorer_acceptance=np_(
                eng.explorer_acceptance()),
            restarts=np_(eng.tracker.restarts - restarts0),
            round_trips=np_(eng.tracker.round_trips - trips0),
            log_normalizer=np_(est["log_normalizer"]), log_normalizer_forward=np_(est["forward"]),
            log_normalizer_reverse=np_(est["reverse"]),
            log_normalizer_per_slot=np_(est["per_slot"]),
            method_one=self.energies.local_barrier(), wall_s=wall,
            extra={"nonfinite_terms": int(self.stone.forward.invalid.sum()
                                          + self.stone.reverse.invalid.sum()),
                   "reverse_valid": est["reverse_valid"].cpu().tolist()})
        if self.spread is not None:
            stats.extra["slot_scale"] = np_(self.spread.scale()).tolist()
        if callback is not None:
            callback(eng)
        return stats, rec

    def adapt(self, stats: RoundStats) -> None:
        """Set the next round's schedule and step sizes from ``stats``."""
        eng = self.engine
        if self.adapt_schedule:
            new = np.stack([update_schedule(stats.schedule[s], stats.rejection[s])
                            for s in range(eng.R)])
            eng.schedule = torch.as_tensor(new, dtype=eng.dtype, device=eng.device)
        if self.adapt_step_size:
            factor = step_size_factor(stats.explorer_acceptance, self.target_acceptance,
                                      ACCEPTANCE_ORDER[self.explorer_name])
            eng.step_size = eng.step_size * torch.as_tensor(factor, dtype=eng.dtype,
                                                            device=eng.device)
        if self.adapt_width and "slot_scale" in stats.extra:
            # slice width ~ the mean width of a Gaussian slice, 2 E[sqrt(2 Exp(1))] sd = 2.5 sd
            scale = torch.as_tensor(np.asarray(stats.extra["slot_scale"], dtype=float),
                                    dtype=eng.dtype, device=eng.device)
            ok = torch.isfinite(scale) & (scale > 0)
            eng.step_size = torch.where(ok, _SLICE_WIDTH * scale, eng.step_size)


def run_rounds(engine: PTEngine, n_rounds: int, *, adapt_schedule: bool = True,
               adapt_step_size: bool = True, target_acceptance: float | None = None,
               reference_normalized: bool = True) -> list[RoundStats]:
    """Run ``n_rounds`` rounds on ``engine`` in memory (no run folder) and return their
    statistics; the engine is left after the last round (its statistics are that round's).
    See :func:`sample_adaptive` / ``nrpt.sample(..., rounds=N)`` for the full run."""
    driver = RoundDriver(engine, adapt_schedule=adapt_schedule, adapt_step_size=adapt_step_size,
                         target_acceptance=target_acceptance,
                         reference_normalized=reference_normalized)
    out = []
    for r in range(1, int(n_rounds) + 1):
        stats, _ = driver.run_round(r)
        out.append(stats)
        if r < n_rounds:
            driver.adapt(stats)
    return out


# ------------------------------------------------------------------------------ building
def _reference_check(target, path, density, R: int, P: int, seed: int, dtype, device):
    """Initial states and the share of reference draws where the target vanishes.

    On a geometric path the chains start at reference draws.  Where the log-likelihood is
    ``-inf`` (or NaN) the engine would refuse to start, so such draws are replaced by other
    (finite) ones; the share is reported.  All draws bad is an error with a clear message.
    """
    if not path.has_reference:
        return None, 0.0
    g = generator_for(seed, Stream.INIT, 0x5EF)
    probe = torch.as_tensor(target.reference_sample(512, g)).to(device, dtype)
    v, base = density(probe)
    probe_ok = torch.isfinite(v) & torch.isfinite(base)
    share = float((~probe_ok).double().mean())
    if hasattr(target, "initial_states") or share == 0.0:
        return None, share
    if share == 1.0:
        raise TargetError(
            "the target's log-likelihood is -inf (or NaN) at all 512 reference draws tried: "
            "the target must be positive on a part of the reference's support that has "
            "noticeable reference mass (choose a reference that covers the target)")
    g = generator_for(seed, Stream.INIT)
    x = torch.as_tensor(target.reference_sample(R * P, g)).to(device, dtype)
    v, base = density(x)
    ok = torch.isfinite(v) & torch.isfinite(base)
    good = torch.cat([x[ok], probe[probe_ok]])
    x = torch.where(ok[:, None], x, good[torch.arange(R * P, device=device) % good.shape[0]])
    return x.reshape(R, P, -1), share


def build_round_engine(cfg: RunConfig, target=None, rule=None) -> tuple[PTEngine, dict]:
    """The engine of an adaptive run and facts about its target (``reference_normalized``,
    ``zero_likelihood_share``)."""
    if target is None:
        target = load_target(cfg.target, **cfg.target_options)
    facts: dict = {}

    def checked_start(target, path):
        from .explorers import Density

        x0, facts["zero_likelihood_share"] = _reference_check(
            target, path, Density(target, path), cfg.systems, cfg.chains, cfg.seed,
            _DTYPES[cfg.dtype], torch.device(cfg.device))
        return x0

    engine = build_engine(cfg, target=target, rule=rule, initial_states=checked_start)
    facts["reference_normalized"] = engine.path.kind == "geometric" and bool(
        getattr(engine.target, "reference_is_normalized", False))
    return engine, facts


def _normalizer_note(path_kind: str, normalized: bool) -> tuple[str, str | None]:
    if path_kind == "temperature":
        return "ratio", ("temperature ladder: only the ratio log(Z(tau=1) / Z(tau_max)) is "
                         "estimated, not log Z (use a geometric path with a normalized "
                         "reference for log Z)")
    if not normalized:
        return "ratio", ("the reference is not declared normalized (reference_is_normalized): "
                         "only the ratio log(Z_target / Z_reference) is estimated")
    return "log Z", None


# ------------------------------------------------------------------------------ summary
class RoundsResult(Result):
    """:class:`nrpt.api.Result` of an adaptive run: ``samples`` / ``energies`` are the last
    round's; ``index`` covers all rounds; ``round_stats`` holds every :class:`RoundStats`."""

    def __str__(self) -> str:
        return format_rounds_summary(self.summary)


def _per_system(a, R: int):
    vals = np.asarray(a, dtype=float).tolist()
    return vals[0] if R == 1 else vals


def _schedule_values(b: np.ndarray, kind: str) -> list:
    b = np.asarray(b, dtype=float)
    return (1.0 / b).tolist() if kind == "temperature" else b.tolist()


def rounds_summary(engine: PTEngine, cfg: RunConfig, stats: list[RoundStats], wall: float,
                   facts: dict, interrupted: bool, planned: int) -> dict[str, Any]:
    """``summary.json`` of an adaptive run: :func:`nrpt.api.summarize` (whose statistics are
    the last round's) plus the adaptive quantities."""
    R = engine.R
    kind = engine.path.kind
    window = cfg.window if cfg.window != "auto" else 1
    s = summarize(engine, cfg, wall, window, interrupted)
    s["rounds"] = len(stats)
    s["rounds_planned"] = planned
    norm_kind, note = _normalizer_note(kind, facts["reference_normalized"])
    if facts.get("zero_likelihood_share", 0.0) > 0:
        s["reference_zero_likelihood_share"] = facts["zero_likelihood_share"]
    s["log_normalizer_kind"] = norm_kind
    s["log_normalizer_note"] = note
    if not stats:
        s["statistics_from"] = "no completed round"
        return _nan_to_none_deep(s)
    last = stats[-1]
    end = last.first_iteration + last.iterations
    s["statistics_from"] = (f"last round (round {last.round}: iterations "
                            f"{last.first_iteration}..{end - 1}, {last.iterations} iterations)")
    s["schedule"] = _schedule_values(last.schedule[0], kind)
    s["schedule_per_round"] = [
        _schedule_values(st.schedule[0], kind) if R == 1 else
        [_schedule_values(b, kind) for b in st.schedule] for st in stats]
    s["swap_acceptance"] = _per_system(1.0 - last.rejection, R)
    s["barrier"] = _per_system(last.barrier, R)
    s["explorer_acceptance"] = _per_system(last.explorer_acceptance, R)
    s["step_size"] = _per_system(last.step_size, R)
    s["log_normalizer"] = _per_system(last.log_normalizer, R)
    s["log_normalizer_forward"] = _per_system(last.log_normalizer_forward, R)
    s["log_normalizer_reverse"] = _per_system(last.log_normalizer_reverse, R)
    s["log_normalizer_per_slot"] = _per_system(last.log_normalizer_per_slot, R)
    if not all(last.extra.get("reverse_valid", [True])):
        s["log_normalizer_note"] = ((s["log_normalizer_note"] + "; ") if s["log_normalizer_note"]
                                    else "") + (
            "the target is zero on part of the reference's support, where the reverse "
            "(1/Z) half cannot see the lost mass: log_normalizer is the forward half")
    fits = [fit_barrier(last.schedule[i], last.rejection[i]) for i in range(R)]
    grid = fits[0].grid(51)[0]
    coordinate = "1/temperature" if kind == "temperature" else "beta"
    s["local_barrier"] = {"coordinate": coordinate, "grid": grid.tolist(),
                          "values": _per_system([f.local(grid) for f in fits], R)}
    s["local_barrier_method_i"] = {"coordinate": coordinate,
                                   "at": _per_system(last.schedule, R),
                                   "values": _per_system(last.method_one, R)}
    n = last.iterations
    s["restart_rate"] = _per_system(last.restarts / n, R)
    s["predicted_restart_rate"] = _per_system(last.predicted_restart_rate(), R)
    lam = np.clip(last.barrier, 0.0, None)
    s["asymptotic_restart_rate"] = _per_system([theory.asymptotic_restart_rate(x) for x in lam],
                                               R)
    s["recommended_chains"] = (recommended_chains(lam[0]) if R == 1 else
                               [recommended_chains(x) for x in lam])
    chains = np.unique(np.round(np.geomspace(2, max(8.0, 4.0 * float(lam.mean()) + 2), 12)))
    s["restart_rate_curve"] = {"chains": chains.astype(int).tolist(),
                               "predicted_restart_rate":
                                   restart_rate_curve(float(lam.mean()), chains).tolist()}
    s["adapted_schedule"] = _schedule_values(
        update_schedule(last.schedule[0], last.rejection[0]), kind)
    s["round_rows"] = [st.row() for st in stats]
    return _nan_to_none_deep(s)


def _fmt(v, spec=".3g") -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x, spec) for x in v) + "]"
    if isinstance(v, float):
        return format(v, spec)
    return "n/a" if v is None else str(v)


def format_rounds_summary(s: dict[str, Any]) -> str:
    lines = [format_summary(s)]
    lines.append(f"  adaptive        {s.get('rounds', 0)} of {s.get('rounds_planned')} rounds; "
                 f"statistics from the {s.get('statistics_from')}")
    if "log_normalizer" in s:
        label = "log Z" if s["log_normalizer_kind"] == "log Z" else "log Z ratio"
        lines.append(f"  {label:<15} {_fmt(s['log_normalizer'], '.4g')}  (forward "
                     f"{_fmt(s['log_normalizer_forward'], '.4g')}, reverse "
                     f"{_fmt(s['log_normalizer_reverse'], '.4g')})")
        lines.append(f"  restart rate    observed {_fmt(s['restart_rate'])} per iteration, "
                     f"finite-P theory {_fmt(s['predicted_restart_rate'])}, "
                     f"1/(2+2Λ̂) = {_fmt(s['asymptotic_restart_rate'])}")
        lines.append(f"  chains          Λ̂ = {_fmt(s['barrier'])}: about 2Λ̂ = "
                     f"{_fmt(s['recommended_chains'])} chains recommended (P = {s['chains']})")
    if s.get("log_normalizer_note"):
        lines.append(f"  note: {s['log_normalizer_note']}")
    if s.get("reference_zero_likelihood_share"):
        share = 100 * s["reference_zero_likelihood_share"]
        lines.append(f"  note: the target is zero on {share:.1f}% of reference draws (those swaps "
                     "are rejected; log Z accounts for them)")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ run folder
def _atomic_json(obj, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def _atomic_npy(arr: np.ndarray, path: Path) -> None:
    tmp = path.with_name(path.stem + ".tmp.npy")
    np.save(tmp, arr)
    os.replace(tmp, path)


def run_config(cfg: RunConfig, *, target=None, rule=None, progress: bool = False,
               resume_from: Path | None = None, callback=None) -> RoundsResult:
    """Run (or resume) the adaptive run ``cfg`` describes (``cfg.rounds`` is set); the branch
    of :func:`nrpt.api._run` for rounds."""
    if cfg.rounds is None:
        raise ValueError("run_config needs cfg.rounds (the number of rounds)")
    engine, facts = build_round_engine(cfg, target, rule)
    driver = RoundDriver(engine, adapt_schedule=cfg.adapt_schedule,
                         adapt_step_size=cfg.adapt_step_size,
                         target_acceptance=cfg.target_acceptance,
                         reference_normalized=facts["reference_normalized"], thin=cfg.thin)
    N = cfg.rounds
    K = sum(round_lengths(N))
    R, P = engine.R, engine.P
    out = Path(cfg.out) if cfg.out else None
    stats: list[RoundStats] = []
    elapsed = 0.0
    draws: dict[str, np.ndarray] = {}
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        if resume_from is None:
            cfg.write_toml(out / "config.toml")
    if resume_from is not None:
        ck = torch.load(Path(resume_from) / "checkpoint.pt", weights_only=False)
        engine.load_state_dict(ck["engine"])
        stats = [RoundStats.from_json(d) for d in ck["rounds"]]
        elapsed = float(ck["wall_time_s"])
        for name in ("samples", "energies"):
            f = Path(resume_from) / f"{name}.npy"
            if f.exists():
                draws[name] = np.load(f)
    if out is not None:
        mode = "r+" if resume_from is not None and (out / "index.npy").exists() else "w+"
        index = np.lib.format.open_memmap(out / "index.npy", mode=mode, dtype=np.int16,
                                          shape=(K + 1, R, P))
    else:
        index = np.zeros((K + 1, R, P), dtype=np.int16)
    if resume_from is None:
        index[0] = engine.slot_of.cpu().numpy()
    boundary = copy.deepcopy(engine.state_dict())
    say = print if progress else (lambda *a, **k: None)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=K, initial=engine.k, unit="it", dynamic_ncols=True, leave=False,
                   desc="nrpt rounds")
        say = bar.write
    lines = [report.ROW_HEADER]
    if not stats:
        say(report.ROW_HEADER)
    lines.extend(report.format_row(st.row()) for st in stats)
    interrupted = False
    t0 = time.perf_counter()
    tick = (lambda: bar.update(1)) if bar is not None else None
    try:
        for r in range(len(stats) + 1, N + 1):
            st, rec = driver.run_round(r, callback=callback, on_step=tick)
            stats.append(st)
            index[st.first_iteration + 1:st.first_iteration + st.iterations + 1] = rec.index[1:]
            draws = {"samples": np.asarray(rec.samples), "energies": np.asarray(rec.energies)}
            line = report.format_row(st.row())
            lines.append(line)
            say(line)
            if r < N:
                driver.adapt(st)
            boundary = copy.deepcopy(engine.state_dict())
            if out is not None:
                if isinstance(index, np.memmap):
                    index.flush()
                for name, arr in draws.items():
                    _atomic_npy(arr, out / f"{name}.npy")
                _atomic_save({"engine": boundary, "rounds": [x.to_json() for x in stats],
                               "wall_time_s": elapsed + time.perf_counter() - t0},
                              out / "checkpoint.pt")
    except KeyboardInterrupt:
        interrupted = True
        engine.load_state_dict(boundary)  # back to the last round boundary
    finally:
        if bar is not None:
            bar.close()
    wall = elapsed + time.perf_counter() - t0
    summary = rounds_summary(engine, cfg, stats, wall, facts, interrupted, N)
    if not draws:
        shape = (0, engine.dim) if R == 1 else (R, 0, engine.dim)
        draws = {"samples": np.zeros(shape), "energies": np.zeros(shape[:-1])}
    k_done = engine.k
    if out is not None:
        if isinstance(index, np.memmap):
            index.flush()
        for name, arr in draws.items():
            _atomic_npy(arr, out / f"{name}.npy")
        (out / "report.txt").write_text("\n".join(lines) + "\n")
        report.write_round_table([st.row() for st in stats], out / "rounds.csv")
        _atomic_json([st.to_json() for st in stats], out / "rounds.json")
        if cfg.figures and stats:
            summary["figures"] = report.write_figures(
                out, index=np.asarray(index[:k_done + 1]), stats=stats, summary=summary,
                target=engine.target)
            try:  # an optional extra (arviz + a netCDF engine): never fail the run here
                summary["inference_data"] = report.export_inference_data(
                    out / "posterior.nc", samples=draws["samples"], energies=draws["energies"],
                    stats=stats[-1], summary=summary)
            except (ImportError, ValueError, OSError) as err:
                summary["inference_data"] = None
                summary["inference_data_error"] = f"{type(err).__name__}: {err}"
        _atomic_json(summary, out / "summary.json")
    res = RoundsResult(samples=draws["samples"], energies=draws["energies"],
                       index=np.array(index[:k_done + 1]), summary=summary, config=cfg, out=out,
                       engine=engine)
    res.round_stats = stats
    return res


def sample_adaptive(target="geometric-gaussian-path", *, rounds: int = 10,
                    progress: bool = False, rule=None, **options) -> RoundsResult:
    """Adaptive NRPT in ``rounds`` rounds of doubling length (Syed et al. 2021).

    Same options as :func:`nrpt.sample` (fields of :class:`~nrpt.config.RunConfig`); the
    explorer defaults to the slice sampler here.  Example::

        res = nrpt.rounds.sample_adaptive("geometric-mixture-model", rounds=10, chains=12)
        res.log_normalizer, res.barrier, res.local_barrier, res.schedule_per_round
    """
    from .api import sample

    options.setdefault("explorer", "slice")
    return sample(target, progress=progress, rule=rule, rounds=rounds, **options)

