"""The one run loop: every kind of run is a *plan* of segments executed here.

===================  ===========================================================================
fixed-length run     warm-up windows (the burn-in; step sizes tuned between them), then the
                     sampling segment (statistics reset: the burn-in is in no statistic)
``window = "auto"``  warm-up windows, a tuning segment (DEO), then the main one under DEO_W(W*)
adaptive NRPT        rounds: segments of 2, 4, ..., 2^N iterations, statistics reset each round
===================  ===========================================================================

Per iteration::

    it = engine.step()                                  # explore, reference, swaps
    for a in adaptors:   engine.apply(a.observe(it))    # online adaptation
    for r in recorders:  r.record(it)

At a segment's end the loop reports a row (the recorders' ``segment_row``), lets the adaptors
propose between-round changes (``end_segment``), and checkpoints.  Checkpoints are also written
every ``checkpoint_every`` iterations and on Ctrl-C (handled at an iteration boundary, so the
saved state is always consistent); they hold the engine, every adaptor and every recorder, so
:func:`execute` resumed from one reproduces the uninterrupted run bit for bit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import threading
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from nrpt.core.engine import PTEngine
from nrpt.core.sharding import ShardedEngine
from nrpt.files import CHECKPOINT, write_checkpoint
from nrpt.roles import SegmentView

__all__ = ["Segment", "Plan", "Run", "Outcome", "execute", "CHECKPOINT", "RunError",
           "Interrupt"]

CALLBACK_EVERY = 256
#: below this many numbers in the replica states ``[R, P, dim]``, ``"auto"`` uses one thread
SMALL_STATE = 1 << 16


def choose_threads(engine: PTEngine, threads: int | str | None = None) -> int:
    """The torch intra-op thread count for a run: ``threads`` (an int >= 1), else the
    environment's ``NRPT_THREADS``, else ``"auto"``: one thread for small states on the CPU
    (fewer than :data:`SMALL_STATE` numbers), torch's own count otherwise."""
    if threads is None:
        threads = os.environ.get("NRPT_THREADS", "auto")
    if isinstance(threads, str) and threads.strip().lower() == "auto":
        small = engine.device.type == "cpu" and engine.R * engine.P * engine.dim < SMALL_STATE
        return 1 if small else torch.get_num_threads()
    try:
        n = int(threads)
    except (TypeError, ValueError):
        n = 0
    if isinstance(threads, bool) or n < 1 or str(n) != str(threads).strip():
        raise ValueError(f"threads must be an integer >= 1 or 'auto' (also NRPT_THREADS); got "
                         f"{threads!r}")
    return n


def release_inference_tensors(objects, depth: int = 3) -> None:
    """Replace the inference tensors (made under ``torch.inference_mode``) held by ``objects``
    -- in their attributes, and in dicts, lists, tuples, dataclasses and objects held there,
    ``depth`` levels down -- by ordinary copies, so that code after the loop may update them
    in place or use them with autograd.  Tensors made before the loop are left as they are."""
    seen: set[int] = set()

    def fix(v, d):
        if isinstance(v, torch.Tensor):
            return v.clone() if v.is_inference() else v
        if d <= 0 or id(v) in seen or isinstance(v, str | bytes | int | float | bool | type
                                                  | types.ModuleType):
            return v  # (a module, e.g. the torch.distributed a Comm holds, is not ours to walk:
            # reading its attributes woke torch's deprecated reduce_op, a FutureWarning per rank)
        seen.add(id(v))
        if isinstance(v, dict):
            for k in list(v):
                v[k] = fix(v[k], d - 1)
            return v
        if isinstance(v, list):
            v[:] = [fix(x, d - 1) for x in v]
            return v
        if type(v) is tuple:  # (named tuples and other tuple types are left alone)
            return tuple(fix(x, d - 1) for x in v)
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            changes = {f.name: fix(getattr(v, f.name), d - 1) for f in dataclasses.fields(v)
                       if f.init}
            return dataclasses.replace(v, **changes)
        if hasattr(v, "__dict__") and not isinstance(v, torch.nn.Module):
            for k, x in list(vars(v).items()):
                new = fix(x, d - 1)
                if new is not x:
                    object.__setattr__(v, k, new)
        return v

    for obj in objects:
        fix(obj, depth)


@contextlib.contextmanager
def torch_threads(n: int):
    """Run a block with ``n`` torch intra-op threads, restoring the count afterwards."""
    before = torch.get_num_threads()
    if n != before:
        torch.set_num_threads(n)
    try:
        yield n
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


@dataclass(frozen=True)
class Segment:
    """``iterations`` iterations; ``reset``: recorders start fresh statistics (a new round);
    ``sample``: its draws are the run's samples (:attr:`Plan.sample_start`)."""

    name: str
    iterations: int
    reset: bool = True
    sample: bool = True


@dataclass(frozen=True)
class Plan:
    segments: tuple[Segment, ...]
    #: iterations of the warm-up windows before the sampling segments (fixed-length runs)
    burn_in: int = 0

    @staticmethod
    def warm_up(burn_in: int, windows: int = 1) -> tuple[Segment, ...]:
        """``burn_in`` iterations in ``windows`` near-equal segments ``"warm-up i"`` whose
        draws are not samples (``reset``: each window's statistics are its own, which is what
        the step-size tuning between them reads)."""
        burn_in, windows = int(burn_in), max(1, min(int(windows), int(burn_in)))
        if burn_in <= 0:
            return ()
        cuts = [burn_in * i // windows for i in range(windows + 1)]
        return tuple(Segment(f"warm-up {i + 1}", cuts[i + 1] - cuts[i], reset=True, sample=False)
                     for i in range(windows))

    @classmethod
    def fixed(cls, iterations: int, burn_in: int = 0, windows: int = 1) -> Plan:
        """``burn_in`` warm-up iterations (in ``windows``), then the rest: the samples, with
        fresh statistics."""
        burn_in = min(int(burn_in), int(iterations) - 1)
        if burn_in <= 0:
            return cls((Segment("run", int(iterations)),))
        return cls(cls.warm_up(burn_in, windows) + (Segment("run", int(iterations) - burn_in),),
                   burn_in)

    @classmethod
    def tuned(cls, tune: int, iterations: int, burn_in: int = 0, windows: int = 1) -> Plan:
        """Warm-up windows, a DEO tuning segment of ``tune`` iterations, then the rest
        (statistics continue from the tuning segment: both sample exactly)."""
        burn_in = max(0, min(int(burn_in), int(iterations) - 1))
        rest = int(iterations) - burn_in
        tune = min(int(tune), rest)
        segs = list(cls.warm_up(burn_in, windows)) + [Segment("tune", tune)]
        if rest > tune:
            segs.append(Segment("main", rest - tune, reset=False))
        return cls(tuple(segs), burn_in)

    @classmethod
    def rounds(cls, n: int) -> Plan:
        """Rounds of ``2^r`` iterations, ``r = 1..n``; only the last round's draws are the
        run's samples, and every round starts fresh statistics."""
        return cls(tuple(Segment(f"round {r}", 2**r, reset=True, sample=(r == n))
                         for r in range(1, int(n) + 1)))

    @property
    def total(self) -> int:
        return sum(s.iterations for s in self.segments)

    def starts(self) -> list[int]:
        out, k = [], 0
        for s in self.segments:
            out.append(k)
            k += s.iterations
        return out

    @property
    def sample_start(self) -> int:
        """First iteration whose draws are the run's samples."""
        starts = self.starts()
        first = [i for i, s in enumerate(self.segments) if s.sample]
        return starts[first[0]] if first else self.total


@dataclass
class Run:
    """What the builder (:func:`nrpt.run.build.build`) assembles from a config."""

    engine: PTEngine
    adaptors: list
    recorders: dict[str, Any]
    plan: Plan
    facts: dict[str, Any] = field(default_factory=dict)
    #: runs chunks of iterations at once (:class:`nrpt.core.fused.Fused`), or None
    fused: Any = None


@dataclass
class Outcome:
    rows: list[dict[str, Any]]
    notes: dict[str, Any]
    wall_time_s: float
    interrupted: bool
    segments_done: int


class Interrupt:
    """SIGINT and SIGTERM become a flag that the loop checks between whole iterations.

    The handler only sets the flag (a second signal too: the run still stops at the next
    iteration boundary, so the checkpoint and the outputs are always consistent; ``kill -9``
    is the way to stop at once).  Installed for as long as the block runs, from the main thread
    only; a signal the process was started with ignored (``SIG_IGN``) stays ignored."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.flag = False
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> Interrupt:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    self._old[sig] = signal.signal(sig, self._handler)
        return self

    def _handler(self, signum, frame) -> None:
        if self.flag:
            with contextlib.suppress(Exception):
                print(f"nrpt: {signal.Signals(signum).name} again: still stopping at the end of "
                      f"this iteration (kill -9 stops at once; the last checkpoint is kept)",
                      file=sys.stderr, flush=True)
        self.flag = True
        self.signum = signum

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():  # (None: a handler not set from Python)
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
        self._old.clear()


def follow_ladder(run: Run, m) -> None:
    """After the engine grew or shrank its ladder (:meth:`PTEngine.resize`, a
    :class:`~nrpt.roles.SlotMap` ``m``): every adaptor and recorder, and the fused runner,
    carries its per-slot tables to the new slots (``follow_ladder(m)``; the builder refuses
    ``chains = "auto"`` for a run with one that cannot)."""
    for obj in [*run.adaptors, *run.recorders.values(), run.fused]:
        if obj is None:
            continue
        follow = getattr(obj, "follow_ladder", None)
        if follow is None:
            raise RunError(f"{type(obj).__name__} {getattr(obj, 'name', '')!r} cannot follow "
                           f"a growing ladder (no follow_ladder)")
        follow(m)
    run.engine.watched = []  # the positions the recorders read, on the new ladder
    for r in run.recorders.values():
        run.engine.watch(getattr(r, "reads_slots", ()))


class RunError(RuntimeError):
    """An iteration failed (usually the target raised); the message says which and how to go
    on from the last checkpoint."""


def _failure(k: int, err: Exception, out: Path | None, chunk: int = 0) -> str:
    which = (f"iterations {k + 1}-{k + chunk} (a fused chunk; the engine is still at "
             f"iteration {k})" if chunk > 1 else f"iteration {k + 1}")
    msg = f"{which} failed: {type(err).__name__}: {err}"
    if out is not None and (out / CHECKPOINT).exists():
        msg += (f"; {out / CHECKPOINT} holds the last checkpoint: fix the cause, then "
                f"`nrpt resume {out}`")
    return msg


def execute(run: Run, *, out: Path | None = None, checkpoint_every: int = 5000,
            progress: bool = False, callback: Callable | None = None,
            resume: dict | None = None, header: dict | None = None,
            say: Callable[[str], None] | None = None,
            table: tuple[str, Callable[[dict], str]] | None = None,
            stop: Interrupt | None = None, threads: int | str | None = None) -> Outcome:
    """Run ``run.plan`` (or its remainder, from the checkpoint dict ``resume``).

    ``callback(engine)`` is called every 256 iterations and at segment ends (raising
    ``KeyboardInterrupt`` there interrupts the run cleanly); ``header`` is stored in every
    checkpoint (e.g. the config); ``say`` prints the per-segment rows, formatted by ``table =
    (header, format_row)`` (:data:`nrpt.report.text.TABLE`; no rows without both); ``stop``: an
    :class:`Interrupt` the caller installed (and keeps installed while it writes its outputs),
    else one is installed for the loop; ``threads``: torch threads while it runs
    (:func:`choose_threads`: default ``NRPT_THREADS`` or ``"auto"``, one thread for small
    states; the count in force before is restored; ``outcome.notes["threads"]`` says which).

    With a run folder ``out``, a checkpoint is written before the first iteration, every
    ``checkpoint_every`` iterations, at segment ends and when the run is interrupted; on the
    way out the record files are cut to their valid rows."""
    with contextlib.ExitStack() as stack:
        if stop is None:
            stop = stack.enter_context(Interrupt())
        n = stack.enter_context(torch_threads(choose_threads(run.engine, threads)))
        fast = run.engine.autograd_free
        try:
            with torch.inference_mode(fast):
                loop = _Loop(run, out, checkpoint_every, callback, header, say, table, stop)
                outcome = loop.execute(resume, progress)
        finally:
            if fast:  # what the run leaves behind is ordinary tensors again
                release_inference_tensors([run.engine, *run.adaptors, *run.recorders.values()])
        outcome.notes["threads"] = n
        outcome.notes["inference_mode"] = fast
        return outcome


class _Loop:
    """One execution of a run's plan: the loop's state between iterations (rows, notes, the
    segment, whether it started) and the steps of :func:`execute`."""

    def __init__(self, run: Run, out, checkpoint_every: int, callback, header, say, table,
                 stop: Interrupt):
        self.run, self.engine, self.out = run, run.engine, out
        self.checkpoint_every, self.callback = checkpoint_every, callback
        self.header, self.say, self.table, self.stop = header, say, table, stop
        self.starts = run.plan.starts()
        self.rows: list[dict[str, Any]] = []
        self.notes: dict[str, Any] = {}
        self.elapsed = 0.0
        self.seg_i, self.started = 0, False
        self.bar: Any = None
        self.t0 = time.perf_counter()
        # no fused chunk runs across a checkpoint or a callback
        self.boundaries = (checkpoint_every, CALLBACK_EVERY if callback is not None else 0)

    def resume(self, resume: dict) -> None:
        run, engine, plan = self.run, self.engine, self.run.plan
        engine.load_state_dict(resume["engine"])
        for a, sd in zip(run.adaptors, resume["adaptors"], strict=True):
            a.load_state_dict(sd)
        for name, rec in run.recorders.items():
            rec.load_state_dict(resume["recorders"][name])
        self.rows, self.notes = list(resume["rows"]), dict(resume["notes"])
        self.seg_i, self.started = int(resume["segment"]), bool(resume["started"])
        self.elapsed = float(resume["wall_time_s"])
        if self.seg_i == len(plan.segments) and engine.k < plan.total:
            # a finished run given a larger budget: its last segment goes on (same statistics),
            # and its report row is made again at the new end
            self.seg_i, self.started, self.rows = self.seg_i - 1, True, self.rows[:-1]

    def payload(self) -> dict[str, Any]:
        """Everything a resumption needs, at an iteration boundary (the one place a checkpoint
        is assembled; ``state_dict`` of the engine and recorders may be collective)."""
        run = self.run
        return {"version": 2, "header": self.header or {}, "engine": self.engine.state_dict(),
                "adaptors": [a.state_dict() for a in run.adaptors],
                "recorders": {n: r.state_dict() for n, r in run.recorders.items()},
                "rows": self.rows, "notes": self.notes, "segment": self.seg_i,
                "started": self.started,
                "wall_time_s": self.elapsed + time.perf_counter() - self.t0}

    def checkpoint(self) -> None:
        # a sharded engine's state is gathered on every rank (a collective); the rank given
        # the run folder writes it
        if self.out is not None or isinstance(self.engine, ShardedEngine):
            p = self.payload()
            if self.out is not None:
                write_checkpoint(p, self.out)

    def write(self, line: str) -> None:
        (self.bar.write if self.bar is not None else self.say)(line)

    def execute(self, resume: dict | None, progress: bool) -> Outcome:

        run, engine, plan = self.run, self.engine, self.run.plan
        if resume is not None:
            self.resume(resume)
        elif "draws" in run.recorders:
            run.recorders["draws"].initial(engine.slot_of)
        self.t0 = time.perf_counter()
        if resume is None:
            self.checkpoint()  # a run stopped before its first periodic checkpoint can resume
        if progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=plan.total, initial=engine.k, unit="it", dynamic_ncols=True,
                            leave=False, desc="nrpt")
        self.show_rows = len(plan.segments) > 1 and self.say is not None and \
            self.table is not None
        if self.show_rows and not self.rows:
            self.write(self.table[0])
        interrupted = False
        self.consistent = True  # false only while an iteration is half done
        try:
            while self.seg_i < len(plan.segments):
                self.segment(plan.segments[self.seg_i])
        except KeyboardInterrupt:
            interrupted = True
        finally:
            if self.bar is not None:
                self.bar.close()
        wall = self.elapsed + time.perf_counter() - self.t0
        if interrupted and self.consistent:  # (a completed run was checkpointed at its last
            self.checkpoint()  # segment end; an iteration broken off half way keeps the last)
        if "draws" in run.recorders:
            run.recorders["draws"].close()
        return Outcome(rows=self.rows, notes=self.notes, wall_time_s=wall,
                       interrupted=interrupted, segments_done=self.seg_i)

    def segment(self, seg: Segment) -> None:
        """Run (the rest of) segment ``seg``, report its row, adapt between segments."""
        engine = self.engine
        if not self.started:
            for r in self.run.recorders.values():
                r.start_segment(seg.reset, seg.iterations)
            self.started = True
            self.notes["segment_b"] = engine.schedule.tolist()
        end = self.starts[self.seg_i] + seg.iterations
        if self.run.fused is not None:  # (a saved compiled chunk checks its objects again)
            self.run.fused.new_segment()
        seg_t0 = time.perf_counter()
        while engine.k < end:
            self.iterate(end)
        self.end_segment(seg, time.perf_counter() - seg_t0)

    def iterate(self, end: int) -> None:
        """One iteration, or a fused chunk of them, then the progress bar, the callback and
        the periodic checkpoint."""
        engine, fused = self.engine, self.run.fused
        # the only place a signal takes effect: between iterations (sharded: when the ranks
        # agreed, from the flags gathered with the last iteration's scalars)
        if engine.should_stop(self.stop.flag):
            raise KeyboardInterrupt
        self.consistent = False
        k_before, chunk = engine.k, 0
        try:
            if fused is not None:  # (may evaluate the target: a dry explore step)
                chunk = fused.chunk_at(k_before, end, self.boundaries)
            if chunk:  # iterations k .. k + chunk - 1 at once (nrpt.core.fused)
                fused.run_chunk(chunk)
            else:
                it = engine.step()
                for a in self.run.adaptors:
                    engine.apply(a.observe(it))
                for r in self.run.recorders.values():
                    r.record(it)
        except (KeyboardInterrupt, RunError):
            raise
        except Exception as err:  # a target or an explorer failed mid-run
            raise RunError(_failure(k_before, err, self.out, chunk)) from err
        self.consistent = True
        k = engine.k
        if self.bar is not None and (k // 64 != k_before // 64 or k == end):
            self.bar.update(k - self.bar.n)
        if self.callback is not None and k % CALLBACK_EVERY == 0:
            self.callback(engine)
        if k % self.checkpoint_every == 0 and k < end:
            self.checkpoint()

    def end_segment(self, seg: Segment, wall_s: float) -> None:

        engine, recorders, seg_i = self.engine, self.run.recorders, self.seg_i
        row = {"segment": seg.name, "round": seg_i + 1, "iterations": seg.iterations,
               "first_iteration": self.starts[seg_i], "b": self.notes.get("segment_b")}
        for r in recorders.values():
            row.update(r.segment_row())
        row["wall_s"] = wall_s
        self.rows.append(row)
        if self.show_rows:
            self.write(self.table[1](row))
        view = SegmentView(index=seg_i, name=seg.name, iterations=seg.iterations,
                           last=seg_i == len(self.run.plan.segments) - 1, recorders=recorders,
                           schedule=engine.schedule, step_size=engine.step_size,
                           params=engine.params, metric=getattr(engine, "metric", None))
        for a in self.run.adaptors:
            update = a.end_segment(view)
            if update is not None:
                self.notes.update(update.note)
                resized = engine.apply(update)  # (the completed slot map, or None)
                if update.resize is not None:  # the ladder grew or shrank (chains = "auto")
                    follow_ladder(self.run, resized)
        self.seg_i, self.started = seg_i + 1, False
        if self.callback is not None:
            self.callback(engine)
        self.checkpoint()
