"""A network posterior as an nrpt energy target, and its minibatch energy estimator.

Energy of parameters ``theta`` on ``N`` examples with weight decay ``wd``::

    U(theta)     = sum_i loss_i(theta) + N * wd / 2 * |theta|^2
    Ũ_B(theta)   = (N / B) * sum_{i in B} loss_i(theta) + N * wd / 2 * |theta|^2

so ``theta - eta ∇Ũ`` with ``eta = lr / N`` is PyTorch's SGD step of rate ``lr`` on the mean
batch loss.  ``Ũ_B`` (training mode: BatchNorm batch statistics, augmentation) is the swap
energy (Deng et al. 2023, Sec. 4.2).  Each replica draws its own keyed batch per iteration
(one epoch = ``ceil(N / B)`` iterations, :class:`EpochBatches`); its BatchNorm statistics are
``extras["bn"]``.

Shard invariance: a replica's batch, its augmentation and its dropout are keyed by the
iteration's key and the replica's GLOBAL index ``(system, replica)`` (never drawn for a
process's block as a whole).  With the ``loop`` strategy (each replica evaluated alone) the
rows of a replica are then bit for bit the same whichever process holds it and however many
replicas that process holds; ``vmap`` batches the replicas of a block, and its rows can
depend on the block's size (on CPU: not for MLPs, by a few ulps for CNNs)."""

from __future__ import annotations

import math

import numpy as np
import torch

from nrpt import rng
from nrpt.deep.replicas import FunctionalNet
from nrpt.energy.estimators import EnergyEstimator, Estimate
from nrpt.host import viewable

#: the dtypes whose scalar arithmetic NumPy makes as torch does (IEEE binary32 / binary64;
#: a Python number taken as the array's dtype, NumPy >= 2's rule): NetworkEnergy._scalars
_NUMPY_EXACT = (torch.float32, torch.float64)
#: NumPy >= 2 takes a Python number in arithmetic with an array as the array's dtype (NEP 50),
#: as torch does with a tensor; NumPy 1 could promote float32 to float64
_NUMPY2 = int(np.__version__.split(".")[0]) >= 2


def _numpy_exact(*ts: torch.Tensor) -> bool:
    """Whether the small arithmetic on ``ts`` can be made in NumPy bit for bit: CPU tensors
    of one dtype of :data:`_NUMPY_EXACT`, outside autograd, NumPy 2's scalar rule."""
    dt = ts[0].dtype
    return _NUMPY2 and dt in _NUMPY_EXACT and viewable(*ts, dtypes=(dt,))


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` in ``dtype``, converted only when it differs (a no-op ``.to`` is a call)."""
    return t if t.dtype == dtype else t.to(dtype)

__all__ = ["NetworkTarget", "NetworkEnergy", "DEEP_STREAMS", "EpochBatches", "replica_ids"]


class DEEP_STREAMS:  # noqa: N801 - a namespace of constants
    AUGMENT = rng.Stream.USER + 501
    DROPOUT = rng.Stream.USER + 502
    BATCH = rng.Stream.USER + 503


def replica_ids(lead: tuple[int, ...], key) -> list[tuple[int, int]]:
    """The global ``(system, replica)`` of every row of a ``[R, w]`` block of replicas, in row
    order (``key.block``: the replicas this process holds; ``None``: all, from 0)."""
    if len(lead) != 2:
        raise ValueError(f"network replicas come as [systems, replicas, dim]; got leading "
                         f"shape {list(lead)}")
    block = getattr(key, "block", None)
    lo = 0 if block is None else block.lo
    R, w = lead
    return [(s, lo + r) for s in range(R) for r in range(w)]


class EpochBatches:
    """Keyed minibatches in epochs, O(batch) per replica and iteration (amortised).

    Law: replica ``(s, r)`` at iteration ``k`` of the key ``(seed, k, *rest)`` reads positions
    ``[j B, j B + B)`` (``j = k mod E``, ``E = ceil(N / B)`` iterations per epoch; the last
    batch of an epoch takes the last ``B`` positions when ``B`` does not divide ``N``) of a
    uniformly random permutation of the ``N`` examples drawn once per epoch ``k div E`` from a
    generator keyed by ``(seed, BATCH, epoch, *rest, s, r)``.  So every batch is a uniformly
    random ``B``-subset (no duplicates; each example is in it with probability ``B / N``), and
    within an epoch a replica sees every example (exactly once when ``B`` divides ``N``).
    The permutation of the current epoch is cached per replica (``P * N`` integers)."""

    def __init__(self, n_data: int, batch: int, per_epoch: int | None = None):
        self.n_data, self.batch = int(n_data), int(batch)
        if not 1 <= self.batch <= self.n_data:
            raise ValueError(f"batch must be in [1, {self.n_data}]; got {batch!r}")
        self.per_epoch = int(per_epoch) if per_epoch else math.ceil(self.n_data / self.batch)
        self._perms: dict[tuple, tuple[int, torch.Tensor]] = {}
        self._ids: dict[tuple, tuple[tuple[int, int], ...]] = {}

    def perms(self, seed: int, epoch: int, rest: tuple, ids: tuple, device) -> torch.Tensor:
        """``[len(ids), N]``: the epoch's permutation of each replica ``(s, r)`` of ``ids``,
        stacked once per epoch and block (each drawn from the replica's own keyed generator,
        so a replica's permutation does not depend on the block it is drawn in)."""
        ck = (seed, rest, ids, str(device))
        hit = self._perms.get(ck)
        if hit is None or hit[0] != epoch:
            rows = [torch.randperm(self.n_data, device=device, generator=rng.generator_for(
                seed, DEEP_STREAMS.BATCH, epoch, *rest, s, r, device=device)) for s, r in ids]
            hit = (epoch, torch.stack(rows) if rows else
                   torch.zeros(0, self.n_data, dtype=torch.int64, device=device))
            if len(self._perms) > 256:  # keys of one-off evaluations: keep the cache bounded
                self._perms.clear()
            self._perms[ck] = hit
        return hit[1]

    def __call__(self, key, lead: tuple[int, ...], device) -> torch.Tensor:
        """Indices ``[*lead, B]`` of the replicas of a ``[R, w]`` block (``key``: an
        :class:`nrpt.rng.Key` carrying the block, or a plain ``(seed, iteration, ...)``): one
        slice of the block's cached permutations per iteration."""
        return self.rows(key, lead, device).reshape(*lead, self.batch)

    def rows(self, key, lead: tuple[int, ...], device) -> torch.Tensor:
        """The indices of :meth:`__call__` as ``[R * w, B]`` (a view of the cached
        permutations: what the estimator gathers its batches with)."""
        key = rng.as_key(key)  # (a plain tuple's .count is tuple.count: never read it)
        if key.count:
            raise ValueError("network replicas take one iteration's batches at a time "
                             "(no fused chunks of iterations)")
        seed, k, *rest = key
        epoch, j = divmod(k, self.per_epoch)
        start = min(j * self.batch, self.n_data - self.batch)
        block = getattr(key, "block", None)
        ck = (tuple(lead), None if block is None else block.lo)
        ids = self._ids.get(ck)
        if ids is None:  # (the global ids of a block's rows: the same every iteration)
            ids = self._ids[ck] = tuple(replica_ids(tuple(lead), key))
        rows = self.perms(seed, epoch, tuple(rest), ids, device)
        return rows[:, start:start + self.batch]


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
        if n == 0:  # (a process holding no replicas)
            return theta.new_zeros(0)
        buf = self.initial_buffers.to(theta.device).expand(n, -1)
        total = torch.zeros(n, dtype=torch.float64, device=theta.device)
        for xs, ys in zip(self.x.split(self.eval_chunk), self.y.split(self.eval_chunk),
                          strict=True):
            xb, yb = xs.expand(n, *xs.shape), ys.expand(n, *ys.shape)
            losses, _, _ = self.net.loss_and_grad(theta, buf, xb, yb, self.strategy,
                                                  need_grad=False)
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
        self.batches = EpochBatches(self.n_data, self.batch_size)

    def full(self, x):
        return self.target.energy(x.reshape(-1, x.shape[-1])).reshape(x.shape[:-1])

    def init_extras(self, x, key):
        buf = self.target.initial_buffers.to(x.device)
        lead = x.shape[:-1]
        if buf.dim() == 1:
            return {"bn": buf.expand(*lead, -1).clone()}
        return {"bn": buf.reshape(*lead, buf.shape[-1]).clone()}

    def __call__(self, x, key, extras, need_grad=True):
        t, net = self.target, self.target.net
        shape = x.shape
        lead, d = shape[:-1], shape[-1]
        n = math.prod(lead)
        if n == 0:  # a process holding no replicas (more processes than blocks of chains)
            z = x.new_zeros(lead)
            return Estimate(z, x.new_zeros(shape) if need_grad else None, z,
                            {"bn": extras["bn"].clone()})
        idx = self.batches.rows(key, tuple(lead), x.device).reshape(-1)
        # [n, B, ...]: the rows themselves (index_select: the copy advanced indexing makes, at
        # a quarter of its cost on small batches)
        xb = t.x.index_select(0, idx).view(n, -1, *t.x.shape[1:])
        yb = t.y.index_select(0, idx).view(n, -1, *t.y.shape[1:])
        dropout_seed = None  # (read only by random layers)
        if t.augment is not None or net.random:
            seed, *parts = key
            ids = replica_ids(tuple(lead), key)
            if t.augment is not None:  # each replica's own keyed draws
                xb = torch.stack([
                    t.augment(xb[i], rng.generator_for(seed, DEEP_STREAMS.AUGMENT, *parts, s,
                                                       r, device=x.device))
                    for i, (s, r) in enumerate(ids)])
            # per replica: dropout keyed by (system, replica), rows evaluated one by one when
            # the network draws random numbers (replicas.FunctionalNet.loss_and_grad)
            if net.random:
                dropout_seed = [rng.key(seed, DEEP_STREAMS.DROPOUT, *parts, s, r)
                                for s, r in ids]
        theta = _as(x.reshape(n, d), net.dtype)
        bn = extras["bn"]
        buf = _as(bn.reshape(n, -1), net.dtype)
        losses, g, new = net.loss_and_grad(theta, buf, xb, yb, t.strategy, dropout_seed,
                                           need_grad=need_grad)
        u, var = self._scalars(losses, (theta * theta).sum(-1))
        if need_grad:
            # (g is this call's own tensor: scaled in place, then N * wd * theta added by
            # one pass without a temporary: add_'s alpha, rounded once where torch's kernel
            # fuses the multiply-add (vectorized CPU bodies with FMA, CUDA), twice elsewhere)
            grad = _as(g.mul_(self.n_data / self.batch_size).add_(
                theta, alpha=t.n_data * t.weight_decay).reshape(shape), x.dtype)
        else:
            grad = None
        return Estimate(_as(u.reshape(lead), x.dtype), grad, _as(var.reshape(lead), x.dtype),
                        {"bn": _as(new.reshape(*lead, -1), bn.dtype)})

    def _scalars(self, losses: torch.Tensor, sq: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(u, var)`` of the replicas' per-example ``losses[n, B]`` and squared norms
        ``sq[n]``: ``u = (N / B) * sum(losses) + N * wd / 2 * sq`` (the prior's term as
        :meth:`NetworkTarget.prior_energy` makes it) and the plug-in variance ``N^2 *
        var(losses) / B * (1 - B / N)``.  The sums and the variance are torch's; the scalar
        products and the sum of these ``[n]`` vectors are made in NumPy on the CPU (views, no
        copies: the same IEEE operations in the same order, bit for bit, at a third of a small
        torch op's cost)."""
        t = self.target
        scale, fpc = self.n_data / self.batch_size, 1.0 - self.batch_size / self.n_data
        total, v = losses.sum(-1), losses.var(-1)
        if not _numpy_exact(total, v, sq):
            return (scale * total + 0.5 * t.n_data * t.weight_decay * sq,
                    self.n_data ** 2 * v / self.batch_size * fpc)
        u = scale * total.numpy() + 0.5 * t.n_data * t.weight_decay * sq.numpy()
        w = self.n_data ** 2 * v.numpy() / self.batch_size * fpc
        return torch.from_numpy(u), torch.from_numpy(w)

    def describe(self):
        return {"energy": "network-minibatch", "batch_size": self.batch_size,
                "n_data": self.n_data, "weight_decay": self.target.weight_decay}


