"""Wrap an energy target into the geometric form ``pi_beta ∝ pi_0 L^beta``,
``log L = -U - log pi_0`` (``beta = 0``: the normalized reference, sampled exactly)."""

from __future__ import annotations

from typing import Any

import torch

from nrpt.targets.gaussian import GaussianReference, bimodal_1d
from nrpt.targets.protocol import TargetError, optional_value, path_kind

__all__ = ["GeometricTarget", "geometric_bimodal"]

# optional members of the wrapped target that stay meaningful for the path's end point
_CARRIED = (
    "mean",
    "cov",
    "cdf",
    "marginal_cdf",
    "sample",
    "log_normalizer",
    "density_grid",
)
_ABSENT = object()


class GeometricTarget:
    """An energy target seen through a geometric path from ``reference``:
    ``log_likelihood(x) = -U(x) - reference.log_prob(x)``, reference members delegated, so the
    wrapped ``log_normalizer`` is the path's ``log Z``.  Carries over ``dim``, ``name`` and, where
    present, ``mean``, ``cov``, ``cdf``, ``marginal_cdf``, ``sample``, ``log_normalizer``,
    ``density_grid``; ``initial_states`` are reference draws; the wrapped target is ``base``.

    Args:
        target: ``dim`` and ``energy(x) -> [n]``.
        reference: normalized ``log_prob(x) -> [n]`` and ``sample(n, generator) -> [n, dim]``,
            e.g. :class:`GaussianReference`."""

    def __init__(self, target: Any, reference: Any) -> None:
        if path_kind(target) != "temperature":
            raise TargetError("GeometricTarget wraps an energy target; this one is geometric")
        for member in ("log_prob", "sample"):
            if not callable(getattr(reference, member, None)):
                raise TargetError(f"GeometricTarget: the reference has no {member}()")
        ref_dim = getattr(reference, "dim", target.dim)
        if ref_dim != target.dim:
            raise TargetError(
                f"GeometricTarget: reference dim {ref_dim} != target dim {target.dim}"
            )
        self.base = target
        self.reference = reference
        self.dim: int = target.dim
        self.name: str = optional_value(target, "name", type(target).__name__)
        self.reference_is_normalized: bool = bool(getattr(reference, "is_normalized", True))
        for member in _CARRIED:
            value = optional_value(target, member, _ABSENT)
            if value is not _ABSENT:
                setattr(self, member, value)

    def log_likelihood(self, x: torch.Tensor) -> torch.Tensor:
        """``-U(x) - log pi_0(x)``, shape ``[n]``."""
        return -self.base.energy(x) - self.reference.log_prob(x)

    def reference_log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """``log pi_0(x)``, shape ``[n]``."""
        return self.reference.log_prob(x)

    def reference_sample(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` iid reference draws ``[n, dim]``."""
        return self.reference.sample(n, generator)

    def initial_states(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """Reference draws ``[n, dim]`` (exact for the ``beta = 0`` chain)."""
        return self.reference.sample(n, generator)

    def __repr__(self) -> str:
        return f"GeometricTarget({self.base!r}, {self.reference!r})"


def geometric_bimodal() -> GeometricTarget:
    """Built-in ``"geometric-bimodal"``: :func:`bimodal_1d` on a geometric path from the
    reference ``N(0, 6^2)``, which covers both modes (at -4 and 4)."""
    target = GeometricTarget(bimodal_1d(), GaussianReference(0.0, 6.0, dim=1))
    target.name = "geometric-bimodal"
    return target
