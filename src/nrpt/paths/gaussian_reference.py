r"""A Gaussian reference for density-only targets (``energy(x)`` alone: a Stan program, a
flat-prior model), one leg, no prior.

A :class:`~nrpt.targets.protocol.TemperatureForm` target has no separable prior to anneal from,
and its temperature path's hot end ``exp(-U / tau)`` may be improper (flat priors).  This path
anneals instead from a normalized Gaussian ``q = N(m, S)``::

    log pi_beta = (1 - beta) log q + beta (-U),    beta_0 = 1 > ... > beta_{P-1} = 0

split as ``log pi_p = base - b_p V`` with ``base = log q`` and ``V = U + log q``; slot ``P - 1``
is ``q`` itself, sampled exactly every iteration.  ``q`` is normalized, so the stepping-stone
estimate is ``log Z`` of ``exp(-U)`` itself.

``reference = "gaussian"``: ``q`` is refitted between adaptive rounds to the round's slot-0
draws by moment matching (:func:`nrpt.paths.variational.fit_gaussian`: full-rank up to
:data:`FULL_RANK_MAX_DIM` dimensions, mean-field above), through the same
``Update.reference`` channel as the two-leg variational reference.  Guards against fitting
``q`` to a slot 0 that never mixed (the failure mode of issue 25):

* with ``systems >= 2`` one ``q`` is fitted to the slot-0 draws of *all* systems, its
  covariance including the spread *between* the systems' means: systems stuck in different
  places widen ``q`` to cover all of them instead of each narrowing onto its own spot;
* ``q`` is refitted only to a round of at least :data:`MIN_DRAWS` pooled draws in which at
  least :data:`MIN_RESTARTS` replicas came down from ``q`` to slot 0: the first, short rounds,
  whose slot 0 has not yet been fed from the hot end, keep the broad initial ``q``;
* the fitted covariance is inflated by :data:`INFLATE` (a slightly wide ``q`` costs little
  barrier; a narrow one misses the target's tails, or a mode);
* a degenerate fit (too few draws, a failed Cholesky factor) keeps the previous ``q``.

(On a two-mode mixture, without these guards 2 of 12 single-system seeds fitted ``q`` to one
mode and reported log Z log 2 off at 80-200 reported errors with R-hat 1.00; with them none
did: tests/test_gaussian_reference.py.)

``reference = "gaussian-fixed"``: the initial ``q`` is kept (a tempered joint against a
broad fixed Gaussian; measured against the refitted one in docs/gaussian_reference.md).

The initial ``q`` (:func:`initial_gaussian`): ``N(m0, s0^2 I)`` with ``m0`` the mean of the
run's initial states and ``s0 = 3 max(1, largest sd of the initial states)``: it covers the
region where the chains start; the first fit (see the guards) replaces it.

**Laplace start** (``reference = "gaussian"`` with a preconditioner, ``precondition`` not
``"none"`` -- a Stan target's defaults --, on a target with a gradient, up to
:data:`LAPLACE_MAX_DIM` dimensions; :func:`laplace_start`, called by the run's builder).
A regression's posterior can sit far from Stan's ``uniform(-2, 2)`` starts on scales that
differ by orders of magnitude
(earnings-earn_height: an intercept of -61,000 with sd 9,700 beside ``log sigma`` with sd 0.02,
a condition number of 1e11): no explorer tuned from a few short rounds finds it, and a ``q``
centred on the starts never overlaps it (that posterior failed with max |z| 606).  Before the
first round about :data:`LAPLACE_STARTS` of the starts (spread over the systems) are carried to
modes of ``U`` by L-BFGS (:func:`find_mode`: strong-Wolfe line search, the target's own
gradient, at most :data:`MODE_EVALS` evaluations each) and the Hessian there (central
differences of the gradient, :func:`nrpt.paths.proper.hessian`) gives each mode's Laplace
covariance ``Sigma_k`` and Laplace mass.  Modes more than :data:`MASS_GAP` nats of mass below
the best are dropped (low_dim_gauss_mix's degenerate solution, one component taking every
point, 452 nats below, had widened ``q0`` 60-fold); the distinct rest weigh equally:

* ``q0 = N(m, c Sigma)``: ``m`` the mean of the modes, ``Sigma`` the mean of their ``Sigma_k``
  plus the spread of the modes (modes far apart widen ``q0`` over all of them), ``c =``
  :data:`LAPLACE_WIDTH` ``^2`` (twice the Laplace sd: a slightly wide ``q`` costs little
  barrier, a narrow one misses tails);
* each system starts from independent draws of ``N(m_r, c Sigma_r)`` around the best mode its
  own starts found (overdispersed by the same factor, so that R-hat can see systems stuck
  apart);
* every slot's metric starts at the
  Cholesky factor of the covariance of the Gaussian that slot anneals between, ``Sigma /
  (beta + (1 - beta) / c)`` (diagonal: its square-rooted diagonal), and, where the step size
  was not given, the step starts at the explorer's optimal scaling for a standard Gaussian in
  those whitened units (:func:`whitened_step`).

A system none of whose starts reached a kept mode (a Hessian not positive definite: a saddle,
a funnel's neck, no mode) starts around the best mode; where no start did, nothing changes.
The rounds then refit ``q`` and the metric from draws: the Laplace fit is a start, not an
assumption -- but the metric's estimates are pooled with it (weighted by
:data:`nrpt.run.build.LAPLACE_ROWS_PER_DIM` rows per dimension, then by the rows of every
round behind it: :attr:`nrpt.adapt.metric.MetricAdaptor.prior_rows`), and ``q``'s refit
regularises in the previous ``q``'s whitened frame (:func:`whitened_fit`).
"""

from __future__ import annotations

import math

import torch

from nrpt import rng
from nrpt.explorers.base import Density
from nrpt.paths import GAUSSIAN_REFERENCES
from nrpt.paths.ladders import GeometricPath, TemperatureLadder, flat_call
from nrpt.paths.proper import hessian
from nrpt.paths.variational import (
    VARIATIONAL_STREAM,
    FittedReferenceEngine,
    GaussianReference,
    TargetMoments,
    VariationalRefit,
    fit_gaussian,
)
from nrpt.recorders.stats import per_system
from nrpt.roles import SegmentView, Update

__all__ = ["GAUSSIAN", "GaussianPath", "GaussianDensity", "GaussianEngine", "GaussianRef",
           "initial_gaussian", "FULL_RANK_MAX_DIM", "INFLATE", "LaplaceStart", "laplace_start",
           "find_mode", "whitened_step", "LAPLACE_WIDTH", "LAPLACE_MAX_DIM", "MODE_EVALS"]

#: the ``reference`` values of this module: refitted between rounds, or fixed
GAUSSIAN = GAUSSIAN_REFERENCES  # (named in nrpt.paths: run checks read it without this module)
#: full-rank ``q`` up to this dimension, mean-field above
FULL_RANK_MAX_DIM = 200
#: the fitted covariance is multiplied by this factor
INFLATE = 1.5
#: ``s0`` of the initial ``q``: this many times the initial states' largest sd (at least 1)
INITIAL_WIDTH = 3.0
#: ``q`` is refitted only to a round of at least this many pooled slot-0 draws (and at least
#: ``d + 2`` for a full-rank fit) ...
MIN_DRAWS = 100
#: ... in which at least this many restarts (a replica came down from ``q`` to slot 0; summed
#: over the systems, whose draws the fit pools) were seen
MIN_RESTARTS = 1
#: the Laplace start: ``q0`` and the starts have this many times the Laplace sd
LAPLACE_WIDTH = 2.0
#: ... up to this dimension (the Hessian costs ``2 dim`` gradient evaluations)
LAPLACE_MAX_DIM = 200
#: L-BFGS's budget of energy and gradient evaluations per system
MODE_EVALS = 2000
#: about this many starts (over all systems) are carried to modes
LAPLACE_STARTS = 8
#: a mode whose Laplace log mass is more than this below the best one's is left out of ``q0``
#: (it holds less than ``e^-10`` of the best one's mass: e.g. low_dim_gauss_mix's degenerate
#: solution, one component taking every point, 452 nats below)
MASS_GAP = 10.0
#: two modes closer than this many Laplace sds (of the later one) are one
SAME_MODE = 0.1
#: the start of a redrawn non-finite start is redrawn at most this many times
_REDRAWS = 20


def initial_gaussian(x0: torch.Tensor, R: int) -> GaussianReference:
    """``q`` before the first fit, from the run's initial states ``x0[..., d]``: ``N(m0,
    s0^2 I)`` (see the module docstring), the same for every system."""
    x = x0.reshape(-1, x0.shape[-1])
    d = x.shape[-1]
    m0 = x.mean(0)
    sd = x.std(0) if x.shape[0] > 1 else torch.ones_like(m0)
    s0 = INITIAL_WIDTH * max(1.0, float(sd.max()) if torch.isfinite(sd).all() else 1.0)
    eye = torch.eye(d, dtype=x.dtype, device=x.device)
    return GaussianReference(m0.expand(R, d).clone(), (s0 * eye).expand(R, d, d).clone())


def find_mode(target, x0: torch.Tensor, max_evals: int = MODE_EVALS):
    """``(mode [d], evaluations)``: L-BFGS (strong-Wolfe line search) on the energy ``U``
    from ``x0`` with the target's gradient (float64, one state at a time); a non-finite
    energy counts as ``+inf`` (the line search backs off).  None where ``U`` or its gradient is
    not finite at ``x0`` or at the end."""
    path = TemperatureLadder([1.0, 2.0])  # (slot 0's components only: U itself)
    density = Density(target, path)
    x = torch.as_tensor(x0, dtype=torch.float64).reshape(1, -1).clone().requires_grad_(True)
    count = [0]

    def closure():
        u, _, g, _ = density.grad_components(x.detach())
        count[0] += 1
        if not (bool(torch.isfinite(u).all()) and bool(torch.isfinite(g).all())):
            u, g = torch.full_like(u, math.inf), torch.zeros_like(g)
        x.grad = g.detach().clone()
        return u.sum().detach()

    u0 = closure()
    if not math.isfinite(float(u0)):
        return None
    opt = torch.optim.LBFGS([x], lr=1.0, max_iter=int(max_evals), max_eval=int(max_evals),
                            history_size=20, tolerance_grad=1e-9, tolerance_change=1e-12,
                            line_search_fn="strong_wolfe")
    opt.step(closure)
    m = x.detach()
    u, _, g, _ = density.grad_components(m)
    if not (bool(torch.isfinite(u).all()) and bool(torch.isfinite(g).all())):
        return None
    return m[0], count[0]


def laplace_fit(target, x0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float] | None:
    """``(mode, L, log mass)``: :func:`find_mode` from ``x0``, the Cholesky factor ``L`` of
    the inverse Hessian of ``U`` there and the Laplace log mass of the mode, ``-U(mode) +
    log det L`` (up to a constant); None where the Hessian is not positive definite."""
    found = find_mode(target, x0)
    if found is None:
        return None
    mode = found[0]
    density = Density(target, TemperatureLadder([1.0, 2.0]))
    h = hessian(density, mode[None])[0]
    chol, info = torch.linalg.cholesky_ex(h)
    if int(info) != 0 or not bool(torch.isfinite(chol).all()):
        return None
    eye = torch.eye(mode.numel(), dtype=torch.float64)
    up = torch.linalg.solve_triangular(chol, eye, upper=False).T  # H^-1 = up up^T
    low, info = torch.linalg.cholesky_ex(0.5 * (up @ up.T + (up @ up.T).T))
    if int(info) != 0 or not bool(torch.isfinite(low).all()):
        return None
    u, _ = density(mode[None])
    mass = -float(u[0]) + float(torch.diagonal(low).log().sum())
    if not math.isfinite(mass):
        return None
    return mode, low, mass


class LaplaceStart:
    """The Laplace start of :func:`laplace_start`: ``q0`` (``mean [d]``, ``chol [d, d]``:
    ``N(m, c Sigma)``), the initial states ``x [R, P, d]``, the pooled Laplace covariance's
    factor ``sigma_chol`` (of ``Sigma``) and ``fitted``, the systems whose fit succeeded."""

    def __init__(self, mean, chol, x, sigma_chol, fitted: list[bool], modes: int = 1):
        self.mean, self.chol, self.x = mean, chol, x
        self.sigma_chol, self.fitted, self.modes = sigma_chol, fitted, int(modes)

    def metric(self, betas, mode: str) -> torch.Tensor:
        """Per-slot metric ``[P, d]`` (diagonal) or ``[P, d, d]`` (dense): the factor of
        ``Sigma / (beta + (1 - beta) / c)``, the covariance of the Gaussian slot ``beta``
        anneals between (``q0`` to the Laplace approximation of the target)."""
        b = torch.as_tensor(list(betas), dtype=torch.float64)
        c = LAPLACE_WIDTH ** 2
        s = 1.0 / torch.sqrt(b + (1.0 - b) / c)  # [P]
        if mode == "diagonal":
            sd = (self.sigma_chol ** 2).sum(-1).sqrt()  # [d]
            return s[:, None] * sd
        return s[:, None, None] * self.sigma_chol

    def note(self) -> dict:
        return {"systems_fitted": sum(self.fitted), "systems": len(self.fitted),
                "modes": self.modes, "width": LAPLACE_WIDTH}


def laplace_start(target, x0: torch.Tensor, generator: torch.Generator) -> LaplaceStart | None:
    """The Laplace start (module docstring) from the initial states ``x0 [R, P, d]``: the
    first ``k`` starts of each system, ``k = ceil(`` :data:`LAPLACE_STARTS` ``/ R)`` (at most
    ``P``), are carried to modes; distinct modes (more than :data:`SAME_MODE` Laplace sds apart)
    weigh equally in ``q0``.  None where no Hessian is positive definite, or ``d >``
    :data:`LAPLACE_MAX_DIM`."""
    R, P, d = x0.shape
    if d > LAPLACE_MAX_DIM:
        return None
    k = min(P, -(-LAPLACE_STARTS // R))
    xs = x0.detach().double().cpu()
    fits = [[laplace_fit(target, xs[r, j]) for j in range(k)] for r in range(R)]
    found = [f for row in fits for f in row if f is not None]
    if not found:
        return None
    best = max(f[2] for f in found)
    kept = [f for f in found if f[2] >= best - MASS_GAP]  # (the others hold < e^-10 of it)
    distinct: list[tuple] = []
    for f in sorted(kept, key=lambda f: -f[2]):  # (within SAME_MODE Laplace sds: one mode)
        if not any(float(torch.linalg.solve_triangular(
                f[1], (f[0] - g[0])[:, None], upper=False).norm()) < SAME_MODE
                for g in distinct):
            distinct.append(f)
    modes = torch.stack([f[0] for f in distinct])
    covs = torch.stack([f[1] @ f[1].T for f in distinct])
    mean = modes.mean(0)
    dm = modes - mean
    sigma = covs.mean(0) + dm.T @ dm / len(distinct)
    sigma_chol, info = torch.linalg.cholesky_ex(0.5 * (sigma + sigma.T))
    if int(info) != 0 or not bool(torch.isfinite(sigma_chol).all()):
        return None
    density = Density(target, TemperatureLadder([1.0, 2.0]))
    x = xs.clone()
    for r, row in enumerate(fits):
        own = [f for f in row if f is not None and f[2] >= best - MASS_GAP]
        mode, low, _ = max(own, key=lambda f: f[2]) if own else distinct[0]
        z = torch.randn(P, d, generator=generator, dtype=torch.float64)
        xr = mode + LAPLACE_WIDTH * z @ low.T
        for _ in range(_REDRAWS):  # a start where U is not finite is drawn again
            u, _ = density(xr)
            bad = ~torch.isfinite(u)
            if not bool(bad.any()):
                break
            z = torch.randn(P, d, generator=generator, dtype=torch.float64)
            xr = torch.where(bad[:, None], mode + LAPLACE_WIDTH * z @ low.T, xr)
        u, _ = density(xr)
        x[r] = torch.where(torch.isfinite(u)[:, None], xr, mode.expand_as(xr))
    return LaplaceStart(mean, LAPLACE_WIDTH * sigma_chol, x.to(x0), sigma_chol,
                        [any(f is not None for f in row) for row in fits], len(distinct))


def whitened_step(explorer, dim: int) -> float | None:
    """A first step size in whitened units (a standard Gaussian target): MALA ``1.65
    d^(-1/6)`` (Roberts & Rosenthal 1998; acceptance 0.574), random-walk Metropolis ``2.38
    d^(-1/2)`` (Roberts, Gelman & Gilks 1997; 0.234); None for other explorers (their own
    default is kept)."""
    order = getattr(explorer, "acceptance_order", None)
    if order == 3:
        return 1.65 * dim ** (-1.0 / 6.0)
    if order == 1:
        return 2.38 * dim ** -0.5
    return None


class GaussianPath(GeometricPath):
    """``log pi_beta = log q + beta (-U - log q)``: ``V = U + log q``, ``base = log q``; states
    ``x[..., R, S, d]`` with the system axis third from the end (as every engine call has it)."""

    def __init__(self, betas, q: GaussianReference, reference: str = "gaussian"):
        super().__init__(betas)
        if not self.has_reference:
            raise ValueError(f"reference {reference!r} needs betas ending at 0 (q is sampled "
                             f"exactly at the hot end); got betas[-1] = {self.betas[-1]:g}")
        self.reference = reference
        self.set_reference(q)

    def set_reference(self, q: GaussianReference) -> None:
        self.q = q
        self.rows = torch.arange(q.mean.shape[0], device=q.mean.device)
        #: every system's q is the same (always so for the pooled refit): states of any shape
        #: (an explorer that flattens its replicas, NUTS, AutoMALA) use system 0's
        self.shared = bool(torch.equal(q.mean, q.mean[:1].expand_as(q.mean))
                           and torch.equal(q.chol, q.chol[:1].expand_as(q.chol)))

    def log_q(self, x):
        """``log q`` of ``x[..., R, S, d]`` (or of any shape ``[..., d]`` when :attr:`shared`)."""
        if self.shared:
            return self.q.log_prob(x.unsqueeze(-2).unsqueeze(-2), self.rows[:1])[..., 0, 0]
        return self.q.log_prob(x, self.rows)

    def grad_log_q(self, x):
        """``grad log q`` (shapes as :meth:`log_q`)."""
        if self.shared:
            return self.q.grad_log_prob(x.unsqueeze(-2).unsqueeze(-2), self.rows[:1])[..., 0, 0, :]
        return self.q.grad_log_prob(x, self.rows)

    def components(self, target, x):
        u = flat_call(target.energy, x, "energy")
        lq = self.log_q(x)
        return u + lq, lq

    def reference_sd(self) -> torch.Tensor:
        """The sd of ``q`` per coordinate (of system 0's ``q``)."""
        return (self.q.chol[0] ** 2).sum(-1).sqrt()

    def describe(self) -> dict:
        return {**super().describe(), "reference": self.reference}


class GaussianDensity(Density):
    """:class:`~nrpt.explorers.base.Density` for :class:`GaussianPath`: a target-supplied
    gradient of the energy (``energy_and_grad`` or ``grad_energy``) plus the closed-form
    gradient of ``log q``; otherwise autograd through the components."""

    def _supplied_components(self, x):
        t, path = self.target, self.path
        if not (hasattr(t, "energy_and_grad") or hasattr(t, "grad_energy")):
            return None
        flat = x.reshape(-1, x.shape[-1])
        with torch.no_grad():
            if hasattr(t, "energy_and_grad"):
                u, gu = t.energy_and_grad(flat)
            else:
                u, gu = t.energy(flat), t.grad_energy(flat)
            u = u.to(x.dtype).reshape(x.shape[:-1])
            gu = gu.to(x.dtype).reshape(x.shape)
            lq = path.log_q(x)
            gq = path.grad_log_q(x)
        return u + lq, lq, gu + gq, gq


class GaussianEngine(FittedReferenceEngine):
    """:class:`~nrpt.core.engine.PTEngine` whose hot end is ``q`` (draws from
    :data:`~nrpt.paths.variational.VARIATIONAL_STREAM`), which installs a refitted ``q``
    (``Update.reference``, :class:`~nrpt.paths.variational.FittedReferenceEngine`) and keeps
    it in its checkpoints."""

    density_class = GaussianDensity
    path: GaussianPath
    def _reference_block(self, k: int, B: int) -> torch.Tensor:
        g = rng.block_generator(self.seed, VARIATIONAL_STREAM, k, B)
        z = torch.randn(B, self.R, self.dim, generator=g, dtype=self.dtype).to(self.device)
        return self.q.sample(z)

    def state_dict(self) -> dict:
        sd = super().state_dict()
        sd["gaussian_reference"] = {**self.q.state_dict(), "refits": self.refits.clone(),
                                    "fallbacks": self.fallbacks.clone()}
        return sd

    def load_state_dict(self, sd: dict) -> None:
        gs = sd["gaussian_reference"]
        self.path.set_reference(GaussianReference.from_state(gs, self.dtype, self.device))
        self.refits, self.fallbacks = gs["refits"].clone(), gs["fallbacks"].clone()
        self._ref_rows = None
        super().load_state_dict(sd)


class SlotZeroMoments(TargetMoments):
    """:class:`~nrpt.paths.variational.TargetMoments` over the ``R`` systems (one row each);
    :meth:`pooled` pools all systems when there are at least two (the between-system spread
    of the means enters the co-moment), else each system alone."""

    def pooled(self):
        n, R = self.n, self.E
        m2 = self.m2 if self.full else torch.diag_embed(self.m2)
        if R < 2:
            return torch.full((R,), n, device=self.device), self.mean, m2
        mean = self.mean.mean(0)
        dm = self.mean - mean
        co = m2.sum(0) + n * dm.T @ dm
        d = mean.shape[-1]
        return (torch.full((R,), n * R, device=self.device), mean.expand(R, d),
                co.expand(R, d, d))

    def follow_ladder(self, m) -> None:
        """(slot 0's moments only: slot 0 stays slot 0 when the ladder grows or shrinks)"""


def whitened_fit(n, mean, co, family: str, prev: GaussianReference):
    """:func:`fit_gaussian` in the whitened frame of the previous ``q`` (``chol^-1 co
    chol^-T``; the fitted factor mapped back, ``chol C``): its shrinkage toward the diagonal
    and its jitter (relative to the mean variance) then act in units of the posterior's own
    scales.  In the original frame they are absolute: on earnings-earn_height (sds 9,700 and
    0.02, correlation -0.9999) the jitter ``1e-6 x`` the mean variance made ``log sigma``'s sd
    6.5 instead of 0.02 and broke the last pair's swaps (acceptance 0.01).

    Where every system's moments and previous ``q`` are the same (the pooled refit), the fit
    is made once and shared (batched factorizations may differ in the last bit per row, and
    :attr:`GaussianPath.shared` needs them equal)."""
    R = mean.shape[0]
    if R > 1 and all(bool(torch.equal(t, t[:1].expand_as(t)))
                     for t in (n, mean, co, prev.mean, prev.chol)):
        q, ok = whitened_fit(n[:1], mean[:1], co[:1], family,
                             GaussianReference(prev.mean[:1], prev.chol[:1]))
        return (GaussianReference(q.mean.expand(R, -1).clone(), q.chol.expand(R, -1, -1).clone()),
                ok.expand(R).clone())
    inv = prev.inv  # [R, d, d]: chol^-1
    co_w = inv @ co @ inv.transpose(-1, -2)
    co_w = 0.5 * (co_w + co_w.transpose(-1, -2))
    d = mean.shape[-1]
    eye = torch.eye(d, dtype=co.dtype, device=co.device).expand_as(co_w).clone()
    q_w, ok = fit_gaussian(n, mean, co_w, family, GaussianReference(prev.mean, eye))
    chol = torch.where(ok[:, None, None], prev.chol @ q_w.chol, prev.chol)
    chol, info = torch.linalg.cholesky_ex(chol @ chol.transpose(-1, -2))  # (lower triangular)
    ok = ok & (info == 0) & torch.isfinite(chol).all(-1).all(-1)
    return (GaussianReference(torch.where(ok[:, None], q_w.mean, prev.mean),
                              torch.where(ok[:, None, None], chol, prev.chol)), ok)


class GaussianRefit(VariationalRefit):
    """Between rounds: fit ``q`` (:func:`fit_gaussian`; ``whitened``: :func:`whitened_fit`) to
    the pooled slot-0 draws, inflate its covariance by :data:`INFLATE`, and hand it to the
    engine (``Update.reference``)."""

    name = "gaussian-reference"

    def __init__(self, family: str, previous, whitened: bool = False):
        super().__init__(family, previous)
        self.whitened = bool(whitened)

    def end_segment(self, view: SegmentView) -> Update | None:
        if view.last:
            return None
        n, mean, co = view.recorders["target_moments"].pooled()
        prev = self.previous()
        if self.whitened:
            q, ok = whitened_fit(n, mean, co, self.family, prev)
        else:
            q, ok = fit_gaussian(n, mean, co, self.family, prev)
        # a round too short, or one in which no replica came down from q to slot 0 (in any
        # system: the fit pools them), keeps the previous q
        came = view.recorders["round_trips"].counts()["restarts"].sum().cpu() >= MIN_RESTARTS
        ok = ok & (n.cpu() >= MIN_DRAWS) & came
        q = GaussianReference(torch.where(ok[:, None], q.mean, prev.mean),
                              torch.where(ok[:, None, None], q.chol, prev.chol))
        chol = torch.where(ok[:, None, None], q.chol * math.sqrt(INFLATE), q.chol)
        return Update(reference=(GaussianReference(q.mean, chol), ok),
                      note={"gaussian_refitted": ok.tolist()})

    def follow_ladder(self, m) -> None:
        """(no per-slot tables: the fit reads slot 0's moments)"""


class GaussianRef:
    """The Gaussian reference as the parts it adds to a run (engine, refit adaptor, moments
    recorder, summary fields): ``Run.facts["hot_end"]``."""

    def __init__(self, reference: str, R: int, *, kind: str, path, comm, cfg):
        if reference not in GAUSSIAN:
            raise ValueError(f"reference must be one of {', '.join(GAUSSIAN)}; got "
                             f"{reference!r}")
        if kind != "temperature":
            raise ValueError(f"reference {reference!r} is for targets with energy(x) only; "
                             f"this target has a prior (reference_log_prob): use reference "
                             f"'prior', or 'variational' (a fitted Gaussian leg joined to the "
                             f"prior leg)")
        if reference == "gaussian" and getattr(cfg, "rounds", None) is None:
            raise ValueError("reference 'gaussian' is fitted between adaptive rounds: give "
                             "rounds = N, or use reference 'gaussian-fixed'")
        if not path.has_reference:
            raise ValueError(f"reference {reference!r} needs betas ending at 0 (q is sampled "
                             f"exactly); got betas[-1] = {path.betas[-1]:g}")
        if comm is not None:
            raise ValueError(f"reference {reference!r} runs in one process; got {comm.world} "
                             f"processes")
        self.reference, self.R = reference, int(R)
        self.fitted = reference == "gaussian"
        self.family = None
        self.start: LaplaceStart | None = None

    def engine(self, target, path, explorer, scheme, rule, *, initial_states,
               start: LaplaceStart | None = None, **kwargs) -> GaussianEngine:
        """The engine; ``start`` (:func:`laplace_start`): ``q0`` and the initial states from
        it instead of from ``initial_states``."""
        d = int(target.dim)
        self.family = "full-rank" if d <= FULL_RANK_MAX_DIM else "mean-field"
        self.start = start
        if start is not None:
            initial_states = start.x.to(initial_states)
            dt, dev = initial_states.dtype, initial_states.device
            q0 = GaussianReference(start.mean.to(dev, dt).expand(self.R, d).clone(),
                                   start.chol.to(dev, dt).expand(self.R, d, d).clone())
        else:
            q0 = initial_gaussian(initial_states, self.R)
        self._engine = GaussianEngine(target, GaussianPath(path.betas, q0, self.reference),
                                      explorer, scheme, rule, systems=self.R,
                                      initial_states=initial_states, **kwargs)
        return self._engine

    def facts(self) -> dict:
        return {"hot_end": self, "reference_normalized": True}

    def adaptors(self) -> list:
        if not self.fitted:
            return []
        # (a Laplace start: the posterior's scales may lie far apart, the refit is whitened)
        return [GaussianRefit(self.family, lambda: self._engine.q,
                              whitened=self.start is not None)]

    def recorders(self, **kw) -> dict:
        if not self.fitted:
            return {}
        return {"target_moments": SlotZeroMoments(self.R, self._engine.dim,
                                                  self.family == "full-rank", **kw)}

    def summary(self, run) -> dict:
        eng = run.engine
        out = {"reference": self.reference, "gaussian_family": self.family,
               "gaussian_refits": eng.refits, "gaussian_fallbacks": eng.fallbacks,
               "gaussian_mean": eng.q.mean, "gaussian_var": (eng.q.chol ** 2).sum(-1)}
        res = {k: per_system(v, self.R) for k, v in out.items()}
        start = self.start
        if start is not None:
            res["laplace_start"] = start.note()
        res["gaussian_note"] = (
            "hot end: a normalized Gaussian q (" + ("started from a Laplace fit at the mode "
            f"({start.modes} mode(s), sd x{LAPLACE_WIDTH:g}), " if start is not None else "")
            + ("refitted between rounds to the pooled "
            f"slot-0 draws, covariance x{INFLATE:g}" if self.fitted else "fixed") +
            "); log Z is that of exp(-energy) itself" + (
                "; chosen by the target's default_reference" if run.facts.get(
                    "reference_from_target") else ""))
        return res
