"""P copies of one ``torch.nn.Module`` as flat parameter rows ``theta[R, P, dim]`` evaluated as
one batched model; momentum and BatchNorm statistics (``extras["bn"]``, ``[R, P,
buffer_dim]``) live in ``ReplicaState.extras``.

Strategies: ``loop`` (one module call per replica; the reference), ``vmap``
(``torch.func.vmap(grad_and_value(...))``), ``compile`` (``torch.compile`` of the vmap
function; falls back to ``vmap`` with a warning).  ``"auto"`` times ``loop`` and ``vmap`` on
the batch and also ``compile`` when the run would exceed :data:`COMPILE_WORTH_S`.

BatchNorm layers update their running statistics themselves, with PyTorch's rule, in copies of
the buffers handed to each call (one tensor per buffer: ``vmap`` drops in-place updates of
views); ``momentum=None`` is refused.  Dropout draws
from a generator seeded from the iteration's key inside ``torch.random.fork_rng``."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.func import grad_and_value, vmap

__all__ = ["FunctionalNet", "STRATEGIES", "PRECISIONS", "MEMORY_FORMATS", "StrategyWarning",
           "choose_strategy", "STRATEGY_CACHE_ENV", "strategy_cache"]

STRATEGIES = ("auto", "loop", "vmap", "compile")
#: ``bf16``: forward and backward under ``torch.autocast(dtype=torch.bfloat16)``; parameters,
#: gradients, losses and the sampler's state stay float32
PRECISIONS = ("float32", "bf16")
#: ``channels_last``: image inputs ``[B, C, H, W]`` and 4-D (convolution) weights in NHWC order
MEMORY_FORMATS = ("contiguous", "channels_last")

#: ``auto`` tries ``compile`` only for runs whose eager time would exceed this (seconds)
COMPILE_WORTH_S = 120.0
#: ``auto`` leaves ``vmap`` only for a strategy faster by more than this fraction
SWITCH_MARGIN = 0.1
#: ``auto`` times one (loop, vmap) pair, and more only when its ratio loop / vmap lies within
#: these bounds (around the switch at ``1 - SWITCH_MARGIN``: a ratio outside them is not
#: noise on this machine; near it the median of ``repeats`` pairs decides)
DECISIVE = (0.75, 1.15)
#: the file where ``auto`` remembers its (loop, vmap) timings per machine and model, so that a
#: later run of the same model, replica count, batch shape, dtype, device, thread count and
#: torch takes no probe (:func:`strategy_cache`); ``0`` / ``off``: never remembered
STRATEGY_CACHE_ENV = "NRPT_DEEP_STRATEGY_CACHE"
#: entries the cache keeps (the most recent)
STRATEGY_CACHE_SIZE = 64

#: the ``loop`` strategy keeps its autograd leaves from call to call (views of one buffer of
#: its own that each call copies ``theta`` into: :meth:`FunctionalNet._leaves`) for states of
#: up to this many numbers (``replicas x dim``); larger ones take views of ``theta`` itself
#: (no second copy of every replica's parameters)
KEPT_LEAVES_MAX = 1 << 22

_BN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
#: layers that draw random numbers in training mode (then each call is seeded from its key)
_RANDOM = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
           nn.FeatureAlphaDropout)


def _flatten(tensors) -> torch.Tensor:
    """The tensors' numbers one after the other, as one new 1-D tensor (``torch.cat`` of
    their flattened forms, in one call)."""
    return torch._C._nn.flatten_dense_tensors(list(tensors))


class StrategyWarning(UserWarning):
    """An execution strategy could not be used and another one runs instead."""


def _loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits, y, reduction="none")


def _checked(module) -> tuple[list, torch.device, torch.dtype]:
    """``(named parameters, device, dtype)`` of a model fit to be replicated, or the error."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module; got {type(module).__name__}")
    params = list(module.named_parameters())
    if not params:
        raise ValueError("model has no parameters to sample")
    devices = {p.device for _, p in params} | {b.device for _, b in module.named_buffers()}
    if len(devices) > 1:
        raise ValueError(f"model's parameters and buffers are on different devices "
                         f"({sorted(map(str, devices))}): move the model to one device")
    dtypes = {p.dtype for _, p in params}
    if len(dtypes) > 1 or not next(iter(dtypes)).is_floating_point:
        raise ValueError(f"model's parameters must share one floating dtype; got {dtypes}")
    return params, next(iter(devices)), next(iter(dtypes))


def _slots(module: nn.Module) -> list[tuple[int, nn.Module, str, str]]:
    """``(kind, submodule, attribute, name)`` for every parameter (kind 0) and buffer (kind 1)
    attribute of ``module``, a tied one under the name ``named_parameters`` gives it."""
    out = []
    for kind, listing in ((0, module.named_parameters), (1, module.named_buffers)):
        first: dict[int, str] = {}
        for name, t in listing(remove_duplicate=False):
            first.setdefault(id(t), name)
            path, _, attr = name.rpartition(".")
            out.append((kind, module.get_submodule(path), attr, first[id(t)]))
    return out


class FunctionalNet:
    """A module's parameters as one flat vector of ``dim`` numbers and its floating-point buffers
    (BatchNorm running statistics) as one of ``buffer_dim``; batched evaluation of many.

    Args:
        module: any ``torch.nn.Module`` whose parameters are floating point and on one device.
            It is copied; the caller's module is never modified.
        loss: ``loss(logits[B, C], y[B]) -> [B]`` per-example losses (default cross entropy).
    """

    def __init__(self, module: nn.Module, loss: Callable | None = None):
        params, self.device, self.dtype = _checked(module)
        self.module = copy.deepcopy(module)
        self.loss = loss or _loss
        self.names = [n for n, _ in params]
        self.shapes = [p.shape for _, p in params]
        self.numels = [p.numel() for _, p in params]
        self.dim = sum(self.numels)
        bufs = list(self.module.named_buffers())
        floating = [(n, b) for n, b in bufs if b.is_floating_point()]
        self.buffer_names = [n for n, _ in floating]
        self.buffer_shapes = [b.shape for _, b in floating]
        self.buffer_numels = [b.numel() for _, b in floating]
        self.buffer_dim = sum(self.buffer_numels)
        self.int_buffers = {n: b for n, b in bufs if not b.is_floating_point()}
        self._slots = _slots(self.module)
        self._bn = self._hook_batchnorm()
        self._stash: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None
        # forking and seeding the RNG costs a state copy per call (a device sync on CUDA):
        # only models with random layers pay it
        self.random = any(isinstance(m, _RANDOM) for m in self.module.modules())
        self._fns: dict[str, Callable] = {}
        self.precision, self.memory_format = "float32", "contiguous"
        self._cast_hooks: list = []
        self._training: bool | None = None  # the module's mode as _mode last set it
        # the loop strategy's kept leaves: ((replicas, dtype, device), buffer, (leaves, by
        # name per replica))
        self._kept: tuple | None = None

    def _mode(self, training: bool) -> None:
        """The held module in train (``True``) or eval mode.  Its mode is set here only (the
        copy is this object's own), so the walk over every submodule that ``Module.train``
        makes is skipped when it is already in that mode (once or twice per iteration)."""
        if self._training is not training:
            self.module.train(training)
            self._training = training

    def set_execution(self, precision: str = "float32", memory_format: str = "contiguous",
                      example: torch.Tensor | None = None) -> None:
        """How forward and backward run (:data:`PRECISIONS`, :data:`MEMORY_FORMATS`); both
        change only rounding, never what is computed.  ``bf16`` needs float32 parameters (and
        on CUDA a device with bfloat16); ``channels_last`` needs 4-D image inputs (``example``:
        a batch of them), else a ``ValueError`` says why.  ``channels_last`` runs the ``loop``
        strategy (``vmap`` has no batching rule for that format: :func:`choose_strategy`'s
        ``auto`` picks ``loop`` and an explicit ``vmap``/``compile`` is refused)."""
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}; got {precision!r}")
        if memory_format not in MEMORY_FORMATS:
            raise ValueError(f"memory_format must be one of {MEMORY_FORMATS}; got "
                             f"{memory_format!r}")
        if precision == "bf16":
            if self.dtype != torch.float32:
                raise ValueError(f"precision='bf16' autocasts float32 models; this model's "
                                 f"parameters are {self.dtype}: use precision='float32' or a "
                                 f"float32 model")
            if self.device.type == "cuda" and not torch.cuda.is_bf16_supported():
                raise ValueError(f"precision='bf16': the device {self.device} has no bfloat16 "
                                 f"support; use precision='float32'")
            if self.device.type not in ("cpu", "cuda"):
                raise ValueError(f"precision='bf16' runs on cpu and cuda devices; got "
                                 f"{self.device}: use precision='float32'")
        if memory_format == "channels_last" and example is not None and example.dim() != 4:
            raise ValueError(f"memory_format='channels_last' applies to image inputs [N, C, H, "
                             f"W]; the inputs here are {list(example.shape)} (a "
                             f"{example.dim()}-D tensor): use memory_format='contiguous'")
        self.precision, self.memory_format = precision, memory_format
        for h in self._cast_hooks:
            h.remove()
        # under bf16 autocast each BatchNorm layer is fed float32 (its statistics and affine
        # parameters are float32): a pre-hook present only then
        self._cast_hooks = [mod.register_forward_pre_hook(self._hook(None))
                            for mod in self.module.modules()
                            if isinstance(mod, _BN)] if precision == "bf16" else []
        self._fns.clear()

    def _autocast(self):
        if self.precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _call(self, params: dict, buffers: dict, x: torch.Tensor) -> torch.Tensor:
        """The module's output on ``x`` under this net's precision and memory format (float
        logits of the parameters' dtype)."""
        if self.memory_format == "channels_last":
            params = {n: (t.contiguous(memory_format=torch.channels_last) if t.dim() == 4
                          else t) for n, t in params.items()}
            if x.dim() == 4:
                x = x.contiguous(memory_format=torch.channels_last)
        saved = self._bind(params, buffers)
        try:
            if self.precision == "float32":
                return self.module(x)
            with self._autocast():
                out = self.module(x)
            return out.to(self.dtype)
        finally:
            self._restore(saved)

    def _bind(self, params: dict, buffers: dict) -> list:
        """Put ``params`` and ``buffers`` in the module's slots in place of its own (what
        ``torch.func.functional_call`` does, tied names included, without walking the module
        tree on every call: the slots are listed once); what was there, for
        :meth:`_restore`."""
        given = (params, buffers)
        saved = []
        try:
            for kind, mod, attr, name in self._slots:
                store = mod._parameters if kind == 0 else mod._buffers
                saved.append((store, attr, store[attr]))
                store[attr] = given[kind][name]
        except BaseException:
            self._restore(saved)
            raise
        return saved

    @staticmethod
    def _restore(saved: list) -> None:
        for store, attr, old in saved:
            store[attr] = old

    @contextlib.contextmanager
    def _bound(self, params: dict, buffers: dict):
        """The module computing with ``params`` and ``buffers`` in place of its own, within
        the block (:meth:`_bind`)."""
        saved = self._bind(params, buffers)
        try:
            yield
        finally:
            self._restore(saved)

    def _hook_batchnorm(self) -> list[tuple[str, nn.Module]]:
        """BatchNorm layers: their running statistics are updated here (see the module doc)."""
        found = []
        for name, mod in self.module.named_modules():
            if isinstance(mod, _BN) and mod.track_running_stats:
                if mod.momentum is None:
                    raise ValueError(f"BatchNorm layer {name!r} has momentum=None (a cumulative "
                                     "average); give it a momentum (e.g. 0.1)")
                found.append((name, mod))
        return found

    # ------------------------------------------------------------------ packing
    def pack(self, module: nn.Module | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(theta[dim], buffers[buffer_dim])`` of ``module`` (default: the copy held here)."""
        module = self.module if module is None else module
        p = dict(module.named_parameters())
        b = dict(module.named_buffers())
        theta = torch.cat([p[n].detach().reshape(-1) for n in self.names])
        buf = (torch.cat([b[n].detach().reshape(-1) for n in self.buffer_names])
               if self.buffer_names else theta.new_zeros(0))
        return theta, buf

    def params(self, theta: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views of one flat vector ``theta[dim]`` as the module's named parameters."""
        return {n: c.view(s) for n, c, s in zip(self.names, theta.split(self.numels),
                                                 self.shapes, strict=True)}

    def buffers(self, buf: torch.Tensor) -> dict[str, torch.Tensor]:
        out = {n: c.view(s) for n, c, s in zip(self.buffer_names, buf.split(self.buffer_numels),
                                                self.buffer_shapes, strict=True)}
        # integer buffers (num_batches_tracked): fresh per call, never read (momentum is set)
        out.update({n: torch.zeros_like(b) for n, b in self.int_buffers.items()})
        return out

    def load(self, theta: torch.Tensor, buf: torch.Tensor | None = None) -> nn.Module:
        """A fresh copy of the module holding ``theta`` (and ``buf``), in train mode where
        the held module was last left in eval mode by :meth:`logits` (as it was before)."""
        m = copy.deepcopy(self.module)
        if self._training is False:
            m.train(True)
        return self.assign(m, theta, buf)

    @torch.no_grad()
    def assign(self, m: nn.Module, theta: torch.Tensor,
               buf: torch.Tensor | None = None) -> nn.Module:
        """``m`` (a copy of the module: :meth:`load`) with its parameters set to ``theta`` and
        its floating buffers to ``buf``, in place; returns ``m``."""
        for name, t in self.params(theta).items():
            m.get_parameter(name).copy_(t)
        if buf is not None:
            for name, t in zip(self.buffer_names, buf.split(self.buffer_numels), strict=True):
                m.get_buffer(name).copy_(t.view_as(m.get_buffer(name)))
        return m

    # ------------------------------------------------------------------ BatchNorm statistics
    def _hook(self, name: str | None):
        """The pre-hook of a BatchNorm layer: stashes the batch statistics (training mode) and
        gives the layer float32 input under ``bf16`` autocast (its statistics and affine
        parameters are float32; what PyTorch's mixed precision does on CUDA)."""
        def hook(mod, args):
            (x,) = args[:1]
            cast = x.dtype in (torch.bfloat16, torch.float16)
            if cast:
                x = x.float()
            if name is not None and self._stash is not None and mod.training:
                dims = [0, *range(2, x.dim())]
                self._stash[name] = (x.mean(dims), x.var(dims, unbiased=True))
            return (x, *args[1:]) if cast else None

        return hook

    def _new_buffers(self, buf: torch.Tensor, stats, weight: float | None = None
                     ) -> torch.Tensor:
        """``buf`` with each BatchNorm layer's statistics moved toward ``stats`` (layer ->
        ``(mean, var)``): ``(1 - w) * old + w * batch`` with ``w`` the layer's momentum
        (PyTorch's rule), or ``weight`` when given."""
        if not self.buffer_names:
            return buf
        old = self.buffers(buf)
        new = dict(old)
        for name, mod in self._bn:
            mean, var = stats[name]
            m = mod.momentum if weight is None else weight
            pre = f"{name}." if name else ""
            new[pre + "running_mean"] = (1 - m) * old[pre + "running_mean"] + m * mean.detach()
            new[pre + "running_var"] = (1 - m) * old[pre + "running_var"] + m * var.detach()
        return torch.cat([new[n].reshape(-1) for n in self.buffer_names])

    @torch.no_grad()
    def refreshed_buffers(self, theta: torch.Tensor, buf: torch.Tensor, batches) -> torch.Tensor:
        """BatchNorm statistics of one replica recomputed as the equal-weight average of the
        batch statistics over ``batches`` (an iterable of inputs), other buffers kept: SWAG's
        BatchNorm update for parameters that were never trained as such."""
        if not self._bn:
            return buf
        total: dict[str, list[torch.Tensor]] = {}
        n = 0
        self._mode(True)
        # the batch statistics are read by hooks, present only for this
        handles = [mod.register_forward_pre_hook(self._hook(name)) for name, mod in self._bn]
        try:
            n = self._accumulate(theta, buf, batches, total)
        finally:
            for h in handles:
                h.remove()
        if n == 0:
            return buf
        return self._new_buffers(buf, {k: (m / n, v / n) for k, (m, v) in total.items()}, 1.0)

    def _accumulate(self, theta, buf, batches, total) -> int:
        n = 0
        for x in batches:
            self._stash = {}
            try:
                with self._bound(self.params(theta), self.buffers(buf.clone())):
                    self.module(x)
                for name, (mean, var) in self._stash.items():
                    acc = total.setdefault(name, [torch.zeros_like(mean), torch.zeros_like(var)])
                    acc[0] += mean
                    acc[1] += var
            finally:
                self._stash = None
            n += 1
        return n

    # ------------------------------------------------------------------ one replica
    def _one(self, theta, buf, x, y, params=None, none=False):
        """``(sum of losses, (per-example losses, new buffers))`` of one replica, train mode
        (``params``: the named parameters to compute with, when given; else views of
        ``theta``).

        BatchNorm updates its running statistics itself, in place, with PyTorch's rule (the
        batch statistics it computes anyway): each buffer is handed over as its own copy (not a
        view of one flat tensor, whose in-place updates ``vmap`` would drop) and the copies are
        read back afterwards.  ``none``: the module has no buffers (then ``buf`` is returned
        as the new buffers and no buffer is bound)."""
        own = {} if none else self._own_buffers(buf)
        logits = self._call(self.params(theta) if params is None else params, own, x)
        losses = self.loss(logits, y)
        new = (torch.cat([own[n].reshape(-1) for n in self.buffer_names])
               if self.buffer_names else buf)
        return losses.sum(), (losses.detach(), new)

    def _own_buffers(self, buf: torch.Tensor) -> dict[str, torch.Tensor]:
        """The buffers of ``buf`` as fresh tensors (BatchNorm writes into them)."""
        return {n: t.clone() for n, t in self.buffers(buf).items()}

    # ------------------------------------------------------------------ batched evaluation
    def loss_and_grad(self, theta, buf, x, y, strategy: str = "vmap", seed: int | None = None,
                      need_grad: bool = True):
        """Training-mode losses and gradients of ``n`` replicas on their own batches.

        ``theta[n, dim]``, ``buf[n, buffer_dim]``, ``x[n, B, ...]``, ``y[n, B]`` ->
        ``(losses[n, B], grad[n, dim], new_buf[n, buffer_dim])`` where ``grad`` is the gradient
        of the summed losses (``None`` with ``need_grad=False``: the forward pass alone, the
        same losses and buffers).  ``seed`` seeds random layers (dropout): one seed for the
        call, or a list of one per replica (then a network with random layers is evaluated
        replica by replica, each under its own seed: a replica's draws do not depend on the
        others)."""
        self._mode(True)
        if isinstance(seed, list | tuple):
            if len(seed) != theta.shape[0]:
                raise ValueError(f"seed: {len(seed)} seeds for {theta.shape[0]} replicas")
            if not self.random:
                seed = None
            elif theta.shape[0] > 1:
                rows = [self.loss_and_grad(theta[i:i + 1], buf[i:i + 1], x[i:i + 1],
                                           y[i:i + 1], strategy, seed[i], need_grad)
                        for i in range(theta.shape[0])]
                return tuple(None if parts[0] is None else torch.cat(parts)
                             for parts in zip(*rows, strict=True))
            else:
                seed = seed[0]
        with _seeded(seed if self.random else None, self.device):
            one_by_one = strategy == "loop" or self.memory_format == "channels_last"
            if not need_grad:
                with torch.no_grad():
                    if one_by_one:
                        outs = [self._one(theta[i], buf[i], x[i], y[i])[1]
                                for i in range(theta.shape[0])]
                        return (torch.stack([o[0] for o in outs]), None,
                                torch.stack([o[1] for o in outs]))
                    _, (losses, new) = self._forward(strategy)(theta, buf, x, y)
                    return losses, None, new
            if one_by_one:
                return self._loop(theta, buf, x, y)
            fn = self._batched(strategy)
            g, (_, (losses, new)) = fn(theta, buf, x, y)
            return losses, g, new

    def _loop(self, theta, buf, x, y):
        """Each replica's forward pass, then ONE backward pass from all their summed losses
        (the outputs of one ``autograd.grad`` call): each replica's graph receives the seed 1
        it would receive alone, so every gradient is the one a backward pass per replica
        gives, bit for bit (tested), for one call into the autograd engine instead of ``n``.
        The leaves are each replica's parameters themselves, holding ``theta``'s values
        (:meth:`_leaves`), as a plain training loop's are: their gradients are written once,
        into the ``[n, dim]`` result, instead of being concatenated per replica by the
        backward pass of a split of one flat leaf and then stacked (the same numbers, copied
        once instead of twice), by one call."""
        n = theta.shape[0]
        leaves, named = self._leaves(theta)
        none = not self.buffer_names and not self.int_buffers
        xs, ys = x.unbind(0), y.unbind(0)
        bufs = None if none else buf.unbind(0)
        out_l, out_b, totals = [], [], []
        with torch.enable_grad():
            for i in range(n):
                t, (losses, new) = self._one(None, buf if none else bufs[i], xs[i], ys[i],
                                             named[i], none)
                totals.append(t)
                out_l.append(losses)
                if not none:
                    out_b.append(new.detach())
            # (the replicas' totals as the outputs, each seeded with 1: what the backward
            # pass of their sum hands each, without the sum's nodes; a parameter the loss
            # does not reach: zeros, as the split's backward gave)
            grads = torch.autograd.grad(totals, leaves, allow_unused=True,
                                        materialize_grads=True)
        # (replica-major, parameters in order: the rows of [n, dim], copied once)
        g = _flatten(grads).view(n, self.dim)
        return torch.stack(out_l), g, (buf if none else torch.stack(out_b))

    def _leaves(self, theta: torch.Tensor) -> tuple[list[torch.Tensor], list[dict]]:
        """The ``loop`` strategy's autograd leaves for ``theta[n, dim]``: each replica's
        parameters (replica-major, parameters in order) holding ``theta``'s values, and each
        replica's as a dict by name.  Up to :data:`KEPT_LEAVES_MAX` numbers they are kept
        from call to call: views of one buffer of this net's own, made once per replica count,
        dtype and device, that each call copies ``theta`` into (one copy); a leaf made anew
        for every parameter and call costs its view and autograd's bookkeeping of a new leaf
        (~45 us of a ~1.8 ms forward and backward of four digits MLPs, more than the copy).
        Larger states: views of ``theta`` itself, made per parameter for all replicas at once
        (a column block of ``theta`` unbound into its ``n`` rows).  The same values either
        way, so the same numbers."""
        n = theta.shape[0]
        if theta.numel() > KEPT_LEAVES_MAX:
            return self._named(self._views(theta.detach(), n), n)
        key = (n, theta.dtype, theta.device)
        if self._kept is None or self._kept[0] != key:
            with torch.inference_mode(False):  # (kept beyond this call: never inference tensors)
                held = torch.empty(n, self.dim, dtype=theta.dtype, device=theta.device)
                self._kept = (key, held, self._named(self._views(held, n), n))
        with torch.no_grad():
            self._kept[1].copy_(theta)
        return self._kept[2]

    def drop_kept(self) -> None:
        """Give back the ``loop`` strategy's kept leaves and their buffer (:meth:`_leaves`; up
        to :data:`KEPT_LEAVES_MAX` numbers): a fit's end, where the net lives on in its result
        for evaluations only.  A later training call makes them again."""
        self._kept = None

    def _named(self, leaves: list[torch.Tensor], n: int) -> tuple[list, list[dict]]:
        k = len(self.names)
        return leaves, [dict(zip(self.names, leaves[i * k:(i + 1) * k], strict=True))
                        for i in range(n)]

    def _views(self, flat: torch.Tensor, n: int) -> list[torch.Tensor]:
        """Leaves of each replica's parameters as views of ``flat[n, dim]`` (replica-major)."""
        per_param = [c.view(n, *s).unbind(0) for c, s in
                     zip(flat.split(self.numels, dim=1), self.shapes, strict=True)]
        return [p[i].requires_grad_(True) for i in range(n) for p in per_param]

    def _batched(self, strategy: str):
        if strategy not in self._fns:
            fn = vmap(grad_and_value(self._one, has_aux=True), randomness="different")
            if strategy == "compile":
                from nrpt.explorers.compiled import compile_cache

                compile_cache()  # (inductor's caches in nrpt's per-machine folder)
                fn = torch.compile(fn, dynamic=False)
            self._fns[strategy] = fn
        return self._fns[strategy]

    def _forward(self, strategy: str):
        """The batched forward pass alone (``need_grad=False``; ``compile`` runs it as
        ``vmap``: a second compilation for a once-a-run call does not pay)."""
        key = "forward"
        if key not in self._fns:
            self._fns[key] = vmap(self._one, randomness="different")
        return self._fns[key]

    @torch.no_grad()
    def logits(self, theta, buf, x, strategy: str = "vmap", chunk: int = 1024):
        """Eval-mode logits ``[n, B, C]`` of ``n`` replicas on one shared input ``x[B, ...]``
        (running statistics from ``buf``), in chunks of ``chunk`` examples.  The module is
        left in eval mode: every training-mode evaluation sets train mode first (so a run of
        evaluations, one per replica at an epoch's end, walks the module tree once, not twice
        per replica)."""
        self._mode(False)
        outs = []
        for xs in x.split(chunk):
            if strategy == "loop" or self.memory_format == "channels_last":
                rows = [self._call(self.params(theta[i]), self.buffers(buf[i]), xs)
                        for i in range(theta.shape[0])]
                # (one replica, the recorders' case: its logits as they are, no copy)
                outs.append(rows[0][None] if len(rows) == 1 else torch.stack(rows))
            else:
                fn = vmap(lambda t, b, xx: self._call(self.params(t), self.buffers(b), xx),
                          in_dims=(0, 0, None))
                outs.append(fn(theta, buf, xs))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)


class _seeded:
    """``torch.random.fork_rng`` seeded from ``seed`` (nothing when ``seed`` is None)."""

    def __init__(self, seed, device):
        self.seed, self.device = seed, torch.device(device)
        self._ctx = None

    def __enter__(self):
        if self.seed is None:
            return self
        devices = [self.device] if self.device.type == "cuda" else []
        self._ctx = torch.random.fork_rng(devices=devices)
        self._ctx.__enter__()
        seed = int(self.seed) % (2 ** 63)
        if self.device.type == "cpu":  # (layers on the CPU draw from its generator alone:
            torch.default_generator.manual_seed(seed)  # torch.manual_seed's lazy seeding of
        else:  # every other device kind formats the caller's stack each call)
            torch.manual_seed(seed)
        return self

    def __exit__(self, *exc):
        if self._ctx is not None:
            return self._ctx.__exit__(*exc)
        return False


def choose_strategy(net: FunctionalNet, theta, buf, x, y, strategy: str = "auto",
                    repeats: int = 3, iterations: int = 0, remember: bool = False
                    ) -> tuple[str, dict[str, float]]:
    """The execution strategy to use and the measured seconds per step of each tried.

    ``auto``: ``loop`` and ``vmap`` are timed on the given batch after one warm-up each (CPU
    time on a CPU device, wall time on an accelerator), up to ``repeats`` steps each,
    interleaved (loop, vmap, loop, ...: a change of the machine's load falls on both), and
    their medians compared; ``loop`` is kept only when it is faster than ``vmap`` by more than
    :data:`SWITCH_MARGIN` (near-ties, where the measurement decides by noise, always pick
    ``vmap``: the choice is the same from run to run).  A first pair whose ratio lies outside
    :data:`DECISIVE` decides alone (the probe is a fixed cost of every fit: a CNN step of
    four replicas on digits is 0.03 s, and the full probe was 14 steps).  If ``iterations``
    steps of the one kept would take more than :data:`COMPILE_WORTH_S`, ``compile`` is timed
    too (its compilation time is reported as ``compile_s``) and kept if faster than that by
    the same margin.  A run records its choice and a resumption reuses it.  An explicit
    ``vmap`` / ``compile`` that fails on this model falls back (``compile`` -> ``vmap`` ->
    ``loop``) with a :class:`StrategyWarning`.

    ``remember=True`` (what :func:`nrpt.deep.fit` passes): ``auto``'s (loop, vmap) timings are
    kept per machine in :func:`strategy_cache`'s file, keyed by everything the timings depend
    on (:func:`_probe_key`), and a later call with the same key decides from them without a
    probe (the timings then hold ``remembered: 1``).  Only timed decisions are kept: a model
    that ``vmap`` cannot run is probed (and warned about) every time.  The choice changes only
    speed and rounding: both strategies compute the same losses and gradients.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}; got {strategy!r}")
    timings: dict[str, float] = {}
    if net.memory_format == "channels_last":
        if strategy in ("vmap", "compile"):
            raise ValueError(f"strategy={strategy!r} cannot run memory_format='channels_last' "
                             f"(vmap has no batching rule for that format); use strategy="
                             f"'loop' or 'auto', or memory_format='contiguous'")
        return "loop", timings

    def works(s: str) -> bool:
        try:
            _time(net, s, theta, buf, x, y, 0)
            return True
        except Exception as err:  # noqa: BLE001 - any failure means: use another strategy
            nxt = "vmap" if s == "compile" else "loop"
            warnings.warn(f"strategy {s!r} failed on this model ({type(err).__name__}: "
                          f"{str(err).splitlines()[0][:200]}); using {nxt!r}",
                          StrategyWarning, stacklevel=3)
            return False

    if strategy == "loop":
        return "loop", timings
    if strategy == "compile":
        if works("compile"):
            return "compile", timings
        strategy = "vmap"
    if strategy == "vmap":
        return ("vmap" if works("vmap") else "loop"), timings
    # auto
    path = strategy_cache() if remember else None
    key = _probe_key(net, theta, x, y) if path is not None else None
    known = _remembered(path, key) if path is not None else None
    if known is not None:  # this machine timed this model, batch and replica count before
        timings.update(known, remembered=1.0)
    else:
        if not works("vmap"):
            return "loop", timings
        _time(net, "loop", theta, buf, x, y, 0)
        runs: dict[str, list[float]] = {"loop": [], "vmap": []}
        lo, hi = DECISIVE
        for i in range(max(1, repeats)):
            for s in runs:
                runs[s].append(_time(net, s, theta, buf, x, y, 1))
            if i == 0 and not lo <= runs["loop"][0] / max(runs["vmap"][0], 1e-12) <= hi:
                break  # one pair decides: far from the margin either way
        timings.update({s: statistics.median(v) for s, v in runs.items()})
        if path is not None:
            _remember(path, key, {s: timings[s] for s in runs})
    best = "loop" if timings["loop"] < (1 - SWITCH_MARGIN) * timings["vmap"] else "vmap"
    if iterations * timings[best] > COMPILE_WORTH_S:
        t0 = time.perf_counter()
        if works("compile"):
            timings["compile_s"] = time.perf_counter() - t0
            timings["compile"] = _time(net, "compile", theta, buf, x, y, repeats)
            if timings["compile"] < (1 - SWITCH_MARGIN) * timings[best]:
                best = "compile"
    return best, timings


def strategy_cache() -> Path | None:
    """The file of ``auto``'s remembered timings: ``$NRPT_DEEP_STRATEGY_CACHE`` (a file path;
    ``0`` or ``off``: none, every run probes), else ``deep-strategy.json`` in the per-machine
    cache folder (``$NRPT_COMPILE_CACHE``'s parent, or ``~/.cache/nrpt``)."""
    env = os.environ.get(STRATEGY_CACHE_ENV)
    if env is not None:
        return None if env.strip().lower() in ("0", "off", "false", "no", "") \
            else Path(env).expanduser()
    base = os.environ.get("NRPT_COMPILE_CACHE")
    folder = Path(base).expanduser().parent if base else Path.home() / ".cache" / "nrpt"
    return folder / "deep-strategy.json"


def _probe_key(net: FunctionalNet, theta, x, y) -> str:
    """What the loop / vmap timings depend on: the model's architecture (its printed form,
    parameter and buffer shapes, dtype, random layers, loss, precision and memory format), the
    replica count and batch shape, the device (a GPU by name), the thread count, torch, the
    CPU (:func:`nrpt.core.precompile.machine_digest`) and the strategies' own code."""
    dev = theta.device
    parts = {
        "model": repr(net.module), "params": [[n, list(s)] for n, s in
                                              zip(net.names, net.shapes, strict=True)],
        "buffers": [[n, list(s)] for n, s in zip(net.buffer_names, net.buffer_shapes,
                                                 strict=True)],
        "dtype": str(net.dtype), "random": net.random, "precision": net.precision,
        "memory_format": net.memory_format,
        "loss": getattr(net.loss, "__qualname__", type(net.loss).__qualname__),
        "theta": list(theta.shape), "x": [list(x.shape), str(x.dtype)],
        "y": [list(y.shape), str(y.dtype)], "device": str(dev),
        "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
        "threads": torch.get_num_threads(), **_process_key()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


#: the parts of :func:`_probe_key` that cannot change within a process (the machine, this
#: module's code), taken once: they read /proc/cpuinfo and this file (~0.1-0.3 ms a fit)
_PROCESS_KEY: dict[str, str] = {}


def _process_key() -> dict[str, str]:
    from nrpt.core.precompile import machine_digest

    if not _PROCESS_KEY:
        _PROCESS_KEY.update(machine=machine_digest(),
                            code=hashlib.sha256(Path(__file__).read_bytes()).hexdigest())
    return _PROCESS_KEY


def _read_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: probe (and write a fresh one)
    return data if isinstance(data, dict) else {}


def _remembered(path: Path, key: str) -> dict[str, float] | None:
    entry = _read_cache(path).get(key)
    if not isinstance(entry, dict):
        return None
    try:
        out = {s: float(entry[s]) for s in ("loop", "vmap")}
    except (KeyError, TypeError, ValueError):
        return None
    return out if all(v > 0 and v == v and v != float("inf") for v in out.values()) else None


def _remember(path: Path, key: str, timings: dict[str, float]) -> None:
    """Add ``key``'s timings to the file (the :data:`STRATEGY_CACHE_SIZE` most recent kept;
    written whole to a temporary file and renamed: a reader never sees half of it; a file that
    cannot be written is skipped: the cache only saves time)."""
    data = _read_cache(path)
    data.pop(key, None)
    data[key] = timings
    data = dict(list(data.items())[-STRATEGY_CACHE_SIZE:])
    from nrpt.files import atomic_write

    with contextlib.suppress(OSError):  # (atomic_write removes its temporary file)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(data), sync=False)


def _time(net, strategy, theta, buf, x, y, repeats: int) -> float:
    """Seconds per step: the process's CPU time on a CPU device (what another process's load
    does not change), wall time after a device sync on an accelerator.  ``repeats == 0``: one
    untimed call (the warm-up, and the check that it runs; every strategy is warmed up so
    before it is timed: the timed calls take no warm-up of their own)."""
    if repeats == 0:
        net.loss_and_grad(theta, buf, x, y, strategy)
        return 0.0
    cuda = theta.device.type == "cuda"
    clock = time.perf_counter if theta.device.type != "cpu" else time.process_time
    if cuda:
        torch.cuda.synchronize()
    t0 = clock()
    for _ in range(repeats):
        net.loss_and_grad(theta, buf, x, y, strategy)
    if cuda:
        torch.cuda.synchronize()
    return (clock() - t0) / repeats
