"""Crash safety of runs and run folders, tested the statistical way: a run that was interrupted
(a signal at an arbitrary point, a crash, a damaged file) and resumed must equal the
uninterrupted run bit for bit -- samples, energies, the index process and every number of the
summary -- and what cannot be resumed exactly must be refused with a message naming the file.
Negative controls show that the comparisons do detect a different run."""

from __future__ import annotations

import ast
import json
import math
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import nrpt
from nrpt.core import loop
from nrpt.core.fused import AUTO_MAX
from nrpt.recorders.draws import Draws
from nrpt.run import folder as runfolder
from nrpt.run.api import run_config
from nrpt.run.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]

#: a short exact run whose HMC explorer evaluates the energy three times per iteration, so a
#: signal sent from the energy lands inside the explorer, between its leapfrog steps.  The
#: plain loop (fuse = false): these tests place a signal in an iteration by counting energy
#: calls; the default eager chunks (fuse = "auto") finish their chunk of 8 before stopping
#: and are tested on their own (test_a_signal_inside_a_fused_chunk_...)
OPTS = dict(chains=5, iterations=300, seed=11, checkpoint_every=70, figures=False,
            explorer="hmc", leapfrog_steps=3, step_size=0.3, max_temperature=8.0, fuse=False)
CALLS_PER_IT = 3


class Kicker:
    """A 2-D double well whose energy sends this process ``sig`` at chosen calls."""

    dim = 2
    name = "kicker"

    def __init__(self, at=(), sig=signal.SIGINT):
        self.at, self.sig, self.calls = set(at), sig, 0

    def energy(self, x):
        self.calls += 1
        if self.calls in self.at:
            os.kill(os.getpid(), self.sig)
        return 2.0 * ((x ** 2 - 1.0) ** 2).sum(-1) + 0.1 * x[:, 1]


@pytest.fixture(autouse=True)
def foreground_sigint():
    """SIGINT as a foreground process has it (a suite started in the background by a shell
    inherits SIGINT ignored, and nrpt keeps an ignored signal ignored)."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


#: summary keys that depend on the clock, the folder, the outputs written or the interruption
#: ("fused" counts the chunks this process ran)
VOLATILE = {"wall_time_s", "iterations_per_s", "wall_s", "interrupted", "out", "figures",
            "outputs_s", "inference_data", "inference_data_error", "fused"}


def numbers(summary: dict) -> dict:
    """The summary less :data:`VOLATILE`."""
    def clean(v):
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items() if k not in VOLATILE}
        if isinstance(v, list):
            return [clean(x) for x in v]
        if isinstance(v, float) and math.isnan(v):
            return "nan"
        return v
    return clean(summary)


def assert_same_run(a, b) -> None:
    assert np.array_equal(a.samples, b.samples)
    assert np.array_equal(a.energies, b.energies)
    assert np.array_equal(a.index, b.index)
    assert numbers(a.summary) == numbers(b.summary)


def assert_same_files(a: Path, b: Path) -> None:
    for name in runfolder.RECORD_FILES:
        x, y = np.load(a / name), np.load(b / name)
        assert x.shape == y.shape and np.array_equal(x, y), name


@pytest.fixture(scope="module")
def at():
    """``at(it, r)``: the energy call that is the ``r``-th (1..3) of iteration ``it`` (1-based;
    the calls made while the run is built come first; ``over``: settings of that run that
    differ from OPTS, since the build's calls depend on the initial states, e.g. the hot-end
    check's search from one of them)."""
    from nrpt.run.build import build

    def build_calls(over) -> int:
        probe = Kicker()
        build(RunConfig(target="kicker", **{**OPTS, **over}), target=probe)
        return probe.calls

    base = build_calls({})
    return lambda it, r=1, **over: ((build_calls(over) if over else base)
                                    + CALLS_PER_IT * (it - 1) + r)


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """The uninterrupted reference run (a folder of its own)."""
    out = tmp_path_factory.mktemp("full") / "run"
    return nrpt.sample(Kicker(), out=str(out), **OPTS)


def interrupted(out: Path, at, sig=signal.SIGINT, **over):
    res = nrpt.sample(Kicker(at, sig), out=str(out), **{**OPTS, **over})
    assert res.summary["interrupted"]
    return res


@pytest.fixture(scope="module")
def template(tmp_path_factory, at):
    """A run folder interrupted in iteration 181 (checkpoints at 140 and 181); by SIGTERM,
    since module fixtures are set up before :func:`foreground_sigint`."""
    out = tmp_path_factory.mktemp("template") / "cut"
    interrupted(out, [at(181, 2)], signal.SIGTERM)
    return out


@pytest.fixture
def cut(template, tmp_path):
    """A fresh copy of :func:`template` to damage."""
    return Path(shutil.copytree(template, tmp_path / "cut"))


# ------------------------------------------------------------------ the comparison can fail
def test_negative_control_a_different_seed_is_detected(full, tmp_path):
    other = nrpt.sample(Kicker(), out=str(tmp_path / "other"), **{**OPTS, "seed": 12})
    with pytest.raises(AssertionError):
        assert_same_run(other, full)
    with pytest.raises(AssertionError):
        assert_same_files(tmp_path / "other", full.out)


def test_negative_control_one_changed_draw_is_detected(full):
    class Copy:
        pass

    c = Copy()
    c.samples, c.energies, c.index = full.samples.copy(), full.energies, full.index
    c.summary = full.summary
    c.samples[123, 1] = np.nextafter(c.samples[123, 1], np.inf)
    with pytest.raises(AssertionError):
        assert_same_run(c, full)


# ------------------------------------------------------------------ 1. signals
@pytest.mark.parametrize("it, r, sig", [(1, 2, signal.SIGINT), (102, 3, signal.SIGTERM),
                                        (141, 1, signal.SIGINT), (300, 2, signal.SIGTERM)])
def test_signal_inside_the_explorer_stops_between_iterations_and_resumes_exactly(
        full, at, tmp_path, sig, it, r):
    """The signal lands inside iteration ``it`` (between leapfrog steps, or at its first energy
    call): that iteration is finished, recorded and checkpointed; nothing is raised inside it.
    At the last iteration the run simply completes."""
    part = nrpt.sample(Kicker([at(it, r)], sig), out=str(tmp_path / "cut"), **OPTS)
    assert part.summary["n_iterations"] == it
    assert part.summary["interrupted"] == (it < 300)
    resumed = nrpt.resume(tmp_path / "cut", target=Kicker())
    assert not resumed.summary["interrupted"]
    assert_same_run(resumed, full)
    assert_same_files(tmp_path / "cut", full.out)


def test_a_signal_inside_a_fused_chunk_stops_at_its_end_and_resumes_exactly(full, at,
                                                                             tmp_path):
    """The default eager chunks (fuse = "auto": up to fused.AUTO_MAX = 128 iterations on this
    small state): a signal inside the explorer lets its chunk finish; the run stops at its
    end (or between the plain steps around a checkpoint), and the resumed run -- chunks again
    -- equals the plain uninterrupted run bit for bit."""
    opts = {**OPTS, "fuse": "auto"}
    part = nrpt.sample(Kicker([at(101, 2)]), out=str(tmp_path / "cut"), **opts)
    k = part.summary["n_iterations"]
    assert part.summary["interrupted"] and part.summary["fused"]["chunks"] > 0
    U = part.summary["fused"]["chunk"]
    assert U == AUTO_MAX and 95 <= k <= 101 + U and k % 8 == 0, k  # the end of the signal's chunk
    resumed = nrpt.resume(tmp_path / "cut", target=Kicker())
    assert resumed.summary["fused"]["chunks"] > 0
    assert_same_run(resumed, full)
    assert_same_files(tmp_path / "cut", full.out)


def test_signal_while_the_run_is_built_stops_before_the_first_iteration(full, tmp_path):
    part = interrupted(tmp_path / "cut", [1])
    assert part.summary["n_iterations"] == 0 and part.samples.shape == (0, 2)
    assert json.loads((tmp_path / "cut" / "checkpoint.json").read_text())["iteration"] == 0
    assert_same_run(nrpt.resume(tmp_path / "cut", target=Kicker()), full)


def test_an_ignored_signal_stays_ignored(full, at, tmp_path):
    """A process started with SIGINT ignored (``nohup``, a background job of a script) is not
    stopped by it; SIGTERM still stops it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    res = nrpt.sample(Kicker([at(10)]), out=str(tmp_path / "a"), **OPTS)
    assert not res.summary["interrupted"] and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert_same_run(res, full)
    assert interrupted(tmp_path / "b", [at(10)], signal.SIGTERM).summary["n_iterations"] == 10


def test_a_second_signal_does_not_break_the_iteration(full, at, tmp_path, capsys):
    part = interrupted(tmp_path / "cut", [at(51, 1), at(51, 2)], signal.SIGINT)
    assert part.summary["n_iterations"] == 51
    assert "still stopping at the end of this iteration" in capsys.readouterr().err
    assert_same_run(nrpt.resume(tmp_path / "cut", target=Kicker()), full)


def test_signal_between_the_step_and_the_record_resumes_exactly(full, tmp_path, monkeypatch):
    calls = {"n": 0}
    record = Draws.record

    def late(self, it):  # after the engine stepped and the adaptors saw it
        calls["n"] += 1
        if calls["n"] == 177:
            os.kill(os.getpid(), signal.SIGTERM)
        record(self, it)

    monkeypatch.setattr(Draws, "record", late)
    part = interrupted(tmp_path / "cut", [])
    assert part.summary["n_iterations"] == 177
    monkeypatch.setattr(Draws, "record", record)
    assert_same_run(nrpt.resume(tmp_path / "cut", target=Kicker()), full)


@pytest.mark.parametrize("also_in_loop", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_signal_while_writing_figures_keeps_every_output(full, tmp_path, monkeypatch,
                                                         also_in_loop):
    from nrpt.report import text as report

    write = report.write_figures

    def interrupted_write(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        return write(*args, **kwargs)

    monkeypatch.setattr(report, "write_figures", interrupted_write)
    out = tmp_path / "cut"
    res = nrpt.sample(Kicker([200] if also_in_loop else []), out=str(out),
                      **{**OPTS, "figures": True})
    assert res.summary["interrupted"] == also_in_loop  # a finished loop stays finished
    summary = json.loads((out / "summary.json").read_text())
    assert summary["figures"] and all((out / f).exists() for f in summary["figures"])
    assert (out / "posterior.nc").exists()
    monkeypatch.setattr(report, "write_figures", write)
    resumed = nrpt.resume(out, target=Kicker())
    assert_same_run(resumed, full)


def test_every_torch_load_refuses_pickle():
    """Item: no pickle on load -- every torch.load in the code passes weights_only=True."""
    found = 0
    files = [*ROOT.joinpath("src").rglob("*.py"), *ROOT.joinpath("benchmarks").rglob("*.py")]
    for path in files:
        if ".venv" in path.parts:  # the peer benchmark's throwaway venv (benchmarks/peers)
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "load" and \
                    getattr(node.func.value, "id", None) == "torch":
                found += 1
                kw = {k.arg: k.value for k in node.keywords}
                assert "weights_only" in kw and getattr(kw["weights_only"], "value", None) is \
                    True, f"{path}:{node.lineno}"
    assert found >= 1


class _Evil:
    def __reduce__(self):
        return (Path.touch, (Path(os.environ["NRPT_TEST_MARKER"]),))


@pytest.mark.parametrize("sidecar", ["forged", "removed"])
def test_a_crafted_pickle_checkpoint_is_refused_and_never_runs(cut, tmp_path, monkeypatch,
                                                               sidecar):
    out = cut
    marker = tmp_path / "pwned"
    monkeypatch.setenv("NRPT_TEST_MARKER", str(marker))
    evil = pickle.dumps({"engine": _Evil()})
    (out / "checkpoint.pt").write_bytes(evil)
    (out / "checkpoint.prev.pt").unlink()
    if sidecar == "forged":  # whoever wrote the file also rewrote its checksum
        side = json.loads((out / "checkpoint.json").read_text())
        sha, size = runfolder.sha256_file(out / "checkpoint.pt")
        side.update(sha256=sha, size=size)
        (out / "checkpoint.json").write_text(json.dumps(side))
        with pytest.raises(runfolder.UnsafeCheckpoint,
                           match=r"refusing to load .*checkpoint.pt.*weights_only"):
            nrpt.resume(out, target=Kicker())
    else:
        (out / "checkpoint.json").unlink()
        (out / "checkpoint.prev.json").unlink()
        with pytest.raises(ValueError, match="no usable checkpoint"):
            nrpt.resume(out, target=Kicker())
    assert not marker.exists()


# ------------------------------------------------------------------ 3. damaged / mismatched
def _damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncated":
        path.write_bytes(bytes(data[: len(data) // 2]))
    elif how == "flipped":
        data[len(data) // 2] ^= 0x40
        path.write_bytes(bytes(data))
    else:
        path.unlink()


@pytest.mark.parametrize("how", ["truncated", "flipped", "deleted"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(full, cut, how):
    out = cut
    prev_k = json.loads((out / "checkpoint.prev.json").read_text())["iteration"]
    assert prev_k == 140  # the last periodic checkpoint before the interruption at 181
    _damage(out / "checkpoint.pt", how)
    with pytest.warns(runfolder.CheckpointWarning, match="previous checkpoint"):
        resumed = nrpt.resume(out, target=Kicker())
    assert_same_run(resumed, full)


def test_both_checkpoints_damaged_is_a_clear_error(cut):
    out = cut
    _damage(out / "checkpoint.pt", "flipped")
    _damage(out / "checkpoint.prev.pt", "truncated")
    with pytest.raises(ValueError, match=r"no usable checkpoint .*checkpoint.pt fails its "
                                         r"checksum.*checkpoint.prev.pt fails its checksum"):
        nrpt.resume(out, target=Kicker())


def test_a_checkpoint_of_another_run_is_refused(cut, tmp_path):
    """Same settings, same seed, another run: the run ids differ."""
    a, b = cut, tmp_path / "b"
    interrupted(b, [600])
    for name in ("checkpoint.pt", "checkpoint.json"):
        shutil.copy(b / name, a / name)
    with pytest.raises(ValueError, match=r"checkpoint.pt belongs to another run"):
        nrpt.resume(a, target=Kicker())


@pytest.mark.parametrize("key, old, new, message", [
    ("seed", "seed = 11", "seed = 12", r"says seed 12 but the run .* has seed 11"),
    ("step_size", "step_size = 0.3", "step_size = 0.31",
     r"does not match the run's settings \(step_size = 0.3 in the run, 0.31 now\)"),
    ("iterations", "iterations = 300", "iterations = 400",
     r"iterations = 400 but the run's budget is 300.*--iterations"),
])
def test_an_edited_config_is_refused(cut, key, old, new, message):
    out = cut
    text = (out / "config.toml").read_text()
    assert old in text
    (out / "config.toml").write_text(text.replace(old, new))
    with pytest.raises(ValueError, match=message):
        nrpt.resume(out, target=Kicker())
    (out / "config.toml").write_text(text)  # restored: resumes
    assert nrpt.resume(out, target=Kicker()).summary["n_iterations"] == 300


def test_budget_extension_is_the_one_allowed_change(tmp_path):
    # the burn-in stays the first run's (0.1 x 300 = 30 warm-up iterations, step sizes tuned
    # and frozen there): the extended run is the fresh run of 450 iterations with burn_in = 30
    longer = nrpt.sample(Kicker(), out=str(tmp_path / "long"),
                         **{**OPTS, "iterations": 450, "burn_in": 30})
    out = tmp_path / "short"
    nrpt.sample(Kicker(), out=str(out), **OPTS)
    extended = nrpt.resume(out, target=Kicker(), iterations=450)
    assert_same_run(extended, longer)
    assert extended.summary["burn_in"] == 30 and len(extended.samples) == 420
    assert "burn_in = 0.1" in (out / "config.toml").read_text()
    assert json.loads((out / "run.json").read_text())["iterations"] == 450
    assert "iterations = 450" in (out / "config.toml").read_text()


@pytest.mark.parametrize("name", runfolder.RECORD_FILES)
@pytest.mark.parametrize("how", ["cut", "short", "deleted"])
def test_a_damaged_record_file_is_refused(cut, name, how):
    out = cut
    k = json.loads((out / "checkpoint.json").read_text())["iteration"]
    path = out / name
    if how == "cut":  # bytes lost at the end: shorter than its header says
        os.truncate(path, path.stat().st_size - 8)
        message = rf"{name} is truncated: \d+ bytes, but its header describes"
    elif how == "short":  # a valid .npy, but with fewer rows than the checkpoint needs
        arr = np.load(path)
        np.save(path, arr[:50])
        need = k + (1 if name == "index.npy" else 0)
        message = rf"{name} holds 50 rows but the checkpoint needs {need}"
    else:
        path.unlink()
        message = rf"{name} is missing"
    with pytest.raises(ValueError, match=message):
        nrpt.resume(out, target=Kicker())
    with pytest.raises(ValueError, match=message):  # refused again: nothing was "repaired"
        nrpt.resume(out, target=Kicker())


# ------------------------------------------------------------------ 4. valid rows only
@pytest.mark.parametrize("systems, thin", [(1, 1), (3, 2)])
def test_an_interrupted_run_folder_holds_only_valid_rows(at, tmp_path, systems, thin):
    opts = {**OPTS, "systems": systems, "thin": thin}
    fullrun = nrpt.sample(Kicker(), out=str(tmp_path / "full"), **opts)
    out = tmp_path / "cut"
    part = interrupted(out, [at(124, 3, systems=systems, thin=thin)],
                       **{"systems": systems, "thin": thin})
    k = part.summary["n_iterations"]
    assert k == 124
    n = k // thin
    samples, energies, index = (np.load(out / f) for f in runfolder.RECORD_FILES)
    axis = 0 if systems == 1 else 1
    assert samples.shape[axis] == energies.shape[axis] == n and index.shape[0] == k + 1
    # samples.npy keeps every row from iteration 0; the samples are those after the burn-in
    m = part.samples.shape[axis]
    assert part.summary["burn_in"] == 30 and m == n - 30 // thin
    tail = np.take(samples, range(n - m, n), axis=axis)
    assert np.array_equal(tail, part.samples) and np.array_equal(index, part.index)
    assert np.array_equal(tail, np.take(fullrun.samples, range(m), axis=axis))
    side = json.loads((out / "checkpoint.json").read_text())
    assert side["iteration"] == k
    assert side["rows"] == {"index": k + 1, "samples": n, "energies": n}
    assert_plain_permissions(out)  # also the files cut by a copy (R > 1)
    resumed = nrpt.resume(out, target=Kicker())
    assert_same_run(resumed, fullrun)
    assert_same_files(out, tmp_path / "full")


# ------------------------------------------------------------------ 5. one run per folder
def test_a_second_run_on_a_busy_folder_fails_at_once(tmp_path):
    out = tmp_path / "run"
    seen = []

    def meddle(engine):  # a second run (and a resume) while the first is running
        if not seen:
            for attempt in (lambda: nrpt.sample(Kicker(), out=str(out), overwrite=True, **{
                    k: v for k, v in OPTS.items()}), lambda: nrpt.resume(out)):
                with pytest.raises(runfolder.RunFolderBusy, match="in use by another nrpt "
                                                                   f"process \\(pid {os.getpid()}"):
                    attempt()
                seen.append(True)

    res = run_config(RunConfig(target="twenty-five-modes", out=str(out), iterations=300,
                               chains=4, figures=False), callback=meddle)
    assert seen == [True, True] and res.summary["n_iterations"] == 300
    with runfolder.RunLock(out):  # free again afterwards
        pass


def test_a_folder_with_a_run_is_refused_unless_overwrite(tmp_path, capsys):
    from nrpt.run.cli import main

    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    first = nrpt.sample(Kicker(), out=str(out), **{**OPTS, "figures": True})
    assert (out / "density.png").exists()
    with pytest.raises(ValueError, match=r"already holds a run .*overwrite=True"):
        nrpt.sample(Kicker(), out=str(out), **OPTS)
    args = ["run", "--preset", "none", "--iterations", "50", "--chains", "3", "--figures",
            "false", "--out", str(out), "--no-progress"]
    assert main(args) == 2 and "--overwrite" in capsys.readouterr().err
    # untouched (samples.npy keeps the burn-in rows first)
    assert np.array_equal(np.load(out / "samples.npy")[-len(first.samples):], first.samples)
    assert main([*args, "--overwrite"]) == 0
    assert np.load(out / "samples.npy").shape == (50, 2)
    assert not (out / "density.png").exists()  # the old run's files are gone
    assert (out / "notes.txt").read_text() == "mine"  # the user's are not
    again = nrpt.sample(Kicker(), out=str(out), overwrite=True, **OPTS)
    assert_same_run(again, first)


def test_overwrite_removes_every_figure_a_run_can_write(tmp_path):
    # trace.png and rank.png (figures = "all") were left behind by an overwrite
    import re

    from nrpt.report import text

    written = set(re.findall(r'"(\w+\.png)"', Path(text.__file__).read_text()))
    assert {"trace.png", "rank.png", "swap_acceptance.png", "density.png"} <= written
    for name in written | {"notes.png"}:
        (tmp_path / name).write_bytes(b"")
    runfolder.clear_run(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.png"]  # the user's file stays


def test_a_failed_start_leaves_no_folder_behind(tmp_path, monkeypatch, capsys):
    """A new run that fails before its first checkpoint (a target file that does not exist, a
    start at a non-finite energy, a crash while starting) removes what it wrote and the folders
    it created, so the next attempt needs no --overwrite; a folder that was there keeps the
    user's files; an --overwrite whose target file is missing keeps the old run."""
    from nrpt.run import api
    from nrpt.run.cli import main

    monkeypatch.chdir(tmp_path)
    args = ["run", "--target", "my_model.py:TARGET", "--chains", "3", "--iterations", "20",
            "--figures", "false", "--no-progress", "--out", "runs/mine"]
    assert main(args) == 2 and "target file not found" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # nor an empty locked runs/mine

    class NaNStart(Kicker):
        def energy(self, x):
            return super().energy(x) + float("nan")

    out = tmp_path / "kept"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="non-finite energy"):
        nrpt.sample(NaNStart(), out=str(out), **OPTS)
    assert sorted(p.name for p in out.iterdir()) in (["notes.txt"], [".nrpt.lock", "notes.txt"])

    def broken(*a, **k):  # after config.toml and run.json, before the first checkpoint
        raise RuntimeError("the node went away")

    monkeypatch.setattr(api, "execute", broken)
    with pytest.raises(RuntimeError, match="went away"):
        nrpt.sample(Kicker(), out=str(tmp_path / "new"), **OPTS)
    assert not (tmp_path / "new").exists()
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    first = nrpt.sample(Kicker(), out=str(tmp_path / "new"), **OPTS)  # no overwrite needed
    assert first.samples.shape == (270, 2)  # after the burn-in of 30
    assert main([*args[:-1], "new", "--overwrite"]) == 2  # the missing file again
    assert np.array_equal(np.load(tmp_path / "new" / "samples.npy")[30:], first.samples)
    nrpt.resume(tmp_path / "new", target=Kicker())  # still the run it was


def test_every_file_is_written_under_a_unique_temporary_name(tmp_path, monkeypatch):
    out = tmp_path / "run"
    moves = []
    replace = os.replace

    def spy(src, dst):
        moves.append((Path(src), Path(dst)))
        replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    interrupted(out, [450], figures=True)
    temporaries = [s for s, d in moves if s.name.startswith(".")]
    targets = {d.name for s, d in moves if s.name.startswith(".")}
    assert {"checkpoint.pt", "checkpoint.json", "run.json", "config.toml", "summary.json",
            "posterior.nc", "density.png"} <= targets
    assert len(set(temporaries)) == len(temporaries)
    assert all(s.parent == out for s in temporaries)
    assert not [p for p in out.iterdir() if ".tmp" in p.name]  # none left behind
    assert_plain_permissions(out)


def assert_plain_permissions(out: Path) -> None:
    """Files get the permissions a plain open() gives (mkstemp's own are owner-only)."""
    mask = os.umask(0o022)
    os.umask(mask)
    for name in ["config.toml", "run.json", "checkpoint.pt", "checkpoint.json", "summary.json",
                 *runfolder.RECORD_FILES]:
        assert (out / name).stat().st_mode & 0o777 == 0o666 & ~mask, name


# ------------------------------------------------------------------ 6. file targets
MODEL = ("import torch\n"
         "class Well:\n"
         "    dim = 2\n"
         "    def energy(self, x):\n"
         "        return {a} * ((x ** 2 - 1.0) ** 2).sum(-1)\n"
         "TARGET = Well()\n")


def test_a_file_target_resumes_from_its_recorded_path_and_refuses_a_changed_file(
        tmp_path, monkeypatch):
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    (home / "model.py").write_text(MODEL.format(a="2.0"))
    (elsewhere / "model.py").write_text(MODEL.format(a="5.0"))  # a decoy with the same name
    opts = {k: v for k, v in OPTS.items()}
    monkeypatch.chdir(home)
    fullrun = nrpt.sample("model.py:TARGET", out=str(tmp_path / "full"), **opts)

    def stop(engine):
        if engine.k >= 256:
            raise KeyboardInterrupt

    part = run_config(RunConfig(target="model.py:TARGET", out=str(tmp_path / "cut"), **opts),
                      callback=stop)
    assert part.summary["interrupted"]
    record = json.loads((tmp_path / "cut" / "run.json").read_text())
    assert record["target"]["path"] == str((home / "model.py").resolve())
    assert record["target"]["sha256"] == runfolder.sha256_file(home / "model.py")[0]
    monkeypatch.chdir(elsewhere)
    backup = tmp_path / "cut-copy"
    shutil.copytree(tmp_path / "cut", backup)
    assert_same_run(nrpt.resume(tmp_path / "cut"), fullrun)
    # the same interrupted run, but the model file was edited in the meantime
    (home / "model.py").write_text(MODEL.format(a="2.0") + "# edited\n")
    with pytest.raises(ValueError, match=r"model.py changed since the run started"):
        nrpt.resume(backup)


# ------------------------------------------------------------------ 7. smaller things
def test_a_crash_before_the_first_periodic_checkpoint_can_resume(full, tmp_path):
    class Crash(Kicker):
        def energy(self, x):
            if self.calls == 120:
                raise RuntimeError("the cluster node went away")
            return super().energy(x)

    out = tmp_path / "cut"
    with pytest.raises(loop.RunError, match=r"iteration \d+ failed.*nrpt resume"):
        nrpt.sample(Crash(), out=str(out), **OPTS)
    assert json.loads((out / "checkpoint.json").read_text())["iteration"] == 30  # the warm-up's end
    assert_same_run(nrpt.resume(out, target=Kicker()), full)


def test_adaptive_runs_checkpoint_inside_rounds_and_resume_from_round_one(tmp_path,
                                                                          monkeypatch):
    opts = dict(target="geometric-gaussian-path", target_options={"dim": 2}, rounds=8,
                chains=5, seed=5, explorer="rwmh", figures=False, checkpoint_every=50,
                fuse=False)  # (the plain loop calls Draws.record every iteration)
    fullrun = nrpt.sample(out=str(tmp_path / "full"), **opts)
    written = []
    write = loop.write_checkpoint

    def spy(payload, out):
        written.append(int(payload["engine"]["k"]))
        write(payload, out)

    monkeypatch.setattr(loop, "write_checkpoint", spy)
    calls = {"n": 0}
    record = Draws.record

    def stop_in_round_one(self, it):
        calls["n"] += 1
        if calls["n"] == 1:
            os.kill(os.getpid(), signal.SIGINT)
        record(self, it)

    monkeypatch.setattr(Draws, "record", stop_in_round_one)
    part = nrpt.sample(out=str(tmp_path / "cut"), **opts)
    assert part.summary["interrupted"] and part.summary["n_iterations"] == 1
    assert written == [0, 1]  # before the first iteration, and at the interruption
    monkeypatch.setattr(Draws, "record", record)
    written.clear()
    resumed = nrpt.resume(tmp_path / "cut")
    ends = np.cumsum([2 ** r for r in range(1, 9)]).tolist()  # 2, 6, 14, ..., 510
    inside = [k for k in range(50, 510, 50) if k not in ends]
    assert sorted(written) == sorted(set(ends) | set(inside))
    assert_same_run(resumed, fullrun)
    drop = lambda rows: [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]  # noqa: E731
    assert drop(resumed.rows) == drop(fullrun.rows)


def test_an_interrupted_cli_resume_exits_130(tmp_path, capsys, monkeypatch):
    from nrpt.run.cli import main

    out = tmp_path / "run"
    args = ["run", "--preset", "none", "--iterations", "400", "--chains", "4", "--figures",
            "false", "--checkpoint-every", "100", "--out", str(out), "--no-progress",
            "--fuse", "false"]  # (the plain loop calls Draws.record every iteration)
    calls = {"n": 0}
    record = Draws.record

    def stop(self, it):
        calls["n"] += 1
        if calls["n"] in (150, 300):
            os.kill(os.getpid(), signal.SIGINT)
        record(self, it)

    monkeypatch.setattr(Draws, "record", stop)
    assert main(args) == 130
    assert f"continue with: nrpt resume {out}" in capsys.readouterr().out
    assert main(["resume", str(out), "--no-progress"]) == 130  # stopped again at 300
    assert main(["resume", str(out), "--no-progress"]) == 0
    assert json.loads((out / "summary.json").read_text())["n_iterations"] == 400


def test_draws_in_memory_and_file_records_agree_after_close(tmp_path):
    """The cut / grow of the record files keeps every valid row (inner row axis, R > 1)."""
    rng = np.random.default_rng(0)
    d = Draws(10, 3, 2, 2, out_dir=tmp_path, dtype=np.float64)
    data = rng.normal(size=(3, 10, 2))
    d._s[:, :6] = data[:, :6]
    d._next_draw, d._next_row = 6, 7
    d.close()
    assert np.load(tmp_path / "samples.npy").shape == (3, 6, 2)
    again = Draws(10, 3, 2, 2, out_dir=tmp_path, dtype=np.float64, resume=True)
    again.load_state_dict({"next_row": 7, "next_draw": 6})
    assert again.samples.shape == (3, 10, 2)
    assert np.array_equal(again.samples[:, :6], data[:, :6])
    assert not again.samples[:, 6:].any()
    with pytest.raises(ValueError, match="index.npy holds 7 rows but the checkpoint needs 8"):
        again.load_state_dict({"next_row": 8, "next_draw": 7})


def test_config_hash_ignores_only_the_folder_and_the_budget():
    a = RunConfig(iterations=100, seed=3, out="x")
    assert runfolder.config_hash(a) == runfolder.config_hash(a.replace(iterations=500, out="y"))
    assert runfolder.config_hash(a) != runfolder.config_hash(a.replace(seed=4))
    assert runfolder.config_hash(a) != runfolder.config_hash(a.replace(chains=11))


# ------------------------------------------------------------------ real signals, real processes
SLOW_MODEL = ("import os, time\n"
              "import torch\n"
              "PAUSE = float(os.environ.get('NRPT_TEST_PAUSE', '0'))\n"
              "class Well:\n"
              "    dim = 2\n"
              "    def energy(self, x):\n"
              "        if PAUSE:\n"
              "            time.sleep(PAUSE)\n"
              "        return 2.0 * ((x ** 2 - 1.0) ** 2).sum(-1) + 0.1 * x[:, 1]\n"
              "TARGET = Well()\n")


@pytest.fixture(scope="module")
def cli_reference(tmp_path_factory):
    """The uninterrupted `nrpt run` (in this process, no pause) and the arguments of the run."""
    from nrpt.run.cli import main

    base = tmp_path_factory.mktemp("cli")
    (base / "model.py").write_text(SLOW_MODEL)
    args = ["run", "--target", f"{base / 'model.py'}:TARGET", "--chains", "4",
            "--iterations", "2000", "--checkpoint-every", "100", "--seed", "5",
            "--figures", "false", "--no-progress"]
    assert main([*args, "--out", str(base / "full")]) == 0
    return args, base / "full"


def _start(args, out: Path):
    """``python -m nrpt`` in a subprocess, running this checkout, paused 1 ms per energy."""
    src = str(Path(nrpt.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "NRPT_TEST_PAUSE": "0.001"}
    return subprocess.Popen([sys.executable, "-m", "nrpt", *args, "--out", str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_checkpoint(proc, out: Path, at_least: int) -> int:
    """Poll the checkpoint sidecar until it reports ``at_least`` iterations."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            k = json.loads((out / "checkpoint.json").read_text())["iteration"]
        except (OSError, ValueError):
            k = -1
        if k >= at_least:
            return k
        time.sleep(0.01)
    proc.kill()
    raise AssertionError("no checkpoint in time")


def _compare_cli_runs(out: Path, ref: Path) -> None:
    assert_same_files(out, ref)
    a, b = (json.loads((d / "summary.json").read_text()) for d in (out, ref))
    assert not a["interrupted"] and numbers(a) == numbers(b)


def test_sigterm_to_nrpt_run_checkpoints_exits_130_and_resumes_exactly(cli_reference, tmp_path):
    from nrpt.run.cli import main

    args, ref = cli_reference
    out = tmp_path / "cut"
    proc = _start(args, out)
    _wait_for_checkpoint(proc, out, 300)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert f"continue with: nrpt resume {out}" in stdout
    summary = json.loads((out / "summary.json").read_text())
    k = summary["n_iterations"]
    assert summary["interrupted"] and 300 <= k < 2000
    assert json.loads((out / "checkpoint.json").read_text())["iteration"] == k
    assert np.load(out / "samples.npy").shape == (k, 2)  # only the valid rows
    assert main(["resume", str(out), "--no-progress"]) == 0
    _compare_cli_runs(out, ref)


@pytest.mark.parametrize("seed", [0])
def test_kill_9_then_resume_equals_the_uninterrupted_run(cli_reference, tmp_path, seed):
    """SIGKILL at a random-ish point after at least one checkpoint: no handler runs, the record
    files keep their full length, and the resumption rewrites the rows after the checkpoint."""
    import random

    from nrpt.run.cli import main

    args, ref = cli_reference
    rng = random.Random(seed)
    out = tmp_path / "cut"
    proc = _start(args, out)
    _wait_for_checkpoint(proc, out, rng.randrange(100, 1200))
    time.sleep(rng.uniform(0.0, 0.2))
    proc.kill()
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    side = json.loads((out / "checkpoint.json").read_text())
    assert side["rows"]["samples"] == side["iteration"] < 2000
    assert not (out / "summary.json").exists()
    assert main(["resume", str(out), "--no-progress"]) == 0
    _compare_cli_runs(out, ref)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1, 9))
def test_kill_9_at_many_points(cli_reference, tmp_path, seed):
    test_kill_9_then_resume_equals_the_uninterrupted_run(cli_reference, tmp_path, seed)
