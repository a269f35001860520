"""The explorer contract.

    explorer.step(state, b, step_size, density, noise) -> (state, info)

moves every replica with a kernel that leaves its current slot's distribution invariant:

* ``state`` — :class:`ReplicaState`, ``x[R, P, dim]`` in replica order and the path components
  ``v``, ``base`` ``[R, P]`` (``log pi_p = base - b_p v``, :mod:`nrpt.paths.ladders`);
* ``b``, ``step_size`` — ``[R, P]``, each replica's slot coefficient and step size;
* ``density`` — :class:`Density` (components; gradients via :meth:`Density.grad_components`
  or :meth:`Density.with_grad`);
* ``noise`` — :class:`Noise`, keyed random numbers for this iteration.

``info`` is an :class:`ExploreInfo`.  Proposals with a non-finite log density or gradient are
rejected and flagged in ``info.nonfinite``.

``explorer.prepare(state, density) -> state`` fills per-replica caches in ``state.extras``; the
engine calls it on initial states and on states it inserts (fresh reference draws).  Code that
changes ``state.x`` otherwise must drop those extras or call ``prepare`` again.  Gradient cache
(MALA, HMC): ``extras["grad_v"]``, ``extras["grad_base"]`` ``[R, P, dim]``, slot-independent,
combined by :func:`slot_grad`.

:func:`nrpt.testing.assert_invariant` checks an explorer's invariance against exact moments.
"""

from __future__ import annotations

import torch

from nrpt.options import Option, check_number, check_numbers, choice, parse_floats
from nrpt.roles import Density, ExploreInfo, Explorer, Noise, ReplicaState, slot_grad

__all__ = ["ReplicaState", "ExploreInfo", "Density", "Noise", "Explorer", "finite_or",
           "slot_grad", "GRAD_KEYS", "metric_mul", "metric_tmul", "PRECONDITION",
           "PRECONDITION_MODES"]

#: the ``extras`` keys of the gradient cache of MALA / HMC (see the module docstring)
GRAD_KEYS = ("grad_v", "grad_base")


def finite_or(t: torch.Tensor, fill: float) -> torch.Tensor:
    return torch.where(torch.isfinite(t), t, torch.full_like(t, fill))


def metric_mul(metric: torch.Tensor | None, z: torch.Tensor) -> torch.Tensor:
    """``L z`` per replica: ``z[R, P, dim]`` from the whitened space to the state space of a
    preconditioned explorer (``metric``: ``None`` identity, ``[R, P, dim]`` a diagonal scale,
    ``[R, P, dim, dim]`` a lower-triangular factor ``L`` of the covariance ``L L^T``)."""
    if metric is None:
        return z
    if metric.dim() == z.dim():
        return metric * z
    return (metric @ z.unsqueeze(-1)).squeeze(-1)


def metric_tmul(metric: torch.Tensor | None, g: torch.Tensor) -> torch.Tensor:
    """``L^T g`` per replica: a gradient ``g[R, P, dim]`` in the state space to the whitened
    space (see :func:`metric_mul`)."""
    if metric is None:
        return g
    if metric.dim() == g.dim():
        return metric * g
    return (metric.transpose(-1, -2) @ g.unsqueeze(-1)).squeeze(-1)


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




#: ``noise_dtype`` values: the dtype of rwmh / mala / hmc proposal noise (the state's own, or
#: float32 drawn and widened to the state's dtype)
NOISE_DTYPES = ("float64", "float32")

#: opt-in float32 proposal noise for large states: drawing float64 normals costs 5.8x float32
#: at d = 10^4 (docs/benchmarks.md); the Metropolis-Hastings correction keeps the target exact
#: for rwmh (a symmetric proposal still) and to float32 rounding of the draws (~1e-7
#: relative) in the proposal densities of mala and hmc
NOISE_DTYPE = Option(
    "noise_dtype", choice(NOISE_DTYPES), default="float64", section="explorer",
    choices=NOISE_DTYPES,
    why="noise_dtype is for {who} (explorers with Gaussian proposal noise)",
    help="rwmh/mala/hmc: dtype of the proposal's normal draws: float64 (default: the state's) "
         "or float32 (faster for large states; widened to the state's dtype; a different "
         "random stream)")


def noise_dtype(name: str) -> torch.dtype | None:
    """``noise_dtype``'s value as the dtype to draw in (None: the state's own)."""
    if name not in NOISE_DTYPES:
        raise ValueError(f"noise_dtype must be one of {', '.join(NOISE_DTYPES)}; got {name!r}")
    return torch.float32 if name == "float32" else None


def proposal_normal(noise: Noise, sub: int, x: torch.Tensor, dtype: torch.dtype | None
                    ) -> torch.Tensor:
    """Standard normals ``[R, P, dim]`` for a proposal from ``x``: in ``x``'s dtype, or drawn
    in ``dtype`` and widened to it."""
    if dtype is None or dtype == x.dtype:
        return noise.normal(sub, (x.shape[-1],), x.dtype)
    return noise.normal(sub, (x.shape[-1],), dtype).to(x.dtype)


#: ``precondition`` values (:mod:`nrpt.adapt.metric`)
PRECONDITION_MODES = ("none", "diagonal", "dense", "auto")

#: the per-slot preconditioner of the explorers that declare ``preconditionable``, estimated
#: between adaptive rounds (:class:`nrpt.adapt.metric.MetricAdaptor`)
PRECONDITION = Option(
    "precondition", choice(PRECONDITION_MODES), default="none", section="adaptation",
    choices=PRECONDITION_MODES,
    applies=lambda cfg: None if cfg.rounds is not None else
    "precondition is estimated between adaptive rounds (rounds)",
    why="precondition is for {who} (explorers that take a preconditioner)",
    help="with --rounds: per-slot preconditioner estimated between rounds from each slot's "
         "states: none (default), diagonal, dense, or auto (dense up to dim 200, else "
         "diagonal)")
