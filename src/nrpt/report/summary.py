"""One summary for every kind of run (``summary.json`` and the printed report): the recorders'
reductions since the last reset (``statistics_from``), the run's facts, the theory's
predictions beside what they predict, adaptive and SG quantities, slot-0 diagnostics and the
health findings (:mod:`nrpt.report.health`, also emitted as warnings)."""

from __future__ import annotations

import math
import shlex
import warnings
from typing import Any

import numpy as np
import torch

from nrpt.adapt.chains import recommended_chains, recommended_chains_noisy, restart_rate_curve
from nrpt.adapt.rounds import StepSizeAdaptor
from nrpt.adapt.schedule import fit_barrier, update_schedule
from nrpt.core.loop import Outcome, Run
from nrpt.diagnostics import theory
from nrpt.diagnostics.density import grid_errors, iid_floor
from nrpt.recorders.log_z import pooled_log_z
from nrpt.recorders.stats import json_ready, per_system
from nrpt.report import health
from nrpt.roles import RowMap
from nrpt.targets.protocol import capabilities

__all__ = ["build_summary", "format_summary", "exact_moments", "density_error"]


def _schedule_values(b, kind: str) -> list:
    """A schedule row ``b`` as reported: temperatures ``1 / b`` for ``kind == "temperature"``,
    else ``b`` itself (betas), as a list of floats."""
    b = np.asarray(b, dtype=float)
    return (1.0 / b).tolist() if kind == "temperature" else b.tolist()


def _moments_fit(mean: np.ndarray, sd: np.ndarray, dim: int | None) -> bool:
    """Whether ``mean`` and ``sd`` are finite, of one shape, and of size ``dim`` (if given)."""
    return bool(mean.shape == sd.shape and (dim is None or mean.size == dim)
                and np.isfinite(mean).all() and np.isfinite(sd).all())


def exact_moments(target, dim: int | None = None) -> dict[str, list] | None:
    """The target's exact mean and marginal sd per coordinate: ``target.exact_moments()`` (dict
    with ``"mean"``, ``"sd"``) if it has one, else its ``mean`` ``[dim]`` and ``cov`` ``[dim,
    dim]``; None when unknown or not of the state's shape.  Raises ``ValueError`` when
    ``exact_moments()`` fails or returns other than finite ``mean`` and ``sd`` of the state's
    size."""
    if capabilities(target).has("exact_moments"):
        return _own_moments(target, dim)
    return _carried_moments(target, dim)


def _own_moments(target, dim: int | None) -> dict[str, list] | None:
    """``target.exact_moments()`` checked; ``ValueError`` naming it when it fails or misfits."""
    try:
        m = target.exact_moments()
        if m is None:
            return None
        mean = np.asarray(m["mean"], dtype=float).reshape(-1)
        sd = np.asarray(m["sd"], dtype=float).reshape(-1)
    except Exception as err:  # noqa: BLE001 -- re-raised with the method named
        raise ValueError(f"the target's exact_moments() failed: {type(err).__name__}: "
                         f"{err} (it must return {{'mean': [dim], 'sd': [dim]}} or None)"
                         ) from err
    if not _moments_fit(mean, sd, dim):
        raise ValueError(f"the target's exact_moments() gave mean of shape {mean.shape} and "
                         f"sd of shape {sd.shape}: both must be finite, of the state's size "
                         f"({dim})")
    return {"mean": mean.tolist(), "sd": sd.tolist()}


def _carried_moments(target, dim: int | None) -> dict[str, list] | None:
    """The moments from the ``mean`` / ``cov`` values a target carries (read here only: they
    may be expensive properties, see :data:`nrpt.targets.protocol.OPTIONAL_MEMBERS`); None
    where absent, callable or not of the state's shape."""
    mean, cov = getattr(target, "mean", None), getattr(target, "cov", None)
    if mean is None or cov is None or callable(mean) or callable(cov):
        return None
    try:  # (attributes of these names may mean something else on a user's target)
        mean = np.asarray(torch.as_tensor(mean).detach().cpu().double(), dtype=float)
        cov = np.asarray(torch.as_tensor(cov).detach().cpu().double(), dtype=float)
    except (TypeError, ValueError, RuntimeError):
        return None
    if cov.ndim != 2 or cov.shape != (mean.size, mean.size):
        return None
    sd = np.sqrt(np.clip(np.diag(cov), 0.0, None)).reshape(-1)
    mean = mean.reshape(-1)
    return {"mean": mean.tolist(), "sd": sd.tolist()} if _moments_fit(mean, sd, dim) else None


def density_error(target, samples) -> dict[str, Any] | None:
    """Total variation between the histogram of the slot-0 draws (all systems pooled) and the
    exact cell probabilities of a 2-D target with ``density_grid()``, beside the TV that as
    many exact iid draws give (:func:`nrpt.diagnostics.density.iid_floor`: the finite-sample
    floor a perfect sampler would show).  None for targets without an exact grid or samples
    that are not 2-D.  Errors of the target's ``density_grid`` propagate (no silent floor)."""
    x = np.asarray(samples, dtype=float)
    if not capabilities(target).has("density_grid") or x.ndim not in (2, 3) \
            or x.shape[-1] != 2:
        return None
    x = x.reshape(-1, 2)
    if x.shape[0] == 0:
        return None
    grid = target.density_grid()
    if len(grid) != 3:
        return None
    xs, ys, probs = grid
    err = grid_errors(x, xs, ys, probs)
    floor = iid_floor(x.shape[0], xs, ys, probs)
    return {"tv": err["tv"], "tv_iid_floor": floor["tv"], "kl": err["kl"],
            "kl_iid_floor": floor["kl"], "n": int(x.shape[0]), "cells": int(np.size(probs))}


def _approximation_note(cfg, facts, s: dict) -> str | None:
    """For stochastic-gradient runs: what the method approximates and, where the exact answer
    is known, by how much (the measured errors of this run)."""
    if not facts.get("sg"):
        return None
    rule = facts.get("rule")
    swap = {"deterministic": "the deterministic swap rule (a fixed-threshold test of noisy "
                             "energies with the correction C)",
            "bias-corrected": "the bias-corrected swap rule of noisy energies"}.get(
        rule, f"the {rule} swap rule")
    method = facts.get("method") or f"stochastic-gradient PT ({cfg.explorer})"
    text = (f"{method} is approximate: {cfg.explorer} exploration (no Metropolis correction) with "
            f"{swap} samples an approximation of the target, not the target itself "
            "(Deng et al. 2023)")
    parts = []
    ex, slot0 = s.get("exact_moments"), s.get("slot0") or {}
    if ex and slot0.get("sd") is not None:
        parts.append(f"sd {_fmt(slot0['sd'], '.3g')} vs exact {_fmt(ex['sd'], '.3g')}")
    de = s.get("density_error")
    if de:
        parts.append(f"TV {de['tv']:.3g} vs iid floor {de['tv_iid_floor']:.3g}")
    if parts:
        text += "; measured here: " + ", ".join(parts)
    elif ex is None:
        text += "; the size of the error is unknown for this target (no exact answer)"
    return text


#: above this many slots the summary gives only the closed-form (Lemma 1) prediction: the
#: exact chain of :func:`nrpt.diagnostics.theory.exact_event_rates` solves one sparse system
#: per origin slot (its cost: docs/benchmarks.md)
EXACT_PREDICTION_SLOTS = 256


def _predictions(rej: np.ndarray, scheme, window: int) -> dict[str, Any]:
    """The ``scheme``'s own predictions (:meth:`nrpt.swap.schemes.Scheme.predicted_rates`) from
    each system's measured rejections; ``None`` where it makes none."""
    rows = []
    none = {"restarts_per_1000": None, "round_trips_a5_per_1000": None}
    for r in rej:
        r = np.clip(np.nan_to_num(r, nan=0.0), 0.0, 1.0)
        try:
            if r.size + 1 > EXACT_PREDICTION_SLOTS:
                rows.append({**none, "restarts_per_1000": scheme.closed_form_restarts(r, window)})
                continue
            rows.append(scheme.predicted_rates(r, window) or none)
        except ValueError:
            rows.append(none)
    R = len(rows)
    return {f"predicted_{k}": (rows[0][k] if R == 1 else [x[k] for x in rows])
            for k in ("restarts_per_1000", "round_trips_a5_per_1000")}


def _recorder_fields(rec: dict, facts: dict) -> dict[str, Any]:
    """Every recorder's ``summary()``: nrpt's merged, one given as an object under its name."""
    out: dict[str, Any] = {}
    for name, r in rec.items():
        if name in facts.get("own_summary", ()):
            out[name] = r.summary()
        else:
            out.update(r.summary())
    return out


def build_summary(run: Run, cfg, outcome: Outcome, samples: np.ndarray) -> dict[str, Any]:
    """The summary of a finished (or interrupted) run: the fields of the module docstring,
    JSON-ready (:func:`nrpt.recorders.stats.json_ready`).  ``samples`` are the slot-0 draws the
    statistics describe (``[R, n, dim]`` or ``[n, dim]``).  The health findings are listed
    under ``"warnings"`` and emitted as :class:`~nrpt.report.health.SamplingWarning` s pointing
    at the caller's caller."""
    eng, facts = run.engine, run.facts
    path_kind = eng.path.kind if not facts["sg"] else "noise-temperatures"
    window = outcome.notes.get("window", facts.get("window")) or 1
    s = _run_fields(run, cfg, outcome, path_kind, window)
    s.update(_recorder_fields(run.recorders, facts))
    rej = run.recorders["swaps"].rejection().detach().cpu().double().numpy()
    if eng.scheme.proposes_swaps:
        s.update(_predictions(rej, eng.scheme, window))
        mean_rej = np.nanmean(np.where(np.isnan(rej), 0.0, rej), axis=1)
        s["optimal_window_measured"] = per_system(
            [theory.optimal_window(eng.P, min(float(x), 1 - 1e-12)) for x in mean_rej], eng.R)
    if facts["sg"]:
        _sg_fields(s, run, cfg)
    else:
        _ladder_fields(s, run, path_kind)
    if getattr(cfg, "rounds", None) is not None:
        _rounds_fields(s, run, outcome, rej, path_kind)
    if facts.get("max_chains") is not None:
        _grown_fields(s, facts, outcome)
    if facts.get("zero_likelihood_share"):
        s["reference_zero_likelihood_share"] = facts["zero_likelihood_share"]
    _log_normalizer_note(s, run, path_kind)
    row_map = facts.get("row_map")  # engine rows that are not the user's systems one to one
    if row_map is None and eng.R > 1:
        _log_normalizer_pooled(s)
    if row_map is not None:
        s.update(row_map.summary(run))
    if facts.get("hot_end") is not None:  # a Gaussian hot end (density-only target)
        s.update(facts["hot_end"].summary(run))
    if facts.get("default_reference_skipped"):
        s["default_reference_note"] = facts["default_reference_skipped"]
    _exact_fields(s, eng, samples)
    note = _approximation_note(cfg, facts, s)
    if note:
        s["approximation_note"] = note
    findings = _health(run, cfg, s, samples)
    s["warnings"] = [f"{f.message} (turn: {f.knob})" for f in findings]
    s["interrupted"] = outcome.interrupted
    s["out"] = cfg.out
    health.emit(findings, stacklevel=4)
    return json_ready(s)


def _statistics_from(run: Run, outcome: Outcome) -> str:
    """What the recorders' statistics cover: the whole run, the last completed segment after
    a reset, or the iterations after the burn-in."""
    segs, done, facts = run.plan.segments, outcome.segments_done, run.facts
    burn = int(facts.get("burn_in") or 0)
    if burn and done > len(run.plan.warm_up(burn, facts.get("warmup_windows") or 1)):
        return (f"the {run.engine.k - burn} iterations after the burn-in of {burn} "
                f"(round_trips_total, restarts_total: the whole run)")
    if len(segs) == 1:
        return "the whole run"
    if not any(s.reset for s in segs[1:]):
        return "the whole run (tuning segment included)"
    if not done:
        return "no completed round"
    last_reset = max([i for i, s in enumerate(segs[:done]) if s.reset] or [0])
    return f"the last completed segment ({segs[min(last_reset, len(segs) - 1)].name})"


def _run_fields(run: Run, cfg, outcome: Outcome, path_kind: str, window: int) -> dict:
    """The run's facts: target, path, components, sizes, timing, what the statistics cover."""
    eng, facts, K = run.engine, run.facts, run.engine.k
    s: dict[str, Any] = {
        "target": cfg.target, "target_options": dict(cfg.target_options or {}),
        "path": path_kind, "chains": eng.P, "systems": eng.R, "explorer": cfg.explorer,
        "scheme": cfg.scheme, "window": window, "window_source": facts.get("window_source"),
        "rule": facts.get("rule"), "seed": cfg.seed, "n_iterations": K,
        "wall_time_s": outcome.wall_time_s, "threads": outcome.notes.get("threads"),
        "iterations_per_s": K / outcome.wall_time_s if outcome.wall_time_s > 0 else None,
        "statistics_from": _statistics_from(run, outcome),
        # fixed-length runs: warm-up iterations in no statistic, not in posterior.nc nor in
        # Result.samples (samples.npy keeps every row, from iteration 0)
        "burn_in": int(facts.get("burn_in") or 0),
        "warmup_windows": facts.get("warmup_windows") or 0,
        "step_size_tuned_in_burn_in": bool(facts.get("step_size_tuned")),
    }
    if facts.get("approximations"):  # e.g. DEO_W's gate on noisy swaps (nrpt.swap.check_gate)
        s["approximations"] = list(facts["approximations"])
    if "explorer_switched" in outcome.notes:  # (MetricAdaptor's switch: explorer mala-hmc)
        s["explorer_switched"] = outcome.notes["explorer_switched"]
    if "window_rejection" in outcome.notes:
        s["window_rejection"] = outcome.notes["window_rejection"]
    if getattr(run, "fused", None) is not None:
        s["fused"] = run.fused.describe()
    return s


def _ladder_fields(s: dict, run: Run, path_kind: str) -> None:
    """An exact run's barrier, schedules (every system's) and step sizes."""
    eng, R = run.engine, run.engine.R
    s["barrier"] = per_system(run.recorders["swaps"].barrier(), R)
    s["schedule_kind"] = "temperatures" if path_kind == "temperature" else "betas"
    every = [_schedule_values(b, path_kind) for b in eng.schedule.cpu().numpy()]
    s["schedules"] = every  # [R][P]: every system's (they differ once adapted)
    s["schedule"] = every[0]  # system 0's (kept for readers of older summaries)
    s["step_size"] = per_system(eng.step_size, R)
    metric = getattr(eng, "metric", None)
    if metric is not None:
        s["preconditioner"] = _preconditioner_fields(metric, run.facts.get("precondition"))


def _preconditioner_fields(metric, mode) -> dict:
    """Per slot (system 0; the metric is pooled over systems): the condition number of the
    covariance the metric encodes and the range of its scales (diagonal: the scales; dense:
    the square roots of the covariance's extreme eigenvalues)."""
    m = metric[0].detach().cpu().double()
    if m.dim() == 2:
        lo, hi = m.min(-1).values, m.max(-1).values
    else:
        ev = torch.linalg.eigvalsh(m @ m.transpose(-1, -2)).clamp_min(0).sqrt()
        lo, hi = ev[..., 0], ev[..., -1]
    return {"kind": "diagonal" if m.dim() == 2 else "dense", "precondition": mode,
            "condition_number": ((hi / lo) ** 2).tolist(),
            "scale_range": torch.stack([lo, hi], -1).tolist()}


def _sg_fields(s: dict, run: Run, cfg) -> None:
    """A stochastic-gradient run's learning-rate ladder (no temperature path, no barrier), its
    noise temperatures, correction and noise-based recommendations."""
    eng, facts, R = run.engine, run.facts, run.engine.R
    s.pop("explorer_acceptance", None)
    s["learning_rates"] = per_system(eng.step_size, R)
    temps = [[1.0 / b if b > 0 else math.inf for b in row] for row in eng.schedule.tolist()]
    s["noise_temperatures"] = json_ready(temps[0])  # the ladder is fixed: the same in
    if any(t != temps[0] for t in temps[1:]):  # every system (else each is reported)
        s["noise_temperatures_per_system"] = json_ready(temps)
    s["energy"] = facts.get("energy")
    if "C" in eng.params:
        s["correction"] = per_system(eng.params["C"][:, 0], R)
    if facts.get("rule") == "deterministic":
        s["swap_rate_target"] = cfg.swap_rate
    var = eng.state.extras.get("energy_var")
    if var is not None:
        _noise_fields(s, eng, var)


def _noise_fields(s: dict, eng, var: torch.Tensor) -> None:
    """From the energy-noise variances ``var`` ``[R, P]`` (per replica): the chain counts of
    Deng et al.'s Eq. 53 and the variance reduction of a control variate."""
    b = eng.schedule.cpu().double().numpy()
    if np.any(b[:, 1:] == math.inf):
        # Eq. 53 needs sigma_p / tau_{p+1}: scale-dependent, so learning rates (tau ∝ eta
        # only up to an unknown factor) cannot stand in for temperatures
        s["recommended_chains_noisy"] = None
        s["recommended_chains_noisy_note"] = (
            "not given: SGD exploration has no temperature, and Deng et al.'s Eq. 53 "
            "(sigma_p / tau_{p+1}) is not invariant to the unknown factor of tau ∝ "
            "learning rate")
    else:
        sigma = var.gather(1, eng.replica_at).clamp_min(0).sqrt().cpu().double().numpy()
        ranges = []
        for sigma_r, b_r in zip(sigma, b, strict=True):
            try:
                ranges.append(list(recommended_chains_noisy(sigma_r, 1.0 / b_r)))
            except ValueError:  # a diverged run (non-finite sigma): no recommendation
                ranges.append(None)
        s["recommended_chains_noisy"] = ranges[0] if eng.R == 1 else ranges
    plain = eng.state.extras.get("energy_var_plain")
    if plain is not None:
        ratio = float(plain.mean() / var.mean().clamp_min(1e-300))
        s["variance_reduction"] = ratio if math.isfinite(ratio) else None


def _log_normalizer_pooled(s: dict) -> None:
    """The systems' log Z (or ratio) pooled into one estimate, with an error that is the larger
    of the batch-means one and the one the systems' spread implies
    (:func:`nrpt.recorders.log_z.pooled_log_z`)."""
    if "log_normalizer" not in s or "log_normalizer_se" not in s:
        return
    p = pooled_log_z(s["log_normalizer"], s["log_normalizer_se"])
    s["log_normalizer_pooled"] = p["estimate"]
    s["log_normalizer_pooled_se"] = p["se"]
    s["log_normalizer_pooled_within_se"] = p["within_se"]
    s["log_normalizer_pooled_between_se"] = p["between_se"]


def _log_normalizer_note(s: dict, run: Run, path_kind: str) -> None:
    """What the log Z estimate is where it is not log Z (a ratio of normalizers)."""
    if "log_normalizer" not in s:
        return
    path = run.engine.path
    if path_kind == "temperature":
        s["log_normalizer_note"] = ("temperature ladder: only the ratio log(Z(tau=1) / "
                                    "Z(tau_max)) is estimated, not log Z")
    elif not path.has_reference:
        s["log_normalizer_note"] = (
            f"the ladder stops at beta = {path.betas[-1]:g} > 0: only "
            "log(Z(beta=1) / Z(beta_min)) is estimated, not log Z")
    elif not run.facts.get("reference_normalized"):
        s.setdefault("log_normalizer_note", "the reference is not declared normalized "
                     "(reference_is_normalized): only log(Z_target / Z_reference) is estimated")


def _exact_fields(s: dict, eng, samples) -> None:
    """ArviZ-style diagnostics of the slot-0 draws and, where the target knows its answer,
    the exact moments and the histogram's error; a failure of either is reported in the
    summary (``*_failed``), never hidden."""
    s["slot0"] = health.slot0_diagnostics(samples) if np.asarray(samples).size else None
    s["exact_moments"] = None
    if not s["slot0"]:
        return
    try:
        s["exact_moments"] = exact_moments(eng.target, eng.dim)
    except ValueError as err:  # the target's own method failed: said, not hidden
        s["exact_moments_failed"] = str(err)
    try:  # a diagnostic must not lose the run, but its failure is reported, never hidden
        s["density_error"] = density_error(eng.target, samples)
    except Exception as err:  # noqa: BLE001
        s["density_error"] = None
        s["density_error_failed"] = f"{type(err).__name__}: {err}"


def _rounds_fields(s: dict, run: Run, outcome: Outcome, rej: np.ndarray, kind: str) -> None:
    """An adaptive run's rounds, schedules per round and, from the last round, the local
    barrier, restart rates (observed, finite-P and asymptotic) and the adapted schedule."""
    R = run.engine.R
    s["rounds"] = outcome.segments_done
    s["rounds_planned"] = len(run.plan.segments)
    s["round_rows"] = outcome.rows
    s["schedule_per_round"] = [
        _schedule_values(row["b"][0], kind) if R == 1 else
        [_schedule_values(b, kind) for b in row["b"]] for row in outcome.rows]
    if not outcome.rows:
        return
    b = np.array(outcome.rows[-1]["b"], dtype=float)  # [R, P] of the last round
    rej = np.nan_to_num(rej, nan=0.0)
    _local_barrier_fields(s, b, rej, kind, R)
    restarts = run.recorders["round_trips"].counts()["restarts"].double().cpu().numpy()
    s["restart_rate"] = per_system(restarts / outcome.rows[-1]["iterations"], R)
    pred = s.get("predicted_restarts_per_1000")  # scheme-aware (theory.predicted_rates)
    s["predicted_restart_rate"] = (None if pred is None else
                                   [None if v is None else v / 1000 for v in pred]
                                   if isinstance(pred, list) else pred / 1000)
    lam = np.clip(rej.sum(1), 0.0, None)
    s["asymptotic_restart_rate"] = per_system([theory.asymptotic_restart_rate(x) for x in lam], R)
    s["recommended_chains"] = per_system([recommended_chains(x) for x in lam], R)
    chains = np.unique(np.round(np.geomspace(2, max(8.0, 4.0 * float(lam.mean()) + 2), 12)))
    s["restart_rate_curve"] = {"chains": chains.astype(int).tolist(),
                               "predicted_restart_rate":
                                   restart_rate_curve(float(lam.mean()), chains).tolist()}
    adapted = [_schedule_values(update_schedule(b[i], rej[i]), kind) for i in range(R)]
    s["adapted_schedules"] = adapted  # [R][P]
    s["adapted_schedule"] = adapted[0]  # system 0's (kept for readers of older summaries)


def _grown_fields(s: dict, facts: dict, outcome: Outcome) -> None:
    """``chains = "auto"``: where the ladder started, its cap, each growth (``{"round",
    "from", "to", "barrier"}``) and the last round that asked for more than the cap allows."""
    s["chains_start"] = facts.get("chains_start")
    s["max_chains"] = facts["max_chains"]
    s["chains_grown"] = list(outcome.notes.get("chains_grown", []))
    s["chains_capped"] = outcome.notes.get("chains_capped")
    if facts.get("min_chains") is not None:  # a ladder fitted both ways: its shrinks too
        s["min_chains"] = facts["min_chains"]
        s["chains_shrunk"] = list(outcome.notes.get("chains_shrunk", []))


def grown_text(s: dict) -> str | None:
    """One line on what ``chains = "auto"`` did ("grew 8 -> 14 chains at round 4: Λ̂ = 6.6"),
    or None for a fixed ladder."""
    if s.get("max_chains") is None:
        return None
    if s.get("min_chains") is not None:
        moves = sorted([*(s.get("chains_grown") or []), *(s.get("chains_shrunk") or [])],
                       key=lambda g: g["round"])
        steps = [f"{'shrank' if g['to'] < g['from'] else 'grew'} {g['from']} -> {g['to']} "
                 f"chains at round {g['round']} (Λ̂ = {g['barrier']:.3g})" for g in moves]
        text = ", ".join(steps) if steps else \
            f"kept {s.get('chains_start')} chains (the barrier estimate fitted them)"
        text += f" (fitted both ways: min_chains {s['min_chains']}, max_chains {s['max_chains']})"
    else:
        steps = [f"{g['from']} -> {g['to']} chains at round {g['round']} "
                 f"(Λ̂ = {g['barrier']:.3g})" for g in s.get("chains_grown") or []]
        text = ("grew " + ", ".join(steps)) if steps else \
            f"kept {s.get('chains_start')} chains (the barrier estimate never asked for more)"
    cap = s.get("chains_capped")
    if cap:
        text += (f"; capped at max_chains = {s['max_chains']} at round {cap['round']}, where "
                 f"Λ̂ = {cap['barrier']:.3g} asked for {cap['needed']}")
    return text


def _local_barrier_fields(s: dict, b: np.ndarray, rej: np.ndarray, kind: str, R: int) -> None:
    """The fitted local barrier per system (last round's ``b`` and ``rej`` ``[R, P]``) on 51
    points, and the Method I points placed at ``b``."""
    fits = [fit_barrier(b[i], rej[i]) for i in range(R)]
    grid = fits[0].grid(51)[0]
    coordinate = "1/temperature" if kind == "temperature" else "beta"
    s["local_barrier"] = {"coordinate": coordinate, "grid": grid.tolist(),
                          "values": per_system(np.array([f.local(grid) for f in fits]), R)}
    if "local_barrier_method_i" in s:
        s["local_barrier_method_i"] = {"coordinate": coordinate, "at": per_system(b, R),
                                       "values": s["local_barrier_method_i"]}


def _health(run: Run, cfg, s: dict, samples) -> list:
    """The run's health findings (:func:`nrpt.report.health.check_run`, then the log Z
    recorder's and the row map's own); a check that cannot run is itself a finding."""
    eng, row_map = run.engine, run.facts.get("row_map")  # engine rows != the user's systems
    exact = not run.facts["sg"]
    hot = _hot_inputs(eng, run.recorders.get("spread"), row_map) if exact else {}
    x = np.asarray(samples)
    slot0 = x if x.ndim == 3 else (x[None] if x.ndim == 2 else None)
    if slot0 is not None and slot0.shape[1] < 8:
        slot0 = None
    elif slot0 is not None and s.get("slot0"):  # these draws' slot0_diagnostics, computed once
        slot0 = s["slot0"]  # (by _exact_fields; check_run reads the dict as its own result)
    try:
        findings = health.check_run(
            **_check_inputs(run, cfg, exact), **hot, reference_exact=eng.path.has_reference,
            slot0=slot0, exact=exact,
            **_sg_ladder_inputs(run, cfg, s))
    except ValueError as err:  # never lose a run's result to a diagnostic
        return [health.Finding("health-check-failed", f"health checks could not run: {err}",
                               "report this as a bug")]
    lz = run.recorders.get("log_z")
    if lz is not None:  # log Z overlap (and systems) checks, per engine row
        findings += lz.findings(None if row_map is None else row_map.row_label,
                                across=row_map is None)
        if row_map is not None:
            findings += row_map.findings(run)
    return findings


def _check_inputs(run: Run, cfg, exact: bool) -> dict:
    """The swap, restart and explorer-acceptance inputs of the health checks."""
    eng, rec = run.engine, run.recorders
    swaps, swapping = rec["swaps"], eng.scheme.proposes_swaps
    # the acceptance the explorer declares it aims at (nrpt.run.build: facts)
    target_acc = run.facts.get("target_acceptance") if exact else None
    tuner = next((a for a in run.adaptors if isinstance(a, StepSizeAdaptor)), None)
    if target_acc is not None and tuner is not None:
        # the target the steps are tuned to now: the build's, or HMC's after mala-hmc's switch
        # (StepSizeAdaptor._switch owns that rule; the check reads it, not a copy of it)
        target_acc = tuner.target
    return {"swap_acceptance": swaps.acceptance().cpu().double().numpy()
            if swapping and exact else None,
            "restarts": rec["round_trips"].counts()["restarts"].cpu().numpy()
            if swapping else None,
            "n_iterations": int(swaps.n), "n_chains": eng.P,
            "explorer_acceptance": swaps.explorer_acceptance().cpu().double().numpy()
            if target_acc is not None else None,
            "explorer_target": target_acc, "explorer_name": cfg.explorer,
            "tail_acceptance": _tail_inputs(run) if target_acc is not None else None,
            "chains_grown": _grown_note(run)}


def _tail_inputs(run: Run) -> dict | None:
    """The ``tail-acceptance`` input: the recorder's statistics and the target's coordinate
    names where it has them (a Stan target's unconstrained names); None without the recorder
    or when engine rows are not the user's systems."""
    rec = run.recorders.get("tail_acceptance")
    if rec is None or run.facts.get("row_map") is not None:
        return None
    stats = rec.stats()
    if stats is not None:
        from nrpt.report.text import coordinate_names
        stats["names"] = coordinate_names(run.engine.target, run.engine.dim)
    return stats


def _grown_note(run: Run) -> str | None:
    """For the ``too-few-chains`` finding of a ``chains = "auto"`` run: how it got to its
    ``P`` (the cap), so that the advice names ``max_chains``."""
    cap = run.facts.get("max_chains")
    if cap is None:
        return None
    start = run.facts.get("chains_start")
    if run.engine.P >= cap:
        return f"chains = 'auto' grew from {start} to its cap max_chains = {cap}"
    return f"chains = 'auto' from {start}; growth is decided between rounds"


def _hot_inputs(eng, spread, row_map: RowMap | None) -> dict:
    """The ``hot-slot-stuck`` inputs of an exact run: the hottest slot's mean and sd per user
    system (the spread recorder's), and the reference's sd per coordinate from 2000 exact
    draws (a fixed generator) where the path has a sampleable reference; None where unknown."""
    out = {"hot_states": None, "reference_spread": None}
    if spread is not None and spread.n >= 2 and (eng.P - 1) in spread.slots:
        j = spread.slots.index(eng.P - 1)
        rows = slice(None) if row_map is None else row_map.chain_rows  # the user's rows
        out["hot_states"] = {"mean": spread.mean[rows, j].cpu().double().numpy(),
                             "sd": spread.sd()[rows, j].cpu().double().numpy(), "n": spread.n}
    if callable(getattr(eng.path, "reference_sd", None)):  # a reference the path holds
        out["reference_spread"] = eng.path.reference_sd().detach().cpu().double().numpy()
    elif eng.path.has_reference:
        g = torch.Generator().manual_seed(12345)
        draws = torch.as_tensor(eng.target.reference_sample(2000, g)).double()
        out["reference_spread"] = draws.std(0).numpy()
    return out


def _sg_ladder_inputs(run: Run, cfg, s: dict) -> dict:
    """The learning-rate ladder and, for an adapting deterministic rule, the per-pair indicator
    rates with their target ``S`` (the ``ladder-collapse`` / ``swap-rate-off-target`` checks)."""
    if not run.facts["sg"] or "learning-rates" not in {getattr(a, "name", None)
                                                       for a in run.adaptors}:
        return {}
    out = {"learning_rates": run.engine.step_size.detach().cpu().double().numpy()}
    rate = s.get("indicator_rate")
    if rate is not None and s.get("swap_rate_target") is not None and getattr(cfg, "adapt",
                                                                                False):
        out["pair_rate"] = np.array(rate if run.engine.R > 1 else [rate], dtype=float)
        out["swap_rate_target"] = float(s["swap_rate_target"])
    return out


def _fmt(v, spec=".3g") -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x, spec) for x in v) + "]"
    if isinstance(v, float):
        return format(v, spec)
    return "n/a" if v is None else str(v)


def _num(v) -> float:
    return float("nan") if v is None else float(v)


def _spread(v: list, spec: str) -> str:
    """``mean ± sd`` of per-system scalars (sd over systems, ddof = 1)."""
    a = np.array([_num(x) for x in v], dtype=float)
    a = a[np.isfinite(a)]
    if a.size == 0:
        return "n/a"
    if a.size == 1:
        return format(float(a[0]), spec)
    return f"{format(float(a.mean()), spec)} ± {format(float(a.std(ddof=1)), '.2g')}"


def _vector_mean(v: list) -> list:
    """The mean over systems of per-system vectors ``[R][n]`` (None where all are missing)."""
    a = np.array([[_num(x) for x in row] for row in v], dtype=float)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a column of NaN: mean of nothing
        m = np.nanmean(a, axis=0)
    return [None if not np.isfinite(x) else float(x) for x in m]


def _per_system(label: str, v, R: int, spec: str = ".3g", suffix: str = "") -> list[str]:
    """Lines of a per-slot / per-pair quantity: one line for one system (or when every system
    has the same values); with several systems the mean over systems, then each system on its
    own line below."""
    if R == 1 and isinstance(v, list) and len(v) == 1 and isinstance(v[0], list):
        v = v[0]  # one system's row of a [R][n] table
    if R == 1 or not (isinstance(v, list) and v and isinstance(v[0], list)):
        return [f"  {label:<15} {_fmt(v, spec)}{suffix}"]
    if all(row == v[0] for row in v[1:]):
        return [f"  {label:<15} {_fmt(v[0], spec)}{suffix} (every system)"]
    out = [f"  {label:<15} {_fmt(_vector_mean(v), spec)}{suffix} (mean of {R} systems)"]
    out += [f"    system {r:<6} {_fmt(row, spec)}" for r, row in enumerate(v)]
    return out


#: the per-system scalars of the table printed for runs with several systems
_SYSTEM_COLUMNS = [("restarts", "restarts", ".0f"), ("restarts_per_1000", "/1000 it", ".3g"),
                   ("predicted_restarts_per_1000", "pred.", ".3g"),
                   ("round_trips", "trips", ".0f"), ("round_trips_a5", "A.5 trips", ".0f"),
                   ("round_trips_a5_per_1000", "/1000 it", ".3g"),
                   ("predicted_round_trips_a5_per_1000", "pred.", ".3g"),
                   ("barrier", "Λ̂", ".3g"), ("log_normalizer", "log Z", ".4g"),
                   ("correction", "C", ".3g"), ("recommended_chains", "2Λ̂ chains", ".0f")]


def _flat_list(v) -> bool:
    """Whether ``v`` is a list of scalars (a per-system scalar), not a table."""
    return isinstance(v, list) and not any(isinstance(x, list) for x in v)


def _system_table(s: dict[str, Any], R: int) -> list[str]:
    """The per-system table: a row per system of the :data:`_SYSTEM_COLUMNS` the summary has
    per system, and their ``mean ± sd``; no lines when it has none."""
    cols = [(k, label, spec) for k, label, spec in _SYSTEM_COLUMNS
            if _flat_list(s.get(k)) and len(s[k]) == R]
    if not cols:
        return []
    if s.get("log_normalizer_kind") != "log Z":
        cols = [(k, "log Z ratio" if k == "log_normalizer" else lab, sp) for k, lab, sp in cols]
    table = _table_cells(s, cols, R)
    widths = [max(len(row[j]) for row in table) for j in range(len(cols))]
    names = ["  per system     "] + [f"    system {r:<6}" for r in range(R)] + \
        ["    mean ± sd   "]
    return [name + "  ".join(f"{c:>{w}}" for c, w in zip(row, widths, strict=True))
            for name, row in zip(names, table, strict=True)]


def _table_cells(s: dict[str, Any], cols: list, R: int) -> list[list[str]]:
    """The table's header, a row per system and the ``mean ± sd`` row of columns ``cols``."""
    table = [[label for _, label, _ in cols]]
    table += [["n/a" if s[k][r] is None else format(float(s[k][r]), spec)
               for k, _, spec in cols] for r in range(R)]
    table.append([_spread(s[k], spec) for k, _, spec in cols])
    return table


def _scalar(v, R: int, spec: str = ".3g") -> str:
    """A per-system scalar: itself for one system, ``mean ± sd`` over several."""
    return _spread(v, spec) if R > 1 and _flat_list(v) else _fmt(v, spec)


def format_summary(s: dict[str, Any], row_map: RowMap | None = None) -> str:
    """The printed report of a run (any kind).  With several systems, per-system scalars are
    shown as ``mean ± sd`` over the systems with a per-system table below, and per-slot /
    per-pair vectors as their mean over systems with each system on its own line.
    ``row_map``: the run's ``Run.facts["row_map"]``, which adds lines of its own."""
    R = int(s.get("systems") or 1)
    lines = _header_lines(s, R)
    if s["scheme"] != "none":
        lines += _swap_lines(s, R)
    if "barrier" in s:
        label = "temperatures" if s["schedule_kind"] == "temperatures" else "betas"
        lines.append(f"  barrier Λ̂       {_scalar(s['barrier'], R)}")
        lines += _per_system(label, s.get("schedules", s["schedule"]), R, ".3g")
        lines += _per_system("explorer acc.", s.get("explorer_acceptance"), R, ".2f")
    if s.get("learning_rates") is not None:
        lines += _sg_lines(s, R)
    if "log_normalizer" in s:
        lines.append(_log_normalizer_line(s, R))
    if row_map is not None:  # its own fields (e.g. per leg)
        lines += row_map.text(s, lambda v, fmt=".3g": _scalar(v, R, fmt))
    if s.get("gaussian_note"):  # a Gaussian hot end (nrpt.paths.gaussian_reference)
        lines.append(f"  reference       {s.get('reference')}: {s['gaussian_note']}")
    if s.get("default_reference_note"):
        lines.append(f"  reference       {s['default_reference_note']}")
    grown = grown_text(s)
    if grown:
        lines.append(f"  chains auto     {grown}")
    if "rounds" in s:
        lines.append(f"  adaptive        {s['rounds']} of {s['rounds_planned']} rounds; "
                     f"Λ̂ = {_scalar(s.get('barrier'), R)}: about 2Λ̂ = "
                     f"{_scalar(s.get('recommended_chains'), R, '.3g')} chains recommended")
        if "restart_rate" in s:
            lines.append(f"  restart rate    observed {_scalar(s['restart_rate'], R)} per "
                         f"iteration, finite-P theory "
                         f"{_scalar(s['predicted_restart_rate'], R)}, 1/(2+2Λ̂) = "
                         f"{_scalar(s['asymptotic_restart_rate'], R)}")
    if R > 1:
        lines += _system_table(s, R)
    return "\n".join(lines + _answer_lines(s, R) + _note_lines(s))


def _header_lines(s: dict, R: int) -> list[str]:
    """The target, path, sizes, components, iterations and what the statistics cover."""
    opts = s.get("target_options") or {}
    target = s["target"] + (" (" + ", ".join(f"{k}={v}" for k, v in opts.items()) + ")"
                            if opts else "")
    win = f" (W = {s['window']}, {s['window_source']})" if s["scheme"] == "deo-w" else ""
    lines = [f"nrpt: {target} | {s['path']} path, P = {s['chains']}, systems = {s['systems']}",
             f"  scheme {s['scheme']}{win}, rule {s['rule']}, explorer {s['explorer']}",
             f"  iterations      {s['n_iterations']} in {s['wall_time_s']:.2f} s"
             f" ({_fmt(s.get('iterations_per_s'), '.0f')} it/s); statistics from "
             f"{s['statistics_from']}"]
    if R > 1:
        lines.append(f"  ({R} independent systems: a single number is the mean ± sd over the "
                     "systems, each system's in the table below; per-slot values are the mean "
                     "over systems, each system's on its own line)")
    return lines


def _swap_lines(s: dict, R: int) -> list[str]:
    """Restarts and round trips, observed beside predicted, and the swap acceptance."""
    return [
        f"  restarts        {_scalar(s['restarts'], R, '.4g')} observed; per 1000 it "
        f"{_scalar(s['restarts_per_1000'], R)} vs "
        f"{_scalar(s.get('predicted_restarts_per_1000'), R)}"
        " predicted (Syed et al. 2021 Thm 1 / Deng et al. 2023 Lemma 1)",
        f"  round trips     {_scalar(s['round_trips'], R, '.4g')} (Syed et al.: restart, "
        f"then back to the top); appendix-A.5 (Deng et al.) "
        f"{_scalar(s['round_trips_a5'], R, '.4g')}, per 1000 it "
        f"{_scalar(s['round_trips_a5_per_1000'], R)} vs "
        f"{_scalar(s.get('predicted_round_trips_a5_per_1000'), R)} predicted (the index "
        "process solved exactly at the measured rates)",
        *_per_system("swap acceptance", s["swap_acceptance"], R, ".2f")]


def _sg_lines(s: dict, R: int) -> list[str]:
    """A stochastic-gradient run's ladder, noise temperatures and correction."""
    lines = _per_system("learning rates", s["learning_rates"], R, ".3g")
    lines += _per_system("noise temps", s.get("noise_temperatures_per_system",
                                              s["noise_temperatures"]), R, ".3g",
                         f"; energy {s.get('energy')}")
    C = s.get("correction")
    if C is not None:
        lines.append(f"  correction C    {_scalar(C, R)} (target swap rate S = "
                     f"{s.get('swap_rate_target')})")
        lines += _per_system("indicator rate", s.get("indicator_rate"), R, ".2f", " per pair")
    return lines


def _log_normalizer_line(s: dict, R: int) -> str:
    """The bridge estimate of log Z (or its ratio) with its stepping-stone halves."""
    label = "log Z" if s.get("log_normalizer_kind") == "log Z" else "log Z ratio"
    se = s.get("log_normalizer_se")
    # (one system: its standard error; several: the spread over systems says it)
    se = "" if se is None or R > 1 else f" ± {_fmt(se, '.2g')}"
    line = (f"  {label:<15} {_scalar(s['log_normalizer'], R, '.4g')}{se}  (bridge; "
            f"stepping-stone halves: forward {_scalar(s['log_normalizer_forward'], R, '.4g')}"
            f", reverse {_scalar(s['log_normalizer_reverse'], R, '.4g')})")
    if s.get("log_normalizer_pooled") is None:
        return line
    return line + (f"\n  {'pooled':<15} {_fmt(s['log_normalizer_pooled'], '.6g')} ± "
                   f"{_fmt(s['log_normalizer_pooled_se'], '.2g')}  (mean over the {R} systems; "
                   "error: the larger of the batch-means one, "
                   f"{_fmt(s['log_normalizer_pooled_within_se'], '.2g')}, and the systems' "
                   f"spread's, {_fmt(s['log_normalizer_pooled_between_se'], '.2g')})")


def _answer_lines(s: dict, R: int) -> list[str]:
    """The slot-0 diagnostics beside the exact answer and histogram error where known."""
    lines = []
    slot0 = s.get("slot0")
    if slot0:
        pooled = f" (pooled over {R} systems)" if R > 1 else ""
        lines.append(f"  slot 0          mean {_fmt(slot0.get('mean'))}, sd "
                     f"{_fmt(slot0.get('sd'))}{pooled}, ESS bulk "
                     f"{_fmt(slot0.get('ess_bulk'), '.0f')}, R-hat "
                     f"{_fmt(slot0.get('r_hat'), '.3f')}")
    ex = s.get("exact_moments")
    if ex:
        lines.append(f"  exact           mean {_fmt(ex['mean'])}, sd {_fmt(ex['sd'])} (the "
                     "target's own moments)")
    if s.get("exact_moments_failed"):
        lines.append(f"  exact           could not be read: {s['exact_moments_failed']}")
    de = s.get("density_error")
    if de:
        ratio = de["tv"] / de["tv_iid_floor"] if de["tv_iid_floor"] > 0 else float("inf")
        lines.append(f"  histogram TV    {de['tv']:.3g} vs {de['tv_iid_floor']:.3g} for "
                     f"{de['n']} exact iid draws (the finite-sample floor; {ratio:.2g} x)")
    if s.get("density_error_failed"):
        lines.append(f"  histogram TV    could not be computed: {s['density_error_failed']}")
    return lines


def _note_lines(s: dict) -> list[str]:
    """Rejected proposals, notes, warnings, interruption and the results folder."""
    lines = []
    if s.get("nonfinite_proposals"):
        lines.append(f"  rejected non-finite proposals: {s['nonfinite_proposals']}")
    lines += [f"  note: {note}" for note in (s.get("approximation_note"),
                                             s.get("log_normalizer_note"),
                                             s.get("log_normalizer_halves_note")) if note]
    lines += [f"  WARNING: {w}" for w in s.get("warnings") or []]
    lines += [f"  WARNING: figure: {w}" for w in s.get("figure_errors") or []]
    if s.get("interrupted"):
        lines.append("  (interrupted: results cover the iterations completed)")
    if s.get("out"):
        lines.append(f"  results in      {s['out']}")
        if "figures" not in s and not s.get("interrupted") and s.get("n_iterations"):
            lines.append(f"  figures         not drawn (figures = false); `nrpt figures "
                         f"{shlex.quote(str(s['out']))}` draws them")
    return lines
