"""Online stochastic-approximation adaptors of DEO*-SGD (Deng et al. 2023, Algorithm 1).

All are engine hooks: ``after_iteration(engine, k, decisions)`` runs once per iteration after the
swaps and receives, for every phase, the rule's verdict ``decision[R, M]`` of *every listed pair*
(active or not).  Following the authors' released implementation, the learning-rate and buffer
updates use the per-iteration 0/1 indicators ``A_p`` of **all** adjacent pairs, not only of the
pairs the scheme let swap.  Hooks keep their state in ``state_dict`` (checkpointed by the engine).

Step sizes (:class:`SAStepSize`): ``gamma_k = a / (k^kappa + b)``, by default
``50 / (k^0.8 + 500)`` (so ``gamma_0 = 0.1``; sum gamma = inf, sum gamma^2 < inf).

* :class:`CorrectionAdaptor` -- Eq. 12/13: ``C_{k+1} = C_k + gamma_k (mean_p A_p - S)`` drives the
  average swap indicator of the deterministic rule to the target swap rate ``S``.
* :class:`LearningRateAdaptor` -- Eqs. 8-11: with the end points ``eta_0``, ``eta_{P-1}`` fixed,
  each gap ``v_p = eta_{p+1} - eta_p`` follows ``log v_p <- log v_p + gamma_k (A_p - S)`` (Eq. 9),
  and slot ``p`` takes the average of the forward and backward sequences (Eq. 11)::

      eta_p <- (eta_{p-1} + eta_{p+1}) / 2
               + (max(0, v_{p-1}) e^{gamma H_{p-1}} - max(0, v_p) e^{gamma H_p}) / 2,

  ``H_p = A_p - S``: a pair that swaps more often than ``S`` has its gap widened.  The update
  keeps the ladder strictly increasing (a system whose update would not is left unchanged that
  iteration) and never touches the end points.
* :class:`VarianceTracker` -- averages the energy estimator's own variance estimates per slot
  over blocks of ``every`` iterations and hands them to :class:`~nrpt.swap.noisy.BiasCorrected`
  (reSGLD's sigma^2, refreshed every ``m`` iterations).
* :class:`SGTrace` -- records ``C``, the learning-rate ladder and the per-pair indicator rate every
  ``every`` iterations (for figures 4b/4d).
* :func:`window_from_swap_rate` -- Algorithm 1's input ``W = ceil((log P + log log P) /
  -log(1 - S))``; :func:`optimal_chains` -- Corollary 1 / appendix B.3's crude optimal ``P``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .diagnostics import theory

__all__ = ["SAStepSize", "pair_indicators", "CorrectionAdaptor", "LearningRateAdaptor",
           "VarianceTracker", "SGTrace", "window_from_swap_rate", "optimal_chains",
           "check_swap_rate", "check_ladder"]


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


_CACHE: dict = {}


def pair_indicators(decisions, R: int, P: int, dtype=torch.float64):
    """``(A[R, P-1], listed[R, P-1])`` from a hook's ``decisions``: the 0/1 verdict of every
    adjacent pair listed in some phase (active or not), and which pairs were listed.  (Several
    hooks of one iteration share the result.)"""
    # the cache holds the list itself, so an identity match cannot be a recycled id
    if _CACHE.get("decisions") is decisions and _CACHE.get("args") == (R, P, dtype):
        return _CACHE["value"]
    value = _pair_indicators(decisions, R, P, dtype)
    _CACHE.update(decisions=decisions, args=(R, P, dtype), value=value)
    return value


def _pair_indicators(decisions, R, P, dtype):
    if len(decisions) == 1 and decisions[0]["lo"].shape[1] == P - 1:
        d = decisions[0]
        adj = (d["hi"] - d["lo"]) == 1
        if bool(adj.all()):  # the common case (SEO/DEO/DEO_W): every pair, in order
            A = torch.empty(R, P - 1, dtype=dtype, device=d["lo"].device)
            A.scatter_(1, d["lo"], d["decision"].to(dtype))
            return A, torch.ones(R, P - 1, dtype=torch.bool, device=A.device)
    dev = decisions[0]["lo"].device
    A = torch.zeros(R, P - 1, dtype=dtype, device=dev)
    listed = torch.zeros(R, P - 1, dtype=torch.bool, device=dev)
    for d in decisions:
        adj = (d["hi"] - d["lo"]) == 1
        lo = torch.where(adj, d["lo"], torch.zeros_like(d["lo"]))
        A.scatter_add_(1, lo, (d["decision"] & adj).to(dtype))
        listed.scatter_(1, lo, adj | listed.gather(1, lo))
    return A, listed


class CorrectionAdaptor:
    """Eq. 12/13 for a :class:`~nrpt.swap.noisy.Deterministic` rule; ``C`` is per system."""

    def __init__(self, rule, swap_rate: float, gamma: SAStepSize | None = None,
                 initial: float | None = None):
        self.rule = rule
        self.S = check_swap_rate(swap_rate)
        self.gamma = gamma or SAStepSize()
        if initial is None:
            initial = rule.C.mean() if isinstance(rule.C, torch.Tensor) else rule.C
        self.initial = float(initial)

    def _ensure(self, engine) -> torch.Tensor:
        if not isinstance(self.rule.C, torch.Tensor) or self.rule.C.shape != (engine.R, 1):
            self.rule.C = torch.full((engine.R, 1), self.initial, dtype=engine.dtype,
                                     device=engine.device)
        return self.rule.C

    def after_iteration(self, engine, k, decisions):
        C = self._ensure(engine)
        A, listed = pair_indicators(decisions, engine.R, engine.P, engine.dtype)
        n = listed.sum(1, keepdim=True)
        mean = A.sum(1, keepdim=True) / n.clamp_min(1)
        step = torch.where(n > 0, mean - self.S, torch.zeros_like(mean))
        C.add_(self.gamma(k) * step)

    def state_dict(self):
        return {"C": self.rule.C}

    def load_state_dict(self, sd):
        self.rule.C = sd["C"]


class LearningRateAdaptor:
    """Eqs. 8-11 on ``engine.step_size[:, 1:-1]`` (the end points stay fixed)."""

    def __init__(self, swap_rate: float, gamma: SAStepSize | None = None):
        self.S = check_swap_rate(swap_rate)
        self.gamma = gamma or SAStepSize()
        self.rejected_updates = 0

    @staticmethod
    def update(eta: torch.Tensor, A: torch.Tensor, listed: torch.Tensor, S: float,
               gamma: float) -> torch.Tensor:
        """One step of Eq. 11 for ladders ``eta[R, P]`` and indicators ``A[R, P-1]``; returns the
        new ladders (rows whose update would break the order are returned unchanged)."""
        if eta.shape[1] < 3:
            return eta
        H = (A - S) * listed  # unlisted pairs: no update
        grown = eta.diff(dim=1) * torch.exp(gamma * H)  # gaps stay > 0 (ladder kept ordered)
        new = eta.clone()
        new[:, 1:-1] = 0.5 * (eta[:, :-2] + eta[:, 2:] + grown[:, :-1] - grown[:, 1:])
        ordered = (new.diff(dim=1) > 0).all(1, keepdim=True)
        if bool(ordered.all()):
            return new
        return torch.where(ordered, new, eta)

    def after_iteration(self, engine, k, decisions):
        A, listed = pair_indicators(decisions, engine.R, engine.P, engine.dtype)
        eta = engine.step_size
        eta.copy_(self.update(eta, A, listed, self.S, self.gamma(k)))

    def state_dict(self):
        return {}


class VarianceTracker:
    """Per-slot averages of ``state.extras["energy_var"]`` over blocks of ``every`` iterations,
    handed to a :class:`~nrpt.swap.noisy.BiasCorrected` rule at the end of each block (the first
    block's running mean is used until then)."""

    def __init__(self, rule, every: int = 100):
        if isinstance(every, bool) or int(every) != every or every < 1:
            raise ValueError(f"every must be an integer >= 1; got {every!r}")
        self.rule, self.every = rule, int(every)
        self.sum: torch.Tensor | None = None
        self.count = 0
        self.published = False

    def after_iteration(self, engine, k, decisions):
        var = engine.state.extras.get("energy_var")
        if var is None:
            return
        per_slot = var.gather(1, engine.replica_at)  # [R, P], slot order
        self.sum = per_slot.clone() if self.sum is None else self.sum + per_slot
        self.count += 1
        if self.count >= self.every or not self.published:
            self.rule.set_slot_variance(engine.schedule, self.sum / self.count)
            self.published = True
            if self.count >= self.every:
                self.sum, self.count = None, 0

    def state_dict(self):
        return {"sum": self.sum, "count": self.count,
                "var": self.rule._slot_var, "b": self.rule._slot_b}

    def load_state_dict(self, sd):
        self.sum, self.count = sd["sum"], int(sd["count"])
        if sd.get("var") is not None:
            self.rule.set_slot_variance(sd["b"], sd["var"])
            self.published = True


class SGTrace:
    """Every ``every`` iterations: iteration, ``C`` (if the rule has one), the learning-rate
    ladder and the mean indicator per adjacent pair since the previous record."""

    def __init__(self, rule=None, every: int = 20):
        self.rule, self.every = rule, int(every)
        self.k: list[int] = []
        self.C: list[torch.Tensor] = []
        self.lr: list[torch.Tensor] = []
        self.rate: list[torch.Tensor] = []
        self._sum: torch.Tensor | None = None
        self._n: torch.Tensor | None = None
        self.total_sum: torch.Tensor | None = None
        self.total_n: torch.Tensor | None = None

    def after_iteration(self, engine, k, decisions):
        A, listed = pair_indicators(decisions, engine.R, engine.P, engine.dtype)
        if self._sum is None:
            self._sum, self._n = torch.zeros_like(A), torch.zeros_like(A)
            self.total_sum, self.total_n = torch.zeros_like(A), torch.zeros_like(A)
        self._sum += A
        self._n += listed
        self.total_sum += A
        self.total_n += listed
        if (k + 1) % self.every == 0:
            self.k.append(k + 1)
            C = getattr(self.rule, "C", None)
            if isinstance(C, torch.Tensor):
                self.C.append(C[:, 0].clone())
            elif C is not None:
                self.C.append(torch.full((engine.R,), float(C), dtype=engine.dtype))
            self.lr.append(engine.step_size.clone())
            self.rate.append(self._sum / self._n.clamp_min(1))
            self._sum.zero_()
            self._n.zero_()

    def arrays(self) -> dict[str, np.ndarray]:
        """``k[T]``, ``C[T, R]``, ``learning_rates[T, R, P]``, ``pair_rate[T, R, P-1]``."""
        out = {"k": np.asarray(self.k, dtype=np.int64)}
        if self.C:
            out["C"] = torch.stack(self.C).cpu().numpy()
        if self.lr:
            out["learning_rates"] = torch.stack(self.lr).cpu().numpy()
            out["pair_rate"] = torch.stack(self.rate).cpu().numpy()
        return out

    def indicator_rate(self) -> torch.Tensor | None:
        """Mean 0/1 verdict per adjacent pair over the whole run ``[R, P-1]`` (all listed pairs,
        active or not) -- what the adaptors drive to ``S``."""
        if self.total_sum is None:
            return None
        return self.total_sum / self.total_n.clamp_min(1)

    def state_dict(self):
        return {"k": self.k, "C": self.C, "lr": self.lr, "rate": self.rate, "sum": self._sum,
                "n": self._n, "total_sum": self.total_sum, "total_n": self.total_n}

    def load_state_dict(self, sd):
        self.k, self.C, self.lr, self.rate = list(sd["k"]), list(sd["C"]), list(sd["lr"]), \
            list(sd["rate"])
        self._sum, self._n = sd["sum"], sd["n"]
        self.total_sum, self.total_n = sd["total_sum"], sd["total_n"]


def window_from_swap_rate(n_chains: int, swap_rate: float) -> int:
    """Algorithm 1's window ``W = ceil((log P + log log P) / -log(1 - S))`` (``r = 1 - S``);
    1 for ``P <= 3``.  ``P = 16, S = 0.4`` gives ``W = 8``."""
    S = check_swap_rate(swap_rate)
    return theory.optimal_window(int(n_chains), 1.0 - S)


def optimal_chains(sigma, temperatures) -> tuple[float, float]:
    """Corollary 1 / Eq. 53 (appendix B.3): the crude optimal number of chains in big data lies in

        ( min_p sigma_p / (3 tau_{p+1}) log(tau_P / tau_1),  max_p sigma_p / (2 tau_{p+1}) log(..) )

    for the energy-estimator standard deviations ``sigma_p`` (``p = 0..P-2``, or ``P`` values of
    which the last is ignored) and the temperature ladder ``tau`` (for SGD ladders, where the
    temperature is inaccessible, the paper uses ``tau ∝ eta``: pass the learning rates).
    Returns ``(lower, upper)``."""
    s = np.asarray(sigma, dtype=float).reshape(-1)
    t = np.asarray(temperatures, dtype=float).reshape(-1)
    if t.size < 2 or np.any(t <= 0) or np.any(~np.isfinite(t)):
        raise ValueError("temperatures must be >= 2 positive finite numbers")
    if s.size not in (t.size, t.size - 1) or np.any(s < 0) or np.any(~np.isfinite(s)):
        raise ValueError(f"sigma must hold {t.size - 1} or {t.size} finite numbers >= 0")
    s = s[: t.size - 1]
    ratio = s / t[1:]
    log_range = math.log(t[-1] / t[0])
    return float(ratio.min() / 3.0 * log_range), float(ratio.max() / 2.0 * log_range)
