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
