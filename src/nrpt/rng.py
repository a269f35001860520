"""Keyed random numbers.

Every draw comes from a fresh generator seeded by a SplitMix64 hash of a key (run seed, stream
tag, iteration, sub-step) and has the full shape of the quantity (``[R, P, ...]``), so results
do not depend on how replicas are spread over processes (a :class:`Block` keeps its slice),
resuming needs no generator state (the iteration counter is the state), and a draw is one
tensor op.  Reproducible bit for bit on one machine and device type (CPU and CUDA differ).

Per-iteration draws (:func:`iteration_normal`, :func:`iteration_uniform`,
:func:`iteration_draw`) are made for a block of ``B`` consecutive iterations from one generator
keyed by (seed, stream, block number, ...); iteration ``k`` reads row ``k mod B``.  ``B``
depends only on the full-width draw size (:func:`block_length`: at most 512 iterations and
``BLOCK_ELEMENTS`` numbers); draws of ``BLOCK_ELEMENTS`` or more have ``B = 1`` and are keyed as
a plain :func:`normal` / :func:`uniform`.  Blocks live in an LRU cache of
:data:`CACHE_ELEMENTS` numbers; a draw is a read-only view into it.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable

import torch

__all__ = ["Stream", "Block", "Key", "as_key", "key", "generator_for", "normal", "uniform",
           "iteration_random", "iteration_normal", "iteration_uniform", "iteration_draw",
           "block_length", "block_generator", "BLOCK_ELEMENTS", "MAX_BLOCK"]

#: the most numbers one block of per-iteration draws holds (a smaller per-iteration draw gets
#: ``BLOCK_ELEMENTS // size`` iterations per block, at most :data:`MAX_BLOCK`)
BLOCK_ELEMENTS = 1 << 16
MAX_BLOCK = 512
#: the cache of blocks holds at most this many numbers (least recently used blocks go first)
CACHE_ELEMENTS = 1 << 23
_BLOCKED = 0xB10C  # key part that tells a block's generator from a single iteration's

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
    """The replicas ``[lo, hi)`` of ``P`` that this process holds (:mod:`nrpt.core.sharding`).

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
    #: > 0: draws of ``count`` consecutive iterations from ``parts[1]`` on, stacked
    count: int  # type: ignore[assignment]  # shadows tuple.count: a Key is never counted

    def __new__(cls, parts, block: Block | None = None, count: int = 0):
        self = super().__new__(cls, tuple(int(p) for p in parts))
        self.block, self.count = block, int(count)
        return self

    # the draws of an energy estimator: ``(seed, iteration, *rest)`` -> the keyed draw of
    # ``stream`` at that iteration (:func:`iteration_draw`), for this key's block of replicas
    def draw(self, draw, tag: tuple, shape, stream: int, device="cpu") -> torch.Tensor:
        seed, *parts = self
        return iteration_draw(draw, tag, shape, seed, stream, *parts, device=device,
                              block=self.block, count=self.count)

    def normal(self, shape, stream: int, dtype=torch.float64, device="cpu") -> torch.Tensor:
        seed, *parts = self
        return iteration_normal(shape, seed, stream, *parts, dtype=dtype, device=device,
                                block=self.block, count=self.count)


def as_key(key) -> Key:
    """``key`` as a :class:`Key` (a plain ``(seed, iteration, ...)`` tuple gets no block; an
    object with the key's ``draw`` / ``normal`` methods is taken as it is)."""
    return key if hasattr(key, "draw") else Key(key)


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


# ------------------------------------------------------------------ per-iteration draws in blocks
def block_length(numel: int) -> int:
    """Iterations per block for a per-iteration draw of ``numel`` numbers (full width)."""
    return max(1, min(MAX_BLOCK, BLOCK_ELEMENTS // max(1, int(numel))))


class _BlockCache:
    def __init__(self, limit: int):
        self.limit, self.size = int(limit), 0
        self.blocks: OrderedDict[tuple, tuple[int, int, torch.Tensor]] = OrderedDict()

    def get(self, ck: tuple):
        return self.blocks.get(ck)

    def put(self, ck: tuple, entry: tuple[int, int, torch.Tensor]) -> None:
        """``entry = (first iteration, B, rows)``: one block per draw family (a new block
        replaces the family's last one); least recently *drawn* families go first."""
        old = self.blocks.pop(ck, None)
        if old is not None:
            self.size -= old[2].numel()
        self.blocks[ck] = entry
        self.size += entry[2].numel()
        while self.size > self.limit and len(self.blocks) > 1:
            _, old = self.blocks.popitem(last=False)
            self.size -= old[2].numel()

    def clear(self) -> None:
        self.blocks.clear()
        self.size = 0


_cache = _BlockCache(CACHE_ELEMENTS)


def iteration_draw(draw: Callable[[tuple, torch.Generator], torch.Tensor], tag: tuple,
                   shape, seed: int, stream: int, iteration: int, *parts: int,
                   device="cpu", block: Block | None = None, count: int = 0) -> torch.Tensor:
    """The draw of iteration ``iteration`` made by ``draw(shape, generator)`` (which must give
    ``shape``-shaped, row-independent output, e.g. ``torch.randn``), keyed by
    ``(seed, stream, iteration, *parts)`` and made in blocks of iterations (module docstring).

    ``tag`` names the draw's kind and settings (dtype, bounds, ...) for the cache; ``block``:
    a per-replica draw made at full width and sliced, as in :func:`normal`.  (This runs several
    times per iteration: it is kept to one dictionary look-up and one index.)

    ``count > 0``: the draws of iterations ``iteration .. iteration + count - 1`` stacked,
    ``[count, *shape]`` (a slice of the block when it holds them all; the fused loop,
    :mod:`nrpt.core.fused`)."""
    if count:
        return _rows(draw, tag, shape, seed, stream, iteration, parts, device, block, count)
    full = tuple(shape) if block is None or block.full else block.widen(shape)
    ck = (tag, seed, stream, parts, full, device)
    hit = _cache.get(ck)
    if hit is not None:
        first, B, rows = hit
        i = iteration - first
        if 0 <= i < B:
            t = rows[i]
            return t if block is None else block.take(t)
    B = _length(full)
    k = int(iteration)
    g = block_generator(seed, stream, k, B, *parts, device=device)
    if B == 1:
        t = draw(full, g)
    else:
        with torch.inference_mode(False):  # the cache outlives the run: no inference tensors
            rows = draw((B, *full), g)
        _cache.put(ck, (k - k % B, B, rows))
        t = rows[k % B]
    return t if block is None else block.take(t)


def _rows(draw, tag, shape, seed, stream, iteration, parts, device, block, count):
    first = iteration_draw(draw, tag, shape, seed, stream, iteration, *parts, device=device,
                           block=block)  # (makes or finds the block)
    hit = _cache.get((tag, seed, stream, parts, _widen(shape, block), device))
    if hit is not None and block is None:
        start, B, rows = hit
        i = iteration - start
        if 0 <= i and i + count <= B:
            return rows[i:i + count]
    rows = [first] + [iteration_draw(draw, tag, shape, seed, stream, iteration + j, *parts,
                                     device=device, block=block) for j in range(1, count)]
    with torch.inference_mode(False):  # ordinary tensors, as the block slices above (a compiled
        return torch.stack(rows)       # chunk would otherwise see two kinds of input)


def block_generator(seed: int, stream: int, iteration: int, B: int, *parts: int,
                    device="cpu") -> torch.Generator:
    """The generator of the block of ``B`` iterations holding ``iteration`` (``B`` from
    :func:`block_length`; ``B = 1``: the plain key of that iteration).  Every per-iteration
    draw made in blocks takes its generator here (:func:`iteration_draw`, the engine's
    reference refresh)."""
    if B == 1:
        return generator_for(seed, stream, iteration, *parts, device=device)
    return generator_for(seed, stream, _BLOCKED, int(iteration) // B, *parts, device=device)


_lengths: dict[tuple, int] = {}


def _length(full: tuple) -> int:
    B = _lengths.get(full)
    if B is None:
        B = _lengths[full] = block_length(math.prod(full))
    return B


#: the per-iteration draws of :func:`iteration_random`, by kind
_SAMPLERS = {"normal": torch.randn, "uniform": torch.rand}


def iteration_random(kind: str, shape, seed: int, stream: int, iteration: int, *parts: int,
                     dtype=torch.float64, device="cpu", block: Block | None = None,
                     count: int = 0) -> torch.Tensor:
    """Standard normals (``kind = "normal"``) or Uniform[0, 1) numbers (``"uniform"``) of
    iteration ``iteration`` (see :func:`iteration_draw`)."""
    sampler = _SAMPLERS[kind]
    return iteration_draw(lambda sh, g: sampler(sh, generator=g, dtype=dtype, device=device),
                          (kind, dtype), shape, seed, stream, iteration, *parts,
                          device=device, block=block, count=count)


def iteration_normal(shape, *args, **kwargs) -> torch.Tensor:
    """:func:`iteration_random` of kind ``"normal"``."""
    return iteration_random("normal", shape, *args, **kwargs)


def iteration_uniform(shape, *args, **kwargs) -> torch.Tensor:
    """:func:`iteration_random` of kind ``"uniform"``."""
    return iteration_random("uniform", shape, *args, **kwargs)
