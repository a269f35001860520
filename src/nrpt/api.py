"""``nrpt.sample``: one call from a target to a result, with an optional run folder.

A run folder holds ``config.toml`` (everything needed to rerun it), ``summary.json``,
``samples.npy``, ``energies.npy``, ``index.npy`` (see :mod:`nrpt.record`) and ``checkpoint.pt``.
Records stream into the ``.npy`` files while sampling; a checkpoint is written every
``checkpoint_every`` iterations and on Ctrl-C, and :func:`resume` continues an interrupted run
bit for bit (all randomness is keyed by the iteration counter).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .config import _SG_EXPLORERS, RunConfig
from .diagnostics import theory
from .engine import PTEngine
from .explorers import make_explorer
from .paths import make_path
from .swap import DEOW, Rule, make_rule, make_scheme
from .target import load_target, validate_target

__all__ = ["sample", "resume", "Result", "build_engine"]

_DTYPES = {"float64": torch.float64, "float32": torch.float32}


@dataclass
class Result:
    """What a run returns.  ``samples`` are the slot-0 draws (``[n, dim]``, or ``[R, n, dim]``
    with R > 1 systems); ``index`` is the index process ``[K + 1, R, P]``.  Per-system figures
    are scalars when R = 1 and lists otherwise; ``summary`` is what ``summary.json`` holds."""

    samples: np.ndarray
    energies: np.ndarray
    index: np.ndarray
    summary: dict[str, Any]
    config: RunConfig
    out: Path | None = None
    engine: PTEngine | None = field(default=None, repr=False)

    def __getattr__(self, name):
        summary = self.__dict__.get("summary", {})
        if name in summary:
            return summary[name]
        raise AttributeError(name)

    def __str__(self) -> str:
        return format_summary(self.summary)


def format_summary(s: dict[str, Any]) -> str:
    def fmt(v, spec=".3g"):
        if isinstance(v, list):
            return "[" + ", ".join(fmt(x, spec) for x in v) + "]"
        if isinstance(v, float):
            return format(v, spec)
        return str(v)

    acc = s["swap_acceptance"]
    lines = [
        f"nrpt: {s['target']} | {s['path']} path, P = {s['chains']}, scheme {s['scheme']}"
        f" (W = {s['window']}), explorer {s['explorer']}",
        f"  iterations      {s['n_iterations']} in {s['wall_time_s']:.2f} s"
        f" ({s['iterations_per_s']:.0f} it/s)",
        f"  round trips     {fmt(s['round_trips'])} (Syed)   {fmt(s['round_trips_a5'])} (A.5)",
        f"  restarts        {fmt(s['restarts'])}",
        f"  round trips/1000 it (A.5): observed {fmt(s['round_trips_per_1000'])}, "
        f"Lemma 1 predicts {fmt(s['predicted_round_trips_per_1000'])}",
        f"  barrier Λ̂       {fmt(s['barrier'])}",
        f"  swap acceptance {fmt(acc, '.2f')}",
    ]
    if s.get("learning_rates") is not None:  # stochastic-gradient runs (nrpt.sgpt)
        C = s.get("correction")
        lines.append(f"  rule            {s.get('rule')}"
                     + (f", correction C = {fmt(C)}" if C is not None else "")
                     + f", target swap rate S = {s.get('swap_rate_target')}")
        lines.append(f"  learning rates  {fmt(s['learning_rates'], '.3g')}")
    if s.get("nonfinite_proposals"):
        lines.append(f"  rejected non-finite proposals: {s['nonfinite_proposals']}")
    if s.get("interrupted"):
        lines.append("  (interrupted: figures cover the iterations completed)")
    if s.get("out"):
        lines.append(f"  results in      {s['out']}")
    return "\n".join(lines)


def build_engine(cfg: RunConfig, target=None, rule: Rule | None = None,
                 initial_states=None) -> PTEngine:
    """The engine a config describes (``target`` may be given as an object).

    ``initial_states`` is a ``[R, P, dim]`` tensor or a callable ``(target, path) -> tensor``
    (used by the adaptive driver to start from checked reference draws)."""
    if cfg.explorer in _SG_EXPLORERS:  # stochastic-gradient PT: nrpt.sgpt builds it
        from .sgpt import build_sg_engine

        return build_sg_engine(cfg, target=target, rule=rule)
    if target is None:
        target = load_target(cfg.target, **cfg.target_options)
    validate_target(target)
    path = make_path(target, cfg.chains, temperatures=cfg.temperatures, betas=cfg.betas,
                     max_temperature=cfg.max_temperature)
    options = ({"leapfrog_steps": cfg.leapfrog_steps} if cfg.explorer == "hmc" else
               {"method": cfg.slice_method} if cfg.explorer == "slice" else {})
    explorer = make_explorer(cfg.explorer, **options)
    window = 1 if cfg.window == "auto" else cfg.window
    scheme = make_scheme(cfg.scheme, window)
    step = cfg.step_size
    if path.kind == "temperature" and not isinstance(step, list):
        # a scalar step size is for slot 0; hotter slots are wider by sqrt(tau)
        step = [float(step) * math.sqrt(t) for t in path.temperatures]
    if callable(initial_states):
        initial_states = initial_states(target, path)
    return PTEngine(target, path, explorer, scheme, rule or make_rule("metropolis"),
                    step_size=step, systems=cfg.systems, seed=cfg.seed,
                    n_explore=cfg.n_explore, dtype=_DTYPES[cfg.dtype], device=cfg.device,
                    initial_states=initial_states)


def _per_system(t: torch.Tensor, R: int):
    vals = t.detach().cpu().tolist()
    return vals[0] if R == 1 else vals


def _nan_to_none(v):
    if isinstance(v, list):
        return [_nan_to_none(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def summarize(engine: PTEngine, cfg: RunConfig, wall: float, window: int,
              interrupted: bool = False) -> dict[str, Any]:
    R, P, K = engine.R, engine.P, engine.k
    acc = engine.swap_acceptance()  # [R, P-1]
    rej = (1.0 - acc).nan_to_num(nan=0.0)
    barrier = rej.sum(1)
    pred_1000, pred_T = [], []
    for s in range(R):
        r = rej[s].clamp(0.0, 1.0).tolist()
        pred_T.append(theory.lemma1_round_trip_time(r, window))
        pred_1000.append(theory.predicted_round_trips_per_1000(r, window))
    rt, rt5 = engine.tracker.round_trips, engine.tracker.round_trips_a5
    observed_T = [K * P / n if n > 0 else math.inf for n in rt5.cpu().tolist()]
    sched = engine.schedule[0].cpu().tolist()
    path = engine.path
    schedule = ([1.0 / b for b in sched] if path.kind == "temperature" else sched)
    one = (lambda v: v[0]) if R == 1 else (lambda v: v)
    summary = {
        "target": getattr(engine.target, "name", cfg.target),
        "path": path.kind,
        "chains": P,
        "systems": R,
        "scheme": cfg.scheme,
        "window": window,
        "explorer": cfg.explorer,
        "seed": cfg.seed,
        "n_iterations": K,
        "wall_time_s": wall,
        "iterations_per_s": K / wall if wall > 0 else math.inf,
        "round_trips": _per_system(rt, R),
        "round_trips_a5": _per_system(rt5, R),
        "restarts": _per_system(engine.tracker.restarts, R),
        "round_trips_per_1000": _per_system(rt5.double() * 1000.0 / max(K, 1), R),
        "restarts_per_1000": _per_system(engine.tracker.restarts.double() * 1000 / max(K, 1), R),
        "predicted_round_trips_per_1000": one(pred_1000),
        "round_trip_time": one(observed_T),
        "predicted_round_trip_time": one(pred_T),
        "swap_acceptance": _per_system(acc, R),
        "swaps_executed": _per_system(engine.pair_swaps, R),
        "barrier": _per_system(barrier, R),
        "optimal_window": one([theory.optimal_window(P, min(float(r), 1 - 1e-12))
                               for r in rej.mean(1).tolist()]),
        "schedule_kind": "temperatures" if path.kind == "temperature" else "betas",
        "schedule": schedule,
        "explorer_acceptance": _per_system(engine.explorer_acceptance(), R),
        "nonfinite_proposals": int(engine.nonfinite.sum()),
        "interrupted": interrupted,
        "out": cfg.out,
    }
    return {k: _nan_to_none(v) for k, v in summary.items()}


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _run(cfg: RunConfig, *, target=None, rule=None, progress: bool = False,
         resume_from: Path | None = None, callback=None) -> Result:
    if cfg.rounds is not None:  # round-based adaptive NRPT (Syed et al. 2021): nrpt.rounds
        from .rounds import run_config

        return run_config(cfg, target=target, rule=rule, progress=progress,
                          resume_from=resume_from, callback=callback)
    from .record import Recorder

    engine = build_engine(cfg, target=target, rule=rule)
    out = Path(cfg.out) if cfg.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        if resume_from is None:
            cfg.write_toml(out / "config.toml")
    recorder = Recorder(cfg.iterations, engine.R, engine.P, engine.dim, thin=cfg.thin,
                        out_dir=out, dtype=np.float64 if cfg.dtype == "float64" else np.float32,
                        resume=resume_from is not None)
    window = cfg.window if cfg.window != "auto" else None
    sg = getattr(engine, "sg", None)  # stochastic-gradient run (nrpt.sgpt): W fixed at build
    if sg is not None:
        window = sg.window
    tune = cfg.window_tune or max(1, cfg.iterations // 10)
    elapsed = 0.0
    if resume_from is not None:
        ck = torch.load(resume_from / "checkpoint.pt", weights_only=False)
        window, elapsed = ck["window"], ck["wall_time_s"]
        if window is not None and window != 1:
            engine.set_scheme(DEOW(window))
        engine.load_state_dict(ck["engine"])
        recorder.set_position(engine.k)
    else:
        recorder.initial(engine.slot_of)

    def checkpoint():
        if out is not None:
            recorder.flush()
            _atomic_save({"engine": engine.state_dict(), "window": window,
                          "wall_time_s": elapsed + time.perf_counter() - t0}, out / "checkpoint.pt")

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.iterations, initial=engine.k, unit="it", dynamic_ncols=True,
                   desc=f"nrpt {cfg.scheme}")
    t0 = time.perf_counter()
    interrupted = False
    try:
        while engine.k < cfg.iterations:
            if window is None and engine.k >= tune:
                # window 'auto': W* from the rejection rate measured under DEO so far
                r = float(engine.rejection_rates().nan_to_num(nan=0.0).mean().clamp(0, 1 - 1e-9))
                window = theory.optimal_window(engine.P, r)
                engine.set_scheme(DEOW(window))
            engine.step()
            x0, v0 = engine.target_slot()
            recorder.record(engine.k - 1, x0, v0, engine.slot_of)
            if engine.k % recorder.chunk == 0 or engine.k == cfg.iterations:
                if bar is not None:
                    bar.update(engine.k - bar.n)
                if callback is not None:
                    callback(engine)
            if engine.k % cfg.checkpoint_every == 0:
                checkpoint()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if bar is not None:
            bar.close()
    recorder.flush()
    wall = elapsed + time.perf_counter() - t0
    if window is None:  # auto window but the run ended inside the tuning phase
        window = 1
    summary = summarize(engine, cfg, wall, window, interrupted)
    if sg is not None:
        summary.update({k: _nan_to_none(v) for k, v in sg.summary(engine).items()})
    if out is not None:
        checkpoint()
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    rec = recorder.truncated(engine.k) if interrupted else {
        "samples": recorder.samples, "energies": recorder.energies, "index": recorder.index}
    if sg is not None and out is not None:
        sg.write_outputs(out, np.asarray(rec["samples"]), np.asarray(rec["index"]), engine,
                         summary)
    return Result(samples=np.asarray(rec["samples"]), energies=np.asarray(rec["energies"]),
                  index=np.asarray(rec["index"]), summary=summary, config=cfg, out=out,
                  engine=engine)


def sample(target="twenty-five-modes", *, progress: bool = False, rule: Rule | None = None,
           **options) -> Result:
    """Run non-reversible (or any-scheme) parallel tempering on ``target``.

    ``target`` is a built-in name, a ``"path/to/file.py:NAME"`` spec, or an object following
    the target protocol (:mod:`nrpt.target`).  ``options`` are the fields of
    :class:`~nrpt.config.RunConfig` (``chains``, ``iterations``, ``scheme``, ``window``,
    ``explorer``, ``step_size``, ``seed``, ``systems``, ``out``, ...).

    Example::

        res = nrpt.sample("twenty-five-modes", chains=10, iterations=20_000, scheme="deo")
        res.samples.shape        # (20000, 2): draws at slot 0 (the target)
        res.round_trips, res.barrier, res.swap_acceptance
    """
    obj = None
    if isinstance(target, str):
        options["target"] = target
    else:
        obj = target
        options["target"] = getattr(target, "name", type(target).__name__)
    cfg = RunConfig(**options)
    return _run(cfg, target=obj, rule=rule, progress=progress)


def resume(out: str | os.PathLike, *, progress: bool = False, target=None) -> Result:
    """Continue the run in folder ``out`` from its last checkpoint (to its configured length)."""
    out = Path(out)
    if not (out / "config.toml").exists() or not (out / "checkpoint.pt").exists():
        raise FileNotFoundError(f"{out} has no config.toml/checkpoint.pt to resume from")
    cfg = RunConfig.from_toml(out / "config.toml")
    cfg.out = str(out)
    return _run(cfg, target=target, progress=progress, resume_from=out)
