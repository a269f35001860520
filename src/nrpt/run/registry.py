"""One registry: names -> ``"module:attribute"`` factories (imported on first use) for every
role (explorer, scheme, rule, adaptor, target); fills
:data:`nrpt.targets.protocol.BUILTIN_TARGETS`.  Each :class:`Entry` carries the
:class:`nrpt.options.Option` s it reads (its class's ``options`` plus those given to
:func:`register`), from which the config, TOML, CLI flags and ``nrpt list`` are generated,
and ``tags`` (``exact``, ``sg``, ``zero-temperature``).  Adding a component: its module, one
``register`` line below, its test (docs/architecture.md)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nrpt.options import Option
from nrpt.targets.protocol import BUILTIN_TARGETS

if TYPE_CHECKING:
    from nrpt.roles import Explorer, Rule, Scheme

__all__ = ["Entry", "ROLES", "register", "unregister", "entry", "names", "create", "describe",
           "make_explorer", "make_rule", "make_scheme"]

ROLES = ("explorer", "scheme", "rule", "adaptor", "target")


@dataclass(frozen=True)
class Entry:
    role: str
    name: str
    factory: str | Callable[..., Any]  # "module:attribute" or a callable
    summary: str = ""
    extra: tuple[Option | str, ...] = ()  # options given to register() besides the class's own
    tags: frozenset[str] = field(default_factory=frozenset)

    def load(self) -> Callable[..., Any]:
        if callable(self.factory):
            return self.factory
        module, attr = self.factory.split(":")
        return getattr(importlib.import_module(module), attr)

    @property
    def declared(self) -> tuple[Option, ...]:
        """The options this choice reads: its factory's ``options`` declarations, then
        :attr:`extra`."""
        own = getattr(self.load(), "options", ())
        if not isinstance(own, tuple | list) or not all(isinstance(o, Option) for o in own):
            raise TypeError(f"{self.role} {self.name!r}: options must be a tuple of "
                            f"nrpt.options.Option; got {own!r}")
        return (*own, *(o if isinstance(o, Option) else _declared_elsewhere(self, o)
                        for o in self.extra))

    @property
    def options(self) -> tuple[str, ...]:
        """The names of :attr:`declared`."""
        return tuple(o.name for o in self.declared)


_TABLE: dict[str, dict[str, Entry]] = {role: {} for role in ROLES}


def register(role: str, name: str, factory: str | Callable[..., Any], *, summary: str = "",
             options: tuple[Option | str, ...] = (), tags: tuple[str, ...] = (),
             replace: bool = False) -> Entry:
    """Add ``name`` to ``role``'s table (``replace=True`` to override an existing entry);
    ``options``: settings it reads besides its factory's own ``options`` declarations
    (:class:`nrpt.options.Option`, or the name of one another entry of ``role`` declares)."""
    if role not in _TABLE:
        raise ValueError(f"role must be one of {', '.join(ROLES)}; got {role!r}")
    if name in _TABLE[role] and not replace:
        raise ValueError(f"{role} {name!r} is already registered (pass replace=True)")
    if not all(isinstance(o, Option | str) for o in options):
        raise TypeError(f"{role} {name!r}: options must be nrpt.options.Option declarations "
                        f"or option names")
    e = Entry(role, name, factory, summary, tuple(options), frozenset(tags))
    _TABLE[role][name] = e
    if role == "target":  # load_target (nrpt.targets.protocol) resolves names from this view
        BUILTIN_TARGETS.add(name, e.load)
    return e


def unregister(role: str, name: str) -> None:
    """Remove ``name`` from ``role``'s table (a test's or a session's own component)."""
    entry(role, name)
    del _TABLE[role][name]
    if role == "target":
        BUILTIN_TARGETS.remove(name)


def _declared_elsewhere(e: Entry, name: str) -> Option:
    """The option ``name`` as another entry of ``e.role`` declares it (register's ``options``
    may name one instead of declaring it again)."""
    for other in _TABLE[e.role].values():
        found = [o for o in getattr(other.load(), "options", ()) if o.name == name]
        if found:
            return found[0]
    raise ValueError(f"{e.role} {e.name!r}: option {name!r} is declared by no {e.role}; "
                     f"declare it with nrpt.options.Option")


def names(role: str, tag: str | None = None) -> list[str]:
    """Registered names of ``role`` (in registration order), optionally only those tagged."""
    if role not in _TABLE:
        raise ValueError(f"role must be one of {', '.join(ROLES)}; got {role!r}")
    return [n for n, e in _TABLE[role].items() if tag is None or tag in e.tags]


def entry(role: str, name: str, *, what: str | None = None) -> Entry:
    """The entry, or a ValueError naming the setting and the allowed values."""
    table = _TABLE.get(role)
    if table is None:
        raise ValueError(f"role must be one of {', '.join(ROLES)}; got {role!r}")
    if not isinstance(name, str) or name not in table:
        raise ValueError(f"{what or role} must be one of {', '.join(table)}; got {name!r}")
    return table[name]


def create(role: str, name: str, /, **options: Any) -> Any:
    """Build the ``role`` named ``name`` with ``options``."""
    return entry(role, name).load()(**options)


def describe(role: str) -> list[tuple[str, str]]:
    """``(name, summary)`` rows for listings (``nrpt targets``, ``nrpt list``)."""
    return [(n, e.summary) for n, e in _TABLE[role].items()]


def make_explorer(name: str, **options: Any) -> Explorer:
    """Build an explorer by its registered name; ``options`` go to its constructor (e.g.
    ``leapfrog_steps``)."""
    return entry("explorer", name, what="explorer").load()(**options)


def make_rule(name: str, **options: Any) -> Rule:
    """Build a rule by its registered name."""
    return create("rule", name, **options)


def make_scheme(name: str, window: int = 1) -> Scheme:
    """Build a scheme by its registered name; ``window`` is DEO_W's."""
    cls = entry("scheme", name, what="scheme").load()
    if name == "deo-w":
        return cls(window)
    if window != 1:
        raise ValueError(f"window applies only to scheme 'deo-w'; scheme {name!r} got "
                         f"window={window}")
    return cls()


# ---------------------------------------------------------------------------------- explorers
register("explorer", "rwmh", "nrpt.explorers.metropolis:RWMH", tags=("exact",),
         summary="Gaussian random-walk Metropolis")
register("explorer", "mala", "nrpt.explorers.metropolis:MALA", tags=("exact", "gradient"),
         summary="Metropolis-adjusted Langevin")
register("explorer", "hmc", "nrpt.explorers.metropolis:HMC", tags=("exact", "gradient"),
         summary="Hamiltonian Monte Carlo (fixed leapfrog steps)")
register("explorer", "slice", "nrpt.explorers.slice:SliceSampler", tags=("exact",),
         summary="coordinate-wise slice sampler (step_size = interval width)")
register("explorer", "automala", "nrpt.explorers.automala:AutoMALA", tags=("exact", "gradient"),
         summary="MALA with a step size chosen per step, reversibly (Biron-Lattes et al. 2024)")
register("explorer", "nuts", "nrpt.explorers.nuts:NUTS", tags=("exact", "gradient"),
         summary="No-U-Turn sampler, multinomial, batched trajectories (Hoffman & Gelman)")
register("explorer", "sgld", "nrpt.explorers.sgmcmc:SGLD", tags=("sg",),
         summary="stochastic gradient Langevin dynamics")
register("explorer", "sgd", "nrpt.explorers.sgmcmc:SGD", tags=("sg", "zero-temperature"),
         summary="SGD at constant learning rates (DEO*-SGD)")
register("explorer", "sghmc", "nrpt.explorers.sgmcmc:SGHMC", tags=("sg",),
         summary="stochastic gradient HMC")
register("explorer", "msgd", "nrpt.explorers.sgmcmc:MomentumSGD",
         tags=("sg", "zero-temperature"), summary="momentum SGD (DEO*-mSGD)")
register("explorer", "psgld", "nrpt.explorers.sgmcmc:PSGLD", tags=("sg",),
         summary="RMSprop-preconditioned SGLD")
register("explorer", "psgd", "nrpt.explorers.sgmcmc:PSGD", tags=("sg", "zero-temperature"),
         summary="RMSprop-preconditioned SGD")
# (listed last: the order of the names above is what messages and listings show)
register("explorer", "mala-hmc", "nrpt.explorers.metropolis:MALAThenHMC",
         tags=("exact", "gradient"),
         summary="MALA, then HMC without a metric where slot 0 cannot enter a neck "
                 "(tail-acceptance, between rounds)")

# ---------------------------------------------------------------------------------- schemes
register("scheme", "adj", "nrpt.swap.schemes:ADJ", summary="sequential adjacent sweep")
register("scheme", "seo", "nrpt.swap.schemes:SEO", summary="stochastic even-odd (reversible)")
register("scheme", "deo", "nrpt.swap.schemes:DEO",
         summary="deterministic even-odd (non-reversible)")
register("scheme", "deo-w", "nrpt.swap.schemes:DEOW",
         summary="generalized DEO with window W (at most one swap per pair per window)")
register("scheme", "ape", "nrpt.swap.schemes:APE", summary="one random pair of slots")
register("scheme", "none", "nrpt.swap.schemes:NoSwap",
         summary="no swaps (independent chains: the no-swap baselines)")

# ---------------------------------------------------------------------------------- rules
register("rule", "metropolis", "nrpt.swap.rules:Metropolis", tags=("exact", "needs-b"),
         summary="Metropolis with exact energies")
register("rule", "deterministic", "nrpt.swap.noisy:Deterministic",
         summary="Deng et al. Eq. 7: swap iff U_hi + C < U_lo")
register("rule", "bias-corrected", "nrpt.swap.noisy:BiasCorrected", tags=("needs-b",),
         summary="reSGLD: Metropolis corrected by the energy variance")
register("rule", "always", "nrpt.swap.rules:AlwaysAccept",
         summary="accept every proposed swap (index-process studies)")

# ---------------------------------------------------------------------------------- adaptors
register("adaptor", "schedule", "nrpt.adapt.rounds:ScheduleAdaptor",
         summary="between rounds: schedule equally spaced in the fitted barrier (Syed et al.)")
register("adaptor", "step-size", "nrpt.adapt.rounds:StepSizeAdaptor",
         summary="between rounds: step sizes toward a target explorer acceptance")
register("adaptor", "slice-width", "nrpt.adapt.rounds:SliceWidthAdaptor",
         summary="between rounds: slice width from each slot's spread")
register("adaptor", "window", "nrpt.adapt.window:WindowAdaptor",
         summary="after a tuning segment: W* from the measured rejection rate")
register("adaptor", "correction", "nrpt.adapt.sa:CorrectionAdaptor",
         summary="online: buffer C toward the target swap rate S (Deng et al. Eq. 12)")
register("adaptor", "learning-rates", "nrpt.adapt.sa:LearningRateAdaptor",
         summary="online: learning rates toward equal swap rates (Deng et al. Eqs. 8-11)")
register("adaptor", "variance", "nrpt.adapt.sa:VarianceTracker",
         summary="online: per-slot energy variance for the bias-corrected rule")

# ---------------------------------------------------------------------------------- targets
register("target", "twenty-five-modes", "nrpt.targets.twenty_five_modes:TwentyFiveModes",
         summary="Deng et al.'s 2-D energy with 25 modes (option penalty=true)")
register("target", "gaussian", "nrpt.targets.gaussian:gaussian",
         summary="Gaussian (options dim, scale)")
register("target", "bimodal", "nrpt.targets.gaussian:bimodal_1d",
         summary="1-D mixture 0.3 N(-4,1) + 0.7 N(4,1)")
register("target", "mixture-2d", "nrpt.targets.gaussian:mixture_2d",
         summary="2-D Gaussian mixture")
register("target", "geometric-bimodal", "nrpt.targets.geometric:geometric_bimodal",
         summary="bimodal target on a geometric path from a Gaussian reference")
register("target", "geometric-gaussian-path",
         "nrpt.targets.gaussian_path:scaled_gaussian_path",
         summary="analytic Gaussian path (known barrier and log Z)")
register("target", "geometric-shifted-gaussian-path",
         "nrpt.targets.gaussian_path:shifted_gaussian_path",
         summary="analytic shifted Gaussian path (known barrier and log Z)")
register("target", "geometric-mixture-model", "nrpt.targets.mixture_model:mixture_model",
         summary="label-switching Gaussian mixture model posterior")
