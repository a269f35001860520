"""NumPy and 0-d torch scalars as Python numbers, for settings given from array code.  A leaf
module: it imports nothing of nrpt."""

from __future__ import annotations

from typing import Any

__all__ = ["plain"]


def plain(value: Any) -> Any:
    """``value`` with NumPy and 0-d torch scalars made Python numbers (``np.float32(0.3)`` ->
    ``0.3``, ``np.int64(4)`` -> ``4``, ``np.bool_`` / a 0-d bool tensor -> ``bool``), inside
    lists, tuples and dicts too; anything else as it is.  An integer scalar stays an integer
    (never a bool), so ``chains = np.int64(4)`` is accepted and ``np.True_`` is not a count."""
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if isinstance(value, list | tuple):
        return type(value)(plain(v) for v in value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return _numpy_scalar(value) if type(value).__module__.startswith("numpy") else \
        _torch_scalar(value) if type(value).__module__.startswith("torch") else value


def _numpy_scalar(value: Any) -> Any:
    import numpy as np

    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        # a float32 0.3 is the user's 0.3: its shortest decimal, not 0.30000001192092896
        return float(value) if value.dtype.itemsize >= 8 else float(str(value))
    if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "biuf":
        return plain(value[()])
    return value


def _torch_scalar(value: Any) -> Any:
    import torch

    if not isinstance(value, torch.Tensor) or value.ndim != 0 or value.is_complex():
        return value
    if value.is_floating_point() and value.element_size() < 8:
        import numpy as np

        return float(str(np.float32(value.item())))
    return value.item()  # bool -> bool, integer -> int, float64 -> float
