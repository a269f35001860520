r"""Is the hot end of a temperature ladder a probability density?  (issue 25, item 4)

The hottest slot of a temperature ladder samples ``exp(-beta_min U(x))``, ``beta_min = 1 /
max_temperature``.  A target with flat (improper) priors is proper at ``beta = 1`` thanks to
its likelihood, but tempering flattens the likelihood: a linear regression with flat priors on
the coefficients ``theta`` (``k`` of them) and on ``log sigma`` has, for ``n`` observations,

    int exp(-beta U) dtheta  ∝  exp(-beta (n - 1) s + k s)   as  s = log sigma -> inf,

integrable only for ``beta (n - 1) > k``: the default ``max_temperature = 25`` breaks it for
``n < 25 k + 1``, and the hot chains then wander off to ``sigma -> inf`` without an error.

The check (:func:`hot_end_check`), before sampling: from the target's mode ``m`` (damped
Newton steps from its initial state, :func:`laplace`), along each coordinate ``i`` and each
direction, the profile log density of the hot slot at ``x_i = m_i +- tau sd_i`` (``sd_i`` the
Laplace standard deviation of the target: distances in the target's own scale) is approximated
by the Laplace integral over the other coordinates at the slice point,

    g(tau) = -beta U(x) - 1/2 log det H_{-i}(x),   x = m +- tau sd_i e_i,

(``sd_i`` at least 1: a narrow well of a multimodal target does not set the scale of its
tails; ``H_{-i}`` the Hessian of ``U`` in the other coordinates, by central differences of the
gradient).  In one dimension ``exp(g)`` is integrable only if ``g`` falls faster than ``-log
tau``; a direction along which ``h(tau) = g(tau) + log tau`` *rises* at ``tau = 8, 24, 72, 216``
(by more than :data:`MARGIN` in all) carries an unbounded amount of mass: the hot end is
improper (or so wide that the hot chains drift that far, which is as bad in practice).
Where no mode with a positive definite Hessian is found (the target itself improper, or not
differentiable) nothing is judged.  The
largest ``beta`` that still rises there, ``beta_c = Delta(-1/2 log det H + log tau) / Delta U``
on the far segment, gives the fix: ``max_temperature <= 1 / (2 beta_c)`` (a factor 2 inside
the boundary).

Conservative by construction: a direction where ``U`` is not finite (outside the support), the
Hessian is not positive definite (heavy or non-convex tails) or the target has no gradient is
not judged; only ``dim <=`` :data:`MAX_DIM` targets are checked (``6 dim`` Laplace points of
``2 dim + 1`` gradient evaluations each, in two batches).  Polynomial tails are improper once
tempered enough -- a Cauchy's ``exp(-beta log(1 + x^2))`` for ``beta <= 1/2`` -- and are
refused as such; exponential and lighter tails stay proper at every temperature and pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from nrpt.roles import Density

__all__ = ["HotEnd", "hot_end_check", "hessian", "laplace", "OFFSETS", "MARGIN", "MAX_DIM"]

#: distances from the typical point (in the target's own coordinates) where the profile is read
OFFSETS = (8.0, 24.0, 72.0, 216.0)
#: the rise of ``h`` over the offsets that counts as evidence (nats)
MARGIN = 1.0
#: targets with more coordinates are not checked (the cost grows as ``dim^2``)
MAX_DIM = 64
_NEWTON_STEPS = 50
#: central-difference step of the Hessian, relative to ``max(1, |x|)``
_EPS = 1e-4


@dataclass(frozen=True)
class HotEnd:
    """An improper hot end: ``coordinate`` and ``direction`` (+1 / -1) along which the profile
    rises (``rise``: ``h(216) - h(8)`` in nats), ``beta`` the hot end's, ``beta_critical`` the
    largest ``beta`` that still rises there (None where no ``beta`` helps: ``U`` itself does
    not grow that way), and the recommended ``max_temperature`` (None likewise)."""

    coordinate: int
    direction: int
    rise: float
    beta: float
    beta_critical: float | None
    max_temperature: float | None

    def message(self, name: str | None = None) -> str:
        where = (f"along coordinate {self.coordinate}" + (f" {name!r}" if name else "")
                 + f" ({'+' if self.direction > 0 else '-'} direction)")
        head = (f"the hottest slot's density exp(-U / {1 / self.beta:g}) is improper (or "
                f"practically so): {where} its profile log density still rises by "
                f"{self.rise:.3g} nats between {OFFSETS[0]:g} and {OFFSETS[-1]:g} standard "
                f"deviations from the mode, so the hot "
                f"chains would drift off without bound (typically a flat prior, e.g. on a "
                f"scale, whose likelihood tempering flattens)")
        if self.max_temperature is not None:
            fix = (f"lower max_temperature to {self.max_temperature:.3g} or less (it is "
                   f"proper there for beta > {self.beta_critical:.3g}, i.e. temperatures below "
                   f"{1 / self.beta_critical:.3g})")
        elif self.beta_critical is not None:
            fix = (f"it is proper there only for temperatures below "
                   f"{1 / self.beta_critical:.3g} (beta > {self.beta_critical:.3g}, heavy "
                   f"tails), too narrow a ladder to help")
        else:
            fix = ("the target's energy does not grow that way at any temperature: give the "
                   "model proper priors")
        return (f"{head}; {fix}, or anneal from a Gaussian instead (reference='gaussian', "
                f"with rounds: exact at the hot end whatever the priors), or use a path with a "
                f"proper reference (for a PyMC model with proper priors, path='prior')")


def _fmt_t(t: float) -> float:
    """Two significant digits, rounded down (a recommended temperature errs low)."""
    if not (t > 0 and math.isfinite(t)):
        return t
    e = math.floor(math.log10(t)) - 1
    return round(math.floor(t / 10 ** e + 1e-9) * 10 ** e, 12)


def hot_end_check(target, path, x0: torch.Tensor, beta: float) -> HotEnd | None:
    """The coordinate direction along which ``exp(-beta U)`` looks most improper (module
    docstring), or None.  ``x0``: a typical point ``[dim]`` (the mode is searched from it);
    ``path``: the temperature path (for :class:`~nrpt.roles.Density`)."""
    x0 = torch.as_tensor(x0, dtype=torch.float64).reshape(-1)
    d = x0.numel()
    beta = float(beta)
    if d > MAX_DIM or not (0.0 < beta < 1.0):
        return None
    density = Density(target, path)
    try:
        fit = laplace(target, path, x0)
    except Exception:  # noqa: BLE001 (a target that cannot be differentiated: not judged)
        fit = None
    if fit is None:
        return None
    center, low = fit
    # the Laplace sd of each coordinate, at least 1 (a narrow well of a multimodal target does
    # not set the scale of its tails)
    scale = torch.clamp((low * low).sum(1).sqrt(), min=1.0)
    if not bool(torch.isfinite(scale).all()):
        return None
    taus = torch.tensor(OFFSETS, dtype=torch.float64)
    # points [2 d, offsets, d]: coordinate i, direction +-, offset tau sd_i
    dirs = torch.cat([torch.diag(scale), -torch.diag(scale)])
    pts = center + dirs[:, None, :] * taus[None, :, None]
    flat = pts.reshape(-1, d)
    try:
        u, logdet = _energy_and_logdet(density, flat,
                                       dirs.abs().argmax(1).repeat_interleave(len(OFFSETS)))
    except Exception:  # noqa: BLE001 (a target that cannot be evaluated there: not judged)
        return None
    n_off = len(OFFSETS)
    u, logdet = u.reshape(2 * d, n_off), logdet.reshape(2 * d, n_off)
    ok = torch.isfinite(u).all(1) & torch.isfinite(logdet).all(1)
    h = -beta * u - 0.5 * logdet + torch.log(taus)
    rise = h[:, -1] - h[:, 0]
    rising = ok & (h.diff(dim=1) > 0).all(1) & (rise > MARGIN)
    if not bool(rising.any()):
        return None
    k = int(torch.argmax(torch.where(rising, rise, -torch.inf)))
    du = float(u[k, -1] - u[k, -2])
    dl = float(-0.5 * (logdet[k, -1] - logdet[k, -2]) + math.log(OFFSETS[-1] / OFFSETS[-2]))
    bc, rec = None, None
    if du > 0 and dl > 0:
        bc = dl / du
        for margin in (2.0, 1.25):  # inside the boundary by a factor 2, else 1.25
            t = _fmt_t(1.0 / (margin * bc))
            if t > 1.0:
                rec = t
                break
    return HotEnd(coordinate=k % d, direction=1 if k < d else -1,
                  rise=float(h[k, 2] - h[k, 0]), beta=beta, beta_critical=bc,
                  max_temperature=rec)


def laplace(target, path, x0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(mode, L)``: the minimum of the energy ``U`` found by damped Newton steps from
    ``x0`` (``[dim]``; a backtracking line search, gradient steps where the Hessian is not
    positive definite) and the Cholesky factor ``L`` of the covariance ``H^-1`` there; None
    where no positive definite Hessian is reached or the target cannot be differentiated."""
    density = Density(target, path)
    x = torch.as_tensor(x0, dtype=torch.float64).reshape(1, -1).clone()
    d = x.shape[1]
    if d > MAX_DIM:
        return None
    u, _, g, _ = density.grad_components(x)
    if not (torch.isfinite(u).all() and torch.isfinite(g).all()):
        return None  # (a target without a gradient has a zero Hessian: refused below)
    chol = None
    for _ in range(_NEWTON_STEPS):
        h = hessian(density, x)[0]
        chol, info = torch.linalg.cholesky_ex(h)
        if int(info) == 0 and torch.isfinite(chol).all():
            step = -torch.cholesky_solve(g.reshape(-1, 1), chol).reshape(1, d)
        else:
            chol = None
            step = -g / max(1.0, float(g.norm()))
        t, moved = 1.0, False
        for _ in range(30):  # backtracking: the energy must not rise
            xn = x + t * step
            un, _, gn, _ = density.grad_components(xn)
            if torch.isfinite(un).all() and torch.isfinite(gn).all() and un <= u + 1e-12:
                moved = True
                break
            t *= 0.5
        if not moved:
            break
        small = float((t * step).abs().max()) < 1e-9 * max(1.0, float(x.abs().max()))
        x, u, g = xn, un, gn
        if small:
            break
    h = hessian(density, x)[0]
    chol, info = torch.linalg.cholesky_ex(h)
    if int(info) != 0 or not torch.isfinite(chol).all():
        return None
    # L with L L^T = H^-1: the inverse of H's Cholesky factor, transposed
    eye = torch.eye(d, dtype=torch.float64)
    cov_chol = torch.linalg.solve_triangular(chol, eye, upper=False).T  # (L_H^-1)^T: upper
    cov = cov_chol @ cov_chol.T
    cov = 0.5 * (cov + cov.T)
    low, info = torch.linalg.cholesky_ex(cov)
    if int(info) != 0 or not torch.isfinite(low).all():
        return None
    return x[0], low


def hessian(density: Density, x: torch.Tensor) -> torch.Tensor:
    """The Hessian ``[m, d, d]`` of the tempered component ``v`` (the energy ``U`` of a
    temperature path) at the points ``x[m, d]``: central differences of its gradient (the
    target's own, else autograd), step ``1e-4 max(1, |x_j|)``, symmetrized."""
    m, d = x.shape
    eps = _EPS * torch.clamp(x.abs(), min=1.0)  # [m, d]
    e = torch.eye(d, dtype=x.dtype)
    plus = x[:, None, :] + eps[:, :, None] * e  # [m, d, d]: perturb coordinate j
    minus = x[:, None, :] - eps[:, :, None] * e
    _, _, gp, _ = density.grad_components(torch.cat([plus, minus], 1).reshape(-1, d))
    gp = gp.reshape(m, 2, d, d)
    hess = (gp[:, 0] - gp[:, 1]) / (2 * eps[:, :, None])  # row j: d grad / d x_j
    return 0.5 * (hess + hess.transpose(1, 2))


def _energy_and_logdet(density: Density, x: torch.Tensor, skip: torch.Tensor):
    """``U`` at the points ``x[m, d]`` and ``log det`` of the Hessian of ``U`` without row and
    column ``skip[m]`` (central differences of the gradient; ``inf`` where it is not positive
    definite or not finite)."""
    m, d = x.shape
    u, _, gu, _ = density.grad_components(x)
    if d == 1:
        return u, torch.zeros_like(u)
    hess = hessian(density, x)
    keep = torch.ones(m, d, dtype=torch.bool)
    keep[torch.arange(m), skip] = False
    sub = hess[keep[:, :, None] & keep[:, None, :]].reshape(m, d - 1, d - 1)
    chol, info = torch.linalg.cholesky_ex(sub)
    logdet = 2.0 * torch.log(torch.diagonal(chol, dim1=1, dim2=2)).sum(1)
    bad = (info != 0) | ~torch.isfinite(logdet) | ~torch.isfinite(gu).all(1)
    return u, torch.where(bad, torch.full_like(logdet, math.inf), logdet)
