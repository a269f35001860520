"""``DeepConfig``: every setting of a deep run, each an :class:`nrpt.options.Option`.

The settings every method reads are :data:`CENTRAL`; a method declares the ones only it reads
(``@method(NAME, options=(...))`` in :mod:`nrpt.deep.methods`).  A setting given to a run
whose method does not read it is an error naming it; one left unset is ``None``.  Cross-field
rules (``lr_min < lr_max``; ``channels_last`` only with the ``loop`` or ``auto`` strategy;
``noise`` and ``average`` against ``likelihood``) follow the checks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from nrpt.deep.methods import BUILDERS, real
from nrpt.deep.replicas import MEMORY_FORMATS, PRECISIONS, STRATEGIES
from nrpt.options import Option, check_int, choice, integer, parse_float, parse_int

__all__ = ["DeepConfig", "CENTRAL", "AVERAGES", "declarations", "known_options"]

AVERAGES = ("probabilities", "logits")
LIKELIHOODS = ("categorical", "gaussian")


def _seed(name: str, value: Any, cfg: Any = None) -> int:
    try:
        return check_int(name, value, 0, 2 ** 64 - 1)
    except ValueError:
        raise ValueError(f"{name} must be an integer in [0, 2^64); got {value!r}") from None


def _any(name: str, value: Any, cfg: Any = None) -> Any:
    return value


def _methods() -> tuple[str, ...]:
    return tuple(BUILDERS)


_POS, _NONNEG = real(0, strict=True), real(0)

#: the settings every method reads, in the order they are checked
CENTRAL: tuple[Option, ...] = (
    Option("method", choice(_methods), "deo-star", choices=_methods,
           help="deo-star (DEO*-mSGD: windows W* and the adapted swap condition), deo (W = 1), "
                "or a baseline: ensemble, cyclical, swag"),
    Option("chains", integer(2), 4, parse=parse_int,
           help="P replicas (single-chain methods run P times the iterations)"),
    Option("epochs", _POS, 10.0, parse=parse_float,
           help="epochs of the main run (after --pretrain-epochs)"),
    Option("seed", _seed, 0, parse=parse_int, help="run seed"),
    Option("batch_size", integer(2), 128, parse=parse_int,
           help="minibatch size of every gradient step"),
    Option("lr_min", _POS, 0.005, parse=parse_float,
           help="learning rate of slot 0 (per mean batch loss, as in PyTorch)"),
    Option("lr_max", _POS, 0.02, parse=parse_float,
           help="learning rate of the hottest slot P-1; the ladder is geometric in between"),
    Option("momentum", real(0, high=1), 0.9, parse=parse_float,
           help="SGD momentum in [0, 1) (stays with its replica across swaps)"),
    Option("weight_decay", _NONNEG, 5e-4, parse=parse_float,
           help="L2 penalty (the Gaussian prior of the weights)"),
    Option("pretrain_epochs", _NONNEG, 2.0, parse=parse_float,
           help="epochs of pretraining before tempering: every replica from its own "
                "initialisation, one cosine cycle of momentum SGD from lr-max, no swaps"),
    Option("burn_in", real(0, high=1), 0.25, parse=parse_float,
           help="fraction of the main run before models are collected, in [0, 1)"),
    Option("collect_every", integer(1), parse=parse_int,
           help="iterations between collected models (default: one epoch; cyclical: half "
                "an epoch)"),
    Option("average", choice(AVERAGES), "probabilities", choices=AVERAGES,
           help="the model average: 'probabilities' or 'logits'"),
    Option("likelihood", choice(LIKELIHOODS), "categorical", choices=LIKELIHOODS,
           help="categorical (integer class labels, cross entropy) or gaussian (float "
                "targets [n] or [n, k], regression; never inferred from y's dtype)"),
    Option("noise", _POS, parse=parse_float,
           help="gaussian: the fixed noise sd in the targets' units (default: learned, a "
                "log-sd parameter sampled with the weights)"),
    Option("device", _any, help="torch device (default: where the model's parameters are)"),
    Option("strategy", choice(STRATEGIES), "auto", choices=STRATEGIES,
           help="how the replicas are evaluated: auto (measured), loop, vmap or compile"),
    Option("precision", choice(PRECISIONS), "float32", choices=PRECISIONS,
           help="float32, or bf16: forward and backward under bfloat16 autocast (parameters, "
                "gradients and the sampler's state stay float32); a float32 model on cpu or a "
                "cuda device with bfloat16"),
    Option("memory_format", choice(MEMORY_FORMATS), "contiguous", choices=MEMORY_FORMATS,
           help="contiguous, or channels_last: image inputs and convolution weights in NHWC "
                "order (4-D image inputs only; runs the loop strategy)"),
    Option("eval_every", _POS, 1.0, parse=parse_float,
           help="epochs between the per-epoch metric rows (metrics.csv)"),
    Option("checkpoint_every", integer(1), 2000, parse=parse_int,
           help="write a checkpoint every this many iterations"),
)


def declarations() -> Iterator[tuple[Option, list[str] | None]]:
    """``(option, None)`` for :data:`CENTRAL`, then ``(option, [the methods that read it])``
    for the methods' own options, each once, in registration order."""
    yield from ((o, None) for o in CENTRAL)
    owners: dict[str, tuple[Option, list[str]]] = {o.name: (o, []) for o in CENTRAL}
    for name, m in BUILDERS.items():
        for o in m.options:
            if owners.setdefault(o.name, (o, []))[0] is not o:
                raise ValueError(f"option {o.name!r} of method {name!r} is declared twice with "
                                 f"different checks; share one nrpt.options.Option")
            owners[o.name][1].append(name)
    yield from ((o, names) for o, names in owners.values() if names)


def known_options() -> dict[str, Option]:
    """Name -> option, for every setting a :class:`DeepConfig` takes."""
    return {o.name: o for o, _ in declarations()}


class DeepConfig:
    """Every setting of a deep run, resolved on construction (written to ``config.json`` and
    ``run.json``): :data:`CENTRAL` and the chosen method's options, defaults filled in; the
    other methods' options are ``None``.  Learning rates are per *mean* batch loss, as in
    PyTorch (the engine uses ``lr / N``).  ``nrpt deep --help`` lists every setting."""

    def __init__(self, **settings: Any) -> None:
        from nrpt.scalars import plain

        known = known_options()
        unknown = sorted(set(settings) - set(known))
        if unknown:
            raise TypeError(f"DeepConfig got unknown setting(s) {unknown}; allowed: "
                            f"{sorted(known)}")
        self.__dict__.update({n: plain(settings.get(n)) for n in known})
        for o, names in declarations():  # (method first: it decides which apply)
            mine = names is None or self.method in names
            if mine and getattr(self, o.name) is None:
                setattr(self, o.name, o.default)
            if getattr(self, o.name) is not None:  # a bad value is named before a misplaced one
                setattr(self, o.name, o.check(o.name, getattr(self, o.name), self))
                if not mine:
                    raise ValueError(f"{o.name} does not apply to method {self.method!r}: "
                                     f"{o.reason('method', names)}; remove it")
        if not self.lr_min < self.lr_max:
            raise ValueError(f"lr_min must be < lr_max; got {self.lr_min} and {self.lr_max}")
        if self.memory_format == "channels_last" and self.strategy in ("vmap", "compile"):
            raise ValueError(f"memory_format='channels_last' runs the loop strategy (vmap has no "
                             f"batching rule for that format); got strategy={self.strategy!r}: "
                             f"use strategy='loop' or 'auto', or memory_format='contiguous'")
        if self.likelihood != "gaussian" and self.noise is not None:
            raise ValueError(f"noise applies to likelihood='gaussian' only; got noise="
                             f"{self.noise!r} with likelihood={self.likelihood!r}")
        if self.likelihood == "gaussian" and self.average != "probabilities":
            raise ValueError("average='logits' has no meaning for likelihood='gaussian' (the "
                             "model average is the mixture of the collected Gaussians); "
                             "leave average as 'probabilities'")

    def __repr__(self) -> str:
        return f"DeepConfig({', '.join(f'{k}={v!r}' for k, v in self.to_dict().items())})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeepConfig) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    @property
    def constant_lr(self) -> float:
        return float(self.lr if self.lr is not None else self.lr_min)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)
