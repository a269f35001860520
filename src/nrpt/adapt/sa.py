"""Online stochastic-approximation adaptors of DEO*-SGD (Deng et al. 2023, Algorithm 1).

``observe(it)`` runs after the swaps of every iteration and returns an
:class:`~nrpt.roles.Update`.  As in the authors' implementation, updates use the 0/1 indicators
``A_p`` of all adjacent pairs (``it.pair_indicators``), not only the pairs allowed to swap.
Step sizes (:class:`SAStepSize`): ``gamma_k = a / (k^kappa + b)``, default ``50 / (k^0.8 + 500)``.

* :class:`CorrectionAdaptor` -- Eq. 12/13: ``C_{k+1} = C_k + gamma_k (mean_p A_p - S)``.
* :class:`LearningRateAdaptor` -- Eqs. 8-11: end points fixed, gaps
  ``v_p = eta_{p+1} - eta_p`` follow ``log v_p <- log v_p + gamma_k (A_p - S)`` and::

      eta_p <- (eta_{p-1} + eta_{p+1}) / 2
               + (max(0, v_{p-1}) e^{gamma H_{p-1}} - max(0, v_p) e^{gamma H_p}) / 2,

  ``H_p = A_p - S``; a system whose update would not keep the ladder increasing is unchanged.
* :class:`VarianceTracker` -- per-slot average of the estimator's variance over blocks of
  ``every`` iterations, for :class:`~nrpt.swap.noisy.BiasCorrected`.
* :func:`window_from_swap_rate` -- ``W = ceil((log P + log log P) / -log(1 - S))``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from nrpt.diagnostics import theory
from nrpt.host import viewable
from nrpt.roles import AdaptorBase, Iteration, Update
from nrpt.swap.noisy import LADDER_UPDATES

__all__ = ["SAStepSize", "CorrectionAdaptor", "LearningRateAdaptor", "VarianceTracker",
           "window_from_swap_rate", "check_swap_rate", "check_ladder", "LADDER_UPDATES"]


def check_swap_rate(S) -> float:
    if isinstance(S, bool) or not isinstance(S, int | float) or not 0.0 < S < 1.0:
        raise ValueError(f"swap_rate S must be a number in (0, 1) (exclusive); got {S!r}")
    return float(S)


def check_ladder(values, name: str = "learning_rates") -> list[float]:
    """A strictly increasing list of positive finite numbers (slot 0 smallest)."""
    try:
        vals = [float(v) for v in values]
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be a list of numbers; got {values!r}") from err
    if len(vals) < 2:
        raise ValueError(f"{name} needs at least 2 entries; got {len(vals)}")
    if not all(v > 0 and math.isfinite(v) for v in vals):
        raise ValueError(f"{name} must be > 0 and finite; got {vals}")
    for i in range(1, len(vals)):
        if not vals[i] > vals[i - 1]:
            raise ValueError(f"{name} must be strictly increasing (slot 0 = target has the "
                             f"smallest); got {name}[{i - 1}] = {vals[i - 1]} >= "
                             f"{name}[{i}] = {vals[i]}")
    return vals


class SAStepSize:
    """``gamma_k = a / (k^kappa + b)`` (default ``50 / (k^0.8 + 500)``)."""

    def __init__(self, a: float = 50.0, kappa: float = 0.8, b: float = 500.0):
        for name, v in (("a", a), ("kappa", kappa), ("b", b)):
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise ValueError(f"step-size parameter {name} must be a number > 0; got {v!r}")
        if not 0.5 < kappa <= 1.0:
            raise ValueError(f"kappa must be in (0.5, 1] (sum gamma = inf, sum gamma^2 < inf); "
                             f"got {kappa!r}")
        self.a, self.kappa, self.b = float(a), float(kappa), float(b)

    def __call__(self, k: int) -> float:
        return self.a / (float(k) ** self.kappa + self.b)

    def describe(self) -> dict:
        return {"a": self.a, "kappa": self.kappa, "b": self.b}


PAIRS = ("all", "attempted")


def _check_pairs(pairs: str) -> str:
    if pairs not in PAIRS:
        raise ValueError(f"pairs must be one of {PAIRS}; got {pairs!r}")
    return pairs


def _indicators(it: Iteration, pairs: str):
    return it.pair_indicators if pairs == "all" else it.attempted_indicators


def _indicators_host(it: Iteration, pairs: str):
    """The indicators ``(A, listed)`` as NumPy views with whether every pair is listed, made
    once an iteration and shared by the adaptors that read them (one crossing each, not one an
    adaptor); ``None`` where they are not float64 CPU tensors (then the torch ops)."""
    def make():
        A, listed = _indicators(it, pairs)
        if not viewable(A) or listed.device.type != "cpu":
            return None
        listed = listed.numpy()
        return A.numpy(), listed, bool(listed.shape[1]) and bool(listed.all())

    key = "pair_indicators_np" if pairs == "all" else "attempted_indicators_np"
    return it._once(key, make)


def _exp_np(a: np.ndarray) -> np.ndarray:
    """``exp`` of a contiguous float64 array by torch's kernel, in place (the same bits as
    ``torch.exp`` of a tensor of that shape: the vectorized kernel's rounding depends on an
    element's position in the loop, which a contiguous array of the same shape keeps)."""
    t = torch.from_numpy(a)
    torch.exp(t, out=t)
    return a


class CorrectionAdaptor(AdaptorBase):
    """Eq. 12/13 for the :class:`~nrpt.swap.noisy.Deterministic` rule: returns the new buffer
    ``C`` (per system, ``[R, 1]``) as an update of the rule parameter ``"C"``.

    ``pairs="all"`` (Algorithm 1): the mean verdict of every adjacent pair at every iteration
    is driven to ``S``.  ``pairs="attempted"``: only the pairs the scheme allowed to swap this
    iteration count (docs/reproduction/deep.md compares them)."""

    name = "correction"

    def __init__(self, swap_rate: float, gamma: SAStepSize | None = None, pairs: str = "all"):
        self.S = check_swap_rate(swap_rate)
        self.gamma = gamma or SAStepSize()
        self.pairs = _check_pairs(pairs)

    def observe(self, it: Iteration) -> Update:
        return self.observe_block(it, self.gamma(it.k))

    def block_inputs(self, k0: int, U: int) -> list[float]:
        """The step sizes of iterations ``k0 .. k0 + U - 1`` (the block form's input)."""
        return [self.gamma(k) for k in range(k0, k0 + U)]

    #: observe_block takes its gain as a float too (nrpt.core.fused hands floats)
    float_gains = True

    def observe_block(self, it, gain) -> Update:
        """:meth:`observe` with the step size ``gain`` given (a float or a 0-d tensor)."""
        C = it.params["C"]
        host = _indicators_host(it, self.pairs) if viewable(C) else None
        if host is not None:  # (NumPy on the same memory: _host says why the numbers are the
            # same)
            with np.errstate(all="ignore"):  # (torch does not warn of overflow either)
                return Update(params={"C": torch.from_numpy(self.observe_arrays(
                    C.numpy(), *host, _gain(gain)))})
        A, listed = _indicators(it, self.pairs)
        n = listed.sum(1, keepdim=True)
        mean = A.sum(1, keepdim=True) / n.clamp_min(1)
        step = torch.where(n > 0, mean - self.S, torch.zeros_like(mean))
        return Update(params={"C": C + gain * step})


    def host_table(self) -> str | None:
        """The table this adaptor's :meth:`observe_arrays` updates (``"C"``, a rule parameter)
        where it has that form (``pairs = "all"``), else ``None``."""
        return "C" if self.pairs == "all" else None

    def observe_arrays(self, C: np.ndarray, A: np.ndarray, listed: np.ndarray, every: bool,
                       gain: float) -> np.ndarray:
        """:meth:`observe_block`'s new ``C`` on NumPy arrays: the buffer ``C[R, 1]``, the
        indicators ``A`` with the pairs ``listed`` (``every``: all listed) and the gain as a
        float (NumPy's floating-point warnings are the caller's to silence)."""
        total = A.sum(1, keepdims=True)
        if every:  # (every pair listed: n = P - 1)
            step = total / listed.shape[1] - self.S
        else:
            n = listed.sum(1, keepdims=True)
            step = total / np.maximum(n, 1) - self.S
            step[n == 0] = 0.0  # (torch.where's zeros)
        return C + gain * step


def check_ladder_update(value) -> str:
    if value not in LADDER_UPDATES:
        raise ValueError(f"ladder_update must be one of {LADDER_UPDATES}; got {value!r}")
    return value


class LearningRateAdaptor(AdaptorBase):
    """Eqs. 8-11 on the learning rates ``step_size[:, 1:-1]`` (the end points stay fixed).

    ``ladder="paper"``: Eq. 11/12 as written; an update that would break the ladder's order is
    refused for the whole system, so rungs can collapse and freeze (health findings
    ``ladder-collapse``, ``swap-rate-off-target``).

    ``ladder="log-gaps"``: Eq. 10 on ``u_p = log eta_{p+1} - log eta_p``,
    ``u_p <- u_p exp(gamma H_p)``, rescaled to sum to ``log(eta_{P-1} / eta_0)``; gaps stay
    positive and the fixed point has equal indicator rates at every pair."""

    name = "learning-rates"

    def __init__(self, swap_rate: float, gamma: SAStepSize | None = None, pairs: str = "all",
                 ladder: str = "paper"):
        self.S = check_swap_rate(swap_rate)
        self.gamma = gamma or SAStepSize()
        self.pairs = _check_pairs(pairs)
        self.ladder = check_ladder_update(ladder)

    @staticmethod
    def update_log_gaps(eta: torch.Tensor, A: torch.Tensor, listed: torch.Tensor, S: float,
                        gamma) -> torch.Tensor:
        """One step of the ``"log-gaps"`` update for ladders ``eta[R, P]`` and indicators
        ``A[R, P-1]``; the end points are kept exactly."""
        if eta.shape[1] < 3:
            return eta
        H = (A - S) * listed
        log_eta = eta.log()
        u = log_eta.diff(dim=1) * torch.exp(gamma * H)
        span = log_eta[:, -1:] - log_eta[:, :1]
        u = u * (span / u.sum(1, keepdim=True))
        new = eta.clone()
        new[:, 1:-1] = torch.exp(log_eta[:, :1] + u.cumsum(1)[:, :-1])
        return new

    @staticmethod
    def update(eta: torch.Tensor, A: torch.Tensor, listed: torch.Tensor, S: float,
               gamma: float) -> torch.Tensor:
        """One step of Eq. 11 for ladders ``eta[R, P]`` and indicators ``A[R, P-1]``; returns the
        new ladders (rows whose update would break the order are returned unchanged)."""
        if eta.shape[1] < 3:
            return eta
        if viewable(eta, A):
            with np.errstate(all="ignore"):  # (torch does not warn of overflow either)
                return torch.from_numpy(_update_np(eta.numpy(), A.numpy(), listed.numpy(), S,
                                                   _gain(gamma)))
        H = (A - S) * listed  # unlisted pairs: no update
        grown = eta.diff(dim=1) * torch.exp(gamma * H)  # gaps stay > 0 (ladder kept ordered)
        new = eta.clone()
        new[:, 1:-1] = 0.5 * (eta[:, :-2] + eta[:, 2:] + grown[:, :-1] - grown[:, 1:])
        ordered = (new.diff(dim=1) > 0).all(1, keepdim=True)
        return torch.where(ordered, new, eta)

    def observe(self, it: Iteration) -> Update:
        return self.observe_block(it, self.gamma(it.k))

    block_inputs = CorrectionAdaptor.block_inputs

    def host_table(self) -> str | None:
        """The table :meth:`observe_arrays` updates (``"step_size"``) where this adaptor has
        that form (``ladder = "paper"``, ``pairs = "all"``), else ``None``."""
        return "step_size" if self.ladder == "paper" and self.pairs == "all" else None

    def observe_arrays(self, eta: np.ndarray, A: np.ndarray, listed: np.ndarray, every: bool,
                       gain: float) -> np.ndarray:
        """:meth:`observe_block`'s new learning rates on NumPy arrays (``eta[R, P]``, the
        indicators as :meth:`CorrectionAdaptor.observe_arrays`'); ``eta`` itself when ``P <
        3``."""
        return _update_np(eta, A, listed, self.S, gain, every) if eta.shape[1] >= 3 else eta

    #: observe_block takes its gain as a float too (nrpt.core.fused hands floats)
    float_gains = True

    def observe_block(self, it, gain) -> Update:
        """:meth:`observe` with the step size ``gain`` given (a float or a 0-d tensor)."""
        eta = it.step_size
        if self.ladder == "paper" and eta.shape[1] >= 3 and viewable(eta):
            host = _indicators_host(it, self.pairs)
            if host is not None:  # (update's NumPy path on the shared views)
                with np.errstate(all="ignore"):  # (torch does not warn of overflow either)
                    return Update(step_size=torch.from_numpy(self.observe_arrays(
                        eta.numpy(), *host, _gain(gain))))
        A, listed = _indicators(it, self.pairs)
        step = self.update if self.ladder == "paper" else self.update_log_gaps
        return Update(step_size=step(eta, A, listed, self.S, gain))


def _gain(gain) -> float:
    """A step size for NumPy: a 0-d float64 tensor's value as a float (the same double)."""
    return gain.item() if isinstance(gain, torch.Tensor) else float(gain)


def _update_np(eta: np.ndarray, A: np.ndarray, listed: np.ndarray, S: float, gamma,
               every: bool = False) -> np.ndarray:
    """:meth:`LearningRateAdaptor.update` on NumPy arrays, op for op (``diff`` as the slices'
    difference, which it is; ``exp`` by torch's kernel).  Two steps are written otherwise with
    the same outcome: the order check ``b - a > 0`` as ``b > a`` (the same truth for every pair
    of doubles: with gradual underflow ``b - a`` is 0 only where ``b == a``, and a NaN fails
    both), and ``where(ordered, new, eta)`` as the refused rows copied back (none, mostly);
    ``every`` (every pair listed) skips the product by ``listed``'s ones.  NumPy's
    floating-point warnings are the caller's to silence."""
    H = A - S if every else (A - S) * listed  # (every pair listed: times 1, the same)
    grown = (eta[:, 1:] - eta[:, :-1]) * _exp_np(gamma * H)
    new = eta.copy()
    new[:, 1:-1] = 0.5 * (eta[:, :-2] + eta[:, 2:] + grown[:, :-1] - grown[:, 1:])
    up = new[:, 1:] > new[:, :-1]
    if not up.all():  # (some row not increasing: it keeps its ladder)
        ordered = up.all(1)
        new[~ordered] = eta[~ordered]
    return new


class VarianceTracker(AdaptorBase):
    """Per-slot averages of ``state.extras["energy_var"]`` (the energy estimator's own variance
    estimate, per replica) over blocks of ``every`` iterations, returned as the rule parameter
    ``"slot_variance"`` of :class:`~nrpt.swap.noisy.BiasCorrected` at the end of each block
    (during the first block, its running mean is published every iteration).  Every run with
    that rule attaches one, whether or not it adapts anything else: a rule that needs sigma^2
    always gets it."""

    name = "variance"

    def __init__(self, every: int = 100):
        if isinstance(every, bool) or int(every) != every or every < 1:
            raise ValueError(f"every must be an integer >= 1; got {every!r}")
        self.every = int(every)
        self.sum: torch.Tensor | None = None
        self.count = 0
        self.published = False

    def observe(self, it: Iteration) -> Update | None:
        var = it.state.extras.get("energy_var")
        if var is None:
            return None
        per_slot = it.at_slots(var)  # [R, P], slot order
        self.sum = per_slot.clone() if self.sum is None else self.sum + per_slot
        self.count += 1
        # until the first block is complete, its running mean is published every iteration
        # (not just the first iteration's value, which may be a special one: e.g. 0 for the
        # control-variate energy, whose anchor is refreshed at k = 0)
        if self.count >= self.every or not self.published:
            update = Update(params={"slot_variance": self.sum / self.count})
            if self.count >= self.every:
                self.sum, self.count = None, 0
                self.published = True  # a full block has been published
            return update
        return None

    def state_dict(self):
        return {"sum": self.sum, "count": self.count, "published": self.published}

    def load_state_dict(self, sd):
        self.sum, self.count = sd["sum"], int(sd["count"])
        self.published = bool(sd.get("published", True))


def window_from_swap_rate(n_chains: int, swap_rate: float) -> int:
    """Algorithm 1's window ``W = ceil((log P + log log P) / -log(1 - S))`` (``r = 1 - S``);
    1 for ``P <= 3``.  ``P = 16, S = 0.4`` gives ``W = 8``."""
    S = check_swap_rate(swap_rate)
    return theory.optimal_window(int(n_chains), 1.0 - S)
