"""Small helpers shared by the built-in targets."""

from __future__ import annotations

import numpy as np
import torch


def as_float64(value, name: str) -> torch.Tensor:
    """``value`` as a float64 CPU tensor (parameters are stored this way and cast on use)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(device="cpu", dtype=torch.float64)
    try:
        return torch.from_numpy(np.array(value, dtype=np.float64))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name} must be numeric; got {value!r}") from e


def like(param: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``param`` in the dtype and on the device of ``x``."""
    return param.to(dtype=x.dtype, device=x.device)


def check_generator(generator) -> torch.Generator:
    """Refuse to fall back on the global RNG: every draw needs an explicit generator."""
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            f"an explicit torch.Generator is required (nrpt never uses the global RNG); "
            f"got {type(generator).__name__}"
        )
    return generator


def randn(n: int, dim: int, generator: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """Standard normal draws ``[n, dim]`` from ``generator`` on the generator's device."""
    g = check_generator(generator)
    return torch.randn(int(n), int(dim), generator=g, dtype=dtype, device=g.device)


def check_states(x: torch.Tensor, dim: int, who: str) -> None:
    """Raise a clear error if ``x`` is not ``[n, dim]``."""
    if x.dim() != 2 or x.shape[1] != dim:
        raise ValueError(f"{who} expects x of shape [n, {dim}]; got {list(x.shape)}")


def to_like_input(values: torch.Tensor, t):
    """Return ``values`` in the kind of container ``t`` came in (tensor, ndarray or float)."""
    if isinstance(t, torch.Tensor):
        return values.to(dtype=t.dtype if t.is_floating_point() else torch.float64, device=t.device)
    out = values.numpy()
    if np.ndim(t) == 0 and not isinstance(t, np.ndarray):
        return float(out)
    return out


def sum_last(t: torch.Tensor) -> torch.Tensor:
    """``t.sum(-1)``, written as additions when the last axis has 2 or 3 entries.

    torch's CPU reduction over so short a last axis is slow for large leading dims
    (docs/benchmarks.md, "Target kernels").  Same value for 2 entries (one rounded addition);
    for 3, ``(t0 + t1) + t2``.
    """
    n = t.shape[-1]
    if n == 0 or n > 3 or t.dtype not in (torch.float64, torch.float32):
        return t.sum(-1)  # (half types: torch accumulates them in float32)
    out = t[..., 0]
    for i in range(1, n):
        out = out + t[..., i]
    return out


#: logsumexp's exponents are floored this far below the row maximum (see :func:`logsumexp`)
_EXP_FLOOR = -700.0


def logsumexp(z: torch.Tensor) -> torch.Tensor:
    """``torch.logsumexp(z, dim=-1)``, with the exponents floored at -700 below the maximum.

    torch's CPU ``exp`` of arguments below -708 (they underflow) takes a slower path
    (docs/benchmarks.md, "Target kernels"), and a mixture evaluated far from most of its
    components hands it many.  A floored term is below ``exp(-700) ≈ 1e-304`` times the
    maximum's ``exp(0) = 1``, so it vanishes in the sum: the value is torch's, bit for bit
    (tested), including rows of ``-inf`` (gives ``-inf``), ``+inf`` and NaN.  A ``z`` that
    requires a gradient, an empty last axis or a non-float ``z`` goes to ``torch.logsumexp``
    itself, so gradients are torch's too.
    """
    if z.requires_grad or z.shape[-1] == 0 or not z.is_floating_point():
        return torch.logsumexp(z, dim=-1)
    top = z.amax(-1, keepdim=True)
    shift = top.nan_to_num(0.0, 0.0, 0.0)  # a non-finite maximum shifts by 0, as in torch
    # (top - shift) is 0 for a finite maximum, else +-inf or NaN: the floor keeps those
    terms = torch.maximum(z - shift, (top - shift).add_(_EXP_FLOOR)).exp_()
    return terms.sum(-1).log_() + shift.squeeze(-1)
