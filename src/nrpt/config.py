"""Run configuration: a validated dataclass, written to and read from TOML, mirrored by the CLI."""

from __future__ import annotations

import math
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

__all__ = ["RunConfig", "to_toml"]

_SCHEMES = ("adj", "seo", "deo", "deo-w", "ape")
_EXPLORERS = ("rwmh", "mala", "hmc", "slice", "sgld", "sgd", "sghmc", "msgd", "psgld", "psgd")
_SG_EXPLORERS = ("sgld", "sgd", "sghmc", "msgd", "psgld", "psgd")
_RULES = ("auto", "metropolis", "deterministic", "bias-corrected")
_DTYPES = ("float64", "float32")


def _int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise ValueError(f"{name} must be an integer >= {low}; got {value!r}")
    if value < low:
        raise ValueError(f"{name} must be an integer >= {low}; got {value!r}")
    return int(value)


def _positive_floats(name: str, value: Any) -> float | list[float]:
    vals = value if isinstance(value, list | tuple) else [value]
    try:
        out = [float(v) for v in vals]
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be a number > 0 or a list of them; got {value!r}") from err
    if not all(v > 0 and math.isfinite(v) for v in out):
        raise ValueError(f"{name} must be > 0 and finite; got {value!r}")
    return out if isinstance(value, list | tuple) else out[0]


@dataclass
class RunConfig:
    """Everything needed to rerun a run.  Field names are the CLI flags (``_`` -> ``-``)."""

    target: str = "twenty-five-modes"
    chains: int = 10
    iterations: int = 10_000
    scheme: str = "deo"
    window: int | str = 1
    explorer: str = "rwmh"
    step_size: float | list[float] = 0.35
    leapfrog_steps: int = 10
    n_explore: int = 1
    max_temperature: float = 25.0
    temperatures: list[float] | None = None
    betas: list[float] | None = None
    systems: int = 1
    seed: int = 0
    thin: int = 1
    window_tune: int | None = None
    dtype: str = "float64"
    device: str = "cpu"
    checkpoint_every: int = 5000
    out: str | None = None
    target_options: dict[str, Any] = field(default_factory=dict)
    # -- stochastic-gradient PT (explorers sgld, sgd, sghmc, msgd, psgld, psgd; docs/sgpt.md)
    swap_rule: str = "auto"
    swap_rate: float = 0.4
    lr_min: float = 0.003
    lr_max: float = 0.6
    learning_rates: list[float] | None = None
    noise_sd: float = 0.0
    grad_noise_sd: float | None = None
    correction: float = 4.0
    adapt: bool = True
    sa_step: list[float] = field(default_factory=lambda: [50.0, 0.8, 500.0])
    bottom_temperature: float = 1.0
    batch_size: int | None = None
    vr_every: int = 0
    variance_factor: float = 1.0
    variance_every: int = 100
    momentum: float = 0.9
    domain: str | None = None
    # -- round-based adaptive NRPT (Syed et al. 2021; docs/adaptive.md, nrpt.rounds)
    rounds: int | None = None
    adapt_schedule: bool = True
    adapt_step_size: bool = True
    target_acceptance: float | None = None
    slice_method: str = "stepping-out"
    figures: bool = True

    def __post_init__(self):
        self.chains = _int("chains", self.chains, 2)
        self.iterations = _int("iterations", self.iterations, 1)
        if self.scheme not in _SCHEMES:
            raise ValueError(f"scheme must be one of {', '.join(_SCHEMES)}; got {self.scheme!r}")
        if self.window != "auto":
            self.window = _int("window", self.window, 1)
            if self.window != 1 and self.scheme != "deo-w":
                raise ValueError(f"window applies to scheme 'deo-w' (got scheme {self.scheme!r} "
                                 f"with window {self.window})")
        elif self.scheme not in ("deo", "deo-w"):
            raise ValueError("window 'auto' needs scheme 'deo-w' (or 'deo')")
        if self.explorer not in _EXPLORERS:
            raise ValueError(f"explorer must be one of {', '.join(_EXPLORERS)}; "
                             f"got {self.explorer!r}")
        self.step_size = _positive_floats("step_size", self.step_size)
        self.leapfrog_steps = _int("leapfrog_steps", self.leapfrog_steps, 1)
        self.n_explore = _int("n_explore", self.n_explore, 1)
        if not (isinstance(self.max_temperature, int | float) and self.max_temperature > 1):
            raise ValueError(f"max_temperature must be a number > 1; got {self.max_temperature!r}")
        self.systems = _int("systems", self.systems, 1)
        self.seed = _int("seed", self.seed, 0)
        self.thin = _int("thin", self.thin, 1)
        if self.thin > self.iterations:
            raise ValueError(f"thin ({self.thin}) must be <= iterations ({self.iterations})")
        if self.window_tune is not None:
            self.window_tune = _int("window_tune", self.window_tune, 1)
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}; got {self.dtype!r}")
        self.checkpoint_every = _int("checkpoint_every", self.checkpoint_every, 1)
        for name in ("temperatures", "betas"):
            v = getattr(self, name)
            if v is not None and len(v) != self.chains:
                raise ValueError(f"{name} has {len(v)} entries but chains = {self.chains}")
        if isinstance(self.step_size, list) and len(self.step_size) != self.chains:
            raise ValueError(f"step_size has {len(self.step_size)} entries but chains = "
                             f"{self.chains}")
        _validate_sg(self)
        _validate_rounds(self)

    # ---------------------------------------------------------------- TOML
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown config key(s) {unknown}; allowed: {sorted(known)}")
        return cls(**data)

    @classmethod
    def from_toml(cls, path: str | Path) -> RunConfig:
        with open(path, "rb") as fh:
            return cls.from_dict(tomllib.load(fh))

    def write_toml(self, path: str | Path) -> None:
        Path(path).write_text(to_toml(self.to_dict()))


def _number(name: str, value: Any, low: float | None = None, *, strict: bool = False,
            high: float | None = None) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if strict else value >= low
    if ok and high is not None:
        ok = value < high
    if not ok:
        rng = "" if low is None else (f" {'>' if strict else '>='} {low}")
        rng += "" if high is None else f" and < {high}"
        raise ValueError(f"{name} must be a finite number{rng}; got {value!r}")
    return float(value)


def _validate_sg(cfg: RunConfig) -> None:
    """Fields of stochastic-gradient runs (checked for every config: defaults are valid)."""
    if cfg.temperatures is not None:
        t = [float(v) for v in cfg.temperatures]
        bad = next((i for i in range(1, len(t)) if not t[i] > t[i - 1]), None)
        if bad is not None:
            raise ValueError(f"temperatures must be strictly increasing; got temperatures"
                             f"[{bad - 1}] = {t[bad - 1]} >= temperatures[{bad}] = {t[bad]}")
    if cfg.swap_rule not in _RULES:
        raise ValueError(f"swap_rule must be one of {', '.join(_RULES)}; got {cfg.swap_rule!r}")
    if cfg.explorer not in _SG_EXPLORERS and cfg.swap_rule not in ("auto", "metropolis"):
        raise ValueError(f"swap_rule {cfg.swap_rule!r} is for stochastic-gradient explorers "
                         f"({', '.join(_SG_EXPLORERS)}); explorer {cfg.explorer!r} uses "
                         "'metropolis'")
    if isinstance(cfg.swap_rate, bool) or not isinstance(cfg.swap_rate, int | float) or \
            not 0.0 < cfg.swap_rate < 1.0:
        raise ValueError(f"swap_rate S must be a number in (0, 1) (exclusive); "
                         f"got {cfg.swap_rate!r}")
    cfg.lr_min = _number("lr_min", cfg.lr_min, 0.0, strict=True)
    cfg.lr_max = _number("lr_max", cfg.lr_max, 0.0, strict=True)
    if not cfg.lr_max > cfg.lr_min:
        raise ValueError(f"lr_max ({cfg.lr_max}) must be larger than lr_min ({cfg.lr_min})")
    if cfg.learning_rates is not None:
        from .adapt_sa import check_ladder

        cfg.learning_rates = check_ladder(cfg.learning_rates)
        if len(cfg.learning_rates) != cfg.chains:
            raise ValueError(f"learning_rates has {len(cfg.learning_rates)} entries but "
                             f"chains = {cfg.chains}")
    cfg.noise_sd = _number("noise_sd", cfg.noise_sd, 0.0)
    if cfg.grad_noise_sd is not None:
        cfg.grad_noise_sd = _number("grad_noise_sd", cfg.grad_noise_sd, 0.0)
    cfg.correction = _number("correction", cfg.correction)
    if not isinstance(cfg.adapt, bool):
        raise ValueError(f"adapt must be true or false; got {cfg.adapt!r}")
    if not isinstance(cfg.sa_step, list | tuple) or len(cfg.sa_step) != 3:
        raise ValueError(f"sa_step must be [a, kappa, b] for gamma_k = a / (k^kappa + b); "
                         f"got {cfg.sa_step!r}")
    cfg.sa_step = [_number("sa_step a", cfg.sa_step[0], 0.0, strict=True),
                   _number("sa_step kappa", cfg.sa_step[1], 0.5, strict=True, high=1.0 + 1e-12),
                   _number("sa_step b", cfg.sa_step[2], 0.0, strict=True)]
    cfg.bottom_temperature = _number("bottom_temperature", cfg.bottom_temperature, 0.0)
    if cfg.batch_size is not None:
        cfg.batch_size = _int("batch_size", cfg.batch_size, 2)
    cfg.vr_every = _int("vr_every", cfg.vr_every, 0)
    cfg.variance_factor = _number("variance_factor", cfg.variance_factor, 1.0)
    cfg.variance_every = _int("variance_every", cfg.variance_every, 1)
    cfg.momentum = _number("momentum", cfg.momentum, 0.0, high=1.0)
    if cfg.domain is not None:
        from .domains import parse_domain

        parse_domain(cfg.domain)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def to_toml(data: dict[str, Any]) -> str:
    """Minimal TOML writer for flat configs with one level of tables (None values omitted)."""
    lines, tables = [], []
    for k, v in data.items():
        if v is None:
            continue
        if isinstance(v, dict):
            tables.append((k, v))
        else:
            lines.append(f"{k} = {_toml_value(v)}")
    for name, table in tables:
        lines.append(f"\n[{name}]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in table.items() if v is not None)
    return "\n".join(lines) + "\n"


_SLICE_METHODS = ("stepping-out", "doubling")


def _validate_rounds(cfg: RunConfig) -> None:
    """Fields of round-based adaptive runs (``rounds`` set; see :mod:`nrpt.rounds`)."""
    for name in ("adapt_schedule", "adapt_step_size", "figures"):
        if not isinstance(getattr(cfg, name), bool):
            raise ValueError(f"{name} must be true or false; got {getattr(cfg, name)!r}")
    if cfg.slice_method not in _SLICE_METHODS:
        raise ValueError(f"slice_method must be one of {', '.join(_SLICE_METHODS)}; "
                         f"got {cfg.slice_method!r}")
    if cfg.target_acceptance is not None:
        cfg.target_acceptance = _number("target_acceptance", cfg.target_acceptance, 0.0,
                                        strict=True, high=1.0)
    if cfg.rounds is None:
        return
    cfg.rounds = _int("rounds", cfg.rounds, 1)
    if cfg.rounds > 30:
        raise ValueError(f"rounds must be an integer in [1, 30] (round r runs 2^r iterations); "
                         f"got {cfg.rounds}")
    if cfg.window == "auto":
        raise ValueError("window 'auto' is not available with rounds; use scheme 'deo' "
                         "(or 'deo-w' with an integer window)")
    if cfg.explorer in _SG_EXPLORERS:
        raise ValueError(f"rounds (adaptive NRPT with exact swaps) needs an exact explorer "
                         f"(rwmh, mala, hmc, slice); got {cfg.explorer!r}")
    if cfg.thin > 2 ** cfg.rounds:
        raise ValueError(f"thin ({cfg.thin}) must be <= the last round's length "
                         f"2^rounds = {2 ** cfg.rounds}")
