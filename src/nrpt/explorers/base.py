"""The explorer contract.

An explorer moves every replica with a kernel that leaves its *current slot's* distribution
invariant.  It is one batched call for all replicas of all systems:

    explorer.step(state, b, step_size, density, noise) -> (state, info)

* ``state`` — :class:`ReplicaState` with ``x[R, P, dim]`` (replica-major: ``x[s, r]`` is replica r
  of system s, wherever it sits on the ladder) and the cached path components ``v``, ``base``
  (``[R, P]``, see :mod:`nrpt.paths`);
* ``b``, ``step_size`` — ``[R, P]``, the slot coefficient and step size of each replica's slot;
* ``density`` — :class:`Density`, evaluates ``(v, base)`` and, on request, the gradient of the
  slot log density ``base - b v``;
* ``noise`` — :class:`Noise`, keyed random numbers for this iteration (no generator state).

``info`` is an :class:`ExploreInfo` of per-replica tensors.  Proposals whose log density (or
gradient) is NaN or ±inf are rejected and flagged in ``info.nonfinite``; they never enter the
state.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from .. import rng

__all__ = ["ReplicaState", "ExploreInfo", "Density", "Noise", "Explorer", "finite_or"]


@dataclass(frozen=True)
class ReplicaState:
    """Per-replica state.  ``extras`` holds explorer buffers ``[R, P, ...]`` (momentum,
    preconditioner, ...) that belong to the replica and so travel with it across slots."""

    x: torch.Tensor  # [R, P, dim]
    v: torch.Tensor  # [R, P]  tempered part (energy or minus log-likelihood)
    base: torch.Tensor  # [R, P]  untempered part (reference log density, or 0)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)

    def where(self, mask: torch.Tensor, other: ReplicaState) -> ReplicaState:
        """Take ``other`` where ``mask[R, P]`` is true (extras of ``self`` kept if absent)."""

        def pick(a, b):
            m = mask.reshape(mask.shape + (1,) * (a.dim() - mask.dim()))
            return torch.where(m, b, a)

        extras = {k: pick(v, other.extras[k]) if k in other.extras else v
                  for k, v in self.extras.items()}
        return ReplicaState(pick(self.x, other.x), pick(self.v, other.v),
                            pick(self.base, other.base), extras)

    def log_density(self, b: torch.Tensor) -> torch.Tensor:
        return self.base - b * self.v

    replace = replace


@dataclass(frozen=True)
class ExploreInfo:
    accept_prob: torch.Tensor  # [R, P] min(1, alpha) of the proposal (0 when non-finite)
    accepted: torch.Tensor  # [R, P] bool
    nonfinite: torch.Tensor  # [R, P] bool: the proposal had a non-finite density/gradient


def finite_or(t: torch.Tensor, fill: float) -> torch.Tensor:
    return torch.where(torch.isfinite(t), t, torch.full_like(t, fill))


class Density:
    """Evaluates the path components of a batch of states, with optional gradients."""

    def __init__(self, target, path):
        self.target = target
        self.path = path

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            return self.path.components(self.target, x)

    def with_grad(
        self, x: torch.Tensor, b: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(v, base, grad_x (base - b v))``; non-finite gradients are left for the caller.

        Autograd, unless the target supplies gradients: ``grad_energy(x)`` (temperature
        ladder) or ``grad_log_likelihood(x)`` and ``grad_reference_log_prob(x)`` (geometric
        path), each ``[n, dim]`` for ``x[n, dim]``."""
        supplied = self._supplied_grad(x, b)
        if supplied is not None:
            return supplied
        with torch.enable_grad():
            xg = x.detach().requires_grad_(True)
            v, base = self.path.components(self.target, xg)
            logp = base - b * v
            (grad,) = torch.autograd.grad(logp.sum(), xg)
        return v.detach(), base.detach(), grad.detach()


    def _supplied_grad(self, x, b):
        t, kind = self.target, self.path.kind
        flat = x.reshape(-1, x.shape[-1])
        if kind == "temperature" and hasattr(t, "grad_energy"):
            v, base = self(x)
            g = -b[..., None] * t.grad_energy(flat).to(x.dtype).reshape(x.shape)
            return v, base, g
        if (kind == "geometric" and hasattr(t, "grad_log_likelihood")
                and hasattr(t, "grad_reference_log_prob")):
            v, base = self(x)
            g_ref = t.grad_reference_log_prob(flat).to(x.dtype).reshape(x.shape)
            g_ll = t.grad_log_likelihood(flat).to(x.dtype).reshape(x.shape)
            return v, base, g_ref + b[..., None] * g_ll
        return None


class Noise:
    """Random numbers for one iteration, drawn with the full ``[R, P, ...]`` shape from
    generators keyed by (seed, stream, iteration, sub-step) -- see :mod:`nrpt.rng`."""

    def __init__(self, seed: int, iteration: int, R: int, P: int, device: torch.device):
        self.seed, self.iteration = int(seed), int(iteration)
        self.R, self.P, self.device = R, P, device

    def normal(self, sub: int, tail: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return rng.normal((self.R, self.P, *tail), self.seed, rng.Stream.EXPLORE,
                          self.iteration, sub, dtype=dtype, device=self.device)

    def uniform(self, sub: int, dtype: torch.dtype) -> torch.Tensor:
        return rng.uniform((self.R, self.P), self.seed, rng.Stream.ACCEPT, self.iteration, sub,
                           dtype=dtype, device=self.device)


class Explorer:
    """Base class; subclasses implement :meth:`step`."""

    name = ""
    uses_gradient = False
    #: how many keyed sub-streams one step consumes (so repeated steps don't reuse noise)
    substeps = 1

    def step(self, state, b, step_size, density, noise, sub=0):  # pragma: no cover - interface
        raise NotImplementedError

    def describe(self) -> dict:
        return {"name": self.name}
