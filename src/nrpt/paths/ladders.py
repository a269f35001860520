"""Paths: the family of distributions over slots, and the log acceptance ratio of a swap.

Slot ``p`` has coefficient ``b_p`` (``b_0 = 1`` at the target, decreasing along the ladder); a
state has a tempered part ``V(x)`` and an untempered part ``base(x)``, cached with the replica:
``log pi_p(x) = base(x) - b_p V(x)`` (up to a constant).

================  ====================  ======================  =======================
path              b_p                   V(x)                    base(x)
================  ====================  ======================  =======================
temperature       1 / tau_p             U(x) = -log pi(x)       0
geometric         beta_p                -l(x) (log-likelihood)  log pi_0(x) (reference)
================  ====================  ======================  =======================

Swapping replica a at slot i with replica c at slot j: ``log alpha = (b_i - b_j)(V(x_a) - V(x_c))``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from nrpt.roles import Path, swap_log_ratio
from nrpt.targets.protocol import path_kind

__all__ = ["Path", "TemperatureLadder", "GeometricPath", "NoiseLadder", "make_path",
           "swap_log_ratio", "geometric_ladder"]


def _as_float_list(name: str, values: Sequence[float]) -> list[float]:
    try:
        out = [float(v) for v in values]
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be a sequence of numbers; got {values!r}") from err
    if len(out) < 2:
        raise ValueError(
            f"{name} must have at least 2 slots (a ladder needs P >= 2); got {len(out)}")
    if not all(math.isfinite(v) for v in out):
        raise ValueError(f"{name} must be finite numbers; got {out}")
    return out


def flat_call(fn, x: torch.Tensor, what: str) -> torch.Tensor:
    lead = x.shape[:-1]
    flat = x.reshape(-1, x.shape[-1])
    out = fn(flat)
    if not isinstance(out, torch.Tensor) or out.shape != (flat.shape[0],):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(
            f"target.{what}(x) must return shape [n] = [{flat.shape[0]}] for x of shape "
            f"{list(flat.shape)}; got {shape}"
        )
    if out.dtype != x.dtype:  # (a no-op .to costs as much as a small op)
        out = out.to(x.dtype)
    return out.reshape(lead)


class TemperatureLadder(Path):
    """Tempered targets pi_p ∝ exp(-U / tau_p) with tau_0 = 1 < tau_1 < ... < tau_{P-1}."""

    kind = "temperature"
    has_reference = False

    def __init__(self, temperatures: Sequence[float]):
        temps = _as_float_list("temperatures", temperatures)
        if abs(temps[0] - 1.0) > 1e-12:
            raise ValueError(f"temperatures[0] must be 1 (slot 0 is the target); got {temps[0]}")
        for i in range(1, len(temps)):
            if not temps[i] > temps[i - 1]:
                raise ValueError(
                    "temperatures must be strictly increasing from 1 (slot 0 = target); got "
                    f"temperatures[{i - 1}] = {temps[i - 1]} >= temperatures[{i}] = {temps[i]}"
                )
        self.temperatures = temps
        super().__init__([1.0 / t for t in temps])

    @classmethod
    def geometric(cls, n_slots: int, max_temperature: float) -> TemperatureLadder:
        """tau_p = max_temperature ** (p / (P - 1))."""
        if int(n_slots) != n_slots or n_slots < 2:
            raise ValueError(f"chains must be an integer >= 2; got {n_slots!r}")
        if not max_temperature > 1.0:
            raise ValueError(f"max_temperature must be > 1; got {max_temperature!r}")
        n = int(n_slots)
        return cls([max_temperature ** (p / (n - 1)) for p in range(n)])

    def components(self, target, x):
        v = flat_call(target.energy, x, "energy")
        return v, torch.zeros_like(v)

    def describe(self) -> dict:
        return {"kind": self.kind, "temperatures": list(self.temperatures)}


class GeometricPath(Path):
    """pi_beta ∝ pi_0^(1-beta) pi^beta, i.e. log pi_beta = log pi_0 + beta * l, with
    beta_0 = 1 (target) > beta_1 > ... > beta_{P-1} >= 0.

    With ``beta_{P-1} = 0`` the hottest slot *is* the reference and the engine samples it iid
    every iteration (``has_reference``).  A ladder that stops short of it (``beta_{P-1} > 0``,
    as in tools whose geometric ladders end at, say, 1e-3) is explored by the local moves
    alone: no iid refresh, and the stepping-stone estimate is ``log(Z_1 / Z_{beta_{P-1}})``."""

    kind = "geometric"

    def __init__(self, betas: Sequence[float]):
        bs = _as_float_list("betas", betas)
        if abs(bs[0] - 1.0) > 1e-12 or not 0.0 <= bs[-1] < 1.0:
            raise ValueError(
                f"betas must run from 1 (slot 0 = target) down to a last value in [0, 1) (0: the "
                f"reference, sampled iid); got betas[0] = {bs[0]}, betas[-1] = {bs[-1]}"
            )
        for i in range(1, len(bs)):
            if not bs[i] < bs[i - 1]:
                raise ValueError(
                    "betas must be strictly decreasing from 1; got "
                    f"betas[{i - 1}] = {bs[i - 1]} <= betas[{i}] = {bs[i]}"
                )
        if abs(bs[-1]) <= 1e-12:
            bs[-1] = 0.0
        self.betas = bs
        #: the hottest slot is the reference itself (sampled iid each iteration)
        self.has_reference = bs[-1] == 0.0
        super().__init__(bs)

    @classmethod
    def linear(cls, n_slots: int) -> GeometricPath:
        if int(n_slots) != n_slots or n_slots < 2:
            raise ValueError(f"chains must be an integer >= 2; got {n_slots!r}")
        n = int(n_slots)
        return cls([1.0 - p / (n - 1) for p in range(n)])

    def components(self, target, x):
        v = -flat_call(target.log_likelihood, x, "log_likelihood")
        base = flat_call(target.reference_log_prob, x, "reference_log_prob")
        return v, base

    def describe(self) -> dict:
        return {"kind": self.kind, "betas": list(self.betas)}


def make_path(
    target,
    n_slots: int,
    *,
    temperatures: Sequence[float] | None = None,
    betas: Sequence[float] | None = None,
    max_temperature: float = 10.0,
) -> Path:
    """The path a target calls for: geometric if it has a reference, temperature otherwise."""
    kind = path_kind(target)
    if kind == "geometric":
        if temperatures is not None:
            raise ValueError("temperatures is for energy targets; this target has a reference, "
                             "give betas instead")
        path = GeometricPath(betas) if betas is not None else GeometricPath.linear(n_slots)
    else:
        if betas is not None:
            raise ValueError("betas is for targets with a reference (geometric path); this "
                             "target has only energy(x), give temperatures instead")
        path = (TemperatureLadder(temperatures) if temperatures is not None
                else TemperatureLadder.geometric(n_slots, max_temperature))
    if path.n_slots != n_slots:
        raise ValueError(f"the ladder has {path.n_slots} slots but chains = {n_slots}")
    return path


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
