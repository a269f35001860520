"""The explorer contract.

An explorer moves every replica with a kernel that leaves its *current slot's* distribution
invariant.  It is one batched call for all replicas of all systems:

    explorer.step(state, b, step_size, density, noise) -> (state, info)

* ``state`` — :class:`ReplicaState` with ``x[R, P, dim]`` (replica-major: ``x[s, r]`` is replica r
  of system s, wherever it sits on the ladder) and the cached path components ``v``, ``base``
  (``[R, P]``, see :mod:`nrpt.paths.ladders`);
* ``b``, ``step_size`` — ``[R, P]``, the slot coefficient and step size of each replica's slot;
* ``density`` — :class:`Density`, evaluates ``(v, base)`` and, on request, gradients: of the
  two path components (:meth:`Density.grad_components`) or of the slot log density
  ``base - b v`` (:meth:`Density.with_grad`);
* ``noise`` — :class:`Noise`, keyed random numbers for this iteration (no generator state).

``info`` is an :class:`ExploreInfo` of per-replica tensors.  Proposals whose log density (or
gradient) is NaN or ±inf are rejected and flagged in ``info.nonfinite``; they never enter the
state.

Sign conventions: ``U = -log pi`` is the energy; the slot log density is
``log pi_p(x) = base(x) - b_p v(x)`` (:mod:`nrpt.paths.ladders`), so ``v = U`` and ``base = 0`` on a
temperature ladder, ``v = -log L`` and ``base = log pi_0`` on a geometric path.

Preparing a state
-----------------
``explorer.prepare(state, density) -> state`` fills the explorer's per-replica caches in
``state.extras`` (default: nothing).  The engine calls it once on the initial states and on
every state it puts into ``state`` from outside the explorer (the fresh reference draws of a
geometric path), so a cache always describes the replica's current ``x``.  ``step`` still
works when the cache is missing (it is then computed first).  Any other code that changes
``state.x`` behind the explorer's back must drop those extras or call ``prepare`` again.

Gradient cache (MALA, HMC): ``extras["grad_v"]`` and ``extras["grad_base"]`` (``[R, P, dim]``)
are the gradients of the two *components* at the replica's ``x``.  They do not depend on the
slot, so they stay valid when the replica changes slot or the schedule is adapted; the step
combines them at the replica's current ``b`` as ``grad log pi_p = grad_base - b grad_v``
(:func:`slot_grad`).

Checking an explorer
--------------------
:func:`nrpt.testing.assert_invariant` runs an explorer alone at a fixed slot (from exact draws
where the target can make them) and compares moments to the truth within a Monte Carlo error
bar: the check the test suite applies to every built-in explorer.
"""

from __future__ import annotations

import torch

from nrpt.options import Option, check_number, check_numbers, parse_floats
from nrpt.roles import Density, ExploreInfo, Explorer, Noise, ReplicaState, slot_grad

__all__ = ["ReplicaState", "ExploreInfo", "Density", "Noise", "Explorer", "finite_or",
           "slot_grad", "GRAD_KEYS"]

#: the ``extras`` keys of the gradient cache of MALA / HMC (see the module docstring)
GRAD_KEYS = ("grad_v", "grad_base")


def finite_or(t: torch.Tensor, fill: float) -> torch.Tensor:
    return torch.where(torch.isfinite(t), t, torch.full_like(t, fill))


def _step_size(name, value, cfg=None):
    """A number > 0, or one per slot (``cfg.chains`` of them)."""
    if isinstance(value, list | tuple):
        out = check_numbers(name, value, cfg.chains)
        for i, v in enumerate(out):
            check_number(f"{name}[{i}]", v, 0.0, strict=True)
        return out
    return check_number(name, value, 0.0, strict=True)


def _parse_step(text: str):
    vals = parse_floats(text)
    return vals[0] if len(vals) == 1 else vals


_parse_step.what = "a number or comma-separated numbers"  # type: ignore[attr-defined]

#: the step size of the exact explorers (the slice width of ``slice``)
STEP_SIZE = Option("step_size", _step_size, default=0.35, section="explorer", parse=_parse_step,
                   why="step_size is for {who}; a stochastic-gradient explorer takes learning "
                       "rates: lr_min/lr_max or learning_rates",
                   help="exact explorers: step size at slot 0 (scaled by sqrt(tau) up a "
                        "temperature ladder), or one per slot, comma-separated")


