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

__all__ = ["viewable", "own_forms"]


def viewable(*ts: torch.Tensor, dtypes: tuple | None = (torch.float64,)) -> bool:
    """Whether every tensor of ``ts`` is a CPU tensor out of autograd whose dtype is one of
    ``dtypes`` (``None``: any), outside a graph being compiled: one a kernel may read and write
    as a NumPy view."""
    for t in ts:
        if not t.is_cpu or t.requires_grad or (dtypes is not None and t.dtype not in dtypes):
            return False
    return not torch.compiler.is_compiling()


def own_forms(obj, name: str, *forms: str) -> bool:
    """Whether the class that gives ``obj`` its method ``name`` (the first in its MRO to define
    it) also defines every one of ``forms`` itself -- and so is also what gives ``obj`` each of
    them.  A role's faster form (``decide_arrays`` beside ``decide``, ``observe_arrays`` beside
    ``observe_block``) may stand in for the method only then: a subclass that overrides the
    method (or one form but not another) inherits forms that compute its parent's numbers,
    not its own, and gets the method called as it is."""
    mro = type(obj).__mro__
    owner = next((c for c in mro if name in vars(c)), None)
    return owner is not None and all(
        next((c for c in mro if f in vars(c)), None) is owner for f in forms)
