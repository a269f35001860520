"""Constrained domains and reflection (r2SGLD: reflected replica-exchange SGLD, Zheng et al. 2024).

A reflected step moves ``x -> y = x + delta`` and, where the straight segment leaves the domain
``Omega``, reflects the rest of the displacement off the boundary (specular reflection, normal
component reversed), repeatedly until the end point is inside.  The energy is then evaluated
only at points of ``Omega``.

Domains (all batched over leading dimensions ``[..., dim]``):

* :class:`Box` ``lo <= x <= hi`` coordinate-wise: reflection is the exact folding map
  ``lo + tri((y - lo) mod 2w)`` per coordinate (any overshoot, any number of bounces).
* :class:`Ball` ``|x - centre| <= radius``: exact segment/sphere intersection, reflection in the
  tangent plane, repeated (at most ``max_bounces``, then the point is pulled radially inside).
* :class:`UserDomain` from ``inside(x) -> bool[...]`` and optionally ``normal(y) -> [..., dim]``
  (outward unit normal at boundary points): the crossing is found by bisection on the segment;
  without ``normal`` the step stops at the crossing point (projection onto the boundary, from
  inside).

Every domain has ``contains(x)`` and ``reflect(x, y) -> y'`` with ``contains(y')`` true whenever
``contains(x)`` is.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

__all__ = ["Domain", "Box", "Ball", "UserDomain", "parse_domain"]


class Domain:
    name = ""

    def contains(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def reflect(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def check_inside(self, x: torch.Tensor, what: str = "initial states") -> None:
        """Raise a clear error if some of ``x[..., dim]`` lie outside the domain."""
        ok = self.contains(x)
        if not bool(ok.all()):
            bad = int((~ok).sum())
            first = x.reshape(-1, x.shape[-1])[~ok.reshape(-1)][0].tolist()
            raise ValueError(f"{bad} of the {what} lie outside the domain {self.describe()} "
                             f"(e.g. {first}); give {what} inside it")

    def describe(self) -> str:
        return self.name


class Box(Domain):
    """The box ``lo <= x <= hi`` (scalars or ``[dim]`` sequences)."""

    name = "box"

    def __init__(self, lo, hi):
        self.lo = torch.as_tensor(lo, dtype=torch.float64)
        self.hi = torch.as_tensor(hi, dtype=torch.float64)
        if not bool((self.hi > self.lo).all()) or not bool(torch.isfinite(self.lo).all() &
                                                          torch.isfinite(self.hi).all()):
            raise ValueError(f"box needs finite lo < hi; got lo={lo!r}, hi={hi!r}")

    def _b(self, x):
        return self.lo.to(x.dtype).to(x.device), self.hi.to(x.dtype).to(x.device)

    def contains(self, x):
        lo, hi = self._b(x)
        return ((x >= lo) & (x <= hi)).all(-1)

    def reflect(self, x, y):
        lo, hi = self._b(y)
        w = hi - lo
        t = torch.remainder(y - lo, 2 * w)
        return torch.where(t <= w, lo + t, hi - (t - w))

    def describe(self):
        return f"box [{self.lo.tolist()}, {self.hi.tolist()}]"


class Ball(Domain):
    """The closed ball ``|x - centre| <= radius``."""

    name = "ball"

    def __init__(self, radius: float, centre=0.0, max_bounces: int = 8):
        if not (isinstance(radius, int | float) and math.isfinite(radius) and radius > 0):
            raise ValueError(f"radius must be a finite number > 0; got {radius!r}")
        self.radius = float(radius)
        self.centre = torch.as_tensor(centre, dtype=torch.float64)
        self.max_bounces = int(max_bounces)

    def contains(self, x):
        c = self.centre.to(x.dtype).to(x.device)
        return ((x - c) ** 2).sum(-1) <= self.radius**2 * (1 + 1e-12)

    def reflect(self, x, y):
        c = self.centre.to(y.dtype).to(y.device)
        a, b = x - c, y - c
        r = self.radius
        for _ in range(self.max_bounces):
            out = (b * b).sum(-1) > r * r
            if not bool(out.any()):
                break
            d = b - a
            # smallest t in (0, 1] with |a + t d| = r (a inside, so the root is the larger one)
            dd = (d * d).sum(-1).clamp_min(1e-300)
            ad = (a * d).sum(-1)
            aa = (a * a).sum(-1)
            disc = (ad * ad - dd * (aa - r * r)).clamp_min(0.0)
            t = ((-ad + disc.sqrt()) / dd).clamp(0.0, 1.0)
            hit = a + t[..., None] * d
            n = hit / hit.norm(dim=-1, keepdim=True).clamp_min(1e-300)
            rest = b - hit
            refl = hit + rest - 2 * (rest * n).sum(-1, keepdim=True) * n
            m = out[..., None]
            # after a bounce the new segment starts (just inside) at the hit point
            a = torch.where(m, hit * (1 - 1e-12), a)
            b = torch.where(m, refl, b)
        norm = b.norm(dim=-1, keepdim=True)
        b = torch.where(norm > r, b * (r / norm.clamp_min(1e-300)) * (1 - 1e-12), b)
        return b + c

    def describe(self):
        return f"ball(radius={self.radius}, centre={self.centre.tolist()})"


class UserDomain(Domain):
    """A domain given by ``inside(x[n, dim]) -> bool[n]`` and optionally the outward unit normal
    ``normal(y[n, dim]) -> [n, dim]`` at boundary points.  The crossing of a segment with the
    boundary is located by ``bisection_steps`` of bisection (inside end kept), so the returned
    points are always inside."""

    name = "user"

    def __init__(self, inside: Callable, normal: Callable | None = None, max_bounces: int = 8,
                 bisection_steps: int = 40):
        if not callable(inside):
            raise ValueError("inside must be callable: inside(x[n, dim]) -> bool[n]")
        if normal is not None and not callable(normal):
            raise ValueError("normal must be callable: normal(y[n, dim]) -> [n, dim]")
        self.inside, self.normal = inside, normal
        self.max_bounces, self.steps = int(max_bounces), int(bisection_steps)

    def contains(self, x):
        flat = x.reshape(-1, x.shape[-1])
        return torch.as_tensor(self.inside(flat), dtype=torch.bool).reshape(x.shape[:-1])

    def _crossing(self, a, b):
        """Last inside point on the segment a -> b (a inside, b outside), by bisection."""
        lo = torch.zeros(a.shape[:-1], dtype=a.dtype, device=a.device)
        hi = torch.ones_like(lo)
        d = b - a
        for _ in range(self.steps):
            mid = 0.5 * (lo + hi)
            ok = self.contains(a + mid[..., None] * d)
            lo = torch.where(ok, mid, lo)
            hi = torch.where(ok, hi, mid)
        return a + lo[..., None] * d

    def reflect(self, x, y):
        a, b = x, y
        for _ in range(self.max_bounces):
            out = ~self.contains(b)
            if not bool(out.any()):
                return b
            hit = self._crossing(a, b)
            if self.normal is None:
                return torch.where(out[..., None], hit, b)
            flat = hit.reshape(-1, hit.shape[-1])
            n = torch.as_tensor(self.normal(flat), dtype=hit.dtype).reshape(hit.shape)
            n = n / n.norm(dim=-1, keepdim=True).clamp_min(1e-300)
            rest = b - hit
            refl = hit + rest - 2 * (rest * n).sum(-1, keepdim=True) * n
            m = out[..., None]
            a = torch.where(m, hit, a)
            b = torch.where(m, refl, b)
        out = ~self.contains(b)
        return torch.where(out[..., None], self._crossing(a, b), b)


def parse_domain(spec: str | None) -> Domain | None:
    """``"box:LO,HI"`` (the same bounds on every axis), ``"ball:R"`` or None."""
    if spec is None or spec == "" or spec == "none":
        return None
    kind, _, rest = str(spec).partition(":")
    try:
        vals = [float(t) for t in rest.split(",") if t.strip()]
    except ValueError:
        vals = []
    if kind == "box" and len(vals) == 2:
        return Box(vals[0], vals[1])
    if kind == "ball" and len(vals) == 1:
        return Ball(vals[0])
    raise ValueError(f"domain must be 'box:LO,HI' or 'ball:R'; got {spec!r}")
