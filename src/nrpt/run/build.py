"""One builder: a :class:`~nrpt.run.config.RunConfig` -> (engine, adaptors, recorders, plan);
every kind of run is assembled here, names resolving through :mod:`nrpt.run.registry`:
target and path, explorer, scheme and rule, step sizes and initial states, adaptors,
recorders, and the plan (warm-up windows + one segment, tuning + main, or rounds)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nrpt.adapt.metric import MetricAdaptor, resolve_mode
from nrpt.adapt.rounds import ScheduleAdaptor, own_tuning
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
from nrpt.paths import GAUSSIAN_REFERENCES as GAUSSIAN
from nrpt.paths.ladders import GeometricPath, NoiseLadder, geometric_ladder, make_path
from nrpt.paths.starts import is_point_start
from nrpt.recorders.draws import Draws
from nrpt.recorders.log_z import SteppingStone
from nrpt.recorders.stats import RoundTrips, SlotSpread, SwapStats, Trace
from nrpt.recorders.tails import TailAcceptance
from nrpt.rng import Stream, generator_for
from nrpt.run import registry
from nrpt.run.config import burn_in_count
from nrpt.swap import DEOW, Rule
from nrpt.swap.schemes import check_gate
from nrpt.targets.protocol import (
    TargetError,
    capabilities,
    fingerprint,
    load_target,
    optional_value,
    validate_target,
)

__all__ = ["build", "initial_states", "DTYPES"]

DTYPES = {"float64": torch.float64, "float32": torch.float32}
#: step sizes are re-tuned after each warm-up window of at least this many iterations, in at
#: most :data:`WARMUP_WINDOWS` windows (a burn-in of 1000 iterations: 8 windows of 125; of
#: 200: 4 of 50)
WARMUP_WINDOW_MIN = 50
WARMUP_WINDOWS = 8
#: the metric of a Laplace start counts as this many rows per dimension when the rounds'
#: estimates are pooled with it (:attr:`nrpt.adapt.metric.MetricAdaptor.prior_rows`)
LAPLACE_ROWS_PER_DIM = 10


def initial_states(target, path, R: int, P: int, seed: int, dtype, device,
                   drawn: bool | None = None) -> tuple[torch.Tensor, float]:
    """The one recipe for initial states ``[R, P, dim]`` and the share of reference draws
    where the target vanishes (0 unless the path has a reference).

    ``target.initial_states(n, generator)`` if defined (where the target declares ``starts =
    "point"`` -- one point jittered -- on a temperature path: independent overdispersed draws
    around the mode found from that point, :mod:`nrpt.paths.starts`); else, on a geometric
    path, reference draws (a draw where the log-likelihood is ``-inf`` or NaN is replaced by a
    finite one, and the share of such draws among 512 probes is reported; all bad is an
    error); else N(0, I)."""
    d = int(target.dim)
    own = capabilities(target).has("initial_states")
    g = generator_for(seed, Stream.INIT)
    share = 0.0
    if drawn is None:  # reference draws start every slot of a geometric path
        drawn = path.kind == "geometric"
    if drawn:
        density = Density(target, path)
        probe = torch.as_tensor(target.reference_sample(512, generator_for(seed, Stream.INIT,
                                                                           0x5EF)))
        v, base = density(probe.to(device, dtype))
        probe_ok = torch.isfinite(v) & torch.isfinite(base)
        share = float((~probe_ok).double().mean())
        if share == 1.0 and not own:
            raise TargetError(
                "the target's log-likelihood is -inf (or NaN) at all 512 reference draws tried: "
                "the target must be positive on a part of the reference's support that has "
                "noticeable reference mass (choose a reference that covers the target)")
    if own and path.kind == "temperature" and is_point_start(target):
        x = _overdispersed(target, path, R * P, g)
    elif own:
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


def _overdispersed(target, path, n: int, g: torch.Generator) -> torch.Tensor:
    """Independent overdispersed starts for a target whose own are one point jittered
    (``starts = "point"``, e.g. PyMC's initial point): :func:`nrpt.paths.starts.
    overdispersed_states` from that point, else (no Laplace approximation) its own starts."""
    from nrpt.paths.starts import overdispersed_states

    point = getattr(target, "initial_point", None)
    x0 = (torch.as_tensor(point()) if callable(point) else
          torch.as_tensor(target.initial_states(1, generator_for(0, Stream.INIT, 0x0D1)))[0])
    x = overdispersed_states(target, path, n, g, x0.double().cpu())
    return target.initial_states(n, g) if x is None else x


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
          allow_gate_bias: bool = False, burn_in: int | None = None,
          explorer=None, scheme=None, adaptors=(), recorders=(), chains: int | None = None) -> Run:
    """Assemble the run ``cfg`` describes.

    ``target`` / ``rule`` / ``explorer`` / ``scheme`` objects override ``cfg``'s names;
    ``adaptors`` and ``recorders`` run after the run's own.  ``out``: the folder for streamed
    draws (``resume``: reopen them); ``record="all"`` keeps every slot's draws; ``comm``
    (:mod:`nrpt.core.sharding`) spreads replicas over processes; ``burn_in`` overrides the
    config's.  Every run passes :func:`nrpt.swap.schemes.check_gate` (refuses ``deo-w`` with a
    window > 1 and Metropolis swaps on exact energies; names approximations in
    ``facts["approximations"]``) unless ``allow_gate_bias=True`` (tests comparing
    implementations only).  ``adapt_step_size`` with an explorer that cannot tune itself is
    refused.  ``chains``: the ladder's size now, where a ``chains = "auto"`` run being resumed
    grew it (:func:`grown_chains`; the tables are then the checkpoint's)."""
    # (explorer, scheme, rule and adaptors built from the config: a user's cannot be keyed by
    # it; a target object may be given -- the API loads the config's own -- and is keyed by
    # its fingerprint, which refuses a class or function from outside nrpt)
    own_parts = all(o is None for o in (rule, explorer, scheme)) and not adaptors
    if chains is not None and int(chains) != cfg.chains:
        start = cfg.chains
        cfg = cfg.replace(chains=int(chains))
    else:
        start = cfg.chains
    if target is None:
        target = load_target(cfg.target, **(cfg.target_options or {}))
    entry = registry.entry("explorer", cfg.explorer, what="explorer")
    facts = _target_facts(cfg, target, entry)
    dtype = DTYPES[cfg.dtype]
    device = torch.device(local_device(cfg.device) if comm is not None else cfg.device)
    facts["reference"] = _reference(cfg, target, facts)
    if facts["sg"]:
        path, explorer, step, estimator = _sg_parts(cfg, target, entry, explorer, facts)
    else:
        path, explorer, step = _exact_parts(cfg, target, entry, explorer, facts)
        estimator = None
    if explorer.target_acceptance is not None:  # (the health check's explorer target)
        facts["target_acceptance"] = (getattr(cfg, "target_acceptance", None)
                                      or explorer.target_acceptance)
    scheme, rule, source = _scheme_and_rule(cfg, path, rule, scheme, estimator,
                                            allow_gate_bias, facts)
    tuned = explorer
    if cfg.compile:  # the explorer step as one compiled graph (explorers.compiled)
        from nrpt.explorers.compiled import Compiled

        explorer = Compiled(explorer)
    engine, refit = _engine(cfg, target, path, explorer, scheme, rule, step, comm, dtype,
                            device, facts)
    burn = 0 if cfg.rounds is not None else burn_in_count(cfg) if burn_in is None else \
        int(burn_in)
    own, windows = _adaptors(cfg, tuned, path, rule, source, engine, burn, refit, facts)
    grow = _chains_adaptor(cfg, comm, record, facts, start)
    plan = _plan(cfg, source, burn, windows)
    kept = _recorders(cfg, engine, plan, [*own, *adaptors], facts, out=out, resume=resume,
                      record=record, comm=comm, dtype=dtype, device=device)
    for r in recorders:
        name = getattr(r, "name", "") or type(r).__name__
        if name in kept:
            raise ValueError(f"recorders: a recorder named {name!r} is already in the run; "
                             f"give yours another name")
        kept[name] = r
        facts.setdefault("own_summary", []).append(name)  # (its summary() under its name)
    for r in kept.values():  # positions the recorders read every iteration
        engine.watch(getattr(r, "reads_slots", ()))
    run = Run(engine=engine, adaptors=[*own, *adaptors, *grow], recorders=kept, plan=plan,
              facts=facts)
    if grow:
        _check_followers(run)
    _fuse(run, cfg)
    if run.fused is not None and run.fused.compile and comm is None and own_parts:
        # the objects a compiled chunk closes over were built from the config (or are a
        # target, fingerprinted): its compiled chunk may be saved and loaded by later
        # processes (nrpt.core.precompile)
        from nrpt.core.precompile import config_digest

        run.fused.precompile_config = config_digest(cfg.to_dict())
    return run


def grown_chains(checkpoint: dict | None) -> int | None:
    """The ladder's size in a checkpoint (``None`` without one): a ``chains = "auto"`` run
    resumes at the size it grew to."""
    if not checkpoint:
        return None
    x = (checkpoint.get("engine") or {}).get("x")
    return None if x is None else int(x.shape[1])


def _chains_adaptor(cfg, comm, record: str, facts, start: int) -> list:
    """``[ChainsAdaptor]`` where ``max_chains`` is set (``chains = "auto"``), after refusing
    what cannot grow; else ``[]``."""
    cap = getattr(cfg, "max_chains", None)
    floor = getattr(cfg, "min_chains", None)
    if cap is None and floor is not None:  # shrinking only: never above where it started
        cap = int(start)
    facts["max_chains"] = cap
    facts["min_chains"] = floor
    if cap is None:
        return []
    why = None
    if comm is not None:
        why = "a run spread over processes (its replica blocks are fixed)"
    elif facts.get("row_map") is not None or getattr(cfg, "reference", None) not in (
            None, *GAUSSIAN):
        why = f"reference {cfg.reference!r} (its two legs keep a ladder each)"
    elif record == "all":
        why = "record='all' (draws of every slot, a fixed width)"
    elif cfg.temperatures is not None or cfg.betas is not None:
        why = "an explicit ladder (temperatures / betas): give max_temperature instead"
    elif isinstance(cfg.step_size, list):
        why = "one step size per slot: give one number"
    if why is not None:
        raise ValueError(f"chains = 'auto' (max_chains / min_chains) changes the ladder between "
                         f"rounds, which {why} cannot follow; give a fixed number of chains")
    from nrpt.adapt.rounds import ChainsAdaptor

    facts["chains_start"] = int(start)
    return [ChainsAdaptor(max(cap, 3), min_chains=floor)]


def _check_followers(run: Run) -> None:
    """Every adaptor and recorder of a growing ladder must carry its per-slot tables to the new
    slots (``follow_ladder``); name those that cannot."""
    stuck = [f"{kind} {getattr(o, 'name', type(o).__name__)!r}"
             for kind, objs in (("adaptor", run.adaptors), ("recorder", run.recorders.values()))
             for o in objs if not callable(getattr(o, "follow_ladder", None))]
    if stuck:
        raise ValueError(f"chains = 'auto' (max_chains) grows the ladder between rounds, but "
                         f"{', '.join(stuck)} cannot follow it (no follow_ladder(slot_map)); give "
                         f"a fixed number of chains")


def _target_facts(cfg, target, entry) -> dict[str, Any]:
    """The target's kind (validated; gradient explorers need a gradient connected to x, a
    NumPy energy would be a silent random walk) and fingerprint, as the run's first facts."""
    sg = "sg" in entry.tags
    probe: dict[str, Any] = {}
    kind = validate_target(target, probe=probe, gradient_for=cfg.explorer if sg or "gradient"
                           in entry.tags else None)
    return {"sg": sg, "target_kind": kind, "target_fingerprint": fingerprint(target, kind, probe)}


def _sg_parts(cfg, target, entry, explorer, facts):
    """``(noise ladder, explorer, learning rates, energy estimator)`` of a stochastic-gradient
    run; an explorer object without an estimator gets the configured one."""
    P = int(cfg.chains)
    if facts["target_kind"] != "temperature":
        name = optional_value(target, "name", cfg.target)
        raise ValueError("stochastic-gradient explorers need an energy target (energy(x)); "
                         f"{name!r} is a geometric-path target")
    if "zero-temperature" in entry.tags:
        temps = [float(cfg.bottom_temperature)] + [0.0] * (P - 1)
    else:
        temps = (list(cfg.temperatures) if cfg.temperatures is not None else
                 [cfg.max_temperature ** (p / (P - 1)) for p in range(P)])
        check_ladder(temps, "temperatures")
    if explorer is None or getattr(explorer, "estimator", None) is None:
        estimator = make_estimator(target, batch_size=cfg.batch_size, vr_every=cfg.vr_every,
                                   noise_sd=cfg.noise_sd, grad_noise_sd=cfg.grad_noise_sd)
    else:
        estimator = explorer.estimator
    if explorer is None:
        opts = {"momentum": cfg.momentum} if "momentum" in entry.options else {}
        explorer = entry.load()(estimator, parse_domain(cfg.domain), **opts)
    else:
        explorer.estimator = estimator
    step = (check_ladder(cfg.learning_rates) if cfg.learning_rates is not None
            else geometric_ladder(cfg.lr_min, cfg.lr_max, P))
    facts["energy"] = estimator.describe().get("energy")
    return NoiseLadder(temps), explorer, step, estimator


def _reference(cfg, target, facts) -> str | None:
    """The run's ``reference``: the setting, else an energy target's ``default_reference``
    (:mod:`nrpt.paths.gaussian_reference`; ``'gaussian'`` becomes ``'gaussian-fixed'`` without
    rounds) unless the run chose a temperature ladder (``temperatures``, a ``max_temperature``
    other than the default 25), compiles its step or uses a stochastic-gradient explorer."""
    if cfg.reference is not None or facts["target_kind"] != "temperature" or facts["sg"]:
        return cfg.reference
    want = optional_value(target, "default_reference")
    if want is None:
        return None
    if want not in GAUSSIAN:
        raise TargetError(f"target.default_reference must be one of {', '.join(GAUSSIAN)}; "
                          f"got {want!r}")
    chose = (cfg.temperatures is not None or cfg.compile or (
        "max_temperature" in getattr(cfg, "explicit", frozenset())
        and cfg.max_temperature not in (None, 25.0)))
    if chose:
        facts["default_reference_skipped"] = (
            f"the target's default_reference {want!r} is not used: this run chose a "
            f"temperature ladder (temperatures / max_temperature) or compile = true")
        return None
    facts["reference_from_target"] = True
    return "gaussian-fixed" if cfg.rounds is None else want


def _exact_parts(cfg, target, entry, explorer, facts):
    """``(path, explorer, step sizes)`` of an exact run: a scalar step size is for slot 0 of a
    temperature ladder, hotter slots wider by ``sqrt(tau)``."""
    kind = facts["target_kind"]
    if kind == "geometric" and "max_temperature" in getattr(cfg, "explicit", frozenset()) and \
            cfg.max_temperature != 25.0:  # 25 = the default a written config.toml holds
        raise ValueError("max_temperature applies to a temperature ladder; this target has a "
                         "reference (geometric path): give betas instead")
    if facts["reference"] in GAUSSIAN:  # energy(x) annealed from a Gaussian
        path = (GeometricPath(cfg.betas) if cfg.betas is not None
                else GeometricPath.linear(int(cfg.chains)))
        if path.n_slots != int(cfg.chains):
            raise ValueError(f"the ladder has {path.n_slots} slots but chains = {cfg.chains}")
    else:
        path = make_path(target, int(cfg.chains), temperatures=cfg.temperatures,
                         betas=cfg.betas, max_temperature=cfg.max_temperature or 25.0)
    if explorer is None:
        fields = {"leapfrog_steps": "leapfrog_steps", "slice_method": "method",
                  "max_doublings": "max_doublings", "max_tree_depth": "max_tree_depth",
                  "noise_dtype": "noise_dtype"}
        explorer = entry.load()(**{arg: getattr(cfg, f) for f, arg in fields.items()
                                   if f in entry.options})
    step = cfg.step_size
    if path.kind == "temperature" and not isinstance(step, list):
        step = [float(step) * math.sqrt(t) for t in path.temperatures]
    return path, explorer, step


def _scheme_and_rule(cfg, path, rule, scheme, estimator, allow_gate_bias: bool, facts):
    """``(scheme, rule, window source)``; every run passes DEO_W's gate check here."""
    window, source = _window(cfg, int(cfg.chains))
    if scheme is None:
        scheme = registry.make_scheme(cfg.scheme, 1) if cfg.scheme != "deo-w" else DEOW(window)
    elif source == "given":
        window = int(getattr(scheme, "window", 1))
    facts.update(window=window if source != "auto" else None, window_source=source)
    if rule is None:
        rule = _rule(cfg, getattr(path, "finite", True))
    facts["rule"] = rule.name
    if cfg.scheme == "deo-w":
        try:
            note = check_gate("auto" if source == "auto" else window, rule,
                              _exact_energies(facts["sg"], estimator), source)
        except ValueError:
            if not allow_gate_bias:
                raise
            note = "scheme 'deo-w' with exact Metropolis swaps: biased (allow_gate_bias)"
        if note is not None:
            facts.setdefault("approximations", []).append(note)
    return scheme, rule, source


def _engine(cfg, target, path, explorer, scheme, rule, step, comm, dtype, device, facts):
    """``(engine, [the row map's adaptor])`` with the initial states; a variational reference
    (:class:`nrpt.paths.variational.TwoLeg`) makes its own engine over two rows per system."""
    R, P = int(cfg.systems), int(cfg.chains)
    reference = facts["reference"]
    if reference in GAUSSIAN:
        return _gaussian_engine(cfg, target, path, explorer, scheme, rule, step, comm, dtype,
                                device, facts)
    row_map, E = None, R  # how engine rows make up the user's systems (None: one row each)
    if reference is not None:
        from nrpt.paths.variational import TwoLeg

        row_map = TwoLeg(reference, R, kind=facts["target_kind"], path=path, comm=comm,
                         cfg=cfg)
        E = row_map.E  # engine systems
    x0, share = initial_states(target, path, E, P, cfg.seed, dtype, device)
    facts["zero_likelihood_share"] = share
    if path.kind == "temperature" and not facts["sg"] and \
            getattr(explorer, "domain", None) is None:
        _refuse_improper_hot_end(target, path, x0[0, 0])
    facts["reference_normalized"] = (path.has_reference
                                     and capabilities(target).reference_is_normalized)
    if getattr(explorer, "domain", None) is not None:
        explorer.domain.check_inside(x0)
    common = dict(step_size=step, seed=cfg.seed, n_explore=cfg.n_explore or 1, dtype=dtype,
                  device=device, initial_states=x0)
    if row_map is None:
        if comm is None:
            return PTEngine(target, path, explorer, scheme, rule, systems=R, **common), []
        return ShardedEngine(target, path, explorer, scheme, rule, systems=R, comm=comm,
                             **common), []
    engine = row_map.engine(target, path, explorer, scheme, rule, **common)
    facts.update(row_map.facts(target))
    return engine, [row_map.adaptor()]


def _gaussian_engine(cfg, target, path, explorer, scheme, rule, step, comm, dtype, device,
                     facts):
    """``(engine, [its refit adaptor])`` of a density-only target annealed from a Gaussian
    (:mod:`nrpt.paths.gaussian_reference`): initial states as a temperature ladder's (the
    target's own or N(0, I)), the initial Gaussian set from them."""
    from nrpt.paths.gaussian_reference import GaussianRef, whitened_step

    ref = GaussianRef(facts["reference"], int(cfg.systems), kind=facts["target_kind"], path=path,
                      comm=comm, cfg=cfg)
    x0, _ = initial_states(target, path, int(cfg.systems), int(cfg.chains), cfg.seed, dtype,
                           device, drawn=False)
    facts["zero_likelihood_share"] = 0.0
    start, metric = _laplace_start(cfg, target, explorer, path, x0, ref)
    if start is not None:
        x0 = start.x.to(x0)
        facts["laplace_start"] = start.note()
        given = "step_size" in getattr(cfg, "explicit", frozenset())
        first = None if given else whitened_step(explorer, int(target.dim))
        if first is not None:
            step = first
    if getattr(explorer, "domain", None) is not None:
        explorer.domain.check_inside(x0)
    engine = ref.engine(target, path, explorer, scheme, rule, step_size=step, seed=cfg.seed,
                        n_explore=cfg.n_explore or 1, dtype=dtype, device=device,
                        initial_states=x0, start=start)
    if metric is not None:
        engine.set_metric(metric.to(dtype).expand(engine.R, *metric.shape).clone())
    facts.update(ref.facts())
    return engine, ref.adaptors()


def _laplace_start(cfg, target, explorer, path, x0, ref):
    """``(LaplaceStart or None, per-slot metric [P, ...] or None)``: a refitted Gaussian
    reference with a preconditioner (``precondition`` not ``"none"``, a preconditionable
    explorer) on a target with a gradient starts from the Laplace fit at its mode(s)
    (:func:`nrpt.paths.gaussian_reference.laplace_start`): ``q0``, the starts, the metric."""
    from nrpt.paths.gaussian_reference import laplace_start

    mode = resolve_mode(getattr(cfg, "precondition", None) or "none", int(target.dim))
    inner = getattr(explorer, "inner", explorer)
    grad = capabilities(target).has("grad_energy") or hasattr(target, "energy_and_grad") \
        or getattr(inner, "uses_gradient", False)
    if not ref.fitted or mode == "none" or not getattr(inner, "preconditionable", False) \
            or not grad:
        return None, None
    start = laplace_start(target, x0, generator_for(cfg.seed, Stream.INIT, 0x1A9))
    if start is None:
        return None, None
    return start, start.metric(path.betas, mode)


def _refuse_improper_hot_end(target, path, x0: torch.Tensor) -> None:
    """A temperature ladder whose hottest density ``exp(-U / max_temperature)`` is improper
    (:func:`nrpt.paths.proper.hot_end_check`, e.g. flat priors) is refused before sampling,
    with the ``max_temperature`` that fixes it."""
    from nrpt.paths.proper import hot_end_check

    beta = float(path.schedule.min())
    hot = hot_end_check(target, path, x0.detach().cpu().double(), beta)
    if hot is None:
        return
    names = getattr(target, "coordinate_names", None)
    try:
        names = list(names() if callable(names) else names) if names is not None else None
    except TypeError:
        names = None
    name = names[hot.coordinate] if names and len(names) == int(target.dim) else None
    raise TargetError(f"temperature ladder: {hot.message(name)}")


def _own_tuning(cfg, explorer, phase: str | None, follow=None):
    """The explorer's own step-size adaptor (``adapt_step_size``), or a ValueError where it
    declares none (never a setting silently ignored)."""
    adaptor = own_tuning(explorer, getattr(cfg, "target_acceptance", None), phase, follow)
    if adaptor is None:
        where = "in a warm-up" if phase is not None else "between rounds"
        raise ValueError(f"adapt_step_size: explorer {cfg.explorer!r} declares no step-size "
                         f"tuning {where} (Explorer.step_adaptor / acceptance_order); set "
                         f"adapt_step_size = false")
    return adaptor


def _adaptors(cfg, explorer, path, rule, source: str, engine, burn: int, refit: list, facts):
    """``(the run's adaptors, warm-up windows)``: step sizes in the warm-up or rounds (the
    explorer's own), the schedule, the window, the SA adaptors of DEO*-SGD, ``refit`` (the
    variational reference's), and the variance tracker that the bias-corrected rule always
    needs."""
    adaptors, windows = _tuning(cfg, explorer, path, burn, facts, engine.dim)
    if source == "auto":
        adaptors.append(WindowAdaptor(int(cfg.chains)))
    if facts["sg"]:
        adaptors += _sa_adaptors(cfg, explorer, rule, facts)
    adaptors += refit
    if "slot_variance" in engine.params:  # the bias-corrected rule always gets sigma^2
        adaptors.append(VarianceTracker(every=cfg.variance_every or 100))
    return adaptors, windows


def _tuning(cfg, explorer, path, burn: int, facts, dim: int) -> tuple[list, int]:
    """Between the warm-up windows of a fixed-length run (the sampling kernel is then fixed),
    or between rounds: the schedule, the per-slot preconditioner (``precondition``) and the
    explorer's own step-size tuning (on a temperature ladder the steps follow the re-fitted
    schedule; after a new metric they restart from its step ratio)."""
    adaptors: list = []
    tune = cfg.rounds is None and burn > 0 and bool(getattr(cfg, "adapt_step_size", None))
    if tune:
        adaptors.append(_own_tuning(cfg, explorer, "warm-up"))
    windows = max(1, min(WARMUP_WINDOWS, burn // WARMUP_WINDOW_MIN)) if tune else 1
    facts.update(burn_in=burn, warmup_windows=windows if burn else 0, step_size_tuned=tune)
    if cfg.rounds is not None:
        schedule = ScheduleAdaptor() if cfg.adapt_schedule else None
        adaptors += [schedule] if schedule is not None else []
        mode = resolve_mode(getattr(cfg, "precondition", None) or "none", dim)
        inner = getattr(explorer, "inner", explorer)
        switch = inner if hasattr(inner, "switched") else None
        if switch is not None and mode == "none":  # (the switch is the metric adaptor's)
            raise ValueError(f"explorer {switch.name!r} switches to HMC between rounds "
                             f"through the preconditioner's adaptor: give precondition 'auto', "
                             f"'diagonal' or 'dense' (got {cfg.precondition!r}), or explorer "
                             f"'mala' / 'hmc'")
        metric = (MetricAdaptor(mode, dim, gate=explorer.acceptance_order is not None,
                                switch=switch) if mode != "none" else None)
        if metric is not None:  # (the summary's preconditioner section)
            facts["precondition"] = mode
            if facts.get("laplace_start"):  # (its metric stands for LAPLACE_ROWS rows per dim)
                metric.seed_rows(LAPLACE_ROWS_PER_DIM * dim)
        adaptors += [metric] if metric is not None else []
        if cfg.adapt_step_size:
            step = _own_tuning(cfg, explorer, None, follow=schedule if path.kind ==
                               "temperature" else None)
            if metric is not None and hasattr(step, "metric_from"):
                step.metric_from = metric
            if metric is not None and hasattr(step, "tuner"):  # (robust tuning: lane B)
                # (after a Laplace start the step begins near its optimum in whitened units:
                # the 10x moves only chase the noise of the first, 2-iteration rounds)
                step.tuner.fast = not facts.get("laplace_start")
            adaptors.append(step)
    return adaptors, windows


def _sa_adaptors(cfg, explorer, rule, facts) -> list:
    """DEO*-SGD's online adaptation (the deterministic rule with ``adapt``): the correction
    and, from 3 slots, the learning rates; and the method's name the explorer declares."""
    method = getattr(explorer, "method_names", {}).get(rule.name)
    if method:
        facts["method"] = method
    if rule.name != "deterministic" or not cfg.adapt:
        return []
    gamma, S = SAStepSize(*cfg.sa_step), check_swap_rate(cfg.swap_rate)
    out: list = [CorrectionAdaptor(S, gamma)]
    if int(cfg.chains) >= 3:
        out.append(LearningRateAdaptor(S, gamma, ladder=getattr(cfg, "ladder_update", None)
                                       or "paper"))
    return out


def _plan(cfg, source: str, burn: int, windows: int) -> Plan:
    if cfg.rounds is not None:
        return Plan.rounds(cfg.rounds)
    if source == "auto":
        return Plan.tuned(cfg.window_tune or max(1, cfg.iterations // 10), cfg.iterations,
                          burn, windows)
    return Plan.fixed(cfg.iterations, burn, windows)


def _recorders(cfg, engine, plan: Plan, adaptors, facts, *, out, resume, record, comm, dtype,
               device) -> dict[str, Any]:
    """Swaps, round trips, log Z (exact finite paths), Method I energies (rounds), spreads
    (every slot where an adaptor asks, ``spread_slots = "all"``), the adaptation trace
    (stochastic-gradient runs), the streamed draws, the row map's own (two legs)."""
    R, P, sg = engine.R, engine.P, facts["sg"]  # R: every engine system
    kw = {"dtype": dtype, "device": device}
    recorders: dict[str, Any] = {"swaps": SwapStats(R, P, **kw),
                                 "round_trips": RoundTrips(engine.slot_of, P)}
    if not sg and bool(torch.isfinite(engine.schedule).all()) and P >= 2:
        recorders["log_z"] = SteppingStone(R, P, reference_normalized=facts[
            "reference_normalized"], **kw)
    if cfg.rounds is not None:
        recorders["slot_energies"] = SlotEnergyRecorder(R, P, **kw)
        if not sg:  # slot 0's acceptance in each coordinate's tails (health: tail-acceptance)
            recorders["tail_acceptance"] = TailAcceptance(R, engine.dim, device=device)
    every = any(getattr(a, "spread_slots", None) == "all" for a in adaptors)
    cov = any(getattr(a, "spread_covariance", False) for a in adaptors)
    recorders["spread"] = SlotSpread(R, P, engine.dim, slots=None if every else [P - 1],
                                     covariance=cov, **kw)
    if sg:
        recorders["trace"] = Trace(every=max(1, plan.total // 1000))
    recorders["draws"] = Draws(plan.total, R, P, engine.dim, thin=cfg.thin, out_dir=out,
                               dtype=np.float64 if dtype == torch.float64 else np.float32,
                               resume=resume, slots=record,
                               store=comm is None or comm.rank == 0)
    row_map = facts.get("row_map")
    if row_map is not None:
        recorders.update(row_map.recorders(**kw))
    if facts.get("hot_end") is not None:
        recorders.update(facts["hot_end"].recorders(**kw))
    return recorders


def _fuse(run: Run, cfg) -> None:
    """Chunks of iterations at once (:mod:`nrpt.core.fused`): ``auto`` where they run eagerly
    with the plain loop's numbers; ``true`` (compiled with ``compile = true``) or refused."""
    if cfg.fuse == "auto":
        from nrpt.core.fused import Fused, auto, auto_unroll

        if auto(run, compile=bool(cfg.compile)):
            run.fused = Fused(run, unroll=auto_unroll(run.engine), compile=False, ragged=True)
    elif cfg.fuse:
        from nrpt.core.fused import UNROLL, Fused, why_not

        reason = why_not(run)
        if reason is not None:
            raise ValueError(f"fuse = true cannot run this configuration: {reason}; set "
                             f"fuse = false")
        unroll = UNROLL if cfg.fuse is True else int(cfg.fuse)
        run.fused = Fused(run, unroll=unroll, compile=bool(cfg.compile))
        if cfg.compile:
            # the iterations outside chunks (up to the first multiple of the chunk length,
            # around checkpoints and callbacks, the tail) take the plain step: compiling it
            # too cost every process a second compilation for those few iterations
            from nrpt.explorers.compiled import Compiled

            if isinstance(run.engine.explorer, Compiled):
                run.engine.explorer = run.engine.explorer.inner
    run.facts["fused"] = run.fused is not None
