"""Targets: the protocol, its checks, and loading.

Energies are ``U = -log pi`` up to a constant; states ``x`` are ``[n, dim]`` floating tensors,
per-state values ``[n]``, in the dtype and on the device of ``x``; gradients come from
autograd; randomness only from an explicit ``torch.Generator``.  A target has ``dim >= 1`` and
one of two forms, :class:`TemperatureForm` (``energy``) or :class:`GeometricForm`
(``log_likelihood``, ``reference_log_prob``, ``reference_sample``; preferred when both,
:func:`path_kind`).  Optional members: :data:`OPTIONAL_MEMBERS`, found once per target by
:func:`capabilities`.  The model-variable hook (``model_variables``, ``model_dims``,
``model_coords``) shapes ``posterior.nc`` (:mod:`nrpt.report.posterior_file`), called after
the run only.  :func:`load_target` resolves a built-in name (:data:`BUILTIN_TARGETS`) or
``path/to/file.py:NAME``."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import itertools
import math
import sys
import types
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import torch

__all__ = [
    "BUILTIN_TARGETS",
    "OPTIONAL_MEMBERS",
    "Capabilities",
    "GeometricForm",
    "Target",
    "TemperatureForm",
    "capabilities",
    "optional_value",
    "TargetError",
    "load_target",
    "import_file_target",
    "file_spec",
    "is_stan_spec",
    "fingerprint",
    "fingerprint_differences",
    "local_modules",
    "path_kind",
    "validate_target",
]

PathKind = Literal["temperature", "geometric"]

_PROBE_N = 3
_PROBE_SEED = 20240611


class TargetError(ValueError):
    """A target does not follow the target protocol, or cannot be found / loaded."""


# --------------------------------------------------------------------------------------------
# The protocol, declared
# --------------------------------------------------------------------------------------------


class Target(Protocol):
    """What every target has; it also has one of the two forms below (see :func:`path_kind`)."""

    dim: int


class TemperatureForm(Target, Protocol):
    """A target for a temperature ladder ``pi_beta ∝ exp(-beta U)``: ``energy(x) -> [n]`` is
    ``U(x) = -log pi(x)`` (up to a constant)."""

    def energy(self, x: torch.Tensor) -> torch.Tensor: ...


class GeometricForm(Target, Protocol):
    """A target for a geometric path ``pi_beta ∝ pi_0 L^beta`` from a reference ``pi_0``
    (``beta = 0``) to the target (``beta = 1``), ``log pi = reference_log_prob +
    log_likelihood``: ``log_likelihood(x) -> [n]`` is ``log L(x) = log pi(x) - log pi_0(x)``
    (up to a constant), ``reference_log_prob(x) -> [n]`` is ``log pi_0(x)``, and
    ``reference_sample(n, generator) -> [n, dim]`` draws iid from ``pi_0`` (the ``beta = 0``
    chain is refreshed exactly)."""

    def log_likelihood(self, x: torch.Tensor) -> torch.Tensor: ...
    def reference_log_prob(self, x: torch.Tensor) -> torch.Tensor: ...
    def reference_sample(self, n: int, generator: torch.Generator) -> torch.Tensor: ...


#: The optional members a target may have: ``name -> (sort, contract)``.  A ``"method"`` is
#: present when callable (:attr:`Capabilities.methods`); a ``"flag"`` is read as
#: ``bool(getattr(target, name, False))``; a ``"value"`` is read where it is used, by
#: :func:`optional_value` (never by :func:`capabilities`: ``mean`` / ``cov`` may be
#: properties that compute exact moments expensively).
OPTIONAL_MEMBERS: dict[str, tuple[str, str]] = {
    "name": ("value", "str shown in logs and reports (else the class name)"),
    "initial_states": ("method", "(n, generator) -> [n, dim] starting states (default: zeros, "
                                 "or reference draws for a geometric path)"),
    "mean": ("value", "tensor [dim]: the exact mean of pi (error metrics)"),
    "cov": ("value", "tensor [dim, dim]: the exact covariance of pi (error metrics)"),
    "exact_moments": ("method", "() -> {'mean': [dim], 'sd': [dim]} or None"),
    "reference_is_normalized": ("flag", "reference_log_prob is normalized: the path's log Z "
                                        "estimate is absolute"),
    "grad_energy": ("method", "(x) -> [n, dim] gradient of energy, used instead of autograd"),
    "energy_and_grad": ("method", "(x) -> ([n], [n, dim]): energy and its gradient"),
    "energy_and_grad_numpy": ("method", "(float64 ndarray [n, dim]) -> (ndarray [n], ndarray "
                                        "[n, dim]): energy_and_grad's numbers on NumPy arrays "
                                        "(the CPU path of the noisy oracle)"),
    "grad_log_likelihood": ("method", "(x) -> [n, dim] gradient of log_likelihood"),
    "grad_reference_log_prob": ("method", "(x) -> [n, dim] gradient of reference_log_prob"),
    "analytic_gradients": ("flag", "the grad_* members use no autograd: gradient runs execute "
                                   "in torch.inference_mode"),
    "model_variables": ("method", "(ndarray [n, dim]) -> {variable: constrained [n, *shape]}"),
    "model_dims": ("value", "dict[str, list[str]]: named dims of the model variables"),
    "model_coords": ("value", "dict[str, list]: coordinates of those dims"),
    "density_grid": ("method", "() -> the exact density of a 2-d target on a grid"),
    "local_barrier": ("method", "(beta) -> the exact local communication barrier"),
    "coordinate_names": ("value", "list[str] (or a method giving it): coordinate names"),
    "sample": ("method", "(n, generator) -> [n, dim] exact iid draws of pi"),
    "sample_at": ("method", "(beta, n, generator) -> [n, dim] exact iid draws of pi_beta"),
    "n_data": ("value", "int: the number of data points of a minibatch (data) target"),
    "loss": ("method", "the per-datum loss of a minibatch (data) target"),
    "log_normalizer": ("value", "float: the exact log Z of pi (checks of log Z estimates)"),
    "default_reference": ("value", "str: the hot end of a run that names none, for an energy "
                                   "target: 'gaussian' (refitted between rounds; "
                                   "'gaussian-fixed' without rounds) or 'gaussian-fixed' "
                                   "(e.g. a Stan program, whose flat priors can make the "
                                   "tempered density improper)"),
    "default_settings": ("value", "dict: run settings an adaptive run (rounds) of nrpt.sample "
                                  "takes when it chose no explorer (e.g. a Stan program's: "
                                  "explorer 'mala', precondition 'auto')"),
    "starts": ("value", "'point': the target's initial_states are one point jittered, so a "
                        "temperature run starts from overdispersed draws around its mode "
                        "(nrpt.paths.starts) instead"),
    "initial_point": ("method", "() -> [dim] the point a 'point'-start target's initial "
                                "states jitter"),
    "cdf": ("method", "(t) -> the exact cdf of a 1-d target (checks)"),
    "marginal_cdf": ("method", "(t, i) -> the exact cdf of coordinate i (checks)"),
}

#: by path kind: the members giving the values (probed by :func:`validate_target`; an
#: explorer takes their gradient), and the members that supply the gradient instead
_GRADIENTS = {
    "temperature": (("energy",), ("grad_energy", "energy_and_grad")),
    "geometric": (("log_likelihood", "reference_log_prob"),
                  ("grad_log_likelihood", "grad_reference_log_prob")),
}


@dataclass(frozen=True)
class Capabilities:
    """Which optional members (:data:`OPTIONAL_MEMBERS`) a target has, found by
    :func:`capabilities`."""

    name: str  #: ``target.name`` if a str, else the class name
    methods: frozenset[str]  #: the optional methods that are callable
    analytic_gradients: bool
    reference_is_normalized: bool

    def has(self, member: str) -> bool:
        """Whether the target has the optional method ``member`` (a name of the table)."""
        if OPTIONAL_MEMBERS.get(member, ("",))[0] != "method":
            raise KeyError(f"{member!r} is not an optional method of the target protocol")
        return member in self.methods

    def supplied_gradients(self, kind: str) -> tuple[str, ...]:
        """The members that supply the gradients of path kind ``kind`` instead of autograd
        (``grad_energy`` before ``energy_and_grad``; both ``grad_*`` of a geometric target),
        or ``()``: autograd."""
        supplied = [m for m in _GRADIENTS[kind][1] if m in self.methods]
        if kind == "temperature":
            return tuple(supplied[:1])
        return tuple(supplied) if len(supplied) == len(_GRADIENTS[kind][1]) else ()


def capabilities(target: Any) -> Capabilities:
    """The optional members ``target`` has (probed once; never calls a member)."""
    name = getattr(target, "name", None)
    return Capabilities(
        name=name if isinstance(name, str) else type(target).__name__,
        methods=frozenset(m for m, (sort, _) in OPTIONAL_MEMBERS.items()
                          if sort == "method" and callable(getattr(target, m, None))),
        analytic_gradients=bool(getattr(target, "analytic_gradients", False)),
        reference_is_normalized=bool(getattr(target, "reference_is_normalized", False)))


def optional_value(target: Any, member: str, default: Any = None) -> Any:
    """``getattr(target, member, default)`` for a member of :data:`OPTIONAL_MEMBERS` (a
    :class:`KeyError` for any other name, so a misspelt probe fails loudly).  Read where the
    value is used: a ``"value"`` member may be a property that computes."""
    if member not in OPTIONAL_MEMBERS:
        raise KeyError(f"{member!r} is not an optional member of the target protocol")
    return getattr(target, member, default)


# --------------------------------------------------------------------------------------------
# Protocol checks
# --------------------------------------------------------------------------------------------

_GEOMETRIC_MEMBERS = {
    "log_likelihood": "log_likelihood(x): log pi(x) - log pi_0(x) for the path's end point",
    "reference_log_prob": (
        "reference_log_prob(x): a geometric path needs the reference log density "
        "(log target = reference_log_prob + log_likelihood)"
    ),
    "reference_sample": (
        "reference_sample(n, generator): a geometric path needs iid draws from its reference"
    ),
}

_REQUIRED_TEXT = (
    "a target needs an int attribute `dim` and either energy(x) -> [n] (temperature ladder) or "
    "log_likelihood(x) -> [n], reference_log_prob(x) -> [n] and "
    "reference_sample(n, generator) -> [n, dim] (geometric path)"
)


def _has_callable(target: Any, member: str) -> bool:
    return callable(getattr(target, member, None))


def _describe(target: Any) -> str:
    name = getattr(target, "name", None)
    kind = type(target).__name__
    return f"{kind} {name!r}" if isinstance(name, str) else kind


def path_kind(target: Any) -> PathKind:
    """``"geometric"`` if ``target`` has the geometric trio, else ``"temperature"`` if it has
    ``energy``; :class:`TargetError` otherwise, and also for a partial trio (even with
    ``energy``)."""
    present = {m: _has_callable(target, m) for m in _GEOMETRIC_MEMBERS}
    if all(present.values()):
        return "geometric"
    if any(present.values()):
        have = next(m for m, ok in present.items() if ok)
        missing = next(m for m, ok in present.items() if not ok)
        why = _GEOMETRIC_MEMBERS[missing]
        if hasattr(target, missing):
            raise TargetError(f"target has {have} but its {missing} is not callable: {why}")
        raise TargetError(f"target has {have} but no {why}")
    if _has_callable(target, "energy"):
        return "temperature"
    if hasattr(target, "energy"):
        raise TargetError(f"target.energy of {_describe(target)} is not callable; {_REQUIRED_TEXT}")
    raise TargetError(f"{_describe(target)} is not a target: {_REQUIRED_TEXT}")


def _check_dim(target: Any) -> int:
    if not hasattr(target, "dim"):
        raise TargetError(f"target has no attribute `dim`; {_REQUIRED_TEXT}")
    dim = target.dim
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TargetError(f"target.dim must be an int >= 1; got {dim!r} ({type(dim).__name__})")
    if dim < 1:
        raise TargetError(f"target.dim must be an int >= 1; got {dim}")
    return dim


def _shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def _call(target: Any, member: str, signature: str, *args: Any) -> Any:
    try:
        return getattr(target, member)(*args)
    except TargetError:
        raise
    except Exception as e:  # user code: report which member failed and how
        raise TargetError(f"target.{signature} raised {type(e).__name__}: {e}") from e


def _check_values(out: Any, member: str, dim: int) -> None:
    n = _PROBE_N
    if not isinstance(out, torch.Tensor):
        raise TargetError(
            f"target.{member}(x) must return a torch.Tensor of shape [n] = [{n}] for x of shape "
            f"[n, dim] = [{n}, {dim}]; got {type(out).__name__}"
        )
    if tuple(out.shape) != (n,):
        raise TargetError(
            f"target.{member}(x) must return shape [n] = [{n}] for x of shape "
            f"[n, dim] = [{n}, {dim}]; got {_shape(out)}"
        )
    if not out.dtype.is_floating_point:  # bool, integer and complex values are refused
        raise TargetError(
            f"target.{member}(x) must return real floating-point values (float64 or float32, "
            f"like x); got dtype {str(out.dtype).replace('torch.', '')}"
        )


def _call_pure(target: Any, member: str, x: torch.Tensor) -> Any:
    """``target.member(x)``, refusing a function that changes its input ``x`` in place (the
    sampler's states would change under it)."""
    before = x.clone()
    out = _call(target, member, f"{member}(x)", x)
    if not torch.equal(x, before):
        raise TargetError(
            f"target.{member}(x) of {_describe(target)} modified its input x in place; compute "
            f"on a copy (x = x.clone()) or with out-of-place torch ops"
        )
    return out


def _check_generator_use(target: Any, x: torch.Tensor, device, seed: int) -> None:
    """``reference_sample(n, generator)`` must draw from ``generator``: equal seeds give equal
    draws and another seed other draws (never the global RNG or a state of its own)."""
    sig = "reference_sample(n, generator)"
    again = _call(target, "reference_sample", sig, _PROBE_N,
                  torch.Generator(device=device).manual_seed(seed))
    other = _call(target, "reference_sample", sig, _PROBE_N,
                  torch.Generator(device=device).manual_seed(seed + 1))
    same = isinstance(again, torch.Tensor) and again.shape == x.shape and \
        torch.equal(again.detach().to(x), x)
    differs = isinstance(other, torch.Tensor) and not (
        other.shape == x.shape and torch.equal(other.detach().to(x), x))
    if not same or not differs:
        what = ("two generators with the same seed gave different draws" if not same else
                "generators with different seeds gave the same draws")
        raise TargetError(
            f"target.{sig} of {_describe(target)} does not draw from its generator ({what}): "
            f"draw every random number from `generator` (torch.randn(..., generator=generator)),"
            f" never the global RNG (runs must be reproducible and independent across chains)"
        )


def _varies(u: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """``(finite entries of u, whether at least two of them differ)``."""
    u = u.detach()
    ok = torch.isfinite(u)
    return ok, int(ok.sum()) >= 2 and bool((u[ok] != u[ok][0]).any())


def _check_gradient(target: Any, kind: str, x: torch.Tensor, explorer: str) -> None:
    """An explorer that follows the gradient (``explorer``) needs one that depends on ``x``:
    a value computed outside autograd (NumPy, ``.item()``, ``.detach()``) would give a zero
    gradient and silently turn MALA into a random walk, HMC into a drift-free walk.  A member
    whose values differ at the probe points must be connected to ``x`` in autograd and have a
    gradient that is not zero at every probe point (a member constant there is left alone:
    a flat energy has a zero gradient)."""
    members, supplied = _GRADIENTS[kind]
    desc = _describe(target)
    how = (f"compute it with torch ops on x (no NumPy, .item(), .detach() or torch.no_grad), "
           f"or supply {' and '.join(supplied) if kind == 'geometric' else supplied[0]}(x) -> "
           f"[n, dim]")
    use = capabilities(target).supplied_gradients(kind)
    for i, member in enumerate(members):
        if use:
            u, g = _supplied_gradient(target, member, use[i], x)
            source = f"{supplied[i]}(x)"
        else:
            got = _autograd_gradient(target, member, x, f"explorer {explorer!r}", desc, how)
            if got is None:
                continue
            u, g = got
            source = f"the autograd gradient of {member}(x)"
        ok, varies = _varies(u)
        g = torch.zeros_like(x) if g is None else torch.as_tensor(g).detach()
        if varies and not bool((g[ok] != 0).any()):
            raise TargetError(
                f"target {desc}: {source} is zero at every probe point although {member}(x) "
                f"varies there, and explorer {explorer!r} follows the gradient; {how}")


def _supplied_gradient(target: Any, member: str, grad: str, x: torch.Tensor) -> tuple[Any, Any]:
    """``(member(x), its gradient from the target's own member grad)``."""
    with torch.no_grad():
        u = _call(target, member, f"{member}(x)", x)
        g = _call(target, grad, f"{grad}(x)", x)
    return u, g[1] if grad == "energy_and_grad" else g


def _autograd_gradient(target: Any, member: str, x: torch.Tensor, who: str, desc: str,
                       how: str) -> tuple[Any, Any] | None:
    """``(member(x), its autograd gradient)``; None for a member constant at ``x``."""
    with torch.enable_grad():
        xg = x.detach().clone().requires_grad_(True)
        u = _call(target, member, f"{member}(x)", xg)
        ok, varies = _varies(u)
        if not varies:
            return None
        if not u.requires_grad or u.grad_fn is None:
            raise TargetError(
                f"target {desc}: {member}(x) is not connected to x in autograd (its result "
                f"has no gradient), but {who} needs the gradient; {how}")
        (g,) = torch.autograd.grad(u[ok].sum(), xg, allow_unused=True)
    return u, g


def _check_states(out: Any, signature: str, dim: int) -> None:
    n = _PROBE_N
    if not isinstance(out, torch.Tensor):
        raise TargetError(
            f"target.{signature} must return a torch.Tensor of shape [n, dim] = [{n}, {dim}]; "
            f"got {type(out).__name__}"
        )
    if tuple(out.shape) != (n, dim):
        raise TargetError(
            f"target.{signature} must return shape [n, dim] = [{n}, {dim}] for n = {n}; "
            f"got {_shape(out)}"
        )


def _check_moments(target: Any, dim: int) -> None:
    for member, shape in (("mean", (dim,)), ("cov", (dim, dim))):
        # only plain attributes: a property may compute exact moments expensively (quadrature),
        # which a run does not need
        if isinstance(getattr(type(target), member, None), property) or not hasattr(target,
                                                                                    member):
            continue
        value = getattr(target, member)
        if value is None:
            continue
        if not isinstance(value, torch.Tensor):
            raise TargetError(
                f"target.{member} must be a torch.Tensor of shape {list(shape)}; "
                f"got {type(value).__name__}"
            )
        if tuple(value.shape) != shape:
            raise TargetError(f"target.{member} must have shape {list(shape)}; got {_shape(value)}")


def validate_target(
    target: Any,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str = "cpu",
    *,
    probe: dict[str, Any] | None = None,
    gradient_for: str | None = None,
) -> PathKind:
    """Check ``target`` against the protocol on a probe batch of ``n = 3`` states in ``dtype`` on
    ``device``; return its path kind.

    Raises :class:`TargetError` naming the member for: wrong shapes, non-real values, an input
    changed in place, a ``reference_sample`` that ignores its generator, a bad optional member
    (``name``, ``initial_states``, ``mean``, ``cov``), and with ``gradient_for`` (a gradient
    explorer's name) a gradient disconnected from ``x`` or zero wherever the values vary.
    Non-finite values are allowed.  ``probe``: receives ``{member: [n floats]}`` for
    :func:`fingerprint`."""
    kind = path_kind(target)
    dim = _check_dim(target)
    n = _PROBE_N
    name = getattr(target, "name", None)
    if name is not None and not isinstance(name, str):
        raise TargetError(f"target.name must be a str; got {type(name).__name__}")

    generator = torch.Generator(device=device)
    generator.manual_seed(_PROBE_SEED)
    x = _probe_states(target, kind, dim, dtype, device, generator)
    for member in _GRADIENTS[kind][0]:
        out = _call_pure(target, member, x)
        _check_values(out, member, dim)
        _keep(probe, member, out)
    if gradient_for is not None:
        _check_gradient(target, kind, x, gradient_for)

    if hasattr(target, "initial_states"):
        if not callable(target.initial_states):
            raise TargetError("target.initial_states must be callable (n, generator) -> [n, dim]")
        sig = "initial_states(n, generator)"
        _check_states(_call(target, "initial_states", sig, n, generator), sig, dim)
    _check_moments(target, dim)
    if probe is not None:
        probe["dtype"] = str(dtype)
    return kind


def _probe_states(target: Any, kind: str, dim: int, dtype: torch.dtype, device,
                  generator: torch.Generator) -> torch.Tensor:
    """The probe batch: reference draws (checked) for a geometric target, else zeros, then
    small offsets of alternating sign."""
    n = _PROBE_N
    if kind == "geometric":
        x = _call(target, "reference_sample", "reference_sample(n, generator)", n, generator)
        _check_states(x, "reference_sample(n, generator)", dim)
        x = x.detach().to(dtype=dtype, device=device)
        _check_generator_use(target, x, device, _PROBE_SEED)
        return x
    steps = torch.arange(n, dtype=dtype, device=device).unsqueeze(1)
    signs = torch.where(torch.arange(dim, device=device) % 2 == 0, 1.0, -1.0).to(dtype)
    return 0.1 * steps * signs


def _keep(probe: dict[str, Any] | None, member: str, out: torch.Tensor) -> None:
    if probe is not None:
        values = out.detach().to("cpu", torch.float64).reshape(-1).tolist()
        probe[member] = [v if math.isfinite(v) else str(v) for v in values]


# --------------------------------------------------------------------------------------------
# Built-ins and loading
# --------------------------------------------------------------------------------------------


class _BuiltinTargets(Mapping[str, Callable[..., Any]]):
    """Built-in targets: name -> factory(**kwargs).  :mod:`nrpt.run.registry` fills it with
    its ``target`` role (register a target there, not here): each name holds a loader that
    imports the factory on first use.  The registry pushes its entries down here, so this
    module imports nothing from :mod:`nrpt.run`."""

    def __init__(self) -> None:
        self._loaders: dict[str, Callable[[], Callable[..., Any]]] = {}

    def add(self, name: str, loader: Callable[[], Callable[..., Any]]) -> None:
        self._loaders[name] = loader

    def remove(self, name: str) -> None:
        del self._loaders[name]

    def __contains__(self, key: object) -> bool:
        return key in self._loaders

    def __getitem__(self, key: str) -> Callable[..., Any]:
        if key not in self._loaders:
            raise ValueError(f"target must be one of {', '.join(self._loaders)}; got {key!r}")
        return self._loaders[key]()

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaders)

    def __len__(self) -> int:
        return len(self._loaders)


#: Built-in targets: name -> factory(**kwargs) returning a target (filled by the registry).
BUILTIN_TARGETS = _BuiltinTargets()

_module_counter = itertools.count()


def _load_module(path: Path) -> Any:
    if not path.is_file():
        raise TargetError(f"target file not found: {path}")
    module_name = f"nrpt_user_target_{path.stem}_{next(_module_counter)}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise TargetError(f"cannot import {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    before = set(sys.modules)
    sys.modules[module_name] = module  # dataclasses, pickling etc. look the module up here
    try:
        with _imports_seen() as seen:
            spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[module_name]
        raise TargetError(f"importing {path} failed: {type(e).__name__}: {e}") from e
    module.__nrpt_local_modules__ = local_modules(  # type: ignore[attr-defined]
        module, set(sys.modules) - before, seen)
    return module


@contextlib.contextmanager
def _imports_seen():
    """The modules the ``import`` statements executed in the block resolved to, also those
    already in ``sys.modules`` (``from helper import X`` of a helper an earlier load cached)."""
    import builtins

    seen: list[Any] = []
    real = builtins.__import__

    def spy(name, globals=None, locals=None, fromlist=(), level=0):
        mod = real(name, globals, locals, fromlist, level)
        with contextlib.suppress(Exception):
            seen.append(mod)
            if level == 0 and name in sys.modules:
                seen.append(sys.modules[name])  # import a.b: a.b as well as a
            for attr in fromlist or ():
                sub = getattr(mod, attr, None)
                if isinstance(sub, types.ModuleType):
                    seen.append(sub)
        return mod

    builtins.__import__ = spy
    try:
        yield seen
    finally:
        builtins.__import__ = real


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def local_modules(module: Any, new: Collection[str] = frozenset(),
                  seen: Iterable[Any] = ()) -> dict[str, str]:
    """``{path relative to the file's directory: sha256}`` of the modules a target file's
    ``module`` imported from its own directory tree (via ``new`` modules, ``seen`` import
    targets and names the namespaces reach, transitively)."""
    own = Path(module.__file__).resolve()
    root = own.parent

    def local(m: Any) -> Path | None:
        f = getattr(m, "__file__", None)
        if not isinstance(f, str):
            return None
        with contextlib.suppress(OSError, ValueError):
            p = Path(f).resolve()
            if p != own and root in p.parents and p.is_file():
                return p
        return None

    def reached(m: Any) -> list[Any]:
        out = []
        for v in list(vars(m).values()):
            if isinstance(v, types.ModuleType):
                out.append(v)
            else:
                name = getattr(v, "__module__", None)
                if isinstance(name, str) and name in sys.modules:
                    out.append(sys.modules[name])
        return out

    found: dict[Path, Any] = {}
    todo = [sys.modules[n] for n in new if n in sys.modules] + list(seen) + reached(module)
    while todo:
        m = todo.pop()
        p = local(m)
        if p is None or p in found:
            continue
        found[p] = m
        todo.extend(reached(m))
    return {p.relative_to(root).as_posix(): _sha256(p) for p in sorted(found)}


#: Models of other libraries that a ``file.py:NAME`` may hold: top-level package ->
#: ``("module:Class" of the model, "module:function" that makes a target of it)``.  Both are
#: strings imported on first use (as in :mod:`nrpt.run.registry`), so nrpt imports no such library
#: unless an object's class comes from it.
MODEL_ADAPTERS: dict[str, tuple[str, str]] = {
    "pymc": ("pymc:Model", "nrpt.targets.adapters.pymc:from_pymc"),
}


#: the factory of a ``path/to/model.stan`` target
STAN_ADAPTER = "nrpt.targets.stan:from_stan"


def _import_attr(ref: str) -> Any:
    module, attr = ref.split(":")
    return getattr(importlib.import_module(module), attr)


def _model_adapter(obj: Any) -> Callable[..., Any] | None:
    """The function that makes a target of ``obj`` if it is a model of a library in
    :data:`MODEL_ADAPTERS` (e.g. a ``pymc.Model``), else None."""
    packages = {(getattr(c, "__module__", None) or "").split(".")[0]
                for c in type(obj).__mro__}
    for package in packages.intersection(MODEL_ADAPTERS):
        model_ref, adapter_ref = MODEL_ADAPTERS[package]
        try:
            model_class = _import_attr(model_ref)
        except (ImportError, AttributeError):
            continue
        if isinstance(obj, model_class):
            return _import_attr(adapter_ref)
    return None


def file_spec(spec: str) -> tuple[Path, str] | None:
    """``(path, NAME)`` of a ``"path/to/file.py:NAME"`` spec; None for any other spec."""
    head, sep, attr = spec.rpartition(":")
    if sep and head.endswith(".py") and attr:
        return Path(head), attr
    return None


def import_file_target(spec: str, **kwargs: Any) -> tuple[Any, dict[str, str]]:
    """:func:`load_target` of a ``file.py:NAME`` spec, and the modules the file imported from
    its own directory tree (:func:`local_modules`: ``{relative path: sha256}``)."""
    modules: dict[str, str] = {}
    return _load_target(spec, kwargs, modules), modules


def load_target(spec: str, **kwargs: Any) -> Any:
    """Resolve ``spec`` to a target object (not validated: :func:`validate_target`).

    ``"path/to/model.stan"``: :func:`nrpt.targets.from_stan` ``(path, **kwargs)`` (``data=``
    a JSON file or a dict).  ``"path/to/file.py:NAME"``: the file imported as a fresh module;
    a ``pymc.Model`` goes through :func:`nrpt.targets.from_pymc` ``(model, **kwargs)``, a class
    or a function without ``dim`` is called with ``kwargs``, anything else is returned
    (``kwargs`` then empty).  A built-in name (:data:`BUILTIN_TARGETS`; ``_`` and ``-``
    alike): its factory with ``kwargs``.
    Raises :class:`TargetError` for an unknown name, a missing file or attribute."""
    return _load_target(spec, kwargs, {})


def _load_target(spec: str, kwargs: dict[str, Any], modules: dict[str, str]) -> Any:
    head, sep, attr = spec.rpartition(":")
    if sep and head.endswith(".py"):
        if not attr:
            raise TargetError(f"target spec {spec!r} names no attribute; use path/to/file.py:NAME")
        return _load_file_target(Path(head).expanduser(), attr, kwargs, modules)
    if spec.endswith(".py"):
        raise TargetError(f"target spec {spec!r} names no attribute; use {spec}:NAME")
    if is_stan_spec(spec):
        from_stan = _import_attr(STAN_ADAPTER)  # by name: the Stan package imports this one
        try:
            return from_stan(Path(spec).expanduser(), **kwargs)
        except TypeError as e:
            raise TargetError(f"building the Stan target {spec!r} failed: {e} (options: data, "
                              f"seed, generated_quantities)") from e
    return _load_builtin(spec, kwargs)


def is_stan_spec(spec: Any) -> bool:
    """A target spec naming a Stan program file (``path/to/model.stan``)."""
    return isinstance(spec, str) and spec.strip().endswith(".stan")


def _load_file_target(path: Path, attr: str, kwargs: dict[str, Any],
                      modules: dict[str, str]) -> Any:
    module = _load_module(path)
    modules.update(module.__nrpt_local_modules__)
    if not hasattr(module, attr):
        public = sorted(k for k in vars(module) if not k.startswith("_"))
        raise TargetError(f"{path} has no attribute {attr!r} (its public names: "
                          f"{', '.join(public)})")
    obj = getattr(module, attr)
    adapter = _model_adapter(obj)
    if adapter is not None:
        return adapter(obj, **kwargs)
    if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "dim")):
        try:
            return obj(**kwargs)
        except TypeError as e:
            raise TargetError(f"building target {attr} from {path} failed: {e}") from e
    if kwargs:
        raise TargetError(f"{path}:{attr} is already a target object; keyword arguments "
                          f"{sorted(kwargs)} cannot be applied to it")
    return obj


def _load_builtin(spec: str, kwargs: dict[str, Any]) -> Any:
    key = spec.strip().lower().replace("_", "-")
    if key not in BUILTIN_TARGETS:
        names = ", ".join(sorted(BUILTIN_TARGETS))
        raise TargetError(f"unknown target {spec!r}: use a built-in name ({names}) or "
                          f"path/to/file.py:NAME for a target defined in your own file")
    from nrpt.scalars import plain  # NumPy / 0-d torch scalars are numbers like any other

    kwargs = {k: plain(v) for k, v in kwargs.items()}
    try:
        return BUILTIN_TARGETS[key](**kwargs)
    except TypeError as e:
        raise TargetError(f"building built-in target {key!r} failed: {e}") from e


# --------------------------------------------------------------------------------------------
# Identity across a run and its resumption
# --------------------------------------------------------------------------------------------

#: relative tolerance of :func:`fingerprint_differences` by dtype (the same code on another
#: machine may round differently; another target differs by far more)
_PROBE_RTOL = {"torch.float64": 1e-6}
_PROBE_RTOL_DEFAULT = 1e-3


def fingerprint(target: Any, kind: PathKind, probe: dict[str, Any]) -> dict[str, Any]:
    """What identifies a target between a run and its resumption (kept in ``run.json``): its
    ``name`` (else its class name), ``dim``, path kind, and ``probe``: the values of its energy
    (or log likelihood and reference log density) at :func:`validate_target`'s probe states
    (fixed, or reference draws from a fixed seed), which that check fills in."""
    return {"name": capabilities(target).name,
            "dim": int(target.dim), "kind": kind, "dtype": probe.get("dtype"),
            "probe": {k: v for k, v in probe.items() if k != "dtype"}}


def _close(a: Any, b: Any, rtol: float) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    return abs(a - b) <= rtol * max(1.0, abs(a), abs(b))


def fingerprint_differences(then: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """How the target ``now`` differs from the one recorded ``then`` (empty: the same)."""
    diff = [f"{key} {then.get(key)!r} then, {now.get(key)!r} now"
            for key in ("name", "dim", "kind") if then.get(key) != now.get(key)]
    if diff:
        return diff
    rtol = _PROBE_RTOL.get(str(then.get("dtype")), _PROBE_RTOL_DEFAULT)
    for member, old in (then.get("probe") or {}).items():
        new = (now.get("probe") or {}).get(member)
        if old is None or new is None:
            continue  # a member that failed to evaluate: nothing to compare
        if len(old) != len(new) or not all(_close(a, b, rtol)
                                           for a, b in zip(old, new, strict=True)):
            diff.append(f"{member} at the probe states [{_shown(old)}] then, "
                        f"[{_shown(new)}] now")
    return diff


def _shown(values: list[Any]) -> str:
    return ", ".join(v if isinstance(v, str) else f"{v:.6g}" for v in values)
