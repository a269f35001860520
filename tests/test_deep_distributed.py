"""Network replicas across processes (``nrpt deep --nproc N``): for a fixed seed 1, 2 and 4 gloo
processes give bit-for-bit the same model average, index process, per-epoch rows and summary
(and 3 processes over 4 chains, one of them holding no replica);
a checkpoint written by 2 processes resumes on 1 to the uninterrupted run's result; a changed
seed *is* detected (negative control).

What makes it hold, tested here in the default run (fast, one process): the keyed minibatch
sampler's law (:class:`nrpt.deep.energy.EpochBatches`: every batch a uniformly random
``B``-subset, no duplicates, each example in it with probability ``B / N``, every example seen
in an epoch) and the block invariance of the minibatch energy's rows (a replica's batch,
augmentation and dropout are keyed by its global index: its rows evaluated in a block of ``P``
or of ``P / 2`` replicas are equal), each with a negative control."""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import nrpt.deep.energy as deep_energy
from nrpt.deep.energy import EpochBatches, NetworkEnergy, NetworkTarget
from nrpt.deep.replicas import FunctionalNet
from nrpt.deep.store import INDEX, MODELS_DIR, ModelStore
from nrpt.rng import Block, Key


# ------------------------------------------------------------------ the keyed sampler's law
def _inclusion_stat(counts: torch.Tensor, draws: int, p: float) -> float:
    """``sum_i (c_i - T p)^2 / (T p (1 - p))`` over the ``N`` examples: mean ``N`` when each
    of ``T`` independent batches holds example ``i`` with probability ``p`` (sd about
    ``sqrt(2 N)``)."""
    mean = draws * p
    return float(((counts - mean) ** 2).sum() / (mean * (1 - p)))


def _counts(sampler, N: int, B: int, position: int, epochs: int, P: int = 2):
    """Inclusion counts of every example in the batches at ``position`` of ``epochs`` epochs of
    ``P`` replicas, and the batches' duplicate count."""
    counts, dups = torch.zeros(N), 0
    E = math.ceil(N / B)
    for e in range(epochs):
        idx = sampler(Key((7, e * E + position, 0, 1)), (1, P), "cpu")  # [1, P, B]
        for row in idx.reshape(P, B):
            dups += B - len(set(row.tolist()))
            counts[row] += 1
    return counts, dups


def test_epoch_batches_are_uniform_subsets_without_duplicates():
    N, B, epochs, P = 50, 8, 1000, 2  # 7 batches per epoch, the last overlapping the 6th
    sampler = EpochBatches(N, B)
    bound = 6 * math.sqrt(2 * N)
    for position in (0, 3, 6):
        counts, dups = _counts(sampler, N, B, position, epochs, P)
        assert dups == 0
        stat = _inclusion_stat(counts, epochs * P, B / N)
        assert abs(stat - N) < bound, (position, stat)
    # within an epoch a replica sees every example
    seen = torch.cat([sampler(Key((7, j, 0, 1)), (1, 1), "cpu").reshape(-1) for j in range(7)])
    assert set(seen.tolist()) == set(range(N))
    # keyed: the same key gives the same batch (a fresh sampler too), another replica another
    a = EpochBatches(N, B)(Key((7, 3, 0, 1)), (1, 2), "cpu")
    assert torch.equal(a, sampler(Key((7, 3, 0, 1)), (1, 2), "cpu"))
    assert not torch.equal(a[0, 0], a[0, 1])
    assert torch.equal(a, sampler((7, 3, 0, 1), (1, 2), "cpu"))  # a plain tuple key too


def test_epoch_batches_law_test_detects_a_biased_sampler():
    """Negative control: a sampler that never draws example 0 (a uniform subset of the others)
    fails the inclusion test; one drawing with replacement fails the duplicate count."""
    N, B, epochs, P = 50, 8, 1000, 2
    inner = EpochBatches(N - 1, B)

    def biased(key, lead, device):
        return inner(key, lead, device) + 1

    counts, dups = _counts(biased, N, B, 0, epochs, P)
    assert dups == 0
    assert abs(_inclusion_stat(counts, epochs * P, B / N) - N) > 6 * math.sqrt(2 * N)

    def with_replacement(key, lead, device):
        g = torch.Generator().manual_seed(int(key[1]))
        return torch.randint(N, (*lead, B), generator=g)

    _, dups = _counts(with_replacement, N, B, 0, 200, P)
    assert dups > 0


def test_epoch_batches_cost_no_full_width_draw():
    # one permutation per replica and epoch, stacked and cached per block: the per-iteration
    # cost is one slice
    sampler = EpochBatches(1000, 10)
    sampler(Key((1, 0, 0, 1)), (1, 3), "cpu")
    perms = dict(sampler._perms)
    sampler(Key((1, 5, 0, 1)), (1, 3), "cpu")  # same epoch: the same cached permutations
    assert all(sampler._perms[k][1] is v[1] for k, v in perms.items())
    assert len(sampler._perms) == 1 and next(iter(perms.values()))[1].shape == (3, 1000)


# ------------------------------------------------------------------ block invariance of rows
def _shift_augment(x, generator):
    """A keyed augmentation: a random shift per example (what CIFAR's crops do)."""
    return x + torch.randn(x.shape[0], 1, generator=generator, dtype=x.dtype)


def _estimator():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(40, 6, generator=g)
    y = torch.randint(3, (40,), generator=g)
    with torch.random.fork_rng(devices=[]):  # (the layers' own initialisation, seeded)
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 12), nn.BatchNorm1d(12), nn.ReLU(), nn.Dropout(0.3),
                              nn.Linear(12, 3))
    net = FunctionalNet(model)
    target = NetworkTarget(net, X, y, weight_decay=1e-3, augment=_shift_augment,
                           strategy="loop")
    P = 4
    theta0, buf0 = net.pack()
    x = theta0 + 0.05 * torch.randn(1, P, net.dim, generator=g)
    target.initial_buffers = buf0  # (one row: every replica starts from it)
    return NetworkEnergy(target, 8), x


def _rows(est, x, blocks):
    """The estimate's rows of every replica, evaluated block by block (a process each)."""
    parts = []
    for lo, hi in blocks:
        key = Key((5, 11, 0, 1), Block(lo, hi, x.shape[1]))
        xs = x[:, lo:hi]
        extras = est.init_extras(xs, key)
        parts.append(est(xs, key, extras, need_grad=True))
    return {"u": torch.cat([e.u for e in parts], 1), "grad": torch.cat([e.grad for e in parts], 1),
            "var": torch.cat([e.var for e in parts], 1),
            "bn": torch.cat([e.extras["bn"] for e in parts], 1)}


def test_energy_rows_do_not_depend_on_the_block():
    est, x = _estimator()
    whole = _rows(est, x, [(0, 4)])
    halves = _rows(est, x, [(0, 2), (2, 4)])
    uneven = _rows(est, x, [(0, 3), (3, 4)])
    for name in whole:
        assert torch.equal(whole[name], halves[name]), name
        assert torch.equal(whole[name], uneven[name]), name
    assert len(set(whole["u"][0].tolist())) == 4  # (distinct replicas: distinct rows)


def test_block_invariance_test_detects_keys_of_the_local_block(monkeypatch):
    """Negative control: keying the draws by the row's place in the process's block (as a
    draw for the local batch as a whole does) instead of the replica's global index changes
    the second block's rows."""
    est, x = _estimator()
    whole = _rows(est, x, [(0, 4)])
    monkeypatch.setattr(deep_energy, "replica_ids",
                        lambda lead, key: [(s, r) for s in range(lead[0])
                                           for r in range(lead[1])])
    halves = _rows(est, x, [(0, 2), (2, 4)])
    assert torch.equal(whole["u"][:, :2], halves["u"][:, :2])
    assert not torch.equal(whole["u"][:, 2:], halves["u"][:, 2:])


# ------------------------------------------------------------------ processes
ENV = dict(os.environ, OMP_NUM_THREADS="1")
RUN = ["--dataset", "digits", "--model", "mlp", "--chains", "4", "--epochs", "2",
       "--pretrain-epochs", "1", "--strategy", "loop", "--checkpoint-every", "12"]
TIMING = {"wall_time_s", "loop_time_s", "strategy_timings_s"}


def _deep(args: list[str], nproc: int | str | None = None) -> subprocess.CompletedProcess:
    """``nrpt deep ARGS`` in one process, ``--nproc N``, or (``nproc="torchrun2"``) under
    ``torchrun --nproc-per-node 2``."""
    cmd = [sys.executable, "-m", "nrpt", "deep", *args, "--no-progress"]
    if nproc == "torchrun2":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", *cmd[1:]]
    elif nproc is not None:
        cmd += ["--nproc", str(nproc)]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)


def _records(out: Path) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    models, buffers = ModelStore.open(out / MODELS_DIR).all()
    with open(out / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    return {"summary": {k: v for k, v in summary.items() if k not in TIMING},
            "index": np.load(out / "index.npy"), "models": models,
            "buffers": buffers, "rows": rows,
            "files": sorted(p.name for p in out.iterdir() if p.name != ".nrpt.lock")}


def _same(a: dict, b: dict) -> list[str]:
    diff = [k for k in ("index",) if not np.array_equal(a[k], b[k])]
    diff += [k for k in ("models", "buffers") if not torch.equal(a[k], b[k])]
    diff += [f"summary.{k}" for k in a["summary"] if a["summary"][k] != b["summary"].get(k)]
    diff += [k for k in ("rows", "files") if a[k] != b[k]]
    return diff


@pytest.mark.distributed
@pytest.mark.parametrize("method", ["deo-star", "ensemble"])
def test_deep_run_is_identical_on_1_2_and_4_processes(tmp_path, method):
    runs = {}
    extra = ["--window", "2"] if method == "deo-star" else []  # (swaps: windows of 2)
    # (ensemble on 3 processes: blocks of 2, 2 and 0 replicas, a rank holding none; and
    # launched by torchrun)
    for n in (None, 2, 4) if method == "deo-star" else (None, 3, "torchrun2"):
        out = tmp_path / f"p{n}"
        r = _deep([*RUN, "--method", method, *extra, "--seed", "3", "--out", str(out)],
                  nproc=n)
        assert r.returncode == 0, r.stderr
        runs[n] = _records(out)
    ref = runs[None]
    assert ref["summary"]["models_collected"] > 0 and ref["summary"]["accuracy"] > 0.5
    if method == "deo-star":
        assert len({tuple(r) for r in ref["index"].tolist()}) > 2  # swaps happened
    for n, rec in runs.items():
        assert _same(ref, rec) == [], n
    if method == "deo-star":  # negative control: another seed is detected
        out = tmp_path / "other"
        assert _deep([*RUN, "--method", method, *extra, "--seed", "4", "--out",
                      str(out)]).returncode == 0
        diff = _same(ref, _records(out))
        assert "models" in diff and "summary.nll_sum" in diff


@pytest.mark.distributed
def test_a_2_process_checkpoint_resumes_on_1(tmp_path):
    """The 2-process run's checkpoint before its end (checkpoint.prev.pt: iteration 12 of 22)
    resumed by one process gives the uninterrupted run's result."""
    full = tmp_path / "full"
    r = _deep([*RUN, "--method", "deo-star", "--window", "2", "--seed", "5", "--out",
               str(full)], nproc=2)
    assert r.returncode == 0, r.stderr
    cut = tmp_path / "cut"
    shutil.copytree(full, cut)
    for name in ("checkpoint.pt", "checkpoint.json", "summary.json", "metrics.csv",
                 f"{MODELS_DIR}/{INDEX}"):
        (cut / name).unlink()
    ck = torch.load(cut / "checkpoint.prev.pt", weights_only=False)
    assert 0 < ck["engine"]["k"] < 22
    r = subprocess.run([sys.executable, "-m", "nrpt", "resume", str(cut), "--no-progress"],
                       capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0, r.stderr
    a, b = _records(full), _records(cut)
    a["files"] = b["files"] = []
    assert _same(a, b) == []


@pytest.mark.distributed
def test_a_single_chain_method_refuses_several_processes(tmp_path):
    r = _deep([*RUN[:6], "--method", "swag", "--out", str(tmp_path / "s")], nproc=2)
    assert r.returncode != 0
    assert "runs one chain, in one process" in r.stderr


def test_a_deep_run_that_cannot_be_spread_is_refused_before_any_launch(tmp_path, capsys):
    from nrpt.run.cli import main

    out = tmp_path / "r"
    assert main(["deep", "--dataset", "digits", "--chains", "2", "--out", str(out),
                 "--nproc", "3"]) == 2
    assert "3 processes for 2 chains" in capsys.readouterr().err
    assert main(["deep", "--dataset", "digits", "--method", "swag", "--out", str(out),
                 "--nproc", "2"]) == 2
    assert "runs one chain, in one process" in capsys.readouterr().err
    assert not out.exists()  # nothing was started
