"""One builder: a :class:`~nrpt.run.config.RunConfig` -> (engine, adaptors, recorders, plan).

Every kind of run is assembled here and nowhere else; names resolve through
:mod:`nrpt.run.registry`.  The pieces, in order:

1. the target (built-in name, ``file.py:NAME`` or an object) and its path: a temperature
   ladder or a geometric path for exact explorers, a ladder of *noise temperatures* for
   stochastic-gradient explorers (``[bottom_temperature, 0, ..., 0]`` for SGD explorers);
2. the explorer (for stochastic-gradient explorers with its energy estimator and domain);
3. the scheme (``window``: an integer, ``"auto"`` = W* from a tuning segment, ``"swap-rate"`` =
   W* from ``r = 1 - swap_rate``) and the rule;
4. per-slot step sizes (learning rates) and the initial states (:func:`initial_states`);
5. adaptors: rounds (schedule, step sizes, slice widths), the window, the SA adaptors of
   DEO*-SGD, and the variance tracker that the bias-corrected rule always needs;
6. recorders: swaps, round trips, log Z (exact paths), Method I energies (rounds), spreads,
   the adaptation trace (stochastic-gradient runs) and the streamed draws;
7. the plan: the burn-in's warm-up windows (fixed-length runs; step sizes tuned between them
   and frozen after) then one segment, or a tuning segment + the main one; or rounds of
   doubling length.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nrpt.adapt.rounds import ScheduleAdaptor, SliceWidthAdaptor, StepSizeAdaptor
from nrpt.adapt.sa import (
    CorrectionAdaptor,
    LearningRateAdaptor,
    SAStepSize,
    VarianceTracker,
    check_ladder,
    check_swap_rate,
    window_from_swap_rate,
)
from nrpt.adapt.window import WindowAdaptor
from nrpt.core.engine import PTEngine
from nrpt.core.loop import Plan, Run
from nrpt.core.sharding import ShardedEngine, local_device
from nrpt.diagnostics.barrier import SlotEnergyRecorder
from nrpt.energy.estimators import make_estimator
from nrpt.explorers import Density
from nrpt.explorers.domains import parse_domain
from nrpt.paths.ladders import NoiseLadder, geometric_ladder, make_path
from nrpt.recorders.draws import Draws
from nrpt.recorders.log_z import SteppingStone
from nrpt.recorders.stats import RoundTrips, SlotSpread, SwapStats, Trace
from nrpt.rng import Stream, generator_for
from nrpt.run import registry
from nrpt.run.config import burn_in_count
from nrpt.swap import DEOW, Rule, make_scheme
from nrpt.swap.schemes import check_gate
from nrpt.targets.protocol import TargetError, fingerprint, load_target, validate_target

__all__ = ["build", "initial_states", "DTYPES"]

DTYPES = {"float64": torch.float64, "float32": torch.float32}
#: step sizes are re-tuned after each warm-up window of at least this many iterations, in at
#: most :data:`WARMUP_WINDOWS` windows (a burn-in of 1000 iterations: 8 windows of 125; of
#: 200: 4 of 50)
WARMUP_WINDOW_MIN = 50
WARMUP_WINDOWS = 8


def initial_states(target, path, R: int, P: int, seed: int, dtype, device
                   ) -> tuple[torch.Tensor, float]:
    """The one recipe for initial states ``[R, P, dim]`` and the share of reference draws
    where the target vanishes (0 unless the path has a reference).

    ``target.initial_states(n, generator)`` if defined; else, on a geometric path, reference
    draws (a draw where the log-likelihood is ``-inf`` or NaN is replaced by a finite one, and
    the share of such draws among 512 probes is reported; all bad is an error); else N(0, I)."""
    d = int(target.dim)
    g = generator_for(seed, Stream.INIT)
    share = 0.0
    drawn = path.kind == "geometric"  # reference draws start every slot of a geometric path
    if drawn:
        density = Density(target, path)
        probe = torch.as_tensor(target.reference_sample(512, generator_for(seed, Stream.INIT,
                                                                           0x5EF)))
        v, base = density(probe.to(device, dtype))
        probe_ok = torch.isfinite(v) & torch.isfinite(base)
        share = float((~probe_ok).double().mean())
        if share == 1.0 and not hasattr(target, "initial_states"):
            raise TargetError(
                "the target's log-likelihood is -inf (or NaN) at all 512 reference draws tried: "
                "the target must be positive on a part of the reference's support that has "
                "noticeable reference mass (choose a reference that covers the target)")
    if hasattr(target, "initial_states"):
        x = target.initial_states(R * P, g)
    elif drawn:
        x = torch.as_tensor(target.reference_sample(R * P, g)).to(device, dtype)
        if share > 0.0:
            v, base = density(x)
            ok = torch.isfinite(v) & torch.isfinite(base)
            good = torch.cat([x[ok], probe.to(device, dtype)[probe_ok]])
            x = torch.where(ok[:, None], x, good[torch.arange(R * P, device=device) % len(good)])
    else:
        x = torch.randn(R * P, d, generator=g, dtype=dtype)
    return torch.as_tensor(x).to(device, dtype).reshape(R, P, d).clone(), share


def _rule(cfg, finite: bool) -> Rule:
    name = cfg.swap_rule
    if name in ("metropolis", "bias-corrected") and not finite:
        raise ValueError(f"swap_rule {name!r} needs a temperature at every slot, but explorer "
                         f"{cfg.explorer!r} runs SGD (temperature 0) above slot 0; use swap_rule "
                         f"'deterministic' or explorer 'sgld'")
    if name == "deterministic":
        return registry.create("rule", name, correction=cfg.correction)
    if name == "bias-corrected":
        return registry.create("rule", name, variance=0.0, factor=cfg.variance_factor)
    return registry.create("rule", name)


def _exact_energies(sg: bool, estimator) -> bool:
    """Whether the swaps see exact energies: always for exact explorers; for stochastic-gradient
    ones with a full-batch estimator without energy noise."""
    if not sg:
        return True
    d = estimator.describe()
    if d.get("energy") == "exact":
        return True
    if d.get("energy") == "noisy-oracle":
        return not np.any(np.asarray(d.get("energy_sd", 0.0), dtype=float) > 0)
    return False


def _window(cfg, P: int) -> tuple[int, str]:
    """``(window to start with, source)``."""
    w = cfg.window
    if cfg.scheme != "deo-w":
        return 1, "scheme"
    if w == "auto":
        return 1, "auto"  # DEO during the tuning segment; WindowAdaptor sets W*
    if w == "swap-rate":
        return window_from_swap_rate(P, check_swap_rate(cfg.swap_rate)), "swap-rate"
    return int(w), "given"


def build(cfg, target=None, rule: Rule | None = None, *, out: Path | None = None,
          resume: bool = False, record: str = "target", comm=None,
          allow_gate_bias: bool = False, burn_in: int | None = None) -> Run:
    """Assemble the run ``cfg`` describes.  ``target`` / ``rule`` may be given as objects
    (``rule`` overrides ``cfg.swap_rule``); ``out`` is the run folder for streamed draws
    (``resume``: reopen them); ``record="all"`` keeps every slot's draws (no-swap baselines);
    ``comm`` (:mod:`nrpt.core.sharding`) spreads the replicas over processes (only rank 0
    stores the draws).  ``burn_in``: the warm-up iterations, overriding the config's (a
    resumption keeps its first run's count, :func:`nrpt.run.api.resume`).

    Every run (``nrpt.sample``, the CLI, config files, resumes, each process of a distributed
    run) passes :func:`nrpt.swap.schemes.check_gate` here: scheme ``deo-w`` with a window
    > 1 and Metropolis swaps on exact energies is refused (biased), and an approximate
    combination is named in ``facts["approximations"]`` (and the summary).
    ``allow_gate_bias=True`` skips the refusal: only for tests of the scheme machinery that
    compare implementations (plain vs fused loops) rather than sample."""
    if target is None:
        target = load_target(cfg.target, **(cfg.target_options or {}))
    explorer_entry = registry.entry("explorer", cfg.explorer, what="explorer")
    sg = "sg" in explorer_entry.tags
    # gradient explorers need a gradient connected to x (a NumPy energy: a silent random walk)
    probe: dict[str, Any] = {}
    kind = validate_target(target, probe=probe, gradient_for=cfg.explorer if sg or "gradient"
                           in explorer_entry.tags else None)
    P, R = int(cfg.chains), int(cfg.systems)
    dtype = DTYPES[cfg.dtype]
    device = torch.device(local_device(cfg.device) if comm is not None else cfg.device)
    explicit = getattr(cfg, "explicit", frozenset())
    facts: dict[str, Any] = {"sg": sg, "target_kind": kind,
                             "target_fingerprint": fingerprint(target, kind, probe)}

    # 1-2. path and explorer
    if sg:
        if kind != "temperature":
            raise ValueError("stochastic-gradient explorers need an energy target (energy(x)); "
                             f"{getattr(target, 'name', cfg.target)!r} is a geometric-path "
                             "target")
        if "zero-temperature" in explorer_entry.tags:
            temps = [float(cfg.bottom_temperature)] + [0.0] * (P - 1)
        else:
            temps = (list(cfg.temperatures) if cfg.temperatures is not None else
                     [cfg.max_temperature ** (p / (P - 1)) for p in range(P)])
            check_ladder(temps, "temperatures")
        path = NoiseLadder(temps)
        estimator = make_estimator(target, batch_size=cfg.batch_size, vr_every=cfg.vr_every,
                                   noise_sd=cfg.noise_sd, grad_noise_sd=cfg.grad_noise_sd)
        domain = parse_domain(cfg.domain)
        opts = {"momentum": cfg.momentum} if "momentum" in explorer_entry.options else {}
        explorer = explorer_entry.load()(estimator, domain, **opts)
        step = (check_ladder(cfg.learning_rates) if cfg.learning_rates is not None
                else geometric_ladder(cfg.lr_min, cfg.lr_max, P))
        facts["energy"] = estimator.describe().get("energy")
    else:
        if kind == "geometric" and "max_temperature" in explicit and \
                cfg.max_temperature != 25.0:  # 25 = the default a written config.toml holds
            raise ValueError("max_temperature applies to a temperature ladder; this target has a "
                             "reference (geometric path): give betas instead")
        path = make_path(target, P, temperatures=cfg.temperatures, betas=cfg.betas,
                         max_temperature=cfg.max_temperature or 25.0)
        options = ({"leapfrog_steps": cfg.leapfrog_steps} if cfg.explorer == "hmc" else
                   {"method": cfg.slice_method} if cfg.explorer == "slice" else {})
        explorer = explorer_entry.load()(**options)
        domain = None
        step = cfg.step_size
        if path.kind == "temperature" and not isinstance(step, list):
            # a scalar step size is for slot 0; hotter slots are wider by sqrt(tau)
            step = [float(step) * math.sqrt(t) for t in path.temperatures]

    # 3. scheme and rule
    window, source = _window(cfg, P)
    scheme = make_scheme(cfg.scheme, 1) if cfg.scheme != "deo-w" else DEOW(window)
    facts.update(window=window if source != "auto" else None, window_source=source)
    if rule is None:
        rule = _rule(cfg, getattr(path, "finite", True))
    facts["rule"] = rule.name
    if cfg.scheme == "deo-w":
        try:
            note = check_gate("auto" if source == "auto" else window, rule,
                              _exact_energies(sg, estimator if sg else None), source)
        except ValueError:
            if not allow_gate_bias:
                raise
            note = "scheme 'deo-w' with exact Metropolis swaps: biased (allow_gate_bias)"
        if note is not None:
            facts.setdefault("approximations", []).append(note)

    if cfg.compile:  # the explorer step as one compiled graph (explorers.compiled)
        from nrpt.explorers.compiled import Compiled

        explorer = Compiled(explorer)

    # 4. initial states and the engine
    reference = getattr(cfg, "reference", None)
    row_map, E = None, R  # how engine rows make up the user's systems (None: one row each)
    if reference is not None:
        from nrpt.paths.variational import TwoLeg

        row_map = TwoLeg(reference, R, kind=kind, path=path, comm=comm, cfg=cfg)
        E = row_map.E  # engine systems
    x0, share = initial_states(target, path, E, P, cfg.seed, dtype, device)
    facts["zero_likelihood_share"] = share
    facts["reference_normalized"] = path.has_reference and bool(
        getattr(target, "reference_is_normalized", False))
    if domain is not None:
        domain.check_inside(x0)
    if row_map is None:
        sharded = {} if comm is None else {"comm": comm}  # (nrpt.core.sharding)
        engine = (PTEngine if comm is None else ShardedEngine)(
            target, path, explorer, scheme, rule, step_size=step, systems=R, seed=cfg.seed,
            n_explore=cfg.n_explore or 1, dtype=dtype, device=device, initial_states=x0,
            **sharded)
    else:
        engine = row_map.engine(target, path, explorer, scheme, rule, step_size=step,
                               seed=cfg.seed, n_explore=cfg.n_explore or 1, dtype=dtype,
                               device=device, initial_states=x0)
        facts.update(row_map.facts(target))

    # 5. adaptors
    adaptors: list = []
    rounds = getattr(cfg, "rounds", None)
    burn = 0 if rounds is not None else burn_in_count(cfg) if burn_in is None else int(burn_in)
    tune_steps = (rounds is None and burn > 0 and bool(getattr(cfg, "adapt_step_size", None))
                  and cfg.explorer in ("rwmh", "mala", "hmc"))
    windows = max(1, min(WARMUP_WINDOWS, burn // WARMUP_WINDOW_MIN)) if tune_steps else 1
    facts.update(burn_in=burn, warmup_windows=windows if burn else 0,
                 step_size_tuned=tune_steps)
    if tune_steps:  # between the warm-up windows only: the sampling kernel is fixed
        adaptors.append(StepSizeAdaptor(cfg.explorer, cfg.target_acceptance, phase="warm-up"))
    if rounds is not None:
        schedule_adaptor = ScheduleAdaptor() if cfg.adapt_schedule else None
        if schedule_adaptor is not None:
            adaptors.append(schedule_adaptor)
        if cfg.adapt_step_size and cfg.explorer in ("rwmh", "mala", "hmc"):
            # on a temperature ladder the tuned steps follow a re-fitted schedule (sqrt(tau))
            follow = schedule_adaptor if path.kind == "temperature" else None
            adaptors.append(StepSizeAdaptor(cfg.explorer, cfg.target_acceptance,
                                            follow=follow))
        if cfg.adapt_step_size and cfg.explorer == "slice":
            adaptors.append(SliceWidthAdaptor())
    if source == "auto":
        adaptors.append(WindowAdaptor(P))
    if sg and rule.name == "deterministic" and cfg.adapt:
        gamma = SAStepSize(*cfg.sa_step)
        S = check_swap_rate(cfg.swap_rate)
        adaptors.append(CorrectionAdaptor(S, gamma))
        if P >= 3:
            adaptors.append(LearningRateAdaptor(S, gamma,
                                                ladder=getattr(cfg, "ladder_update", None)
                                                or "paper"))
    if row_map is not None:
        adaptors.append(row_map.adaptor())
    if "slot_variance" in engine.params:  # the bias-corrected rule always gets sigma^2
        adaptors.append(VarianceTracker(every=cfg.variance_every or 100))

    # 6. plan and recorders
    if rounds is not None:
        plan = Plan.rounds(rounds)
    elif source == "auto":
        plan = Plan.tuned(cfg.window_tune or max(1, cfg.iterations // 10), cfg.iterations,
                          burn, windows)
    else:
        plan = Plan.fixed(cfg.iterations, burn, windows)
    kw = {"dtype": dtype, "device": device}
    R = E  # recorders see every engine system
    recorders: dict[str, Any] = {"swaps": SwapStats(R, P, **kw),
                                 "round_trips": RoundTrips(engine.slot_of, P)}
    finite_path = bool(torch.isfinite(engine.schedule).all())
    if not sg and finite_path and P >= 2:
        recorders["log_z"] = SteppingStone(R, P, reference_normalized=facts[
            "reference_normalized"], **kw)
    if rounds is not None:
        recorders["slot_energies"] = SlotEnergyRecorder(R, P, **kw)
    slots = None if cfg.explorer == "slice" and rounds is not None else [P - 1]
    recorders["spread"] = SlotSpread(R, P, engine.dim, slots=slots, **kw)
    if sg:
        recorders["trace"] = Trace(every=max(1, plan.total // 1000))
    recorders["draws"] = Draws(plan.total, R, P, engine.dim, thin=cfg.thin, out_dir=out,
                               dtype=np.float64 if dtype == torch.float64 else np.float32,
                               resume=resume, slots=record,
                               store=comm is None or comm.rank == 0)
    if row_map is not None:
        recorders.update(row_map.recorders(**kw))
    for r in recorders.values():  # positions the recorders read every iteration
        engine.watch(getattr(r, "reads_slots", ()))
    run = Run(engine=engine, adaptors=adaptors, recorders=recorders, plan=plan, facts=facts)
    if cfg.fuse == "auto":  # eager chunks wherever they run (nrpt.core.fused.auto)
        from nrpt.core.fused import UNROLL, Fused, auto

        if auto(run, compile=bool(cfg.compile)):
            run.fused = Fused(run, unroll=UNROLL, compile=False)
    elif cfg.fuse:  # chunks of iterations at once (nrpt.core.fused), compiled with compile = true
        from nrpt.core.fused import UNROLL, Fused, why_not

        reason = why_not(run)
        if reason is not None:
            raise ValueError(f"fuse = true cannot run this configuration: {reason}; set "
                             f"fuse = false")
        unroll = UNROLL if cfg.fuse is True else int(cfg.fuse)
        run.fused = Fused(run, unroll=unroll, compile=bool(cfg.compile))
    facts["fused"] = run.fused is not None
    return run
