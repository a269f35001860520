"""The fused loop: ``U`` whole iterations per call, optionally one ``torch.compile`` graph.

:class:`Fused` runs a chunk of ``U`` iterations (explore, refresh the reference, swap, adapt
online, track the index process) as one function of tensors, with every random number drawn
beforehand (:mod:`nrpt.rng`), and hands recorders the chunk (:class:`~nrpt.roles.IterationBlock`,
``record_block``).  It is composed from :func:`nrpt.core.engine.explore`,
:func:`~nrpt.core.engine.refresh_top`, :func:`~nrpt.core.engine.sweep_exchange` and the roles'
block forms (:mod:`nrpt.roles`): scheme ``block_inputs`` / ``block_phase`` / ``block_after``,
adaptor ``block_inputs`` / ``observe_block``, recorder ``record_block``.

Eager, a chunk equals the plain iterations bit for bit; compiled, up to rounding per step (the
same chain in law, ``tests/test_compile_law.py``).  Chunking depends only on the iteration
number, the checkpoint and callback periods and the kind of state (:meth:`Fused.chunk_at`), so
a resumed run chunks as the uninterrupted one.  ``observe_block`` must be pure and return an
:class:`~nrpt.roles.Update` of ``[R, P]`` tables and known rule parameters only (applied
without :meth:`nrpt.core.engine.PTEngine.apply`'s conversions).

Fusable runs: one process; DEO, DEO_W, SEO; rules ``metropolis``, ``deterministic``,
``always``, ``fixed-rate``; explorers that declare ``compilable``; adaptors
without ``observe`` or with ``observe_block``; any recorders.  :func:`why_not` says why not.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import warnings
from typing import Any, NamedTuple

import numpy as np
import torch

from nrpt.core.engine import (
    PTEngine,
    explore,
    refresh_top,
    slot_metric,
    slot_stats,
    sweep_exchange,
)
from nrpt.explorers import Noise, ReplicaState
from nrpt.explorers.compiled import (
    Compiled,
    CompileWarning,
    RecordingNoise,
    ReplayNoise,
    compilable,
    compile_cache,
    deferred_inductor,
    make_draw,
    why_failed,
)
from nrpt.explorers.sgmcmc import finite_np, keep_failed
from nrpt.host import own_forms, viewable
from nrpt.rng import Stream, block_length, iteration_uniform
from nrpt.roles import BLOCK, AdaptorBase, Iteration, IterationBlock, PhaseDecision
from nrpt.swap.rules import Metropolis, SwapContext
from nrpt.swap.schemes import DEOW, Scheme, adjacent_pairs

__all__ = ["Fused", "why_not", "auto", "auto_unroll", "UNROLL", "RULES"]

#: iterations per chunk (the contracts' block length)
UNROLL = BLOCK
#: each run's compiled chunk gets its own graph cache: the runs of a process (notebooks,
#: benchmarks) share the chunk's code object, and torch.compile keeps at most
#: ``recompile_limit`` graphs per code object (older torch: past it, the fallback says so)
_ISOLATE: dict[str, Any] = ({"isolate_recompiles": True}
                             if "isolate_recompiles" in inspect.signature(torch.compile).parameters
                             else {})
#: rules a chunk may call (pure functions of the context, no host syncs)
RULES = ("metropolis", "deterministic", "always", "fixed-rate")
#: ``fuse = "auto"``'s eager chunks: up to this many iterations, while the chunk's draws of one
#: kind (``U R P dim`` numbers) stay within :data:`AUTO_ELEMENTS` (:func:`auto_unroll`): at most
#: 32 MiB of float64 a kind, whatever the state's size (chunks of 8 beyond ``R P dim = 2^19``).
#: 2^16 until stop 38 held chunks at 8 from ``R P dim > 2^13``: at d = 10^3 x 16 replicas
#: chunks of 128 instead of 8 took a RWMH iteration from 674 to 559 us (docs/benchmarks.md,
#: "Chunk lengths for mid-size states (stop 38)")
AUTO_MAX = 128
AUTO_ELEMENTS = 1 << 22
#: a chunk whose states hold at most this many numbers together (``U R P dim``) gathers the
#: watched slots' positions once, from its stacked states, rather than every iteration
BLOCK_GATHER = 1 << 14
#: on the CPU, an eager chunk of at most this many replicas (``R P``) keeps its swap
#: bookkeeping on NumPy views of its tensors (:func:`_host_swaps`)
NUMPY_SWAPS_MAX = 4096
#: ... and of states of at most this many numbers together (``R P dim``): on large states the
#: bookkeeping's few microseconds are nothing beside the step, and the NumPy path measured
#: 2-3.5 % slower at d = 10^4 (RWMH, P = 16; docs/benchmarks.md, stop 37), cause not found
NUMPY_STATE_MAX = 1 << 16


def _host_swaps(device: torch.device, R: int, P: int, dim: int) -> bool:
    """Whether an eager chunk's swap bookkeeping runs on NumPy views (:data:`_NUMPY`): on
    the CPU, up to :data:`NUMPY_SWAPS_MAX` replicas and :data:`NUMPY_STATE_MAX` numbers."""
    return device.type == "cpu" and R * P <= NUMPY_SWAPS_MAX and \
        R * P * dim <= NUMPY_STATE_MAX


class _Ops(NamedTuple):
    """The few array ops of the lean chunk's swap bookkeeping, on NumPy arrays or on tensors
    (both take ``[]`` slices, ``+`` and ``-``), called with NumPy's positional arguments (no
    wrapper on the NumPy side: a Python call costs as much as a small op's kernel):
    ``array(tensor)`` (a view), ``tensor(array)`` (back), ``take(a, flat indices, None, out or
    None, "clip")``, ``put(a, flat indices, values, "clip")`` (in place), ``mul(a, b, out)``,
    ``lt(a, b, out)``, ``source(padded verdicts, operand)`` (the permutation in the doubled flat
    index space ``[2, R, P]``: the operand is :func:`_source_matrix`'s matrix, or the doubled
    flat ids), whether the padded verdicts' end
    columns hold the row's constants (else zeros), and a context for the chunk's arithmetic."""

    array: Any
    tensor: Any
    take: Any
    put: Any
    mul: Any
    lt: Any
    source: Any
    constant_pads: bool
    quiet: Any


def _torch_take(a, index, axis, out, mode):
    return torch.take(a, index, out=out)


def _torch_put(a, index, values, mode):
    return a.put_(index, values)


def _torch_mul(a, b, out):
    return torch.mul(a, b, out=out)


def _torch_lt(a, b, out):
    return torch.lt(a, b, out=out)


def _torch_source(a, ids):
    return ids + a[:, 1:] - a[:, :-1]


#: (``mode = "clip"``: every index is in range; NumPy's default ``"raise"`` copies ``out``;
#: the permutation as one integer product, the row offsets folded in)
_NUMPY = _Ops(array=torch.Tensor.numpy, tensor=torch.from_numpy, take=np.ndarray.take,
              put=np.ndarray.put, mul=np.multiply, lt=np.less,
              source=np.matmul, constant_pads=True, quiet=lambda: np.errstate(all="ignore"))
#: (the permutation from the zero-padded verdicts' differences: no integer products on GPUs)
_TORCH = _Ops(array=lambda t: t, tensor=lambda t: t, take=_torch_take, put=_torch_put,
              mul=_torch_mul, lt=_torch_lt,
              source=_torch_source, constant_pads=False, quiet=contextlib.nullcontext)


def _source_matrix(R: int, P: int) -> tuple[np.ndarray, torch.Tensor]:
    """``(M[2, P+1, P], pads[R, P+1])`` (long) such that ``a @ M`` is the permutation in the
    doubled flat index space ``src[j, r, p] = j R P + r P + p + a[r, p + 1] - a[r, p]`` (``j =
    0``: the schedule's half, ``1``: the step sizes') of a row ``a`` whose columns ``1 .. P-1``
    hold the verdicts of the pairs ``0 .. P-2`` (0 or 1) and whose end columns hold ``pads``'s
    ``r`` and 1.  Integer products: exact."""
    m = np.zeros((2, P + 1, P), dtype=np.int64)
    j = np.arange(1, P)
    m[:, j, j - 1], m[:, j, j] = 1, -1  # (pair j - 1 swapped: slots j - 1 and j take each other's)
    m[:, 0], m[:, P] = P, np.arange(P)  # (r P + p)
    m[1, P] += R * P  # (the second half)
    pads = torch.zeros(R, P + 1, dtype=torch.long)
    pads[:, 0], pads[:, P] = torch.arange(R), 1
    return m, pads


class _Rows:
    """A buffer attribute's per-iteration tensors (``buf.unbind(0)``), made on the first read
    and kept on the instance (a cached property named by the buffer)."""

    def __init__(self, buf: str):
        self.buf = buf

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, obj, owner=None) -> Any:
        if obj is None:
            return self
        rows = obj.__dict__[self.name] = getattr(obj, self.buf).unbind(0)
        return rows


class _HostSwaps:
    """One eager chunk's swap bookkeeping on NumPy views of its buffers (:meth:`Fused._body`
    with ``eager``): the slot maps kept flat as well, one ``take`` a gather, the permutation as
    one integer product, every per-iteration table written into a ``[U, ...]`` buffer that is
    the chunk's output (fresh each chunk: no step keeps a buffer that is written again)."""

    def __init__(self, rule, n_explore: int, U: int, R: int, P: int, carry: dict,
                 active: torch.Tensor | None, off_a, pads_a, matrix, lo, hi, scheme=None,
                 inputs: dict | None = None, pairs: tuple = ()):
        self.rule, self.n_explore, self.P, self.matrix, self.off_a = rule, n_explore, P, \
            matrix, off_a
        #: the rule's decisions on NumPy arrays, where the class that defines its ``decide``
        #: gives them (Deterministic.decide_host; a subclass's own decide is called as is)
        self.decide_host = rule.decide_host if own_forms(rule, "decide", "decide_host") \
            else None
        #: ... and its core on arrays of the parameters (the host iteration, Fused._body),
        #: where the same class gives it too
        self.decide_arrays = rule.decide_arrays if own_forms(
            rule, "decide", "decide_host", "decide_arrays") else None
        self.listed: torch.Tensor | None = None  # (every pair listed: one tensor a chunk)
        self.arrays = False  # (whether the chunk ran as Fused._body's host iteration)
        self.lo, self.hi = lo, hi
        f64, long = torch.float64, torch.long
        with torch.inference_mode(False):  # (the loop's tensors are made outside it too)
            b_buf, h_buf, e_buf = (torch.empty(U, R, P, dtype=f64) for _ in range(3))
            v_buf = torch.empty(U, R, P + 1, dtype=long)
            raf_buf, sof_buf, ra_buf, so_buf = (torch.empty(U, R, P, dtype=long)
                                                for _ in range(4))
            acc_buf = torch.empty(U, R, P - 1, dtype=torch.bool)
        self.b_a, self.h_a, self.e_a, self.v_a, self.raf_a, self.sof_a, self.ra_a, self.so_a, \
            self.acc_a = (t.numpy() for t in (b_buf, h_buf, e_buf, v_buf, raf_buf, sof_buf,
                                              ra_buf, so_buf, acc_buf))
        self.v_a[...] = pads_a  # (a broadcast copy: the verdicts' row constants)
        self.b_buf, self.h_buf, self.e_buf = b_buf, h_buf, e_buf
        self.ra_buf, self.so_buf, self.acc_buf = ra_buf, so_buf, acc_buf
        # (every iteration's mask where it depends on no state, block_active; else per step)
        self.active_all = self.block_masks = active
        self.act_a = None if active is None else active.numpy()
        # DEO_W's gate (window > 1: the masks read the swaps made) on arrays, where the scheme
        # is DEO_W's own (block_phase and block_after not overridden): per iteration the gate
        # opened at a window's start (|), the masks (parity & gate), the gate closed on the
        # pairs that swapped (& ~accepted), each into a [U, R, P-1] buffer
        cls = type(scheme)
        self.gate: Any = None
        if active is None and cls.block_phase is DEOW.block_phase and \
                cls.block_after is DEOW.block_after and scheme.window > 1:
            gate = carry["scheme"]["gate"]
            if gate.dtype is torch.bool and tuple(gate.shape) == (R, P - 1):
                assert inputs is not None  # (the chunk's scheme inputs: DEO_W's block_inputs)
                with torch.inference_mode(False):
                    g_buf, a_buf, n_buf = (torch.empty(U, R, P - 1, dtype=torch.bool)
                                           for _ in range(3))
                self.gate, self.scheme_state = gate.numpy(), carry["scheme"]
                self.g_a, self.a_a, self.n_a = g_buf.numpy(), a_buf.numpy(), n_buf.numpy()
                self.n_buf, self.active_all = n_buf, a_buf
                self.odd_u, self.open_u = inputs["odd"].tolist(), inputs["open"].numpy()
                self.even_a, self.odd_a = pairs[2].numpy(), pairs[3].numpy()
        # (the flat maps before the chunk's first iteration)
        self.raf = np.add(carry["replica_at"].numpy(), off_a)
        self.sof = np.add(carry["slot_of"].numpy(), off_a)
        self._tables: tuple = (None, None, None, None)

    # each iteration's tensors of the buffers, made where the tensor iteration reads them
    # (one unbind a buffer and chunk; the host iteration reads the arrays)
    b_t = _Rows("b_buf")
    h_t = _Rows("h_buf")
    ra_t = _Rows("ra_buf")
    so_t = _Rows("so_buf")
    acc_t = _Rows("acc_buf")

    @functools.cached_property
    def active(self) -> tuple | None:
        """Every iteration's mask where they depend on no state (block_active), else None."""
        return None if self.block_masks is None else self.block_masks.unbind(0)

    def gate_phase(self, u: int) -> torch.Tensor:
        """DEOW.block_phase's mask of iteration ``u`` (window > 1), on arrays."""
        return torch.from_numpy(self.gate_phase_a(u))

    def gate_phase_a(self, u: int) -> np.ndarray:
        """:meth:`gate_phase`'s array (a view of the chunk's masks)."""
        g = self.g_a[u]
        np.logical_or(self.gate, self.open_u[u], out=g)
        return np.logical_and(self.odd_a if self.odd_u[u] else self.even_a, g,
                              out=self.a_a[u])

    def gate_after(self, u: int, state: dict) -> dict:
        """DEOW.block_after after iteration ``u``'s swaps, on arrays (``state``: the carried
        scheme state, made once a chunk in :meth:`scheme_after`)."""
        self.gate = np.logical_and(self.g_a[u], np.logical_not(self.acc_a[u]),
                                   out=self.n_a[u])
        return state

    def scheme_after(self) -> dict:
        """The scheme's state after the chunk (DEO_W's gate after its last iteration)."""
        return {**self.scheme_state, "gate": self.n_buf[-1]}

    def indicators(self, d: np.ndarray, active: torch.Tensor) -> tuple:
        """A swap phase's :attr:`nrpt.roles.Iteration.pair_indicators` (a sweep: the
        verdicts as 0/1 doubles, every pair listed) from its verdicts' array ``d`` (a cast,
        as ``decision.to(float64)``), and their NumPy views as :mod:`nrpt.adapt.sa` shares
        them: ``((A, listed), (A's array, listed's, every pair listed))``; the all-true
        ``listed`` is one tensor a chunk (read-only, as every table an Iteration hands
        out)."""
        if self.listed is None:
            self.listed = torch.ones_like(active)
            self.listed_a = self.listed.numpy()
        A = d.astype(np.float64)
        return (torch.from_numpy(A), self.listed), (A, self.listed_a, self.P > 1)

    def tables(self, schedule: torch.Tensor, step_size: torch.Tensor):
        """The tables' NumPy views (made again only when an adaptor gave a new table)."""
        st, sa, ht, ha = self._tables
        if schedule is not st:
            st, sa = schedule, schedule.numpy()
        if step_size is not ht:
            ht, ha = step_size, step_size.numpy()
        self._tables = (st, sa, ht, ha)
        return sa, ha

    def swaps(self, u: int, state: ReplicaState, accept, nonfinite, schedule, b_pairs,
              params: dict, uniforms, by_slot: bool, active: torch.Tensor):
        """Iteration ``u``'s swap phase, as :func:`~nrpt.core.engine.sweep_exchange`'s (and
        :func:`~nrpt.core.engine.slot_stats`'s where ``by_slot``): ``(replica_at, slot_of,
        decision, accepted, prob, accept by slot, nonfinite by slot, the verdicts' array)``."""
        take, raf = _NUMPY.take, self.raf  # (the replicas at the slots during the moves)
        v_at = self.e_a[u]  # (the energies at the slots)
        take(state.v.numpy(), raf, None, v_at, "clip")
        if by_slot:
            a = take(accept.numpy(), raf, None, None, "clip")
            if self.n_explore > 1:
                a = a / self.n_explore
            accept = torch.from_numpy(a)
            nonfinite = torch.from_numpy(take(nonfinite.numpy(), raf, None, None, "clip"))
        got = None if self.decide_host is None else self.decide_host(v_at[:, :-1],
                                                                     v_at[:, 1:], params)
        if got is not None:  # (the rule on the arrays: no context, no tensor slices)
            d = got[0]
            decision, prob = torch.from_numpy(d), torch.from_numpy(got[1])
        else:
            e = self.e_buf[u]  # (a rule without decide_host)
            b_lo, b_hi = (schedule[:, :-1], schedule[:, 1:]) if b_pairs is None else b_pairs
            decision, prob = self.rule.decide(SwapContext(
                b_lo=b_lo, b_hi=b_hi, v_lo=e[:, :-1], v_hi=e[:, 1:], uniform_or_draw=uniforms,
                iteration=0, lo=self.lo, hi=self.hi, params=params))
            d = decision.numpy()
        self.exchange(u, d, active.numpy() if self.act_a is None else self.act_a[u])
        np.subtract(self.raf, self.off_a, out=self.ra_a[u])  # (the maps by row, this step's)
        np.subtract(self.sof, self.off_a, out=self.so_a[u])
        return (self.ra_t[u], self.so_t[u], decision, self.acc_t[u], prob, accept,
                nonfinite, d)

    def exchange(self, u: int, d: np.ndarray, active: np.ndarray) -> None:
        """Iteration ``u``'s swaps of the pairs whose verdict ``d`` holds and that are
        ``active`` (both boolean arrays): the executed swaps and the flat maps after them,
        into the chunk's buffers (their row-relative forms: the caller's, per step or per
        chunk)."""
        take = _NUMPY.take
        acc = self.acc_a[u]  # (decision & active: both boolean)
        np.logical_and(d, active, out=acc)
        verdict = self.v_a[u]
        verdict[:, 1:self.P] = acc
        src = _NUMPY.source(verdict, self.matrix)  # (the flat permutation, _source_matrix)
        self.raf = take(self.raf, src, None, self.raf_a[u], "clip")
        self.sof = take(src, self.sof, None, self.sof_a[u], "clip")


def _explorer(engine: PTEngine):
    ex = engine.explorer
    return ex.inner if isinstance(ex, Compiled) else ex


def _online(adaptor) -> bool:
    return type(adaptor).observe is not AdaptorBase.observe


def _has_block_form(obj, base: type, name: str) -> bool:
    return getattr(type(obj), name, None) is not getattr(base, name)


def why_not(run) -> str | None:
    """Why ``run`` cannot be fused (``None``: it can)."""
    eng = run.engine
    if type(eng) is not PTEngine:
        return f"engine {type(eng).__name__} (only the plain PTEngine is fused)"
    if not _has_block_form(eng.scheme, Scheme, "block_phase"):
        return f"scheme {eng.scheme.name!r} has no block form (fused: deo, deo-w, seo)"
    if eng.rule.name not in RULES:
        return f"rule {eng.rule.name!r} (fused: {', '.join(RULES)})"
    if not compilable(_explorer(eng)):
        return f"explorer {getattr(_explorer(eng), 'name', '?')!r} (its draws depend on the state)"
    for a in run.adaptors:
        if _online(a) and not _has_block_form(a, AdaptorBase, "observe_block"):
            return f"adaptor {a.name!r} observes every iteration without observe_block"
    return None


def auto(run, compile: bool = False) -> bool:
    """Whether ``fuse = "auto"`` (the default) runs ``run`` in eager chunks: where
    :func:`why_not` allows, ``compile`` is off, and every recorder is one of nrpt's or has its
    own ``record_block`` (a user recorder written for the plain loop might read engine state
    that ``IterationBlock.iteration(u)`` does not carry).  Eager chunks equal the plain loop
    bit for bit."""
    if compile or why_not(run) is not None:
        return False
    return all(type(r).__module__.startswith("nrpt.") or _own_block(r)
               for r in run.recorders.values())


def auto_unroll(engine) -> int:
    """The chunk length of ``fuse = "auto"``'s eager chunks: the largest power of two in
    ``[UNROLL, AUTO_MAX]`` whose chunk draws at most :data:`AUTO_ELEMENTS` numbers of a kind
    (128 for states of ``R P dim <= 2^15`` numbers: the per-chunk work of the inputs, the
    chunk's set-up and outputs and the recorders' block forms is spread over more iterations;
    16 at ``R P dim = 16 x 10^4``; 8 from ``R P dim > 2^18``).  Eager chunks of any length give
    the plain loop's numbers, so this changes no draw."""
    U, size = UNROLL, engine.R * engine.P * engine.dim
    while U * 2 <= AUTO_MAX and U * 2 * size <= AUTO_ELEMENTS:
        U *= 2
    return U


def _own_block(recorder) -> bool:
    from nrpt.roles import RecorderBase

    return _has_block_form(recorder, RecorderBase, "record_block")


class Fused:
    """Runs chunks of ``unroll`` iterations of ``run`` (a :class:`nrpt.core.loop.Run` that
    :func:`why_not` accepts); ``compile``: as one ``torch.compile`` graph (falls back to the
    eager chunk with a :class:`~nrpt.explorers.compiled.CompileWarning`).  ``ragged`` (eager
    only; ``fuse = "auto"``): chunks of any length up to ``unroll``, ending at the next multiple
    of ``unroll``, the segment's end or a boundary, so that no iteration runs as a plain step
    around them (an eager chunk's numbers do not depend on where it starts)."""

    def __init__(self, run, unroll: int = UNROLL, compile: bool = False, ragged: bool = False):
        reason = why_not(run)
        if reason is not None:
            raise ValueError(f"this run cannot be fused: {reason}")
        if isinstance(unroll, bool) or int(unroll) != unroll or unroll < 1:
            raise ValueError(f"unroll must be an integer >= 1; got {unroll!r}")
        self.unroll, self.compile = int(unroll), bool(compile)
        if ragged and self.compile:
            raise ValueError("ragged chunks are eager only (a compiled chunk has one length)")
        self.ragged = bool(ragged)
        eng = run.engine
        self.engine, self.explorer = eng, _explorer(eng)
        self.online = [a for a in run.adaptors if _online(a)]
        self.recorders = list(run.recorders.values())
        self.plan: list | None = None  # the draws of one iteration's explore phase
        self._reads_uniforms: bool | None = None
        self._fns: dict = {}
        self.failed: str | None = None
        self.chunks = 0
        self._inference = False
        #: the digest of the run's config where its explorer, scheme, rule and adaptors were
        #: built from it (set by nrpt.run.build): compiled chunks are then saved and loaded
        #: across processes under a key that also holds the objects' fingerprint
        #: (nrpt.core.precompile); None: torch.compile in every process
        self.precompile_config: str | None = None
        self.precompiled: str | None = None  # loaded / built, or why not (describe)
        self._artifacts: dict = {}
        self._objects: dict = {}  # the chunk's settings -> its objects' fingerprint
        self._check_objects = True

    def follow_ladder(self, m) -> None:
        """The ladder grew (``chains = "auto"``): the noted draws and any compiled chunk were
        for the old number of slots; they are made again at the next chunk."""
        self.plan = None
        self._fns = {}
        self._artifacts = {}
        self._check_objects = True

    def new_segment(self) -> None:
        """A segment starts (the loop): objects the chunk closes over may have been changed
        between segments (a fitted reference); a saved chunk checks them again."""
        self._check_objects = True

    def describe(self) -> dict:
        """For the summary: the chunk length, chunks run (this process), compiled or not."""
        return {"chunk": self.unroll, "chunks": self.chunks,
                "compiled": self.compile and self.failed is None,
                **({"precompiled": self.precompiled} if self.precompiled else {}),
                **({"compile_failed": self.failed} if self.failed else {})}

    # ------------------------------------------------------------------ when to fuse
    def chunk_at(self, k: int, end: int, boundaries) -> int:
        """How many iterations to run fused from iteration ``k`` (0: a plain step).  A chunk
        starts at a multiple of ``unroll``, ends by ``end``, and no iteration inside it ends
        at a multiple of a ``boundaries`` entry (checkpoints, callbacks)."""
        U = self.unroll
        if self.ragged:  # up to the next multiple of U, the end, the next boundary
            U = min(U - k % U, end - k)
            for every in boundaries:
                if every:
                    U = min(U, every - k % every)
            if U < 1:
                return 0
        elif k % U or k + U > end:
            return 0
        else:
            for every in boundaries:
                if every and (k // every) != ((k + U - 1) // every):
                    return 0
        if self.plan is None:
            self._record_plan()
        return U if self.plan is not None else 0

    def _record_plan(self) -> None:
        """Note the draws of the explore phase at the current state (a discarded dry run); none
        while the phase still sets up buffers, so fusing depends on the state alone."""
        eng = self.engine
        rec = RecordingNoise(Noise(eng.seed, eng.k, eng.R, eng.P, eng.device))
        state = eng.state
        b, h = eng.slot_params(eng.schedule), eng.slot_params(eng.step_size)
        state, _, _ = explore(self.explorer, state, b, h, eng.density, rec, eng.n_explore,
                              slot_metric(eng.metric, eng.slot_of))
        if sorted(state.extras) == sorted(eng.state.extras):
            self.plan = rec.calls

    # ------------------------------------------------------------------ one chunk
    def _inputs(self, k0: int, U: int) -> dict:
        """Every random number and per-iteration constant of iterations ``k0 .. k0 + U - 1``,
        made outside the chunk: the explorer's draws, the rule's uniforms, the scheme's and the
        adaptors' block inputs, the reference rows."""
        eng = self.engine
        R, P, dev, dt = eng.R, eng.P, eng.device, eng.dtype
        if not self.compile and block_length(R * P * eng.dim) < U:
            # eager, a large state: each iteration's draws as they are made (stacking them
            # would copy every state-sized draw once more: the draws are not in one block)
            its = [Noise(eng.seed, k0 + u, R, P, dev) for u in range(U)]
            draws = [[make_draw(n, call) for n in its] for call in self.plan or ()]
        else:
            noise = Noise(eng.seed, k0, R, P, dev, count=U)  # every draw [U, ...]
            draws = [make_draw(noise, call) for call in self.plan or ()]
        inp = {"draws": draws, "scheme": eng.scheme.block_inputs(k0, U, R, eng.seed, dev)}
        if self._reads_uniforms is None:
            self._reads_uniforms = _reads_uniforms(eng)
        if self._reads_uniforms:
            inp["uniforms"] = iteration_uniform((R, P - 1), eng.seed, Stream.SWAP, k0, 0,
                                                dtype=dt, device=dev, count=U)
        if eng.path.has_reference:
            inp["ref"] = eng._reference_rows(k0, count=U)
        if self.online:
            inp["gains"] = torch.tensor([a.block_inputs(k0, U) for a in self.online],
                                        dtype=dt, device=dev)
        return inp

    def _carry(self) -> dict:
        """What an iteration reads and writes, as a dict of tensors."""
        eng = self.engine
        st = eng.state
        carry = {"x": st.x, "v": st.v, "base": st.base, "extras": dict(st.extras),
                 "replica_at": eng.replica_at, "slot_of": eng.slot_of,
                 "schedule": eng.schedule, "step_size": eng.step_size,
                 "params": dict(eng.params), "scheme": dict(eng.scheme_state)}
        if eng.metric is not None:  # (constant within a chunk: it changes between segments)
            carry["metric"] = eng.metric
        if torch.is_inference_mode_enabled() and not self._inference:
            self._inference = True
            # tensors made before the loop's inference mode would make a compiled chunk's
            # first call a graph of its own (one copy each, once: the chunk returns inference
            # tensors, and so do the plain steps and adaptors in the loop's inference mode)
            carry = torch.utils._pytree.tree_map(
                lambda t: t.clone() if isinstance(t, torch.Tensor) and not t.is_inference()
                else t, carry)
        return carry

    def _take_carry(self, carry: dict, iterations: int) -> None:
        """The engine's state after ``iterations`` more iterations: ``carry`` as the chunk
        returned it."""
        eng = self.engine
        eng.state = ReplicaState(carry["x"], carry["v"], carry["base"], carry["extras"])
        eng.replica_at, eng.slot_of = carry["replica_at"], carry["slot_of"]
        eng.schedule, eng.step_size = carry["schedule"], carry["step_size"]
        eng.params.update(carry["params"])  # (the dict keeps its identity, as in apply)
        eng.scheme_state.update(carry["scheme"])
        eng.k += int(iterations)

    def _body(self, U: int, eager: bool = False):
        """The chunk as a function ``(carry, inputs) -> (carry, stacked per-iteration
        outputs)`` of tensors only (what ``torch.compile`` traces): ``U`` times the engine's
        iteration, composed from the roles' block forms.

        ``eager`` (a chunk that is not traced, run in inference mode as the loop runs it:
        every tensor has a NumPy view), float64 on the CPU, a small state (:func:`_host_swaps`),
        a scheme whose masks depend on no state
        (:func:`block_active`): the swap phase's bookkeeping runs on NumPy views of per-chunk
        buffers, as in :meth:`_lean_body` (its :data:`_NUMPY` ops; the rule and the adaptors
        are called as in :func:`~nrpt.core.engine.sweep_exchange`): the slot maps also kept
        flat (row ``r``'s entries offset by ``r P``), the schedule and step sizes at the slots,
        the energies at the slots and the explorer's statistics by slot by one ``take`` each,
        the executed swaps as the padded verdicts' integer product with
        :func:`_source_matrix`'s matrix, the new maps by a ``take`` each; the verdicts, masks
        and maps of the chunk are its output buffers (no stacks).  A rule with
        ``decide_host`` (the deterministic rule's, where its class defines ``decide``) decides
        on the arrays (no context, no tensor slices), DEO_W's gate (window > 1, the scheme's
        own forms) opens and closes on arrays, the iteration's pair indicators and their views
        come from the verdicts' array (:mod:`nrpt.adapt.sa` shares the views), and the
        adaptors of :mod:`nrpt.adapt.sa` get their gains as floats (the same doubles).  Where
        every role has an array form (``host_chunk``: SGLD/SGD with a NumPy estimator, a rule
        with ``decide_arrays``, adaptors with ``observe_arrays``, one explorer step, no
        reference slot, no metric, the watched positions gathered per chunk) the whole chunk
        runs on arrays, its state never a tensor between the roles.
        Integer indexing, logical ops and a cast: the same numbers as the tensors' ops
        (``tests/test_host_swaps.py`` checks each chunk against the traced form's bit for
        bit; ``tests/test_fused.py`` the chunks against the plain loop)."""
        eng, explorer, online = self.engine, self.explorer, list(self.online)
        density, rule, scheme, P = eng.density, eng.rule, eng.scheme, eng.P
        n_explore, R, dev = eng.n_explore, eng.R, eng.device
        pairs = adjacent_pairs(eng.R, P, eng.device)
        lo, hi = pairs[0], pairs[1]
        with torch.inference_mode(False):  # (a constant of the chunk: an ordinary tensor)
            ids = torch.arange(P, device=eng.device).expand(eng.R, P)
        host = eager and eng.dtype is torch.float64 and _host_swaps(dev, R, P, eng.dim)
        if host:
            with torch.inference_mode(False):  # (constants of the chunk: ordinary tensors)
                off = torch.arange(0, R * P, P, device=dev).view(R, 1)  # (row r from r P)
                matrix, pads = _source_matrix(R, P)
                matrix = matrix[0]  # (one flat map here: the doubled space's first half)
            off_a, pads_a = off.numpy(), pads.numpy()
        has_ref, watched = eng.path.has_reference, list(eng.watched)
        # Per-block work where no adaptor reads the iteration: the per-slot explorer
        # statistics gathered once per chunk, and on small states the watched positions too
        # (the chunk's states stacked: at most BLOCK_GATHER numbers); the same gathers of the
        # same numbers as per iteration.
        late_stats = not online
        late_x = bool(watched) and U * eng.R * P * eng.dim <= BLOCK_GATHER
        if watched:
            with torch.inference_mode(False):
                watched_t = torch.tensor(watched, device=eng.device)
        # the host iteration (host_chunk) where every role of the iteration has an array form
        host_est = explorer.host_estimator(density) if host and hasattr(
            explorer, "host_estimator") else None
        # (an adaptor's array form only where the class that defines its observe_block and
        # observe gives it: a subclass's own observe_block is called as it is)
        tables = [a.host_table() if own_forms(a, "observe_block", "observe", "host_table",
                                              "observe_arrays") else None for a in online]
        arrays = host_est is not None and n_explore == 1 and not has_ref and \
            eng.metric is None and None not in tables and not (watched and not late_x)

        def host_chunk(carry: dict, inp: dict, sw: _HostSwaps):
            """The chunk's ``U`` iterations wholly on NumPy arrays, the state kept as arrays
            from the first iteration to the last (no tensor between the roles): the
            explorer's move (``move_np``) and its estimator's ``numpy_gradients``, the
            finiteness check, the swaps (the rule's ``decide_arrays``, :meth:`_HostSwaps.
            exchange`), the adaptors' ``observe_arrays`` on the indicators and the gains as
            floats; the per-iteration tables collected and stacked once.  The roles' own
            array forms, called in :meth:`iteration`'s order on the same numbers: its outputs
            bit for bit (``tests/test_host_swaps.py``); a replica whose step is not finite
            keeps its old state through :meth:`ReplicaState.where`, as the step's."""
            sw.arrays = True
            ex = dict(carry["extras"])
            x, g, v, base = (carry["x"].numpy(), ex["sg_grad"].numpy(), carry["v"].numpy(),
                             carry["base"].numpy())
            var = ex["energy_var"].numpy() if "energy_var" in ex else None
            sched, steps0 = carry["schedule"].numpy(), carry["step_size"].numpy()
            steps = steps0
            pa = {n: t.numpy() for n, t in carry["params"].items()}
            pa0 = dict(pa)
            rows = [(a, t, inp["gains"][j].tolist()) for j, (a, t)
                    in enumerate(zip(online, tables, strict=True))]
            listed = np.ones((R, P - 1), dtype=bool)
            every = P > 1
            ones, zeros = np.ones((R, P)), np.zeros((R, P), dtype=np.int64)
            zero_base = np.zeros((R, P))
            # (every iteration's draws in the order the steps take them, one cursor: checked
            # at the end; as arrays, which the array forms take as they are)
            draws = [d if isinstance(d, list) else list(d.numpy()) for d in inp["draws"]]
            noise = ReplayNoise([t for ts in zip(*draws, strict=True) for t in ts])
            # (the caller took this path only with these: an estimator's, the rule's array
            # forms and, without DEO_W's gate, every iteration's masks)
            assert host_est is not None and sw.decide_arrays is not None
            move, grads, decide, exchange = (explorer.move_np, host_est.numpy_gradients,
                                             sw.decide_arrays, sw.exchange)
            gate, sch, masks = sw.gate is not None, carry["scheme"], sw.act_a
            assert gate or masks is not None
            take, b_a, h_a, e_a = _NUMPY.take, sw.b_a, sw.h_a, sw.e_a
            rows_u = []  # (each iteration's tables, stacked once)
            with np.errstate(all="ignore"):  # (torch does not warn of overflow either)
                for u in range(U):
                    sof, raf = sw.sof, sw.raf  # (the flat maps before the swaps)
                    b_u, h_u = take(sched, sof, None, b_a[u], "clip"), \
                        take(steps, sof, None, h_a[u], "clip")
                    x_new = move(x, g, h_u[..., None], b_u, noise, 0)
                    u_new, g_new, var_new = grads(x_new, noise.key(0, 1))
                    ok = finite_np(u_new, x_new, g_new)
                    if ok.all():
                        x, v, g, var, base = x_new, u_new, g_new, var_new, zero_base
                        acc_u, nf_u = ones, zeros
                    else:  # (the step's where, on tensors: rare)
                        now = {**ex, "sg_grad": torch.from_numpy(g),
                               **({} if var is None else {"energy_var": torch.from_numpy(var)})}
                        new_ex = {**now, "sg_grad": torch.from_numpy(g_new),
                                  **({} if var_new is None else
                                     {"energy_var": torch.from_numpy(var_new)})}
                        st = keep_failed(
                            ReplicaState(torch.from_numpy(x), torch.from_numpy(v),
                                         torch.from_numpy(base), now),
                            torch.from_numpy(ok),
                            ReplicaState(torch.from_numpy(x_new), torch.from_numpy(u_new),
                                         torch.from_numpy(np.zeros(u_new.shape)), new_ex))
                        x, v, base = st.x.numpy(), st.v.numpy(), st.base.numpy()
                        ex = dict(st.extras)
                        g = ex["sg_grad"].numpy()
                        var = ex["energy_var"].numpy() if "energy_var" in ex else None
                        acc_u, nf_u = ok.astype(np.float64), (~ok).astype(np.int64)
                        if not late_stats:  # (by slot: the replicas at the slots before)
                            acc_u = take(acc_u, raf, None, None, "clip")
                            nf_u = take(nf_u, raf, None, None, "clip")
                    v_at = take(v, raf, None, e_a[u], "clip")  # (the energies at the slots)
                    d = decide(v_at[:, :-1], v_at[:, 1:], pa)
                    exchange(u, d, sw.gate_phase_a(u) if gate else masks[u])  # type: ignore[index]
                    if gate:
                        sw.gate_after(u, sch)
                    else:
                        sch = scheme.block_after(sch, torch.from_numpy(sw.acc_a[u]))
                    prob = d.astype(np.float64)  # (also the pair indicators: every pair listed)
                    new_steps = steps
                    for a, table, gl in rows:  # (the rule's parameters live, the steps as begun)
                        if table == "step_size":
                            new_steps = a.observe_arrays(steps, prob, listed, every, gl[u])
                        else:
                            pa[table] = a.observe_arrays(pa[table], prob, listed, every, gl[u])
                    rows_u.append((v, base, d, prob, acc_u, nf_u, steps, x, *pa.values()))
                    steps = new_steps
            if noise.i != len(noise.draws):
                raise RuntimeError(f"the chunk's steps took {noise.i} of its {len(noise.draws)} "
                                   f"draws")
            np.subtract(sw.raf_a, off_a, out=sw.ra_a)  # (the maps by row, every step's)
            np.subtract(sw.sof_a, off_a, out=sw.so_a)
            fr = torch.from_numpy
            v_l, base_l, d_l, p_l, a_l, n_l, s_l, x_l, *par_l = zip(*rows_u, strict=True)
            stacked = {"slot_of": sw.so_buf, "replica_at": sw.ra_buf, "accepted": sw.acc_buf,
                       "active": sw.active_all, "v": fr(np.stack(v_l)),
                       "base": fr(np.stack(base_l)), "decision": fr(np.stack(d_l)),
                       "prob": fr(np.stack(p_l)), "accept": fr(np.stack(a_l)),
                       "nonfinite": fr(np.stack(n_l)),
                       "schedule": carry["schedule"].expand(U, *carry["schedule"].shape),
                       "step_size": carry["step_size"].expand(U, *steps0.shape)
                       if all(t is steps0 for t in s_l) else fr(np.stack(s_l)),
                       "params": {n: fr(np.stack(lst)) for n, lst in zip(pa, par_l,
                                                                         strict=True)}}
            if late_x:
                stacked["x"] = fr(np.stack(x_l))
            ex["sg_grad"] = fr(g)
            if var is not None:
                ex["energy_var"] = fr(var)
            new = {"x": fr(x), "v": fr(v), "base": fr(base.copy() if base is zero_base
                                                       else base), "extras": ex,
                   "replica_at": sw.ra_buf[-1].clone(), "slot_of": sw.so_buf[-1].clone(),
                   "schedule": carry["schedule"],
                   "step_size": carry["step_size"] if steps is steps0 else fr(steps),
                   "params": {n: carry["params"][n] if pa[n] is pa0[n] else fr(pa[n])
                              for n in pa},
                   "scheme": sw.scheme_after() if gate else sch}
            return new, stacked

        def iteration(c: dict, inp: dict, u: int, draws, uniforms, gains) -> tuple[dict, dict]:
            """Iteration ``u`` of the chunk: the carry ``c`` after it, plus its outputs
            (``draws``, ``uniforms``, ``gains``: the chunk's inputs split by iteration)."""
            state = ReplicaState(c["x"], c["v"], c["base"], c["extras"])
            sw: Any = c.get("host")
            take = _NUMPY.take
            if sw is not None:  # (the slots' tables by a take each, into the chunk's buffers)
                sched_a, steps_a = sw.tables(c["schedule"], c["step_size"])
                take(sched_a, sw.sof, None, sw.b_a[u], "clip")
                take(steps_a, sw.sof, None, sw.h_a[u], "clip")
                b, h = sw.b_t[u], sw.h_t[u]
            else:
                sched_g, steps_g = c["schedule"], c["step_size"]
                b, h = sched_g.gather(1, c["slot_of"]), steps_g.gather(1, c["slot_of"])
            m = slot_metric(c["metric"], c["slot_of"]) if "metric" in c else None
            noise = ReplayNoise([d[u] for d in draws])
            state, accept, nonfinite = explore(explorer, state, b, h, density, noise, n_explore,
                                               m)
            explored_at = c["replica_at"]
            if has_ref:
                state = refresh_top(state, c["slot_of"], _fresh(inp["ref"], u), P - 1)
            params = dict(c["params"])
            if sw is not None:
                if sw.active is not None:
                    active, sch = sw.active[u], c["scheme"]
                elif sw.gate is not None:
                    active, sch = sw.gate_phase(u), None
                else:
                    active, sch = scheme.block_phase(pairs, inp["scheme"], u, c["scheme"])
                replica_at, slot_of, decision, accepted, prob, by_slot, nonfinite, verdicts = \
                    sw.swaps(u, state, accept, nonfinite, c["schedule"], c.get("b_pairs"),
                             params, _no_uniforms if uniforms is None else uniforms[u],
                             not late_stats, active)
            else:
                active, sch = scheme.block_phase(pairs, inp["scheme"], u, c["scheme"])
                # (SwapContext.iteration is 0 here: none of RULES reads it, and a Python
                # iteration number would make every chunk a graph of its own)
                replica_at, slot_of, decision, accepted, prob = sweep_exchange(
                    rule, state.v, c["replica_at"], c["schedule"], params, active,
                    _no_uniforms if uniforms is None else uniforms[u], 0, lo, hi, ids,
                    c.get("b_pairs"), c["slot_of"])
            schedule, step_size = c["schedule"], c["step_size"]
            out = {"v": state.v, "base": state.base, "slot_of": slot_of,
                   "replica_at": replica_at, "schedule": c["schedule"],
                   "step_size": c["step_size"], "active": active, "decision": decision,
                   "accepted": accepted, "prob": prob}
            if late_stats:  # (gathered per chunk, in body)
                out["accept"], out["nonfinite"] = accept, nonfinite
            else:
                if sw is None:
                    by_slot, nonfinite = slot_stats(accept, nonfinite, explored_at, n_explore)
                out["accept"], out["nonfinite"] = by_slot, nonfinite
                it = Iteration(k=0, state=state, slot_of=slot_of, replica_at=replica_at,
                               schedule=c["schedule"], step_size=c["step_size"], params=params,
                               explore_accept=by_slot, nonfinite=nonfinite,
                               decisions=[PhaseDecision(lo, hi, active, decision, accepted,
                                                        prob)],
                               has_reference=has_ref)
                if sw is not None and c["schedule"].dtype is torch.float64:
                    it._cache["pair_indicators"], it._cache["pair_indicators_np"] = \
                        sw.indicators(verdicts, active)
                for j, a in enumerate(online):  # (k is not read: the gain comes in)
                    upd = a.observe_block(it, gains[j][u])
                    schedule = upd.schedule if upd.schedule is not None else schedule
                    step_size = upd.step_size if upd.step_size is not None else step_size
                    params.update(upd.params)  # (the view reads the live dict, as it.params)
            out["params"] = dict(params)
            if late_x:  # (gathered per chunk, in body)
                out["x"] = state.x
            elif watched:
                out["slot_x"] = _at_slots(state.x, replica_at.index_select(1, watched_t))
            new = {"x": state.x, "v": state.v, "base": state.base, "extras": state.extras,
                   **({"b_pairs": c["b_pairs"]} if "b_pairs" in c else {}),
                   **({"host": sw} if sw is not None else {}),
                   "replica_at": replica_at, "slot_of": slot_of, "schedule": schedule,
                   "step_size": step_size, "params": params,
                   "scheme": sw.gate_after(u, c["scheme"]) if sch is None else
                   scheme.block_after(sch, accepted),
                   **({"metric": c["metric"]} if "metric" in c else {})}
            return new, out

        def body(carry, inp):
            outs = []
            first_at = carry["replica_at"]
            sw = None
            if host and torch.is_inference_mode_enabled():  # (the loop's: no tensor of the
                # chunk is in autograd, so every one has a NumPy view)
                sw = _HostSwaps(rule, n_explore, U, R, P, carry,
                                block_active(scheme, pairs, inp["scheme"], U), off_a, pads_a,
                                matrix, lo, hi, scheme, inp["scheme"], pairs)
                carry = {**carry, "host": sw}
            if late_stats:  # (no adaptor: the schedule is the chunk's own; its pairs' sides)
                sch = carry["schedule"]
                carry = {**carry, "b_pairs": (sch[:, :-1], sch[:, 1:])}
            ex = carry["extras"]
            if sw is not None and arrays and sw.decide_arrays is not None and \
                    sw.active_all is not None and "sg_grad" in ex and \
                    all(k in ex for k in host_est.extras_keys) and \
                    viewable(carry["x"], carry["v"], carry["base"], ex["sg_grad"],
                             carry["schedule"], carry["step_size"], *carry["params"].values()) \
                    and all(t in carry["params"] for t in tables if t != "step_size"):
                carry, stacked = host_chunk(carry, inp, sw)  # (its own splits of the inputs)
            else:
                # (one op a draw, not one a step; a list: already one tensor an iteration)
                draws = [d if isinstance(d, list) else d.unbind(0) for d in inp["draws"]]
                uniforms = inp["uniforms"].unbind(0) if "uniforms" in inp else None
                # (each adaptor's gains split once: a tuple index a step, not a tensor index)
                gains = [g.unbind(0) for g in inp["gains"].unbind(0)] if "gains" in inp else None
                if sw is not None and gains is not None:  # (float64: the same doubles as floats,
                    # for the adaptors whose observe_block takes a float: no .item() a step)
                    gains = [inp["gains"][j].tolist() if _takes_floats(a) else g
                             for j, (a, g) in enumerate(zip(online, gains, strict=True))]
                outs = []
                for u in range(U):
                    carry, out = iteration(carry, inp, u, draws, uniforms, gains)
                    outs.append(out)
                stacked = {}
                if sw is not None:  # (the chunk's buffers)
                    stacked.update(slot_of=sw.so_buf, replica_at=sw.ra_buf,
                                   accepted=sw.acc_buf, **({} if sw.active_all is None else
                                                           {"active": sw.active_all}))
                    carry = {**carry, "slot_of": carry["slot_of"].clone(),
                             "replica_at": carry["replica_at"].clone(),
                             **({"scheme": sw.scheme_after()} if sw.gate is not None else {})}
                for n in outs[0]:
                    if n == "params" or n in stacked:
                        continue
                    t0 = outs[0][n]
                    if all(o[n] is t0 for o in outs):  # (a table no adaptor changed)
                        stacked[n] = t0.expand(U, *t0.shape)
                    else:
                        stacked[n] = torch.stack([o[n] for o in outs])
                stacked["params"] = {n: torch.stack([o["params"][n] for o in outs])
                                     for n in outs[0]["params"]}
            carry.pop("b_pairs", None)
            carry.pop("host", None)
            if late_stats:
                _per_slot(stacked, first_at, n_explore)
            if late_x:
                stacked["slot_x"] = _at_slots(stacked.pop("x"),
                                              stacked["replica_at"].index_select(2, watched_t))
            return carry, stacked

        return body

    def _lean_body(self, U: int, plain):
        """The eager chunk where an iteration needs nothing of its swap phase but the
        permutation: no online adaptor (the chunk's tables are its own), the Metropolis rule,
        a scheme whose masks depend on no state (:func:`block_active`; else ``plain``, the
        chunk of :meth:`_body`).  Per iteration: the explorer step and seven small ops for the
        slot tables and the swaps (the schedule and step sizes at the replicas' slots by one
        take from the two tables stacked, the slot map kept in that doubled flat index space
        ``[2, R, P]``, the energies put at the replicas' slots, their differences times the
        schedule's, the verdicts of the open pairs against log-uniforms made per chunk, the
        permutation ``src`` from the padded verdicts (in the doubled space: one product with a
        ``[2, P+1, P]`` matrix), and ``slot_of`` by one take: the swaps are disjoint, so
        ``src`` is its own inverse); the replicas at the slots of every iteration by one put
        per chunk (every iteration only where the watched positions are gathered per
        iteration).  Each iteration's views of the buffers come from iterating over them (no
        indexing in the loop).  The slot maps are kept flat (row ``r``'s entries offset by
        ``r P``, once per chunk) so that every gather is one ``take``, each written into a
        per-chunk buffer (fresh each chunk: no step keeps a buffer that is written again).
        On the CPU on small states (:func:`_host_swaps`) these ops run on NumPy views of the
        buffers (:data:`_NUMPY`: a small NumPy op costs a third to a half of a torch op), else
        on the tensors (:data:`_TORCH`); the same indexing, IEEE subtractions, products and
        comparisons either way.  The rule's verdicts and probabilities of all pairs, the masks
        and the log-uniforms are made once per chunk, from the same numbers by the same
        elementwise ops as the rule's per iteration.  The same numbers as :meth:`_body`:
        ``(b_hi - b_lo) (v_hi - v_lo)`` is the rule's ``(b_lo - b_hi) (v_lo - v_hi)`` up to
        the sign of a zero (each factor is the exact negation, or +0 for both), which neither
        ``log u < lr`` nor ``exp(min(lr, 0))`` sees, and ``log u < lr`` is false for a NaN
        ``lr`` as for the rule's ``-inf`` (``tests/test_lean_chunk.py`` checks the chunks
        against :meth:`_body` bit for bit, both namespaces)."""
        eng, explorer = self.engine, self.explorer
        density, scheme, P, R, n_explore = eng.density, eng.scheme, eng.P, eng.R, eng.n_explore
        dev, dt = eng.device, eng.dtype
        pairs = adjacent_pairs(R, P, dev)
        xp = _NUMPY if _host_swaps(dev, R, P, eng.dim) else _TORCH
        arr = xp.array
        with torch.inference_mode(False):  # (constants of the chunk: ordinary tensors)
            # (flat: row r from r P; the step sizes' half of the doubled index space from R P)
            ids2 = torch.arange(2 * R * P, device=dev).view(2, R, P)
            ids = ids2[0]
            off = ids[:, :1]
            top = off + (P - 1)  # (the reference slot, flat)
        ids_a = arr(ids)
        with torch.inference_mode(False):
            matrix, pads = _source_matrix(R, P) if xp.constant_pads else (
                arr(ids2), torch.zeros(R, P + 1, dtype=torch.long, device=dev))
        pads_a = arr(pads)
        with torch.inference_mode(False):
            # (each flat entry k of a chunk's [U, R, P] slot maps offset by u R P, and its
            # replica k mod P: the replicas at the slots by one put a chunk)
            u_off = arr(torch.arange(U, device=dev).mul_(R * P).view(U, 1, 1))
            rep_ids = arr(torch.arange(P, device=dev).expand(U, R, P))
        off_a = arr(off)
        half_a = arr(torch.tensor([0, R * P], device=dev).view(2, 1, 1))
        has_ref, watched, metric = eng.path.has_reference, list(eng.watched), eng.metric
        late_x = bool(watched) and U * R * P * eng.dim <= BLOCK_GATHER
        if watched:
            with torch.inference_mode(False):
                watched_t = torch.tensor(watched, device=dev)
        # (the flat slot tables as tensors, per iteration, only where a step reads them)
        want_tensors = has_ref or metric is not None or (bool(watched) and not late_x)
        ra_each = bool(watched) and not late_x  # (the replicas at the slots every iteration)

        def body(carry, inp):
            active = block_active(scheme, pairs, inp["scheme"], U)
            if active is None:
                return plain(carry, inp)
            schedule, step_size = carry["schedule"], carry["step_size"]
            metric, params = carry.get("metric"), carry["params"]
            log_u = torch.log(inp["uniforms"])  # [U, R, P-1], as the rule's per iteration
            open_u = arr(torch.where(active, log_u, math.inf))  # (closed: never below)
            # (the schedule over the step sizes: one take gathers both at the slots)
            tables = arr(torch.cat([schedule, step_size]))
            sched = tables[:R]
            b_step = sched[:, 1:] - sched[:, :-1]  # b_hi - b_lo
            # every iteration's draws in the order the steps take them, replayed by one cursor
            # (one op a draw per chunk, not one a step; the steps' draws are the plan's, so
            # each step takes its own: checked at the end)
            draws = [d if isinstance(d, list) else d.unbind(0) for d in inp["draws"]]
            noise = ReplayNoise([t for ts in zip(*draws, strict=True) for t in ts])
            state = ReplicaState(carry["x"], carry["v"], carry["base"], carry["extras"])
            first_at = carry["replica_at"]
            # the chunk's buffers: the slots' schedule and step sizes handed to the explorer
            # (one [2, R, P] take an iteration), the energies at the slots, the log ratios, the
            # padded verdicts, the doubled flat index maps after each iteration
            bh_buf = torch.empty(U, 2, R, P, dtype=dt, device=dev)
            e_buf = torch.empty(U, R, P, dtype=dt, device=dev)
            lr_buf = torch.empty(U, R, P - 1, dtype=dt, device=dev)
            v_buf = torch.empty(U, R, P + 1, dtype=torch.long, device=dev)
            ra_buf = torch.empty(U, R, P, dtype=torch.long, device=dev)
            so2_buf = torch.empty(U, 2, R, P, dtype=torch.long, device=dev)
            bh_a, e_a, lr_a, v_a, ra_a, so2_a = map(arr, (bh_buf, e_buf, lr_buf, v_buf, ra_buf,
                                                          so2_buf))
            v_a[...] = pads_a  # (a broadcast copy: torch's repeat costs ~20 small ops here)
            so_a = so2_a[:, 0]  # (the slots' own half)
            so_t = carry["slot_of"] + off
            so = arr(so_t)
            so2 = so + half_a
            if want_tensors:  # (the flat maps as tensors: before each iteration, after it)
                sos, ras = (so_t, *so2_buf[:, 0].unbind(0)), ra_buf.unbind(0)
            take, put, mul, lt, source = xp.take, xp.put, xp.mul, xp.lt, xp.source
            rows = []
            # (the watched positions gathered each iteration into the chunk's own buffer, rows
            # of [R S, dim]: one copy, no stack)
            sx_buf = torch.empty(U, R, len(watched), eng.dim, dtype=dt, device=dev) \
                if ra_each else None
            sx_rows = sx_buf.flatten(1, 2).unbind(0) if ra_each else None
            # (each iteration's views made by the iteration over the buffers, not by indexing)
            its = zip(bh_a, bh_buf[:, 0].unbind(0), bh_buf[:, 1].unbind(0), e_a,
                      e_a[:, :, 1:], e_a[:, :, :-1], lr_a, open_u, v_a, v_a[:, :, 1:P], so2_a,
                      so_a, strict=True)
            with xp.quiet():  # (NumPy: inf - inf is NaN without a warning, as torch's)
                for u, (bh_u, b, h, v_at, v_hi, v_lo, lr_u, open_row, verdict, verdicts,
                        so2_u, so_u) in enumerate(its):
                    take(tables, so2, None, bh_u, "clip")
                    m = None if metric is None else metric.flatten(0, 1)[sos[u]]
                    if n_explore == 1:  # (explore's, its count made long once per chunk)
                        state, info = explorer.step(state, b, h, density, noise, sub=0) \
                            if m is None else explorer.step(state, b, h, density, noise, sub=0,
                                                            metric=m)
                        accept, nonfinite = info.accept_prob, info.nonfinite
                    else:
                        state, accept, nonfinite = explore(explorer, state, b, h, density,
                                                           noise, n_explore, m)
                    if has_ref:
                        state = refresh_top(state, sos[u], _fresh(inp["ref"], u), top)
                    put(v_at, so, arr(state.v), "clip")  # (each replica's energy at its slot)
                    lt(open_row, mul(b_step, v_hi - v_lo, lr_u), verdicts)
                    so2 = take(source(verdict, matrix), so2, None, so2_u, "clip")
                    so = so_u
                    if ra_each:
                        put(ra_a[u], so, ids_a, "clip")
                        torch.index_select(state.x.detach().flatten(0, 1), 0,
                                           ras[u].index_select(1, watched_t).flatten(),
                                           out=sx_rows[u])
                    rows.append((state.v, state.base, accept, nonfinite, state.x if late_x else
                                 None))
            if noise.i != len(noise.draws):
                raise RuntimeError(f"the chunk's steps took {noise.i} of its {len(noise.draws)} "
                                   f"draws")
            names = ("v", "base", "accept", "nonfinite", "x" if late_x else "slot_x")
            st = {n: torch.stack(ts) for n, ts in zip(names, zip(*rows, strict=True), strict=True)
                  if late_x or n != names[-1]}
            if ra_each:
                st["slot_x"] = sx_buf
            replica_at = torch.empty(U, R, P, dtype=torch.long, device=dev)
            put(arr(replica_at), so_a + u_off, rep_ids, "clip")
            st["slot_of"], st["replica_at"] = xp.tensor(so_a - off_a), replica_at
            st["accepted"] = v_buf[:, :, 1:P].bool().contiguous()
            st["active"], st["decision"] = active, log_u < lr_buf
            st["prob"] = torch.exp(torch.clamp(torch.nan_to_num(
                lr_buf, nan=-math.inf, posinf=math.inf, neginf=-math.inf), max=0.0))
            st["schedule"] = schedule.expand(U, *schedule.shape)
            st["step_size"] = step_size.expand(U, *step_size.shape)
            st["params"] = {n: torch.stack([t] * U) for n, t in params.items()}
            _per_slot(st, first_at, n_explore)
            if late_x:
                st["slot_x"] = _at_slots(st.pop("x"), st["replica_at"].index_select(2, watched_t))
            new = {"x": state.x, "v": state.v, "base": state.base, "extras": state.extras,
                   "replica_at": st["replica_at"][-1].clone(),
                   "slot_of": st["slot_of"][-1].clone(), "schedule": schedule,
                   "step_size": step_size, "params": dict(params),
                   "scheme": carry["scheme"],
                   **({"metric": metric} if metric is not None else {})}
            return new, st

        return body

    def _function(self, U: int, compiled: bool):
        # the body bakes in the scheme's kind and window: a run whose window is tuned
        # (window = "auto": DEO, then DEO_W(W*) from the next segment on) gets a new one
        metric = self.engine.metric  # (none, diagonal or dense: a body each)
        key = (U, type(self.engine.scheme).__name__, getattr(self.engine.scheme, "window", None),
               compiled, None if metric is None else metric.dim())
        fn = self._fns.get(key)
        if fn is None:
            fn = self._body(U, eager=not compiled)
            if not compiled and not self.online and type(self.engine.rule) is Metropolis \
                    and self._reads_uniforms:
                fn = self._lean_body(U, fn)
            if compiled:
                # fullgraph: a graph break would make torch.compile run the whole chunk
                # eagerly without a word; it raises instead, and the fallback says so
                # (inductor deferred to the first call: a guard that fails on the traced frame
                # fails before the long compilation, and the fallback is at once)
                compile_cache()
                fn = torch.compile(fn, dynamic=False, fullgraph=True, backend=deferred_inductor,
                                   **_ISOLATE)
            self._fns[key] = fn
        return fn

    def _roots(self) -> dict:
        """The objects the chunk closes over (their fingerprint is in a saved chunk's key)."""
        eng = self.engine
        return {"density": eng.density, "explorer": self.explorer, "rule": eng.rule,
                "scheme": eng.scheme, "path": eng.path, "online": self.online}

    def _static(self, U: int) -> dict:
        """The chunk's settings that its body bakes in, besides the objects and the inputs."""
        eng = self.engine
        return {"U": U, "scheme": type(eng.scheme).__qualname__,
                "window": getattr(eng.scheme, "window", None), "R": eng.R, "P": eng.P,
                "dim": eng.dim, "dtype": eng.dtype, "device": eng.device,
                "n_explore": eng.n_explore, "watched": list(eng.watched),
                "has_reference": eng.path.has_reference, "plan": self.plan,
                "uniforms": self._reads_uniforms, "online": [type(a).__qualname__
                                                             for a in self.online],
                "block_gather": BLOCK_GATHER,
                # inductor bakes the thread count into its CPU kernels; a GPU's generation
                "threads": torch.get_num_threads(),
                "gpu": (torch.cuda.get_device_capability(eng.device),
                        torch.cuda.get_device_name(eng.device))
                if eng.device.type == "cuda" else None}

    def _artifact(self, U: int, carry: dict, inp: dict):
        """The saved compiled chunk for this run (loaded from the per-machine folder, or
        exported, compiled and saved now), or None where the run takes ``torch.compile``
        (:mod:`nrpt.core.precompile`; the reason is in :meth:`describe`)."""
        from nrpt.core import precompile

        if self.precompile_config is None or not precompile.enabled() or (
                self.precompiled is not None and self.precompiled.startswith("off")):
            return None
        static = self._static(U)
        skey = repr(sorted((k, repr(v)) for k, v in static.items()))
        if self._check_objects or skey not in self._objects:
            try:
                objects = precompile.fingerprint(self._roots())
            except precompile.Unkeyable as err:
                self.precompiled = f"off: the key cannot cover {err}"
                return None
            if self._objects.get(skey, objects) != objects:
                # the same settings, changed objects (a value refitted between segments): a
                # key per segment would never be hit again (torch.compile takes them)
                self.precompiled = "off: the chunk's objects changed during the run"
                return None
            self._objects[skey], self._check_objects = objects, False
        art = self._artifacts.get(skey)
        if art is None:
            key = precompile.key(self.precompile_config, self._objects[skey], static,
                                 (carry, inp))
            path = precompile.folder() / f"chunk-{key}.pt2"
            try:
                if path.exists():
                    art, self.precompiled = precompile.Artifact(path), "loaded"
                else:
                    compile_cache()  # (inductor's caches in the per-machine folder too)
                    with warnings.catch_warnings():  # torch's own notices are not the user's
                        warnings.simplefilter("ignore")
                        art = precompile.Artifact.build(
                            path, self._body(U), carry, inp,
                            {"key": key, "static": static, "torch": torch.__version__})
                    self.precompiled = "built"
            except Exception as err:  # export cannot take the chunk, no compiler, ...
                self.precompiled = f"off: {why_failed(err)}"
                return None
            self._artifacts[skey] = art
        return art

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
                    art = self._artifact(U, carry, inp)
                    fn = art if art is not None else self._function(U, compiled=True)
                    new, out = fn(carry, inp)
            except Exception as err:  # no compiler, an op the compiler cannot take, ...
                # the eager chunk: a target's own error raises there, and compiling goes on
                new, out = self._function(U, compiled=False)(carry, inp)
                self.failed = why_failed(err)
                warnings.warn(f"the compiled chunk failed ({self.failed}); running the chunks "
                              f"eagerly", CompileWarning, stacklevel=2)
        else:
            new, out = self._function(U, compiled=False)(carry, inp)
        self._take_carry(new, U)
        block = IterationBlock(
            k0=k0, v=out["v"], base=out["base"], slot_of=out["slot_of"],
            replica_at=out["replica_at"], schedule=out["schedule"],
            step_size=out["step_size"], params=out["params"], explore_accept=out["accept"],
            nonfinite=out["nonfinite"], active=out["active"], decision=out["decision"],
            accepted=out["accepted"], prob=out["prob"],
            slot_x=out.get("slot_x", torch.empty(U, eng.R, 0, eng.dim, dtype=eng.dtype,
                                                 device=eng.device)),
            watched=list(eng.watched), has_reference=eng.path.has_reference)
        for r in self.recorders:
            if hasattr(r, "record_block"):
                r.record_block(block)
            else:  # (a recorder without the block form: one iteration at a time)
                for u in range(U):
                    r.record(block.iteration(u))
        self.chunks += 1
        return block


def block_active(scheme: Scheme, pairs: tuple, inputs: dict, U: int) -> torch.Tensor | None:
    """Every iteration's mask of the pairs that may swap ``[U, R, P-1]`` from the scheme's
    block inputs, where the scheme's ``block_active`` gives it (its masks depend on no state)
    and comes from the class that defines its ``block_phase``; else ``None``."""
    if not own_forms(scheme, "block_phase", "block_active"):
        return None
    return scheme.block_active(pairs, inputs, U)


def _fresh(ref, u: int) -> ReplicaState:
    """Iteration ``u``'s fresh reference draws of the chunk's ``ref`` (stacked states)."""
    return ReplicaState(ref.x[u], ref.v[u], ref.base[u], {n: t[u] for n, t in ref.extras.items()})


def _at_slots(x: torch.Tensor, rep: torch.Tensor) -> torch.Tensor:
    """The positions ``x[..., P, dim]`` of the replicas ``rep[..., S]`` (per iteration
    ``[R, S]``, or a chunk's ``[U, R, S]``): ``[..., S, dim]``."""
    return x.gather(rep.dim() - 1, rep[..., None].expand(*rep.shape, x.shape[-1]))


def _per_slot(stacked: dict, first_at: torch.Tensor, n_explore: int) -> None:
    """A chunk's explorer acceptance and non-finite counts ``[U, R, P]`` by slot, in place:
    each iteration's moves ran with the slot -> replica map before its swaps."""
    at = torch.cat([first_at[None], stacked["replica_at"][:-1]])
    stacked["accept"], stacked["nonfinite"] = slot_stats(
        stacked["accept"], stacked["nonfinite"].long(), at, n_explore)


def _takes_floats(adaptor) -> bool:
    """Whether the adaptor's ``observe_block`` takes its gain as a float as well as a 0-d
    tensor: the class that defines it says so (``float_gains = True`` beside it; a subclass
    that overrides ``observe_block`` says so again or not)."""
    return own_forms(adaptor, "observe_block", "float_gains") and adaptor.float_gains is True


def _no_uniforms():
    raise RuntimeError("a fused rule read swap uniforms that were not drawn")


def _reads_uniforms(eng: PTEngine) -> bool:
    """Whether the engine's rule reads the pairs' uniforms (a dry decision on the current
    energies, which changes nothing)."""
    from nrpt.swap.rules import SwapContext

    read: list[bool] = []

    def draw():
        read.append(True)
        return torch.full((eng.R, eng.P - 1), 0.5, dtype=eng.dtype, device=eng.device)

    v = eng.state.v.gather(1, eng.replica_at)
    eng.rule.decide(SwapContext(b_lo=eng.schedule[:, :-1], b_hi=eng.schedule[:, 1:],
                                v_lo=v[:, :-1], v_hi=v[:, 1:], uniform_or_draw=draw,
                                iteration=eng.k, params=eng.params))
    return bool(read)
