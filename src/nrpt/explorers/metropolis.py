"""Exact full-batch explorers: random-walk Metropolis, MALA and HMC.

Each leaves its slot's density pi_p(x) ∝ exp(base(x) - b_p v(x)) invariant (a Metropolis-Hastings
correction is always applied), with a per-slot step size ``step_size[R, P]`` and all replicas
moved in one batched call.
"""

from __future__ import annotations

import math

import torch

from .base import Density, ExploreInfo, Explorer, Noise, ReplicaState

__all__ = ["RWMH", "MALA", "HMC", "metropolis_select"]


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
    log_alpha = torch.where(proposal_ok & ~torch.isnan(log_alpha), log_alpha,
                            torch.full_like(log_alpha, -math.inf))
    u = noise.uniform(sub, log_alpha.dtype)
    accepted = torch.log(u) < log_alpha
    prob = torch.exp(torch.clamp(log_alpha, max=0.0))
    return state.where(accepted, proposal), ExploreInfo(prob, accepted, ~proposal_ok)


def _finite_rows(x: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(x).all(dim=-1)


class RWMH(Explorer):
    """Gaussian random-walk Metropolis: x' = x + h * xi, xi ~ N(0, I)."""

    name = "rwmh"

    def step(self, state, b, step_size, density: Density, noise: Noise, sub: int = 0):
        xi = noise.normal(sub, (state.x.shape[-1],), state.x.dtype)
        x_new = state.x + step_size[..., None] * xi
        v, base = density(x_new)
        prop = ReplicaState(x_new, v, base)
        lp_new = prop.log_density(b)
        ok = torch.isfinite(lp_new) & _finite_rows(x_new)
        return metropolis_select(state, prop, lp_new - state.log_density(b), ok, noise, sub)


class MALA(Explorer):
    """Metropolis-adjusted Langevin: x' = x + (h^2 / 2) grad log pi_p(x) + h xi."""

    name = "mala"
    uses_gradient = True

    def step(self, state, b, step_size, density: Density, noise: Noise, sub: int = 0):
        h = step_size[..., None]
        _, _, g = density.with_grad(state.x, b)
        xi = noise.normal(sub, (state.x.shape[-1],), state.x.dtype)
        x_new = state.x + 0.5 * h * h * g + h * xi
        v, base, g_new = density.with_grad(x_new, b)
        prop = ReplicaState(x_new, v, base)
        lp_new = prop.log_density(b)
        # log q(x | x') - log q(x' | x), q(a | c) = N(a; c + h^2/2 grad(c), h^2 I)
        fwd = ((x_new - state.x - 0.5 * h * h * g) ** 2).sum(-1)
        bwd = ((state.x - x_new - 0.5 * h * h * g_new) ** 2).sum(-1)
        log_q = (fwd - bwd) / (2.0 * step_size**2)
        ok = (torch.isfinite(lp_new) & _finite_rows(x_new) & _finite_rows(g_new)
              & _finite_rows(g))
        return metropolis_select(state, prop, lp_new - state.log_density(b) + log_q, ok, noise,
                                 sub)


class HMC(Explorer):
    """Hamiltonian Monte Carlo with a fixed number of leapfrog steps and identity mass."""

    name = "hmc"
    uses_gradient = True

    def __init__(self, leapfrog_steps: int = 10):
        if int(leapfrog_steps) != leapfrog_steps or leapfrog_steps < 1:
            raise ValueError(f"leapfrog_steps must be an integer >= 1; got {leapfrog_steps!r}")
        self.leapfrog_steps = int(leapfrog_steps)

    def describe(self) -> dict:
        return {"name": self.name, "leapfrog_steps": self.leapfrog_steps}

    def step(self, state, b, step_size, density: Density, noise: Noise, sub: int = 0):
        h = step_size[..., None]
        p0 = noise.normal(sub, (state.x.shape[-1],), state.x.dtype)
        _, _, g = density.with_grad(state.x, b)
        x, p = state.x, p0 + 0.5 * h * g
        ok = _finite_rows(g)
        for i in range(self.leapfrog_steps):
            x = x + h * p
            v, base, g = density.with_grad(x, b)
            ok = ok & _finite_rows(g)
            p = p + (h * g if i < self.leapfrog_steps - 1 else 0.5 * h * g)
        prop = ReplicaState(x, v, base)
        lp_new = prop.log_density(b)
        ok = ok & torch.isfinite(lp_new) & _finite_rows(x) & _finite_rows(p)
        log_alpha = (lp_new - 0.5 * (p**2).sum(-1)) - (state.log_density(b) - 0.5 * (p0**2).sum(-1))
        return metropolis_select(state, prop, log_alpha, ok, noise, sub)
