"""Run configuration: one validated dataclass, written to TOML in sections, mirrored by the CLI.

A setting belongs to one of the sections ``run``, ``ladder``, ``explorer``, ``swap``,
``adaptation``, ``energy`` and ``output`` (:data:`SECTIONS`); flags and keyword arguments use
the field names themselves (``nrpt.sample(step_size=0.5)``, ``--step-size 0.5``).

Which settings apply depends on the run (the explorer's, scheme's and rule's entries in
:mod:`nrpt.run.registry` say which fields they read).  After construction every field holds its
*resolved* value, and a field that does not apply to the run is ``None``:

* a setting the user gave (``explicit``) that does not apply is an error naming it -- never
  silently ignored (``step_size`` with explorer ``sgld``, ``noise_sd`` with an exact explorer);
* a value that came from a preset or a legacy file is a default: dropped when it does not apply.

``window`` of scheme ``deo-w`` is an integer, ``"auto"`` (W* from the rejection rate measured
in a tuning segment of ``window_tune`` iterations) or ``"swap-rate"`` (W* from the target swap
rate S: ``r = 1 - swap_rate``, Deng et al.'s Algorithm 1).

``config.toml`` files written by nrpt 0.1 (flat keys, every field written) still load: keys that
hold the old defaults are treated as defaults, the old ``window = "auto"`` of a
stochastic-gradient run becomes ``"swap-rate"`` (its old meaning), ``swap_rule = "auto"`` is
resolved; anything that still fails says how to update the file.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from nrpt.explorers.compiled import COMPILABLE
from nrpt.run import registry
from nrpt.scalars import plain as _plain

__all__ = ["RunConfig", "SECTIONS", "to_toml", "VERSION", "burn_in_count", "DEFAULT_BURN_IN"]

#: schemes under which the variational reference's bridge fires (pair (0, 1) rests on some
#: iterations): DEO and DEO_W by design, SEO at random
BRIDGED_SCHEMES = ("deo", "deo-w", "seo")
VERSION = 2
DTYPES = ("float64", "float32")
SLICE_METHODS = ("stepping-out", "doubling")
WINDOW_NAMES = ("auto", "swap-rate")
#: the warm-up fraction of a fixed-length run (``burn_in``)
DEFAULT_BURN_IN = 0.1
MAX_ROUNDS = 24  # round r runs 2^r iterations: 2^25 iterations in all at most

#: TOML sections -> the fields they hold (``target_options`` is its own table)
SECTIONS: dict[str, tuple[str, ...]] = {
    "run": ("target", "iterations", "burn_in", "rounds", "systems", "seed", "dtype", "device"),
    "ladder": ("chains", "temperatures", "betas", "max_temperature", "bottom_temperature",
               "learning_rates", "lr_min", "lr_max", "reference"),
    "explorer": ("explorer", "step_size", "leapfrog_steps", "n_explore", "slice_method",
                 "momentum", "domain", "compile", "fuse"),
    "swap": ("scheme", "window", "window_tune", "swap_rule", "swap_rate", "correction",
             "variance_factor", "variance_every"),
    "adaptation": ("adapt", "sa_step", "ladder_update", "adapt_schedule", "adapt_step_size",
                   "target_acceptance"),
    "energy": ("noise_sd", "grad_noise_sd", "batch_size", "vr_every"),
    "output": ("out", "thin", "checkpoint_every", "figures"),
}

#: what nrpt 0.1 wrote for every field it did not change (legacy files hold all fields)
LEGACY_DEFAULTS: dict[str, Any] = {
    "target": "twenty-five-modes", "chains": 10, "iterations": 10_000, "scheme": "deo",
    "window": 1, "explorer": "rwmh", "step_size": 0.35, "leapfrog_steps": 10, "n_explore": 1,
    "max_temperature": 25.0, "systems": 1, "seed": 0, "thin": 1, "dtype": "float64",
    "device": "cpu", "checkpoint_every": 5000, "swap_rule": "auto", "swap_rate": 0.4,
    "lr_min": 0.003, "lr_max": 0.6, "noise_sd": 0.0, "correction": 4.0, "adapt": True,
    "sa_step": [50.0, 0.8, 500.0], "bottom_temperature": 1.0, "vr_every": 0,
    "variance_factor": 1.0, "variance_every": 100, "momentum": 0.9, "adapt_schedule": True,
    "adapt_step_size": True, "slice_method": "stepping-out", "figures": True,
    "target_options": {},
}


# ----------------------------------------------------------------------------- checks
def _int(name: str, value: Any, low: int, high: int | None = None) -> int:
    ok = not isinstance(value, bool) and isinstance(value, int | float) and \
        (not isinstance(value, float) or math.isfinite(value)) and int(value) == value
    if ok:
        ok = value >= low and (high is None or value <= high)
    if not ok:
        rng = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be an integer {rng}; got {value!r}")
    return int(value)


def _number(name: str, value: Any, low: float | None = None, *, strict: bool = False,
            high: float | None = None, high_strict: bool = True) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if strict else value >= low
    if ok and high is not None:
        ok = value < high if high_strict else value <= high
    if not ok:
        rng = "" if low is None else f" {'>' if strict else '>='} {low}"
        rng += "" if high is None else f"{' and' if rng else ''} {'<' if high_strict else '<='} " \
                                        f"{high}"
        raise ValueError(f"{name} must be a finite number{rng}; got {value!r}")
    return float(value)


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false; got {value!r}")
    return value


def _chunk(name: str, value: Any) -> bool | int | str:
    """``"auto"``, ``true`` / ``false``, or a chunk length: an integer >= 1 (``fuse``)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value >= 1:
        return value
    if isinstance(value, str) and value == "auto":
        return value
    raise ValueError(f"{name} must be auto, true, false or a chunk length (an integer >= 1); "
                     f"got {value!r}")


def _burn_in(value: Any, iterations: int) -> float | int:
    """A fraction in [0, 1) (a float) or a count in [0, iterations - 1] (an integer): at least
    one iteration is left to sample."""
    ok = not isinstance(value, bool) and isinstance(value, int | float)
    if ok and isinstance(value, float):
        ok = math.isfinite(value) and 0.0 <= value < 1.0
    elif ok:
        ok = 0 <= value <= iterations - 1
    if not ok:
        raise ValueError(f"burn_in must be a fraction of iterations in [0, 1) (e.g. 0.1) or an "
                         f"integer count of iterations in [0, {iterations - 1}] (iterations - 1); "
                         f"got {value!r}")
    return value


def burn_in_count(cfg) -> int:
    """The warm-up iterations of a fixed-length run ``cfg`` (0 for adaptive rounds): ``burn_in``
    itself if it is an integer, else ``floor(burn_in * iterations)``, at most
    ``iterations - 1``."""
    b = getattr(cfg, "burn_in", None)
    if b is None or cfg.rounds is not None:
        return 0
    n = int(b) if isinstance(b, int) else int(math.floor(float(b) * cfg.iterations))
    return max(0, min(n, int(cfg.iterations) - 1))


def _choice(name: str, value: Any, allowed) -> str:
    allowed = list(allowed)
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
    return value


def _numbers(name: str, value: Any, n: int | None = None) -> list[float]:
    if not isinstance(value, list | tuple) or not value:
        raise ValueError(f"{name} must be a list of numbers; got {value!r}")
    out = [_number(f"{name}[{i}]", v) for i, v in enumerate(value)]
    if n is not None and len(out) != n:
        raise ValueError(f"{name} has {len(out)} entries but chains = {n}")
    return out


def _increasing(name: str, vals: list[float], first: float | None = None,
                positive: bool = True) -> list[float]:
    if first is not None and vals[0] != first:
        raise ValueError(f"{name}[0] must be {first} (slot 0 is the target); got {vals[0]}")
    for i, v in enumerate(vals):
        if positive and not v > 0:
            raise ValueError(f"{name}[{i}] must be > 0; got {v}")
    for i in range(1, len(vals)):
        if not vals[i] > vals[i - 1]:
            raise ValueError(f"{name} must be strictly increasing; got {name}[{i - 1}] = "
                             f"{vals[i - 1]} >= {name}[{i}] = {vals[i]}")
    return vals


def _betas(vals: list[float]) -> list[float]:
    if vals[0] != 1.0:
        raise ValueError(f"betas[0] must be 1 (slot 0 is the target); got {vals[0]}")
    for i, v in enumerate(vals):
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"betas[{i}] must be in [0, 1]; got {v}")
    for i in range(1, len(vals)):
        if not vals[i] < vals[i - 1]:
            raise ValueError(f"betas must be strictly decreasing from 1; got betas[{i - 1}] = "
                             f"{vals[i - 1]} <= betas[{i}] = {vals[i]}")
    return vals


def _device(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"device must be a torch device name such as cpu or cuda; got "
                         f"{value!r}")
    import torch

    try:
        dev = torch.device(value)
    except (RuntimeError, ValueError) as err:
        raise ValueError(f"device must be a torch device name such as cpu, cuda or cuda:1; "
                         f"got {value!r}") from err
    if dev.type == "cpu":
        return value
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {value!r}: CUDA is not available on this machine (torch "
                             f"{torch.__version__}); use device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {value!r}: this machine has {torch.cuda.device_count()} "
                             f"CUDA device(s)")
        return value
    if dev.type == "mps" and torch.backends.mps.is_available():
        return value
    raise ValueError(f"device must be cpu or an available accelerator (cuda, cuda:N); got "
                     f"{value!r}")


def _target(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"target must be a built-in name ({', '.join(registry.names('target'))}"
                         f") or path/to/file.py:NAME; got {value!r}")
    return value


def _window(value: Any) -> int | str:
    if isinstance(value, str):
        if value in WINDOW_NAMES:
            return value
        try:
            value = int(value)
        except ValueError:
            raise ValueError(f"window must be an integer >= 1, 'auto' (W* from the measured "
                             f"rejection rate) or 'swap-rate' (W* from swap_rate); got "
                             f"{value!r}") from None
    return _int("window", value, 1)


# ----------------------------------------------------------------------------- the config
_UNSET = None


@dataclass
class RunConfig:
    """Everything needed to rerun a run.  Field names are the CLI flags (``_`` -> ``-``).

    Fields left ``None`` take the default of the run they belong to; after construction a field
    that does not apply is ``None`` and :attr:`explicit` names the fields the user set."""

    # run
    target: str | None = None
    iterations: int | None = None
    #: warm-up of a fixed-length run, in no statistic and not in posterior.nc: a fraction of
    #: ``iterations`` in [0, 1) (default 0.1) or a count (an integer); step sizes are tuned
    #: during it (``adapt_step_size``) and frozen after it
    burn_in: float | int | None = None
    rounds: int | None = None
    systems: int | None = None
    seed: int | None = None
    dtype: str | None = None
    device: str | None = None
    target_options: dict[str, Any] | None = None
    # ladder
    chains: int | None = None
    temperatures: list[float] | None = None
    betas: list[float] | None = None
    max_temperature: float | None = None
    bottom_temperature: float | None = None
    learning_rates: list[float] | None = None
    lr_min: float | None = None
    lr_max: float | None = None
    #: the hot end of a geometric path: "prior" (default), or a Gaussian fitted between rounds
    #: -- "variational" (full-rank) / "variational-meanfield" (diagonal) -- annealed in a
    #: second leg joined to the prior leg at the target (:mod:`nrpt.paths.variational`)
    reference: str | None = None
    # explorer
    explorer: str | None = None
    step_size: float | list[float] | None = None
    leapfrog_steps: int | None = None
    n_explore: int | None = None
    slice_method: str | None = None
    compile: bool | None = None
    fuse: bool | int | str | None = None
    momentum: float | None = None
    domain: str | None = None
    # swap
    scheme: str | None = None
    window: int | str | None = None
    window_tune: int | None = None
    swap_rule: str | None = None
    swap_rate: float | None = None
    correction: float | None = None
    variance_factor: float | None = None
    variance_every: int | None = None
    # adaptation
    adapt: bool | None = None
    sa_step: list[float] | None = None
    ladder_update: str | None = None
    adapt_schedule: bool | None = None
    adapt_step_size: bool | None = None
    target_acceptance: float | None = None
    # energy (stochastic-gradient runs)
    noise_sd: float | None = None
    grad_noise_sd: float | None = None
    batch_size: int | None = None
    vr_every: int | None = None
    # output
    out: str | None = None
    thin: int | None = None
    checkpoint_every: int | None = None
    figures: bool | None = None
    #: the fields the user set (default: every field given a value)
    explicit: frozenset[str] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        given = {f.name for f in fields(self) if f.name != "explicit"
                 and getattr(self, f.name) is not None}
        if self.target_options == {}:
            given.discard("target_options")
        self.explicit = frozenset(given if self.explicit is None else set(self.explicit) & given)
        for f in fields(self):  # NumPy / torch scalars are numbers like any other
            if f.name != "explicit":
                setattr(self, f.name, _plain(getattr(self, f.name)))
        _resolve(self, given)

    # ------------------------------------------------------------------ properties
    @property
    def is_sg(self) -> bool:
        return "sg" in registry.entry("explorer", self.explorer).tags

    # ------------------------------------------------------------------ copies and dicts
    def to_dict(self) -> dict[str, Any]:
        """The resolved settings, flat (``None`` = not applicable)."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "explicit"}
        d["target_options"] = dict(d["target_options"] or {})
        return d

    def flat(self) -> dict[str, Any]:
        """The applicable settings, flat (no ``None``)."""
        return {k: v for k, v in self.to_dict().items() if v is not None}

    def replace(self, **changes: Any) -> RunConfig:
        """A copy with ``changes`` (explicit); the other settings keep their standing."""
        data = self.to_dict()
        data.update(changes)
        return RunConfig(**data, explicit=frozenset(self.explicit) | set(changes))

    def sections(self, omit: tuple[str, ...] = ()) -> dict[str, Any]:
        """The applicable settings grouped as in ``config.toml`` (less ``omit``)."""
        flat = {k: v for k, v in self.flat().items() if k not in omit}
        out: dict[str, Any] = {"version": VERSION}
        for sec, names in SECTIONS.items():
            table = {n: flat[n] for n in names if n in flat}
            if table:
                out[sec] = table
        if flat.get("target_options"):
            out["target_options"] = flat["target_options"]
        return out

    # ------------------------------------------------------------------ TOML
    @classmethod
    def from_dict(cls, data: dict[str, Any], *, defaults: dict[str, Any] | None = None
                  ) -> RunConfig:
        """From a sectioned or flat dict (a flat dict holding only field names, or a legacy
        nrpt 0.1 dict).  ``defaults`` (e.g. a preset) fill unset fields without being
        explicit: those that do not apply are dropped."""
        data = dict(data)
        if data.pop("version", None) is not None or _has_sections(data):
            data = _unsection(data)
        known = {f.name for f in fields(cls)} - {"explicit"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown config key(s) {unknown}; allowed: {sorted(known)} (in "
                             f"sections {', '.join(SECTIONS)})")
        merged = dict(defaults or {})
        merged.update({k: v for k, v in data.items() if v is not None})
        return cls(**merged, explicit=frozenset(k for k, v in data.items() if v is not None))

    @classmethod
    def from_toml(cls, path: str | Path, *, defaults: dict[str, Any] | None = None
                  ) -> RunConfig:
        path = Path(path)
        if path.is_dir():
            raise ValueError(f"config {str(path)!r} is a directory; give a TOML file (e.g. "
                             f"{path / 'config.toml'})")
        if not path.is_file():
            raise ValueError(f"config file {str(path)!r} does not exist")
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"config {str(path)!r} is not valid TOML: {err}") from None
        if "version" not in data and not _has_sections(data):
            return _from_legacy(data, path, defaults)
        return cls.from_dict(data, defaults=defaults)

    def write_toml(self, path: str | Path, omit: tuple[str, ...] = ()) -> None:
        """Write ``config.toml``; ``omit``: settings the built run turned out not to read
        (e.g. ``max_temperature`` for a target with a reference)."""
        from nrpt.run.folder import atomic_write

        atomic_write(path, to_toml(self.sections(omit)), sync=False)


def _has_sections(data: dict[str, Any]) -> bool:
    return any(isinstance(data.get(s), dict) for s in SECTIONS)


def _unsection(data: dict[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key in SECTIONS:
            if not isinstance(value, dict):
                raise ValueError(f"[{key}] must be a table of settings; got {value!r}")
            for name, v in value.items():
                if name not in SECTIONS[key]:
                    home = next((s for s, ns in SECTIONS.items() if name in ns), None)
                    where = f"; it belongs in [{home}]" if home else ""
                    raise ValueError(f"unknown key {name!r} in [{key}]{where} (allowed: "
                                     f"{', '.join(SECTIONS[key])})")
                flat[name] = v
        else:
            flat[key] = value
    return flat


def _from_legacy(data: dict[str, Any], path: Path, defaults) -> RunConfig:
    """A flat config.toml written by nrpt 0.1: keys holding the old defaults are defaults."""
    known = set(LEGACY_DEFAULTS) | {f.name for f in fields(RunConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown config key(s) {unknown} in {path}")
    sg = "sg" in registry.entry("explorer", data.get("explorer", "rwmh"), what="explorer").tags
    explicit = {k: v for k, v in data.items() if LEGACY_DEFAULTS.get(k, object()) != v}
    soft = {k: v for k, v in data.items() if k not in explicit and k != "swap_rule"}
    if explicit.get("window") == "auto" and sg:
        explicit["window"] = "swap-rate"  # nrpt 0.1's SG 'auto' was W* from the swap rate
    if explicit.get("swap_rule") == "auto":
        explicit.pop("swap_rule")
    merged = dict(defaults or {})
    merged.update(soft)
    merged.update(explicit)
    try:
        return RunConfig(**merged, explicit=frozenset(explicit))
    except ValueError as err:
        raise ValueError(
            f"{path} is a config.toml written by nrpt 0.1 (flat keys) and does not load in this "
            f"version: {err}. Update it: remove that setting (or fix it), or rewrite the file in "
            f"sections [{'], ['.join(SECTIONS)}] as this version writes them") from None


# ----------------------------------------------------------------------------- resolution
def _resolve(cfg: RunConfig, given: set[str]) -> None:
    """Fill defaults, validate, and set what does not apply to None (explicit -> error)."""
    ex = cfg.explicit
    na: dict[str, str] = {}  # field -> why it does not apply

    def default(name: str, value: Any) -> None:
        if getattr(cfg, name) is None:
            setattr(cfg, name, value)

    def not_applicable(name: str, why: str) -> None:
        na[name] = why

    # -- run
    cfg.target = _target(cfg.target or "twenty-five-modes")
    if cfg.target_options is None:
        cfg.target_options = {}
    if not isinstance(cfg.target_options, dict):
        raise ValueError(f"target_options must be a table of keyword arguments; got "
                         f"{cfg.target_options!r}")
    if cfg.rounds is not None:
        cfg.rounds = _int("rounds", cfg.rounds, 1, MAX_ROUNDS)
        not_applicable("iterations", "an adaptive run (rounds) runs 2 + 4 + ... + 2^rounds "
                                     "iterations; give rounds only")
        not_applicable("burn_in", "an adaptive run (rounds) already keeps only its last round; "
                                  "burn_in is for fixed-length runs")
    else:
        default("iterations", 10_000)
        cfg.iterations = _int("iterations", cfg.iterations, 1)
        default("burn_in", DEFAULT_BURN_IN)
        cfg.burn_in = _burn_in(cfg.burn_in, cfg.iterations)
    default("systems", 1)
    cfg.systems = _int("systems", cfg.systems, 1)
    default("seed", 0)
    cfg.seed = _int("seed", cfg.seed, 0, 2 ** 64 - 1)
    default("dtype", "float64")
    cfg.dtype = _choice("dtype", cfg.dtype, DTYPES)
    default("device", "cpu")
    cfg.device = _device(cfg.device)

    # -- explorer
    default("explorer", "slice" if cfg.rounds is not None else "rwmh")
    e = registry.entry("explorer", cfg.explorer, what="explorer")
    sg, zero = "sg" in e.tags, "zero-temperature" in e.tags
    kind = "stochastic-gradient" if sg else "exact"
    if sg and cfg.rounds is not None:
        raise ValueError(f"rounds (adaptive NRPT with exact swaps) needs an exact explorer "
                         f"({', '.join(registry.names('explorer', 'exact'))}); got explorer "
                         f"{cfg.explorer!r}")
    default("chains", 10)
    cfg.chains = _int("chains", cfg.chains, 2)
    P = cfg.chains
    default("n_explore", 1)
    cfg.n_explore = _int("n_explore", cfg.n_explore, 1)
    if sg:
        not_applicable("step_size", f"explorer {cfg.explorer!r} takes learning rates: lr_min/"
                                    "lr_max or learning_rates")
    else:
        default("step_size", 0.35)
        if isinstance(cfg.step_size, list | tuple):
            cfg.step_size = _numbers("step_size", cfg.step_size, P)
            for i, v in enumerate(cfg.step_size):
                _number(f"step_size[{i}]", v, 0.0, strict=True)
        else:
            cfg.step_size = _number("step_size", cfg.step_size, 0.0, strict=True)
    if cfg.explorer == "hmc":
        default("leapfrog_steps", 10)
        cfg.leapfrog_steps = _int("leapfrog_steps", cfg.leapfrog_steps, 1)
    else:
        not_applicable("leapfrog_steps", "leapfrog_steps is for explorer 'hmc'")
    if getattr(e.load(), "compilable", False):  # (the explorer's declaration)
        default("compile", False)
        cfg.compile = _bool("compile", cfg.compile)
        # auto: chunks run eagerly wherever nrpt.core.fused can run them (the same numbers as the
        # plain loop, fewer launches); compile = true keeps its compiled explorer step
        default("fuse", "auto")
        cfg.fuse = _chunk("fuse", cfg.fuse)
    else:
        not_applicable("compile", f"compile is for explorers {', '.join(COMPILABLE)} (a step "
                                  f"with a fixed set of draws)")
        if cfg.fuse not in ("auto", False):  # (auto and false mean the plain loop here)
            not_applicable("fuse", f"fuse is for explorers {', '.join(COMPILABLE)} (a step "
                                   f"with a fixed set of draws)")
    if cfg.explorer == "slice":
        default("slice_method", "stepping-out")
        cfg.slice_method = _choice("slice_method", cfg.slice_method, SLICE_METHODS)
    else:
        not_applicable("slice_method", "slice_method is for explorer 'slice'")
    if "momentum" in e.options:
        default("momentum", 0.9)
        cfg.momentum = _number("momentum", cfg.momentum, 0.0, high=1.0)
    else:
        not_applicable("momentum", "momentum is for explorers "
                       + ", ".join(n for n in registry.names("explorer")
                                   if "momentum" in registry.entry("explorer", n).options))
    if sg:
        if cfg.domain is not None:
            from nrpt.explorers.domains import parse_domain

            if not isinstance(cfg.domain, str):
                raise ValueError(f"domain must be box:LO,HI or ball:R; got {cfg.domain!r}")
            parse_domain(cfg.domain)
    else:
        not_applicable("domain", "domain reflects stochastic-gradient steps")

    # -- ladder
    if sg:
        for name in ("betas",):
            not_applicable(name, "stochastic-gradient explorers need an energy target and a "
                                 "temperature ladder")
        if zero:
            for name in ("temperatures", "max_temperature"):
                not_applicable(name, f"explorer {cfg.explorer!r} runs SGD (temperature 0) above "
                                     "slot 0: set bottom_temperature for slot 0")
            default("bottom_temperature", 1.0)
            cfg.bottom_temperature = _number("bottom_temperature", cfg.bottom_temperature, 0.0)
        else:
            not_applicable("bottom_temperature", "bottom_temperature is for SGD explorers "
                           + ", ".join(registry.names("explorer", "zero-temperature")))
        if cfg.learning_rates is not None:
            cfg.learning_rates = _increasing("learning_rates",
                                             _numbers("learning_rates", cfg.learning_rates, P))
            for name in ("lr_min", "lr_max"):
                not_applicable(name, "learning_rates gives the whole ladder")
        else:
            default("lr_min", 0.003)
            default("lr_max", 0.6)
            cfg.lr_min = _number("lr_min", cfg.lr_min, 0.0, strict=True)
            cfg.lr_max = _number("lr_max", cfg.lr_max, 0.0, strict=True)
            if not cfg.lr_max > cfg.lr_min:
                raise ValueError(f"lr_max ({cfg.lr_max}) must be larger than lr_min "
                                 f"({cfg.lr_min})")
    else:
        for name in ("learning_rates", "lr_min", "lr_max", "bottom_temperature"):
            not_applicable(name, f"{name} is for stochastic-gradient explorers "
                                 f"({', '.join(registry.names('explorer', 'sg'))})")
    if cfg.reference is not None:
        from nrpt.paths.variational import REFERENCES

        cfg.reference = _choice("reference", cfg.reference, REFERENCES)
        if cfg.reference == "prior":
            cfg.reference = None  # the default: a plain run, its settings unchanged
        elif sg or cfg.rounds is None:
            raise ValueError(f"reference {cfg.reference!r} is fitted between adaptive rounds: "
                             f"it needs rounds (rounds = N) and an exact explorer; got "
                             f"{'explorer ' + repr(cfg.explorer) if sg else 'no rounds'} (use "
                             f"reference 'prior')")
        elif cfg.compile:
            raise ValueError(f"reference {cfg.reference!r} does not run with compile = true "
                             f"(the compiled step would keep the old reference after a refit); "
                             f"set compile = false or reference 'prior'")
    if not (sg and zero):
        if cfg.temperatures is not None and cfg.betas is not None:
            raise ValueError("give temperatures or betas, not both")
        if cfg.temperatures is not None:
            cfg.temperatures = _increasing("temperatures",
                                           _numbers("temperatures", cfg.temperatures, P), 1.0)
        if cfg.betas is not None:
            cfg.betas = _betas(_numbers("betas", cfg.betas, P))
        if cfg.temperatures is not None or cfg.betas is not None:
            not_applicable("max_temperature", "an explicit ladder (temperatures or betas) is "
                                              "given")
        else:
            default("max_temperature", 25.0)
            cfg.max_temperature = _number("max_temperature", cfg.max_temperature, 1.0,
                                          strict=True)

    # -- swap
    default("scheme", "deo")
    cfg.scheme = _choice("scheme", cfg.scheme, registry.names("scheme"))
    if cfg.reference is not None and cfg.scheme not in BRIDGED_SCHEMES:
        raise ValueError(f"reference {cfg.reference!r} joins its two legs on the iterations where "
                         f"pair (0, 1) rests, which scheme {cfg.scheme!r} never or hardly leaves; "
                         f"use scheme {', '.join(map(repr, BRIDGED_SCHEMES))} (or reference "
                         f"'prior')")
    if cfg.scheme == "deo-w":
        default("window", "auto")
        cfg.window = _window(cfg.window)
        if cfg.window == "auto" and cfg.rounds is not None:
            raise ValueError("window 'auto' (a tuning segment) is not available with rounds; "
                             "give an integer window or window 'swap-rate'")
    else:
        not_applicable("window", f"window is for scheme 'deo-w' (scheme is {cfg.scheme!r})")
    if cfg.window == "auto":
        default("window_tune", max(1, cfg.iterations // 10))
        cfg.window_tune = _int("window_tune", cfg.window_tune, 1, cfg.iterations - 1
                               if cfg.iterations > 1 else 1)
    else:
        not_applicable("window_tune", "window_tune is the tuning segment of window 'auto'")
    rules = (["metropolis", "always"] if not sg else
             ["deterministic", "always"] if zero else
             ["bias-corrected", "metropolis", "deterministic", "always"])
    rules = [r for r in rules if r in registry.names("rule")] + \
        [r for r in registry.names("rule") if r not in ("metropolis", "deterministic",
                                                        "bias-corrected", "always")]
    default("swap_rule", rules[0])
    if cfg.swap_rule not in rules:
        why = ("exact explorers swap with exact energies" if not sg else
               f"explorer {cfg.explorer!r} runs SGD (temperature 0) above slot 0, where a "
               "Metropolis swap is undefined")
        raise ValueError(f"swap_rule must be one of {', '.join(rules)} for explorer "
                         f"{cfg.explorer!r} ({why}); got {cfg.swap_rule!r}")
    det, bc = cfg.swap_rule == "deterministic", cfg.swap_rule == "bias-corrected"
    if det:
        default("correction", 4.0)
        cfg.correction = _number("correction", cfg.correction)
        default("adapt", True)
        cfg.adapt = _bool("adapt", cfg.adapt)
    else:
        not_applicable("correction", "correction is the buffer C of swap_rule 'deterministic'")
        not_applicable("adapt", "adapt (C and learning rates) is for swap_rule 'deterministic'")
    if bc:
        default("variance_factor", 1.0)
        cfg.variance_factor = _number("variance_factor", cfg.variance_factor, 1.0)
        # control-variate energies have a variance that restarts at 0 at every anchor refresh:
        # a sigma^2 window longer than the refresh cycle over-corrects (measured bias)
        default("variance_every", cfg.vr_every if sg and cfg.vr_every else 100)
        cfg.variance_every = _int("variance_every", cfg.variance_every, 1)
    else:
        for name in ("variance_factor", "variance_every"):
            not_applicable(name, f"{name} is for swap_rule 'bias-corrected'")
    if (det and cfg.adapt) or cfg.window == "swap-rate":
        default("swap_rate", 0.4)
        if isinstance(cfg.swap_rate, bool) or not isinstance(cfg.swap_rate, int | float) or \
                not 0.0 < cfg.swap_rate < 1.0:
            raise ValueError(f"swap_rate S must be a number in (0, 1) (exclusive); got "
                             f"{cfg.swap_rate!r}")
        cfg.swap_rate = float(cfg.swap_rate)
    else:
        not_applicable("swap_rate", "swap_rate is the target of the deterministic rule's "
                                    "adaptation (adapt = true) and of window 'swap-rate'")

    # -- adaptation
    if det and cfg.adapt:
        default("sa_step", [50.0, 0.8, 500.0])
        if not isinstance(cfg.sa_step, list | tuple) or len(cfg.sa_step) != 3:
            raise ValueError(f"sa_step must be [a, kappa, b] for gamma_k = a / (k^kappa + b); "
                             f"got {cfg.sa_step!r}")
        cfg.sa_step = [_number("sa_step a", cfg.sa_step[0], 0.0, strict=True),
                       _number("sa_step kappa", cfg.sa_step[1], 0.5, strict=True, high=1.0,
                               high_strict=False),
                       _number("sa_step b", cfg.sa_step[2], 0.0, strict=True)]
        default("ladder_update", "paper")
        from nrpt.adapt.sa import check_ladder_update

        cfg.ladder_update = check_ladder_update(cfg.ladder_update)
    else:
        not_applicable("sa_step", "sa_step is the step size of the deterministic rule's "
                                  "adaptation (adapt = true)")
        not_applicable("ladder_update", "ladder_update is how the deterministic rule's "
                                        "adaptation (adapt = true) moves the learning rates")
    tunable = registry.entry("explorer", cfg.explorer).load().acceptance_order is not None
    if cfg.rounds is not None:
        default("adapt_schedule", True)
        cfg.adapt_schedule = _bool("adapt_schedule", cfg.adapt_schedule)
    else:
        not_applicable("adapt_schedule", "adapt_schedule is for adaptive runs (rounds)")
    if cfg.rounds is not None or (tunable and burn_in_count(cfg) > 0):
        default("adapt_step_size", True)
        cfg.adapt_step_size = _bool("adapt_step_size", cfg.adapt_step_size)
        if cfg.adapt_step_size and tunable:
            if cfg.target_acceptance is not None:
                cfg.target_acceptance = _number("target_acceptance", cfg.target_acceptance,
                                                0.0, strict=True, high=1.0)
        else:
            not_applicable("target_acceptance", "target_acceptance is what adapt_step_size "
                                                "aims at for rwmh, mala, hmc")
    else:
        for name in ("adapt_step_size", "target_acceptance"):
            not_applicable(name, f"{name} is for adaptive runs (rounds) and for the burn-in "
                                 f"(burn_in > 0) of fixed-length runs with explorer rwmh, mala "
                                 f"or hmc")

    # -- energy
    if sg:
        default("noise_sd", 0.0)
        cfg.noise_sd = _number("noise_sd", cfg.noise_sd, 0.0)
        if cfg.grad_noise_sd is not None:
            cfg.grad_noise_sd = _number("grad_noise_sd", cfg.grad_noise_sd, 0.0)
        if cfg.batch_size is not None:
            cfg.batch_size = _int("batch_size", cfg.batch_size, 2)
        default("vr_every", 0)
        cfg.vr_every = _int("vr_every", cfg.vr_every, 0)
    else:
        for name in ("noise_sd", "grad_noise_sd", "batch_size", "vr_every"):
            not_applicable(name, f"{name} sets the energy estimator of stochastic-gradient "
                                 f"explorers ({', '.join(registry.names('explorer', 'sg'))})")

    # -- output
    if cfg.out is not None:
        if not isinstance(cfg.out, str | Path):
            raise ValueError(f"out must be a folder path; got {cfg.out!r}")
        cfg.out = str(cfg.out)
        _check_out(Path(cfg.out))
    default("thin", 1)
    cfg.thin = _int("thin", cfg.thin, 1)
    length = cfg.iterations if cfg.rounds is None else 2 ** cfg.rounds
    if cfg.thin > length:
        what = "iterations" if cfg.rounds is None else "the last round's length 2^rounds"
        raise ValueError(f"thin ({cfg.thin}) must be <= {what} ({length})")
    default("checkpoint_every", 5000)
    cfg.checkpoint_every = _int("checkpoint_every", cfg.checkpoint_every, 1)
    default("figures", True)
    cfg.figures = _bool("figures", cfg.figures)

    # -- what does not apply
    bad = [n for n in na if n in ex and n in given]
    if bad:
        n = bad[0]
        raise ValueError(f"{n} does not apply to this {kind} run (explorer {cfg.explorer!r}, "
                         f"scheme {cfg.scheme!r}, swap_rule {cfg.swap_rule!r}"
                         f"{', rounds' if cfg.rounds is not None else ''}): {na[n]}; remove it")
    for n in na:
        setattr(cfg, n, None)


def _check_out(out: Path) -> None:
    for parent in [out, *out.parents]:
        if parent.exists():
            if not parent.is_dir():
                what = "is a file" if parent == out else f"is under the file {parent}"
                raise ValueError(f"out {str(out)!r} {what}; give a folder path")
            break


# ----------------------------------------------------------------------------- TOML writer
def to_toml(data: dict[str, Any]) -> str:
    """``config.toml``'s text: top-level keys, then one level of tables, ``None`` omitted.
    Written by ``tomli-w`` (strings with quotes, backslashes or control characters are
    escaped: whatever a setting holds reads back equal with :mod:`tomllib`)."""
    import tomli_w

    def drop_none(d: dict[str, Any]) -> dict[str, Any]:
        return {k: drop_none(v) if isinstance(v, dict) else v for k, v in d.items()
                if v is not None}

    return tomli_w.dumps(drop_none(data))
