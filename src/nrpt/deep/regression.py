"""Regression with a Gaussian likelihood: the per-example loss, the learned-noise head, the
predictive mixture and its metrics, and the recorders of a regression run (docs/deep.md,
"Regression").

Targets ``y[N]`` or ``y[N, k]`` (float) are standardised on the training split (per column:
``(y - mean) / sd``, population sd) before the run; the network ``f(x; θ)`` predicts the
standardised mean ``mu[B, k]``.  The per-example loss is the exact Gaussian negative
log-likelihood on that scale::

    loss_i(θ) = Σ_j [ (y_ij - mu_ij)² / (2 s_j²) + log s_j + ½ log 2π ]

with ``s`` either fixed (``noise``: the sd in the targets' original units, divided by the
column's sd) or learned: ``log s[k]`` is one more parameter of the network (:class:`NoiseHead`),
so it is part of the sampled state and carries the weights' Gaussian prior,
``log s_j ~ N(0, 1 / (N · weight_decay))`` (centred on the training sd of the targets).  The
energy is therefore ``(N/B) Σ_{i∈B} loss_i + N·wd/2 |θ|²`` as for classification
(:mod:`nrpt.deep.energy`), and its plug-in variance is the same formula.

The predictive distribution of the model average is the mixture of the collected Gaussians,
``p(y | x) = (1/S) Σ_s N(y | mu_s(x), s_s(x)²)`` (independent over the ``k`` columns within
each model); its test log-likelihood is ``log (1/S) Σ_s exp(log N_s)`` by log-sum-exp, not the
Gaussian of the mean.  Metrics are reported in the targets' original units: the log density
shifts by ``-Σ_j log sd_j`` and the errors scale by ``sd_j``."""

from __future__ import annotations

import json
import math
from typing import Any

import torch
from torch import Tensor, nn

from nrpt.deep.config import LIKELIHOODS
from nrpt.deep.recorders import BMARecorder, EpochMetrics

__all__ = ["LIKELIHOODS", "Targets", "GaussianLoss", "NoiseHead", "GaussianMixture",
           "gaussian_log_density", "check_regression_data", "RegressionBMARecorder",
           "RegressionEpochMetrics"]

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def gaussian_log_density(y: Tensor, mu: Tensor, log_sd: Tensor) -> Tensor:
    """``log N(y | mu, exp(log_sd)²)`` summed over the last dimension (broadcasting)."""
    z = (y - mu) * torch.exp(-log_sd)
    return (-0.5 * z * z - log_sd - _HALF_LOG_2PI).sum(-1)


class Targets:
    """How a run's targets are scaled and read: ``k`` columns, ``vector`` (``y`` was ``[N]``),
    ``mean[k]`` / ``scale[k]`` (training split, population sd), and ``noise`` (the fixed sd in
    original units, or ``None``: learned)."""

    def __init__(self, y_train: Tensor, noise: float | None):
        self.vector = y_train.dim() == 1
        y = y_train.double().reshape(y_train.shape[0], -1)
        self.k = int(y.shape[1])
        self.mean = y.mean(0)
        scale = y.std(0, unbiased=False)
        if bool((scale <= 0).any()):
            cols = (scale <= 0).nonzero().flatten().tolist()
            raise ValueError(f"train: y is constant (column(s) {cols}): a Gaussian likelihood "
                             f"needs targets that vary")
        self.scale = scale
        self.noise = None if noise is None else float(noise)

    @property
    def learned(self) -> bool:
        return self.noise is None

    def standardise(self, y: Tensor, dtype) -> Tensor:
        y = y.double().reshape(y.shape[0], -1)
        mean, scale = self.moments_on(y.device)
        return ((y - mean) / scale).to(dtype)

    def moments_on(self, device) -> tuple[Tensor, Tensor]:
        """``(mean[k], scale[k])`` (float64) on ``device``."""
        return self.mean.to(device), self.scale.to(device)

    def fixed_log_sd(self) -> Tensor:
        """The fixed noise's ``log s[k]`` on the standardised scale (float64)."""
        return torch.log(torch.as_tensor(self.noise, dtype=torch.float64) / self.scale)

    def split(self, out: Tensor) -> tuple[Tensor, Tensor]:
        """``(mu[..., k], log_sd[..., k])`` of a network output (standardised scale)."""
        mu = out[..., :self.k]
        if self.learned:
            return mu, out[..., self.k:]
        key = (out.device, out.dtype)
        cache = self.__dict__.setdefault("_fixed", {})
        if key not in cache:  # (once per device and dtype, not per step)
            cache[key] = self.fixed_log_sd().to(*key)
        return mu, cache[key].expand_as(mu)

    def state(self) -> dict[str, Any]:
        return {"k": self.k, "vector": self.vector, "y_mean": self.mean.tolist(),
                "y_scale": self.scale.tolist(), "noise": self.noise}


class GaussianLoss:
    """``loss(out[B, k or 2k], y[B, k]) -> [B]``: the Gaussian negative log-likelihood of each
    example (module docstring), with the fixed ``log s`` or the learned one in ``out[:, k:]``."""

    def __init__(self, targets: Targets):
        self.targets = targets

    def __call__(self, out: Tensor, y: Tensor) -> Tensor:
        mu, log_sd = self.targets.split(out)
        return -gaussian_log_density(y, mu, log_sd)


class NoiseHead(nn.Module):
    """``model`` with a learned ``log_sd[k]`` appended to its output: ``[B, k] -> [B, 2k]``.
    ``log_sd`` starts at 0 (the training sd of the standardised targets)."""

    def __init__(self, model: nn.Module, k: int):
        super().__init__()
        self.model = model
        p = next(model.parameters())
        self.log_sd = nn.Parameter(torch.zeros(k, dtype=p.dtype, device=p.device))

    def forward(self, x: Tensor) -> Tensor:
        mu = self.model(x)
        return torch.cat([mu, self.log_sd.expand(*mu.shape[:-1], -1)], dim=-1)


def check_regression_data(name: str, data) -> tuple[Tensor, Tensor]:
    """``(X, y)`` of a Gaussian-likelihood run: ``y`` float ``[n]`` or ``[n, k]``, one row per
    row of ``X``, finite."""
    if not (isinstance(data, tuple | list) and len(data) == 2):
        raise ValueError(f"{name} must be a pair (X, y) of tensors")
    X, y = (torch.as_tensor(t) for t in data)
    if not y.dtype.is_floating_point:
        raise ValueError(f"{name}: likelihood='gaussian' needs float targets y; got {y.dtype} "
                         f"(class labels take likelihood='categorical')")
    if y.dim() not in (1, 2) or X.dim() < 1 or X.shape[0] != y.shape[0]:
        raise ValueError(f"{name}: X has {X.shape[0] if X.dim() else 0} rows but y has shape "
                         f"{list(y.shape)} (y must be [n] or [n, k], one row per row of X)")
    if X.shape[0] < 2:
        raise ValueError(f"{name} needs at least 2 examples")
    if not torch.isfinite(X.float()).all() or not torch.isfinite(y).all():
        raise ValueError(f"{name}: X or y holds NaN or inf")
    return X, y


class GaussianMixture:
    """Running model average of a regression run on a fixed test set ``y[n, k]``
    (standardised): ``add(out[n, k or 2k])`` folds one model into the running log-sum-exp of
    ``log N(y_i | mu_s, s_s²)`` and the sums of ``mu_s`` and ``mu_s² + s_s²`` (float64, O(n)
    memory whatever the number of models); :meth:`evaluate` and :meth:`moments`."""

    def __init__(self, targets: Targets, y: Tensor):
        self.targets = targets
        self.y = y.double().reshape(y.shape[0], -1)
        self.count = 0
        self._max: Tensor | None = None  # running max of the log densities, [n]
        self._sum: Tensor | None = None  # Σ exp(log N_s - max), [n]
        self._mu: Tensor | None = None  # Σ mu_s, [n, k]
        self._m2: Tensor | None = None  # Σ (mu_s² + s_s²), [n, k]

    def add(self, out: Tensor) -> None:
        """Fold in one model's output ``[n, k]`` (fixed noise) or ``[n, 2k]`` (learned)."""
        want = self.targets.k * (2 if self.targets.learned else 1)
        if not isinstance(out, Tensor) or out.dim() != 2 or out.shape != (self.y.shape[0], want):
            shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise ValueError(f"out must be a [{self.y.shape[0]}, {want}] tensor (one row per test "
                             f"example), got {shape}")
        o = out.detach().double().to(self.y.device)
        if not bool(torch.isfinite(o).all()):
            raise ValueError("out must be finite (found nan or inf)")
        mu, log_sd = self.targets.split(o)
        lp = gaussian_log_density(self.y, mu, log_sd)
        var = torch.exp(2 * log_sd)
        if self.count == 0:
            self._max, self._sum = lp.clone(), torch.ones_like(lp)
            self._mu, self._m2 = mu.clone(), mu * mu + var
        else:
            new_max = torch.maximum(self._max, lp)
            self._sum = self._sum * torch.exp(self._max - new_max) + torch.exp(lp - new_max)
            self._max = new_max
            self._mu = self._mu + mu
            self._m2 = self._m2 + mu * mu + var
        self.count += 1

    def _need(self) -> None:
        if self.count == 0:
            raise RuntimeError("no model has been collected yet")

    def log_likelihood(self) -> Tensor:
        """``log (1/S) Σ_s N(y_i | mu_s, s_s²)`` per test example ``[n]``, standardised scale."""
        self._need()
        return self._max + torch.log(self._sum) - math.log(self.count)

    def moments(self) -> tuple[Tensor, Tensor]:
        """The mixture's mean and sd ``[n, k]`` in the targets' original units."""
        self._need()
        mean = self._mu / self.count
        var = (self._m2 / self.count - mean * mean).clamp(min=0.0)
        m, scale = self.targets.moments_on(mean.device)
        return mean * scale + m, var.sqrt() * scale

    def evaluate(self) -> dict[str, float]:
        """``test_ll`` (mean per example of the mixture's log density in original units),
        ``nll_mean`` / ``nll_sum`` (its negatives), ``rmse`` (of the mixture mean, original
        units, over all ``n·k`` entries) and ``test_ll_standardised``."""
        m, scale = self.targets.moments_on(self.y.device)
        ll_std = self.log_likelihood()
        ll = ll_std - torch.log(scale).sum()
        mean, _ = self.moments()
        y = self.y * scale + m
        rmse = ((mean - y) ** 2).mean().sqrt()
        return {"test_ll": float(ll.mean()), "nll_mean": float(-ll.mean()),
                "nll_sum": float(-ll.sum()), "rmse": float(rmse),
                "test_ll_standardised": float(ll_std.mean())}

    def state_dict(self) -> dict:
        empty = torch.zeros(0, dtype=torch.float64)
        return {"count": self.count,
                **{name: (empty if v is None else v.clone()) for name, v in
                   (("max", self._max), ("sum", self._sum), ("mu", self._mu), ("m2", self._m2))}}

    def load_state_dict(self, state: dict) -> None:
        self.count = int(state["count"])
        if self.count:
            self._max, self._sum = state["max"].double(), state["sum"].double()
            self._mu, self._m2 = state["mu"].double(), state["m2"].double()

    def __repr__(self) -> str:
        return f"GaussianMixture(count={self.count}, n={self.y.shape[0]}, k={self.targets.k})"


class RegressionBMARecorder(BMARecorder):
    """:class:`nrpt.deep.recorders.BMARecorder` whose average is a :class:`GaussianMixture`."""

    def __init__(self, net, x_test, y_test, *, targets: Targets, **kw):
        super().__init__(net, x_test, y_test, **kw)
        self.bma = GaussianMixture(targets, y_test)


class RegressionEpochMetrics(EpochMetrics):
    """Per-epoch rows of a regression run: the running mixture's ``bma_test_ll`` /
    ``bma_rmse`` (original units) and each slot's current ``slot_rmse``."""

    LINE = (("slot-0 RMSE", "slot_rmse", ".4g"), ("BMA RMSE", "bma_rmse", ".4g"),
            ("BMA test LL", "bma_test_ll", ".4f"))

    def __init__(self, bma, net, x_test, y_test, *, targets: Targets, **kw):
        super().__init__(bma, net, x_test, y_test, **kw)
        self.targets = targets

    def _slot_metric(self, out: Tensor) -> Tensor:
        """One slot's current model on the test set (``out[n, outputs]``): its RMSE in the
        targets' original units."""
        t = self.targets
        mu, _ = t.split(out[None].double())
        err = (mu[0] - self.y.double().reshape(self.y.shape[0], -1)) * t.moments_on(mu.device)[1]
        return (err ** 2).mean().sqrt()

    def _model_rows(self, row: dict[str, Any], per_slot: Tensor) -> None:
        if self.bma.bma.count:
            m = self.bma.bma.evaluate()
            row.update({"bma_test_ll": m["test_ll"], "bma_nll_mean": m["nll_mean"],
                        "bma_rmse": m["rmse"]})
        row["slot_rmse"] = per_slot.tolist()


def targets_from_state(state: dict[str, Any]) -> Targets:
    """The :class:`Targets` of :meth:`Targets.state` (a result read back)."""
    t = Targets.__new__(Targets)
    t.k, t.vector, t.noise = int(state["k"]), bool(state["vector"]), state["noise"]
    t.mean = torch.tensor(state["y_mean"], dtype=torch.float64)
    t.scale = torch.tensor(state["y_scale"], dtype=torch.float64)
    return t


def describe(targets: Targets) -> dict[str, Any]:
    """The summary's account of the likelihood (JSON-ready)."""
    return json.loads(json.dumps({"likelihood": "gaussian",
                                  "noise": "learned" if targets.learned else targets.noise,
                                  "y_mean": targets.mean.tolist(),
                                  "y_scale": targets.scale.tolist()}))
