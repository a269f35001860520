"""One summary for every kind of run: ``summary.json`` and the printed report.

The summary is the union of the recorders' reductions (statistics since the last reset: the
whole run, or the last round of an adaptive run -- ``statistics_from`` says which), the run's
facts (path, scheme, window and where it came from, rule), the theory's predictions of the
observed rates (each beside the quantity it predicts), the adaptive quantities of round-based
runs, the adapted ladder of stochastic-gradient runs, ArviZ diagnostics of the slot-0 chain, and
the health findings (:mod:`nrpt.report.health`), which are also emitted as Python warnings.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import torch

from nrpt.adapt.chains import recommended_chains, recommended_chains_noisy, restart_rate_curve
from nrpt.adapt.schedule import fit_barrier, update_schedule
from nrpt.core.loop import Outcome, Run
from nrpt.diagnostics import theory
from nrpt.diagnostics.density import grid_errors, iid_floor
from nrpt.recorders.stats import json_ready, per_system
from nrpt.report import health
from nrpt.roles import RowMap

__all__ = ["build_summary", "format_summary", "exact_moments", "density_error"]


def _schedule_values(b, kind: str) -> list:
    b = np.asarray(b, dtype=float)
    return (1.0 / b).tolist() if kind == "temperature" else b.tolist()


def exact_moments(target, dim: int | None = None) -> dict[str, list] | None:
    """The target's exact mean and marginal sd per coordinate, where it knows them: from
    ``target.exact_moments()`` (a dict with ``"mean"`` and ``"sd"``) if it has one, else from
    the ``mean`` ``[dim]`` and ``cov`` ``[dim, dim]`` the built-in targets carry
    (:class:`~nrpt.targets.TwentyFiveModes`, ``Gaussian``, ``GaussianMixture``); None when
    unknown or not of the state's shape (a user's ``mean`` attribute meaning something else is
    not taken for the answer).  A target's own ``exact_moments()`` that fails or returns
    something else than finite ``mean`` and ``sd`` of the state's size raises ``ValueError``
    (the caller reports it: a known answer is never dropped silently)."""
    fn = getattr(target, "exact_moments", None)
    if callable(fn):
        try:
            m = fn()
            if m is None:
                return None
            mean = np.asarray(m["mean"], dtype=float).reshape(-1)
            sd = np.asarray(m["sd"], dtype=float).reshape(-1)
        except Exception as err:  # noqa: BLE001 -- re-raised with the method named
            raise ValueError(f"the target's exact_moments() failed: {type(err).__name__}: "
                             f"{err} (it must return {{'mean': [dim], 'sd': [dim]}} or None)"
                             ) from err
        if mean.shape != sd.shape or (dim is not None and mean.size != dim) \
                or not (np.isfinite(mean).all() and np.isfinite(sd).all()):
            raise ValueError(f"the target's exact_moments() gave mean of shape {mean.shape} and "
                             f"sd of shape {sd.shape}: both must be finite, of the state's size "
                             f"({dim})")
        return {"mean": mean.tolist(), "sd": sd.tolist()}
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
    sd = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    mean, sd = mean.reshape(-1), sd.reshape(-1)
    if mean.shape != sd.shape or (dim is not None and mean.size != dim) \
            or not (np.isfinite(mean).all() and np.isfinite(sd).all()):
        return None
    return {"mean": mean.tolist(), "sd": sd.tolist()}


def density_error(target, samples) -> dict[str, Any] | None:
    """Total variation between the histogram of the slot-0 draws (all systems pooled) and the
    exact cell probabilities of a 2-D target with ``density_grid()``, beside the TV that as
    many exact iid draws give (:func:`nrpt.diagnostics.density.iid_floor`: the finite-sample
    floor a perfect sampler would show).  None for targets without an exact grid or samples
    that are not 2-D.  Errors of the target's ``density_grid`` propagate (no silent floor)."""
    fn = getattr(target, "density_grid", None)
    x = np.asarray(samples, dtype=float)
    if not callable(fn) or x.ndim not in (2, 3) or x.shape[-1] != 2:
        return None
    x = x.reshape(-1, 2)
    if x.shape[0] == 0:
        return None
    grid = fn()
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
#: per origin slot (26 s at P = 400; a run of 40,000 chains never reached its summary)
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
    eng, rec, facts = run.engine, run.recorders, run.facts
    R, P, K = eng.R, eng.P, eng.k
    sg = facts["sg"]
    path_kind = eng.path.kind if not sg else "noise-temperatures"
    window = outcome.notes.get("window", facts.get("window")) or 1
    segs = run.plan.segments
    done = outcome.segments_done
    last_reset = max([i for i, s in enumerate(segs[:max(done, 1)]) if s.reset] or [0])
    if len(segs) == 1:
        stats_from = "the whole run"
    elif any(s.reset for s in segs[1:]):
        seg = segs[min(last_reset, len(segs) - 1)]
        stats_from = f"the last completed segment ({seg.name})" if done else "no completed round"
    else:
        stats_from = "the whole run (tuning segment included)"
    burn = int(facts.get("burn_in") or 0)
    if burn and done > len(run.plan.warm_up(burn, facts.get("warmup_windows") or 1)):
        stats_from = (f"the {K - burn} iterations after the burn-in of {burn} (round_trips_total"
                      f", restarts_total: the whole run)")
    s: dict[str, Any] = {
        "target": cfg.target, "target_options": dict(cfg.target_options or {}),
        "path": path_kind, "chains": P, "systems": R, "explorer": cfg.explorer,
        "scheme": cfg.scheme, "window": window, "window_source": facts.get("window_source"),
        "rule": facts.get("rule"), "seed": cfg.seed, "n_iterations": K,
        "wall_time_s": outcome.wall_time_s, "threads": outcome.notes.get("threads"),
        "iterations_per_s": K / outcome.wall_time_s if outcome.wall_time_s > 0 else None,
        "statistics_from": stats_from,
        # fixed-length runs: warm-up iterations in no statistic, not in posterior.nc nor in
        # Result.samples (samples.npy keeps every row, from iteration 0)
        "burn_in": burn, "warmup_windows": facts.get("warmup_windows") or 0,
        "step_size_tuned_in_burn_in": bool(facts.get("step_size_tuned")),
    }
    if facts.get("approximations"):  # e.g. DEO_W's gate on noisy swaps (nrpt.swap.check_gate)
        s["approximations"] = list(facts["approximations"])
    if "window_rejection" in outcome.notes:
        s["window_rejection"] = outcome.notes["window_rejection"]
    if getattr(run, "fused", None) is not None:
        s["fused"] = run.fused.describe()
    s.update(_recorder_fields(rec, facts))
    swaps = rec["swaps"]
    rej = swaps.rejection().detach().cpu().double().numpy()
    if eng.scheme.proposes_swaps:
        s.update(_predictions(rej, eng.scheme, window))
        mean_rej = np.nanmean(np.where(np.isnan(rej), 0.0, rej), axis=1)
        s["optimal_window_measured"] = per_system(
            [theory.optimal_window(P, min(float(x), 1 - 1e-12)) for x in mean_rej], R)
    if sg:
        # a learning-rate ladder: no temperature path, no barrier; report the ladder itself
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
        zero_temperature = bool(np.any(eng.schedule.cpu().double().numpy()[:, 1:] == math.inf))
        if var is not None and zero_temperature:
            # Eq. 53 needs sigma_p / tau_{p+1}: scale-dependent, so learning rates (tau ∝ eta
            # only up to an unknown factor) cannot stand in for temperatures
            s["recommended_chains_noisy"] = None
            s["recommended_chains_noisy_note"] = (
                "not given: SGD exploration has no temperature, and Deng et al.'s Eq. 53 "
                "(sigma_p / tau_{p+1}) is not invariant to the unknown factor of tau ∝ "
                "learning rate")
        if var is not None:
            sigma = var.gather(1, eng.replica_at).clamp_min(0).sqrt().cpu().double().numpy()
            temps_np = 1.0 / eng.schedule.cpu().double().numpy()  # noise temperatures [R, P]
        if var is not None and not zero_temperature:
            ranges = []
            for i in range(R):
                try:
                    ranges.append(list(recommended_chains_noisy(sigma[i], temps_np[i])))
                except ValueError:  # a diverged run (non-finite sigma): no recommendation
                    ranges.append(None)
            s["recommended_chains_noisy"] = ranges[0] if R == 1 else ranges
        if var is not None:
            plain = eng.state.extras.get("energy_var_plain")
            if plain is not None:
                ratio = float(plain.mean() / var.mean().clamp_min(1e-300))
                s["variance_reduction"] = ratio if math.isfinite(ratio) else None
    else:
        s["barrier"] = per_system(swaps.barrier(), R)
        s["schedule_kind"] = "temperatures" if path_kind == "temperature" else "betas"
        every = [_schedule_values(b, path_kind) for b in eng.schedule.cpu().numpy()]
        s["schedules"] = every  # [R][P]: every system's (they differ once adapted)
        s["schedule"] = every[0]  # system 0's (kept for readers of older summaries)
        s["step_size"] = per_system(eng.step_size, R)
    if getattr(cfg, "rounds", None) is not None:
        _rounds_fields(s, run, outcome, rej, path_kind)
    if facts.get("zero_likelihood_share"):
        s["reference_zero_likelihood_share"] = facts["zero_likelihood_share"]
    if "log_normalizer" in s and path_kind == "temperature":
        s["log_normalizer_note"] = ("temperature ladder: only the ratio log(Z(tau=1) / "
                                    "Z(tau_max)) is estimated, not log Z")
    elif "log_normalizer" in s and not eng.path.has_reference:
        s["log_normalizer_note"] = (
            f"the ladder stops at beta = {eng.path.betas[-1]:g} > 0: only "
            "log(Z(beta=1) / Z(beta_min)) is estimated, not log Z")
    elif "log_normalizer" in s and not facts.get("reference_normalized"):
        s.setdefault("log_normalizer_note", "the reference is not declared normalized "
                     "(reference_is_normalized): only log(Z_target / Z_reference) is estimated")
    row_map = facts.get("row_map")  # engine rows that are not the user's systems one to one
    if row_map is not None:
        s.update(row_map.summary(run))
    s["slot0"] = health.slot0_diagnostics(samples) if np.asarray(samples).size else None
    s["exact_moments"] = None
    if s["slot0"]:
        try:
            s["exact_moments"] = exact_moments(eng.target, eng.dim)
        except ValueError as err:  # the target's own method failed: said, not hidden
            s["exact_moments_failed"] = str(err)
    if s["slot0"]:
        try:  # a diagnostic must not lose the run, but its failure is reported, never hidden
            s["density_error"] = density_error(eng.target, samples)
        except Exception as err:  # noqa: BLE001
            s["density_error"] = None
            s["density_error_failed"] = f"{type(err).__name__}: {err}"
    note = _approximation_note(cfg, facts, s)
    if note:
        s["approximation_note"] = note
    findings = _health(run, cfg, s, samples)
    s["warnings"] = [f"{f.message} (turn: {f.knob})" for f in findings]
    s["interrupted"] = outcome.interrupted
    s["out"] = cfg.out
    health.emit(findings, stacklevel=4)
    return json_ready(s)


def _rounds_fields(s, run: Run, outcome: Outcome, rej: np.ndarray, kind: str) -> None:
    eng = run.engine
    R = eng.R
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
    fits = [fit_barrier(b[i], rej[i]) for i in range(R)]
    grid = fits[0].grid(51)[0]
    coordinate = "1/temperature" if kind == "temperature" else "beta"
    s["local_barrier"] = {"coordinate": coordinate, "grid": grid.tolist(),
                          "values": per_system(np.array([f.local(grid) for f in fits]), R)}
    if "local_barrier_method_i" in s:
        s["local_barrier_method_i"] = {"coordinate": coordinate, "at": per_system(b, R),
                                       "values": s["local_barrier_method_i"]}
    n = outcome.rows[-1]["iterations"]
    restarts = run.recorders["round_trips"].counts()["restarts"].double().cpu().numpy()
    s["restart_rate"] = per_system(restarts / n, R)
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


def _health(run: Run, cfg, s: dict, samples) -> list:
    eng, rec, facts = run.engine, run.recorders, run.facts
    row_map = facts.get("row_map")  # engine rows that are not the user's systems one to one
    swaps = rec["swaps"]
    exact = not facts["sg"]
    # the acceptance the explorer declares it aims at (nrpt.run.build: facts)
    target_acc = facts.get("target_acceptance") if exact else None
    spread = rec.get("spread")
    hot = None
    if spread is not None and spread.n >= 2:
        j = spread.slots.index(eng.P - 1) if (eng.P - 1) in spread.slots else None
        if j is not None:
            rows = slice(None) if row_map is None else row_map.chain_rows  # the user's rows
            hot = {"mean": spread.mean[rows, j].cpu().double().numpy(),
                   "sd": spread.sd()[rows, j].cpu().double().numpy(), "n": spread.n}
    ref_sd = None
    if eng.path.has_reference and exact:
        g = torch.Generator().manual_seed(12345)
        draws = torch.as_tensor(eng.target.reference_sample(2000, g)).double()
        ref_sd = draws.std(0).numpy()
    x = np.asarray(samples)
    slot0 = x if x.ndim == 3 else (x[None] if x.ndim == 2 else None)
    n_stats = int(swaps.n)
    try:
        findings = health.check_run(
            swap_acceptance=None if not eng.scheme.proposes_swaps or not exact
            else swaps.acceptance().cpu().double().numpy(),
            restarts=None if not eng.scheme.proposes_swaps
            else rec["round_trips"].counts()["restarts"].cpu().numpy(),
            n_iterations=n_stats, n_chains=eng.P,
            explorer_acceptance=swaps.explorer_acceptance().cpu().double().numpy()
            if target_acc is not None else None,
            explorer_target=target_acc, explorer_name=cfg.explorer,
            hot_states=hot if exact else None, reference_spread=ref_sd,
            reference_exact=eng.path.has_reference,
            slot0=slot0 if slot0 is not None and slot0.shape[1] >= 8 else None, exact=exact,
            **_sg_ladder_inputs(run, cfg, s))
    except ValueError as err:  # never lose a run's result to a diagnostic
        return [health.Finding("health-check-failed", f"health checks could not run: {err}",
                               "report this as a bug")]
    lz = rec.get("log_z")
    if lz is not None:  # log Z halves self-check, per engine row
        findings += lz.findings(None if row_map is None else row_map.row_label)
        if row_map is not None:
            findings += row_map.findings(run)
    return findings


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


def _system_table(s: dict[str, Any], R: int) -> list[str]:
    cols = [(k, label, spec) for k, label, spec in _SYSTEM_COLUMNS
            if isinstance(s.get(k), list) and len(s[k]) == R
            and not any(isinstance(x, list) for x in s[k])]
    if not cols:
        return []
    if s.get("log_normalizer_kind") != "log Z":
        cols = [(k, "log Z ratio" if k == "log_normalizer" else lab, sp) for k, lab, sp in cols]
    table = [[label for _, label, _ in cols]]
    table += [["n/a" if s[k][r] is None else format(float(s[k][r]), spec)
               for k, _, spec in cols] for r in range(R)]
    table.append([_spread(s[k], spec) for k, _, spec in cols])
    widths = [max(len(row[j]) for row in table) for j in range(len(cols))]
    names = ["  per system     "] + [f"    system {r:<6}" for r in range(R)] + \
        ["    mean ± sd   "]
    return [name + "  ".join(f"{c:>{w}}" for c, w in zip(row, widths, strict=True))
            for name, row in zip(names, table, strict=True)]


def _scalar(v, R: int, spec: str = ".3g") -> str:
    """A per-system scalar: itself for one system, ``mean ± sd`` over several."""
    if R > 1 and isinstance(v, list) and not any(isinstance(x, list) for x in v):
        return _spread(v, spec)
    return _fmt(v, spec)


def format_summary(s: dict[str, Any], row_map: RowMap | None = None) -> str:
    """The printed report of a run (any kind).  With several systems, per-system scalars are
    shown as ``mean ± sd`` over the systems with a per-system table below, and per-slot /
    per-pair vectors as their mean over systems with each system on its own line.
    ``row_map``: the run's ``Run.facts["row_map"]``, which adds lines of its own."""
    R = int(s.get("systems") or 1)
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
    if s["scheme"] != "none":
        lines += [
            f"  restarts        {_scalar(s['restarts'], R, '.4g')} observed; per 1000 it "
            f"{_scalar(s['restarts_per_1000'], R)} vs "
            f"{_scalar(s.get('predicted_restarts_per_1000'), R)}"
            " predicted (Syed et al. 2021 Thm 1 / Deng et al. 2023 Lemma 1)",
            f"  round trips     {_scalar(s['round_trips'], R, '.4g')} (Syed et al.: restart, "
            f"then back to the top); appendix-A.5 (Deng et al.) "
            f"{_scalar(s['round_trips_a5'], R, '.4g')}, per 1000 it "
            f"{_scalar(s['round_trips_a5_per_1000'], R)} vs "
            f"{_scalar(s.get('predicted_round_trips_a5_per_1000'), R)} predicted (the index "
            "process solved exactly at the measured rates)"]
        lines += _per_system("swap acceptance", s["swap_acceptance"], R, ".2f")
    if "barrier" in s:
        label = "temperatures" if s["schedule_kind"] == "temperatures" else "betas"
        lines.append(f"  barrier Λ̂       {_scalar(s['barrier'], R)}")
        lines += _per_system(label, s.get("schedules", s["schedule"]), R, ".3g")
        lines += _per_system("explorer acc.", s.get("explorer_acceptance"), R, ".2f")
    if s.get("learning_rates") is not None:
        C = s.get("correction")
        lines += _per_system("learning rates", s["learning_rates"], R, ".3g")
        lines += _per_system("noise temps", s.get("noise_temperatures_per_system",
                                                  s["noise_temperatures"]), R, ".3g",
                             f"; energy {s.get('energy')}")
        if C is not None:
            lines.append(f"  correction C    {_scalar(C, R)} (target swap rate S = "
                         f"{s.get('swap_rate_target')})")
            lines += _per_system("indicator rate", s.get("indicator_rate"), R, ".2f",
                                 " per pair")
    if "log_normalizer" in s:
        label = "log Z" if s.get("log_normalizer_kind") == "log Z" else "log Z ratio"
        se = s.get("log_normalizer_se")
        # (one system: its standard error; several: the spread over systems says it)
        se = "" if se is None or R > 1 else f" ± {_fmt(se, '.2g')}"
        lines.append(f"  {label:<15} {_scalar(s['log_normalizer'], R, '.4g')}{se}  (bridge; "
                     f"stepping-stone halves: forward "
                     f"{_scalar(s['log_normalizer_forward'], R, '.4g')}, reverse "
                     f"{_scalar(s['log_normalizer_reverse'], R, '.4g')})")
    if row_map is not None:  # its own fields (e.g. per leg)
        lines += row_map.text(s, lambda v, fmt=".3g": _scalar(v, R, fmt))
    if "rounds" in s:
        lines.append(f"  adaptive        {s['rounds']} of {s['rounds_planned']} rounds; "
                     f"Λ̂ = {_scalar(s.get('barrier'), R)}: about 2Λ̂ = "
                     f"{_scalar(s.get('recommended_chains'), R, '.3g')} chains recommended")
        if "restart_rate" in s:
            lines.append(f"  restart rate    observed {_scalar(s['restart_rate'], R)} per "
                         f"iteration, finite-P theory {_scalar(s['predicted_restart_rate'], R)}"
                         f", 1/(2+2Λ̂) = {_scalar(s['asymptotic_restart_rate'], R)}")
    if R > 1:
        lines += _system_table(s, R)
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
    if s.get("nonfinite_proposals"):
        lines.append(f"  rejected non-finite proposals: {s['nonfinite_proposals']}")
    for note in (s.get("approximation_note"), s.get("log_normalizer_note")):
        if note:
            lines.append(f"  note: {note}")
    for w in s.get("warnings") or []:
        lines.append(f"  WARNING: {w}")
    for w in s.get("figure_errors") or []:
        lines.append(f"  WARNING: figure: {w}")
    if s.get("interrupted"):
        lines.append("  (interrupted: results cover the iterations completed)")
    if s.get("out"):
        lines.append(f"  results in      {s['out']}")
    return "\n".join(lines)
