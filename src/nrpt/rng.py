"""Keyed random numbers.

Every random number nrpt draws comes from a fresh generator whose seed is a hash of a *key*:
the run seed, a stream tag (explorer noise, swap uniforms, scheme coins, ...), the iteration and
a sub-step.  Draws always have the *full* shape of the quantity (``[R, P, ...]`` over all systems
and replicas), so

* a process that holds only some replicas (``torch.distributed``) draws the same full tensor and
  keeps its slice: results do not depend on how replicas are spread over processes;
* resuming from a checkpoint needs no generator state: the iteration counter is the state;
* a draw is one native tensor op (no per-replica generators, no Python loop).

The price of the full-shape draw is that each process generates the noise of every replica;
that is negligible beside the gradient evaluations that consume it.  Draws are bit-for-bit
reproducible on one machine and device type (CPU and CUDA generators differ).

The key hash is SplitMix64 folded over the key parts, in plain Python integers.
"""

from __future__ import annotations

import torch

__all__ = ["Stream", "key", "generator_for", "normal", "uniform"]

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


def generator_for(seed: int, *parts: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A ``torch.Generator`` seeded from a key (also handed to ``reference_sample``)."""
    g = torch.Generator(device=device)
    g.manual_seed(key(seed, *parts))
    return g


def normal(shape, seed: int, *parts: int, dtype=torch.float64, device="cpu") -> torch.Tensor:
    return torch.randn(shape, generator=generator_for(seed, *parts, device=device), dtype=dtype,
                       device=device)


def uniform(shape, seed: int, *parts: int, dtype=torch.float64, device="cpu") -> torch.Tensor:
    """Uniform[0, 1) draws (``log u`` may be -inf, which rejects any comparison)."""
    return torch.rand(shape, generator=generator_for(seed, *parts, device=device), dtype=dtype,
                      device=device)
