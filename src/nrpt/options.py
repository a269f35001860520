"""Option declarations: each component says which settings it reads, how they are checked, their
defaults and their help; :class:`nrpt.run.config.RunConfig`, ``config.toml``, the CLI flags and
``nrpt list`` are generated from these declarations.

A leaf module (it imports nothing of nrpt but :mod:`nrpt.scalars`), so explorers, schemes and
rules can declare options without importing the run layer::

    class MyExplorer(Explorer):
        options = (Option("width", number(0.0, strict=True), default=1.0, section="explorer",
                          help="proposal width of my explorer"),)

A checker is called as ``check(name, value, cfg)`` and returns the normalised value, or raises
``ValueError`` naming the setting and what it allows; ``cfg`` is the configuration being
resolved (settings resolved before this one hold their final values).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Option", "SECTION_NAMES", "integer", "number", "boolean", "choice", "increasing",
           "check_int", "check_number", "check_numbers", "parse_int", "parse_float",
           "parse_floats", "parse_bool", "BOOL_WORDS", "typed", "add_flags"]

#: the tables of ``config.toml``, in the order they are written
SECTION_NAMES = ("run", "ladder", "explorer", "swap", "adaptation", "energy", "output")

#: ``check(name, value, cfg=None) -> value``
Check = Callable[..., Any]


@dataclass(frozen=True, eq=False)
class Option:
    """One setting: its name (a ``RunConfig`` attribute, the flag ``--name-with-dashes``, a key
    of ``config.toml``'s ``[section]``), its checker, default and help.

    ``default`` is a value or ``default(cfg)``; ``None`` leaves an unset setting unset.
    ``applies(cfg)`` returns why the option does not apply to this run (``None``: it applies),
    on top of its component being chosen.  ``why`` is the reason given when the component that
    reads it is not chosen; ``{name}``, ``{role}``, ``{names}`` (the components that read it)
    and ``{who}`` (``explorer 'hmc'``, ``explorers sgd, msgd``) are filled in.  ``parse`` turns
    a command-line word into a value (with a ``what`` attribute naming what it expects);
    ``choices`` lists the words the flag takes (a
    sequence, or a callable giving one)."""

    name: str
    check: Check
    default: Any = None
    help: str = ""
    section: str = "run"
    parse: Callable[[str], Any] | None = None
    choices: Sequence[str] | Callable[[], Sequence[str]] | None = None
    applies: Callable[[Any], str | None] | None = None
    why: str | None = None

    def __post_init__(self):
        if self.section not in SECTION_NAMES:
            raise ValueError(f"option {self.name!r}: section must be one of "
                             f"{', '.join(SECTION_NAMES)}; got {self.section!r}")

    def flag_choices(self) -> list[str] | None:
        c = self.choices() if callable(self.choices) else self.choices
        return None if c is None else list(c)

    def reason(self, role: str, names: Sequence[str]) -> str:
        """Why the option does not apply when none of ``names`` (of ``role``) is chosen."""
        who = f"{role} {names[0]!r}" if len(names) == 1 else f"{role}s {', '.join(names)}"
        text = self.why if self.why is not None else "{name} is for {who}"
        return text.format(name=self.name, names=", ".join(names), role=role, who=who)


# ----------------------------------------------------------------------------- checks
def check_int(name: str, value: Any, low: int, high: int | None = None) -> int:
    ok = not isinstance(value, bool) and isinstance(value, int | float) and \
        (not isinstance(value, float) or math.isfinite(value)) and int(value) == value
    if ok:
        ok = value >= low and (high is None or value <= high)
    if not ok:
        rng = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be an integer {rng}; got {value!r}")
    return int(value)


def check_number(name: str, value: Any, low: float | None = None, *, strict: bool = False,
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


def check_numbers(name: str, value: Any, n: int | None = None) -> list[float]:
    if not isinstance(value, list | tuple) or not value:
        raise ValueError(f"{name} must be a list of numbers; got {value!r}")
    out = [check_number(f"{name}[{i}]", v) for i, v in enumerate(value)]
    if n is not None and len(out) != n:
        raise ValueError(f"{name} has {len(out)} entries but chains = {n}")
    return out


def integer(low: int, high: int | None = None) -> Check:
    """An integer in ``[low, high]`` (a float holding an integer is accepted; a bool is not)."""
    return lambda name, value, cfg=None: check_int(name, value, low, high)


def number(low: float | None = None, *, strict: bool = False, high: float | None = None,
           high_strict: bool = True) -> Check:
    """A finite number, ``> low`` (``strict``) or ``>= low``, and ``< high`` / ``<= high``."""
    return lambda name, value, cfg=None: check_number(name, value, low, strict=strict,
                                                      high=high, high_strict=high_strict)


def boolean(name: str, value: Any, cfg: Any = None) -> bool:
    """``true`` or ``false`` (no 0/1, no words: those are the CLI's)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false; got {value!r}")
    return value


def choice(allowed: Sequence[str] | Callable[[], Sequence[str]]) -> Check:
    """One of ``allowed`` (a sequence, or a callable giving one when checked)."""
    def check(name: str, value: Any, cfg: Any = None) -> str:
        names = list(allowed() if callable(allowed) else allowed)
        if not isinstance(value, str) or value not in names:
            raise ValueError(f"{name} must be one of {', '.join(names)}; got {value!r}")
        return value
    return check


def increasing(name: str, vals: list[float], first: float | None = None) -> list[float]:
    """``vals`` positive and strictly increasing (from ``first`` if given)."""
    if first is not None and vals[0] != first:
        raise ValueError(f"{name}[0] must be {first} (slot 0 is the target); got {vals[0]}")
    for i, v in enumerate(vals):
        if not v > 0:
            raise ValueError(f"{name}[{i}] must be > 0; got {v}")
    for i in range(1, len(vals)):
        if not vals[i] > vals[i - 1]:
            raise ValueError(f"{name} must be strictly increasing; got {name}[{i - 1}] = "
                             f"{vals[i - 1]} >= {name}[{i}] = {vals[i]}")
    return vals


# ----------------------------------------------------------------------------- command-line words
#: the words every boolean flag takes (case-insensitive)
BOOL_WORDS = {"true": True, "yes": True, "on": True, "1": True,
              "false": False, "no": False, "off": False, "0": False}


def _expects(what: str):
    def mark(fn):
        fn.what = what
        return fn
    return mark


@_expects("an integer")
def parse_int(text: str) -> int:
    return int(text)


@_expects("a number")
def parse_float(text: str) -> float:
    return float(text)


@_expects("comma-separated numbers")
def parse_floats(text: str) -> list[float]:
    vals = [float(t) for t in text.split(",") if t.strip()]
    if not vals:
        raise ValueError(text)
    return vals


@_expects("true or false (true/false, yes/no, on/off, 1/0)")
def parse_bool(text: str) -> bool:
    try:
        return BOOL_WORDS[text.strip().lower()]
    except KeyError:
        raise ValueError(text) from None


# ----------------------------------------------------------------------------- flags
def typed(what: str, conv: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type whose error says what was expected (never an internal name)."""

    def parse(text: str):
        try:
            return conv(text)
        except (ValueError, TypeError, OverflowError):
            raise argparse.ArgumentTypeError(f"expected {what}; got {text!r}") from None

    parse.__name__ = what
    return parse


def add_flags(parser: argparse.ArgumentParser, declared: Iterable[tuple[Option, str]],
              describe: Callable[[Option], str] | None = None) -> None:
    """One flag ``--name-with-dashes`` per option (default ``None``: unset), in one ``--help``
    group per title; an option listed twice is added once, under its first title.
    ``describe(opt)`` is its help (default ``opt.help``)."""
    groups: dict[str, Any] = {}
    added: set[str] = set()
    for opt, title in declared:
        if title not in groups:
            groups[title] = parser.add_argument_group(title)
        if opt.name in added:
            continue
        added.add(opt.name)
        kind = str if opt.parse is None else typed(getattr(opt.parse, "what", "a value"),
                                                   opt.parse)
        groups[title].add_argument("--" + opt.name.replace("_", "-"), dest=opt.name,
                                   default=None, type=kind, choices=opt.flag_choices(),
                                   help=(describe(opt) if describe else opt.help) or None)
