"""Keyed random numbers.

Every random number nrpt draws comes from a fresh generator whose seed is a hash of a *key*:
the run seed, a stream tag (explorer noise, swap uniforms, scheme coins, ...), the iteration and
a sub-step.  Draws always have the *full* shape of the quantity (``[R, P, ...]`` over all systems
and replicas), so

* a process that holds only some replicas (``torch.distributed``, a :class:`Block`) draws the
  same full tensor and keeps its slice: results do not depend on how replicas are spread over
  processes;
* resuming from a checkpoint needs no generator state: the iteration counter is the state;
* a draw is one native tensor op (no per-replica generators, no Python loop).

The price of the full-shape draw is that each process generates the noise of every replica;
that is negligible beside the gradient evaluations that consume it.  Draws are bit-for-bit
reproducible on one machine and device type (CPU and CUDA generators differ).

The key hash is SplitMix64 folded over the key parts, in plain Python integers.
"""

from __future__ import annotations

import torch

__all__ = ["Stream", "Block", "Key", "key", "generator_for", "normal", "uniform"]

_M64 = (1 << 64) - 1


class Stream:
    """Stream tags keep independent uses of randomness apart."""

    INIT = 1
    EXPLORE = 2  # explorer proposals / momenta / Langevin noise
    ACCEPT = 3  # explorer Metropolis uniforms
    SWAP = 4  # swap-rule uniforms (one per pair)
    SCHEME = 5  # scheme coin flips (SEO parity, APE pair choice)
    REFERENCE = 6  # iid draws from the reference of a geometric path
    USER = 16  # first tag free for extensions


def _mix(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def key(seed: int, *parts: int) -> int:
    """A 63-bit seed from ``(seed, *parts)``; order matters, every part is an int."""
    z = _mix(int(seed) & _M64)
    for p in parts:
        z = _mix(z ^ (int(p) & _M64))
    return z & ((1 << 63) - 1)


class Block:
    """The replicas ``[lo, hi)`` of ``P`` that this process holds (:mod:`nrpt.distributed`).

    A per-replica draw ``[R, hi - lo, ...]`` is made at the full width ``[R, P, ...]`` and
    sliced, so every process sees the numbers the single-process run would give its replicas."""

    __slots__ = ("lo", "hi", "P")

    def __init__(self, lo: int, hi: int, P: int):
        if not 0 <= lo <= hi <= P:
            raise ValueError(f"replica block [{lo}, {hi}) does not lie in [0, {P})")
        self.lo, self.hi, self.P = int(lo), int(hi), int(P)

    @property
    def width(self) -> int:
        return self.hi - self.lo

    @property
    def full(self) -> bool:
        return self.lo == 0 and self.hi == self.P

    def widen(self, shape) -> tuple[int, ...]:
        """The full-width shape of a per-replica draw of local ``shape`` (axis 1 = replicas)."""
        shape = tuple(int(n) for n in shape)
        if len(shape) < 2 or shape[1] != self.width:
            raise ValueError(f"a per-replica draw needs shape [R, {self.width}, ...]; got "
                             f"{list(shape)}")
        return (shape[0], self.P, *shape[2:])

    def take(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.full else t[:, self.lo:self.hi]

    def __repr__(self) -> str:
        return f"Block({self.lo}, {self.hi}, P={self.P})"


class Key(tuple):
    """A key ``(seed, *parts)`` for per-replica draws, with the :class:`Block` of replicas the
    draw is for (``None``: all).  Unpacks like the plain tuple (``seed, *parts = key``)."""

    block: Block | None

    def __new__(cls, parts, block: Block | None = None):
        self = super().__new__(cls, tuple(int(p) for p in parts))
        self.block = block
        return self


def _widen(shape, block: Block | None):
    return tuple(shape) if block is None or block.full else block.widen(shape)


def generator_for(seed: int, *parts: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A ``torch.Generator`` seeded from a key (also handed to ``reference_sample``)."""
    g = torch.Generator(device=device)
    g.manual_seed(key(seed, *parts))
    return g


def normal(shape, seed: int, *parts: int, dtype=torch.float64, device="cpu",
           block: Block | None = None) -> torch.Tensor:
    """Standard normal draws of ``shape``; with ``block``, a per-replica draw (axis 1) made at
    full width and sliced to the block."""
    z = torch.randn(_widen(shape, block), generator=generator_for(seed, *parts, device=device),
                    dtype=dtype, device=device)
    return z if block is None else block.take(z)


def uniform(shape, seed: int, *parts: int, dtype=torch.float64, device="cpu",
            block: Block | None = None) -> torch.Tensor:
    """Uniform[0, 1) draws (``log u`` may be -inf, which rejects any comparison); ``block`` as
    in :func:`normal`."""
    u = torch.rand(_widen(shape, block), generator=generator_for(seed, *parts, device=device),
                   dtype=dtype, device=device)
    return u if block is None else block.take(u)
