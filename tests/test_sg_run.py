"""Stochastic-gradient runs end to end: the headline DEO*-SGD configuration, `nrpt run`, resume,
minibatch / variance-reduced runs, and bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

import nrpt
from nrpt.cli import main
from nrpt.sgpt import HEADLINE
from nrpt.targets.noisy import MixtureMeanModel


def headline(**over):
    opts = {k: v for k, v in HEADLINE.items() if k != "target"}
    opts["target_options"] = dict(opts["target_options"])
    opts.update(over)
    return nrpt.sample(HEADLINE["target"], **opts)


def test_headline_adapts_c_and_learning_rates_toward_the_swap_rate():
    res = headline(iterations=2500, seed=1)
    s = res.summary
    assert s["window"] == 8 and s["explorer"] == "sgd" and s["rule"] == "deterministic"
    lr = s["learning_rates"]
    assert len(lr) == 16 and lr[0] == 0.003 and lr[-1] == pytest.approx(0.6, rel=1e-12)
    assert all(b > a for a, b in zip(lr, lr[1:], strict=False))
    assert isinstance(s["correction"], float) and s["correction"] < 4.0
    # the C adaptor drives the mean 0/1 indicator over all pairs to S = 0.4; over the last
    # 1000 iterations x 15 pairs the binomial se is ~0.004, the SA fluctuation of C adds more
    arrays = res.engine.sg.trace.arrays()
    late = arrays["pair_rate"][arrays["k"] > 1500].mean()
    assert abs(late - 0.4) < 0.04
    assert res.samples.shape == (2500, 2)
    assert s["round_trips_a5"] > 0


def test_nrpt_run_defaults_to_the_headline_and_writes_figures(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["run", "--iterations", "300", "--out", str(out), "--no-progress"])
    stdout = capsys.readouterr().out
    assert code == 0 and "correction C" in stdout and "learning rates" in stdout
    s = json.loads((out / "summary.json").read_text())
    assert s["window"] == 8 and s["chains"] == 16 and s["explorer"] == "sgd"
    assert s["target"] == "twenty-five-modes-penalized"
    assert isinstance(s["correction"], float) and len(s["learning_rates"]) == 16
    for name in ("density.png", "index.png", "adaptation.png", "adaptation.npz"):
        assert (out / name).exists(), name
    code = main(["run", "--iterations", "200", "--window", "1", "--out", str(tmp_path / "w1"),
                 "--no-progress"])
    assert code == 0
    assert json.loads((tmp_path / "w1" / "summary.json").read_text())["window"] == 1
    capsys.readouterr()
    code = main(["run", "--iterations", "100", "--preset", "none", "--no-progress"])
    assert code == 0 and "correction C" not in capsys.readouterr().out


def test_sample_defaults_stay_exact_parallel_tempering():
    res = nrpt.sample("twenty-five-modes", iterations=50)
    assert res.summary["explorer"] == "rwmh" and "learning_rates" not in res.summary


def test_interrupted_sg_run_resumes_bit_for_bit(tmp_path):
    opts = dict(explorer="sgd", chains=6, iterations=500, noise_sd=2.0, scheme="deo-w",
                window="auto", seed=3, checkpoint_every=120)
    full = nrpt.sample("twenty-five-modes", out=str(tmp_path / "full"), **opts)

    def interrupt(engine):
        if engine.k >= 300:
            raise KeyboardInterrupt

    from nrpt.api import _run

    part = _run(nrpt.RunConfig(out=str(tmp_path / "cut"), **opts), callback=interrupt)
    assert part.summary["interrupted"]
    resumed = nrpt.resume(tmp_path / "cut")
    assert np.array_equal(resumed.samples, full.samples)
    assert np.array_equal(resumed.index, full.index)
    assert resumed.summary["correction"] == full.summary["correction"]
    assert resumed.summary["learning_rates"] == full.summary["learning_rates"]


def test_minibatch_run_with_variance_reduction_reports_the_reduction():
    model = MixtureMeanModel(n_data=200)
    common = dict(explorer="sgld", chains=4, iterations=300, batch_size=20, max_temperature=20.0,
                  learning_rates=[1e-3, 2e-3, 4e-3, 8e-3], seed=2, variance_every=20)
    plain = nrpt.sample(model, **common)
    vr = nrpt.sample(model, vr_every=10, **common)
    assert plain.summary["rule"] == "bias-corrected" and plain.summary["energy"] == "minibatch"
    assert vr.summary["energy"] == "control-variate"
    assert vr.summary["variance_reduction"] > 5
    assert np.isfinite(vr.samples).all()


@pytest.mark.parametrize("over, message", [
    (dict(swap_rate=0.0), "swap_rate"),
    (dict(swap_rate=1.0), "swap_rate"),
    (dict(swap_rate=1.5), "swap_rate"),
    (dict(learning_rates=[0.1, 0.05, 0.2, 0.3]), "strictly increasing"),
    (dict(lr_min=0.5, lr_max=0.1), "lr_max"),
    (dict(swap_rule="metropolis"), "temperature at every slot"),
    (dict(noise_sd=-1.0), "noise_sd"),
    (dict(domain="box:5,6"), "outside the domain"),
    (dict(batch_size=64), "batch_size needs a data target"),
])
def test_bad_sg_input_fails_with_a_clear_message(over, message):
    opts = dict(explorer="sgd", chains=4, iterations=5)
    opts.update(over)
    with pytest.raises(ValueError, match=message):
        nrpt.sample("twenty-five-modes", **opts)


def test_batch_larger_than_the_data_through_the_config():
    with pytest.raises(ValueError, match=r"batch_size \(300\) is larger than the data"):
        nrpt.sample(MixtureMeanModel(n_data=200), explorer="sgld", chains=3, iterations=5,
                    batch_size=300)


def test_exact_explorers_refuse_the_noisy_rules():
    with pytest.raises(ValueError, match="stochastic-gradient explorers"):
        nrpt.RunConfig(explorer="rwmh", swap_rule="deterministic")
