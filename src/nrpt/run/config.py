"""Run configuration: :class:`nrpt.options.Option` s declared by the components that read them
(central ones in :data:`CENTRAL`), resolved into one frozen :class:`RunConfig`, written to
TOML in sections (:func:`section_table`), mirrored by the CLI and keyword arguments.

After construction every setting holds its resolved value, ``None`` where it does not apply;
a user-given setting that does not apply is an error naming it, a preset's is dropped.
``window`` of ``deo-w``: an integer, ``"auto"`` (W* from a tuning segment of ``window_tune``
iterations) or ``"swap-rate"`` (``r = 1 - swap_rate``, Deng et al.'s Algorithm 1).
``config.toml`` has ``version = 2``; other versions are refused, none means 2."""

from __future__ import annotations

import math
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from nrpt.options import (
    BOOL_WORDS,
    SECTION_NAMES,
    Option,
    boolean,
    check_int,
    check_numbers,
    choice,
    increasing,
    integer,
    number,
    parse_bool,
    parse_float,
    parse_floats,
    parse_int,
)
from nrpt.paths import GAUSSIAN_REFERENCES
from nrpt.run import registry
from nrpt.scalars import plain as _plain

__all__ = ["RunConfig", "CENTRAL", "section_table", "known_options", "to_toml", "VERSION",
           "burn_in_count", "DEFAULT_BURN_IN"]

#: schemes under which the variational reference's bridge fires (pair (0, 1) rests on some
#: iterations): DEO and DEO_W by design, SEO at random
BRIDGED_SCHEMES = ("deo", "deo-w", "seo")
VERSION = 2
DTYPES = ("float64", "float32")
#: the warm-up fraction of a fixed-length run (``burn_in``)
DEFAULT_BURN_IN = 0.1
MAX_ROUNDS = 24  # round r runs 2^r iterations: 2^25 iterations in all at most
#: the roles whose chosen component's options apply (``explorer``, ``scheme``, ``swap_rule``)
COMPONENTS = {"explorer": "explorer", "scheme": "scheme", "rule": "swap_rule"}


# ----------------------------------------------------------------------------- central checks
def _burn_in(name: str, value: Any, cfg) -> float | int:
    """A fraction in [0, 1) (a float) or a count in [0, iterations - 1] (an integer): at least
    one iteration is left to sample."""
    iterations = cfg.iterations
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


#: ``chains = "auto"``: the ladder it starts from, and the default cap of its growth
AUTO_CHAINS = 8
AUTO_MAX_CHAINS = 64


def _chains(name: str, value: Any, cfg=None) -> int:
    """An integer >= 2 (``"auto"`` is resolved before: :func:`_explorer_settings`)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        raise ValueError(f"{name} = 'auto' grows the ladder between adaptive rounds: give "
                         f"rounds too (or an integer number of chains >= 2)")
    return check_int(name, value, 2, None)


def _parse_chains(text: str) -> int | str:
    t = text.strip().lower()
    return "auto" if t == "auto" else _parse_int_or_fail(text)


def _parse_int_or_fail(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(text) from None


_parse_chains.what = "an integer >= 2 or auto"  # type: ignore[attr-defined]


def _chunk(name: str, value: Any, cfg=None) -> bool | int | str:
    """``"auto"``, ``true`` / ``false``, or a chunk length: an integer >= 1 (``fuse``)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value >= 1:
        return value
    if isinstance(value, str) and value == "auto":
        return value
    raise ValueError(f"{name} must be auto, true, false or a chunk length (an integer >= 1); "
                     f"got {value!r}")


def _figures(name: str, value: Any, cfg=None) -> bool | str:
    """``true`` (the run's main figures), ``false`` (none) or ``"all"`` (with the trace and
    rank plots too)."""
    if isinstance(value, bool) or value == "all":
        return value
    raise ValueError(f"{name} must be true, false or all; got {value!r}")


def _temperatures(name: str, value: Any, cfg) -> list[float]:
    return increasing(name, check_numbers(name, value, cfg.chains), 1.0)


def _betas(name: str, value: Any, cfg) -> list[float]:
    vals = check_numbers(name, value, cfg.chains)
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


def _device(name: str, value: Any, cfg=None) -> str:
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


def _target(name: str, value: Any, cfg=None) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"target must be a built-in name ({', '.join(registry.names('target'))}"
                         f"), path/to/file.py:NAME or path/to/model.stan; got {value!r}")
    return value


def _swap_rate(name: str, value: Any, cfg=None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 < value < 1.0:
        raise ValueError(f"swap_rate S must be a number in (0, 1) (exclusive); got {value!r}")
    return float(value)


def _out(name: str, value: Any, cfg=None) -> str:
    if not isinstance(value, str | Path):
        raise ValueError(f"out must be a folder path; got {value!r}")
    out = Path(value)
    for parent in [out, *out.parents]:
        if parent.exists():
            if not parent.is_dir():
                what = "is a file" if parent == out else f"is under the file {parent}"
                raise ValueError(f"out {str(out)!r} {what}; give a folder path")
            break
    return str(value)


def _references():
    from nrpt.paths.variational import REFERENCES

    return REFERENCES




def _parse_burn_in(text: str):
    """An integer count ("500") or a fraction ("0.1")."""
    try:
        return int(text)
    except ValueError:
        return float(text)


def _parse_figures(text: str) -> bool | str:
    low = text.strip().lower()
    return "all" if low == "all" else parse_bool(text)


def _parse_fuse(text: str) -> bool | int | str:
    low = text.strip().lower()
    if low == "auto":
        return "auto"
    if low in BOOL_WORDS and low not in ("0", "1"):  # a number is a chunk length
        return BOOL_WORDS[low]
    return int(text)


_parse_burn_in.what = "a fraction in [0, 1) or an integer count"  # type: ignore[attr-defined]
_parse_figures.what = "true/false (yes/no, on/off, 1/0) or all"  # type: ignore[attr-defined]
_parse_fuse.what = ("auto, true/false (yes/no, on/off) or a chunk "  # type: ignore[attr-defined]
                    "length >= 1")


def _S(section: str):
    """Option constructors for one section."""
    return lambda name, check, **kw: Option(name, check, section=section, **kw)


_run, _ladder, _explorer, _swap, _adapt, _output = (
    _S("run"), _S("ladder"), _S("explorer"), _S("swap"), _S("adaptation"), _S("output"))

#: the settings that span components (declared here, not on one component's class)
CENTRAL: tuple[Option, ...] = (
    _run("target", _target, default="twenty-five-modes",
         help="built-in target name, path/to/file.py:NAME (see `nrpt list targets`) or "
              "path/to/model.stan (a Stan program; its data: --data FILE.json)"),
    _run("iterations", integer(1), default=10_000, parse=parse_int,
         help="number of PT iterations (explore + swap)"),
    _run("burn_in", _burn_in, default=DEFAULT_BURN_IN, parse=_parse_burn_in,
         help="warm-up of a fixed-length run, in no statistic and not in posterior.nc: a "
              "fraction of --iterations in [0, 1) (default 0.1) or a count (an integer); "
              "rwmh/mala/hmc step sizes are tuned during it and then frozen"),
    _run("rounds", integer(1, MAX_ROUNDS), parse=parse_int,
         help="adaptive NRPT in N rounds of 2, 4, ..., 2^N iterations (replaces --iterations); "
              "the schedule is re-fitted between rounds, the report uses the last round; the "
              "explorer defaults to slice"),
    _run("systems", integer(1), default=1, parse=parse_int,
         help="independent PT systems run side by side (repeats)"),
    _run("seed", integer(0, 2 ** 64 - 1), default=0, parse=parse_int,
         help="run seed in [0, 2^64) (runs are bit-for-bit reproducible on one machine)"),
    _run("dtype", choice(DTYPES), default="float64", choices=DTYPES,
         help="floating-point precision"),
    _run("device", _device, default="cpu", help="torch device: cpu, cuda, cuda:N"),
    _ladder("chains", _chains, default=10, parse=_parse_chains,
            help="number of slots P on the ladder (>= 2), or auto (with --rounds): start from "
                 f"{AUTO_CHAINS} and grow the ladder between rounds while the estimated barrier "
                 "asks for more (about 2 Λ̂ chains), up to --max-chains"),
    _ladder("max_chains", integer(3), parse=parse_int,
            help=f"with --rounds: grow the ladder between rounds up to this many chains while "
                 f"the barrier estimate asks for more than it has (chains = auto sets it to "
                 f"{AUTO_MAX_CHAINS}); unset: the ladder keeps its chains"),
    _ladder("min_chains", integer(2), parse=parse_int,
            help="with --rounds: shrink the ladder between rounds down to this many chains "
                 "(>= 2) while the barrier estimate asks for clearly fewer than it has (about "
                 "1 + 2 Λ̂ chains: each pair rejecting at most 1/2), and grow it back where a "
                 "pair rejects more; a Stan program's defaults set it to 2 (with chains = auto); "
                 "unset: the ladder never shrinks"),
    _ladder("temperatures", _temperatures, parse=parse_floats,
            help="explicit temperature ladder, comma-separated, starting at 1"),
    _ladder("betas", _betas, parse=parse_floats,
            help="explicit geometric-path schedule, comma-separated, from 1 down to 0"),
    _ladder("max_temperature", number(1.0, strict=True), default=25.0, parse=parse_float,
            help="hottest temperature of the default geometric temperature ladder"),
    _ladder("reference", choice(_references), choices=_references,
            help="hot end of a geometric path: prior (default), or with --rounds a Gaussian "
                 "fitted to the target draws between rounds, full-rank (variational) or "
                 "diagonal (variational-meanfield), annealed in a second leg joined to the "
                 "prior leg at the target; for targets with energy(x) only: gaussian (one "
                 "leg from a Gaussian refitted between rounds, with --rounds) or "
                 "gaussian-fixed (a broad Gaussian set from the initial states)"),
    _explorer("explorer", choice(lambda: registry.names("explorer")),
              choices=lambda: registry.names("explorer"),
              help="local move (exact: rwmh, mala, hmc, slice, automala, nuts; "
                   "stochastic-gradient: the rest)"),
    _explorer("n_explore", integer(1), default=1, parse=parse_int,
              help="explorer steps per iteration"),
    _explorer("compile", boolean, default=False, parse=parse_bool,
              help="run the explorer step (rwmh, mala, hmc, and the stochastic-gradient "
                   "explorers without control variates) as one torch.compile graph: faster "
                   "iterations after a compilation of seconds; each step equals the plain one "
                   "to rounding (a deterministic-rule run then diverges from the plain run "
                   "after a flipped verdict: the same chain in law, not the same numbers); "
                   "falls back to the plain step (true/false)"),
    # auto: chunks run eagerly wherever nrpt.core.fused can run them (the same numbers as the
    # plain loop, fewer launches); compile = true keeps its compiled explorer step
    _explorer("fuse", _chunk, default="auto", parse=_parse_fuse,
              help="run the iterations in chunks (explore, swap, adapt, record) as one "
                   "function, one torch.compile graph with --compile: fewer launches per "
                   "iteration; true = chunks of 8, or a chunk length (16: faster, twice the "
                   "compilation); one process, schemes deo/deo-w/seo; auto (default): eager "
                   "chunks where they run (up to 128 iterations on small states, 8 on large), "
                   "the same numbers as the plain loop (auto/true/false/N)"),
    _swap("scheme", choice(lambda: registry.names("scheme")), default="deo",
          choices=lambda: registry.names("scheme"), help="swap scheme"),
    _swap("swap_rule", choice(lambda: registry.names("rule")),
          choices=lambda: registry.names("rule"),
          help="swap rule (default: metropolis for exact explorers, deterministic for "
               "sgd/msgd/psgd, bias-corrected for sgld/sghmc/psgld)"),
    _swap("swap_rate", _swap_rate, default=0.4, parse=parse_float,
          help="target swap rate S in (0, 1) of the C and learning-rate adaptors; also sets "
               "W = ceil((log P + log log P) / -log(1 - S)) for --window swap-rate"),
    _adapt("adapt_schedule", boolean, default=True, parse=parse_bool,
           help="with --rounds: re-fit the schedule between rounds (true/false)"),
    _adapt("adapt_step_size", boolean, default=True, parse=parse_bool,
           help="with --rounds: tune rwmh/mala/hmc step sizes (slice widths) between rounds; "
                "in a fixed-length run: tune rwmh/mala/hmc step sizes during the burn-in "
                "(true/false, default true)"),
    _adapt("target_acceptance", number(0.0, strict=True, high=1.0), parse=parse_float,
           help="explorer acceptance aimed at by --adapt-step-size (default 0.3 rwmh, 0.574 "
                "mala, 0.65 hmc)"),
    _output("out", _out, help="run folder (config.toml, summary.json, samples.npy, index.npy, "
                              "checkpoint.pt, posterior.nc, figures)"),
    _output("thin", integer(1), default=1, parse=parse_int,
            help="record every thin-th target-slot draw"),
    _output("checkpoint_every", integer(1), default=5000, parse=parse_int,
            help="write a checkpoint every this many iterations"),
    _output("figures", _figures, default=False, parse=_parse_figures,
            help="with --out: draw the figures at the run's end: false (default: none; "
                 "`nrpt figures DIR` draws them later, byte for byte the same), true (the "
                 "main ones: index process, swap acceptance, density of 1-/2-D targets, "
                 "adaptation, local barrier; swap acceptance not beside the adaptation, whose "
                 "last panel draws the pairs' swap rates) or all (with those, the index "
                 "process's zoom on its last iterations and the trace and rank plots too)"),
)


# ----------------------------------------------------------------------------- the declarations
def declarations() -> Iterator[tuple[Option, str | None, list[str]]]:
    """Every option with its owner: ``(option, None, [])`` for :data:`CENTRAL`, then
    ``(option, role, [the names of that role that read it])`` for the components' options,
    each once, in registration order."""
    for o in CENTRAL:
        yield o, None, []
    for role in COMPONENTS:
        owners: dict[str, tuple[Option, list[str]]] = {}
        for n in registry.names(role):
            for o in registry.entry(role, n).declared:
                if owners.setdefault(o.name, (o, []))[0] is not o:
                    _twice(o, f"{role} {n!r}")
                owners[o.name][1].append(n)
        for o, names in owners.values():
            yield o, role, names


def _twice(o: Option, who: str) -> NoReturn:
    raise ValueError(f"option {o.name!r} of {who} is declared twice with different checks; "
                     f"share one nrpt.options.Option (e.g. nrpt.explorers.base.STEP_SIZE)")


def known_options() -> dict[str, Option]:
    """Name -> option, for every setting a :class:`RunConfig` takes; two declarations of one
    name must be the same :class:`~nrpt.options.Option` (share it, e.g. ``STEP_SIZE``)."""
    out: dict[str, Option] = {}
    for o, role, names in declarations():
        if out.setdefault(o.name, o) is not o:
            _twice(o, f"{role} {', '.join(names)}")
    return out


def section_table() -> dict[str, tuple[str, ...]]:
    """The ``config.toml`` tables -> the settings they hold (``target_options`` is its own
    table), from the declarations."""
    opts = known_options().values()
    return {s: tuple(o.name for o in opts if o.section == s) for s in SECTION_NAMES}


def __getattr__(name: str):  # ``SECTIONS``: the tables of the components registered so far
    if name == "SECTIONS":
        return section_table()
    raise AttributeError(name)


# ----------------------------------------------------------------------------- the config
class RunConfig:
    """Everything needed to rerun a run, resolved and frozen.  Setting names are the CLI flags
    (``_`` -> ``-``) and the keyword arguments; :func:`known_options` lists them.

    A setting left unset takes the default of the run it belongs to; after construction one
    that does not apply is ``None`` and :attr:`explicit` names the settings the user set.  The
    annotations below are the resolved types of the central settings; a component's options
    are attributes too (``cfg.leapfrog_steps``).  Change a setting with :meth:`replace`."""

    target: str
    target_options: dict[str, Any]
    #: ``None`` with ``rounds``
    iterations: int | None
    #: warm-up of a fixed-length run, in no statistic and not in posterior.nc: a fraction of
    #: ``iterations`` in [0, 1) (default 0.1) or a count (an integer); step sizes are tuned
    #: during it (``adapt_step_size``) and frozen after it
    burn_in: float | int | None
    rounds: int | None
    systems: int
    seed: int
    dtype: str
    device: str
    chains: int
    #: grow the ladder between rounds up to this many chains (``chains = "auto"``); ``None``:
    #: the ladder keeps its ``chains``
    max_chains: int | None
    #: shrink the ladder between rounds down to this many chains where the barrier estimate
    #: asks for clearly fewer (:class:`nrpt.adapt.rounds.ChainsAdaptor`); ``None``: never
    min_chains: int | None
    temperatures: list[float] | None
    betas: list[float] | None
    max_temperature: float | None
    #: the hot end of a geometric path: ``None`` (the prior), or a Gaussian fitted between
    #: rounds -- "variational" (full-rank) / "variational-meanfield" (diagonal) -- annealed in a
    #: second leg joined to the prior leg at the target (:mod:`nrpt.paths.variational`)
    reference: str | None
    explorer: str
    n_explore: int
    compile: bool | None
    fuse: bool | int | str | None
    scheme: str
    swap_rule: str
    swap_rate: float | None
    adapt_schedule: bool | None
    adapt_step_size: bool | None
    target_acceptance: float | None
    out: str | None
    thin: int
    checkpoint_every: int
    figures: bool | str
    #: the settings the user set (default: every setting given a value)
    explicit: frozenset[str]

    def __init__(self, *, explicit: frozenset[str] | set[str] | None = None,
                 **settings: Any) -> None:
        known = known_options()
        unknown = sorted(set(settings) - set(known) - {"target_options"})
        if unknown:
            raise TypeError(f"RunConfig got unknown setting(s) {unknown}; allowed: "
                            f"{sorted(known)}")
        # NumPy / torch scalars are numbers like any other
        values = {n: _plain(settings.get(n)) for n in (*known, "target_options")}
        given = {n for n, v in values.items() if v is not None}
        if values["target_options"] == {}:
            given.discard("target_options")
        self.__dict__.update(values, _names=tuple(known))
        self.__dict__["explicit"] = frozenset(given if explicit is None
                                              else set(explicit) & given)
        _resolve(self, given)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"a RunConfig is resolved and frozen; use cfg.replace({name}=...)")

    def __getattr__(self, name: str) -> Any:  # (only reached for names that are no setting)
        raise AttributeError(f"RunConfig has no setting {name!r}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunConfig) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RunConfig({', '.join(f'{k}={v!r}' for k, v in self.flat().items())})"

    # ------------------------------------------------------------------ properties
    @property
    def is_sg(self) -> bool:
        return "sg" in registry.entry("explorer", self.explorer).tags

    # ------------------------------------------------------------------ copies and dicts
    def to_dict(self) -> dict[str, Any]:
        """The resolved settings, flat (``None`` = not applicable)."""
        d = {n: self.__dict__[n] for n in self.__dict__["_names"]}
        d["target_options"] = dict(self.target_options or {})
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
        for sec, names in section_table().items():
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
        """From a sectioned dict (``config.toml``'s tables, ``version`` optional) or a flat
        one holding only setting names.  ``defaults`` (e.g. a preset) fill unset settings
        without being explicit: those that do not apply are dropped."""
        data = dict(data)
        version = data.pop("version", None)
        if version is not None and version != VERSION:
            raise ValueError(f"config version {version!r} is not one this nrpt reads (version "
                             f"{VERSION}); rewrite the file in sections "
                             f"[{'], ['.join(SECTION_NAMES)}] with version = {VERSION}")
        if version is not None or _has_sections(data):
            data = _unsection(data)
        known = set(known_options()) | {"target_options"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown config key(s) {unknown}; allowed: {sorted(known)} (in "
                             f"sections {', '.join(SECTION_NAMES)})")
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
        if "version" in data:
            return cls.from_dict(data, defaults=defaults)
        try:
            return cls.from_dict(data, defaults=defaults)
        except ValueError as err:
            raise ValueError(f"{err} ({path} has no version: it is read as version {VERSION} "
                             f"settings; nrpt 0.1's flat config.toml files are no longer read: "
                             f"rewrite it in sections [{'], ['.join(SECTION_NAMES)}] with "
                             f"version = {VERSION})") from None

    def write_toml(self, path: str | Path, omit: tuple[str, ...] = ()) -> None:
        """Write ``config.toml``; ``omit``: settings the built run turned out not to read
        (e.g. ``max_temperature`` for a target with a reference)."""
        from nrpt.run.folder import atomic_write

        atomic_write(path, to_toml(self.sections(omit)), sync=False)


def _has_sections(data: dict[str, Any]) -> bool:
    return any(isinstance(data.get(s), dict) for s in SECTION_NAMES)


def _unsection(data: dict[str, Any]) -> dict[str, Any]:
    table = section_table()
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key in table:
            if not isinstance(value, dict):
                raise ValueError(f"[{key}] must be a table of settings; got {value!r}")
            for name, v in value.items():
                if name not in table[key]:
                    home = next((s for s, ns in table.items() if name in ns), None)
                    where = f"; it belongs in [{home}]" if home else ""
                    raise ValueError(f"unknown key {name!r} in [{key}]{where} (allowed: "
                                     f"{', '.join(table[key])})")
                flat[name] = v
        else:
            flat[key] = value
    return flat


# ----------------------------------------------------------------------------- resolution
_DECLARED = object()
_C = {o.name: o for o in CENTRAL}


def _explorers(declares: str) -> str:
    """The registered explorers whose class declares ``declares`` (a metadata attribute that is
    truthy, or not None), for messages: the declarations, not a table of names, decide."""
    return ", ".join(n for n in registry.names("explorer")
                     if getattr(registry.entry("explorer", n).load(), declares, None)
                     not in (None, False))


class _Resolution:
    """One resolution: the config being filled, the settings the user gave, and those found
    not to apply (name -> why; their values are set to ``None`` at once)."""

    def __init__(self, cfg: RunConfig, given: set[str]):
        self.cfg, self.given = cfg, given
        self.na: dict[str, str] = {}

    def set(self, name: str, value: Any) -> None:
        self.cfg.__dict__[name] = value

    def take(self, opt: Option | str, default: Any = _DECLARED) -> None:
        """Fill ``opt``'s default if unset, then check and normalise its value."""
        opt = _C[opt] if isinstance(opt, str) else opt
        cfg = self.cfg
        if getattr(cfg, opt.name) is None:
            d = opt.default if default is _DECLARED else default
            self.set(opt.name, d(cfg) if callable(d) else d)
        value = getattr(cfg, opt.name)
        if value is not None:
            self.set(opt.name, opt.check(opt.name, value, cfg))

    def drop(self, name: str, why: str) -> None:
        self.na[name] = why
        self.set(name, None)

    def keep_if(self, name: str, applies: bool, why: str) -> None:
        """:meth:`take` ``name`` where it ``applies``, else :meth:`drop` it with ``why``."""
        if applies:
            self.take(name)
        else:
            self.drop(name, why)

    def component(self, role: str, chosen: str) -> None:
        """The options of ``role``: the chosen component's are taken (where they apply), every
        other component's are dropped; then the component's own ``check_settings(cfg)``."""
        field = COMPONENTS[role]
        entry = registry.entry(role, chosen)
        mine = {o.name for o in entry.declared}
        for opt, owner, names in declarations():
            if owner != role:
                continue
            why = opt.reason(field, names) if opt.name not in mine else \
                opt.applies(self.cfg) if opt.applies is not None else None
            if why:
                self.drop(opt.name, why)
            else:
                self.take(opt)
        check = getattr(entry.load(), "check_settings", None)
        if callable(check):
            check(self.cfg)


def _resolve(cfg: RunConfig, given: set[str]) -> None:
    """Fill defaults, validate, and set what does not apply to None (explicit -> error)."""
    r = _Resolution(cfg, given)
    for stage in (_run_settings, _explorer_settings, _ladder_settings, _swap_settings,
                  _adaptation_settings, _output_settings):
        stage(r)
    bad = [n for n in r.na if n in cfg.explicit and n in given]
    if bad:
        n = bad[0]
        kind = "stochastic-gradient" if cfg.is_sg else "exact"
        raise ValueError(f"{n} does not apply to this {kind} run (explorer {cfg.explorer!r}, "
                         f"scheme {cfg.scheme!r}, swap_rule {cfg.swap_rule!r}"
                         f"{', rounds' if cfg.rounds is not None else ''}): {r.na[n]}; remove it")


def _run_settings(r: _Resolution) -> None:
    cfg = r.cfg
    if not cfg.target:
        r.set("target", None)
    r.take("target")
    if cfg.target_options is None:
        r.set("target_options", {})
    if not isinstance(cfg.target_options, dict):
        raise ValueError(f"target_options must be a table of keyword arguments; got "
                         f"{cfg.target_options!r}")
    if cfg.rounds is not None:
        r.take("rounds")
        r.drop("iterations", "an adaptive run (rounds) runs 2 + 4 + ... + 2^rounds "
                             "iterations; give rounds only")
        r.drop("burn_in", "an adaptive run (rounds) already keeps only its last round; "
                          "burn_in is for fixed-length runs")
    else:
        r.take("iterations")
        r.take("burn_in")
    for name in ("systems", "seed", "dtype", "device"):
        r.take(name)


def _explorer_settings(r: _Resolution) -> None:
    cfg = r.cfg
    r.take("explorer", default="slice" if cfg.rounds is not None else "rwmh")
    if cfg.is_sg and cfg.rounds is not None:
        raise ValueError(f"rounds (adaptive NRPT with exact swaps) needs an exact explorer "
                         f"({', '.join(registry.names('explorer', 'exact'))}); got explorer "
                         f"{cfg.explorer!r}")
    _chain_count(r)
    r.take("n_explore")
    r.component("explorer", cfg.explorer)
    if registry.entry("explorer", cfg.explorer).load().compilable:  # (its declaration)
        r.take("compile")
        r.take("fuse")
        return
    why = f"is for explorers {_explorers('compilable')} (a step with a fixed set of draws)"
    r.drop("compile", f"compile {why}")
    if cfg.fuse not in ("auto", False):  # (auto and false mean the plain loop here)
        r.drop("fuse", f"fuse {why}")


def _chain_count(r: _Resolution) -> None:
    """``chains`` and ``max_chains``: ``chains = "auto"`` is ``chains =`` :data:`AUTO_CHAINS`
    with ``max_chains`` (default :data:`AUTO_MAX_CHAINS`), which needs rounds; a resolved config
    grows its ladder exactly where ``max_chains`` is set."""
    cfg = r.cfg
    auto = isinstance(cfg.chains, str) and cfg.chains.strip().lower() == "auto"
    if auto and cfg.rounds is not None:
        r.set("chains", AUTO_CHAINS)
        if cfg.max_chains is None:
            r.set("max_chains", AUTO_MAX_CHAINS)
    r.take("chains")
    if cfg.rounds is None or cfg.is_sg:
        r.drop("max_chains", "the ladder grows between adaptive rounds only (give rounds, and "
                             "an exact explorer)")
        r.drop("min_chains", "the ladder shrinks between adaptive rounds only (give rounds, "
                             "and an exact explorer)")
        return
    r.take("max_chains")
    r.take("min_chains")
    if cfg.max_chains is not None and cfg.max_chains < cfg.chains:
        raise ValueError(f"max_chains must be >= chains ({cfg.chains}); got {cfg.max_chains}")
    if cfg.min_chains is not None and cfg.min_chains > cfg.chains:
        raise ValueError(f"min_chains must be <= chains ({cfg.chains}); got {cfg.min_chains}")


def _ladder_settings(r: _Resolution) -> None:
    cfg = r.cfg
    tags = registry.entry("explorer", cfg.explorer).tags
    if "sg" in tags:
        r.drop("betas", "stochastic-gradient explorers need an energy target and a "
                        "temperature ladder")
    if "zero-temperature" in tags:
        for name in ("temperatures", "max_temperature"):
            r.drop(name, f"explorer {cfg.explorer!r} runs SGD (temperature 0) above slot 0: "
                         "set bottom_temperature for slot 0")
    _reference(r)
    if "zero-temperature" in tags:
        return
    if cfg.reference in GAUSSIAN_REFERENCES:
        why = (f"reference {cfg.reference!r} anneals on a geometric path from a Gaussian: "
               f"give betas")
        r.drop("temperatures", why)
        r.drop("max_temperature", why)
        r.take("betas")
        return
    if cfg.temperatures is not None and cfg.betas is not None:
        raise ValueError("give temperatures or betas, not both")
    r.take("temperatures")
    r.take("betas")
    if cfg.temperatures is not None or cfg.betas is not None:
        r.drop("max_temperature", "an explicit ladder (temperatures or betas) is given")
    else:
        r.take("max_temperature")


def _reference(r: _Resolution) -> None:
    cfg = r.cfg
    if cfg.reference is None:
        return
    r.take("reference")
    if cfg.reference == "prior":
        r.set("reference", None)  # the default: a plain run, its settings unchanged
    elif cfg.is_sg:
        raise ValueError(f"reference {cfg.reference!r} needs an exact explorer (the swaps read "
                         f"exact energies); got explorer {cfg.explorer!r} (use reference "
                         f"'prior')")
    elif cfg.rounds is None and cfg.reference != "gaussian-fixed":
        alt = "'gaussian-fixed'" if cfg.reference == "gaussian" else "'prior'"
        raise ValueError(f"reference {cfg.reference!r} is fitted between adaptive rounds: "
                         f"it needs rounds (rounds = N); got no rounds (or use reference "
                         f"{alt})")
    elif cfg.compile:
        raise ValueError(f"reference {cfg.reference!r} does not run with compile = true "
                         f"(the compiled step would keep the old reference after a refit); "
                         f"set compile = false or reference 'prior'")


def _rules(cfg: RunConfig) -> list[str]:
    """The swap rules an explorer may take, its default first."""
    tags = registry.entry("explorer", cfg.explorer).tags
    rules = (["metropolis", "always"] if "sg" not in tags else
             ["deterministic", "always"] if "zero-temperature" in tags else
             ["bias-corrected", "metropolis", "deterministic", "always"])
    builtin = ("metropolis", "deterministic", "bias-corrected", "always")
    return [r for r in rules if r in registry.names("rule")] + \
        [r for r in registry.names("rule") if r not in builtin]


def _swap_settings(r: _Resolution) -> None:
    cfg = r.cfg
    r.take("scheme")
    if cfg.reference not in (None, *GAUSSIAN_REFERENCES) and cfg.scheme not in BRIDGED_SCHEMES:
        raise ValueError(f"reference {cfg.reference!r} joins its two legs on the iterations where "
                         f"pair (0, 1) rests, which scheme {cfg.scheme!r} never or hardly leaves; "
                         f"use scheme {', '.join(map(repr, BRIDGED_SCHEMES))} (or reference "
                         f"'prior')")
    r.component("scheme", cfg.scheme)
    rules = _rules(cfg)
    if cfg.swap_rule is None:
        r.set("swap_rule", rules[0])
    if cfg.swap_rule not in rules:
        why = ("exact explorers swap with exact energies" if not cfg.is_sg else
               f"explorer {cfg.explorer!r} runs SGD (temperature 0) above slot 0, where a "
               "Metropolis swap is undefined")
        raise ValueError(f"swap_rule must be one of {', '.join(rules)} for explorer "
                         f"{cfg.explorer!r} ({why}); got {cfg.swap_rule!r}")
    r.component("rule", cfg.swap_rule)
    r.keep_if("swap_rate", (cfg.swap_rule == "deterministic" and cfg.adapt)
              or getattr(cfg, "window", None) == "swap-rate",
              "swap_rate is the target of the deterministic rule's adaptation (adapt = true) "
              "and of window 'swap-rate'")


def _adaptation_settings(r: _Resolution) -> None:
    cfg = r.cfg
    tunable = registry.entry("explorer", cfg.explorer).load().acceptance_order is not None
    tuned = _explorers("acceptance_order")
    r.keep_if("adapt_schedule", cfg.rounds is not None,
              "adapt_schedule is for adaptive runs (rounds)")
    if cfg.rounds is None and not (tunable and burn_in_count(cfg) > 0):
        for name in ("adapt_step_size", "target_acceptance"):
            r.drop(name, f"{name} is for adaptive runs (rounds) and for the burn-in "
                         f"(burn_in > 0) of fixed-length runs with explorer {tuned}")
        return
    r.take("adapt_step_size")
    r.keep_if("target_acceptance", bool(cfg.adapt_step_size and tunable),
              f"target_acceptance is what adapt_step_size aims at for {tuned}")


def _output_settings(r: _Resolution) -> None:
    cfg = r.cfg
    r.take("out")
    r.take("thin")
    length = cfg.iterations if cfg.rounds is None else 2 ** cfg.rounds
    if length is not None and cfg.thin > length:
        what = "iterations" if cfg.rounds is None else "the last round's length 2^rounds"
        raise ValueError(f"thin ({cfg.thin}) must be <= {what} ({length})")
    r.take("checkpoint_every")
    r.take("figures")


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
