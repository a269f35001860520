"""A run folder is untrusted input (issue 26, items 1, 7, 11): nothing in it chooses code to
import, the target of a resumption is the run's own, and ``overwrite`` is a real bool.

Each attack writes a marker file when its code runs; the tests assert the marker is absent and
the resumption refused with a message that says what differs.  Negative controls resume the
untouched run (or the same target again) and get the uninterrupted run's numbers."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys

import numpy as np
import pytest

import nrpt
from nrpt.run.cli import main

OPTS = dict(chains=3, iterations=40, burn_in=4, seed=3, figures=False, explorer="rwmh", fuse=False,
            checkpoint_every=20)  # (a fixed burn-in: extending the budget is the longer run)

EVIL = ("from pathlib import Path\n"
        "Path({marker!r}).write_text('imported')\n"
        "class Wide:\n"
        "    dim = 2\n"
        "    name = 'wide'\n"
        "    def energy(self, x):\n"
        "        return 0.001 * (x ** 2).sum(-1)\n"
        "TARGET = Wide()\n")

MODEL = ("import torch\n"
         "from {helper} import SCALE\n"
         "class Well:\n"
         "    dim = 2\n"
         "    name = 'well'\n"
         "    def energy(self, x):\n"
         "        return SCALE * ((x ** 2 - 1.0) ** 2).sum(-1)\n"
         "TARGET = Well()\n")


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _point_run_json_at(out, evil) -> None:
    """The attack of item 1: run.json's target is evil.py, with its true sha256."""
    record = json.loads((out / "run.json").read_text())
    record["target"] = {"spec": f"{evil}:TARGET", "path": str(evil), "attribute": "TARGET",
                        "sha256": _sha(evil), "size": evil.stat().st_size}
    (out / "run.json").write_text(json.dumps(record))


@pytest.fixture
def evil(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.py"
    path.write_text(EVIL.format(marker=str(marker)))
    return path, marker


@pytest.fixture
def helper(tmp_path, monkeypatch):
    """A project folder whose model.py imports a sibling module (a fresh name per test, so no
    earlier import is cached)."""
    name = f"trust_helper_{tmp_path.name.replace('-', '_')}"
    home = tmp_path / "home"
    home.mkdir()
    (home / f"{name}.py").write_text("SCALE = 2.0\n")
    (home / "model.py").write_text(MODEL.format(helper=name))
    monkeypatch.syspath_prepend(str(home))
    yield home, name
    sys.modules.pop(name, None)


# ------------------------------------------------------------------ item 1: run.json picks no code
def test_a_run_json_naming_another_file_never_imports_it(tmp_path, evil, capsys):
    path, marker = evil
    out = tmp_path / "run"
    full = nrpt.sample("gaussian", out=str(out), **{**OPTS, "iterations": 60})
    shutil.rmtree(out)
    nrpt.sample("gaussian", out=str(out), **OPTS)
    shutil.copytree(out, tmp_path / "clean")
    _point_run_json_at(out, path)
    with pytest.raises(ValueError, match=r"disagree about the target.*never\s+from run.json"):
        nrpt.resume(out, iterations=60)
    assert main(["resume", str(out), "--iterations", "60", "--no-progress"]) == 2
    assert "disagree about the target" in capsys.readouterr().err
    assert not marker.exists()
    # negative control: the untouched folder resumes to the uninterrupted run
    resumed = nrpt.resume(tmp_path / "clean", iterations=60)
    assert np.array_equal(resumed.samples, full.samples)


def test_a_file_targets_run_json_edited_to_another_file_is_refused(tmp_path, evil, helper,
                                                                     monkeypatch):
    path, marker = evil
    home, _ = helper
    monkeypatch.chdir(home)
    out = tmp_path / "run"
    nrpt.sample("model.py:TARGET", out=str(out), **OPTS)
    _point_run_json_at(out, path)
    for where in (home, tmp_path):
        monkeypatch.chdir(where)
        with pytest.raises(ValueError, match="disagree about the target"):
            nrpt.resume(out, iterations=60)
    assert not marker.exists()
    config = (out / "config.toml").read_text()
    assert f'"{home / "model.py"}:TARGET"' in config  # the absolute path the user's resolved to


def test_a_target_path_given_to_resume_must_be_the_runs_file(tmp_path, evil, helper,
                                                            monkeypatch, capsys):
    """--target PATH names the file of a run started elsewhere; it is still checked."""
    path, marker = evil
    home, name = helper
    monkeypatch.chdir(home)
    full = nrpt.sample("model.py:TARGET", out=str(tmp_path / "full"),
                       **{**OPTS, "iterations": 60})
    out = tmp_path / "run"
    nrpt.sample("model.py:TARGET", out=str(out), **OPTS)
    moved = tmp_path / "moved"
    shutil.move(home, moved)  # the project moved: config.toml's path is gone
    monkeypatch.syspath_prepend(str(moved))
    with pytest.raises(ValueError, match=r"does not exist.*--target PATH"):
        nrpt.resume(out, iterations=60)
    with pytest.raises(ValueError, match="changed since the run started"):
        nrpt.resume(out, iterations=60, target=str(path))
    assert main(["resume", str(out), "--iterations", "60", "--no-progress",
                 "--target", f"{path}:TARGET"]) == 2
    assert "changed since the run started" in capsys.readouterr().err
    with pytest.raises(ValueError, match="samples 'TARGET' of its file"):
        nrpt.resume(out, iterations=60, target=f"{moved / 'model.py'}:OTHER")
    assert not marker.exists()
    # negative control: the moved file itself resumes exactly
    assert main(["resume", str(out), "--iterations", "60", "--no-progress",
                 "--target", str(moved / "model.py")]) == 0
    assert np.array_equal(np.load(out / "samples.npy"), np.load(tmp_path / "full" /
                                                               "samples.npy"))
    again = nrpt.resume(out, target=str(moved / "model.py"))  # (config.toml still says home)
    assert np.array_equal(again.samples, full.samples)


def test_figures_of_a_moved_file_target_name_their_own_command(tmp_path, helper, monkeypatch,
                                                                capsys):
    """`nrpt figures` checks the target file as a resumption does, its hints naming itself:
    `nrpt figures DIR --target PATH` (not resume, which would run the budget on)."""
    home, name = helper
    monkeypatch.chdir(home)
    out = tmp_path / "run"
    nrpt.sample("model.py:TARGET", out=str(out), **OPTS)
    moved = tmp_path / "moved"
    shutil.move(home, moved)
    monkeypatch.syspath_prepend(str(moved))
    with pytest.raises(ValueError, match=r"cannot draw the figures .*does not exist.*"
                                         r"`nrpt figures \S+ --target PATH` \(figures\(target"):
        nrpt.figures(out)
    assert main(["figures", str(out), "--target", str(moved / "model.py")]) == 0
    assert "figures in" in capsys.readouterr().out and list(out.glob("*.png"))


# ------------------------------------------------------------------ item 7: imported modules
def test_an_edited_module_imported_by_the_target_file_is_refused(tmp_path, helper,
                                                                monkeypatch):
    home, name = helper
    monkeypatch.chdir(home)
    full = nrpt.sample("model.py:TARGET", out=str(tmp_path / "full"),
                       **{**OPTS, "iterations": 60})
    out = tmp_path / "run"
    nrpt.sample("model.py:TARGET", out=str(out), **OPTS)
    shutil.copytree(out, tmp_path / "clean")
    (home / f"{name}.py").write_text("SCALE = 20.0\n")  # the edit of item 7
    with pytest.raises(ValueError, match=rf"module .*{name}\.py that the run's target file "
                                         rf"model\.py imports changed since the run started"):
        nrpt.resume(out, iterations=60)
    record = json.loads((out / "run.json").read_text())
    assert record["target"]["modules"] == {
        f"{name}.py": hashlib.sha256(b"SCALE = 2.0\n").hexdigest()}  # recorded at the start
    (home / f"{name}.py").unlink()
    with pytest.raises(ValueError, match=rf"{name}\.py .*no longer exists"):
        nrpt.resume(out, iterations=60)
    # negative control: restored, the run resumes to the uninterrupted one
    (home / f"{name}.py").write_text("SCALE = 2.0\n")
    assert np.array_equal(nrpt.resume(tmp_path / "clean", iterations=60).samples, full.samples)


# ------------------------------------------------------------------ item 11: target objects
class Well:
    dim = 2
    name = "well"

    def __init__(self, scale=2.0):
        self.scale = scale

    def energy(self, x):
        return self.scale * ((x ** 2 - 1.0) ** 2).sum(-1)


class Other(Well):
    name = "other"


def test_resume_refuses_another_target_object(tmp_path):
    full = nrpt.sample(Well(), out=str(tmp_path / "full"), **{**OPTS, "iterations": 60})
    out = tmp_path / "run"
    nrpt.sample(Well(), out=str(out), **OPTS)
    with pytest.raises(ValueError, match=r"not the run's target \(name 'well' then, 'other'"):
        nrpt.resume(out, target=Other(), iterations=60)
    with pytest.raises(ValueError, match=r"not the run's target \(energy at the probe states"):
        nrpt.resume(out, target=Well(scale=3.0), iterations=60)  # same name, another energy
    # negative control: a new instance of the run's own target resumes exactly
    assert np.array_equal(nrpt.resume(out, target=Well(), iterations=60).samples, full.samples)


# ------------------------------------------------------------------ item 11: overwrite is a bool
@pytest.mark.parametrize("value", ["no", "false", 0, 1, None, [True]])
def test_overwrite_must_be_a_bool_and_a_truthy_word_keeps_the_run(tmp_path, value):
    out = tmp_path / "run"
    nrpt.sample("gaussian", out=str(out), **OPTS)
    before = (out / "samples.npy").read_bytes(), (out / "run.json").read_text()
    with pytest.raises(ValueError, match=r"overwrite must be True or False; got "):
        nrpt.sample("gaussian", out=str(out), overwrite=value, **{**OPTS, "seed": 4})
    assert ((out / "samples.npy").read_bytes(), (out / "run.json").read_text()) == before


def test_overwrite_takes_numpy_bools(tmp_path):
    out = tmp_path / "run"
    nrpt.sample("gaussian", out=str(out), **OPTS)
    with pytest.raises(ValueError, match="already holds a run"):
        nrpt.sample("gaussian", out=str(out), overwrite=np.bool_(False), **OPTS)
    again = nrpt.sample("gaussian", out=str(out), overwrite=np.bool_(True), **{**OPTS, "seed": 4})
    assert again.config.seed == 4


@pytest.mark.parametrize("damage", [
    lambda t: "evil.py:TARGET",
    lambda t: {**t, "fingerprint": {"name": "well", "dim": 2, "kind": "temperature",
                                    "probe": [1, 2]}},
    lambda t: {**t, "fingerprint": {**t["fingerprint"], "probe": {"energy": ["x", {}, 3]}}},
])
def test_a_damaged_target_record_is_refused_clearly(tmp_path, damage):
    out = tmp_path / "run"
    nrpt.sample(Well(), out=str(out), **OPTS)
    record = json.loads((out / "run.json").read_text())
    record["target"] = damage(record["target"])
    (out / "run.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"run.json|not the run's target"):
        nrpt.resume(out, target=Well(), iterations=60)
