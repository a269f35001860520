"""Stochastic-gradient parallel tempering: building DEO*-SGD / reSGLD engines from a config, the
no-swap baselines (parallel SGLD, cyclical SGLD), and histogram errors against an exact density.

DEO*-SGD (Deng et al. 2023, Algorithm 1) in nrpt's roles::

    explorer  SGD with per-slot learning rates eta_0 < ... < eta_{P-1}, Langevin noise at slot 0
              (nrpt.explorers.sgmcmc; noise temperatures [tau_1, 0, ..., 0] = NoiseLadder)
    energies  noisy oracle / minibatch / control variates              (nrpt.energy)
    scheme    DEO_W with W = ceil((log P + log log P) / -log(1 - S))   (nrpt.swap.schemes)
    rule      Ũ_{p+1} + C < Ũ_p                                        (nrpt.swap.noisy)
    adaptors  C toward the swap rate S, learning rates toward equal    (nrpt.adapt_sa)
              acceptance between fixed end points

Configurations (:class:`nrpt.config.RunConfig`) whose ``explorer`` is one of
:data:`SG_EXPLORERS` are built here by :func:`build_sg_engine` (``nrpt.build_engine`` dispatches).
Explorers ``sgd``, ``msgd``, ``psgd`` run at temperature 0 on every slot but slot 0 (whose noise
temperature is ``bottom_temperature``, 1 by default, 0 for plain SGD); ``sgld``, ``sghmc``,
``psgld`` run on a temperature ladder (``temperatures`` or geometric up to ``max_temperature``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from . import adapt_sa
from .energy import ControlVariateEnergy, EnergyEstimator, ExactEnergy, MinibatchEnergy, NoisyOracle
from .engine import PTEngine
from .explorers import Noise, ReplicaState
from .explorers.base import Density
from .explorers.sgmcmc import PSGD, PSGLD, SGD, SGHMC, SGLD, MomentumSGD, SGExplorer
from .paths import Path
from .rng import Stream, generator_for
from .swap import Metropolis, Rule, make_scheme
from .swap.noisy import BiasCorrected, Deterministic

__all__ = ["SG_EXPLORERS", "ZERO_TEMPERATURE", "NoiseLadder", "SGRun", "build_sg_engine",
           "geometric_ladder", "make_estimator", "run_chains", "grid_errors", "iid_floor",
           "HEADLINE"]

SG_EXPLORERS: dict[str, type[SGExplorer]] = {
    "sgld": SGLD, "sgd": SGD, "sghmc": SGHMC, "msgd": MomentumSGD, "psgld": PSGLD, "psgd": PSGD}
#: explorers whose slots above 0 inject no noise (temperature inaccessible, Eq. 6)
ZERO_TEMPERATURE = ("sgd", "msgd", "psgd")

#: the paper's headline run (Sec. 5.1): DEO*-SGD x P16 on the 25-mode target with a noisy oracle
HEADLINE: dict[str, Any] = {
    "target": "twenty-five-modes", "target_options": {"penalty": True}, "chains": 16,
    "iterations": 20_000, "scheme": "deo-w", "window": "auto", "explorer": "sgd",
    "noise_sd": 2.0, "lr_min": 0.003, "lr_max": 0.6, "swap_rate": 0.4, "correction": 4.0,
    "swap_rule": "auto", "adapt": True, "bottom_temperature": 1.0,
}


class NoiseLadder(Path):
    """Per-slot *noise temperatures* ``tau_p >= 0`` of stochastic-gradient explorers, as a path
    with ``b_p = 1 / tau_p`` (``inf`` for ``tau_p = 0``: no injected noise).  Energies are the
    target's (``V = U``); a ladder with infinite ``b`` has no Metropolis swap ratio (use the
    deterministic rule)."""

    kind = "temperature"
    has_reference = False

    def __init__(self, temperatures: Sequence[float], min_slots: int = 2):
        temps = [float(t) for t in temperatures]
        if len(temps) < min_slots:
            raise ValueError(f"a ladder needs at least {min_slots} slots; got {len(temps)}")
        if not all(t >= 0 and math.isfinite(t) for t in temps):
            raise ValueError(f"noise temperatures must be finite and >= 0; got {temps}")
        self.temperatures = temps
        super().__init__([math.inf if t == 0 else 1.0 / t for t in temps])

    @property
    def finite(self) -> bool:
        return all(t > 0 for t in self.temperatures)

    def components(self, target, x):
        lead = x.shape[:-1]
        v = target.energy(x.reshape(-1, x.shape[-1])).to(x.dtype).reshape(lead)
        return v, torch.zeros_like(v)

    def describe(self):
        return {"path": "noise-temperatures", "temperatures": self.temperatures}


def geometric_ladder(lo: float, hi: float, n: int) -> list[float]:
    """``n`` values from ``lo`` to ``hi`` in geometric progression (the paper's initial rates)."""
    if not (lo > 0 and hi > lo):
        raise ValueError(f"need 0 < lo < hi; got lo={lo!r}, hi={hi!r}")
    if n < 2:
        raise ValueError(f"need at least 2 values; got {n}")
    return [lo * (hi / lo) ** (p / (n - 1)) for p in range(n)]


def make_estimator(cfg, target) -> EnergyEstimator:
    """The energy estimator a config asks for: minibatch (``batch_size``; with control variates
    if ``vr_every > 0``), noisy oracle (``noise_sd > 0`` or ``grad_noise_sd > 0``) or exact."""
    if cfg.batch_size is not None:
        if not hasattr(target, "n_data") or not callable(getattr(target, "loss", None)):
            raise ValueError(f"batch_size needs a data target (with data, n_data, loss); "
                             f"{getattr(target, 'name', type(target).__name__)!r} has none")
        if cfg.vr_every:
            return ControlVariateEnergy(target, cfg.batch_size, anchor_every=cfg.vr_every)
        return MinibatchEnergy(target, cfg.batch_size)
    if cfg.vr_every:
        raise ValueError("vr_every (variance reduction) needs a minibatch energy: set batch_size")
    grad_sd = cfg.noise_sd if cfg.grad_noise_sd is None else cfg.grad_noise_sd
    if cfg.noise_sd > 0 or grad_sd > 0:
        return NoisyOracle(target, cfg.noise_sd, grad_sd)
    return ExactEnergy(target)


@dataclass
class SGRun:
    """What a stochastic-gradient engine carries besides the engine (``engine.sg``)."""

    estimator: EnergyEstimator
    explorer: SGExplorer
    rule: Rule
    window: int
    swap_rate: float
    trace: adapt_sa.SGTrace
    adaptors: list = field(default_factory=list)

    def summary(self, engine: PTEngine) -> dict[str, Any]:
        R = engine.R
        one = (lambda v: v[0]) if R == 1 else (lambda v: v)
        out: dict[str, Any] = {"rule": self.rule.name, "swap_rate_target": self.swap_rate,
                               "energy": self.estimator.describe().get("energy")}
        C = getattr(self.rule, "C", None)
        if isinstance(C, torch.Tensor):
            out["correction"] = one(C[:, 0].cpu().tolist())
        elif C is not None:
            out["correction"] = float(C)
        else:
            out["correction"] = None
        out["learning_rates"] = one(engine.step_size.cpu().tolist())
        rate = self.trace.indicator_rate()
        if rate is not None:
            out["indicator_rate"] = one(rate.cpu().tolist())
        var = engine.state.extras.get("energy_var")
        if var is not None:
            sigma = var.gather(1, engine.replica_at).clamp_min(0).sqrt()
            lo_hi = [adapt_sa.optimal_chains(sigma[s].cpu().numpy(),
                                             engine.step_size[s].cpu().numpy())
                     for s in range(R)]
            out["optimal_chains"] = one([list(v) for v in lo_hi])
        plain = engine.state.extras.get("energy_var_plain")
        if plain is not None and var is not None:
            out["variance_reduction"] = float(plain.mean() / var.mean().clamp_min(1e-300))
        return out

    def write_outputs(self, out, samples: np.ndarray, index: np.ndarray, engine: PTEngine,
                      summary: dict) -> None:
        """``adaptation.npz`` (C, learning rates, per-pair indicator rates over time) and the
        run's figures (:mod:`nrpt.plots_sgpt`)."""
        from pathlib import Path as _P

        out = _P(out)
        arrays = self.trace.arrays()
        np.savez(out / "adaptation.npz", **arrays)
        from . import plots_sgpt

        plots_sgpt.run_figures(out, samples, index, arrays, engine.target, summary)


def _initial_states(cfg, target, R: int, P: int, dtype) -> torch.Tensor:
    """The engine's default initial states, drawn here so a domain can be checked before any
    energy is evaluated."""
    g = generator_for(cfg.seed, Stream.INIT)
    if hasattr(target, "initial_states"):
        x = target.initial_states(R * P, g)
    else:
        x = torch.randn(R * P, target.dim, generator=g, dtype=dtype)
    return torch.as_tensor(x).to(cfg.device, dtype).reshape(R, P, target.dim).clone()


def build_sg_engine(cfg, target=None, rule: Rule | None = None) -> PTEngine:
    """A :class:`~nrpt.engine.PTEngine` for a stochastic-gradient config (``engine.sg`` holds
    the estimator, rule, adaptors and trace; the adaptors are in ``engine.hooks``)."""
    from .api import _DTYPES
    from .domains import parse_domain
    from .target import load_target, validate_target

    if target is None:
        target = load_target(cfg.target, **cfg.target_options)
    if validate_target(target) != "temperature":
        raise ValueError("stochastic-gradient explorers need an energy target (energy(x))")
    P, R, dtype = cfg.chains, cfg.systems, _DTYPES[cfg.dtype]
    estimator = make_estimator(cfg, target)
    if cfg.learning_rates is not None:
        lrs = adapt_sa.check_ladder(cfg.learning_rates)
    else:
        lrs = geometric_ladder(cfg.lr_min, cfg.lr_max, P)
    if cfg.explorer in ZERO_TEMPERATURE:
        temps = [cfg.bottom_temperature] + [0.0] * (P - 1)
    elif cfg.temperatures is not None:
        temps = list(cfg.temperatures)
    else:
        temps = [cfg.max_temperature ** (p / (P - 1)) for p in range(P)]
    if cfg.explorer not in ZERO_TEMPERATURE:
        adapt_sa.check_ladder(temps, "temperatures")
    path = NoiseLadder(temps)
    domain = parse_domain(cfg.domain)
    cls = SG_EXPLORERS[cfg.explorer]
    opts = {"momentum": cfg.momentum} if issubclass(cls, SGHMC) else {}
    explorer = cls(estimator, domain, **opts)

    rule_name = cfg.swap_rule
    if rule is None:
        if rule_name == "auto":
            rule_name = "deterministic" if cfg.explorer in ZERO_TEMPERATURE else "bias-corrected"
        if rule_name in ("metropolis", "bias-corrected") and not path.finite:
            raise ValueError(f"rule {rule_name!r} needs a temperature at every slot, but explorer "
                             f"{cfg.explorer!r} runs SGD (temperature 0) above slot 0; use rule "
                             f"'deterministic' or explorer 'sgld'")
        rule = {"deterministic": lambda: Deterministic(cfg.correction),
                "bias-corrected": lambda: BiasCorrected(0.0, cfg.variance_factor),
                "metropolis": Metropolis}[rule_name]()
    S = adapt_sa.check_swap_rate(cfg.swap_rate)
    window = (adapt_sa.window_from_swap_rate(P, S) if cfg.window == "auto" else int(cfg.window))
    scheme = make_scheme("deo-w" if cfg.scheme == "deo" and window != 1 else cfg.scheme, window)

    x0 = _initial_states(cfg, target, R, P, dtype)
    if domain is not None:
        domain.check_inside(x0)
    engine = PTEngine(target, path, explorer, scheme, rule, step_size=lrs, systems=R,
                      seed=cfg.seed, n_explore=cfg.n_explore, dtype=dtype, device=cfg.device,
                      initial_states=x0)
    gamma = adapt_sa.SAStepSize(*cfg.sa_step)
    adaptors: list = []
    if cfg.adapt:
        if isinstance(rule, Deterministic):
            adaptors.append(adapt_sa.CorrectionAdaptor(rule, S, gamma))
            if P >= 3:
                adaptors.append(adapt_sa.LearningRateAdaptor(S, gamma))
        if isinstance(rule, BiasCorrected):
            adaptors.append(adapt_sa.VarianceTracker(rule, every=cfg.variance_every))
    trace = adapt_sa.SGTrace(rule, every=max(1, cfg.iterations // 1000))
    engine.hooks.extend([*adaptors, trace])
    engine.sg = SGRun(estimator, explorer, rule, window, S, trace, adaptors)
    return engine


# ------------------------------------------------------------------------ no-swap baselines
def run_chains(target, explorer, *, chains: int, iterations: int, step_size, seed: int = 0,
               systems: int = 1, temperature: float = 1.0, keep=None, burn_in: int = 0,
               initial_states: torch.Tensor | None = None,
               dtype: torch.dtype = torch.float64) -> np.ndarray:
    """Independent chains without swaps (parallel SGLD x P, or one cyclical chain), batched as
    ``[systems, chains]`` with the same keyed noise as the engine.

    ``step_size`` is a number or ``[chains]`` learning rates; ``keep(k) -> bool`` selects the
    recorded iterations (default: all after ``burn_in``).  Returns ``[systems, n_kept * chains,
    dim]`` (the draws of all chains of a system pooled, chain-major within each iteration)."""
    R, n, d = int(systems), int(chains), int(target.dim)
    if initial_states is None:
        g = generator_for(seed, Stream.INIT)
        if hasattr(target, "initial_states"):
            x0 = target.initial_states(R * n, g)
        else:
            x0 = torch.randn(R * n, d, generator=g, dtype=dtype)
        x0 = torch.as_tensor(x0).to(dtype).reshape(R, n, d)
    else:
        x0 = torch.as_tensor(initial_states, dtype=dtype).reshape(R, n, d)
    path = NoiseLadder([temperature] * n, min_slots=1)
    density = Density(target, path)
    v, base = density(x0)
    state = ReplicaState(x0.clone(), v, base)
    b = path.schedule.to(dtype).expand(R, n)
    h = torch.as_tensor(step_size, dtype=dtype).expand(R, n).clone()
    keep = keep or (lambda k: k >= burn_in)
    kept = []
    for k in range(int(iterations)):
        state, _ = explorer.step(state, b, h, density, Noise(seed, k, R, n, "cpu"))
        if keep(k):
            kept.append(state.x.clone())
    if not kept:
        return np.zeros((R, 0, d))
    xs = torch.stack(kept, dim=1)  # [R, K, n, d]
    return xs.reshape(R, -1, d).cpu().numpy()


# ------------------------------------------------------------------------ errors on a grid
def grid_errors(samples: np.ndarray, edges_x: np.ndarray, edges_y: np.ndarray,
                probs: np.ndarray) -> dict[str, float]:
    """Total variation and KL between the histogram of ``samples[n, 2]`` on a grid and the exact
    cell probabilities ``probs`` (e.g. ``TwentyFiveModes.density_grid``); the mass outside the
    grid is one more cell on both sides.

    ``tv = 1/2 sum |q - p|``; ``kl = sum q log(q / p)`` = KL(histogram || exact) (finite: the exact
    density is positive everywhere; the other direction is infinite for an empty cell)."""
    x = np.asarray(samples, dtype=float)
    if x.ndim != 2 or x.shape[1] != 2 or x.shape[0] == 0:
        raise ValueError(f"samples must be [n, 2] with n >= 1; got {x.shape}")
    h, _, _ = np.histogram2d(x[:, 0], x[:, 1], bins=(edges_x, edges_y))
    q = np.append(h.ravel(), x.shape[0] - h.sum()) / x.shape[0]
    p = np.append(np.asarray(probs, dtype=float).ravel(), max(0.0, 1.0 - float(np.sum(probs))))
    p = np.maximum(p, 1e-300)
    tv = 0.5 * float(np.abs(q - p).sum())
    nz = q > 0
    kl = float(np.sum(q[nz] * np.log(q[nz] / p[nz])))
    return {"tv": tv, "kl": kl}


def iid_floor(n: int, edges_x, edges_y, probs, repeats: int = 5, seed: int = 0) -> dict:
    """Mean TV / KL of ``n`` *exact* iid draws (multinomial on the grid cells): the Monte Carlo
    floor against which the errors of ``n`` correlated draws should be read."""
    p = np.asarray(probs, dtype=float).ravel()
    p = np.append(p, max(0.0, 1.0 - p.sum()))
    p = p / p.sum()
    rs = np.random.default_rng(seed)
    tvs, kls = [], []
    for _ in range(repeats):
        q = rs.multinomial(n, p) / n
        tvs.append(0.5 * np.abs(q - p).sum())
        nz = q > 0
        kls.append(np.sum(q[nz] * np.log(q[nz] / np.maximum(p[nz], 1e-300))))
    return {"tv": float(np.mean(tvs)), "kl": float(np.mean(kls))}
