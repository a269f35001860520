"""The parallel-tempering engine: one iteration, read top to bottom.

    states[R, P, ...]  --explorer(slot params)-->  states'      (one batched call)
    reference slot of a geometric path           -->  iid draw from the reference
    energies v[R, P], slot_of[R, P], k  --scheme-->  phases of disjoint pairs
    each phase  --rule-->  accepted pairs  -->  new slot_of (a permutation; states never move)
    slot_of  -->  round-trip tracker;  slot-0 state, slot_of  -->  recorder

Replicas are *replica-major*: ``state.x[s, r]`` is replica ``r`` of system ``s`` wherever it sits;
``slot_of[s, r]`` is its slot and ``replica_at[s, p]`` the inverse permutation.  Swapping two
slots rewrites two integers per system, so swaps cost the same for a 2-D toy and a ResNet.

Randomness is keyed (:mod:`nrpt.rng`): every draw comes from a generator seeded by a hash of
(seed, stream, iteration, sub-step) and has the full ``[R, P, ...]`` shape, so nothing depends
on how replicas are spread over processes, and resuming needs only the iteration counter.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from . import rng
from .diagnostics import RoundTripTracker
from .explorers import Density, Explorer, Noise, ReplicaState
from .paths import Path
from .rng import Stream, generator_for
from .swap import Rule, Scheme, SwapContext

__all__ = ["PTEngine"]


class PTEngine:
    """Batched PT over ``systems`` independent copies of a ``P``-slot ladder.

    Parameters
    ----------
    target, path, explorer, scheme, rule
        The roles (see the package docs).
    step_size
        Per-slot step sizes, a float (all slots) or a sequence of ``P`` floats, all > 0.
    systems
        Number ``R`` of independent PT systems run side by side (for repeats / error bars).
    seed
        The run seed; every random number is keyed from it (:mod:`nrpt.rng`).
    n_explore
        Explorer steps per iteration (between swap rounds).
    initial_states
        Optional ``[R, P, dim]`` tensor; otherwise ``target.initial_states(n, generator)`` if
        defined, the reference for a geometric path, or N(0, I).
    """

    def __init__(self, target, path: Path, explorer: Explorer, scheme: Scheme, rule: Rule, *,
                 step_size: float | list[float] = 0.5, systems: int = 1, seed: int = 0,
                 n_explore: int = 1, dtype: torch.dtype = torch.float64,
                 device: str | torch.device = "cpu", initial_states: torch.Tensor | None = None):
        if isinstance(systems, bool) or int(systems) != systems or systems < 1:
            raise ValueError(f"systems must be an integer >= 1; got {systems!r}")
        if isinstance(n_explore, bool) or int(n_explore) != n_explore or n_explore < 1:
            raise ValueError(f"n_explore must be an integer >= 1; got {n_explore!r}")
        self.target, self.path, self.explorer = target, path, explorer
        self.scheme, self.rule = scheme, rule
        self.R, self.P, self.dim = int(systems), path.n_slots, int(target.dim)
        self.seed, self.n_explore = int(seed), int(n_explore)
        self.dtype, self.device = dtype, torch.device(device)
        R, P, dev = self.R, self.P, self.device

        self.schedule = path.schedule.to(dev, dtype).expand(R, P).clone()  # b per slot [R, P]
        self.step_size = self._per_slot("step_size", step_size)
        self.density = Density(target, path)
        self.system_ids = torch.arange(R, device=dev).reshape(R, 1)
        self.replica_ids = torch.arange(P, device=dev).reshape(1, P)

        # replica r starts at slot r
        self.slot_of = torch.arange(P, device=dev).expand(R, P).clone()
        self.replica_at = self.slot_of.clone()
        x0 = self._initial_states(initial_states)
        v, base = self.density(x0)
        if not torch.isfinite(v).all() or not torch.isfinite(base).all():
            bad = int((~torch.isfinite(v) | ~torch.isfinite(base)).sum())
            raise ValueError(f"{bad} initial state(s) have a non-finite energy / log density; "
                             "give initial_states inside the support")
        self.state = ReplicaState(x0, v, base)
        self.scheme_state = scheme.init_state(R, P, dev)
        self.k = 0
        self.reset_statistics()
        self.tracker = RoundTripTracker(self.slot_of, P)
        #: objects with ``after_iteration(engine, k, decisions)``, called once per iteration
        #: after the swaps (online adaptors, recorders of extra quantities)
        self.hooks: list = []

    # ------------------------------------------------------------------ set-up helpers
    def _per_slot(self, name: str, value) -> torch.Tensor:
        vals = [float(value)] * self.P if np.ndim(value) == 0 else [float(v) for v in value]
        if len(vals) != self.P:
            raise ValueError(f"{name} must be one number or {self.P} numbers (one per slot); "
                             f"got {len(vals)}")
        if not all(v > 0 and math.isfinite(v) for v in vals):
            raise ValueError(f"{name} must be > 0 and finite for every slot; got {vals}")
        return torch.tensor(vals, dtype=self.dtype, device=self.device).expand(self.R,
                                                                              self.P).clone()

    def _initial_states(self, given):
        R, P, d = self.R, self.P, self.dim
        if given is not None:
            x = torch.as_tensor(given, dtype=self.dtype, device=self.device)
            if x.shape == (P, d):
                x = x.expand(R, P, d)
            if x.shape != (R, P, d):
                raise ValueError(f"initial_states must have shape [systems, chains, dim] = "
                                 f"[{R}, {P}, {d}] or [{P}, {d}]; got {list(x.shape)}")
            return x.clone()
        g = generator_for(self.seed, Stream.INIT)
        if hasattr(self.target, "initial_states"):
            x = self.target.initial_states(R * P, g)
        elif self.path.has_reference:
            x = self.target.reference_sample(R * P, g)
        else:
            x = torch.randn(R * P, d, generator=g, dtype=self.dtype)
        return torch.as_tensor(x).to(self.device, self.dtype).reshape(R, P, d).clone()

    def reset_statistics(self) -> None:
        """Zero the per-pair and per-slot accumulators (e.g. at the start of a round)."""
        R, P, dev, dt = self.R, self.P, self.device, self.dtype
        self.pair_attempts = torch.zeros(R, P - 1, dtype=torch.int64, device=dev)
        self.pair_swaps = torch.zeros(R, P - 1, dtype=torch.int64, device=dev)
        self.pair_accept_sum = torch.zeros(R, P - 1, dtype=dt, device=dev)
        self.explore_accept_sum = torch.zeros(R, P, dtype=dt, device=dev)
        self.explore_moves = torch.zeros(R, P, dtype=torch.int64, device=dev)
        self.nonfinite = torch.zeros(R, P, dtype=torch.int64, device=dev)
        self.stat_iterations = 0

    def set_scheme(self, scheme: Scheme) -> None:
        self.scheme = scheme
        self.scheme_state = scheme.init_state(self.R, self.P, self.device)

    # ------------------------------------------------------------------ one iteration
    def slot_params(self, table: torch.Tensor) -> torch.Tensor:
        """Per-replica view of a per-slot table ``[R, P]``."""
        return table.gather(1, self.slot_of)

    def step(self) -> None:
        k = self.k
        noise = Noise(self.seed, k, self.R, self.P, self.device)
        b = self.slot_params(self.schedule)
        h = self.slot_params(self.step_size)

        # 1. explore: every replica at its slot's parameters, in one batched call per step
        for i in range(self.n_explore):
            self.state, info = self.explorer.step(self.state, b, h, self.density, noise,
                                                  sub=i * self.explorer.substeps)
            self.explore_accept_sum.scatter_add_(1, self.slot_of, info.accept_prob)
            self.nonfinite.scatter_add_(1, self.slot_of, info.nonfinite.long())
        self.explore_moves += self.n_explore

        # 2. the reference end of a geometric path is sampled exactly
        if self.path.has_reference:
            self._refresh_reference(k)

        # 3. swaps: phases of disjoint pairs, each decided from scalars only
        decisions = [
            self._swap_phase(k, phase, lo, hi, active)
            for phase, (lo, hi, active) in enumerate(
                self.scheme.phases(k, self.R, self.P, self.seed, self.system_ids,
                                   self.scheme_state))
        ]

        self.tracker.update(self.slot_of)
        for hook in self.hooks:
            hook.after_iteration(self, k, decisions)
        self.stat_iterations += 1
        self.k += 1

    def _refresh_reference(self, k: int) -> None:
        g = generator_for(self.seed, Stream.REFERENCE, k)
        xr = torch.as_tensor(self.target.reference_sample(self.R, g)).to(self.device, self.dtype)
        vr, br = self.density(xr.reshape(self.R, 1, self.dim))
        top = self.slot_of == self.P - 1  # [R, P], one replica per system
        fresh = ReplicaState(xr.reshape(self.R, 1, self.dim).expand_as(self.state.x),
                             vr.expand(self.R, self.P), br.expand(self.R, self.P))
        self.state = self.state.where(top, fresh)

    def _swap_phase(self, k: int, phase: int, lo, hi, active) -> dict[str, torch.Tensor]:
        """Decide and execute one phase; returns the decision record for hooks: ``lo``,
        ``hi``, ``active`` (the scheme proposed the pair), ``decision`` (the rule's verdict for
        every listed pair, active or not), ``accepted`` (executed) and ``prob``, all [R, M]."""
        rep_lo = self.replica_at.gather(1, lo)
        rep_hi = self.replica_at.gather(1, hi)
        ctx = SwapContext(
            b_lo=self.schedule.gather(1, lo), b_hi=self.schedule.gather(1, hi),
            v_lo=self.state.v.gather(1, rep_lo), v_hi=self.state.v.gather(1, rep_hi),
            u=rng.uniform(lo.shape, self.seed, Stream.SWAP, k, phase, dtype=self.dtype,
                          device=self.device),
            iteration=k,
        )
        decision, prob = self.rule.decide(ctx)
        accepted = decision & active
        adjacent = active & (hi - lo == 1)
        self.pair_attempts.scatter_add_(1, lo, adjacent.long())
        self.pair_accept_sum.scatter_add_(1, lo, torch.where(adjacent, prob,
                                                             torch.zeros_like(prob)))
        self.pair_swaps.scatter_add_(1, lo, (accepted & adjacent).long())
        # sigma: slot -> new slot; pairs in a phase are disjoint, so the adds never collide
        step = (hi - lo) * accepted.long()
        sigma = self.replica_ids.expand(self.R, self.P).clone()
        sigma.scatter_add_(1, lo, step)
        sigma.scatter_add_(1, hi, -step)
        self.slot_of = sigma.gather(1, self.slot_of)
        self.replica_at = torch.empty_like(self.replica_at).scatter_(
            1, self.slot_of, self.replica_ids.expand(self.R, self.P))
        self.scheme.after_phase(k, self.scheme_state, lo, accepted)
        return {"lo": lo, "hi": hi, "active": active, "decision": decision,
                "accepted": accepted, "prob": prob}

    # ------------------------------------------------------------------ views
    def target_slot(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x[R, dim], v[R])`` of the replica at slot 0."""
        rep = self.replica_at[:, :1]
        x = self.state.x.gather(1, rep[..., None].expand(self.R, 1, self.dim)).squeeze(1)
        return x, self.state.v.gather(1, rep).squeeze(1)

    def swap_acceptance(self) -> torch.Tensor:
        """Mean of min(1, alpha) per adjacent pair ``[R, P-1]`` (NaN where never attempted)."""
        return self.pair_accept_sum / self.pair_attempts.to(self.dtype)

    def rejection_rates(self) -> torch.Tensor:
        """Estimated rejection rate per pair, 1 - mean min(1, alpha) (NaN if never attempted)."""
        return 1.0 - self.swap_acceptance()

    def explorer_acceptance(self) -> torch.Tensor:
        return self.explore_accept_sum / self.explore_moves.to(self.dtype)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        return {
            "k": self.k, "x": self.state.x, "v": self.state.v, "base": self.state.base,
            "extras": dict(self.state.extras),
            "slot_of": self.slot_of, "schedule": self.schedule, "step_size": self.step_size,
            "scheme_state": dict(self.scheme_state), "tracker": self.tracker.state_dict(),
            "stats": {n: getattr(self, n) for n in (
                "pair_attempts", "pair_swaps", "pair_accept_sum", "explore_accept_sum",
                "explore_moves", "nonfinite")},
            "stat_iterations": self.stat_iterations,
            "hooks": [h.state_dict() if hasattr(h, "state_dict") else None for h in self.hooks],
        }

    def load_state_dict(self, sd: dict) -> None:
        dev = self.device
        self.k = int(sd["k"])
        self.state = ReplicaState(sd["x"].to(dev), sd["v"].to(dev), sd["base"].to(dev),
                                  {k: v.to(dev) for k, v in sd.get("extras", {}).items()})
        self.slot_of = sd["slot_of"].to(dev)
        self.replica_at = torch.empty_like(self.slot_of).scatter_(
            1, self.slot_of, self.replica_ids.expand(self.R, self.P))
        self.schedule = sd["schedule"].to(dev)
        self.step_size = sd["step_size"].to(dev)
        self.scheme_state = {k: v.to(dev) for k, v in sd["scheme_state"].items()}
        self.tracker.load_state_dict(sd["tracker"])
        for n, t in sd["stats"].items():
            setattr(self, n, t.to(dev))
        self.stat_iterations = int(sd["stat_iterations"])
        for h, hs in zip(self.hooks, sd.get("hooks", []), strict=False):
            if hs is not None and hasattr(h, "load_state_dict"):
                h.load_state_dict(hs)
