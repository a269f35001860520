"""``DeepConfig``: every setting of a deep run, each with one validation rule.

The rules are a table (:data:`RULES`: field, test, what is allowed), checked in order on
construction; one cross-field rule (``lr_min < lr_max``) follows them.  The table is what a
generic option declaration reads: a field's rule lives in one place only."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

from nrpt.deep.methods import BUILDERS, METHODS
from nrpt.deep.replicas import STRATEGIES

__all__ = ["DeepConfig", "RULES", "AVERAGES"]

AVERAGES = ("probabilities", "logits")


@dataclass
class DeepConfig:
    """Every setting of a deep run (validated on construction; written to ``config.json`` and
    ``run.json``).  Learning rates are per *mean* batch loss, as in PyTorch (the engine uses
    ``lr / N``)."""

    method: str = "deo-star"
    chains: int = 4
    epochs: float = 10.0
    batch_size: int = 128
    lr_min: float = 0.005
    lr_max: float = 0.02
    lr: float | None = None            # ensemble / swag (default lr_min)
    momentum: float = 0.9
    weight_decay: float = 5e-4
    swap_rate: float = 0.005           # S (the paper's CIFAR-100 optimum)
    window: int | str = "optimal"      # "optimal" = W* from S; deo forces 1
    correction: float = 0.0            # initial C
    sa_scale: float = 25.0             # C's SA gain per unit of the energy noise sd
    sa_pairs: str = "attempted"        # verdicts that adapt C and the rates: "attempted" pairs,
                                       # or "all" pairs every iteration (Algorithm 1, Eq. 13)
    pretrain_epochs: float = 2.0
    burn_in: float = 0.25              # fraction of the main run before collection
    collect_every: int | None = None   # iterations (default: one epoch)
    average: str = "probabilities"
    cycles: int | None = None          # cyclical: default one cycle per 10 epochs of its budget
    temperature: float = 1.0           # cyclical SGHMC noise temperature
    swag_rank: int = 20
    swag_samples: int = 20
    seed: int = 0
    device: str | None = None          # default: where the model's parameters are
    strategy: str = "auto"
    eval_every: float = 1.0            # epochs between per-epoch metric rows
    checkpoint_every: int = 2000

    def __post_init__(self):
        from nrpt.scalars import plain

        for f in fields(self):  # NumPy / 0-d torch scalars are numbers like any other
            setattr(self, f.name, plain(getattr(self, f.name)))
        for name, ok, allowed in RULES:
            value = getattr(self, name)
            if not ok(value):
                raise ValueError(f"{name} must be {allowed}; got {value!r}")
        if not self.lr_min < self.lr_max:
            raise ValueError(f"lr_min must be < lr_max; got {self.lr_min} and {self.lr_max}")

    @property
    def constant_lr(self) -> float:
        return float(self.lr if self.lr is not None else self.lr_min)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------------------ the rules
def _number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _finite(v) -> bool:
    return _number(v) and math.isfinite(v)


def _positive(v) -> bool:
    return isinstance(v, int | float) and math.isfinite(v) and v > 0


def _int_from(lo: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and v >= lo


def _optional(test: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or test(v)


def _one_of(allowed: tuple) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: v in allowed), f"one of {allowed}"


#: (field, test, what is allowed): one rule per field, checked in this order
RULES: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("method", lambda v: v in BUILDERS, f"one of {METHODS}"),
    ("average", *_one_of(AVERAGES)),
    ("strategy", *_one_of(STRATEGIES)),
    ("sa_pairs", lambda v: v in ("all", "attempted"), "'all' or 'attempted'"),
    ("chains", _int_from(2), "an integer >= 2 (P replicas; single-chain methods run chains x "
                             "the iterations)"),
    ("epochs", _positive, "a finite number > 0"),
    ("lr_min", _positive, "a finite number > 0"),
    ("lr_max", _positive, "a finite number > 0"),
    ("eval_every", _positive, "a finite number > 0"),
    ("seed", lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2 ** 64,
     "an integer in [0, 2^64)"),
    ("lr", _optional(lambda v: _finite(v) and v > 0), "a finite number > 0 (or None: lr_min)"),
    ("correction", _finite, "a finite number"),
    ("sa_scale", lambda v: _finite(v) and v > 0, "a finite number > 0"),
    ("momentum", lambda v: _number(v) and 0 <= v < 1, "in [0, 1)"),
    ("weight_decay", lambda v: _finite(v) and v >= 0, "a finite number >= 0"),
    ("swap_rate", lambda v: _number(v) and 0 < v < 1, "in (0, 1)"),
    ("window", lambda v: v == "optimal" or (isinstance(v, int) and v >= 1),
     "'optimal' or an integer >= 1"),
    ("batch_size", _int_from(2), "an integer >= 2"),
    ("burn_in", lambda v: _number(v) and 0 <= v < 1, "a fraction in [0, 1)"),
    ("pretrain_epochs", lambda v: _finite(v) and v >= 0, "a finite number >= 0"),
    ("collect_every", _optional(_int_from(1)),
     "an integer >= 1 (iterations) or None (one epoch)"),
    ("cycles", _optional(_int_from(1)), "an integer >= 1"),
    ("temperature", lambda v: _finite(v) and v >= 0, "a finite number >= 0"),
    ("swag_rank", _int_from(1), "an integer >= 1"),
    ("swag_samples", _int_from(1), "an integer >= 1"),
    ("checkpoint_every", _int_from(1), "an integer >= 1"),
)
