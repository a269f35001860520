"""The fused loop: ``U`` whole iterations per call, optionally one ``torch.compile`` graph.

On small problems an iteration costs what its few hundred tensor ops cost to *launch*, not to
compute.  :class:`Fused` runs a chunk of ``U`` consecutive iterations -- explore, refresh the
reference, swap, adapt online, track the index process -- as one function of tensors, with
every random number drawn beforehand (the engine's keyed draws, :mod:`nrpt.rng`), and hands the
recorders the chunk at once (:class:`~nrpt.roles.IterationBlock`, ``record_block``).  Under
``torch.compile`` the chunk is one graph whose hundreds of launches fuse into a few kernels;
eager, the same function still saves the per-iteration bookkeeping.

What a chunk computes is what the plain loop computes, with the same code:

* the explorer's own ``step``, fed the draws a plain step asks :class:`~nrpt.explorers.Noise`
  for (recorded once on a plain step, then made outside the graph and replayed inside, as
  :mod:`nrpt.explorers.compiled` does);
* :func:`nrpt.core.engine.sweep_exchange` and :func:`nrpt.core.engine.refresh_top`, which the
  engine's
  own step calls;
* the online adaptors' ``observe_with(view, gain)`` with the step size ``gain(k)`` handed in
  as a tensor (the stochastic-approximation adaptors of :mod:`nrpt.adapt.sa`);
* :meth:`nrpt.diagnostics.RoundTripTracker.advance` for the ``round_trips`` recorder, carried
  inside the chunk (it is a per-iteration state machine); every other recorder gets the block.

Eager, a chunk equals the plain iterations bit for bit (recorders included); compiled, to the
last bits a fused kernel rounds differently (tested) -- per step: a deterministic swap rule
(DEO*-SGD) flips a verdict on such a last bit within tens of iterations, after which the run
is the plain run's chain in law, not in numbers (``tests/test_compile_law.py``).  Which
iterations run in chunks depends on the iteration number, the run's checkpoint and callback
periods, and the kind of state (whether the explore phase still sets up buffers) alone
(:meth:`Fused.chunk_at`), so a resumed run with the same settings chunks exactly as the
uninterrupted one.  An online adaptor's ``observe_with`` must be pure and return an
:class:`~nrpt.roles.Update` of ``[R, P]`` tables and known rule parameters only (the chunk
takes them as they are, without :meth:`nrpt.core.engine.PTEngine.apply`'s conversions).

Fused runs: one process; schemes DEO, DEO_W and SEO (one phase over all adjacent pairs);
rules ``metropolis``, ``deterministic``, ``always``, ``fixed-rate``; the explorers of
:data:`nrpt.explorers.compiled.COMPILABLE`; adaptors without a per-iteration ``observe`` or
with ``observe_with``; any recorders.  :func:`why_not` says why a run is not fused.
"""

from __future__ import annotations

import types
import warnings

import torch

from nrpt.core.engine import PTEngine, refresh_top, sweep_exchange
from nrpt.explorers import Noise, ReplicaState
from nrpt.explorers.compiled import (
    Compiled,
    CompileWarning,
    RecordingNoise,
    ReplayNoise,
    compilable,
    make_draw,
)
from nrpt.roles import AdaptorBase, Iteration, IterationBlock, PhaseDecision
from nrpt.swap.schemes import DEOW, SEO, adjacent_pairs

__all__ = ["Fused", "why_not", "auto", "UNROLL", "RULES"]

#: iterations per chunk
UNROLL = 8
#: the chunk function's code object per kind of run (:meth:`Fused._kind`)
_CODES: dict[tuple, types.CodeType] = {}
#: rules a chunk may call (pure functions of the context, no host syncs)
RULES = ("metropolis", "deterministic", "always", "fixed-rate")


def _explorer(engine: PTEngine):
    ex = engine.explorer
    return ex.inner if isinstance(ex, Compiled) else ex


def _online(adaptor) -> bool:
    return type(adaptor).observe is not AdaptorBase.observe


def why_not(run) -> str | None:
    """Why ``run`` cannot be fused (``None``: it can)."""
    eng = run.engine
    if type(eng) is not PTEngine:
        return f"engine {type(eng).__name__} (only the plain PTEngine is fused)"
    if not isinstance(eng.scheme, DEOW | SEO):
        return f"scheme {eng.scheme.name!r} (fused: deo, deo-w, seo)"
    if eng.rule.name not in RULES:
        return f"rule {eng.rule.name!r} (fused: {', '.join(RULES)})"
    if not compilable(_explorer(eng)):
        return f"explorer {getattr(_explorer(eng), 'name', '?')!r} (its draws depend on the state)"
    for a in run.adaptors:
        if _online(a) and not hasattr(a, "observe_with"):
            return f"adaptor {a.name!r} observes every iteration without observe_with"
    return None


def auto(run, compile: bool = False) -> bool:
    """Whether ``fuse = "auto"`` (the default) runs ``run`` in eager chunks: where
    :func:`why_not` allows, ``compile`` is off (``compile = true`` alone keeps its compiled
    explorer step; ``fuse = true`` with it compiles the chunks), and every recorder is one of
    nrpt's or has its own ``record_block`` (a recorder handed ``IterationBlock.iteration(u)``
    one by one sees the contract's fields, not the engine's raw state, which a user recorder
    written for the plain loop might read).  Eager chunks make the plain loop's numbers (bit
    for bit, tests/test_fused.py) with fewer launches: the headline run's loop took 723 against
    864 µs per iteration (``make bench-headline``); RWMH and MALA at d = 10^4 within 4 % of the
    plain loop (a one-off timing)."""
    if compile or why_not(run) is not None:
        return False
    return all(type(r).__module__.startswith("nrpt.") or _own_block(r)
               for r in run.recorders.values())


def _own_block(recorder) -> bool:
    from nrpt.roles import RecorderBase

    fn = getattr(type(recorder), "record_block", None)
    return fn is not None and fn is not RecorderBase.record_block


class Fused:
    """Runs chunks of ``unroll`` iterations of ``run`` (a :class:`nrpt.core.loop.Run` that
    :func:`why_not` accepts); ``compile``: as one ``torch.compile`` graph (falls back to the
    eager chunk with a :class:`~nrpt.explorers.compiled.CompileWarning`)."""

    def __init__(self, run, unroll: int = UNROLL, compile: bool = False):
        reason = why_not(run)
        if reason is not None:
            raise ValueError(f"this run cannot be fused: {reason}")
        if isinstance(unroll, bool) or int(unroll) != unroll or unroll < 1:
            raise ValueError(f"unroll must be an integer >= 1; got {unroll!r}")
        self.unroll, self.compile = int(unroll), bool(compile)
        eng = run.engine
        self.engine, self.explorer = eng, _explorer(eng)
        self.online = [a for a in run.adaptors if _online(a)]
        from nrpt.recorders.stats import RoundTrips

        self.trips = next((r for r in run.recorders.values() if isinstance(r, RoundTrips)),
                          None)
        self.others = [r for r in run.recorders.values() if r is not self.trips]
        self.plan: list | None = None  # the draws of one iteration's explore phase
        self._reads_uniforms: bool | None = None
        self._fns: dict = {}
        self.failed: str | None = None
        self.chunks = 0
        self._inference = False

    def describe(self) -> dict:
        """For the summary: the chunk length, chunks run (this process), compiled or not."""
        return {"chunk": self.unroll, "chunks": self.chunks,
                "compiled": self.compile and self.failed is None,
                **({"compile_failed": self.failed} if self.failed else {})}

    # ------------------------------------------------------------------ when to fuse
    def chunk_at(self, k: int, end: int, boundaries) -> int:
        """How many iterations to run fused from iteration ``k`` (0: a plain step).  A chunk
        starts at a multiple of ``unroll``, ends by ``end``, and no iteration inside it ends
        at a multiple of a ``boundaries`` entry (checkpoints, callbacks)."""
        U = self.unroll
        if k % U or k + U > end:
            return 0
        for every in boundaries:
            if every and (k // every) != ((k + U - 1) // every):
                return 0
        if self.plan is None:
            self._record_plan()
        return U if self.plan is not None else 0

    def _record_plan(self) -> None:
        """Note the draws of the explore phase at the current state (a dry run whose result is
        discarded).  A phase that sets up buffers (a stochastic-gradient explorer's first step)
        is not a steady one: no plan yet.  Whether there is a plan thus depends on the state
        alone, and so does which iterations are fused (resume stays exact)."""
        eng = self.engine
        rec = RecordingNoise(Noise(eng.seed, eng.k, eng.R, eng.P, eng.device))
        state = eng.state
        b, h = eng.slot_params(eng.schedule), eng.slot_params(eng.step_size)
        for i in range(eng.n_explore):
            state, _ = self.explorer.step(state, b, h, eng.density, rec,
                                          sub=i * self.explorer.substeps)
        if sorted(state.extras) == sorted(eng.state.extras):
            self.plan = rec.calls

    # ------------------------------------------------------------------ one chunk
    def _inputs(self, k0: int, U: int) -> dict:
        eng = self.engine
        R, P, dev, dt = eng.R, eng.P, eng.device, eng.dtype
        ks = range(k0, k0 + U)
        noise = Noise(eng.seed, k0, R, P, dev, count=U)  # every draw [U, ...]
        inp = {"draws": [make_draw(noise, call) for call in self.plan]}
        if self._reads_uniforms is None:
            self._reads_uniforms = _reads_uniforms(eng)
        if self._reads_uniforms:
            from nrpt.rng import Stream, iteration_uniform

            inp["uniforms"] = iteration_uniform((R, P - 1), eng.seed, Stream.SWAP, k0, 0,
                                                dtype=dt, device=dev, count=U)
        scheme = eng.scheme
        if isinstance(scheme, SEO):
            from nrpt.rng import Stream, iteration_uniform

            inp["coins"] = iteration_uniform((R, 1), eng.seed, Stream.SCHEME, k0, device=dev,
                                             count=U) < 0.5
        else:
            W = scheme.window
            inp["odd"] = torch.tensor([(k // W) % 2 == 1 for k in ks], device=dev)
            if W > 1:
                inp["open"] = torch.tensor([k % W == 0 for k in ks], device=dev)
        if eng.path.has_reference:
            inp["ref"] = eng._reference_rows(k0, count=U)
        if self.online:
            inp["gains"] = torch.tensor([[a.gain(k) for k in ks] for a in self.online],
                                        dtype=dt, device=dev)
        return inp

    def _carry(self) -> dict:
        carry = self.engine.carry()
        if self.trips is not None:
            carry["trips"] = self.trips.tracker.carry()
        if torch.is_inference_mode_enabled() and not self._inference:
            self._inference = True
            # tensors made before the loop's inference mode would make a compiled chunk's
            # first call a graph of its own (one copy each, once: the chunk returns inference
            # tensors, and so do the plain steps and adaptors in the loop's inference mode)
            carry = torch.utils._pytree.tree_map(
                lambda t: t.clone() if isinstance(t, torch.Tensor) and not t.is_inference()
                else t, carry)
        return carry

    def _body(self, U: int):
        """The chunk as a function ``(carry, inputs) -> (carry, stacked per-iteration
        outputs)`` of tensors only (what ``torch.compile`` traces)."""
        eng, explorer, online = self.engine, self.explorer, list(self.online)
        density, rule, P = eng.density, eng.rule, eng.P
        lo, hi, even, odd = adjacent_pairs(eng.R, P, eng.device)
        n_explore, substeps = eng.n_explore, explorer.substeps
        has_ref = eng.path.has_reference
        watched = list(eng.watched)
        seo = isinstance(eng.scheme, SEO)
        W = None if seo else eng.scheme.window
        trips = self.trips is not None
        if trips:
            from nrpt.diagnostics import RoundTripTracker

            advance = RoundTripTracker.advance

        def body(carry, inp):
            x, v, base, extras = carry["x"], carry["v"], carry["base"], carry["extras"]
            replica_at, slot_of = carry["replica_at"], carry["slot_of"]
            schedule, step_size = carry["schedule"], carry["step_size"]
            params, gate = dict(carry["params"]), carry.get("gate")
            rt = carry.get("trips")
            out: dict[str, list] = {n: [] for n in (
                "v", "base", "slot_of", "replica_at", "schedule", "step_size", "accept",
                "nonfinite", "active", "decision", "accepted", "prob", "slot_x")}
            out_params: dict[str, list] = {n: [] for n in params}
            for u in range(U):
                state = ReplicaState(x, v, base, extras)
                b, h = schedule.gather(1, slot_of), step_size.gather(1, slot_of)
                noise = ReplayNoise([d[u] for d in inp["draws"]])
                for i in range(n_explore):
                    state, info = explorer.step(state, b, h, density, noise, sub=i * substeps)
                    if i == 0:
                        accept, nonfinite = info.accept_prob, info.nonfinite.long()
                    else:
                        accept, nonfinite = accept + info.accept_prob, nonfinite + info.nonfinite
                explored_at = replica_at
                if has_ref:
                    ref = inp["ref"]
                    fresh = ReplicaState(ref.x[u], ref.v[u], ref.base[u],
                                         {n: t[u] for n, t in ref.extras.items()})
                    state = refresh_top(state, slot_of, fresh, P - 1)
                if seo:
                    active = odd == inp["coins"][u]
                else:
                    parity = torch.where(inp["odd"][u], odd, even)
                    if W > 1:
                        gate = gate | inp["open"][u]
                        active = parity & gate
                    else:
                        active = parity
                uniforms = inp["uniforms"][u] if "uniforms" in inp else _no_uniforms
                # (SwapContext.iteration is 0 here: none of RULES reads it, and a Python
                # iteration number would make every chunk a graph of its own)
                replica_at, slot_of, decision, accepted, prob = sweep_exchange(
                    rule, state.v, replica_at, schedule, params, active, uniforms, 0, lo, hi)
                if gate is not None and W > 1:
                    gate = gate & ~accepted
                by_slot = accept.gather(1, explored_at)
                if n_explore > 1:
                    by_slot = by_slot / n_explore
                out["schedule"].append(schedule)
                out["step_size"].append(step_size)
                nonfinite = nonfinite.gather(1, explored_at)
                # what the plain loop hands its adaptors (k is not read: the gain comes in)
                it = Iteration(k=0, state=state, slot_of=slot_of, replica_at=replica_at,
                               schedule=schedule, step_size=step_size, params=params,
                               explore_accept=by_slot, nonfinite=nonfinite,
                               decisions=[PhaseDecision(lo, hi, active, decision, accepted,
                                                        prob)], has_reference=has_ref)
                for j, a in enumerate(online):
                    upd = a.observe_with(it, inp["gains"][j, u])
                    if upd.schedule is not None:
                        schedule = upd.schedule
                    if upd.step_size is not None:
                        step_size = upd.step_size
                    params.update(upd.params)  # (the view reads the live dict, as it.params)
                if trips:
                    rt = advance(rt, slot_of, P - 1)
                x, v, base, extras = state.x, state.v, state.base, state.extras
                for n, t in (("v", v), ("base", base), ("slot_of", slot_of),
                             ("replica_at", replica_at), ("accept", by_slot),
                             ("nonfinite", nonfinite),
                             ("active", active), ("decision", decision),
                             ("accepted", accepted), ("prob", prob)):
                    out[n].append(t)
                if watched:
                    rep = replica_at[:, watched]
                    out["slot_x"].append(x.gather(1, rep[..., None].expand(*rep.shape,
                                                                           x.shape[-1])))
                for n in out_params:
                    out_params[n].append(params[n])
            new = {"x": x, "v": v, "base": base, "extras": extras, "replica_at": replica_at,
                   "slot_of": slot_of, "schedule": schedule, "step_size": step_size,
                   "params": params}
            if gate is not None:
                new["gate"] = gate
            if trips:
                new["trips"] = rt
            stacked = {n: torch.stack(t) for n, t in out.items() if t}
            stacked["params"] = {n: torch.stack(t) for n, t in out_params.items()}
            return new, stacked

        return body

    def _function(self, U: int, compiled: bool):
        # the body bakes in the scheme's kind and window: a run whose window is tuned
        # (window = "auto": DEO, then DEO_W(W*) from the next segment on) gets a new one
        key = (U, type(self.engine.scheme).__name__, getattr(self.engine.scheme, "window", None),
               compiled)
        fn = self._fns.get(key)
        if fn is None:
            fn = self._body(U)
            if compiled:
                # one code object per kind of run: torch.compile keeps at most a few graphs per
                # code object (then silently runs it eagerly), so the runs of a process
                # (notebooks, benchmarks) must not all share one; runs of the same kind share
                # it, and a later one finds the graph already compiled
                code = _CODES.setdefault(self._kind(U), fn.__code__.replace(
                    co_name=f"fused_chunk_{len(_CODES)}"))
                fn = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__,
                                        fn.__closure__)
                # fullgraph: a graph break would make torch.compile run the whole chunk
                # eagerly without a word; it raises instead, and the fallback says so
                fn = torch.compile(fn, dynamic=False, fullgraph=True)
            self._fns[key] = fn
        return fn

    def _kind(self, U: int) -> tuple:
        """What the compiled chunk's graph depends on beyond tensor shapes and values."""
        eng = self.engine
        return (U, type(eng.scheme).__name__, getattr(eng.scheme, "window", None),
                type(self.explorer).__name__, eng.rule.name, type(eng.target).__name__,
                eng.n_explore, eng.path.has_reference, eng.R, eng.P, eng.dim, eng.dtype,
                self.trips is not None, tuple(type(a).__name__ for a in self.online),
                tuple(eng.watched))

    def run_chunk(self, U: int) -> IterationBlock:
        """Run iterations ``engine.k .. engine.k + U - 1``; returns their block (already
        recorded)."""
        eng = self.engine
        k0 = eng.k
        inp, carry = self._inputs(k0, U), self._carry()
        if self.compile and self.failed is None:
            try:
                with warnings.catch_warnings():  # torch's own notices are not the user's
                    warnings.simplefilter("ignore", DeprecationWarning)
                    warnings.simplefilter("ignore", FutureWarning)
                    new, out = self._function(U, compiled=True)(carry, inp)
            except Exception as err:  # no compiler, an op the compiler cannot take, ...
                # the eager chunk: a target's own error raises there, and compiling goes on
                new, out = self._function(U, compiled=False)(carry, inp)
                first = str(err).splitlines()[0] if str(err) else ""
                self.failed = f"{type(err).__name__}: {first}"
                warnings.warn(f"the compiled chunk failed ({self.failed}); running the chunks "
                              f"eagerly", CompileWarning, stacklevel=2)
        else:
            new, out = self._function(U, compiled=False)(carry, inp)
        eng.set_carry(new, U)
        if self.trips is not None:
            self.trips.take_carry(new["trips"], U)
        block = IterationBlock(
            k0=k0, v=out["v"], base=out["base"], slot_of=out["slot_of"],
            replica_at=out["replica_at"], schedule=out["schedule"],
            step_size=out["step_size"], params=out["params"], explore_accept=out["accept"],
            nonfinite=out["nonfinite"], active=out["active"], decision=out["decision"],
            accepted=out["accepted"], prob=out["prob"],
            slot_x=out.get("slot_x", torch.empty(U, eng.R, 0, eng.dim, dtype=eng.dtype,
                                                 device=eng.device)),
            watched=list(eng.watched), has_reference=eng.path.has_reference)
        for r in self.others:
            if hasattr(r, "record_block"):
                r.record_block(block)
            else:  # (a recorder without the block form: one iteration at a time)
                for u in range(U):
                    r.record(block.iteration(u))
        self.chunks += 1
        return block


def _no_uniforms():
    raise RuntimeError("a fused rule read swap uniforms that were not drawn")


def _reads_uniforms(eng: PTEngine) -> bool:
    """Whether the engine's rule reads the pairs' uniforms (a dry decision on the current
    energies, which changes nothing)."""
    from nrpt.swap.rules import SwapContext

    read = []

    def draw():
        read.append(True)
        return torch.full((eng.R, eng.P - 1), 0.5, dtype=eng.dtype, device=eng.device)

    v = eng.state.v.gather(1, eng.replica_at)
    eng.rule.decide(SwapContext(b_lo=eng.schedule[:, :-1], b_hi=eng.schedule[:, 1:],
                                v_lo=v[:, :-1], v_hi=v[:, 1:], uniform_or_draw=draw,
                                iteration=eng.k, params=eng.params))
    return bool(read)
