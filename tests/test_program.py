"""The program ``nrpt`` as a process (:func:`nrpt.run.cli.entry`): its heap handled as a process
that ends with its run may (the collector off while nrpt imports, the heap frozen), with the
same files and numbers as :func:`nrpt.run.cli.main` in a process that goes on; and the
adaptation trace checkpointed as stacked tensors, resuming exactly (old list checkpoints too)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

import nrpt
from nrpt.recorders.stats import Trace
from nrpt.run.cli import main

SRC = str(Path(nrpt.__file__).resolve().parents[1])
#: summary entries that are clocks or places, not results
VOLATILE = {"wall_time_s", "iterations_per_s", "out", "outputs_s", "threads"}


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=SRC, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, *args, "-c", code] if code else
                          [sys.executable, *args], env=env, capture_output=True, text=True,
                          timeout=300)


def test_importing_nrpt_leaves_the_collector_as_the_importer_had_it():
    probe = ("import gc, sys\n{before}\nimport nrpt\n"
             "print(gc.isenabled(), gc.get_freeze_count(), 'torch' in sys.modules)")
    on = _python(probe.format(before=""))
    assert on.returncode == 0, on.stderr
    assert on.stdout.split() == ["True", "0", "True"]  # back on, nothing frozen
    off = _python(probe.format(before="gc.disable()"))
    assert off.returncode == 0, off.stderr
    assert off.stdout.split() == ["False", "0", "True"]  # an importer's choice is kept


def test_the_program_freezes_its_heap_and_main_does_not():
    code = ("import gc, sys\nfrom nrpt.run import cli\nsys.argv = ['nrpt', 'targets']\n"
            "{call}\nprint('frozen', gc.get_freeze_count() > 0, gc.isenabled())")
    prog = _python(code.format(call="assert cli.entry() == 0"))
    assert prog.returncode == 0, prog.stderr
    assert prog.stdout.splitlines()[-1] == "frozen True True"
    # negative control: main() (what tests and embedding callers run) leaves the heap alone
    plain = _python(code.format(call="assert cli.main() == 0"))
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.splitlines()[-1] == "frozen False True"
    assert prog.stdout == plain.stdout.replace("frozen False", "frozen True")


def test_python_m_nrpt_writes_what_main_writes(tmp_path):
    args = ["run", "--iterations", "400", "--seed", "4", "--no-progress", "--figures", "true"]
    r = subprocess.run([sys.executable, "-m", "nrpt", *args, "--out", str(tmp_path / "prog")],
                       env=dict(os.environ, PYTHONPATH=SRC, OMP_NUM_THREADS="1"),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert main([*args, "--out", str(tmp_path / "main")]) == 0
    prog, here = tmp_path / "prog", tmp_path / "main"
    names = sorted(p.name for p in prog.iterdir())
    assert names == sorted(p.name for p in here.iterdir())
    assert {"density.png", "posterior.nc", "summary.json", "adaptation.npz"} <= set(names)
    for name in ("samples.npy", "energies.npy", "index.npy"):
        assert np.array_equal(np.load(prog / name), np.load(here / name)), name
    with np.load(prog / "adaptation.npz") as a, np.load(here / "adaptation.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        for k in a.files:
            assert np.array_equal(a[k], b[k]), k
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (prog, here))
    assert {k: v for k, v in sa.items() if k not in VOLATILE} == \
        {k: v for k, v in sb.items() if k not in VOLATILE}
    # the figures too, byte for byte (the program imports matplotlib without its help text)
    pngs = [n for n in names if n.endswith(".png")]
    assert len(pngs) >= 3
    for name in pngs:
        assert (prog / name).read_bytes() == (here / name).read_bytes(), name


def test_the_trace_checkpoints_stacked_and_resumes_exactly(tmp_path):
    opts = dict(explorer="sgd", chains=6, iterations=500, noise_sd=2.0, scheme="deo-w",
                window="auto", seed=3, checkpoint_every=120, figures=False)
    nrpt.sample("twenty-five-modes", out=str(tmp_path / "full"), **opts)

    def interrupt(engine):
        if engine.k >= 300:
            raise KeyboardInterrupt

    cut = tmp_path / "cut"
    part = nrpt.run_config(nrpt.RunConfig(out=str(cut), **opts), callback=interrupt)
    assert part.summary["interrupted"]
    sd = torch.load(cut / "checkpoint.pt", weights_only=False)["recorders"]["trace"]
    n = len(sd["k"])
    assert n > 10 and all(isinstance(sd[k], torch.Tensor) and sd[k].shape[0] == n
                          for k in ("C", "table", "rate"))
    nrpt.resume(cut)
    with np.load(cut / "adaptation.npz") as a, np.load(tmp_path / "full" / "adaptation.npz") as b:
        assert sorted(a.files) == sorted(b.files) and "pair_rate" in a.files
        for k in a.files:
            assert np.array_equal(a[k], b[k]), k
    # a checkpoint from before the stacking (lists of tensors) loads to the same records
    old = {k: (list(v) if k in ("C", "table", "rate") else v) for k, v in sd.items()}
    new_form, list_form = Trace(), Trace()
    new_form.load_state_dict(sd)
    list_form.load_state_dict(old)
    for k, v in new_form.arrays().items():
        assert np.array_equal(v, list_form.arrays()[k]), k
    # records of different shapes (a ladder that changed) stay a list
    t = Trace()
    t.load_state_dict({**old, "table": [torch.zeros(1, 3), torch.zeros(1, 4)]})
    assert isinstance(t.state_dict()["table"], list)
    assert isinstance(new_form.state_dict()["table"], torch.Tensor)


def test_the_outputs_freeze_stays_in_the_program_only(monkeypatch):
    import gc

    from nrpt.run import api

    assert gc.isenabled() and gc.get_freeze_count() == 0
    monkeypatch.setattr(api, "_PROGRAM", True)
    try:
        with api._heap_frozen():
            pass
        assert gc.get_freeze_count() > 0  # the program keeps what it froze
    finally:
        gc.unfreeze()
    monkeypatch.setattr(api, "_PROGRAM", False)  # negative control: a caller gets it back
    with api._heap_frozen():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
