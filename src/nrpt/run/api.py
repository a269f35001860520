"""``nrpt.sample`` / ``nrpt.resume`` / ``nrpt.run_config``: build a run
(:func:`nrpt.run.build.build`) and execute it (:func:`nrpt.core.loop.execute`) in its run
folder (:mod:`nrpt.run.folder`): ``config.toml``, ``summary.json``, the streamed
``samples.npy`` / ``energies.npy`` / ``index.npy``, ``checkpoint.pt``, ``posterior.nc``,
figures, ``rounds.csv`` / ``report.txt`` (adaptive runs), ``adaptation.npz`` (SG runs).
A run holds the folder's lock and defers SIGINT / SIGTERM to an iteration boundary until its
outputs are written."""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nrpt.core import sharding as distributed
from nrpt.core.engine import PTEngine
from nrpt.core.loop import Interrupt, Outcome, Run, execute
from nrpt.report import text as report
from nrpt.report.health import SamplingWarning
from nrpt.report.summary import build_summary, format_summary
from nrpt.run import folder as rf
from nrpt.run.build import build, grown_chains
from nrpt.run.config import RunConfig
from nrpt.swap import Rule
from nrpt.targets.protocol import capabilities, optional_value

__all__ = ["sample", "resume", "figures", "run_config", "Result"]


@dataclass
class Result:
    """What a run returns.  ``samples`` are the slot-0 draws of the sampling segments
    (``[n, dim]``, or ``[R, n, dim]`` with R > 1 systems; for a fixed-length run those after
    the burn-in, ``summary["burn_in"]`` iterations; for an adaptive run the last round);
    ``index`` is the index process of the whole run ``[K + 1, R, P]``.  Per-system figures are
    scalars when R = 1 and lists otherwise; ``summary`` is what ``summary.json`` holds (its keys
    are also attributes: ``res.round_trips``); ``rows`` the per-segment report rows."""

    samples: np.ndarray
    energies: np.ndarray
    index: np.ndarray
    summary: dict[str, Any]
    config: RunConfig
    out: Path | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    engine: PTEngine | None = field(default=None, repr=False)
    recorders: dict[str, Any] = field(default_factory=dict, repr=False)
    #: what :meth:`to_inference_data` needs besides the above (first iteration, thin, row map)
    export: dict[str, Any] = field(default_factory=dict, repr=False)

    def __getattr__(self, name):
        summary = self.__dict__.get("summary", {})
        if name in summary:
            return summary[name]
        raise AttributeError(name)

    def __str__(self) -> str:
        return format_summary(self.summary, self.export.get("row_map"))

    def to_inference_data(self):
        """The run's draws and diagnostics as an in-memory ``arviz.InferenceData`` with the groups
        of ``posterior.nc`` (:mod:`nrpt.report.posterior_file`).  Needs ArviZ (``nrpt[arviz]``)."""
        try:
            import arviz as az
            import h5netcdf  # noqa: F401  (the engine the builder writes with)
            import xarray as xr
        except ImportError as err:
            raise ImportError(f"Result.to_inference_data needs ArviZ ({err.name} is not "
                              f"installed): pip install nrpt[arviz]") from None
        if self.engine is None or np.asarray(self.samples).size == 0:
            raise ValueError("this result holds no samples (a rank > 0 of a distributed run, "
                             "or a run stopped before its sampling segment)")
        import tempfile

        from nrpt.report.posterior_file import write_inference_data

        with tempfile.TemporaryDirectory(prefix="nrpt-idata-") as tmp:
            path = Path(tmp) / "posterior.nc"
            write_inference_data(path, samples=self.samples, energies=self.energies,
                                 recorders=self.recorders, engine=self.engine,
                                 summary=self.summary, index=self.index,
                                 first=int(self.export.get("first", 0)),
                                 thin=int(self.export.get("thin", 1)),
                                 row_map=self.export.get("row_map"))
            # every group read into memory before the file goes away
            import h5py  # (h5netcdf's own dependency: lists the groups)

            with h5py.File(path, "r") as f:
                names = [g for g in f.keys() if isinstance(f[g], h5py.Group)]
            groups = {}
            for g in names:
                with xr.open_dataset(path, group=g, engine="h5netcdf") as ds:
                    groups[g] = ds.load()
        return az.InferenceData(**groups)

    def trace(self) -> dict[str, np.ndarray]:
        """The adaptation trace of a stochastic-gradient run (``adaptation.npz``): ``k``,
        ``C``, ``learning_rates``, ``pair_rate``; empty for other runs."""
        t = self.recorders.get("trace")
        return t.arrays() if t is not None else {}


def _sets(path: Path, name: str) -> bool:
    """Whether the TOML file ``path`` holds the setting ``name`` (in any section)."""
    import tomllib

    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    return name in data or any(isinstance(v, dict) and name in v for v in data.values())


def interactive() -> bool:
    """Whether a person is likely watching: a notebook or IPython, the Python prompt, or a
    terminal on stderr (where the progress bar goes) -- and not under pytest."""
    import sys

    if os.environ.get("PYTEST_CURRENT_TEST"):
        return False
    ipython = sys.modules.get("IPython")
    if ipython is not None and getattr(ipython, "get_ipython", lambda: None)() is not None:
        return True
    if hasattr(sys, "ps1") or sys.flags.interactive:
        return True
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stream
        return False


def _progress(progress: bool | None) -> bool:
    if progress is None:
        return interactive()
    if not isinstance(progress, bool):
        raise ValueError(f"progress must be True, False or None (on when interactive); got "
                         f"{progress!r}")
    return progress


def _atomic_text(text: str, path: Path) -> None:
    rf.atomic_write(path, text, sync=False)


@contextlib.contextmanager
def _guard(out: Path | None):
    """Signals deferred to iteration boundaries (:class:`~nrpt.core.loop.Interrupt`) and the run
    folder locked, for a whole run: set-up, loop and outputs."""
    with Interrupt() as stop, (rf.RunLock(out) if out is not None else contextlib.nullcontext()):
        yield stop


def run_config(cfg: RunConfig, *, target=None, rule: Rule | None = None,
               progress: bool | None = False,
               callback=None, resume_from: str | os.PathLike | None = None,
               overwrite: bool = False, threads: int | str | None = None,
               explorer=None, scheme=None, adaptors=(), recorders=()) -> Result:
    """Run (or, with ``resume_from`` = a run folder, resume) the run ``cfg`` describes.

    ``rule``, ``explorer``, ``scheme`` (objects) replace the ones ``cfg`` names; ``adaptors``
    and ``recorders`` join the run's own.  ``overwrite=True`` replaces a run already in
    ``cfg.out`` (else an error).  Under ``torchrun`` rank 0 owns the folder and returns the
    result; other ranks return a :class:`Result` with empty arrays.  ``threads``: an int or
    ``"auto"`` (:func:`nrpt.core.loop.choose_threads`; default ``NRPT_THREADS``, else
    ``"auto"``).  ``progress``: a bar and per-segment rows (``None``: when
    :func:`interactive`)."""
    progress = _progress(progress)
    overwrite = _overwrite(overwrite)
    parts = {"rule": rule, "explorer": explorer, "scheme": scheme, "adaptors": list(adaptors),
             "recorders": list(recorders)}
    comm = _join(cfg, distributed.from_env(cfg.device))
    lead = comm is None or comm.rank == 0
    out = Path(cfg.out) if cfg.out else None
    created = _make_folder(out) if out is not None and lead else []
    resume_from = Path(resume_from) if resume_from is not None else None
    with _guard(out if lead else None) as stop:
        if not lead:
            return _follow(cfg, stop, comm, target=target, parts=parts, callback=callback,
                           threads=threads)
        # the folder is this run's to clean up if the start fails: empty of runs, or overwritten
        ours = out is not None and resume_from is None and (overwrite or not rf.run_files(out))
        try:
            return _run(cfg, stop, target=target, parts=parts, progress=progress,
                        callback=callback, resume_from=resume_from, overwrite=overwrite,
                        comm=comm, threads=threads)
        except BaseException:
            if ours and not rf.checkpoint_exists(out):
                _discard_failed_start(out, created)
            raise


def _make_folder(out: Path) -> list[Path]:
    """Create the run folder ``out`` (its name checked first); the folders this created,
    ``out`` first, then its parents."""
    rf.check_folder_name(out)  # before anything is created
    created = [p for p in (out, *out.parents) if not p.exists()]
    out.mkdir(parents=True, exist_ok=True)
    return created


def _discard_failed_start(out: Path, created: list[Path]) -> None:
    """A new run that failed before its first checkpoint (a bad target, setting or initial
    state): remove the files it wrote, and the folders it created if nothing else is in them,
    so the next attempt starts afresh (no ``--overwrite``).  Runs while the lock is held; a run
    that got as far as its first checkpoint stays, resumable (``nrpt resume``)."""
    with contextlib.suppress(OSError):
        rf.clear_run(out)
    if not created:
        return
    with contextlib.suppress(OSError):
        if {p.name for p in out.iterdir()} <= {rf.LOCK}:
            (out / rf.LOCK).unlink(missing_ok=True)
    for folder in created:  # out first, then the parents it made (each only if empty)
        try:
            folder.rmdir()
        except OSError:
            break


def _join(cfg: RunConfig, comm):
    """``comm`` once every rank runs the same settings, at most one rank per chain."""
    if comm is not None:
        distributed.check_world(comm.world, int(cfg.chains))
        comm.check_same(json.dumps(cfg.to_dict(), sort_keys=True, default=str), "config")
    return comm


def _follow(cfg: RunConfig, stop: Interrupt, comm, *, target, parts, callback,
            threads=None) -> Result:
    """A rank > 0 of a distributed run: the folder is rank 0's; this rank takes the checkpoint
    and the target file rank 0 validated, and runs its block of replicas."""
    told = comm.share(None)
    if told["error"] is not None:
        raise ValueError(f"rank 0 stopped the run: {told['error']}")
    ck = rf.load_file(Path(told["checkpoint"])) if told["checkpoint"] else None
    if target is None and told["target"] is not None:
        from nrpt.targets.protocol import load_target

        target = load_target(told["target"], **(cfg.target_options or {}))
    run = build(cfg, target=target, out=None, resume=ck is not None, comm=comm,
                burn_in=_pinned_burn_in(ck), **(parts or {}))
    outcome = execute(run, out=None, checkpoint_every=cfg.checkpoint_every, callback=callback,
                      resume=ck, stop=stop, threads=threads)
    run.engine.unshard()
    empty = np.zeros(0)
    return Result(samples=empty, energies=empty, index=empty,
                  summary={"rank": comm.rank, "interrupted": outcome.interrupted},
                  config=cfg, rows=outcome.rows, engine=run.engine, recorders=run.recorders)


def _prepare(cfg: RunConfig, target, resume_from: Path | None, overwrite: bool,
             record: dict | None, command: str = "resume"):
    """The folder checks of a run or a resumption: ``(checkpoint, its path, config hash,
    run record, target, target file spec)``; ``command``: the one a resumption's hints name
    (``resume``, or ``figures`` drawing a finished run)."""
    from nrpt.targets.protocol import import_file_target, load_target
    out = Path(cfg.out) if cfg.out else None
    ck = used = spec = None
    chash = rf.config_hash(cfg)
    opts = cfg.target_options or {}
    if resume_from is not None:
        if record is None:
            record = rf.read_run_record(resume_from)
        ck, used = rf.read_checkpoint(resume_from)
        rf.check_checkpoint(ck, used, record, cfg, chash)
        if record is not None:
            target, spec = _resume_target(cfg, record, target, resume_from, command)
        elif isinstance(target, (str, os.PathLike)):
            raise ValueError(f"target={os.fspath(target)!r}: {resume_from} has no run.json to "
                             f"check a target file against; resume it without target=")
    elif out is not None:
        present = rf.run_files(out)
        if present and not overwrite:
            raise ValueError(f"run folder {out} already holds a run ({', '.join(present[:4])}"
                             f"{', ...' if len(present) > 4 else ''}): resume it with `nrpt "
                             f"resume {out}`, choose another out, or pass overwrite=True "
                             f"(--overwrite) to replace it")
        record = rf.new_run_record(cfg, chash)
        if record["target"].get("path"):
            spec = record["target"]["spec"]  # the absolute path: config.toml names it so
            if target is None:  # the hashed file, and what it imports from its own tree
                target, modules = import_file_target(spec, **opts)
                record["target"]["modules"] = modules
        elif target is None:  # (a missing file: its error, before the old run goes)
            target = load_target(cfg.target, **opts)
        rf.clear_run(out)  # after the target loaded: a bad target file keeps the old run
    return ck, used, chash, record, target, spec


def _resume_target(cfg: RunConfig, record: dict, target, out: Path, command: str = "resume"):
    """The target of a resumption and its file spec: the object given (``target=``), else the
    target ``config.toml`` names -- a file only after :func:`nrpt.run.folder.check_target_file`
    matched it (and the modules it imports) to ``run.json``'s record, from the path config.toml
    or ``target=PATH`` / ``--target PATH`` names, never from run.json; and in every case a
    target whose fingerprint is the run's (:func:`nrpt.run.folder.check_fingerprint`)."""
    from nrpt.targets.protocol import import_file_target, load_target

    given = None
    if isinstance(target, (str, os.PathLike)):
        given, target = target, None
    spec = None
    if target is None:
        opts = cfg.target_options or {}
        from nrpt.targets.protocol import is_stan_spec

        if is_stan_spec(cfg.target):  # before compiling: a changed program or data is refused
            rf.check_stan_files(record, cfg.target, opts, out)
        spec = rf.check_target_file(record, cfg.target, out, given, command)
        if spec is not None:
            target, modules = import_file_target(spec, **opts)
            rf.check_target_modules(record, modules, spec.rpartition(":")[0])
        else:
            target = load_target(cfg.target, **opts)
    return target, spec


def _overwrite(value) -> bool:
    """``overwrite`` as a bool: True / False (a NumPy bool too), nothing else -- a truthy
    string such as ``'no'`` must never delete a run."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ValueError(f"overwrite must be True or False; got {value!r} "
                     f"({type(value).__name__})")


def _pinned_burn_in(ck: dict | None) -> int | None:
    """The burn-in a resumption keeps: the count its first run resolved (checkpoint header;
    0 for a checkpoint from before burn-in existed), so that extending the budget
    (``iterations``) never turns sampled iterations into warm-up; ``None`` for a new run."""
    if ck is None:
        return None
    return int((ck.get("header") or {}).get("burn_in", 0))


def _run(cfg: RunConfig, stop: Interrupt, *, target, parts, progress, callback,
         resume_from: Path | None, overwrite: bool = False, record: dict | None = None,
         comm=None, threads=None) -> Result:
    """The run itself (the caller holds the lock); ``record``: the folder's ``run.json``;
    ``comm``: this is rank 0 of a distributed run, which tells the others what it found."""
    ck, chash, record, target, spec = _prepare_told(cfg, target, resume_from, overwrite,
                                                    record, comm)
    out = Path(cfg.out) if cfg.out else None
    if ck is None and out is not None and spec and spec != cfg.target:
        # a new run's file target is the absolute path it was imported from (config.toml,
        # summary): what a resumption imports, from any directory (checked against run.json)
        cfg = cfg.replace(target=spec)
    objects = _given_objects(parts, ck, out)
    run = build(cfg, target=target, out=out, resume=ck is not None, comm=comm,
                burn_in=_pinned_burn_in(ck), chains=grown_chains(ck), **(parts or {}))
    record, chash = _records(cfg, run, out, ck, record, chash, resume_from)
    outcome = execute(run, out=out, checkpoint_every=cfg.checkpoint_every, progress=progress,
                      callback=callback, resume=ck,
                      header=_header(cfg, run, chash, record, objects), table=report.TABLE,
                      say=print if progress else None, stop=stop, threads=threads)
    if comm is not None:
        run.engine.unshard()  # the summary and outputs read the whole state
    return _finish(run, cfg, outcome, out)


def _prepare_told(cfg: RunConfig, target, resume_from: Path | None, overwrite: bool,
                  record: dict | None, comm):
    """:func:`_prepare` (``(checkpoint, config hash, run record, target, target file spec)``);
    in a distributed run the other ranks are told its checkpoint and target file, or its
    error."""
    try:
        ck, used, chash, record, target, spec = _prepare(cfg, target, resume_from, overwrite,
                                                         record)
    except Exception as err:
        if comm is not None:
            comm.share({"error": f"{type(err).__name__}: {err}", "checkpoint": None,
                        "target": None})
        raise
    if comm is not None:
        comm.share({"error": None, "checkpoint": str(used) if used else None, "target": spec})
    return ck, chash, record, target, spec


def _header(cfg: RunConfig, run: Run, chash: str, record: dict | None,
            objects: list[str]) -> dict:
    """The checkpoint header: settings, their hash, seed, budget, burn-in, the run record's id
    and target, and the roles given as objects (a resumption must be given them again)."""
    header = {"config": cfg.to_dict(), "config_hash": chash, "seed": cfg.seed,
              "iterations": cfg.iterations, "burn_in": run.plan.burn_in}
    if record is not None:
        header.update(run_id=record["run_id"], target=record.get("target"))
    if objects:
        header["objects"] = objects
    return header


def _records(cfg: RunConfig, run: Run, out: Path | None, ck, record, chash, resume_from):
    """The target's fingerprint checked (a resumption) or recorded (a new run); in a run
    folder ``config.toml`` and ``run.json`` written: ``(record, config hash)``."""
    if record is not None:
        if ck is not None:  # the run's own target (before anything is written)
            rf.check_fingerprint(record, run.facts["target_fingerprint"], resume_from)
        elif out is not None:
            record["target"]["fingerprint"] = run.facts["target_fingerprint"]
    if out is None:
        return record, chash
    geometric = run.facts.get("target_kind") == "geometric"
    cfg.write_toml(out / "config.toml", omit=("max_temperature",) if geometric else ())
    if ck is None:  # the hash a resumption will compare: of the settings as written
        chash = rf.config_hash(RunConfig.from_toml(out / "config.toml"))
        record = {**record, "config_hash": chash}
    if record is None:  # a folder from before run.json: it gets one now
        record = rf.new_run_record(cfg, chash)
    if ck is None or record.get("iterations") != cfg.iterations or \
            not (out / rf.RUN_JSON).exists():
        record = {**record, "iterations": cfg.iterations}
        rf.write_run_record(out, record)
    return record, chash


def _given_objects(parts: dict | None, ck: dict | None, out: Path | None,
                   command: str = "resume") -> list[str]:
    """The roles given as objects.  A run built with component objects is resumed (or drawn:
    ``command = "figures"``) only with objects given again (its folder's names alone would
    build other components: a silently different run)."""
    given = sorted(k for k, v in (parts or {}).items() if v)
    made = ((ck or {}).get("header") or {}).get("objects") or []
    if made and not given:
        how = "resume it" if command == "resume" else "draw its figures"
        raise ValueError(f"{out} was run with {', '.join(made)} given as objects: {how} with "
                         f"the same objects, nrpt.{command}({str(out)!r}, {made[0]}=...)")
    return given


def _finish(run: Run, cfg: RunConfig, outcome: Outcome, out: Path | None) -> Result:
    arrays, row_map = _run_arrays(run, outcome)
    samples = np.asarray(arrays["samples"])
    with _heap_frozen() as freeze_more:
        clock = _Clock()
        summary = build_summary(run, cfg, outcome, samples)
        clock.lap("summary")
        if out is not None:
            _write_outputs(out, run, cfg, outcome, summary, arrays, clock, freeze_more)
            # what the outputs cost (wall and CPU seconds each): the summary, posterior.nc,
            # the figures (docs/benchmarks.md, "Outputs"; volatile, like wall_time_s)
            summary["outputs_s"] = clock.laps
            _atomic_text(json.dumps(summary, indent=2) + "\n", out / "summary.json")
    return Result(samples=samples, energies=np.asarray(arrays["energies"]),
                  index=np.asarray(arrays["index"]), summary=summary, config=cfg, out=out,
                  rows=outcome.rows, engine=run.engine, recorders=run.recorders,
                  export={"first": int(arrays["first"]),
                          "thin": run.recorders["draws"].thin, "row_map": row_map})


def _run_arrays(run: Run, outcome: Outcome):
    """The run's record arrays (``samples``, ``energies``: its sampling segments'; ``index``:
    the whole run's; ``first``: the iteration the draws start from) and its row map (engine
    rows that are not the user's own systems, or None)."""
    draws = run.recorders["draws"]
    k = run.engine.k
    first, last = min(run.plan.sample_start, k), k
    segs, done = run.plan.segments, outcome.segments_done
    if done < len(segs) and len(segs) > 1 and segs[-1].reset and done >= 1 and \
            not run.plan.burn_in:
        # an interrupted adaptive run: the samples are the last completed round's (whose
        # statistics the summary reports)
        start = run.plan.starts()[done - 1]
        first, last = start, start + segs[done - 1].iterations
    arrays = draws.arrays(first, last)
    arrays["index"] = draws.arrays(k, k)["index"]  # the index process of the whole run
    arrays["first"] = first  # the iteration the draws start from (for posterior.nc)
    row_map = run.facts.get("row_map")  # engine rows that are not the user's own systems
    if row_map is not None:  # (samples.npy keeps every engine row)
        arrays = row_map.chains(arrays)
    return arrays, row_map


#: whether this process is the program ``nrpt`` (:func:`nrpt.run.cli.entry`), which ends with its
#: run: then what :func:`_heap_frozen` freezes stays frozen (nothing to hand back to a caller)
_PROGRAM = False


@contextlib.contextmanager
def _heap_frozen():
    """The objects alive on entry (torch's modules, the run's) left out of the garbage
    collector's passes until exit (``gc.freeze`` / ``gc.unfreeze``): the summary, posterior.nc
    and matplotlib's figures make many objects, and every full pass walked the whole heap
    (0.09 s of the outputs' CPU in a headline run; docs/benchmarks.md, "Outputs").  Young
    objects are still collected as usual (a figure's arrays are freed before the next is
    drawn); garbage among the frozen ones waits for the first full pass after exit.  Left
    alone when the collector is off or the caller froze objects of its own (``unfreeze``
    would release those too); in the program ``nrpt`` (``_PROGRAM``), which froze its imports
    itself and ends after the run, the objects are frozen and stay so.  Yields a function that
    freezes what was made since."""
    if gc.isenabled() and _PROGRAM:
        gc.freeze()
        yield gc.freeze
        return
    if not gc.isenabled() or gc.get_freeze_count():
        yield lambda: None
        return
    gc.freeze()
    try:
        yield gc.freeze  # (to freeze what was made since: matplotlib's modules, once imported)
    finally:
        gc.unfreeze()


class _Clock:
    """Wall and CPU (process) seconds between laps: ``laps[name] = {"wall": .., "cpu": ..}``."""

    def __init__(self) -> None:
        self.laps: dict[str, dict[str, float]] = {}
        self._t = (time.perf_counter(), time.process_time())

    def lap(self, name: str) -> None:
        t = (time.perf_counter(), time.process_time())
        self.laps[name] = {"wall": round(t[0] - self._t[0], 4),
                           "cpu": round(t[1] - self._t[1], 4)}
        self._t = t


def _write_outputs(out: Path, run: Run, cfg, outcome: Outcome, summary: dict, arrays,
                   clock: _Clock | None = None, freeze_more=lambda: None) -> None:
    clock = clock or _Clock()
    if len(run.plan.segments) > 1:
        with rf.atomic_path(out / "rounds.csv") as tmp:
            report.write_round_table(outcome.rows, tmp)
        _atomic_text("\n".join([report.ROW_HEADER] + [report.format_row(r)
                                                      for r in outcome.rows]) + "\n",
                     out / "report.txt")
    trace = run.recorders.get("trace")
    if trace is not None:
        with rf.atomic_path(out / "adaptation.npz") as tmp:
            np.savez(tmp, **trace.arrays())
    samples = np.asarray(arrays["samples"])
    if samples.size:
        _room_for(out / "posterior.nc", samples, arrays)
        try:  # an optional extra (arviz + a netCDF engine): never fail the run here
            summary["inference_data"] = report.export_inference_data(
                out / "posterior.nc", samples=samples, energies=np.asarray(arrays["energies"]),
                recorders=run.recorders, engine=run.engine, summary=summary,
                index=np.asarray(arrays["index"]), first=int(arrays["first"]),
                thin=run.recorders["draws"].thin, row_map=run.facts.get("row_map"))
        except Exception as err:  # noqa: BLE001 -- the summary and the rest must still be written
            if _disk_full(err):  # (HDF5 reports it as a RuntimeError): not "all is well"
                raise OSError(errno.ENOSPC, "no space left on device", str(out / "posterior.nc")) \
                    from err
            summary["inference_data"] = None
            summary["inference_data_error"] = f"{type(err).__name__}: {err}"
    clock.lap("posterior")  # (with the rounds' tables and adaptation.npz)
    if cfg.figures and run.engine.k > 0:
        _draw_figures(out, run, cfg.figures, outcome, summary, arrays, freeze_more)
        clock.lap("figures")


def _draw_figures(out: Path, run: Run, which: bool | str, outcome: Outcome, summary: dict,
                  arrays, freeze_more=lambda: None) -> list[str]:
    """Write the run's figures into ``out`` (:func:`nrpt.report.text.write_figures`), list them
    in ``summary["figures"]`` (a figure that failed: ``summary["figure_errors"]``)."""
    if _PROGRAM:  # (a process that ends after the run: no help text for matplotlib's set)
        from nrpt.report._matplotlib import without_set_docs

        without_set_docs()
    from nrpt.report import figures  # noqa: F401  (matplotlib, imported first: then
    freeze_more()  # its modules are left out of the collector's passes too)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # matplotlib font / layout chatter
        summary["figures"] = report.write_figures(
            out, run=run, summary=summary, samples=np.asarray(arrays["samples"]),
            index=np.asarray(arrays["index"]), rows=outcome.rows, which=which)
    return summary["figures"]


def _disk_full(err: BaseException) -> bool:
    """Whether ``err`` (from a writer such as HDF5, which may not raise an OSError) is a full
    disk or quota."""
    codes = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
    if isinstance(err, OSError) and err.errno in codes:
        return True
    text = str(err)
    return "errno = 28" in text or "No space left on device" in text or \
        "Disk quota exceeded" in text


def _room_for(path: Path, samples: np.ndarray, arrays) -> None:
    """Refuse to start ``posterior.nc`` on a disk without room for it (about the size of the
    arrays it holds, plus a margin): HDF5 on a full disk can crash the process."""
    import shutil

    need = samples.nbytes + np.asarray(arrays["energies"]).nbytes + \
        np.asarray(arrays["index"]).nbytes + (1 << 20)
    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        return
    if free < need:
        raise OSError(errno.ENOSPC, f"no space left on device (it needs about "
                                    f"{need / 2 ** 20:.1f} MiB, {free / 2 ** 20:.1f} MiB free)",
                      str(path))


def sample(target="twenty-five-modes", *, progress: bool | None = None,
           rule: Rule | None = None,
           callback=None, overwrite: bool = False, threads: int | str | None = None,
           adaptors=(), recorders=(), **options) -> Result:
    """Run parallel tempering on ``target``.

    ``target``: a built-in name, ``"path/to/file.py:NAME"``, or an object following the target
    protocol.  ``options``: :class:`~nrpt.run.config.RunConfig` settings (a setting that does
    not apply is an error).  ``explorer`` / ``scheme`` / ``rule`` may be objects (registered
    names are shorthand for them; an unregistered exact explorer's or scheme's class is
    registered under its ``name``); ``adaptors`` / ``recorders`` objects
    (:class:`nrpt.roles.AdaptorBase` / :class:`nrpt.roles.RecorderBase`) run after the run's own,
    a recorder's ``summary()`` joining the summary under its ``name``.  ``overwrite``,
    ``threads``, ``progress``: as :func:`run_config` (``progress=None``: on when interactive).

    Example::

        res = nrpt.sample("twenty-five-modes", chains=10, iterations=20_000, scheme="deo")
        res.samples.shape        # (18000, 2): slot-0 draws after the burn-in (0.1)
        res.round_trips, res.barrier, res.swap_acceptance"""
    parts = _objects(options)
    obj = None
    if isinstance(target, str):
        options["target"] = target
    else:
        obj = target
        options["target"] = capabilities(target).name  # a str name, else the class name
        _target_defaults(obj, options)
    cfg = RunConfig(**options)
    return run_config(cfg, target=obj, rule=rule, progress=progress, callback=callback,
                      overwrite=overwrite, threads=threads, adaptors=adaptors,
                      recorders=recorders, **parts)


def _target_defaults(target, options: dict) -> None:
    """A target's ``default_settings`` (e.g. a Stan program's: MALA with a per-slot
    preconditioner) for an adaptive run (``rounds``): :func:`apply_target_defaults`."""
    own = optional_value(target, "default_settings")
    if own:
        apply_target_defaults(dict(own), options, f"target {options.get('target')!r}")


class DefaultsWarning(UserWarning):
    """A target's default setting that a run's explicit choice leaves out (the setting, its
    value and why are in the message)."""


def apply_target_defaults(own: dict, options: dict, who: str) -> list[str]:
    """Join a target's ``default_settings`` ``own`` to an adaptive run's ``options`` (the
    settings given; a given one wins) and return the names left out, each said in a
    :class:`DefaultsWarning`.  An explicit ``explorer`` replaces the default one only:
    settings no explorer declares (``chains``, ``min_chains``, a reference...) still join,
    and an explorer's option (``precondition``, ``step_size``...) joins where the chosen
    explorer declares it (the registry's declarations), else it is left out and said.  Given
    ``chains``, ``min_chains`` / ``max_chains`` are the user's ladder's, not defaults.  Nothing
    joins a run without ``rounds`` (the defaults are adaptive settings)."""
    if options.get("rounds") is None:
        return []
    from nrpt.run import registry
    from nrpt.run.config import declarations

    explorer = options.get("explorer")
    chosen_chains = options.get("chains") is not None
    mine: set[str] | None = None  # the default explorer (or it named): every setting joins
    of_explorers: set[str] = set()
    if explorer is not None and explorer != own.get("explorer"):
        mine = set(registry.entry("explorer", explorer, what="explorer").options)
        of_explorers = {o.name for o, role, _ in declarations() if role == "explorer"}
    if explorer is None and "explorer" in own:
        options["explorer"] = own["explorer"]
    dropped = []
    for name, value in own.items():
        if name == "explorer" or name in options:
            continue  # (an explicit explorer is the user's choice: nothing to say)
        if chosen_chains and name in ("min_chains", "max_chains"):
            continue
        if mine is not None and name in of_explorers and name not in mine:
            dropped.append(name)
            warnings.warn(f"{who}: its default setting {name} = {value!r} (for explorer "
                          f"{own.get('explorer')!r}) is not applied: explorer {explorer!r} "
                          f"does not take {name}", DefaultsWarning, stacklevel=4)
            continue
        options[name] = value
    return dropped


def _objects(options: dict) -> dict:
    """The explorer / scheme given as objects (``options`` then holds their names)."""
    parts = {}
    for role in ("explorer", "scheme"):
        given = options.get(role)
        if given is not None and not isinstance(given, str):
            options[role] = _registered_name(role, given)
            parts[role] = given
    window = getattr(parts.get("scheme"), "window", None)
    if options.get("scheme") == "deo-w" and window is not None:
        options.setdefault("window", window)
    return parts


def _registered_name(role: str, obj) -> str:
    """The registry name of ``obj``'s class: its ``name`` (registered now if new)."""
    from nrpt.run import registry

    name = getattr(obj, "name", "")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{role}: an object needs a non-empty string attribute name (its "
                         f"registry name); got {type(obj).__name__} with name {name!r}")
    if name in registry.names(role):
        cls = registry.entry(role, name).load()
        if isinstance(cls, type) and isinstance(obj, cls):
            return name
        raise ValueError(f"{role}: name {name!r} is registered for {cls!r}, not "
                         f"{type(obj).__name__}: give your class another name")
    if role == "explorer":
        from nrpt.explorers.sgmcmc import SGExplorer

        if isinstance(obj, SGExplorer):
            raise ValueError(f"explorer: register the stochastic-gradient explorer {name!r} "
                             f"first (nrpt.run.registry.register('explorer', {name!r}, "
                             f"{type(obj).__name__}, tags=('sg', ...)))")
        tags = ("exact", "gradient") if getattr(obj, "uses_gradient", False) else ("exact",)
        own = [getattr(o, "name", o) for o in getattr(obj, "options", ())]
        registry.register(role, name, type(obj), tags=tags,
                          options=() if "step_size" in own else ("step_size",),
                          summary=f"{type(obj).__name__} (registered from an object)")
    else:
        registry.register(role, name, type(obj),
                          summary=f"{type(obj).__name__} (registered from an object)")
    return name


def _resumed_config(out: Path, record: dict | None, iterations: int | None) -> RunConfig:
    """The settings of the run in ``out`` (``config.toml``, checked against the run record's
    budget), with ``out`` and a larger budget ``iterations`` applied."""
    cfg = RunConfig.from_toml(out / "config.toml")
    changes: dict[str, Any] = {"out": str(out)}
    if cfg.rounds is None and not _sets(out / "config.toml", "burn_in"):
        changes["burn_in"] = 0  # a run from before burn-in existed: it had none
    if record is not None and cfg.iterations != record.get("iterations"):
        raise ValueError(f"{out / 'config.toml'} says iterations = {cfg.iterations} but the "
                         f"run's budget is {record.get('iterations')} (run.json): a run's "
                         f"settings cannot be edited; extend its budget with `nrpt resume "
                         f"{out} --iterations N` (resume(iterations=N))")
    if iterations is not None:
        if getattr(cfg, "rounds", None) is not None:
            raise ValueError("iterations: an adaptive run is extended with more rounds, not "
                             "iterations")
        if iterations < cfg.iterations:
            raise ValueError(f"iterations must be >= the run's {cfg.iterations}; got "
                             f"{iterations}")
        changes["iterations"] = iterations
    return cfg.replace(**changes)


def resume(out: str | os.PathLike, *, progress: bool | None = None, target=None,
           iterations: int | None = None, callback=None,
           threads: int | str | None = None, rule=None, explorer=None, scheme=None,
           adaptors=(), recorders=()) -> Result:
    """Continue the run in folder ``out`` from its last checkpoint, to its configured length or
    to ``iterations`` (fixed-length runs).

    Refuses with a ``ValueError`` naming it: an edited setting, another run's checkpoint, a
    changed target file, a damaged record file, a target whose fingerprint
    (:func:`nrpt.targets.protocol.fingerprint`) is not the run's.  ``target``: the run's target
    object or file path when not where ``config.toml`` says.  A run started with component
    objects needs the same objects again."""
    out = Path(out)
    parts = {"rule": rule, "explorer": explorer, "scheme": scheme, "adaptors": list(adaptors),
             "recorders": list(recorders)}
    if not (out / "config.toml").exists() or not rf.checkpoint_exists(out):
        raise FileNotFoundError(f"{out} has no config.toml/{rf.CHECKPOINT} to resume from")
    comm = distributed.from_env(RunConfig.from_toml(out / "config.toml").device)
    lead = comm is None or comm.rank == 0
    with _guard(out if lead else None) as stop:
        record = rf.read_run_record(out)
        cfg = _resumed_config(out, record, iterations)
        if _join(cfg, comm) is not None and not lead:  # (a target path: rank 0 checks it)
            return _follow(cfg, stop, comm,
                           target=None if isinstance(target, (str, os.PathLike)) else target,
                           parts=parts, callback=callback, threads=threads)
        return _run(cfg, stop, target=target, parts=parts, progress=_progress(progress) and lead,
                    callback=callback, resume_from=out, record=record, comm=comm,
                    threads=threads)


def figures(out: str | os.PathLike, *, which: bool | str = True, target=None, rule=None,
            explorer=None, scheme=None, adaptors=(), recorders=()) -> list[str]:
    """Draw the figures of the finished run in folder ``out``, after the fact: the files a run
    with ``figures = which`` draws at its end (:func:`nrpt.report.text.write_figures`), byte for
    byte, from the run's last checkpoint and record files; returns their names and lists them
    in the folder's ``summary.json``.  Nothing else in the folder changes.

    ``which``: ``True`` (the main figures) or ``"all"`` (with the trace and rank plots).  A run
    does not draw its figures unless told (``figures = false`` is the default: matplotlib's
    import and drawing cost more than the outputs of a short run together); this draws them
    when wanted.  Refuses (``ValueError``) a run that has not finished (``nrpt resume`` it
    first), and everything :func:`resume` refuses: another run's checkpoint, a changed target
    file, a target whose fingerprint is not the run's.  ``target`` and the component objects:
    as :func:`resume`."""
    out = Path(out)
    if which is not True and not (isinstance(which, str) and which == "all"):
        raise ValueError(f"which must be true or all; got {which!r}")
    parts = {"rule": rule, "explorer": explorer, "scheme": scheme, "adaptors": list(adaptors),
             "recorders": list(recorders)}
    from nrpt.deep.cli import is_deep_run

    if is_deep_run(out):
        raise ValueError(f"{out} is a `nrpt deep` run folder, which has its figures already "
                         f"(`nrpt deep` draws them at its end)")
    if not (out / "config.toml").exists() or not rf.checkpoint_exists(out):
        raise FileNotFoundError(f"{out} has no config.toml/{rf.CHECKPOINT}: not a run folder "
                                f"(`nrpt run --out DIR` makes one)")
    # the folder's lock only: no iteration runs here, so Ctrl-C stops the command at once (a
    # figure is written whole or not at all)
    with rf.RunLock(out), warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)  # (the run's summary said them)
        try:
            record = rf.read_run_record(out)
            cfg = _resumed_config(out, record, None)
            # (the checks of a resumption, their hints naming this command)
            ck, _used, chash, record, target, _spec = _prepare(cfg, target, out, False, record,
                                                               command="figures")
            objects = _given_objects(parts, ck, out, "figures")
            run = build(cfg, target=target, out=out, resume=True, comm=None,
                        burn_in=_pinned_burn_in(ck), chains=grown_chains(ck), **parts)
            if record is not None:
                rf.check_fingerprint(record, run.facts["target_fingerprint"], out)
        except ValueError as err:
            raise ValueError(f"cannot draw the figures of {out}: {err}") from None
        k = int(ck["engine"]["k"])
        if int(ck["segment"]) < len(run.plan.segments) or k != run.plan.total:
            # (an interrupted run, or an extension -- `resume --iterations N` -- that stopped
            # before its first checkpoint: execute would go on with it)
            raise ValueError(f"{out}: the run has not finished (its last checkpoint is at "
                             f"iteration {k} of the {run.plan.total} its settings ask for): "
                             f"`nrpt resume {out}` finishes it, then draw its figures")
        with Interrupt() as stop:  # (no iteration runs to read a signal: it is raised here)
            outcome = execute(run, out=out, checkpoint_every=cfg.checkpoint_every, resume=ck,
                              header=_header(cfg, run, chash, record, objects), stop=stop)
        if stop.flag:
            raise KeyboardInterrupt
        arrays, _ = _run_arrays(run, outcome)
        summary = build_summary(run, cfg, outcome, np.asarray(arrays["samples"]))
        names = _draw_figures(out, run, which, outcome, summary, arrays) if k > 0 else []
        _note_figures(out / "summary.json", summary)
    return names


def _note_figures(path: Path, summary: dict) -> None:
    """The figures just drawn (and any that failed) named in the run's ``summary.json``, after
    them those it named before that are still in the folder; a missing or unreadable file is
    left as it is."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if not isinstance(saved, dict):
        return
    drawn = list(summary.get("figures", []))
    # figures drawn earlier (e.g. "all"'s trace and rank plots) stay listed while they exist
    kept = [n for n in saved.get("figures") or [] if isinstance(n, str) and n not in drawn
            and Path(n).name == n and (path.parent / n).is_file()]
    saved["figures"] = drawn + kept
    saved.pop("figure_errors", None)
    if summary.get("figure_errors"):
        saved["figure_errors"] = summary["figure_errors"]
    _atomic_text(json.dumps(saved, indent=2) + "\n", path)
