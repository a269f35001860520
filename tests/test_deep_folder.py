"""A deep run lives in the same run folder as every other run: ``run.json`` (what ran: version,
settings, sha256 of the data and the model), checkpoints whose sidecar hash is verified on
resume (a damaged one is refused: the negative control), ``nrpt resume DIR`` continues it bit
for bit, and its methods are a table of builders that a new method joins by registering."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch
from torch import nn

from nrpt.deep import fit
from nrpt.run import folder as rf


def _mlp(seed=0):
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


def _data(seed=0, n=200):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 6, generator=g)
    y = (X @ torch.randn(6, 3, generator=g)).argmax(1)
    return (X[:150], y[:150]), (X[150:], y[150:])


OPTS = dict(method="deo", chains=3, epochs=3, seed=2, batch_size=25, lr_min=0.02, lr_max=0.2,
            swap_rate=0.3, strategy="vmap", checkpoint_every=100, pretrain_epochs=45,
            eval_every=3)


def _stop(engine):
    raise KeyboardInterrupt


def _interrupted(out, **kw):
    """A deep run stopped at its first callback (iteration 256 of the pretraining)."""
    train, test = _data()
    part = fit(_mlp(), train, test, out=out, callback=_stop, **{**OPTS, **kw})
    assert part.summary["interrupted"]
    return train, test


def test_a_deep_runs_folder_holds_run_json_and_verified_checkpoints(tmp_path):
    out = tmp_path / "run"
    train, test = _data()
    fit(_mlp(), train, test, out=out, **{**OPTS, "pretrain_epochs": 1})
    record = json.loads((out / rf.RUN_JSON).read_text())
    assert record["kind"] == "deep" and record["seed"] == 2 and record["nrpt_version"]
    assert record["settings"]["method"] == "deo" and record["settings"]["lr_max"] == 0.2
    assert set(record["data"]) == {"train", "test", "model"}
    assert record["data"]["train"]["shape"] == [150, 6]
    assert rf.run_kind(out) == "deep"
    for folder in (out, out / "pretrain"):
        side = json.loads((folder / rf.SIDECAR).read_text())
        data = (folder / rf.CHECKPOINT).read_bytes()
        assert side["sha256"] == hashlib.sha256(data).hexdigest() and side["size"] == len(data)
        assert side["run_id"] == record["run_id"]  # the checkpoint belongs to this run
        ck, _ = rf.read_checkpoint(folder)
        assert ck["header"]["run_id"] == record["run_id"]
    side = json.loads((out / "pretrained.pt.json").read_text())
    assert side["sha256"] == rf.sha256_file(out / "pretrained.pt")[0]
    assert not list(out.glob(".*.tmp*"))  # every file written through a temporary name


def test_a_damaged_deep_checkpoint_is_refused_on_resume(tmp_path):
    out = tmp_path / "run"
    train, test = _interrupted(out)
    for name in (rf.CHECKPOINT, rf.PREV_CHECKPOINT):
        data = bytearray((out / "pretrain" / name).read_bytes())
        data[len(data) // 2] ^= 0xFF  # one flipped byte: torch may still load it
        (out / "pretrain" / name).write_bytes(bytes(data))
    with pytest.raises(ValueError, match="fails its checksum"):
        fit(_mlp(), train, test, out=out, resume=True, **OPTS)


def test_a_damaged_newest_checkpoint_falls_back_and_still_resumes_bit_for_bit(tmp_path):
    """The negative control of the test above: the same folder with one good checkpoint left
    resumes (from the previous one, with a warning) to the uninterrupted run's result."""
    train, test = _data()
    whole = fit(_mlp(), train, test, **OPTS)
    out = tmp_path / "run"
    _interrupted(out)
    path = out / "pretrain" / rf.CHECKPOINT
    path.write_bytes(path.read_bytes()[:-100])  # truncated
    with pytest.warns(rf.CheckpointWarning, match="resuming from the previous checkpoint"):
        done = fit(_mlp(), train, test, out=out, resume=True, **OPTS)
    for key in ("accuracy", "nll_sum", "ece", "brier", "round_trips", "learning_rates",
                "swap_rates", "correction"):
        assert done.summary[key] == whole.summary[key], key


def test_a_damaged_pretrained_file_is_refused(tmp_path):
    out = tmp_path / "run"
    train, test = _data()
    opts = {**OPTS, "pretrain_epochs": 1, "epochs": 45}
    def stop_in_the_main_run(engine):
        if engine.k >= 256:  # (the pretraining has 6 iterations)
            raise KeyboardInterrupt

    part = fit(_mlp(), train, test, out=out, callback=stop_in_the_main_run, **opts)
    assert part.summary["interrupted"] and (out / "pretrained.pt").exists()
    data = bytearray((out / "pretrained.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF  # in the weights: torch loads it (other weights, silently)
    (out / "pretrained.pt").write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"pretrained.pt fails its checksum"):
        fit(_mlp(), train, test, out=out, resume=True, **opts)


@pytest.mark.parametrize("what", [pytest.param("train", marks=pytest.mark.slow),
                                  pytest.param("test", marks=pytest.mark.slow), "model"])
def test_resuming_with_other_data_or_another_model_is_refused(tmp_path, what):
    out = tmp_path / "run"
    train, test = _interrupted(out)
    other_train, other_test = _data(seed=5)
    args = {"train": (_mlp(), other_train, test), "test": (_mlp(), train, other_test),
            "model": (_mlp(seed=9), train, test)}[what]
    words = {"train": "training data", "test": "test data", "model": "model"}[what]
    with pytest.raises(ValueError, match=f"the {words} given is not the run's own"):
        fit(*args, out=out, resume=True, **OPTS)
    fit(_mlp(), train, test, out=out, resume=True, **OPTS)  # the run's own: resumes


# ------------------------------------------------------------------ nrpt resume DIR
CLI = ["deep", "--dataset", "digits", "--method", "deo-star", "--chains", "2", "--epochs", "4",
       "--seed", "0", "--no-progress", "--pretrain-epochs", "0", "--batch-size", "16",
       "--strategy", "vmap", "--swap-rate", "0.2", "--checkpoint-every", "100"]


@pytest.mark.slow  # 5 s; the test below keeps `nrpt resume` of a deep folder in the default run
def test_nrpt_resume_continues_a_deep_run_bit_for_bit(tmp_path, capsys, monkeypatch):
    import nrpt.deep.fitting as fitting
    from nrpt.run.cli import main

    assert main([*CLI, "--out", str(tmp_path / "whole")]) == 0
    real = fitting.fit

    def stopped(*a, **kw):  # the run is stopped at its first callback
        return real(*a, **{**kw, "callback": _stop})

    monkeypatch.setattr(fitting, "fit", stopped)
    out = tmp_path / "part"
    assert main([*CLI, "--out", str(out)]) == 130
    assert f"continue with: nrpt resume {out}" in capsys.readouterr().out
    part = json.loads((out / "summary.json").read_text())
    monkeypatch.setattr(fitting, "fit", real)
    assert main(["resume", str(out), "--iterations", "5"]) == 2
    assert "--iterations does not apply" in capsys.readouterr().err
    assert main(["resume", str(out), "--no-progress"]) == 0
    whole = json.loads((tmp_path / "whole" / "summary.json").read_text())
    done = json.loads((out / "summary.json").read_text())
    assert part["interrupted"] and part["iterations"] < done["iterations"]
    assert not done["interrupted"]
    for key in ("accuracy", "nll_sum", "ece", "brier", "round_trips", "learning_rates",
                "swap_rates", "correction", "iterations", "models_collected"):
        assert done[key] == whole[key], key
    assert np.array_equal(np.load(out / "index.npy"), np.load(tmp_path / "whole" / "index.npy"))
    from nrpt.deep.store import ModelStore

    a = ModelStore.open(out / "models").all()[0]
    b = ModelStore.open(tmp_path / "whole" / "models").all()[0]
    assert torch.equal(a, b)


def test_nrpt_resume_of_a_python_deep_run_says_how_to_resume_it(tmp_path, capsys):
    from nrpt.run.cli import main

    out = tmp_path / "run"
    _interrupted(out)
    assert main(["resume", str(out), "--no-progress"]) == 2
    assert "nrpt.deep.fit(..., out=DIR, resume=True)" in capsys.readouterr().err


# ------------------------------------------------------------------ methods table
def test_a_registered_method_runs_without_touching_fit():
    from nrpt.deep.methods import BUILDERS, Setup, method

    @method("test-ensemble-at-lr-max")
    def build(ctx) -> Setup:
        from nrpt.explorers.sgmcmc import MomentumSGD
        from nrpt.swap import Deterministic, NoSwap

        P = ctx.cfg.chains
        eng = ctx.engine(MomentumSGD(ctx.estimator, momentum=0.9), [0.0] * P,
                         ctx.cfg.lr_max / ctx.N, NoSwap(), Deterministic(0.0))
        return Setup(eng, list(range(P)), facts={"dummy": True})

    try:
        train, test = _data()
        opts = {k: v for k, v in OPTS.items() if k != "swap_rate"}  # (deo's, not this one's)
        res = fit(_mlp(), train, test, **{**opts, "method": "test-ensemble-at-lr-max",
                                          "pretrain_epochs": 0})
        assert res.summary["dummy"] is True and res.summary["models_collected"] >= 1
        assert res.summary["learning_rates"] == pytest.approx([0.2] * 3)
    finally:
        del BUILDERS["test-ensemble-at-lr-max"]
    with pytest.raises(ValueError, match="method must be one of"):  # negative control
        fit(_mlp(), train, test, **{**OPTS, "method": "test-ensemble-at-lr-max"})
