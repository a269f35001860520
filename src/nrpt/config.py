"""Run configuration: a validated dataclass, written to and read from TOML, mirrored by the CLI."""

from __future__ import annotations

import math
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

__all__ = ["RunConfig", "to_toml"]

_SCHEMES = ("adj", "seo", "deo", "deo-w", "ape")
_EXPLORERS = ("rwmh", "mala", "hmc")
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
