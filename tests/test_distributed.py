"""Replicas across processes (nrpt.core.sharding): a fixed seed gives bit-for-bit the same index
process, samples and reported numbers with 1 (in-process), 2 and 4 gloo processes, for exact
and stochastic-gradient samplers; a checkpoint written by N processes resumes on M; a changed
seed *is* detected (negative control).  The multi-process runs are real processes on CPU
(``nrpt run --nproc N`` spawns them with the torchrun environment); each costs seconds of
start-up on 2 cores, so the default suite runs the exact sampler on 1/2/4 processes and the
cheap checks, and ``make test-slow`` the SG, minibatch, resume-on-M and interrupt checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import nrpt
import nrpt.core.sharding
from nrpt.core.sharding import block_of, check_world, spawn
from nrpt.rng import Block, Key, normal

DATA = Path(__file__).parent / "data"
TIMING = {"wall_time_s", "iterations_per_s", "out", "figures", "round_rows", "outputs_s"}
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def _cli(args: list[str], nproc: int | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "nrpt", "run", *args, "--no-progress", "--figures", "false"]
    if nproc is not None:
        cmd += ["--nproc", str(nproc)]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)


def _records(out: Path) -> dict:
    rec = {f: np.load(out / f"{f}.npy") for f in ("samples", "energies", "index")}
    summary = json.loads((out / "summary.json").read_text())
    rec["summary"] = {k: v for k, v in summary.items() if k not in TIMING}
    rows = summary.get("round_rows")
    if rows:
        rec["rows"] = [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]
    return rec


def _same(a: dict, b: dict) -> list[str]:
    """Names of the records that differ (arrays bit for bit, numbers exactly)."""
    diff = [f for f in ("samples", "energies", "index") if not np.array_equal(a[f], b[f])]
    # ("fused" says how a process ran its loop: one process takes eager chunks, several the
    # plain loop; what they compute is the same)
    diff += [f"summary.{k}" for k in a["summary"]
             if k != "fused" and a["summary"][k] != b["summary"].get(k)]
    if a.get("rows") != b.get("rows"):
        diff.append("rows")
    return diff


# ------------------------------------------------------------------ pieces
def test_blocks_partition_the_replicas():
    for P in (1, 5, 6, 16, 17):
        for world in range(1, P + 1):
            blocks = [block_of(r, world, P) for r in range(world)]
            covered = [i for b in blocks for i in range(b.lo, b.hi)]
            assert covered == list(range(P)), (P, world)


def test_block_draws_are_slices_of_the_full_draw():
    full = normal((3, 7, 2), 11, 5, 9)
    for lo, hi in [(0, 3), (3, 6), (6, 7), (2, 2)]:
        part = normal((3, hi - lo, 2), 11, 5, 9, block=Block(lo, hi, 7))
        assert torch.equal(part, full[:, lo:hi])
    key = Key((11, 4), Block(1, 3, 7))
    assert tuple(key) == (11, 4) and key.block.width == 2
    with pytest.raises(ValueError, match=r"shape \[R, 2"):
        normal((3, 5, 2), 11, block=Block(1, 3, 7))


def test_too_many_processes_is_a_clear_error():
    with pytest.raises(ValueError, match="at most one process per chain"):
        check_world(3, 2)
    check_world(4, 4)


@pytest.mark.distributed
def test_a_failing_rank_ends_the_launch(tmp_path, monkeypatch):
    # rank 1 dies before the rendezvous; rank 0 would wait for it: the launcher kills it
    monkeypatch.setattr(nrpt.core.sharding, "FAILURE_GRACE_S", 0.5)
    opts = {"fail_rank": 1, "chains": 2, "iterations": 5, "out": str(tmp_path / "f")}
    code = spawn(2, [sys.executable, str(DATA / "dist_sample.py"), json.dumps(opts)])
    assert code != 0


# ------------------------------------------------------------------ invariance
EXACT = ["--preset", "none", "--target", "twenty-five-modes", "--chains", "6", "--systems", "2",
         "--iterations", "300", "--explorer", "mala"]


@pytest.mark.distributed
def test_exact_sampler_is_identical_on_1_and_4_processes(tmp_path):
    # 4 ranks over 6 replicas: blocks of 2, 2, 2 and 0 (an empty rank); 2 processes run in
    # the default suite
    one = nrpt.sample("twenty-five-modes", chains=6, systems=2, iterations=300, explorer="mala",
                      seed=4, out=str(tmp_path / "p1"), figures=False)
    ref = _records(one.out)
    assert ref["samples"].shape == (2, 300, 2)
    for n in (4,):
        r = _cli([*EXACT, "--seed", "4", "--out", str(tmp_path / f"p{n}")], nproc=n)
        assert r.returncode == 0, r.stderr
        assert _same(ref, _records(tmp_path / f"p{n}")) == [], n
    # negative control: another seed is detected as different
    other = nrpt.sample("twenty-five-modes", chains=6, systems=2, iterations=300,
                        explorer="mala", seed=5, out=str(tmp_path / "other"), figures=False)
    diff = _same(ref, _records(other.out))
    assert "samples" in diff and "index" in diff


def test_exact_sampler_is_identical_on_2_processes(tmp_path):
    """The default suite's one multi-process run (the rest is marked distributed: make
    test-all): 2 gloo processes give the single process's records bit for bit (the same kernels
    on the same numbers; test_exact_sampler_is_identical_on_1_and_4_processes has the negative
    control).  40 iterations: each one waits on a collective between the processes, seconds on
    2 loaded cores."""
    one = nrpt.sample("twenty-five-modes", chains=6, systems=2, iterations=40, explorer="mala",
                      seed=4, out=str(tmp_path / "p1"), figures=False)
    assert (np.diff(_records(one.out)["index"], axis=1) != 0).any()  # swaps happened
    args = [a if a != "300" else "40" for a in EXACT]
    r = _cli([*args, "--seed", "4", "--out", str(tmp_path / "p2")], nproc=2)
    assert r.returncode == 0, r.stderr
    assert _same(_records(one.out), _records(tmp_path / "p2")) == []


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("nprocs", [(2,), (4,)], ids=["2", "4"])
def test_sg_headline_is_identical_on_1_2_and_4_processes(tmp_path, nprocs):
    # the DEO*-SGD x P16 headline (adaptive C and learning rates, W* window), shortened
    args = ["--iterations", "400", "--seed", "2"]
    runs = {}
    for n in (None, *nprocs):
        out = tmp_path / f"sg{n}"
        r = _cli([*args, "--out", str(out)], nproc=n)
        assert r.returncode == 0, r.stderr
        runs[n] = _records(out)
    assert runs[None]["summary"]["round_trips"] > 0
    for n in nprocs:
        assert _same(runs[None], runs[n]) == [], n


@pytest.mark.slow
@pytest.mark.distributed
def test_adaptive_rounds_with_slice_are_identical_on_3_processes(tmp_path):
    args = ["--preset", "none", "--target", "twenty-five-modes", "--rounds", "6", "--chains",
            "7", "--explorer", "slice", "--seed", "1"]
    outs = []
    for n in (None, 3):
        out = tmp_path / f"r{n}"
        r = _cli([*args, "--out", str(out)], nproc=n)
        assert r.returncode == 0, r.stderr
        outs.append(_records(out))
    assert _same(*outs) == []


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("vr_every", [0, 3], ids=["minibatch", "control-variate"])
def test_minibatch_energies_are_identical_on_2_processes(tmp_path, vr_every):
    opts = dict(explorer="sgld", chains=5, max_temperature=20.0, batch_size=10, iterations=300,
                swap_rule="bias-corrected", seed=7, figures=False)
    if vr_every:
        opts["vr_every"] = vr_every
    outs = []
    for n in (1, 2):
        opts["out"] = str(tmp_path / f"mb{n}")
        cmd = [sys.executable, str(DATA / "dist_sample.py"), json.dumps(opts)]
        code = spawn(n, cmd) if n > 1 else subprocess.run(cmd, env=ENV).returncode
        assert code == 0
        outs.append(_records(Path(opts["out"])))
    assert outs[0]["summary"]["energy"] == ("control-variate" if vr_every else "minibatch")
    assert _same(*outs) == []


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("m", [3, 1])
def test_checkpoint_of_2_processes_resumes_on_m(tmp_path, m):
    # reference: 300 iterations in one process, extended to 600 from its checkpoint
    one = nrpt.sample("twenty-five-modes", chains=6, iterations=150, explorer="rwmh", seed=9,
                      out=str(tmp_path / "one"), figures=False)
    ref = _records(nrpt.resume(one.out, iterations=300).out)
    assert ref["index"].shape[0] == 301
    base = ["--preset", "none", "--target", "twenty-five-modes", "--chains", "6", "--explorer",
            "rwmh", "--seed", "9", "--iterations", "150", "--out", str(tmp_path / "two")]
    r = _cli(base, nproc=2)
    assert r.returncode == 0, r.stderr
    cmd = [sys.executable, "-m", "nrpt", "resume", str(tmp_path / "two"), "--iterations", "300",
           "--no-progress"] + (["--nproc", str(m)] if m > 1 else [])
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0, r.stderr
    assert _same(ref, _records(tmp_path / "two")) == []


@pytest.mark.slow
@pytest.mark.distributed
def test_interrupted_multi_process_run_stops_together_and_resumes_on_other_count(tmp_path):
    # SIGINT to the launcher reaches every rank; they agree on the iteration to stop after
    # (the flag travels with the gathered scalars), checkpoint, exit 130; resuming on another
    # number of processes gives the uninterrupted run bit for bit
    import signal
    import time

    target = f"{DATA / 'slow_target.py'}:TARGET"  # >= 3 ms per iteration
    args = ["--preset", "none", "--target", target, "--chains", "4", "--seed", "6",
            "--iterations", "700", "--explorer", "rwmh", "--scheme", "deo"]
    out = tmp_path / "cut"
    cmd = [sys.executable, "-m", "nrpt", "run", *args, "--out", str(out), "--no-progress",
           "--figures", "false", "--nproc", "2"]
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 120
        while not (out / "config.toml").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.7)  # inside the run: 700 iterations take >= 2.1 s
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    cut = torch.load(out / "checkpoint.pt", weights_only=True)["engine"]["k"]
    assert 0 < cut < 700
    r = subprocess.run([sys.executable, "-m", "nrpt", "resume", str(out), "--no-progress",
                        "--nproc", "3"], capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0, r.stderr
    full = _cli([*args, "--out", str(tmp_path / "full")])
    assert full.returncode == 0, full.stderr
    assert _same(_records(tmp_path / "full"), _records(out)) == []


@pytest.mark.distributed
def test_rank_0_refusal_reaches_every_rank(tmp_path):
    # rank 0 owns the run folder; when it refuses (a run is already there), the other ranks
    # learn it from rank 0 and stop too, instead of waiting for it in a collective
    nrpt.sample("bimodal", chains=2, iterations=20, out=str(tmp_path / "busy"), figures=False)
    r = _cli(["--preset", "none", "--target", "bimodal", "--chains", "2", "--iterations", "20",
              "--out", str(tmp_path / "busy")], nproc=2)
    assert r.returncode == 2
    assert "already holds a run" in r.stderr and "rank 0 stopped the run" in r.stderr


@pytest.mark.slow
@pytest.mark.compile
@pytest.mark.distributed
def test_a_compiled_run_is_identical_on_1_and_2_processes(tmp_path):
    """compile = true with the replicas over 2 processes: each rank replays its block of the
    keyed draws into its compiled step, so the records equal the single-process run's."""
    one = nrpt.sample("twenty-five-modes", chains=6, systems=2, iterations=300, explorer="mala",
                      seed=4, out=str(tmp_path / "p1"), figures=False, compile=True)
    assert one.engine.explorer.describe()["compiled"]
    r = _cli([*EXACT, "--seed", "4", "--compile", "true", "--out", str(tmp_path / "p2")],
             nproc=2)
    assert r.returncode == 0, r.stderr
    assert "using the plain step" not in r.stderr  # no rank fell back (CompileWarning)
    assert _same(_records(one.out), _records(tmp_path / "p2")) == []
