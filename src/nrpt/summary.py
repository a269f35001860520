"""One summary for every kind of run: ``summary.json`` and the printed report.

The summary is the union of the recorders' reductions (statistics since the last reset: the
whole run, or the last round of an adaptive run -- ``statistics_from`` says which), the run's
facts (path, scheme, window and where it came from, rule), the theory's predictions of the
observed rates (each beside the quantity it predicts), the adaptive quantities of round-based
runs, the adapted ladder of stochastic-gradient runs, ArviZ diagnostics of the slot-0 chain, and
the health findings (:mod:`nrpt.health`), which are also emitted as Python warnings.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from . import health
from .adapt.chains import recommended_chains, recommended_chains_noisy, restart_rate_curve
from .adapt.rounds import DEFAULT_ACCEPTANCE
from .adapt.schedule import fit_barrier, update_schedule
from .diagnostics import theory
from .loop import Outcome, Run
from .recorders import json_ready, per_system

__all__ = ["build_summary", "format_summary"]


def _schedule_values(b, kind: str) -> list:
    b = np.asarray(b, dtype=float)
    return (1.0 / b).tolist() if kind == "temperature" else b.tolist()


def _predictions(rej: np.ndarray, scheme: str, window: int) -> dict[str, Any]:
    rows = []
    for r in rej:
        r = np.clip(np.nan_to_num(r, nan=0.0), 0.0, 1.0)
        try:
            rows.append(theory.predicted_rates(r, scheme, window))
        except ValueError:
            rows.append({"restarts_per_1000": None, "round_trips_a5_per_1000": None})
    R = len(rows)
    return {f"predicted_{k}": (rows[0][k] if R == 1 else [x[k] for x in rows])
            for k in ("restarts_per_1000", "round_trips_a5_per_1000")}


def build_summary(run: Run, cfg, outcome: Outcome, samples: np.ndarray) -> dict[str, Any]:
    eng, rec, facts = run.engine, run.recorders, run.facts
    R, P, K = eng.R, eng.P, eng.k
    sg = facts["sg"]
    path_kind = eng.path.kind if not sg else "noise-temperatures"
    window = outcome.notes.get("window", facts.get("window")) or 1
    scheme = eng.scheme.name
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
    s: dict[str, Any] = {
        "target": cfg.target, "target_options": dict(cfg.target_options or {}),
        "path": path_kind, "chains": P, "systems": R, "explorer": cfg.explorer,
        "scheme": cfg.scheme, "window": window, "window_source": facts.get("window_source"),
        "rule": facts.get("rule"), "seed": cfg.seed, "n_iterations": K,
        "wall_time_s": outcome.wall_time_s, "threads": outcome.notes.get("threads"),
        "iterations_per_s": K / outcome.wall_time_s if outcome.wall_time_s > 0 else None,
        "statistics_from": stats_from,
    }
    if facts.get("approximations"):  # e.g. DEO_W's gate on noisy swaps (nrpt.swap.check_gate)
        s["approximations"] = list(facts["approximations"])
    if "window_rejection" in outcome.notes:
        s["window_rejection"] = outcome.notes["window_rejection"]
    if getattr(run, "fused", None) is not None:
        s["fused"] = run.fused.describe()
    for r in rec.values():
        s.update(r.summary())
    swaps = rec["swaps"]
    rej = swaps.rejection().detach().cpu().double().numpy()
    if scheme != "none":
        s.update(_predictions(rej, scheme, window))
        mean_rej = np.nanmean(np.where(np.isnan(rej), 0.0, rej), axis=1)
        s["optimal_window_measured"] = per_system(
            [theory.optimal_window(P, min(float(x), 1 - 1e-12)) for x in mean_rej], R)
    if sg:
        # a learning-rate ladder: no temperature path, no barrier; report the ladder itself
        s.pop("explorer_acceptance", None)
        s["learning_rates"] = per_system(eng.step_size, R)
        s["noise_temperatures"] = [1.0 / b if b > 0 else math.inf
                                   for b in eng.schedule[0].tolist()]
        s["noise_temperatures"] = json_ready(s["noise_temperatures"])
        s["energy"] = facts.get("energy")
        if "C" in eng.params:
            s["correction"] = per_system(eng.params["C"][:, 0], R)
        if facts.get("rule") == "deterministic":
            s["swap_rate_target"] = cfg.swap_rate
        var = eng.state.extras.get("energy_var")
        if var is not None:
            sigma = var.gather(1, eng.replica_at).clamp_min(0).sqrt().cpu().double().numpy()
            lr = eng.step_size.cpu().double().numpy()
            ranges = []
            for i in range(R):
                try:
                    ranges.append(list(recommended_chains_noisy(sigma[i], lr[i])))
                except ValueError:  # a diverged run (non-finite sigma): no recommendation
                    ranges.append(None)
            s["recommended_chains_noisy"] = ranges[0] if R == 1 else ranges
            plain = eng.state.extras.get("energy_var_plain")
            if plain is not None:
                ratio = float(plain.mean() / var.mean().clamp_min(1e-300))
                s["variance_reduction"] = ratio if math.isfinite(ratio) else None
    else:
        s["barrier"] = per_system(swaps.barrier(), R)
        s["schedule_kind"] = "temperatures" if path_kind == "temperature" else "betas"
        s["schedule"] = _schedule_values(eng.schedule[0].cpu().numpy(), path_kind)
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
    if facts.get("legs"):
        from .variational import leg_summary

        s.update(leg_summary(run, s))
    s["slot0"] = health.slot0_diagnostics(samples) if np.asarray(samples).size else None
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
    s["adapted_schedule"] = _schedule_values(update_schedule(b[0], rej[0]), kind)


def _health(run: Run, cfg, s: dict, samples) -> list:
    eng, rec, facts = run.engine, run.recorders, run.facts
    swaps = rec["swaps"]
    exact = not facts["sg"]
    target_acc = None
    if exact and cfg.explorer in DEFAULT_ACCEPTANCE:
        target_acc = getattr(cfg, "target_acceptance", None) or DEFAULT_ACCEPTANCE[cfg.explorer]
    spread = rec.get("spread")
    hot = None
    if spread is not None and spread.n >= 2:
        j = spread.slots.index(eng.P - 1) if (eng.P - 1) in spread.slots else None
        if j is not None:
            rows = slice(0, None, 2) if facts.get("legs") else slice(None)  # prior leg's
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
            swap_acceptance=None if eng.scheme.name == "none" or not exact
            else swaps.acceptance().cpu().double().numpy(),
            restarts=None if eng.scheme.name == "none"
            else rec["round_trips"].counts()["restarts"].cpu().numpy(),
            n_iterations=n_stats, n_chains=eng.P,
            explorer_acceptance=swaps.explorer_acceptance().cpu().double().numpy()
            if target_acc is not None else None,
            explorer_target=target_acc, explorer_name=cfg.explorer,
            hot_states=hot if exact else None, reference_spread=ref_sd,
            reference_exact=eng.path.has_reference,
            slot0=slot0 if slot0 is not None and slot0.shape[1] >= 8 else None, exact=exact)
    except ValueError as err:  # never lose a run's result to a diagnostic
        return [health.Finding("health-check-failed", f"health checks could not run: {err}",
                               "report this as a bug")]
    lz = rec.get("log_z")
    if lz is not None:  # the log Z halves' self-check (nrpt.lognorm), per leg in two-leg runs
        legs = facts.get("legs")
        findings += lz.findings((lambda i: f"system {i // 2}, "
                                 f"{'variational' if i % 2 else 'prior'} leg") if legs else None)
        if legs:
            from .variational import legs_findings

            findings += legs_findings(run)
    return findings


def _fmt(v, spec=".3g") -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x, spec) for x in v) + "]"
    if isinstance(v, float):
        return format(v, spec)
    return "n/a" if v is None else str(v)


def format_summary(s: dict[str, Any]) -> str:
    """The printed report of a run (any kind)."""
    opts = s.get("target_options") or {}
    target = s["target"] + (" (" + ", ".join(f"{k}={v}" for k, v in opts.items()) + ")"
                            if opts else "")
    win = f" (W = {s['window']}, {s['window_source']})" if s["scheme"] == "deo-w" else ""
    lines = [f"nrpt: {target} | {s['path']} path, P = {s['chains']}, systems = {s['systems']}",
             f"  scheme {s['scheme']}{win}, rule {s['rule']}, explorer {s['explorer']}",
             f"  iterations      {s['n_iterations']} in {s['wall_time_s']:.2f} s"
             f" ({_fmt(s.get('iterations_per_s'), '.0f')} it/s); statistics from "
             f"{s['statistics_from']}"]
    if s["scheme"] != "none":
        lines += [
            f"  restarts        {_fmt(s['restarts'])} observed; per 1000 it "
            f"{_fmt(s['restarts_per_1000'])} vs {_fmt(s.get('predicted_restarts_per_1000'))}"
            " predicted (Syed et al. 2021 Thm 1 / Deng et al. 2023 Lemma 1)",
            f"  round trips     {_fmt(s['round_trips'])} (Syed et al.: restart, then back to the "
            f"top); appendix-A.5 (Deng et al.) {_fmt(s['round_trips_a5'])}, per 1000 it "
            f"{_fmt(s['round_trips_a5_per_1000'])} vs "
            f"{_fmt(s.get('predicted_round_trips_a5_per_1000'))} predicted (the index process "
            "solved exactly at the measured rates)",
            f"  swap acceptance {_fmt(s['swap_acceptance'], '.2f')}"]
    if "barrier" in s:
        label = "temperatures" if s["schedule_kind"] == "temperatures" else "betas"
        lines += [f"  barrier Λ̂       {_fmt(s['barrier'])}",
                  f"  {label:<15} {_fmt(s['schedule'], '.3g')}",
                  f"  explorer acc.   {_fmt(s.get('explorer_acceptance'), '.2f')}"]
    if s.get("learning_rates") is not None:
        C = s.get("correction")
        lines.append(f"  learning rates  {_fmt(s['learning_rates'], '.3g')}")
        lines.append(f"  noise temps     {_fmt(s['noise_temperatures'], '.3g')}"
                     f"; energy {s.get('energy')}")
        if C is not None:
            lines.append(f"  correction C    {_fmt(C)} (target swap rate S = "
                         f"{s.get('swap_rate_target')}); indicator rate per pair "
                         f"{_fmt(s.get('indicator_rate'), '.2f')}")
    if "log_normalizer" in s:
        label = "log Z" if s.get("log_normalizer_kind") == "log Z" else "log Z ratio"
        se = s.get("log_normalizer_se")
        se = "" if se is None else f" ± {_fmt(se, '.2g')}"
        lines.append(f"  {label:<15} {_fmt(s['log_normalizer'], '.4g')}{se}  (bridge; "
                     f"stepping-stone halves: forward "
                     f"{_fmt(s['log_normalizer_forward'], '.4g')}, reverse "
                     f"{_fmt(s['log_normalizer_reverse'], '.4g')})")
    if "barrier_variational_leg" in s:
        lines.append(f"  legs            barrier Λ̂ prior leg {_fmt(s['barrier_prior_leg'])}, "
                     f"variational leg {_fmt(s['barrier_variational_leg'])} "
                     f"({s.get('reference')}); log Z "
                     f"{_fmt(s.get('log_normalizer_prior_leg'), '.4g')} / "
                     f"{_fmt(s.get('log_normalizer_variational_leg'), '.4g')}")
    if "rounds" in s:
        lines.append(f"  adaptive        {s['rounds']} of {s['rounds_planned']} rounds; "
                     f"Λ̂ = {_fmt(s.get('barrier'))}: about 2Λ̂ = "
                     f"{_fmt(s.get('recommended_chains'))} chains recommended")
        if "restart_rate" in s:
            lines.append(f"  restart rate    observed {_fmt(s['restart_rate'])} per iteration,"
                         f" finite-P theory {_fmt(s['predicted_restart_rate'])}, "
                         f"1/(2+2Λ̂) = {_fmt(s['asymptotic_restart_rate'])}")
    slot0 = s.get("slot0")
    if slot0:
        lines.append(f"  slot 0          mean {_fmt(slot0.get('mean'))}, sd "
                     f"{_fmt(slot0.get('sd'))}, ESS bulk {_fmt(slot0.get('ess_bulk'), '.0f')}, "
                     f"R-hat {_fmt(slot0.get('r_hat'), '.3f')}")
    if s.get("nonfinite_proposals"):
        lines.append(f"  rejected non-finite proposals: {s['nonfinite_proposals']}")
    for note in (s.get("log_normalizer_note"),):
        if note:
            lines.append(f"  note: {note}")
    for w in s.get("warnings") or []:
        lines.append(f"  WARNING: {w}")
    if s.get("interrupted"):
        lines.append("  (interrupted: results cover the iterations completed)")
    if s.get("out"):
        lines.append(f"  results in      {s['out']}")
    return "\n".join(lines)
