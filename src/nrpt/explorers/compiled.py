"""An explorer step compiled with ``torch.compile`` (optional; falls back to the plain step).

:class:`Compiled` runs the wrapped explorer's ``step`` (proposal, target code, Metropolis
decision) as one compiled graph.  Random numbers stay the engine's keyed draws
(:mod:`nrpt.rng`), made outside the graph: one eager step records which draws the explorer asks
:class:`~nrpt.explorers.base.Noise` for, and later steps with the same kind of state make those
draws and replay them to the compiled function.  Results equal the plain step's up to rounding
per step, so a run is the plain run in law (``tests/test_compile_law.py``), not bit for bit.

Which steps are compiled depends on the state alone (a step whose state lacks the explorer's
buffers runs plain; one whose ``extras`` keys are unchanged by the step runs compiled), so a
resumed run equals the uninterrupted one bit for bit.

Only explorers whose draws do not depend on the state are compilable (:func:`compilable`):
RWMH, MALA, HMC, and the stochastic-gradient explorers with the exact, noisy-oracle or
minibatch energy.  A failed compilation or call emits a :class:`CompileWarning` that says why
(:func:`why_failed`) and falls back to the plain step; inductor runs at the graph's first call
(:func:`deferred_inductor`), so a graph break or a guard that fails on the traced frame falls
back after Dynamo's trace alone.  Inductor's caches live in a per-machine folder
(:func:`compile_cache`): a later process pays Dynamo's trace and the loading, not the
compilation (``make bench-compile``, docs/benchmarks.md).  A compiled fused chunk of a run built
from its config is instead saved whole and loaded without a trace (:mod:`nrpt.core.precompile`).
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import torch

from nrpt.explorers.base import ExploreInfo, Explorer, ReplicaState

__all__ = ["Compiled", "CompileWarning", "compilable", "RecordingNoise",
           "ReplayNoise", "make_draw", "deferred_inductor", "why_failed", "compile_cache"]

class CompileWarning(UserWarning):
    """A compiled explorer step could not be built or run; the plain step is used instead."""


def compile_cache() -> str:
    """The folder of inductor's and AOTAutograd's on-disk caches, set before a compilation:
    ``$TORCHINDUCTOR_CACHE_DIR`` where the user set it, else ``$NRPT_COMPILE_CACHE`` or
    ``~/.cache/nrpt/compile`` (per machine, kept across reboots, where torch's default is a
    folder under /tmp).  A process whose cache holds the run's graphs skips inductor's code
    generation and C++ compilation (tens of seconds) and pays Dynamo's trace and the loading."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    now = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    # (importing torch._dynamo sets the variable to torch's default: that is not the user's)
    if now and os.path.abspath(now) != os.path.abspath(default_cache_dir()):
        return now
    env = os.environ.get("NRPT_COMPILE_CACHE")
    folder = Path(env).expanduser() if env else Path.home() / ".cache" / "nrpt" / "compile"
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder.absolute())
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


_NUMPY_GUARD = re.compile(r"___from_numpy\(([^)]*)\)")


def why_failed(err: BaseException) -> str:
    """What a failed compilation says to the user: the error's first line, or, for a guard that
    failed on the frame it was traced from, which value made it and how to fix it."""
    text = str(err)
    first = text.splitlines()[0] if text else ""
    if "Guard failed on the same frame" not in text:
        return f"{type(err).__name__}: {first}"
    numpy = _NUMPY_GUARD.search(text)
    if numpy:
        name = numpy.group(1).rsplit("cell_contents.", 1)[-1]  # (the closure's path)
        if "target." in name:  # (the density's or the engine's path to the user's target)
            name = name[name.index("target."):]
        return (f"{name} is a NumPy value, which torch.compile cannot guard in the loop's "
                f"inference mode: make it a Python float or a torch tensor")
    reason = text.split("Guard fail reason:", 1)[-1].strip().splitlines()[0]
    return f"a torch.compile guard fails on the frame it was traced from ({reason})"


def deferred_inductor(gm, example_inputs):
    """A ``torch.compile`` backend: inductor, run at the graph's first call instead of while
    Dynamo traces.  Dynamo checks the guards it built against the frame that it traced only
    after the backend returns; a failure there (e.g. a NumPy scalar in the target under
    inference mode) used to come after inductor's whole compilation (tens of seconds cold):
    deferred, it comes after the trace alone, and the fallback is at once.  For static shapes
    (``dynamic=False``, as nrpt compiles): inductor then adds no guards of its own."""
    from torch._guards import CompileContext, TracingContext, compile_context, tracing

    # inductor compiles in Dynamo's contexts (its fake tensors and shape environment: the keys
    # of inductor's and AOTAutograd's on-disk caches), entered again at the first call
    pending = [gm, example_inputs, TracingContext.try_get(), CompileContext.try_get()]
    compiled: list = []

    def first_call(*args):
        if not compiled:
            # (imported here: a fallback before the first call does not even import inductor)
            from torch._inductor.compile_fx import compile_fx

            graph, inputs, trace, ids = pending
            with compile_context(ids), tracing(trace):
                compiled.append(compile_fx(graph, inputs))
            pending.clear()  # (the fake tensors and contexts are not needed any more)
        return compiled[0](*args)

    return first_call


def compilable(explorer: Explorer) -> bool:
    """Whether ``explorer``'s step declares ``compilable`` (draws that do not depend on the
    state; declared by the class that defines ``step``) and has no control-variate energy
    (whose anchor refresh depends on the iteration)."""
    # the class whose step runs must declare it: a subclass that re-defines step (and so
    # perhaps its draws) does not inherit the declaration
    owner = next((k for k in type(explorer).__mro__ if "step" in vars(k)), type(explorer))
    if not vars(owner).get("compilable", False):
        return False
    from nrpt.energy.estimators import ControlVariateEnergy

    return not isinstance(getattr(explorer, "estimator", None), ControlVariateEnergy)


class RecordingNoise:
    """Wraps the iteration's :class:`Noise`; notes every draw the explorer makes."""

    def __init__(self, noise):
        self.noise, self.calls = noise, []

    def normal(self, *args, **kwargs):
        self.calls.append(("normal", args, kwargs))
        return self.noise.normal(*args, **kwargs)

    def uniform(self, *args, **kwargs):
        self.calls.append(("uniform", args, kwargs))
        return self.noise.uniform(*args, **kwargs)

    def key(self, *parts):
        return _RecordingKey(self, parts, self.noise.key(*parts))


class _RecordingKey:
    """The :class:`~nrpt.rng.Key` handed to an energy estimator, noting its draws."""

    def __init__(self, rec: RecordingNoise, parts, key):
        self.rec, self.parts, self.real = rec, parts, key

    def draw(self, *args, **kwargs):
        self.rec.calls.append(("key", self.parts, "draw", args, kwargs))
        return self.real.draw(*args, **kwargs)

    def normal(self, *args, **kwargs):
        self.rec.calls.append(("key", self.parts, "normal", args, kwargs))
        return self.real.normal(*args, **kwargs)


def make_draw(noise, call):
    """Make the draw ``call`` recorded by :class:`RecordingNoise` from this iteration's noise."""
    if call[0] == "key":
        _, parts, method, args, kwargs = call
        return getattr(noise.key(*parts), method)(*args, **kwargs)
    method, args, kwargs = call
    return getattr(noise, method)(*args, **kwargs)


class ReplayNoise:
    """Inside the compiled graph: returns the pre-made draws in the recorded order."""

    def __init__(self, draws):
        self.draws, self.i = draws, 0

    def _next(self):
        t = self.draws[self.i]
        self.i += 1
        return t

    def normal(self, *args, **kwargs):
        return self._next()

    def uniform(self, *args, **kwargs):
        return self._next()

    def key(self, *parts):
        return _ReplayKey(self)


class _ReplayKey:
    def __init__(self, replay: ReplayNoise):
        self.replay = replay

    def draw(self, *args, **kwargs):
        return self.replay._next()

    def normal(self, *args, **kwargs):
        return self.replay._next()


class Compiled(Explorer):
    """``inner``'s step as one ``torch.compile`` graph (see the module docstring).

    ``options`` go to ``torch.compile`` (default ``dynamic=False``: a run's shapes are
    fixed; backend :func:`deferred_inductor`, inductor after Dynamo's guards passed)."""

    def __init__(self, inner: Explorer, **options):
        if not compilable(inner):
            raise ValueError(f"explorer {getattr(inner, 'name', inner)!r} cannot be compiled "
                             f"(its draws depend on the state or the iteration, e.g. the "
                             f"control-variate energy); compile works for explorers "
                             f"that declare compilable = True (`nrpt list` names them)")
        self.inner = inner
        self.name, self.uses_gradient = inner.name, inner.uses_gradient
        self.substeps = inner.substeps
        self.target_acceptance = inner.target_acceptance
        self.acceptance_order = inner.acceptance_order
        self.preconditionable = inner.preconditionable
        self.options = {"dynamic": False, **options}
        if "backend" not in options and "mode" not in options:
            self.options["backend"] = deferred_inductor
        self._plans: dict[tuple, list] = {}  # kind of state -> the draws a step makes
        self._fn: dict[int, object] = {}  # sub-step -> its compiled function
        self.failed: str | None = None

    def prepare(self, state, density):
        return self.inner.prepare(state, density)

    def step_adaptor(self, target_acceptance=None, *, phase=None, follow=None):
        return self.inner.step_adaptor(target_acceptance, phase=phase, follow=follow)

    def describe(self) -> dict:
        return {**self.inner.describe(), "compiled": self.failed is None}

    def __getattr__(self, name):  # the inner explorer's settings (leapfrog_steps, ...)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _graph(self, density, sub: int):
        inner = self.inner

        def step(x, v, base, extras, b, h, draws, metric=None):
            kw = {} if metric is None else {"metric": metric}
            new, info = inner.step(ReplicaState(x, v, base, extras), b, h, density,
                                   ReplayNoise(draws), sub, **kw)
            return (new.x, new.v, new.base, new.extras, info.accept_prob, info.accepted,
                    info.nonfinite)

        compile_cache()
        return torch.compile(step, **self.options)

    def step(self, state, b, step_size, density, noise, sub=0, metric=None):
        kw = {} if metric is None else {"metric": metric}
        if self.failed is not None:
            return self.inner.step(state, b, step_size, density, noise, sub, **kw)
        kind = (sub, tuple(sorted(state.extras)))
        plan = self._plans.get(kind)
        if plan is None:  # a plain step, recording its draws
            rec = RecordingNoise(noise)
            out = self.inner.step(state, b, step_size, density, rec, sub, **kw)
            if set(out[0].extras) != set(state.extras):  # it set up buffers: not a steady step
                return out
            plan = self._plans[kind] = rec.calls
        draws = tuple(make_draw(noise, call) for call in plan)
        try:
            fn = self._fn.get(sub)
            args = (state.x, state.v, state.base, dict(state.extras), b, step_size, draws,
                    metric)
            if fn is None:  # compiles now: torch's own deprecation notices are not the user's
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", DeprecationWarning)
                    warnings.simplefilter("ignore", FutureWarning)
                    fn = self._fn[sub] = self._graph(density, sub)
                    out = fn(*args)
            else:
                out = fn(*args)
            x, v, base, extras, prob, accepted, nonfinite = out
        except Exception as err:  # no compiler, an unsupported op in the target, ...
            self.failed = why_failed(err)
            warnings.warn(f"the compiled {self.name} step failed ({self.failed}); using the "
                          f"plain step", CompileWarning, stacklevel=2)
            return self.inner.step(state, b, step_size, density, noise, sub, **kw)
        return ReplicaState(x, v, base, extras), ExploreInfo(prob, accepted, nonfinite)
