r"""Coordinate-wise slice sampling (Neal 2003, "Slice sampling", Ann. Statist. 31(3)), batched.

One step sweeps coordinates ``j = 0..dim-1``; per coordinate every replica, at its slot's
log density ``f(x) = base(x) - b v(x)``:

    y  = f(x) - E,  E ~ Exp(1)                                  (slice level; Neal Eq. 2)
    an interval [L, R] of width w (the slot's step size) around x_j, at a uniform offset
    grow it:  "stepping-out"  up to m steps of w, split at random between sides (Neal Fig. 3)
              "doubling"      up to p doublings on a random side while either end is
                              inside the slice                  (Neal Fig. 4)
    shrink:   x1 ~ U[L, R]; accept if f(x1) > y (doubling: and the Fig. 6 test on the grown
              interval); else move the side beyond x1 to x1                (Neal Fig. 5)

Replicas run the loops together as masked tensor ops.  Caps ``max_steps`` (grow) and
``max_shrink`` (shrink; a replica hitting it keeps its coordinate) preserve reversibility.
Non-finite densities count as outside the slice; at ``b = 0`` the density is ``base`` alone.

Random numbers (:mod:`nrpt.rng`), two keyed sub-streams per (iteration, step, coordinate), in
blocks of uniforms ``[R, P, 16]``: *main* (column 0 level, 1 offset, 2 stepping-out split,
``SHRINK0 + i`` the ``i``-th shrink proposal) and *doubling* (column ``i`` the ``i``-th side).
``info.accept_prob`` is 1; ``info.accepted`` says whether the replica moved.
"""

from __future__ import annotations

import math
import numbers

import torch

from nrpt.explorers.base import (
    PRECONDITION,
    STEP_SIZE,
    Density,
    ExploreInfo,
    Explorer,
    Noise,
    ReplicaState,
)
from nrpt.options import Option, choice

__all__ = ["SliceSampler", "slot_log_density"]

METHODS = ("stepping-out", "doubling")
_BLOCK = 16  # uniforms are drawn in keyed blocks of this many columns
# columns of the main per-coordinate stream: 0 the slice level, 1 the interval offset, 2 the
# stepping-out split, shrinkage proposals from SHRINK0 on (a typical coordinate draws a single
# block); the doubling sides come from a stream of their own, keyed with _DOUBLING
SHRINK0 = 3
_DOUBLING = 1
#: the allowed range of ``max_steps`` and ``max_shrink``
CAP_RANGE = (1, 10_000)


def slot_log_density(v: torch.Tensor, base: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``base - b v``, with ``base`` alone where ``b == 0`` and ``-inf`` where not finite."""
    f = torch.where(b == 0, base, base - b * v)
    return torch.where(torch.isfinite(f), f, torch.full_like(f, -math.inf))


class _Uniforms:
    """Keyed uniforms ``[R, P]`` for one coordinate of one step (see the module docstring).

    ``u(i)`` is column ``i`` of the main stream (level, offset, split, shrinkage proposals);
    ``u.doubling(i)`` is column ``i`` of the doubling stream.  Column ``i`` lies in block
    ``i // _BLOCK`` of its stream, drawn on first use and keyed by
    ``(EXPLORE, iteration, sub, coord, block)`` (main) or
    ``(EXPLORE, iteration, sub, coord, _DOUBLING, block)`` (doubling)."""

    def __init__(self, noise: Noise, sub: int, coord: int, dtype: torch.dtype):
        self.noise, self.sub, self.coord, self.dtype = noise, int(sub), int(coord), dtype
        self._blocks: dict[tuple[int, ...], torch.Tensor] = {}

    def _column(self, tag: tuple[int, ...], i: int) -> torch.Tensor:
        if i < 0:
            raise IndexError(f"uniform column must be >= 0; got {i}")
        blk = (*tag, i // _BLOCK)
        if blk not in self._blocks:
            n = self.noise
            self._blocks[blk] = n.uniform(self.sub, self.dtype, (_BLOCK,),
                                          (self.coord, *blk))
        return self._blocks[blk][..., i % _BLOCK]

    def __call__(self, i: int) -> torch.Tensor:
        return self._column((), i)

    def doubling(self, i: int) -> torch.Tensor:
        return self._column((_DOUBLING,), i)


class SliceSampler(Explorer):
    """Batched coordinate-wise slice sampler (see the module docstring).

    Args:
        method: ``"stepping-out"`` (default) or ``"doubling"``.
        max_steps: the cap ``m`` on stepping-out steps (default 16) or ``p`` on doublings
            (default 8, i.e. intervals up to ``256 w``); an integer in ``[1, 10000]``.
        max_shrink: the cap on shrinkage proposals per coordinate (default 64); an integer
            in ``[1, 10000]``.

    The initial width ``w`` is the slot's ``step_size`` (any width is exact).
    """

    name = "slice"
    options = (STEP_SIZE, Option("slice_method", choice(METHODS), default="stepping-out",
                                 section="explorer", choices=METHODS,
                                 help="interval growth of the slice explorer"), PRECONDITION)
    uses_gradient = False
    substeps = 1
    preconditionable = True

    def step_adaptor(self, target_acceptance=None, *, phase=None, follow=None):
        """Between adaptive rounds: the widths from each slot's spread
        (:class:`nrpt.adapt.rounds.SliceWidthAdaptor`); no tuning in a warm-up."""
        if phase is not None:
            return None
        from nrpt.adapt.rounds import SliceWidthAdaptor

        return SliceWidthAdaptor()

    def __init__(self, method: str = "stepping-out", max_steps: int | None = None,
                 max_shrink: int = 64):
        if method not in METHODS:
            raise ValueError(f"slice method must be one of {', '.join(METHODS)}; got {method!r}")
        if max_steps is None:
            max_steps = 16 if method == "stepping-out" else 8
        lo, hi = CAP_RANGE
        for name, val in (("max_steps", max_steps), ("max_shrink", max_shrink)):
            ok = (not isinstance(val, bool) and isinstance(val, numbers.Real)
                  and math.isfinite(val) and int(val) == val and lo <= val <= hi)
            if not ok:
                raise ValueError(f"{name} must be an integer in [{lo}, {hi}]; got {val!r}")
        self.method = method
        self.max_steps = int(max_steps)
        self.max_shrink = int(max_shrink)

    def describe(self) -> dict:
        return {"name": self.name, "method": self.method, "max_steps": self.max_steps,
                "max_shrink": self.max_shrink}

    # ------------------------------------------------------------------ one sweep
    def step(self, state: ReplicaState, b, step_size, density: Density, noise: Noise, sub=0,
             metric=None):
        """One sweep over the coordinates of ``z`` where ``x = L z`` (``metric``: ``None``
        the identity, ``[R, P, dim]`` diagonal scales -- coordinate ``j`` with width ``w s_j``
        --, ``[R, P, dim, dim]`` a lower-triangular ``L`` -- along its column ``j``); the
        width ``w`` (``step_size``) is in ``z`` units."""
        x, v, base = state.x, state.v, state.base
        f0 = slot_log_density(v, base, b)
        moved = torch.zeros_like(f0, dtype=torch.bool)
        nonfinite = torch.zeros_like(moved)
        dense = metric is not None and metric.dim() == x.dim() + 1
        for j in range(x.shape[-1]):
            u = _Uniforms(noise, sub, j, x.dtype)
            if dense:
                col = metric[..., :, j]  # the line x + t L e_j, t from 0

                def evaluate(t, x=x, col=col):
                    v, base = density(x + t[..., None] * col)
                    return v, base, slot_log_density(v, base, b)

                t, v, base, f0, bad = self._slice(torch.zeros_like(f0), v, base, f0,
                                                  step_size, u, evaluate)
                went = t != 0
                moved |= went
                nonfinite |= bad
                x = torch.where(went[..., None], x + t[..., None] * col, x)
                continue

            w = step_size if metric is None else step_size * metric[..., j]
            xj, v, base, f0, bad = self._coordinate(x, j, v, base, f0, b, w, density, u)
            moved |= xj != x[..., j]
            nonfinite |= bad
            x = x.clone()
            x[..., j] = xj
        new = ReplicaState(x, v, base, dict(state.extras))
        info = ExploreInfo(torch.ones_like(f0), moved, nonfinite)
        return new, info

    def _coordinate(self, x, j, v0, base0, f0, b, w, density, u):
        """One slice update of coordinate ``j`` of ``x`` (width ``w[R, P]``)."""

        def evaluate(values):
            """Path components at x with coordinate j replaced by ``values`` ([..., R, P])."""
            pts = x.expand(*values.shape[:-2], *x.shape).clone()
            pts[..., j] = values
            v, base = density(pts)
            return v, base, slot_log_density(v, base, b)

        return self._slice(x[..., j], v0, base0, f0, w, u, evaluate)

    def _slice(self, x0, v0, base0, f0, w, u, evaluate):
        """One slice update of the scalar ``x0[R, P]`` (a coordinate, or the position along a
        line) of the density ``evaluate`` returns, from its current value ``f0``."""
        y = f0 + torch.log1p(-u(0))  # log(1 - U) ~ -Exp(1), finite since U < 1
        left = x0 - w * u(1)
        right = left + w
        if self.method == "stepping-out":
            left, right = self._step_out(left, right, y, w, u, evaluate)
        else:
            left, right = self._double(left, right, y, u, evaluate)
        grown = (left, right)  # Neal's test (Fig. 6) uses the interval before any shrinking
        done = torch.zeros_like(y, dtype=torch.bool)
        bad = torch.zeros_like(done)
        x_new, v_new, base_new, f_new = x0, v0, base0, f0
        for i in range(self.max_shrink):
            x1 = left + u(SHRINK0 + i) * (right - left)
            v1, base1, f1 = evaluate(x1)
            bad |= ~done & (f1 == -math.inf)
            ok = ~done & (f1 > y)
            if self.method == "doubling":
                ok = ok & self._accept_doubling(x0, x1, y, *grown, w, evaluate, ok)
            x_new = torch.where(ok, x1, x_new)
            v_new, base_new, f_new = (torch.where(ok, v1, v_new), torch.where(ok, base1, base_new),
                                      torch.where(ok, f1, f_new))
            done |= ok
            if bool(done.all()):
                break
            shrink = ~done
            left = torch.where(shrink & (x1 < x0), x1, left)
            right = torch.where(shrink & (x1 >= x0), x1, right)
        return x_new, v_new, base_new, f_new, bad

    def _step_out(self, left, right, y, w, u, evaluate):
        m = self.max_steps
        n_left = torch.floor(m * u(2)).to(torch.int64)  # J of Neal Fig. 3
        n_right = (m - 1) - n_left  # K
        grow_l = n_left > 0
        grow_r = n_right > 0
        for _ in range(m):
            if not bool((grow_l | grow_r).any()):
                break
            _, _, f = evaluate(torch.stack([left, right]))
            grow_l = grow_l & (f[0] > y)
            grow_r = grow_r & (f[1] > y)
            left = torch.where(grow_l, left - w, left)
            right = torch.where(grow_r, right + w, right)
            n_left = n_left - grow_l.long()
            n_right = n_right - grow_r.long()
            grow_l = grow_l & (n_left > 0)
            grow_r = grow_r & (n_right > 0)
        return left, right

    def _double(self, left, right, y, u, evaluate):
        _, _, f = evaluate(torch.stack([left, right]))
        f_l, f_r = f[0], f[1]
        for i in range(self.max_steps):
            grow = (y < f_l) | (y < f_r)
            if not bool(grow.any()):
                break
            to_left = u.doubling(i) < 0.5
            width = right - left
            new_l = torch.where(grow & to_left, left - width, left)
            new_r = torch.where(grow & ~to_left, right + width, right)
            _, _, f_new = evaluate(torch.where(to_left, new_l, new_r))
            f_l = torch.where(grow & to_left, f_new, f_l)
            f_r = torch.where(grow & ~to_left, f_new, f_r)
            left, right = new_l, new_r
        return left, right

    def _accept_doubling(self, x0, x1, y, left, right, w, evaluate, active):
        """Neal's Fig. 6: would doubling from ``x1`` have produced ``[left, right]``?"""
        ok = torch.ones_like(active)
        differ = torch.zeros_like(active)
        lo, hi = left, right
        for _ in range(self.max_steps + 1):
            halving = active & ok & (hi - lo > 1.1 * w)
            if not bool(halving.any()):
                break
            mid = 0.5 * (lo + hi)
            differ = differ | (halving & ((x0 < mid) != (x1 < mid)))
            lo = torch.where(halving & (x1 >= mid), mid, lo)
            hi = torch.where(halving & (x1 < mid), mid, hi)
            _, _, f = evaluate(torch.stack([lo, hi]))
            ok = ok & ~(halving & differ & (y >= f[0]) & (y >= f[1]))
        return ok
