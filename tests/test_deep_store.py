"""The collected models of a deep run stream to the run folder (``models/``,
:class:`nrpt.deep.store.ModelStore`): the checkpoint keeps the running sums and a fixed-size
head (its size does not grow with the number of models collected), ``predict_proba`` reads
the models back in chunks and equals the in-memory average, a resume is exact and removes the
entries written after its checkpoint, and a missing, truncated or replaced file is refused on
resume with an error naming it (the negative controls)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from torch import nn

from nrpt.deep import fit
from nrpt.deep.metrics import evaluate
from nrpt.run import folder as rf


def _mlp(seed=0, width=128):
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(6, width), nn.BatchNorm1d(width), nn.ReLU(),
                             nn.Linear(width, 3))


def _data(seed=0, n=200):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 6, generator=g)
    y = (X @ torch.randn(6, 3, generator=g)).argmax(1)
    return (X[:150], y[:150]), (X[150:], y[150:])


# 6 iterations per epoch; the main run is 18 iterations, models collected after iteration 4
SMALL = dict(method="ensemble", chains=3, epochs=3, seed=1, batch_size=25, strategy="vmap",
             pretrain_epochs=1, eval_every=3, checkpoint_every=100)


def test_the_checkpoint_does_not_grow_with_the_models_collected(tmp_path):
    """2 vs 7 collections of 3 models (~6 KB each) in runs of the same length: the
    checkpoints differ by a few bytes (they held every model before: ~90 KB more)."""
    train, test = _data()
    sizes, per_model = {}, None
    for every in (7, 2):
        out = tmp_path / f"every{every}"
        res = fit(_mlp(), train, test, out=out, collect_every=every, **SMALL)
        sizes[every] = ((out / rf.CHECKPOINT).stat().st_size, res.summary["models_collected"])
        per_model = 4 * res.net.dim
    (small, n_small), (big, n_big) = sizes[7], sizes[2]
    assert (n_small, n_big) == (6, 21)
    assert (n_big - n_small) * per_model > 80_000  # what the old checkpoints grew by
    assert abs(big - small) < 2_000, sizes


def test_predict_proba_streams_the_stored_models_and_equals_the_in_memory_average(tmp_path):
    from nrpt.deep.store import ModelStore

    train, test = _data()
    opts = {**SMALL, "collect_every": 2}
    on_disk = fit(_mlp(), train, test, out=tmp_path / "run", **opts)
    in_memory = fit(_mlp(), train, test, **opts)  # no folder: the models stay in memory
    assert on_disk.store.folder is not None and in_memory.store.folder is None
    assert len(list((tmp_path / "run" / "models").glob("*.pt"))) == 7
    Xte, yte = test
    p = on_disk.predict_proba(Xte)
    # the same models, read back from disk 1, 4 or all at a time
    for chunk in (1, 4, 100):
        assert torch.allclose(on_disk.predict_proba(Xte, chunk=chunk), p, rtol=0, atol=1e-12)
    assert torch.allclose(in_memory.predict_proba(Xte), p, rtol=0, atol=1e-12)
    # ... and it is the run's own running average (the summary's metrics)
    assert evaluate(p, yte)["nll_sum"] == pytest.approx(on_disk.summary["nll_sum"], rel=1e-9)
    lp = on_disk.predict_proba(Xte, average="logits")
    assert evaluate(lp, yte)["nll_sum"] == pytest.approx(
        on_disk.summary["logits_average"]["nll_sum"], rel=1e-9)
    # readable after the fact from its listing, each file verified
    store = ModelStore.open(tmp_path / "run" / "models")
    assert len(store) == 21 and torch.equal(store.all()[0], in_memory.models)
    assert torch.equal(on_disk.buffers, in_memory.buffers)
    with pytest.raises(ValueError, match="chunk must be an integer >= 1"):
        on_disk.predict_proba(Xte, chunk=0)


# ------------------------------------------------------------------ resume
OPTS = dict(method="deo", chains=3, epochs=50, seed=2, batch_size=25, lr_min=0.02, lr_max=0.2,
            swap_rate=0.3, strategy="vmap", checkpoint_every=100, pretrain_epochs=1,
            eval_every=25)
KEYS = ("accuracy", "nll_sum", "ece", "brier", "round_trips", "models_collected")


def _stop_in_the_main_run(engine):
    if engine.k >= 256:  # (the pretraining has 6 iterations; 30 models collected by then)
        raise KeyboardInterrupt


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """A deep run stopped at iteration 256 of its 300 (with models stored), and the same run
    uninterrupted."""
    train, test = _data()
    base = tmp_path_factory.mktemp("store")
    part = fit(_mlp(width=8), train, test, out=base / "run", callback=_stop_in_the_main_run,
               **OPTS)
    assert part.summary["interrupted"]
    whole = fit(_mlp(width=8), train, test, **OPTS)
    return base / "run", whole, train, test


def _copy(src, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(src, dst, symlinks=True)
    return dst


def test_a_resume_is_exact_and_drops_entries_written_after_its_checkpoint(interrupted,
                                                                         tmp_path):
    src, whole, train, test = interrupted
    out = _copy(src, tmp_path)
    files = sorted((out / "models").glob("*.pt"))
    n = len(files)
    assert n > 2
    # an interruption between a store append and the next checkpoint leaves entries the
    # checkpoint does not count (here: a stray copy); the resume removes them
    shutil.copy(files[0], out / "models" / f"{n + 1:06d}.pt")
    done = fit(_mlp(width=8), train, test, out=out, resume=True, **OPTS)
    for key in KEYS:
        assert done.summary[key] == whole.summary[key], key
    assert torch.equal(done.models, whole.models)
    assert torch.equal(done.predict_proba(test[0]), whole.predict_proba(test[0]))
    assert np.array_equal(done.index, whole.index) and done.index.shape == (300, 3)
    assert np.array_equal(np.load(out / "index.npy"), whole.index)


def test_a_resume_from_an_older_checkpoint_rewrites_the_later_entries(interrupted, tmp_path):
    """The newest checkpoint damaged: the resume falls back to the one before (iteration 200),
    which counts fewer collections than models/ holds; those after it are removed and
    collected again, and the run ends as the uninterrupted one did."""
    src, whole, train, test = interrupted
    out = _copy(src, tmp_path)
    before = len(list((out / "models").glob("*.pt")))
    ck = out / rf.CHECKPOINT
    ck.write_bytes(ck.read_bytes()[:-100])
    older = torch.load(out / rf.PREV_CHECKPOINT, weights_only=True)
    assert older["recorders"]["bma"]["store"]["count"] < before
    with pytest.warns(rf.CheckpointWarning, match="resuming from the previous checkpoint"):
        done = fit(_mlp(width=8), train, test, out=out, resume=True, **OPTS)
    for key in KEYS:
        assert done.summary[key] == whole.summary[key], key
    assert torch.equal(done.models, whole.models)
    assert np.array_equal(done.index, whole.index)


def test_a_checkpoint_with_models_inline_is_refused_by_name():
    from nrpt.deep.recorders import BMARecorder

    rec = BMARecorder(None, None, None, every=1, start=0, slots=[0], strategy="loop")
    old = {"bma": rec.bma.state_dict(), "models": [], "buffers": [], "collected_at": []}
    with pytest.raises(ValueError, match="keeps its collected models inline"):
        rec.load_state_dict(old)


def test_the_index_process_is_stored_once_and_checked_on_resume(interrupted, tmp_path):
    """The checkpoint keeps the number of rows and their sha256, not the rows (index.npy holds
    them); a changed index.npy is refused on resume (negative control)."""
    src, _, train, test = interrupted
    ck = torch.load(src / rf.CHECKPOINT, weights_only=True)
    assert set(ck["recorders"]["index"]) == {"n", "sha256"} and ck["recorders"]["index"]["n"] == 256
    out = _copy(src, tmp_path)
    idx = np.load(out / "index.npy")
    assert idx.shape == (256, 3)
    idx[100] = idx[100][::-1]
    np.save(out / "index.npy", idx)
    with pytest.raises(ValueError, match=r"index.npy fails its checksum"):
        fit(_mlp(width=8), train, test, out=out, resume=True, **OPTS)


def _damage(out, how):
    files = sorted((out / "models").glob("*.pt"))
    if how == "missing":
        files[1].unlink()
    elif how == "truncated":
        files[1].write_bytes(files[1].read_bytes()[:-50])
    elif how == "replaced":  # a valid collection, but not this one
        shutil.copy(files[0], files[1])
    elif how == "flipped":
        data = bytearray(files[1].read_bytes())
        theta = torch.load(files[1], weights_only=True)["theta"]
        at = bytes(data).find(theta.numpy().tobytes()[:16])
        assert at > 0
        data[at + 3] ^= 0x40  # in the weights: torch loads it (other weights, silently)
        files[1].write_bytes(bytes(data))
    return files[1].name


@pytest.mark.parametrize("how", ["missing", "truncated", "replaced", "flipped"])
def test_a_damaged_model_store_is_refused_on_resume(interrupted, tmp_path, how):
    src, _, train, test = interrupted
    out = _copy(src, tmp_path)
    name = _damage(out, how)
    match = {"missing": f"missing .*{name}", "truncated": "model store|not a readable",
             "replaced": "does not match the checkpoint",
             "flipped": "does not match the checkpoint"}[how]
    with pytest.raises(ValueError, match=match):
        fit(_mlp(width=8), train, test, out=out, resume=True, **OPTS)


def test_a_store_changed_after_the_run_is_refused_when_read(interrupted, tmp_path):
    """The negative control of predict_proba: a file changed under a live result is refused
    (its sha256 was recorded when written), not averaged in silently."""
    src, _, train, test = interrupted
    out = _copy(src, tmp_path)
    done = fit(_mlp(width=8), train, test, out=out, resume=True, **OPTS)
    done.predict_proba(test[0])
    _damage(out, "flipped")
    with pytest.raises(ValueError, match="fails its checksum"):
        done.predict_proba(test[0])


def test_a_linked_model_store_is_refused(interrupted, tmp_path):
    from nrpt.files import UnsafeFile

    src, _, train, test = interrupted
    out = _copy(src, tmp_path)
    (out / "models").rename(tmp_path / "elsewhere")
    (out / "models").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafeFile, match="symbolic link"):
        fit(_mlp(width=8), train, test, out=out, resume=True, **OPTS)
