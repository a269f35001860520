"""The No-U-Turn sampler (Hoffman & Gelman 2014) as Stan runs it (Betancourt 2017): multinomial
sampling of the trajectory's states, the generalised no-U-turn criterion checked on every
subtree and across the halves of every merge, biased progressive sampling between the old
tree and each new subtree.  Batched over replicas: each replica builds its own trajectory in
the whitened space of the slot's ``metric`` (``x = L z``, kinetic energy ``|p|^2 / 2``,
:func:`nrpt.explorers.base.metric_mul`); replicas whose trajectory has stopped are masked.

One transition from ``(x, p)``, ``p ~ N(0, I)``, ``H = -log pi_p(x) + |p|^2 / 2``::

    for depth d = 0, 1, ..., max_tree_depth - 1 (while the replica goes on):
        direction v = +-1 (a keyed uniform); from the trajectory's end in direction v, 2^d
        leapfrog steps of size v h form the new subtree; inside it, its state is drawn with
        probability proportional to exp(-H) (progressively, leaf by leaf).  The subtree is
        invalid (and the transition stops, keeping the old sample) if the energy error
        H - H0 exceeds 1000 or is not finite (a divergence, flagged ``nonfinite`` when not
        finite), or if the no-U-turn criterion fails on any of its aligned blocks of 2^k
        leaves (k >= 1): for halves A, B of the block (in build order),
            crit(A.first, B.last, rho_A + rho_B), crit(A.first, B.first, rho_A + p_B.first),
            crit(A.last, B.last, rho_B + p_A.last),   crit(a, c, rho) = a.rho > 0 and c.rho > 0
        (rho: the sum of the momenta).  A valid subtree's sample replaces the current one with
        probability min(1, W_subtree / W_old) (W: summed exp(-H + H0)); then the merged tree
        stops if the criterion fails across the old tree and the subtree (the same three
        checks).

Every check is symmetric in the build direction, so the tree a state belongs to could have
been built from any of its states with the same probability, and each ``pi_p`` is exactly
invariant.  The acceptance statistic (``info.accept_prob``) is Stan's: the mean over the
trajectory's leapfrog steps of ``min(1, exp(H0 - H))``, which :class:`StepSizeAdaptor` tunes
toward ``target_acceptance = 0.8``.

Random numbers: ``noise.normal(sub)`` the momentum (``substeps = 1``); EXPLORE uniforms
``(sub, 1)`` the directions ``[max_tree_depth]``, ``(sub, 2)`` the subtree-versus-tree choices,
``(sub, 3, d)`` the in-subtree choices of depth ``d`` ``[2^d]`` (drawn when some replica
reaches depth ``d``).  Gradient evaluations per transition: the number of leapfrog steps
(at most ``2^max_tree_depth - 1``).
"""

from __future__ import annotations

import math

import torch

from nrpt.explorers.base import (
    PRECONDITION,
    STEP_SIZE,
    Density,
    ExploreInfo,
    Noise,
    metric_mul,
    metric_tmul,
    slot_grad,
)
from nrpt.explorers.metropolis import GradientCached, finite_rows
from nrpt.options import Option, integer, parse_int
from nrpt.roles import ReplicaState

__all__ = ["NUTS", "MAX_DELTA_H"]

#: an energy error above this makes a divergence (Stan's ``max_deltaH``)
MAX_DELTA_H = 1000.0


def _crit(a: torch.Tensor, c: torch.Tensor, rho: torch.Tensor) -> torch.Tensor:
    """The generalised no-U-turn criterion: both end momenta still point along ``rho``."""
    return ((a * rho).sum(-1) > 0) & ((c * rho).sum(-1) > 0)


def _merge_ok(a_first, a_last, rho_a, b_first, b_last, rho_b) -> torch.Tensor:
    """The three checks of a merge of halves ``A`` then ``B`` (build order; symmetric)."""
    return (_crit(a_first, b_last, rho_a + rho_b) & _crit(a_first, b_first, rho_a + b_first)
            & _crit(a_last, b_last, rho_b + a_last))


class NUTS(GradientCached):
    """The No-U-Turn sampler (see the module docstring).

    Args:
        max_tree_depth: at most ``2^max_tree_depth - 1`` leapfrog steps per transition (an
            integer in ``[1, 20]``; default 10, as Stan).
    """

    name = "nuts"
    uses_gradient = True
    preconditionable = True
    compilable = False  # data-dependent tree building
    substeps = 1
    #: Stan's target of its acceptance statistic; the leapfrog's energy error is O(h^2)
    target_acceptance, acceptance_order = 0.8, 2
    options = (STEP_SIZE, PRECONDITION,
               Option("max_tree_depth", integer(1, 20), default=10, section="explorer",
                      parse=parse_int,
                      help="nuts: at most 2^max_tree_depth - 1 leapfrog steps per step"))

    def __init__(self, max_tree_depth: int = 10):
        if (isinstance(max_tree_depth, bool) or int(max_tree_depth) != max_tree_depth
                or not 1 <= max_tree_depth <= 20):
            raise ValueError(f"max_tree_depth must be an integer in [1, 20]; got "
                             f"{max_tree_depth!r}")
        self.max_tree_depth = int(max_tree_depth)

    def describe(self) -> dict:
        return {"name": self.name, "max_tree_depth": self.max_tree_depth}

    # the two sampling choices (a negative control in tests/test_nuts.py overrides them)
    def _take_leaf(self, u, log_w, log_w_total):
        """Whether a new leaf replaces the subtree's sample: probability ``w / W`` (so the
        subtree's sample is drawn proportionally to the weights)."""
        return u < torch.exp(log_w - log_w_total)

    def _take_subtree(self, u, log_w_sub, log_w_old):
        """Whether a valid subtree's sample replaces the tree's: ``min(1, W_sub / W_old)``."""
        return u < torch.exp(log_w_sub - log_w_old)

    def step(self, state, b, step_size, density: Density, noise: Noise, sub: int = 0,
             metric=None):
        state = self._cached(state, density)
        shape, dim, dtype = state.v.shape, state.x.shape[-1], state.x.dtype
        D = self.max_tree_depth

        def flat(t):
            return t.reshape(-1, *t.shape[len(shape):])

        p0 = flat(noise.normal(sub, (dim,), dtype))
        u_dir = flat(noise.uniform(sub, dtype, (D,), parts=(1,)))
        u_top = flat(noise.uniform(sub, dtype, (D,), parts=(2,)))
        bb = flat(b.to(dtype).expand(shape))
        h = flat(step_size.to(dtype).expand(shape))
        M = None if metric is None else flat(metric.to(dtype).expand(*shape, *metric.shape[2:]))
        x0 = flat(state.x)
        gv0, gb0 = flat(state.extras["grad_v"]), flat(state.extras["grad_base"])
        g0 = slot_grad(gv0, gb0, bb)
        lp0 = flat(state.log_density(b))
        H0 = -lp0 + 0.5 * (p0**2).sum(-1)
        N = x0.shape[0]

        # the trajectory: its two ends, momentum sum, log weight, sample
        gz0 = metric_tmul(M, g0)
        ends = {"xb": x0, "pb": p0, "gb": gz0, "xf": x0, "pf": p0, "gf": gz0}
        rho = p0.clone()
        log_W = torch.zeros(N, dtype=dtype, device=x0.device)
        sample = {"x": x0, "v": flat(state.v), "base": flat(state.base), "g_v": gv0,
                  "g_base": gb0}
        alive = torch.isfinite(H0) & finite_rows(g0) & finite_rows(x0)
        sum_metro = torch.zeros_like(log_W)
        n_leap = torch.zeros_like(log_W)
        nonfinite = ~alive.clone()

        for d in range(D):
            rows = alive.nonzero().squeeze(-1)
            if rows.numel() == 0:
                break
            m = 2**d
            u_leaf = flat(noise.uniform(sub, dtype, (m,), parts=(3, d)))[rows]
            fwd = u_dir[rows, d] > 0.5
            f1 = fwd[:, None]
            x = torch.where(f1, ends["xf"][rows], ends["xb"][rows])
            p = torch.where(f1, ends["pf"][rows], ends["pb"][rows])
            gz = torch.where(f1, ends["gf"][rows], ends["gb"][rows])
            eps = torch.where(fwd, h[rows], -h[rows])
            Mr = None if M is None else M[rows]
            br, H0r = bb[rows], H0[rows]
            n_a = rows.numel()
            hist = torch.empty(n_a, m, dim, dtype=dtype, device=x0.device)
            S = torch.zeros(n_a, m + 1, dim, dtype=dtype, device=x0.device)
            lw_sub = torch.full((n_a,), -math.inf, dtype=dtype, device=x0.device)
            sub_sample = {k: t[rows].clone() for k, t in sample.items()}
            valid = torch.ones(n_a, dtype=torch.bool, device=x0.device)
            metro = torch.zeros(n_a, dtype=dtype, device=x0.device)
            leaps = torch.zeros_like(metro)
            bad = torch.zeros_like(valid)
            for n in range(1, m + 1):
                act = valid.nonzero().squeeze(-1)
                if act.numel() == 0:
                    break
                # every row still building: views instead of gathers
                ia = slice(None) if act.numel() == n_a else act
                e = eps[ia][:, None]
                Ma = None if Mr is None else Mr[ia]
                p_half = p[ia] + 0.5 * e * gz[ia]
                xn = x[ia] + e * metric_mul(Ma, p_half)
                v, base, g_v, g_base = density.grad_components(xn)
                g = slot_grad(g_v, g_base, br[ia])
                gzn = metric_tmul(Ma, g)
                pn = p_half + 0.5 * e * gzn
                lp = base - br[ia] * v
                dH = (-lp + 0.5 * (pn**2).sum(-1)) - H0r[ia]
                finite = (torch.isfinite(dH) & finite_rows(xn) & finite_rows(g)
                          & finite_rows(pn))
                log_w = torch.where(finite, -dH, torch.full_like(dH, -math.inf))
                metro[ia] += torch.where(finite, torch.exp(torch.clamp(-dH, max=0.0)),
                                         torch.zeros_like(dH))
                leaps[ia] += 1
                bad[ia] |= ~finite
                # progressive multinomial sampling inside the subtree
                lw_new = torch.logaddexp(lw_sub[ia], log_w)
                take = finite & self._take_leaf(u_leaf[ia, n - 1], log_w, lw_new)
                leaf = {"x": xn, "v": v, "base": base, "g_v": g_v, "g_base": g_base}
                for k, t in leaf.items():
                    sub_sample[k][ia] = torch.where(take.reshape(-1, *[1] * (t.dim() - 1)), t,
                                                    sub_sample[k][ia])
                lw_sub[ia] = lw_new
                hist[ia, n - 1] = pn
                S[ia, n] = S[ia, n - 1] + pn
                ok = finite & (dH <= MAX_DELTA_H)
                k = 1
                while n % (2**k) == 0:
                    i0, im = n - 2**k, n - 2 ** (k - 1)
                    ok &= _merge_ok(hist[ia, i0], hist[ia, im - 1], S[ia, im] - S[ia, i0],
                                    hist[ia, im], hist[ia, n - 1], S[ia, n] - S[ia, im])
                    k += 1
                valid[ia] = ok
                x[ia], p[ia], gz[ia] = xn, pn, gzn
            sum_metro[rows] += metro
            n_leap[rows] += leaps
            nonfinite[rows] |= bad
            # merge the valid subtrees into their trajectories
            top = self._take_subtree(u_top[rows, d], lw_sub, log_W[rows]) & valid
            for k in sample:
                t = sample[k].clone()
                t[rows[top]] = sub_sample[k][top]
                sample[k] = t
            log_W[rows[valid]] = torch.logaddexp(log_W[rows], lw_sub)[valid]
            a_near = torch.where(f1, ends["pf"][rows], ends["pb"][rows])
            a_far = torch.where(f1, ends["pb"][rows], ends["pf"][rows])
            rho_a, rho_b = rho[rows], S[:, m]
            turn_ok = _merge_ok(a_far, a_near, rho_a, hist[:, 0], hist[:, m - 1], rho_b)
            rho[rows[valid]] = (rho_a + rho_b)[valid]
            for side, pick in (("f", valid & fwd), ("b", valid & ~fwd)):
                for name, t in (("x", x), ("p", p), ("g", gz)):
                    key = name + side
                    new = ends[key].clone()
                    new[rows[pick]] = t[pick]
                    ends[key] = new
            alive[rows] = valid & turn_ok

        moved = (sample["x"] != x0).any(-1)
        prob = torch.where(n_leap > 0, sum_metro / n_leap.clamp(min=1), torch.zeros_like(n_leap))
        def unflat(t):
            return t.reshape(*shape, *t.shape[1:])

        new = ReplicaState(unflat(sample["x"]), unflat(sample["v"]), unflat(sample["base"]),
                           {**state.extras, "grad_v": unflat(sample["g_v"]),
                            "grad_base": unflat(sample["g_base"])})
        return new, ExploreInfo(unflat(prob), unflat(moved), unflat(nonfinite))
