"""Whether a kernel may work on NumPy views of tensors' memory (``tensor.numpy()``,
``torch.from_numpy``: no copies).  A leaf module: it imports torch and nothing of nrpt.

On the CPU a small NumPy op costs a third to a half of a small torch op (docs/benchmarks.md,
"A lean iteration, fifth pass (stop 37)"), so nrpt's per-iteration bookkeeping on small
states (the eager chunks' swaps, the stochastic-approximation adaptors, the deterministic rule,
SGD's step, recorders' block merges, nrpt.deep's per-replica arithmetic) runs on views where
:func:`viewable` says so.  Such a kernel keeps to operations both libraries round alike -- one
IEEE addition, subtraction, multiplication, division, comparison or ``sqrt`` at a time, sums
whose order cannot matter -- and leaves transcendentals (``exp``, ``log``, ``cos``, ...) to
torch's kernels, which may round differently from the C library's: its numbers are torch's,
bit for bit, and each such path is tested against its torch form."""

from __future__ import annotations

import torch

__all__ = ["viewable"]


def viewable(*ts: torch.Tensor, dtypes: tuple | None = (torch.float64,)) -> bool:
    """Whether every tensor of ``ts`` is a CPU tensor out of autograd whose dtype is one of
    ``dtypes`` (``None``: any), outside a graph being compiled: one a kernel may read and write
    as a NumPy view."""
    for t in ts:
        if not t.is_cpu or t.requires_grad or (dtypes is not None and t.dtype not in dtypes):
            return False
    return not torch.compiler.is_compiling()
