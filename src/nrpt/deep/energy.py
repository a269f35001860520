"""A network posterior as an nrpt energy target, and its minibatch energy estimator.

Energy of parameters ``theta`` on ``N`` examples with weight decay ``wd``::

    U(theta)     = sum_i loss_i(theta) + N * wd / 2 * |theta|^2
    Ũ_B(theta)   = (N / B) * sum_{i in B} loss_i(theta) + N * wd / 2 * |theta|^2

so ``theta - eta ∇Ũ`` with ``eta = lr / N`` is PyTorch's SGD step of rate ``lr`` on the mean
batch loss.  ``Ũ_B`` (training mode: BatchNorm batch statistics, augmentation) is the swap
energy (Deng et al. 2023, Sec. 4.2).  Each replica draws its own keyed batch per iteration
(one epoch = ``N / B`` iterations); its BatchNorm statistics are ``extras["bn"]``."""

from __future__ import annotations

import math

import torch

from nrpt import rng
from nrpt.deep.replicas import FunctionalNet
from nrpt.energy.estimators import EnergyEstimator, Estimate, batch_indices

__all__ = ["NetworkTarget", "NetworkEnergy", "DEEP_STREAMS"]


class DEEP_STREAMS:  # noqa: N801 - a namespace of constants
    AUGMENT = rng.Stream.USER + 501
    DROPOUT = rng.Stream.USER + 502


class NetworkTarget:
    """A classifier's posterior on ``(x_train, y_train)`` as an energy target.

    ``energy(theta[n, dim]) -> [n]`` is the full-data energy, with training-mode BatchNorm
    batch statistics over fixed chunks of ``batch_size`` examples and no augmentation (what
    a caller may evaluate; the engines of :func:`nrpt.deep.fit` start from a minibatch
    estimate instead, :class:`nrpt.deep.methods.MinibatchLadder`).
    ``initial_buffers[buffer_dim]`` (or ``[R * P, buffer_dim]``) are the BatchNorm statistics
    replicas start from."""

    name = "network"

    def __init__(self, net: FunctionalNet, x_train: torch.Tensor, y_train: torch.Tensor, *,
                 weight_decay: float = 5e-4, augment=None, strategy: str = "vmap",
                 eval_chunk: int = 512):
        if not (isinstance(weight_decay, int | float) and weight_decay >= 0
                and math.isfinite(weight_decay)):
            raise ValueError(f"weight_decay must be a finite number >= 0; got {weight_decay!r}")
        self.net, self.x, self.y = net, x_train, y_train
        self.n_data = int(y_train.shape[0])
        self.dim = net.dim
        self.weight_decay = float(weight_decay)
        self.augment, self.strategy, self.eval_chunk = augment, strategy, int(eval_chunk)
        self.data = torch.arange(self.n_data, device=x_train.device)
        _, self.initial_buffers = net.pack()

    def prior_energy(self, theta: torch.Tensor) -> torch.Tensor:
        return 0.5 * self.n_data * self.weight_decay * (theta * theta).sum(-1)

    @torch.no_grad()
    def energy(self, theta: torch.Tensor) -> torch.Tensor:
        theta = theta.reshape(-1, self.dim).to(self.net.dtype)
        n = theta.shape[0]
        buf = self.initial_buffers.to(theta.device).expand(n, -1)
        total = torch.zeros(n, dtype=torch.float64, device=theta.device)
        for xs, ys in zip(self.x.split(self.eval_chunk), self.y.split(self.eval_chunk),
                          strict=True):
            xb, yb = xs.expand(n, *xs.shape), ys.expand(n, *ys.shape)
            losses, _, _ = self.net.loss_and_grad(theta, buf, xb, yb, self.strategy)
            total += losses.double().sum(-1)
        return (total + self.prior_energy(theta).double()).to(theta.dtype)


class NetworkEnergy(EnergyEstimator):
    """Minibatch energy and gradient of :class:`NetworkTarget` for all replicas in one batched
    forward/backward (the target's ``strategy``); ``var`` is the plug-in estimate of
    ``Var Ũ_B`` (:class:`nrpt.energy.estimators.MinibatchEnergy`'s formula)."""

    extras_keys = ("bn",)

    def __init__(self, target: NetworkTarget, batch_size: int):
        if isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 2:
            raise ValueError(f"batch_size must be an integer >= 2; got {batch_size!r}")
        if batch_size > target.n_data:
            raise ValueError(f"batch_size ({batch_size}) is larger than the training data "
                             f"(N = {target.n_data})")
        self.target, self.batch_size = target, int(batch_size)
        self.n_data = target.n_data

    def full(self, x):
        return self.target.energy(x.reshape(-1, x.shape[-1])).reshape(x.shape[:-1])

    def init_extras(self, x, key):
        buf = self.target.initial_buffers.to(x.device)
        lead = x.shape[:-1]
        if buf.dim() == 1:
            return {"bn": buf.expand(*lead, -1).clone()}
        return {"bn": buf.reshape(*lead, -1).clone()}

    def __call__(self, x, key, extras, need_grad=True):
        t, net = self.target, self.target.net
        lead, d = x.shape[:-1], x.shape[-1]
        n = math.prod(lead)
        idx = batch_indices(lead, self.n_data, self.batch_size, False, key, x.device)
        xb = t.x[idx.reshape(n, -1)]  # [n, B, ...]
        yb = t.y[idx.reshape(n, -1)]
        seed, *parts = key
        if t.augment is not None:
            g = rng.generator_for(seed, DEEP_STREAMS.AUGMENT, *parts, device=x.device)
            xb = t.augment(xb.reshape(n * self.batch_size, *xb.shape[2:]), g).reshape(xb.shape)
        dropout_seed = rng.key(seed, DEEP_STREAMS.DROPOUT, *parts)
        theta = x.reshape(n, d).to(net.dtype)
        buf = extras["bn"].reshape(n, -1).to(net.dtype)
        losses, g, new = net.loss_and_grad(theta, buf, xb, yb, t.strategy, dropout_seed,
                                           need_grad=need_grad)
        scale = self.n_data / self.batch_size
        u = scale * losses.sum(-1) + t.prior_energy(theta)
        grad = scale * g + t.n_data * t.weight_decay * theta if need_grad else None
        fpc = 1.0 - self.batch_size / self.n_data
        var = self.n_data ** 2 * losses.var(-1) / self.batch_size * fpc
        out = Estimate(u.reshape(lead).to(x.dtype),
                       grad.reshape(*lead, d).to(x.dtype) if need_grad else None,
                       var.reshape(lead).to(x.dtype),
                       {"bn": new.reshape(*lead, -1).to(extras["bn"].dtype)})
        return out

    def describe(self):
        return {"energy": "network-minibatch", "batch_size": self.batch_size,
                "n_data": self.n_data, "weight_decay": self.target.weight_decay}


