"""Swap schemes: which pairs of slots may attempt a swap at iteration k.

A scheme returns a list of *phases*; each phase is a set of disjoint slot pairs
``(lo[R, M], hi[R, M], active[R, M])`` decided together from the energies after the previous
phase.  All schemes but ADJ have one phase per iteration.  Pairs are indexed by their lower slot
(the one nearer the target); "even pairs" are (0,1), (2,3), ... (the papers' odd-numbered pairs
(1,2), (3,4), ... in their 1-based counting).

====== ======================================================================================
ADJ    sequential sweep (0,1), (1,2), ..., (P-2,P-1) in one iteration; each decision sees the
       outcome of the previous one (P-1 phases)
SEO    stochastic even-odd: a fair coin per iteration (and per system) picks even or odd pairs
       (reversible; O(P^2) round trips)
DEO    deterministic even-odd: even pairs at even k, odd pairs at odd k (non-reversible)
DEO_W  generalized DEO (Deng et al. 2023, Section 3.1): even pairs during windows with
       floor(k / W) even, odd pairs otherwise; a pair's gate opens at the start of each window
       (k mod W == 0) and closes after it swaps, so *at most one swap per pair per window*.
       W = 1 is DEO.  For W > 1 the stopping time of the gate biases the target marginal
       (the paper's Section C.2); see docs/architecture.md.
APE    one pair of slots (i < j, not necessarily adjacent) drawn uniformly per iteration
none   no swaps: independent chains at their slots (the no-swap baselines, e.g. SGLD x P)
====== ======================================================================================
"""

from __future__ import annotations

import torch

from .. import rng

__all__ = ["is_sweep", "adjacent_pairs", "Scheme", "ADJ", "SEO", "DEO", "DEOW", "APE", "NoSwap",
           "make_scheme"]

Phase = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


_ADJACENT: dict[tuple, tuple[torch.Tensor, ...]] = {}


def is_sweep(lo: torch.Tensor, R: int, P: int) -> bool:
    """Whether a phase's pairs ``lo`` are all ``P - 1`` adjacent pairs in slot order (SEO, DEO,
    DEO_W return the cached ``lo`` of :func:`adjacent_pairs` itself): per-pair tensors of such a
    phase are already in pair order, so the engine, the indicators and the swap counters use
    them as they are (slices and adds instead of gathers and scatters)."""
    return lo is adjacent_pairs(R, P, lo.device)[0]


def adjacent_pairs(R: int, P: int, device) -> tuple[torch.Tensor, ...]:
    """``(lo, hi, even, odd)``: the adjacent pairs ``[R, P-1]`` and the masks of even / odd
    ``lo``, made once per shape and device (read-only: schemes hand them out as they are)."""
    key = (R, P, str(device))
    got = _ADJACENT.get(key)
    if got is None:
        with torch.inference_mode(False):  # a cache outlives the run: never inference tensors
            lo = torch.arange(P - 1, device=device).expand(R, P - 1)
            got = _ADJACENT[key] = (lo, lo + 1, lo % 2 == 0, lo % 2 == 1)
    return got


class Scheme:
    name = ""
    #: True if a pair's decision must wait for the previous pair's (ADJ)
    sequential = False

    def init_state(self, R: int, P: int, device) -> dict[str, torch.Tensor]:
        return {}

    def phases(self, k: int, R: int, P: int, seed: int, systems: torch.Tensor,
               state: dict) -> list[Phase]:
        raise NotImplementedError

    def after_phase(self, k: int, state: dict, lo: torch.Tensor, accepted: torch.Tensor) -> None:
        """Update scheme state after a phase (``accepted[R, M]`` for pairs ``lo[R, M]``)."""

    def describe(self) -> dict:
        return {"scheme": self.name}


class ADJ(Scheme):
    name = "adj"
    sequential = True

    def phases(self, k, R, P, seed, systems, state):
        dev = systems.device
        ones = torch.ones(R, 1, dtype=torch.bool, device=dev)
        return [
            (torch.full((R, 1), p, device=dev), torch.full((R, 1), p + 1, device=dev), ones)
            for p in range(P - 1)
        ]


class SEO(Scheme):
    name = "seo"

    def phases(self, k, R, P, seed, systems, state):
        lo, hi, _, odd = adjacent_pairs(R, P, systems.device)
        coin = rng.iteration_uniform((R, 1), seed, rng.Stream.SCHEME, k,
                                     device=systems.device) < 0.5
        return [(lo, hi, odd == coin)]


class DEOW(Scheme):
    """Generalized DEO with window ``W`` (``window=1`` is plain DEO)."""

    name = "deo-w"

    def __init__(self, window: int = 1):
        if isinstance(window, bool) or int(window) != window or window < 1:
            raise ValueError(f"window must be an integer >= 1 (or 'auto'); got {window!r}")
        self.window = int(window)

    def init_state(self, R, P, device):
        return {"gate": torch.ones(R, P - 1, dtype=torch.bool, device=device)}

    def phases(self, k, R, P, seed, systems, state):
        lo, hi, even, odd = adjacent_pairs(R, P, systems.device)
        parity = odd if (k // self.window) % 2 else even
        if self.window == 1:  # every window is one iteration: the gate is always open
            return [(lo, hi, parity)]
        if k % self.window == 0:
            state["gate"].fill_(True)
        return [(lo, hi, parity & state["gate"])]

    def after_phase(self, k, state, lo, accepted):
        if self.window > 1:
            state["gate"] &= ~accepted

    def describe(self):
        return {"scheme": self.name, "window": self.window}


class DEO(DEOW):
    name = "deo"

    def __init__(self, window: int = 1):
        if window != 1:
            raise ValueError(f"scheme 'deo' has window 1; use scheme 'deo-w' for window={window}")
        super().__init__(1)

    def describe(self):
        return {"scheme": self.name, "window": 1}


class APE(Scheme):
    name = "ape"

    def phases(self, k, R, P, seed, systems, state):
        dev = systems.device
        i, j = torch.triu_indices(P, P, offset=1, device=dev)
        u = rng.iteration_uniform((R, 1), seed, rng.Stream.SCHEME, k, device=dev)
        m = torch.clamp((u * i.numel()).long(), max=i.numel() - 1)
        return [(i[m], j[m], torch.ones_like(m, dtype=torch.bool))]


class NoSwap(Scheme):
    """No pair is ever proposed: each replica stays at its slot (independent chains)."""

    name = "none"

    def phases(self, k, R, P, seed, systems, state):
        return []


def make_scheme(name: str, window: int = 1) -> Scheme:
    """Build a scheme by its registered name (:mod:`nrpt.registry`); ``window`` is DEO_W's."""
    from .. import registry

    cls = registry.entry("scheme", name, what="scheme").load()
    if name == "deo-w":
        return cls(window)
    if window != 1:
        raise ValueError(f"window applies only to scheme 'deo-w'; scheme {name!r} got "
                         f"window={window}")
    return cls()
