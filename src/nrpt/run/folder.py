"""The run folder's bookkeeping: one writer at a time, atomic writes, verified checkpoints.

=========================  ================================================================
``run.json``               run id, seed, settings hash, budget, the target's fingerprint and
                           for a ``file.py:NAME`` target its absolute path and the sha256 of
                           it and its local modules (a record, never code to import)
``checkpoint.pt``          the newest checkpoint (:func:`write_checkpoint`)
``checkpoint.json``        its sidecar: size, sha256, iteration, the valid rows of the records
``checkpoint.prev.pt``     the checkpoint before it, and its sidecar ``checkpoint.prev.json``
``.nrpt.lock``             locked (``flock``) by the process running or resuming the run
=========================  ================================================================

Files are written by :func:`atomic_write` (temporary name, then rename); files changed in
place are opened by :func:`open_fd` (no symlinks, one link).  A write's ``OSError`` names the
file (:func:`os_error_message`).  A damaged newest checkpoint falls back to the previous one
with a :class:`CheckpointWarning`; a checkpoint, ``config.toml`` or target file of another run
is refused with a ``ValueError``.  Writing primitives are re-exported from :mod:`nrpt.files`."""

from __future__ import annotations

import contextlib
import datetime
import errno
import hashlib
import json
import os
import pickle
import uuid
import warnings
from pathlib import Path
from typing import Any

import torch

from nrpt.files import (
    CHECKPOINT,
    PREV_CHECKPOINT,
    PREV_SIDECAR,
    SIDECAR,
    UnsafeFile,
    atomic_path,
    atomic_write,
    open_fd,
    temporary,
    write_checkpoint,
)

try:
    import fcntl
except ImportError:  # not POSIX: runs without the folder lock
    fcntl = None

__all__ = ["CHECKPOINT", "PREV_CHECKPOINT", "SIDECAR", "PREV_SIDECAR", "RUN_JSON", "LOCK",
           "RECORD_FILES", "RunFolderBusy", "CheckpointWarning", "UnsafeCheckpoint", "UnsafeFile",
           "open_fd", "check_folder_name", "os_error_message",
           "atomic_write", "atomic_path",
           "RunLock", "run_files", "clear_run", "config_hash", "target_record",
           "stan_files", "check_stan_files",
           "check_target_file", "check_target_modules", "check_fingerprint",
           "new_run_record", "write_run_record", "read_run_record",
           "write_checkpoint", "read_checkpoint", "check_checkpoint", "checkpoint_exists",
           "load_file", "sha256_file", "temporary", "save_verified", "load_verified",
           "run_kind"]

RUN_JSON = "run.json"
LOCK = ".nrpt.lock"
RECORD_FILES = ("samples.npy", "energies.npy", "index.npy")
#: every file an nrpt run writes into its folder (what ``overwrite`` removes)
RUN_FILES = (RUN_JSON, "config.toml", CHECKPOINT, SIDECAR, PREV_CHECKPOINT, PREV_SIDECAR,
             *RECORD_FILES, "summary.json", "posterior.nc", "adaptation.npz", "rounds.csv",
             "report.txt", "density.png", "index_process.png", "swap_acceptance.png",
             "adaptation.png", "local_barrier.png", "schedules.png", "trace.png", "rank.png")
#: settings that may differ between a run and its resumption (the folder's path, the budget)
_NOT_HASHED = ("out", "iterations")


class RunFolderBusy(RuntimeError):
    """Another process holds the run folder's lock."""


class CheckpointWarning(UserWarning):
    """The newest checkpoint was damaged and the previous one is used instead."""


class UnsafeCheckpoint(ValueError):
    """A checkpoint file that only an unrestricted unpickler would load: never loaded."""


def check_folder_name(out: str | os.PathLike) -> None:
    """Refuse a run folder path with a control character (a newline, a tab, ESC...): config.toml
    and run.json record the path, and such names are almost always a quoting accident.
    Checked before anything is created."""
    text = os.fspath(out)
    bad = sorted({c for c in text if ord(c) < 32 or ord(c) == 127})
    if bad:
        raise ValueError(f"out: the run folder name {text!r} holds the control character(s) "
                         f"{', '.join(repr(c) for c in bad)}; choose a name without control "
                         f"characters (newlines, tabs, escapes)")


def os_error_message(err: OSError, out: str | os.PathLike | None = None) -> str:
    """One line for an OS error of a run: the file, the cause and what to do (a full disk:
    free space, then resume from the last checkpoint, which a failed write leaves intact)."""
    name = err.filename if err.filename is not None else "a file of the run"
    if getattr(err, "filename2", None):
        name = f"{name} -> {err.filename2}"
    cause = err.strerror or str(err) or type(err).__name__
    text = f"{name}: {cause}"
    resumable = False
    with contextlib.suppress(OSError, TypeError):
        resumable = out is not None and checkpoint_exists(Path(out))
    if err.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        text += (f" (disk full or over quota): free space, then continue with `nrpt resume "
                 f"{out}` (its last checkpoint is intact)" if resumable else
                 " (disk full or over quota): free space and run again")
    elif err.errno == errno.EROFS:
        text += ": choose an out folder on a writable file system"
    elif err.errno == errno.ENAMETOOLONG:
        text += ": choose a shorter out folder name"
    elif err.errno in (errno.EACCES, errno.EPERM):
        text += ": check the folder's permissions, or choose another out folder"
    elif err.errno == errno.EEXIST:
        text += ": remove it or choose another out folder"
    elif resumable:
        text += f"; the last checkpoint is intact: fix the cause, then `nrpt resume {out}`"
    return text


def sha256_file(path: str | os.PathLike) -> tuple[str, int]:
    """``(sha256 hex, size in bytes)`` of a file, read in chunks."""
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
            n += len(block)
    return h.hexdigest(), n


# ------------------------------------------------------------------------------ the lock
class RunLock:
    """An exclusive ``flock`` on ``.nrpt.lock`` in the run folder for as long as the block
    runs: a second run or resume of the same folder fails at once with
    :class:`RunFolderBusy` (the lock goes with the process, also when it is killed)."""

    def __init__(self, out: str | os.PathLike):
        self.out = Path(out)
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        path = self.out / LOCK
        if fcntl is None:
            return self
        fd = open_fd(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
            os.close(fd)
            if err.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                warnings.warn(f"cannot lock {path} ({err}): this file system does not support "
                              f"flock; nothing stops a second process from using {self.out}",
                              RuntimeWarning, stacklevel=2)
                return self
            who = f" (pid {holder})" if holder else ""
            raise RunFolderBusy(f"run folder {self.out} is in use by another nrpt process{who}: "
                                f"wait for it to finish, or stop it (Ctrl-C / kill: it "
                                f"checkpoints) before running or resuming this folder") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        _remove_stale_temporaries(self.out)
        return self

    def __exit__(self, *exc) -> bool:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        return False


def _remove_stale_temporaries(out: Path) -> None:
    """Temporary files a killed writer left (we hold the lock: nobody is writing them)."""
    for p in out.glob(".*.tmp*"):
        if any(p.name.startswith(f".{name}.") for name in RUN_FILES):
            with contextlib.suppress(OSError):
                p.unlink()


def run_files(out: Path) -> list[str]:
    """The nrpt run files present in ``out``."""
    return [name for name in RUN_FILES if (out / name).exists()]


def clear_run(out: Path) -> None:
    """Remove the run files of a previous run (``overwrite``); other files stay."""
    for name in run_files(out):
        (out / name).unlink()


# ------------------------------------------------------------------------------ run identity
def config_hash(cfg) -> str:
    """sha256 of the run's resolved settings, less those a resumption may change and those
    that do not apply (``None``: a setting added in a later version does not change it)."""
    data = {k: v for k, v in cfg.to_dict().items() if k not in _NOT_HASHED and v is not None
            and not (k == "burn_in" and v == 0)}  # (burn_in 0: what runs before it did)
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def _settings_diff(then: dict, now: dict) -> list[str]:
    keys = sorted((set(then) | set(now)) - set(_NOT_HASHED))
    return [f"{k} = {then.get(k)!r} in the run, {now.get(k)!r} now" for k in keys
            if then.get(k) != now.get(k)]


def target_record(spec: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """What ``run.json`` keeps about the target (a record to check a resumption against, never
    a source of code to import): ``spec`` as ``config.toml`` names it; for a Stan program
    (``model.stan``, its data file in ``options["data"]``) :func:`stan_files`; for ``file.py:NAME``
    the file's absolute path, sha256 and size; the caller adds ``modules`` (the files it
    imported from its own directory tree, :func:`nrpt.targets.protocol.local_modules`) and
    ``fingerprint`` (:func:`nrpt.targets.protocol.fingerprint`) once the target is loaded."""
    from nrpt.targets.protocol import file_spec, is_stan_spec

    if is_stan_spec(spec):
        return {"spec": spec, "stan": stan_files(spec, options)}
    parsed = file_spec(spec)
    if parsed is None:
        return {"spec": spec}
    path, attr = parsed
    path = path.expanduser().resolve()
    if not path.is_file():
        return {"spec": spec}  # load_target reports the missing file
    sha, size = sha256_file(path)
    return {"spec": f"{path}:{attr}", "given": spec, "path": str(path), "attribute": attr,
            "sha256": sha, "size": size}


def stan_files(spec: str, options: dict[str, Any] | None) -> dict[str, Any]:
    """The files of a Stan target: the program's path and sha256, and the data's (a JSON file
    named by ``options["data"]``: its path and sha256; data given as a table in the config:
    the sha256 of its JSON)."""
    out: dict[str, Any] = {"program": spec, "program_sha256": None, "data": None,
                           "data_sha256": None}
    path = Path(spec).expanduser()
    if path.is_file():
        out["program_sha256"] = sha256_file(path)[0]
    data = (options or {}).get("data")
    if isinstance(data, str | os.PathLike):
        out["data"] = os.fspath(data)
        dpath = Path(data).expanduser()
        if dpath.is_file():
            out["data_sha256"] = sha256_file(dpath)[0]
    elif data is not None:
        out["data"] = "<table>"
        out["data_sha256"] = hashlib.sha256(json.dumps(data, sort_keys=True, default=str)
                                            .encode()).hexdigest()
    return out


def check_stan_files(record: dict[str, Any], spec: str, options: dict[str, Any] | None,
                     out: Path) -> None:
    """A resumed Stan run's program and data files are the ones it started with (sha256 in
    ``run.json``), checked before the program is compiled."""
    tgt = record.get("target") or {}
    then = tgt.get("stan") if isinstance(tgt, dict) else None
    if not isinstance(then, dict):
        return  # a run.json without the record: the target's fingerprint still checks it
    now = stan_files(spec, options)
    for what, key in (("Stan program", "program"), ("data", "data")):
        if then.get(f"{key}_sha256") != now.get(f"{key}_sha256"):
            raise ValueError(
                f"the run's {what} {now.get(key) or then.get(key)!r} changed since the run "
                f"started (sha256 {str(then.get(f'{key}_sha256'))[:16]}... then, "
                f"{str(now.get(f'{key}_sha256'))[:16]}... now): resuming would continue the "
                f"chain on another posterior; restore the file, or start a new run "
                f"(overwrite=True / --overwrite)")


def _tampered(out: Path, what: str) -> ValueError:
    return ValueError(f"{out / RUN_JSON} and {out / 'config.toml'} disagree about the target "
                      f"({what}): the folder was edited; nrpt imports a target file only from "
                      f"the path config.toml names (or resume's --target / target=), never "
                      f"from run.json; restore both files or start a new run")


def check_target_file(record: dict[str, Any], spec: str, out: Path,
                      given: str | os.PathLike | None = None,
                      command: str = "resume") -> str | None:
    """For a ``file.py:NAME`` target, the absolute spec to load after checking the file (and its
    local modules) against the sha256s in ``record`` (``run.json``); None for other targets.
    The file is ``spec``'s (relative to the current directory) or ``given`` (a path, or
    ``path:NAME`` with the run's NAME).  ``command``: what the hints tell to run again
    (``resume`` or ``figures``, which both take ``--target PATH``)."""
    from nrpt.targets.protocol import file_spec, is_stan_spec

    tgt = record.get("target") or {}
    if not isinstance(tgt, dict):
        raise _tampered(out, "run.json's target is not a table")
    parsed = file_spec(spec)
    if parsed is None:  # a built-in target: no file given, and run.json records none
        if given is not None and is_stan_spec(spec):
            raise ValueError(f"target={str(given)!r}: the run's target is the Stan program "
                             f"{spec!r} that config.toml names (its path and its data's are "
                             f"relative to the directory the run started in, checked against "
                             f"run.json's sha256); resume from that directory without a "
                             f"target path")
        if given is not None:
            raise ValueError(f"target={str(given)!r}: the run's target is {spec!r} "
                             f"(config.toml), not a file; resume it without a target path")
        if any(k in tgt for k in ("path", "sha256", "modules")) or tgt.get("spec", spec) != spec:
            raise _tampered(out, f"config.toml names {spec!r}, run.json records the file "
                                 f"{tgt.get('path', tgt.get('spec'))!r}")
        return None
    if "sha256" not in tgt:
        _check_spec_recorded(tgt, spec, out)  # a run.json from before file hashes, or damaged
        raise ValueError(f"{out / RUN_JSON} holds no sha256 of the target file {spec!r}: "
                         f"nothing to check it against; start a new run")
    path, attr = parsed
    if given is None:
        path = _configured_file(tgt, spec, path, out, command)
    else:
        path = _given_file(os.fspath(given), spec, attr)
    sha, _ = sha256_file(path)
    if sha != tgt["sha256"]:
        raise ValueError(f"the run's target file {path} changed since the run started (sha256 "
                         f"{str(tgt['sha256'])[:16]}... then, {sha[:16]}... now): resuming would "
                         f"run different code in the same chain; restore the file, or start a "
                         f"new run (overwrite=True / --overwrite)")
    _check_module_hashes(tgt.get("modules") or {}, path, out)
    return f"{path}:{attr}"


def _check_spec_recorded(tgt: dict[str, Any], spec: str, out: Path) -> None:
    if tgt.get("spec") != spec:
        raise _tampered(out, f"config.toml names {spec!r}, run.json records {tgt.get('spec')!r}")


_TARGET_HINT = ("run `nrpt {command}` from the directory the run started in, or name the file "
                "with `nrpt {command} {out} --target PATH` ({command}(target=PATH)); it must be "
                "the file the run started with")


def _configured_file(tgt: dict[str, Any], spec: str, path: Path, out: Path,
                     command: str) -> Path:
    """The file ``config.toml``'s ``spec`` names, resolved from the current directory; it must
    be where ``run.json`` says the run started with it."""
    _check_spec_recorded(tgt, spec, out)
    path = path.expanduser()
    hint = _TARGET_HINT.format(out=out, command=command)
    if not path.is_file():
        was = (f" (it was {tgt.get('path')} when the run started)"
               if tgt.get("path") and tgt.get("path") != str(path.absolute()) else "")
        raise ValueError(f"the run's target file {path} (config.toml) does not exist"
                         f"{'' if path.is_absolute() else ' in ' + os.getcwd()}{was}: {hint}")
    path = path.resolve()
    if tgt.get("path") != str(path):
        raise ValueError(f"the run's target {spec!r} (config.toml) is {path} from "
                         f"{os.getcwd()}, but run.json records that the run started with "
                         f"{tgt.get('path')!r}: {hint}")
    return path


def _given_file(text: str, spec: str, attr: str) -> Path:
    """The file resume's ``--target`` / ``target=`` names (``path`` or ``path:NAME``)."""
    from nrpt.targets.protocol import file_spec

    other = file_spec(text)
    if other is not None:
        path, other_attr = other
        if other_attr != attr:
            raise ValueError(f"target={text!r}: the run samples {attr!r} of its file "
                             f"(config.toml {spec!r}), not {other_attr!r}")
    elif text.endswith(".py"):
        path = Path(text)
    else:
        raise ValueError(f"target={text!r}: name the run's target file, path/to/file.py or "
                         f"path/to/file.py:{attr}")
    path = path.expanduser()
    if not path.is_file():
        raise ValueError(f"target file {path} (target=/--target) does not exist")
    return path.resolve()


def _check_module_hashes(modules: Any, path: Path, out: Path) -> None:
    """The modules the target file imported from its tree when the run started are unchanged."""
    if not isinstance(modules, dict):
        raise _tampered(out, "run.json's target modules are not a table")
    for rel, then in sorted(modules.items()):
        parts = Path(rel).parts
        if not parts or Path(rel).is_absolute() or ".." in parts or "\x00" in rel:
            raise _tampered(out, f"run.json names the module {rel!r} outside the target's "
                                 f"directory")
        file = path.parent / rel
        if not file.is_file():
            raise ValueError(f"the module {file} that the run's target file {path.name} "
                             f"imported when the run started no longer exists: restore it to "
                             f"resume (resuming would run different code in the same chain)")
        now, _ = sha256_file(file)
        if now != then:
            raise ValueError(f"the module {file} that the run's target file {path.name} "
                             f"imports changed since the run started (sha256 {str(then)[:16]}... "
                             f"then, {now[:16]}... now): resuming would run different code in "
                             f"the same chain; restore the module, or start a new run "
                             f"(overwrite=True / --overwrite)")


def check_target_modules(record: dict[str, Any], modules: dict[str, str], path: str) -> None:
    """After the import: the target file imported no module of its tree that the run did not."""
    tgt = record.get("target")
    then = tgt.get("modules") if isinstance(tgt, dict) else None
    if then is None:
        return  # a run.json from before module records
    extra = sorted(set(modules) - set(then if isinstance(then, dict) else ()))
    if extra:
        raise ValueError(f"the run's target file {path} now imports {', '.join(extra)} from "
                         f"its directory, which it did not when the run started: resuming "
                         f"would run different code in the same chain; start a new run")


def check_fingerprint(record: dict[str, Any], now: dict[str, Any], out: Path) -> None:
    """The target of a resumption is the run's own (:func:`nrpt.targets.protocol.fingerprint`)."""
    from nrpt.targets.protocol import fingerprint_differences

    tgt = record.get("target")
    then = tgt.get("fingerprint") if isinstance(tgt, dict) else tgt
    if then is None:
        return  # a run.json from before fingerprints
    if not isinstance(then, dict):
        raise ValueError(f"{out / RUN_JSON}: the target's record is damaged (not a table); "
                         f"restore run.json or start a new run")
    try:
        diff = fingerprint_differences(then, now)
    except (TypeError, ValueError, AttributeError) as err:
        raise ValueError(f"{out / RUN_JSON}: the target's fingerprint is damaged ({err}); "
                         f"restore run.json or start a new run") from None
    if diff:
        raise ValueError(f"the target given to resume {out} is not the run's target "
                         f"({'; '.join(diff)}; recorded in {RUN_JSON}): resuming would "
                         f"continue the chain on another distribution; pass the run's own "
                         f"target, or start a new run (overwrite=True / --overwrite)")


def new_run_record(cfg, chash: str) -> dict[str, Any]:
    from nrpt import __version__

    return {"format": 1, "run_id": uuid.uuid4().hex, "seed": cfg.seed, "config_hash": chash,
            "iterations": cfg.iterations, "rounds": cfg.rounds,
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "nrpt_version": __version__,
            "target": target_record(cfg.target, cfg.target_options)}


def write_run_record(out: Path, record: dict[str, Any]) -> None:
    atomic_write(out / RUN_JSON, json.dumps(record, indent=2) + "\n")


def read_run_record(out: Path) -> dict[str, Any] | None:
    """``run.json`` of ``out``; None when the folder predates it (no run.json, no sidecar)."""
    path = out / RUN_JSON
    if not path.exists():
        if (out / SIDECAR).exists() or (out / PREV_SIDECAR).exists():
            raise ValueError(f"{path} is missing: the folder's checkpoints cannot be matched to "
                             f"its run; restore run.json or start a new run")
        return None
    try:
        record = json.loads(path.read_text())
        record["run_id"], record["config_hash"]  # noqa: B018 - must be there
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path} is damaged ({type(err).__name__}: {err}); restore it or start "
                         f"a new run") from None
    return record


# ------------------------------------------------------------------------------ checkpoints
def checkpoint_exists(out: Path) -> bool:
    return (out / CHECKPOINT).exists() or (out / PREV_CHECKPOINT).exists()


def _sidecars(out: Path) -> list[dict[str, Any]]:
    found = []
    for name in (SIDECAR, PREV_SIDECAR):
        with contextlib.suppress(OSError, ValueError):
            side = json.loads((out / name).read_text())
            if isinstance(side, dict) and "sha256" in side and "size" in side:
                found.append(side)
    return found


def load_weights(path: Path):
    """``torch.load(path, weights_only=True)`` for a run folder's tensor files (``pretrained.pt``
    of a deep run): a file that needs an unrestricted unpickler is an :class:`UnsafeCheckpoint`
    naming it, never loaded; a damaged one a ``ValueError`` naming it."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*pickle protocol", category=UserWarning)
            return torch.load(path, weights_only=True)
    except pickle.UnpicklingError as err:
        raise UnsafeCheckpoint(
            f"refusing to load {path}: it holds Python objects that only an unrestricted "
            f"unpickler would build (nrpt never runs code from a run folder); it was not "
            f"written by nrpt, or was tampered with: {str(err).splitlines()[0]}") from None
    except (OSError, EOFError, RuntimeError) as err:
        raise ValueError(f"{path} cannot be read ({type(err).__name__}: {str(err)[:200]}); "
                         f"remove it (it is made again) or start a new run") from None


def save_verified(payload: dict[str, Any], path: Path) -> None:
    """``torch.save(payload)`` to ``path`` atomically, with a sidecar ``PATH.json`` holding its
    size and sha256 (written first: a sidecar without its file vouches for nothing), for the
    tensor files of a run folder besides the checkpoints (``pretrained.pt`` of a deep run)."""
    import io

    buf = io.BytesIO()
    torch.save(payload, buf)
    data = buf.getvalue()
    side = {"file": path.name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    atomic_write(_sidecar_of(path), json.dumps(side, indent=2) + "\n")
    atomic_write(path, data)


def load_verified(path: Path):
    """:func:`load_weights` of a file written by :func:`save_verified`, after checking its
    size and sha256 against its sidecar: a missing sidecar or a mismatch is a ``ValueError``
    naming the file (never loaded)."""
    side_path = _sidecar_of(path)
    try:
        side = json.loads(side_path.read_text())
        want = (str(side["sha256"]), int(side["size"]))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path} cannot be verified: its sidecar {side_path.name} is missing "
                         f"or damaged ({type(err).__name__}); remove {path.name} (it is made "
                         f"again) or start a new run") from None
    sha, size = sha256_file(path)
    if (sha, size) != want:
        raise ValueError(f"{path} fails its checksum ({size} bytes, sha256 {sha[:16]}...; "
                         f"{side_path.name} records {want[1]} bytes, {want[0][:16]}...): it is "
                         f"truncated or damaged; remove it (it is made again) or start a new "
                         f"run")
    return load_weights(path)


def _sidecar_of(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def run_kind(out: str | os.PathLike) -> str | None:
    """What ``run.json`` of ``out`` says the run is (``"sample"`` when it names no kind: an
    ``nrpt run`` folder; ``"deep"``: :func:`nrpt.deep.fit`); None without a readable run.json
    (the caller reports the folder as it would)."""
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
        record = json.loads((Path(out) / RUN_JSON).read_text())
        return str(record.get("kind", "sample"))
    return None


def load_file(path: Path) -> dict[str, Any]:
    try:
        with warnings.catch_warnings():  # torch's remarks on a foreign pickle's protocol
            warnings.filterwarnings("ignore", message=".*pickle protocol", category=UserWarning)
            ck = torch.load(path, weights_only=True)
    except pickle.UnpicklingError as err:
        raise UnsafeCheckpoint(
            f"refusing to load {path}: it holds Python objects that only an unrestricted "
            f"unpickler would build (nrpt loads checkpoints with torch.load(weights_only=True) "
            f"and never runs code from them); it was not written by nrpt, or was tampered "
            f"with: {str(err).splitlines()[0]}") from None
    if not isinstance(ck, dict) or "engine" not in ck:
        raise ValueError(f"{path} is not an nrpt checkpoint")
    return ck


def read_checkpoint(out: Path) -> tuple[dict[str, Any], Path]:
    """The newest usable checkpoint of ``out`` and its path: its size and sha256 match a sidecar
    (or, without sidecars, it loads) and it loads with ``weights_only=True``; else
    ``checkpoint.prev.pt`` with a :class:`CheckpointWarning`."""
    sides = _sidecars(out)
    known = {(s["sha256"], int(s["size"])) for s in sides}
    legacy = not sides and not (out / RUN_JSON).exists()
    problems: list[str] = []
    for name in (CHECKPOINT, PREV_CHECKPOINT):
        path = out / name
        if not path.exists():
            problems.append(f"{name} is missing")
            continue
        if not legacy:
            sha, size = sha256_file(path)
            if (sha, size) not in known:
                problems.append(f"{name} fails its checksum ({size} bytes; truncated or damaged)"
                                if sides else f"{name} has no sidecar ({SIDECAR}) to verify it")
                continue
        try:
            ck = load_file(path)
        except UnsafeCheckpoint:
            raise
        except ValueError as err:
            problems.append(str(err))
            continue
        except Exception as err:  # noqa: BLE001 - a damaged file fails in many ways
            problems.append(f"{name} cannot be read ({type(err).__name__}: {err})")
            continue
        if name != CHECKPOINT:
            warnings.warn(f"{out / CHECKPOINT}: {problems[0]}; resuming from the previous "
                          f"checkpoint {path} (iteration {int(ck['engine']['k'])})",
                          CheckpointWarning, stacklevel=3)
        return ck, path
    raise ValueError(f"no usable checkpoint in {out}: " + "; ".join(problems))


def check_checkpoint(ck: dict[str, Any], path: Path, record: dict[str, Any] | None, cfg,
                     chash: str) -> None:
    """Refuse a checkpoint (or an edited ``config.toml``) that does not belong to the folder's
    run: another run id, another seed, other settings."""
    head = ck.get("header") or {}
    if record is None:
        if head.get("run_id") is not None:
            raise ValueError(f"{path.parent / RUN_JSON} is missing: restore it to resume")
        return  # a folder written before run ids: nothing to compare
    if head.get("run_id") != record["run_id"]:
        raise ValueError(f"{path} belongs to another run (run id {head.get('run_id')}) than "
                         f"{path.parent / RUN_JSON} (run id {record['run_id']}): it was copied "
                         f"from another run folder; restore this run's own checkpoint")
    if int(record["seed"]) != cfg.seed or int(head.get("seed", cfg.seed)) != cfg.seed:
        raise ValueError(f"{path.parent / 'config.toml'} says seed {cfg.seed} but the run "
                         f"(run.json, {path.name}) has seed {record['seed']}: a run's seed "
                         f"cannot change on resume; restore the seed or start a new run")
    if chash != record["config_hash"] or head.get("config_hash") != record["config_hash"]:
        diff = _settings_diff(head.get("config") or {}, cfg.to_dict())
        what = ("; ".join(diff) if diff and chash != record["config_hash"] else
                f"{path.name} was written with other settings than run.json records")
        raise ValueError(f"{path.parent / 'config.toml'} does not match the run's settings "
                         f"({what}): only the budget may change on resume (nrpt resume "
                         f"--iterations N); restore the file or start a new run")
