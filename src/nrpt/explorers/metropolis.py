"""Exact full-batch explorers: random-walk Metropolis, MALA and HMC.

Each leaves its slot's density ``pi_p ∝ exp(base - b_p v)`` invariant (Metropolis-Hastings
correction), per-slot step size ``step_size[R, P]``.  MALA and HMC keep the gradient cache of
:mod:`nrpt.explorers.base` (an accepted proposal brings its own gradients): one gradient
evaluation per step for MALA, ``leapfrog_steps`` for HMC.
"""

from __future__ import annotations

import math

import torch

from nrpt.explorers.base import (
    GRAD_KEYS,
    NOISE_DTYPE,
    PRECONDITION,
    STEP_SIZE,
    Density,
    ExploreInfo,
    Explorer,
    Noise,
    ReplicaState,
    metric_mul,
    metric_tmul,
    noise_dtype,
    proposal_normal,
    slot_grad,
)
from nrpt.options import Option, integer, parse_int

__all__ = ["RWMH", "MALA", "HMC", "MALAThenHMC", "metropolis_select", "finite_rows",
           "GradientCached"]


def metropolis_select(
    state: ReplicaState,
    proposal: ReplicaState,
    log_alpha: torch.Tensor,
    proposal_ok: torch.Tensor,
    noise: Noise,
    sub: int,
) -> tuple[ReplicaState, ExploreInfo]:
    """Accept ``proposal`` where log u < log alpha.  A proposal that is not ``proposal_ok``
    (non-finite density or gradient) is rejected and flagged; a current state with density 0
    (log density -inf) accepts any finite proposal."""
    # (-inf where not ok or NaN: nan_to_num leaves the infinities as they are)
    log_alpha = torch.where(proposal_ok, torch.nan_to_num(log_alpha, nan=-math.inf,
                                                          posinf=math.inf, neginf=-math.inf),
                            -math.inf)
    u = noise.uniform(sub, log_alpha.dtype)
    accepted = torch.log(u) < log_alpha
    prob = torch.exp(torch.clamp(log_alpha, max=0.0))
    return state.where(accepted, proposal), ExploreInfo(prob, accepted, ~proposal_ok)


def _finite_rows(x: torch.Tensor) -> torch.Tensor:
    """Rows of ``x[..., dim]`` with no NaN or infinity, as ``isfinite`` of their sum (a row whose
    sum overflows counts as non-finite too)."""
    return torch.isfinite(x.sum(dim=-1))


class _NoiseDtype:
    """``noise_dtype`` (:data:`nrpt.explorers.base.NOISE_DTYPE`): ``"float64"`` (the state's
    dtype) or ``"float32"`` proposal noise."""

    _noise: torch.dtype | None = None

    def __init__(self, noise_dtype: str = "float64"):
        self._set_noise_dtype(noise_dtype)

    def _set_noise_dtype(self, name: str) -> None:
        self._noise = noise_dtype(name)
        self.noise_dtype = name

    def describe(self) -> dict:
        out = super().describe()  # type: ignore[misc]
        if self._noise is not None:  # (the default leaves the description as it was)
            out["noise_dtype"] = self.noise_dtype
        return out


class RWMH(_NoiseDtype, Explorer):
    """Gaussian random-walk Metropolis: x' = x + h * L xi, xi ~ N(0, I) (``L``: the slot's
    preconditioner ``metric``, identity by default; the proposal stays symmetric).
    ``noise_dtype="float32"``: xi drawn in float32 (still symmetric: exact)."""

    name = "rwmh"
    target_acceptance, acceptance_order, compilable = 0.3, 1, True
    preconditionable = True
    options = (STEP_SIZE, PRECONDITION, NOISE_DTYPE)

    def step(self, state, b, step_size, density: Density, noise: Noise, sub: int = 0,
             metric=None):
        xi = proposal_normal(noise, sub, state.x, self._noise)
        x_new = state.x + step_size[..., None] * metric_mul(metric, xi)
        v, base = density(x_new)
        prop = ReplicaState(x_new, v, base)
        lp_new = prop.log_density(b)
        ok = torch.isfinite(lp_new) & _finite_rows(x_new)
        return metropolis_select(state, prop, lp_new - state.log_density(b), ok, noise, sub)


class _GradientCached(Explorer):
    """Shared by MALA and HMC: the per-replica cache of component gradients."""

    uses_gradient = True

    def prepare(self, state: ReplicaState, density: Density) -> ReplicaState:
        """Fill ``extras["grad_v"]``, ``extras["grad_base"]`` (``[R, P, dim]``) at ``state.x``;
        ``x``, ``v``, ``base`` and other extras are kept as they are."""
        _, _, g_v, g_base = density.grad_components(state.x)
        return state.replace(extras={**state.extras, "grad_v": g_v, "grad_base": g_base})

    def _cached(self, state: ReplicaState, density: Density) -> ReplicaState:
        """``state`` with a cache of the right shape (computed here if missing)."""
        ex = state.extras
        if all(k in ex and ex[k].shape == state.x.shape for k in GRAD_KEYS):
            return state
        return self.prepare(state, density)


#: the shared pieces, public for the gradient explorers of other modules (automala, nuts)
finite_rows = _finite_rows
GradientCached = _GradientCached


class MALA(_NoiseDtype, _GradientCached):
    """Metropolis-adjusted Langevin: x' = x + (h^2 / 2) grad log pi_p(x) + h xi, xi ~ N(0, I),
    accepted with the Metropolis-Hastings ratio including the proposal asymmetry
    ``q(x | x') / q(x' | x)``.  One gradient evaluation per step (at ``x'``; the one at ``x``
    comes from the cache).

    With a preconditioner ``metric`` ``L`` (``x = L z``) the same move in ``z``:
    ``z' = z + (h^2 / 2) L^T grad + h xi``, i.e. ``x' = x + L ((h^2 / 2) L^T grad + h xi)``;
    the proposal's log density in ``z`` needs no solve (``z' - z`` is the move itself)."""

    name = "mala"
    target_acceptance, acceptance_order, compilable = 0.574, 3, True
    preconditionable = True
    options = (STEP_SIZE, PRECONDITION, NOISE_DTYPE)

    def step(self, state, b, step_size, density: Density, noise: Noise, sub: int = 0,
             metric=None):
        state = self._cached(state, density)
        h = step_size[..., None]
        g = slot_grad(state.extras["grad_v"], state.extras["grad_base"], b)
        xi = proposal_normal(noise, sub, state.x, self._noise)
        if metric is None:
            x_new = state.x + 0.5 * h * h * g + h * xi
        else:
            dz = 0.5 * h * h * metric_tmul(metric, g) + h * xi  # z' - z
            x_new = state.x + metric_mul(metric, dz)
        v, base, g_v, g_base = density.grad_components(x_new)
        g_new = slot_grad(g_v, g_base, b)
        prop = ReplicaState(x_new, v, base, {"grad_v": g_v, "grad_base": g_base})
        lp_new = prop.log_density(b)
        # log q(x | x') - log q(x' | x), q(a | c) = N(a; c + h^2/2 grad(c), h^2 I) (in z)
        if metric is None:
            fwd = ((x_new - state.x - 0.5 * h * h * g) ** 2).sum(-1)
            bwd = ((state.x - x_new - 0.5 * h * h * g_new) ** 2).sum(-1)
        else:
            fwd = ((dz - 0.5 * h * h * metric_tmul(metric, g)) ** 2).sum(-1)
            bwd = ((-dz - 0.5 * h * h * metric_tmul(metric, g_new)) ** 2).sum(-1)
        log_q = (fwd - bwd) / (2.0 * step_size**2)
        ok = (torch.isfinite(lp_new) & _finite_rows(x_new) & _finite_rows(g_new)
              & _finite_rows(g))
        return metropolis_select(state, prop, lp_new - state.log_density(b) + log_q, ok, noise,
                                 sub)


class HMC(_NoiseDtype, _GradientCached):
    """Hamiltonian Monte Carlo with a fixed number of leapfrog steps and identity mass
    (momentum ``p0 ~ N(0, I)``, kinetic energy ``|p|^2 / 2``).  ``leapfrog_steps`` gradient
    evaluations per step (the first half step uses the cached gradient at ``x``).

    ``jitter``: each step's leapfrog step is ``h (1 + jitter (2u - 1))``, ``u ~ U(0, 1)`` per
    replica and iteration (state-independent: still exact).  It removes the leapfrog
    resonances (Neal 2011, Sec. 5.4.2.2) that make acceptance non-monotone in ``h``, which
    step-size tuning needs.  ``jitter = 0``: the fixed step.

    With a preconditioner ``metric`` ``L`` (mass matrix ``(L L^T)^{-1}``): ``x += h L p``,
    ``p += h L^T grad``, kinetic energy still ``|p|^2 / 2``."""

    name = "hmc"
    target_acceptance, acceptance_order, compilable = 0.65, 2, True
    preconditionable = True
    options = (STEP_SIZE, Option("leapfrog_steps", integer(1), default=10, section="explorer",
                                 parse=parse_int, help="leapfrog steps of hmc"), PRECONDITION,
               NOISE_DTYPE)
    #: the default relative half-width of the step's jitter
    JITTER = 0.2

    def __init__(self, leapfrog_steps: int = 10, jitter: float = JITTER,
                 noise_dtype: str = "float64"):
        self._set_noise_dtype(noise_dtype)
        if int(leapfrog_steps) != leapfrog_steps or leapfrog_steps < 1:
            raise ValueError(f"leapfrog_steps must be an integer >= 1; got {leapfrog_steps!r}")
        if not 0.0 <= float(jitter) < 1.0:
            raise ValueError(f"jitter must be in [0, 1); got {jitter!r}")
        self.leapfrog_steps = int(leapfrog_steps)
        self.jitter = float(jitter)

    def describe(self) -> dict:
        return {**super().describe(), "leapfrog_steps": self.leapfrog_steps,
                "jitter": self.jitter}

    def step(self, state, b, step_size, density: Density, noise: Noise, sub: int = 0,
             metric=None):
        state = self._cached(state, density)
        h = step_size[..., None]
        p0 = proposal_normal(noise, sub, state.x, self._noise)
        if self.jitter > 0.0:  # (a draw of its own: the EXPLORE stream's (iteration, sub, 1))
            u = noise.uniform(sub, state.x.dtype, parts=(1,))
            h = h * (1.0 + self.jitter * (2.0 * u[..., None] - 1.0))
        g = slot_grad(state.extras["grad_v"], state.extras["grad_base"], b)
        x, p = state.x, p0 + 0.5 * h * metric_tmul(metric, g)
        ok = _finite_rows(g)
        for i in range(self.leapfrog_steps):
            x = x + h * metric_mul(metric, p)
            v, base, g_v, g_base = density.grad_components(x)
            g = slot_grad(g_v, g_base, b)
            ok = ok & _finite_rows(g)
            gz = metric_tmul(metric, g)
            p = p + (h * gz if i < self.leapfrog_steps - 1 else 0.5 * h * gz)
        prop = ReplicaState(x, v, base, {"grad_v": g_v, "grad_base": g_base})
        lp_new = prop.log_density(b)
        ok = ok & torch.isfinite(lp_new) & _finite_rows(x) & _finite_rows(p)
        log_alpha = (lp_new - 0.5 * (p**2).sum(-1)) - (state.log_density(b) - 0.5 * (p0**2).sum(-1))
        return metropolis_select(state, prop, log_alpha, ok, noise, sub)


class MALAThenHMC(MALA):
    """MALA until the run's evidence says slot 0 cannot enter a funnel's neck, then HMC with
    no preconditioner (the switch: :attr:`switched`, set between rounds by
    :class:`nrpt.adapt.metric.MetricAdaptor` where the ``tail-acceptance`` check of slot 0
    fires on a significant deficit, ``NECK_MAX_P``; it then drops the metric to the identity
    and stops estimating it).

    Why (gp_pois_regr, docs/gaussian_reference.md): MALA under any metric fails its neck
    (rounds 10: 1 of 4 seeds with the dense metric), HMC with no metric passes 4 of 4 but costs
    8x MALA on low_dim_gauss_mix, and the dense metric the badly scaled posteriors need breaks
    HMC on the funnel (0 of 4).  The check fired on no run of the other posteriors measured,
    where this explorer is MALA, draw for draw.  Each round's kernel is MALA's or HMC's, each
    exact for its slot's density; the switch depends on past rounds only (adaptive MCMC's
    between-rounds rule).  The switch needs rounds and a preconditioner (``precondition``
    'auto', 'diagonal' or 'dense'; rounds with ``precondition = "none"`` are refused): a run
    without rounds is MALA throughout."""

    name = "mala-hmc"
    #: (the switch is read in Python at each step: a compiled step would bake one kernel in)
    compilable = False
    options = (STEP_SIZE, HMC.options[1], PRECONDITION, NOISE_DTYPE)

    def __init__(self, leapfrog_steps: int = 10, noise_dtype: str = "float64"):
        super().__init__(noise_dtype)
        self.hmc = HMC(leapfrog_steps, noise_dtype=noise_dtype)
        #: HMC (no metric) from the round after the switch on
        self.switched = False

    def describe(self) -> dict:
        return {**super().describe(), "leapfrog_steps": self.hmc.leapfrog_steps,
                "switched": self.switched}

    def step(self, state, b, step_size, density: Density, noise: Noise, sub: int = 0,
             metric=None):
        if self.switched:
            return self.hmc.step(state, b, step_size, density, noise, sub, metric)
        return super().step(state, b, step_size, density, noise, sub, metric)
