"""Swap schemes: which pairs of slots may attempt a swap at iteration k.

A scheme returns *phases*; each is a set of disjoint pairs ``(lo[R, M], hi[R, M], active[R, M])``
decided together from the energies after the previous phase.  Pairs are indexed by their lower
slot; "even pairs" are (0,1), (2,3), ... (the papers' odd pairs in 1-based counting).

====== ======================================================================================
ADJ    sequential sweep (0,1), ..., (P-2,P-1); each decision sees the previous (P-1 phases)
SEO    stochastic even-odd: a fair coin per iteration and system picks even or odd pairs
DEO    deterministic even-odd: even pairs at even k, odd pairs at odd k (non-reversible)
DEO_W  Deng et al. 2023, Sec. 3.1: even pairs while floor(k / W) is even, else odd; a pair's
       gate opens at k mod W == 0 and closes after it swaps (at most one swap per pair per
       window); W = 1 is DEO.  W > 1 with state-dependent verdicts biases the target (Sec. C.2):
       refused with exact energies and Metropolis swaps (:func:`check_gate`)
APE    one pair (i < j, any) drawn uniformly per iteration
none   no swaps: independent chains at their slots
====== ======================================================================================
"""

from __future__ import annotations

import numpy as np
import torch

from nrpt import rng
from nrpt.options import Option, check_int, parse_int
from nrpt.roles import Phase as Phase  # noqa: F401 (re-export)
from nrpt.roles import Scheme, adjacent_pairs, is_sweep

__all__ = ["is_sweep", "adjacent_pairs", "Scheme", "ADJ", "SEO", "DEO", "DEOW", "APE", "NoSwap",
           "check_gate", "GATE_BIAS"]


def _theory(scheme: Scheme, rejection, window: int = 1):
    """The built-in schemes' predicted rates: the exact chain of their clock."""
    from nrpt.diagnostics import theory

    return theory.predicted_rates(rejection, scheme.name, window)


class ADJ(Scheme):
    name = "adj"
    predicted_rates = _theory

    def phases(self, k, R, P, seed, systems, state):
        dev = systems.device
        ones = torch.ones(R, 1, dtype=torch.bool, device=dev)
        return [
            (torch.full((R, 1), p, device=dev), torch.full((R, 1), p + 1, device=dev), ones)
            for p in range(P - 1)
        ]


class SEO(Scheme):
    name = "seo"
    predicted_rates = _theory

    def phases(self, k, R, P, seed, systems, state):
        lo, hi, _, odd = adjacent_pairs(R, P, systems.device)
        coin = rng.iteration_uniform((R, 1), seed, rng.Stream.SCHEME, k,
                                     device=systems.device) < 0.5
        return [(lo, hi, odd == coin)]

    def block_inputs(self, k0, U, R, seed, device):
        return {"coins": rng.iteration_uniform((R, 1), seed, rng.Stream.SCHEME, k0,
                                               device=device, count=U) < 0.5}

    def block_phase(self, pairs, inputs, u, state):
        return pairs[3] == inputs["coins"][u], state

    def block_active(self, pairs, inputs, U):
        """Every iteration's ``active`` of the block at once, ``[U, R, P-1]`` (no state: the
        same masks as :meth:`block_phase`'s, :func:`nrpt.core.fused.block_active`)."""
        return pairs[3] == inputs["coins"]


def _window(name, value, cfg=None) -> int | str:
    if isinstance(value, str):
        if value in ("auto", "swap-rate"):
            if value == "auto" and cfg is not None and cfg.rounds is not None:
                raise ValueError("window 'auto' (a tuning segment) is not available with "
                                 "rounds; give an integer window or window 'swap-rate'")
            return value
        try:
            value = int(value)
        except ValueError:
            raise ValueError(f"window must be an integer >= 1, 'auto' (W* from the measured "
                             f"rejection rate) or 'swap-rate' (W* from swap_rate); got "
                             f"{value!r}") from None
    return check_int("window", value, 1)


def _parse_window(text: str) -> int | str:
    return text if text in ("auto", "swap-rate") else int(text)


_parse_window.what = "an integer >= 1, auto or swap-rate"  # type: ignore[attr-defined]


def _window_tune(name, value, cfg):
    return check_int(name, value, 1, cfg.iterations - 1 if cfg.iterations > 1 else 1)


_TUNE_WHY = "window_tune is the tuning segment of window 'auto'"


class DEOW(Scheme):
    """Generalized DEO with window ``W`` (``window=1`` is plain DEO)."""

    name = "deo-w"
    predicted_rates = _theory

    def closed_form_restarts(self, rejection, window: int = 1) -> float | None:
        """Lemma 1 of Deng et al. (2023) (:func:`nrpt.diagnostics.theory.\
predicted_round_trips_per_1000`)."""
        from nrpt.diagnostics import theory

        return theory.predicted_round_trips_per_1000(rejection, window, scheme=self.name)
    options = (
        Option("window", _window, default="auto", section="swap", parse=_parse_window,
               help="window W of deo-w: an integer >= 1, 'auto' (W* from the rejection rate "
                    "measured in a DEO tuning segment) or 'swap-rate' (W* from r = 1 - "
                    "swap_rate); for noisy / stochastic-gradient swaps: a window > 1 with "
                    "exact Metropolis swaps is refused (biased; use --scheme deo)"),
        Option("window_tune", _window_tune, section="swap", parse=parse_int,
               default=lambda cfg: max(1, cfg.iterations // 10), why=_TUNE_WHY,
               applies=lambda cfg: None if cfg.window == "auto" else _TUNE_WHY,
               help="iterations of DEO that measure the rejection rate for --window auto "
                    "(default: iterations / 10)"),
    )

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

    def block_inputs(self, k0, U, R, seed, device):
        # (integer arithmetic on one NumPy range: torch.tensor of U Python bools costs ~40 us)
        W, ks = self.window, np.arange(k0, k0 + U, dtype=np.int64)
        out = {"odd": torch.from_numpy(ks // W % 2 == 1).to(device)}
        if W > 1:
            out["open"] = torch.from_numpy(ks % W == 0).to(device)
        return out

    def block_phase(self, pairs, inputs, u, state):
        parity = torch.where(inputs["odd"][u], pairs[3], pairs[2])
        if self.window == 1:
            return parity, state
        gate = state["gate"] | inputs["open"][u]
        return parity & gate, {**state, "gate": gate}

    def block_active(self, pairs, inputs, U):
        """Every iteration's ``active`` of the block at once, ``[U, R, P-1]``, where it depends
        on no state (``window = 1``, DEO); ``None`` otherwise (the gate reads the swaps made)."""
        if self.window != 1:
            return None
        return torch.where(inputs["odd"][:, None, None], pairs[3], pairs[2])

    def block_after(self, state, accepted):
        if self.window == 1:
            return state
        return {**state, "gate": state["gate"] & ~accepted}

    def describe(self):
        return {"scheme": self.name, "window": self.window}


class DEO(DEOW):
    name = "deo"
    options = ()

    def __init__(self, window: int = 1):
        if window != 1:
            raise ValueError(f"scheme 'deo' has window 1; use scheme 'deo-w' for window={window}")
        super().__init__(1)

    def describe(self):
        return {"scheme": self.name, "window": 1}


class APE(Scheme):
    name = "ape"
    predicted_rates = _theory

    def phases(self, k, R, P, seed, systems, state):
        dev = systems.device
        i, j = torch.triu_indices(P, P, offset=1, device=dev)
        u = rng.iteration_uniform((R, 1), seed, rng.Stream.SCHEME, k, device=dev)
        m = torch.clamp((u * i.numel()).long(), max=i.numel() - 1)
        return [(i[m], j[m], torch.ones_like(m, dtype=torch.bool))]


class NoSwap(Scheme):
    """No pair is ever proposed: each replica stays at its slot (independent chains)."""

    name = "none"
    proposes_swaps = False

    def phases(self, k, R, P, seed, systems, state):
        return []


#: what the gate did to an exact run (issue 21: ``nrpt run --target banana.py:TARGET --chains 16
#: --iterations 100000 --scheme deo-w --window auto --explorer mala``)
GATE_BIAS = ("a 2-D banana with exact sd(x1) = 2 and E[x2] = 0 gave sd(x1) = 2.81 and "
             "E[x2] = 1.97 under scheme 'deo-w' with window 'auto' (2.02 and 0.08 under 'deo')")


def check_gate(window: int | str, rule, exact_energies: bool, source: str = "given"
               ) -> str | None:
    """Whether a run may use DEO_W's gate (*at most one swap per pair per window*); every run
    passes here (:func:`nrpt.run.build.build`).

    With state-dependent verdicts the gate is a stopping time and biases slot 0 (Deng et al.
    2023, App. C.2; :data:`GATE_BIAS`).  For ``window`` (an integer, or ``"auto"``; ``source``:
    where an integer came from, e.g. ``"swap-rate"``):

    * ``window == 1`` (DEO), or a rule whose verdicts ignore the states (``always``,
      ``fixed-rate``: scheme studies) -> ``None``, nothing approximate;
    * a rule that samples the tempered product exactly (``metropolis``; ``bias-corrected``,
      which *is* Metropolis when the energies are exact) on exact energies -> ``ValueError``
      naming the scheme, window and rule and what to use instead (scheme ``deo``);
    * otherwise (noisy or minibatch energies, or the deterministic rule: the paper's DEO*
      setting, approximate anyway) -> a note naming the approximation, for the run's facts.
    """
    from nrpt.swap.noisy import BiasCorrected

    if window == 1 or not getattr(rule, "state_dependent", True):
        return None
    name = getattr(rule, "name", "") or type(rule).__name__
    shown = ("'auto' (W* from a tuning segment, which can be > 1)" if window == "auto" else
             f"{window} (window '{source}')" if source not in ("given", "scheme") else window)
    metropolis = bool(getattr(rule, "exact", False)) or isinstance(rule, BiasCorrected)
    if metropolis and exact_energies:
        raise ValueError(
            f"scheme 'deo-w' with window {shown} and swap_rule {name!r} on exact energies would "
            f"give a biased answer, so it is refused: DEO_W lets a pair swap at most once per "
            f"window, which makes later swap attempts depend on earlier verdicts; those depend "
            f"on the states, so the tempered distributions are no longer invariant (Deng et al. "
            f"2023, appendix C.2; {GATE_BIAS}).  Use scheme 'deo' (window 1): exact, and the "
            f"scheme for exact swaps (lower the rejection rate with more chains or adaptive "
            f"rounds, not a window).  DEO_W is for noisy or stochastic-gradient swaps "
            f"(swap_rule 'deterministic', or 'bias-corrected' with minibatch / noisy energies)")
    return (f"scheme 'deo-w' (window {window}) gates state-dependent swap verdicts (swap_rule "
            f"{name!r}) at most once per pair per window: a stopping-time bias of slot 0 on "
            f"top of the noisy swaps', mild only when the energy noise is large (Deng et al. "
            f"2023, appendix C.2); scheme 'deo' has no such bias")
