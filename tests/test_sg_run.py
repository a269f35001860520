"""Stochastic-gradient runs end to end: the headline DEO*-SGD configuration, `nrpt run`, resume,
minibatch / variance-reduced runs, and bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

import nrpt
from nrpt.run.cli import main
from nrpt.run.sgpt import HEADLINE
from nrpt.targets.minibatch import MixtureMeanModel


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
    arrays = res.trace()
    assert set(arrays) == {"k", "C", "learning_rates", "pair_rate"}
    assert arrays["C"].shape == (len(arrays["k"]), 1)
    assert arrays["learning_rates"].shape == (len(arrays["k"]), 1, 16)
    assert arrays["pair_rate"].shape == (len(arrays["k"]), 1, 15)
    assert arrays["C"][-1, 0] == pytest.approx(s["correction"])
    late = arrays["pair_rate"][arrays["k"] > 1500].mean()
    assert abs(late - 0.4) < 0.04
    assert res.samples.shape == (2250, 2)  # after the burn-in of 250
    assert s["round_trips_a5"] > 0


def test_nrpt_run_defaults_to_the_headline_and_nrpt_figures_draws_its_figures(tmp_path,
                                                                               capsys):
    out = tmp_path / "run"
    code = main(["run", "--iterations", "300", "--out", str(out), "--no-progress"])
    stdout = capsys.readouterr().out
    assert code == 0 and "correction C" in stdout and "learning rates" in stdout
    # figures are drawn on request: the run says how, and draws none itself
    assert f"`nrpt figures {out}` draws them" in stdout
    assert not list(out.glob("*.png"))
    assert main(["figures", str(out)]) == 0
    assert "3 figures in" in capsys.readouterr().out
    s = json.loads((out / "summary.json").read_text())
    assert s["window"] == 8 and s["chains"] == 16 and s["explorer"] == "sgd"
    # the summary names the target as configured: the spec and its options
    assert s["target"] == "twenty-five-modes" and s["target_options"] == {"penalty": True}
    assert isinstance(s["correction"], float) and len(s["learning_rates"]) == 16
    for name in ("density.png", "index_process.png", "adaptation.png",
                 "adaptation.npz", "config.toml", "checkpoint.pt"):
        assert (out / name).exists(), name
    # (the per-pair swap rates: adaptation.png's last panel; swap_acceptance.png with "all")
    assert not (out / "swap_acceptance.png").exists()
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
                window="auto", seed=3, checkpoint_every=120, figures=False)
    full = nrpt.sample("twenty-five-modes", out=str(tmp_path / "full"), **opts)

    def interrupt(engine):
        if engine.k >= 300:
            raise KeyboardInterrupt

    part = nrpt.run_config(nrpt.RunConfig(out=str(tmp_path / "cut"), **opts),
                           callback=interrupt)
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
    # an SGD explorer has temperature 0 above slot 0: only the deterministic rule (or always)
    (dict(swap_rule="metropolis"), "swap_rule must be one of deterministic, always for "
                                   "explorer 'sgd'"),
    (dict(swap_rule="bias-corrected"), "where a Metropolis swap is undefined"),
    # settings that do not apply are errors, never silently ignored
    (dict(step_size=0.1), "step_size does not apply .* takes learning rates"),
    (dict(temperatures=[1.0, 2.0, 3.0, 4.0]), "temperatures does not apply"),
    (dict(variance_every=10), "variance_every does not apply"),
    (dict(adapt=False, swap_rate=0.3), "swap_rate does not apply"),
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
    for rule in ("deterministic", "bias-corrected"):
        with pytest.raises(ValueError, match="swap_rule must be one of metropolis, always for "
                                             "explorer 'rwmh' \\(exact explorers swap with exact"):
            nrpt.RunConfig(explorer="rwmh", swap_rule=rule)
    for name in ("noise_sd", "batch_size", "lr_max"):
        with pytest.raises(ValueError,
                           match=f"{name} does not apply to this exact run \\(explorer 'rwmh'"):
            nrpt.RunConfig(explorer="rwmh", **{name: 2.0 if name != "batch_size" else 10})


def regression_data(n_data=100, seed=0):
    """1-D linear regression y_i = 2 a_i + N(0, 1), loss (y_i - a_i x)^2 / 2, flat prior: at a
    large x the per-datum losses differ like a_i^2 x^2, so their variance grows like x^4."""
    import torch

    from nrpt.targets.minibatch import MinibatchTarget

    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n_data, generator=g, dtype=torch.float64)
    y = 2.0 * a + torch.randn(n_data, generator=g, dtype=torch.float64)
    return MinibatchTarget(torch.stack([a, y], 1),
                           lambda x, b: 0.5 * (b[..., 1] - b[..., 0] * x[:, :1]) ** 2, dim=1,
                           name="regression")


@pytest.mark.parametrize("case", ["sgd-oracle", "sgld-minibatch", "sgld-control-variate"])
def test_a_diverging_float32_sg_run_completes_and_reports_it(case, tmp_path):
    # learning rates far above 2 / curvature: the iterates blow up geometrically until a step
    # overflows float32; such steps are rejected (the replica keeps its state) and counted.  The
    # minibatch energies' variance estimates overflow to inf first, which once made the summary
    # raise "sigma must hold 3 or 4 finite numbers" and lose the run.
    if case == "sgd-oracle":
        target, opts = "twenty-five-modes", dict(explorer="sgd", noise_sd=2.0, lr_min=10.0,
                                                 lr_max=1e4, target_options={"penalty": True})
    else:
        target = regression_data()
        opts = dict(explorer="sgld", batch_size=10, max_temperature=8.0,
                    learning_rates=[0.1, 1.0, 10.0, 100.0])
        if case == "sgld-control-variate":
            opts["vr_every"] = 5
    out = tmp_path / "run"
    res = nrpt.sample(target, chains=4, iterations=120, systems=2, dtype="float32",
                      out=str(out), seed=1, **opts)
    s = res.summary
    assert s["n_iterations"] == 120 and not s["interrupted"]
    assert s["nonfinite_proposals"] > 0
    assert f"rejected non-finite proposals: {s['nonfinite_proposals']}" in str(res)
    assert res.samples.shape == (2, 108, target.dim if case != "sgd-oracle" else 2)  # burn-in 12
    assert np.isfinite(res.samples).all()  # rejected steps keep the last finite state
    assert np.abs(res.samples).max() > 1e10  # ... which has diverged
    if case != "sgd-oracle":
        # the minibatch variance estimates overflowed (so the test exercises that path) ...
        assert not bool(res.engine.state.extras["energy_var"].isfinite().all())
        # ... and the summary gives no chain recommendation instead of raising
        assert s["recommended_chains_noisy"] == [None, None]
    # summary.json is written and is strict JSON (non-finite numbers become null)
    text = (out / "summary.json").read_text()

    def no_constants(name):
        raise AssertionError(f"summary.json holds {name}")

    on_disk = json.loads(text, parse_constant=no_constants)
    assert on_disk["nonfinite_proposals"] == s["nonfinite_proposals"]
    for name in ("config.toml", "checkpoint.pt", "samples.npy", "adaptation.npz"):
        assert (out / name).exists(), name
