"""Check an explorer (or a target) for invariance the way nrpt's own test suite does::

    from nrpt.targets import Gaussian
    from nrpt.testing import assert_invariant

    target = Gaussian(mean=[1.0, -2.0], cov=[[1.0, 0.6], [0.6, 2.0]])
    report = assert_invariant(MyExplorer(), target, step_size=0.8)
    print(report)

:func:`check_invariance` runs ``systems`` independent chains of ``n_steps`` explorer steps at
one ``b`` (no swaps, no adaptation, keyed noise of :mod:`nrpt.rng`), started from exact
draws of ``pi_b`` when the target can make them (else its initial states, dropping
``burn_in``), and compares moments (or ``functions``) to the truth (given, the target's
exact ``mean`` / ``cov``, or ``exact_draws`` iid draws whose error is added).  Tolerance:
``|estimate - truth| < z * se``, ``se`` by batch means (one batch per chain when there are
>= 16 chains, exactly independent).  The state must change in at least ``min_moved`` of
the steps."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from nrpt.explorers.base import Density, ExploreInfo, Explorer, Noise, ReplicaState
from nrpt.paths.ladders import GeometricPath, TemperatureLadder
from nrpt.rng import Stream, generator_for
from nrpt.targets.protocol import capabilities, optional_value, path_kind

__all__ = ["MomentCheck", "InvarianceReport", "check_invariance", "assert_invariant",
           "Frozen", "Flat"]


class Frozen(Explorer):
    """An explorer that never moves (every step "accepted"): with a fixed-rate rule
    (:class:`nrpt.swap.FixedRate`) only the index process matters, which is how the suite and
    ``benchmarks/schemes.py`` measure swap schemes against the theory."""

    name = "frozen"

    def step(self, state, b, step_size, density, noise, sub=0):
        ones = torch.ones_like(state.v)
        return state, ExploreInfo(ones, ones.bool(), torch.zeros_like(ones, dtype=torch.bool))


class Flat:
    """A 1-D standard Gaussian energy: a cheap target for index-process studies."""

    dim = 1
    name = "flat"

    def energy(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * (x ** 2).sum(-1)

#: extra key part for the generators of this module (starting states, truth draws)
_TAG = 0x7E57
#: at least this many batch means by default
MIN_BATCHES = 16


@dataclass(frozen=True)
class MomentCheck:
    """One statistic: its estimate from the chains, the truth, the standard error used (the
    chains' batch-means error, combined with the truth's own error when the truth was estimated
    from exact draws), the chains' effective sample size and ``z = |estimate - truth| / se``."""

    name: str
    estimate: float
    truth: float
    se: float
    ess: float
    z: float
    ok: bool


@dataclass
class InvarianceReport:
    """What :func:`check_invariance` found; ``ok`` is true when every statistic is within
    ``threshold`` standard errors and the chains moved.  ``str(report)`` is a readable table."""

    explorer: str
    target: str
    b: float
    step_size: float
    systems: int
    n_steps: int
    burn_in: int
    start: str
    truth_from: str
    batches: int
    threshold: float
    checks: list[MomentCheck]
    acceptance: float
    moved: float
    min_moved: float
    nonfinite: int

    @property
    def moved_enough(self) -> bool:
        return self.moved >= self.min_moved

    @property
    def failures(self) -> list[MomentCheck]:
        return [c for c in self.checks if not c.ok]

    @property
    def ok(self) -> bool:
        return self.moved_enough and not self.failures

    @property
    def max_z(self) -> float:
        return max((c.z for c in self.checks), default=0.0)

    def __str__(self) -> str:
        verdict = "passed" if self.ok else "FAILED"
        lines = [
            f"invariance check {verdict}: explorer {self.explorer!r} on target "
            f"{self.target!r} at b = {self.b:g}, step_size = {self.step_size:g}",
            f"  {self.systems} chains x {self.n_steps} steps from {self.start}, burn-in "
            f"{self.burn_in}; truth from {self.truth_from}",
            f"  se by batch means over {self.batches} batches; each statistic needs "
            f"|estimate - truth| < {self.threshold:g} se",
            f"  acceptance {self.acceptance:.3f}, moved in {self.moved:.3f} of the steps "
            f"(needs >= {self.min_moved:g}), {self.nonfinite} non-finite proposals",
            f"  {'statistic':<14}{'estimate':>12}{'truth':>12}{'se':>11}{'ESS':>9}{'z':>8}",
        ]
        for c in self.checks:
            flag = "" if c.ok else "   <-- FAIL"
            lines.append(f"  {c.name:<14}{c.estimate:>12.5g}{c.truth:>12.5g}{c.se:>11.3g}"
                         f"{c.ess:>9.0f}{c.z:>8.2f}{flag}")
        if not self.moved_enough:
            lines.append(f"  the chains moved in only {self.moved:.4f} of the steps: a kernel "
                         "that does not move is trivially invariant, so this check says nothing "
                         "(raise acceptance, e.g. a smaller step_size, or lower min_moved)")
        if self.failures:
            worst = max(self.failures, key=lambda c: c.z)
            lines.append(f"  worst: {worst.name} is {worst.z:.1f} standard errors from the "
                         "truth; the explorer does not leave the slot distribution invariant "
                         "(or the truth given is wrong)")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------- helpers
def _as_explorer(explorer, options) -> Explorer:
    if isinstance(explorer, str):
        from nrpt.run.registry import make_explorer

        return make_explorer(explorer, **(options or {}))
    if options:
        raise ValueError("explorer_options are for an explorer given by name")
    if not callable(getattr(explorer, "step", None)):
        raise TypeError(f"explorer must be an nrpt Explorer or a registered name; got "
                        f"{type(explorer).__name__}")
    return explorer


def _check_sizes(step_size: float, n_steps, systems) -> tuple[int, int]:
    if not (step_size > 0 and math.isfinite(step_size)):
        raise ValueError(f"step_size must be > 0 and finite; got {step_size}")
    for name, val, lo in (("n_steps", n_steps, 2), ("systems", systems, 1)):
        if isinstance(val, bool) or int(val) != val or val < lo:
            raise ValueError(f"{name} must be an integer >= {lo}; got {val!r}")
    return int(n_steps), int(systems)


def _path_for(target, b: float):
    if path_kind(target) == "geometric":
        if not 0.0 <= b <= 1.0:
            raise ValueError(f"b is beta on a geometric path and must be in [0, 1]; got {b}")
        return GeometricPath([1.0, 0.0])
    if not (b > 0 and math.isfinite(b)):
        raise ValueError(f"b is the inverse temperature and must be > 0 and finite; got {b}")
    return TemperatureLadder([1.0, 2.0])


def _exact_sampler(target, b: float) -> Callable | None:
    """``draw(n, generator) -> [n, dim]`` exact draws of ``pi_b``, or None."""
    caps = capabilities(target)
    if caps.has("sample_at"):
        return lambda n, g: target.sample_at(b, n, g)
    if b == 1.0 and caps.has("sample"):
        return lambda n, g: target.sample(n, g)
    return None


def _start_states(start, exact, target, path, systems: int, dim: int, seed: int, device,
                  dtype) -> tuple[torch.Tensor, str]:
    """The starting states ``[systems, dim]`` and how they were made (see ``start``)."""
    g = generator_for(seed, Stream.INIT, _TAG, 0, device=device)
    if isinstance(start, torch.Tensor):
        x0, how = start, "the given states"
    elif start in ("auto", "exact") and exact is not None:
        x0, how = exact(systems, g), "exact draws"
    elif start == "exact":
        raise ValueError("start='exact' needs a target that can draw exactly at b: "
                         "target.sample(n, generator) (b = 1) or target.sample_at(b, n, "
                         "generator)")
    elif start in ("auto", "initial"):
        how = "initial states"
        if capabilities(target).has("initial_states"):
            x0 = target.initial_states(systems, g)
        elif path.kind == "geometric":
            x0 = target.reference_sample(systems, g)
        else:
            x0 = torch.randn(systems, dim, generator=g, dtype=torch.float64, device=g.device)
    else:
        raise ValueError(f"start must be 'auto', 'exact', 'initial' or a tensor; got {start!r}")
    x0 = torch.as_tensor(x0).to(device, dtype)
    if x0.shape != (systems, dim):
        raise ValueError(f"starting states must have shape [systems, dim] = [{systems}, {dim}]; "
                         f"got {list(x0.shape)}")
    return x0, how


def _check_burn_in(burn_in, how: str, n_steps: int) -> int:
    if burn_in is None:
        burn_in = 0 if how == "exact draws" else n_steps // 5
    burn_in = int(burn_in)
    if not 0 <= burn_in <= n_steps - 2:
        raise ValueError(f"burn_in must be in [0, n_steps - 2 = {n_steps - 2}]; got {burn_in}")
    return burn_in


def _array(value, shape: tuple[int, ...], name: str) -> np.ndarray:
    arr = np.asarray(value.detach().cpu() if isinstance(value, torch.Tensor) else value,
                     dtype=np.float64)
    if arr.shape != shape:
        raise ValueError(f"{name} must have shape {list(shape)}; got {list(arr.shape)}")
    return arr


def _known_moments(target, b: float, dim: int, mean, var, cov):
    """``mean, var, cov, source``: the moments given here, else the target's exact ones (at
    ``b = 1`` only); each None where not known.  Variances about an unknown mean are unknown
    (they are estimated alongside it)."""
    t_mean = optional_value(target, "mean") if b == 1.0 else None
    t_cov = optional_value(target, "cov") if b == 1.0 else None
    mean_v = _array(mean, (dim,), "mean") if mean is not None else (
        _array(t_mean, (dim,), "target.mean") if t_mean is not None else None)
    cov_src = cov if cov is not None else t_cov
    cov_m = _array(cov_src, (dim, dim), "cov") if cov_src is not None else None
    var_v = _array(var, (dim,), "var") if var is not None else (
        np.diag(cov_m).copy() if cov_m is not None else None)
    if mean_v is None:
        return None, None, None, None
    return mean_v, var_v, cov_m, "the moments given" if mean is not None else "the target's moments"


def _statistics(mean_v, var_v, cov_m, mean_known: bool, cross: bool, functions, truth,
                dtype, device) -> tuple[dict, dict[str, float]]:
    """The statistics (means, variances, covariances when ``cross``, then ``functions``) and
    the true values known of them."""
    stats: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}
    known: dict[str, float] = {}
    m_t = torch.as_tensor(mean_v, dtype=dtype, device=device)
    dim = len(mean_v)
    for j in range(dim):
        stats[f"mean[{j}]"] = lambda x, j=j: x[:, j]
        if mean_known:
            known[f"mean[{j}]"] = float(mean_v[j])
    for j in range(dim):
        stats[f"var[{j}]"] = lambda x, j=j: (x[:, j] - m_t[j]) ** 2
        if var_v is not None:
            known[f"var[{j}]"] = float(var_v[j])
    pairs = [(i, j) for i in range(dim) for j in range(i + 1, dim)] if cross else []
    for i, j in pairs:
        stats[f"cov[{i},{j}]"] = lambda x, i=i, j=j: (x[:, i] - m_t[i]) * (x[:, j] - m_t[j])
        if cov_m is not None:
            known[f"cov[{i},{j}]"] = float(cov_m[i, j])
    for name, f in (functions or {}).items():
        if name in stats:
            raise ValueError(f"function name {name!r} is taken by a built-in statistic")
        stats[name] = f
        if truth is not None and name in truth:
            known[name] = float(truth[name])
    return stats, known


def _truth(target, b, dim, exact, *, mean, var, cov, cross, functions, truth, exact_draws, seed,
           dtype, device):
    """``stats, known, se, source``: the statistics (in report order) and their truth -- the
    moments given here, then the target's exact moments (``b = 1`` only), then estimates from
    exact draws, whose standard errors ``se`` join the tolerance."""
    mean_v, var_v, cov_m, source = _known_moments(target, b, dim, mean, var, cov)
    mean_known = mean_v is not None
    draws = None
    if (mean_v is None or var_v is None or (cross and cov_m is None and dim > 1)
            or any(k not in (truth or {}) for k in (functions or {}))):
        if exact is None:
            raise ValueError("the truth is not known: give mean= and var= (or cov=), and truth= "
                             "for each function, or use a target that can draw exactly at b "
                             "(target.sample at b = 1, or target.sample_at)")
        g_truth = generator_for(seed, Stream.INIT, _TAG, 1, device=device)
        draws = torch.as_tensor(exact(int(exact_draws), g_truth)).to(device, dtype)
        if mean_v is None:
            mean_v = draws.double().mean(0).cpu().numpy()
        drawn = f"{len(draws)} exact draws"
        source = drawn if source is None else f"{source} and {drawn}"
    stats, known = _statistics(mean_v, var_v, cov_m, mean_known, cross, functions, truth, dtype,
                               device)
    return stats, known, _estimate(stats, known, draws), source


def _estimate(stats, known: dict[str, float], draws) -> dict[str, float]:
    """Put the mean over ``draws`` of each statistic not in ``known`` there; returns their
    standard errors."""
    se: dict[str, float] = {}
    for name, f in stats.items():
        if draws is not None and name not in known:
            vals = f(draws).double().cpu().numpy()
            known[name] = float(vals.mean())
            se[name] = float(vals.std(ddof=1) / math.sqrt(len(vals)))
    return se


def _run_chains(ex: Explorer, density: Density, x0: torch.Tensor, b: float, step_size: float,
                n_steps: int, burn_in: int, seed: int, stats, dtype, device, metric=None):
    """Run the chains as the engine does (prepare, then one batched step per iteration);
    returns each statistic's values ``[systems, n_steps - burn_in]`` after the burn-in, the
    summed acceptance, the number of (chain, step) pairs that moved and the non-finite
    proposals."""
    systems, dim = x0.shape
    x = x0.reshape(systems, 1, dim)
    v, base = density(x)
    if not (torch.isfinite(v).all() and torch.isfinite(base).all()):
        raise ValueError("a starting state has a non-finite energy / log density")
    state = ex.prepare(ReplicaState(x, v, base), density)
    bb = torch.full((systems, 1), b, dtype=dtype, device=device)
    hh = torch.full((systems, 1), step_size, dtype=dtype, device=device)
    values = {name: torch.empty(systems, n_steps - burn_in, dtype=torch.float64)
              for name in stats}
    accept, moved, nonfinite = 0.0, 0.0, 0
    kw = {}
    if metric is not None:
        m = torch.as_tensor(metric).to(device, dtype)
        kw["metric"] = m.expand(systems, 1, *m.shape).contiguous()
    for k in range(n_steps):
        new, info = ex.step(state, bb, hh, density, Noise(seed, k, systems, 1, device), **kw)
        moved += float((new.x != state.x).any(-1).double().sum())
        accept += float(info.accept_prob.double().sum())
        nonfinite += int(info.nonfinite.sum())
        state = new
        if k >= burn_in:
            xs = state.x[:, 0]
            for name, f in stats.items():
                values[name][:, k - burn_in] = f(xs).double().cpu()
    return values, accept, moved, nonfinite


def _batch_means(values: np.ndarray, per_chain: int) -> np.ndarray:
    """``values[systems, T]`` -> the ``systems * per_chain`` means of contiguous batches (the
    first ``T mod per_chain`` draws are left out so that batches have equal length)."""
    S, T = values.shape
    L = T // per_chain
    kept = values[:, T - L * per_chain:]
    return kept.reshape(S, per_chain, L).mean(-1).reshape(-1)


def _batches_per_chain(batches, systems: int, kept: int) -> int:
    per_chain = int(batches) if batches is not None else max(1, math.ceil(MIN_BATCHES / systems))
    if per_chain < 1 or per_chain > kept:
        raise ValueError(f"batches must be in [1, {kept}] (the kept steps per chain); got "
                         f"{per_chain}")
    if systems * per_chain < 2:
        raise ValueError("need at least 2 batches for a standard error: more systems or batches")
    return per_chain


def _moment_check(name: str, vals: np.ndarray, per_chain: int, truth: float, truth_se: float,
                  z: float) -> MomentCheck:
    """One statistic's check from its values ``[systems, T]`` (module doc: the tolerance)."""
    bm = _batch_means(vals, per_chain)
    est = float(bm.mean())
    se_mc = float(bm.std(ddof=1) / math.sqrt(bm.size))
    se = math.sqrt(se_mc**2 + truth_se**2)
    ess = float(vals.var()) / se_mc**2 if se_mc > 0 else float(vals.size)
    dev = abs(est - truth)
    zz = dev / se if se > 0 else (0.0 if dev == 0 else math.inf)
    return MomentCheck(name, est, truth, se, ess, zz, bool(zz < z and math.isfinite(est)))


# ---------------------------------------------------------------------------------- the check
def check_invariance(
    explorer: Explorer | str,
    target,
    *,
    step_size: float,
    n_steps: int = 400,
    systems: int = 32,
    seed: int = 0,
    b: float = 1.0,
    mean=None,
    var=None,
    cov=None,
    cross: bool = False,
    functions: Mapping[str, Callable[[torch.Tensor], torch.Tensor]] | None = None,
    truth: Mapping[str, float] | None = None,
    start: str | torch.Tensor = "auto",
    burn_in: int | None = None,
    batches: int | None = None,
    z: float = 4.5,
    min_moved: float = 0.01,
    exact_draws: int = 100_000,
    explorer_options: Mapping[str, Any] | None = None,
    dtype: torch.dtype = torch.float64,
    device: str | torch.device = "cpu",
    metric=None,
) -> InvarianceReport:
    """Run ``explorer`` on ``target`` at slot coefficient ``b`` and compare moments to the truth
    (the recipe of the module docstring); returns an :class:`InvarianceReport`.

    Args:
        explorer: an :class:`~nrpt.explorers.Explorer` or a registered name (with
            ``explorer_options``).
        target: an nrpt target, temperature or geometric form.
        step_size: > 0; n_steps: steps per chain; systems: independent chains.
        seed: keys every random number (same seed, same report).
        b: inverse temperature (temperature form) or beta (geometric form).
        mean, var, cov: exact moments of ``pi_b``; default the target's at ``b = 1``, else from
            ``exact_draws`` exact draws.  ``cross``: also the off-diagonal covariances.
        functions, truth: extra statistics ``f(x[n, dim]) -> [n]`` and their exact values.
        start: ``"auto"``, ``"exact"`` (else an error), ``"initial"`` or ``[systems, dim]``.
        burn_in: default 0 from exact draws, else ``n_steps // 5``.
        batches: batches per chain for the batch-means error; z: threshold in standard errors;
            min_moved: share of steps that must change the state.
        dtype, device: of the chains.
        metric: a preconditioner for every chain, ``[dim]`` (diagonal scales) or ``[dim, dim]``
            (a lower-triangular factor), for an explorer that declares ``preconditionable``
            (:func:`nrpt.explorers.base.metric_mul`); ``None``: the identity."""
    ex = _as_explorer(explorer, explorer_options)
    if metric is not None:
        if not getattr(ex, "preconditionable", False):
            raise ValueError(f"metric: explorer {getattr(ex, 'name', ex)!r} does not declare "
                             f"preconditionable = True")
        d = int(target.dim)
        if tuple(torch.as_tensor(metric).shape) not in ((d,), (d, d)):
            raise ValueError(f"metric must have shape [{d}] or [{d}, {d}]; got "
                             f"{list(torch.as_tensor(metric).shape)}")
    b, step_size = float(b), float(step_size)
    n_steps, systems = _check_sizes(step_size, n_steps, systems)
    device = torch.device(device)
    path = _path_for(target, b)
    dim = int(target.dim)
    exact = _exact_sampler(target, b)
    x0, how = _start_states(start, exact, target, path, systems, dim, seed, device, dtype)
    burn_in = _check_burn_in(burn_in, how, n_steps)
    stats, known, truth_se, source = _truth(
        target, b, dim, exact, mean=mean, var=var, cov=cov, cross=cross, functions=functions,
        truth=truth, exact_draws=exact_draws, seed=seed, dtype=dtype, device=device)
    values, accept, moved, nonfinite = _run_chains(ex, Density(target, path), x0, b, step_size,
                                                   n_steps, burn_in, seed, stats, dtype, device,
                                                   metric)
    per_chain = _batches_per_chain(batches, systems, n_steps - burn_in)
    checks = [_moment_check(name, values[name].numpy(), per_chain, known[name],
                            truth_se.get(name, 0.0), z) for name in stats]
    total = systems * n_steps
    return InvarianceReport(
        explorer=getattr(ex, "name", "") or type(ex).__name__,
        target=optional_value(target, "name", type(target).__name__), b=b, step_size=step_size,
        systems=systems, n_steps=n_steps, burn_in=burn_in, start=how, truth_from=source,
        batches=systems * per_chain, threshold=float(z), checks=checks,
        acceptance=accept / total, moved=moved / total, min_moved=float(min_moved),
        nonfinite=nonfinite)


def assert_invariant(explorer: Explorer | str, target, **kwargs) -> InvarianceReport:
    """:func:`check_invariance`, raising :class:`AssertionError` (the report as its message)
    when a statistic is off by ``z`` standard errors or more or the chains did not move.
    Returns the report when the check passes."""
    report = check_invariance(explorer, target, **kwargs)
    if not report.ok:
        raise AssertionError("\n" + str(report))
    return report
