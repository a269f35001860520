"""The round-based driver end to end: run folder contract and summary fields, ArviZ export,
resume at round boundaries (bit for bit), the CLI, explorer tuning between rounds, the
label-switching mixture example, and bad input (clear messages, no crash mid-run)."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
import torch

import nrpt
from nrpt.api import _run
from nrpt.cli import main
from nrpt.config import RunConfig
from nrpt.diagnostics import count_round_trips
from nrpt.report import import_arviz
from nrpt.rounds import RoundsResult, round_lengths, sample_adaptive
from nrpt.target import TargetError
from nrpt.targets import Gaussian
from nrpt.targets.gaussian_path import ScaledGaussianPath
from nrpt.targets.mixture_model import mixture_model

SMALL = {"dim": 3, "c": 4.0}


def test_round_lengths_double():
    assert round_lengths(4) == [2, 4, 8, 16]


def test_run_folder_contract_summary_and_arviz_export(tmp_path):
    out = tmp_path / "run"
    res = nrpt.sample("geometric-gaussian-path", target_options=SMALL, rounds=6, chains=6,
                      systems=2, explorer="slice", seed=3, out=str(out))
    assert isinstance(res, RoundsResult)
    K = sum(round_lengths(6))
    for name in ("config.toml", "summary.json", "samples.npy", "energies.npy", "index.npy",
                 "rounds.csv", "rounds.json", "report.txt", "checkpoint.pt", "posterior.nc",
                 "index_process.png", "swap_acceptance.png", "local_barrier.png",
                 "schedules.png"):
        assert (out / name).is_file(), name
    # samples: the last round (64 iterations) of both systems; index: every iteration
    assert np.load(out / "samples.npy").shape == (2, 64, 3) == res.samples.shape
    assert np.load(out / "energies.npy").shape == (2, 64)
    index = np.load(out / "index.npy")
    assert index.shape == (K + 1, 2, 6) and np.array_equal(index, res.index)
    s = json.loads((out / "summary.json").read_text())
    assert s["n_iterations"] == K and s["rounds"] == 6 and "last round" in s["statistics_from"]
    for key in ("log_normalizer", "log_normalizer_forward", "log_normalizer_reverse",
                "barrier", "restart_rate", "predicted_restart_rate", "asymptotic_restart_rate",
                "recommended_chains", "log_normalizer_per_slot"):
        assert len(s[key]) == 2, key  # one per system
    assert s["log_normalizer_kind"] == "log Z" and s["log_normalizer_note"] is None
    assert len(s["schedule_per_round"]) == 6 and len(s["schedule_per_round"][0]) == 2
    assert len(s["local_barrier"]["grid"]) == len(s["local_barrier"]["values"][0]) == 51
    assert len(s["round_rows"]) == 6 and len((out / "rounds.csv").read_text().splitlines()) == 7
    assert len((out / "report.txt").read_text().splitlines()) == 7
    curve = s["restart_rate_curve"]
    assert len(curve["chains"]) == len(curve["predicted_restart_rate"]) >= 3
    # the index process on disk reproduces the online restart / round-trip counts
    counts = count_round_trips(index)
    assert counts["restarts"].tolist() == s["restarts"]
    assert counts["round_trips"].tolist() == s["round_trips"]
    # what the user sees
    text = str(res)
    assert "log Z" in text and "restart rate" in text and "2Λ̂" in text
    # ArviZ: ESS and R-hat from the exported posterior (two systems = two chains)
    az = import_arviz()
    with warnings.catch_warnings():  # ArviZ's own deprecation notices are not ours to test
        warnings.simplefilter("ignore")
        idata = az.from_netcdf(str(out / "posterior.nc"))
        table = az.summary(idata, var_names=["x"])
    assert idata.posterior["x"].shape == (2, 64, 3)
    assert np.all(np.isfinite(table["ess_bulk"])) and np.all(np.isfinite(table["r_hat"]))
    assert idata.constant_data["schedule"].shape == (2, 6)


def test_resume_from_a_round_boundary_is_bit_for_bit(tmp_path):
    opts = dict(target="geometric-gaussian-path", target_options=SMALL, rounds=6, chains=5, seed=5,
                explorer="rwmh", figures=False)
    full = _run(RunConfig(out=str(tmp_path / "full"), **opts))

    def interrupt(engine):  # called at every round's end: stop as round 5 finishes
        if engine.k >= sum(round_lengths(5)):
            raise KeyboardInterrupt

    part = _run(RunConfig(out=str(tmp_path / "cut"), **opts), callback=interrupt)
    # round 5 did not complete (the interrupt came before it was stored): back to round 4
    assert part.summary["interrupted"] and part.summary["rounds"] == 4
    assert part.summary["n_iterations"] == sum(round_lengths(4))
    assert part.samples.shape == (16, 3)  # the last completed round's draws
    resumed = nrpt.resume(tmp_path / "cut")
    assert resumed.summary["rounds"] == 6 and not resumed.summary["interrupted"]
    assert np.array_equal(resumed.samples, full.samples)
    assert np.array_equal(resumed.index, full.index)
    assert np.array_equal(np.load(tmp_path / "cut" / "index.npy"), full.index)
    for key in ("log_normalizer", "barrier", "schedule_per_round", "restarts", "round_trips",
                "local_barrier", "swap_acceptance"):
        assert resumed.summary[key] == full.summary[key], key


def test_cli_rounds_defaults_to_the_slice_explorer(tmp_path, capsys):
    out = tmp_path / "cli"
    rc = main(["run", "--target", "geometric-gaussian-path", "--option", "dim=2", "--rounds", "4",
               "--chains", "4", "--out", str(out), "--no-progress", "--figures", "false"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "log Z" in printed and "explorer slice" in printed
    cfg = RunConfig.from_toml(out / "config.toml")
    assert cfg.rounds == 4 and cfg.explorer == "slice" and cfg.figures is False
    s = json.loads((out / "summary.json").read_text())
    assert s["rounds"] == 4 and s["n_iterations"] == 30
    assert main(["run", "--rounds", "0", "--no-progress"]) == 2
    assert "rounds must be an integer >= 1" in capsys.readouterr().err


def test_step_sizes_are_tuned_towards_the_target_acceptance():
    # MALA started with a step far too large (acceptance ~0) on N(0, I_4) at temperatures
    # 1..8: between rounds the step shrinks until the acceptance is near 0.574
    target = Gaussian(np.zeros(4), np.eye(4))
    res = nrpt.sample(target, rounds=8, chains=4, max_temperature=8.0, explorer="mala",
                      step_size=6.0, systems=2, seed=2)
    first = res.round_stats[0]
    last = res.round_stats[-1]
    assert np.all(last.step_size < first.step_size)
    acc = last.explorer_acceptance
    assert np.all((acc > 0.4) & (acc < 0.75)), acc
    # switched off: the step size stays put
    fixed = nrpt.sample(target, rounds=4, chains=4, max_temperature=8.0, explorer="mala",
                        step_size=6.0, adapt_step_size=False, adapt_schedule=False)
    np.testing.assert_allclose(fixed.round_stats[-1].step_size[0], 6.0 * np.sqrt([1, 2, 4, 8]))
    assert np.allclose(fixed.round_stats[-1].schedule, fixed.round_stats[0].schedule)


def test_slice_width_follows_the_spread_of_each_slot():
    # N(0, I / (1 + 9 beta)): the sd of a coordinate is 1 at beta = 0 and 0.32 at beta = 1
    res = sample_adaptive("geometric-gaussian-path", target_options={"dim": 2, "c": 9.0},
                          rounds=7, chains=5, seed=1)
    w = res.round_stats[-1].step_size[0]
    sd = 1 / np.sqrt(1 + 9.0 * res.round_stats[-2].schedule[0])
    np.testing.assert_allclose(w / sd, 2.5, rtol=0.35)


def test_mixture_model_visits_every_label_permutation():
    target = mixture_model()
    res = sample_adaptive(target, rounds=8, chains=10, seed=0)
    perms = target.label_permutation(res.samples)
    # all K! = 6 orderings in the last round (256 draws; seeds 0-5 all give >= 10 of each)
    assert set(perms.tolist()) == set(range(6))
    assert res.barrier > 1.0 and res.restarts > 0
    assert len(res.summary["schedule_per_round"]) == 8
    # the sorted means recover the data's component centres (-4, 0, 4) up to noise
    np.testing.assert_allclose(np.sort(res.samples, 1).mean(0), [-4, 0, 4], atol=0.6)


# ------------------------------------------------------------------ bad input
class NoSampler:
    """A geometric target whose reference cannot be sampled."""

    dim = 2

    def log_likelihood(self, x):
        return -(x**2).sum(1)

    def reference_log_prob(self, x):
        return -0.5 * (x**2).sum(1)


class HalfSupport:
    """Reference N(0, 1); the target is the reference restricted to x > -1 (log-likelihood
    -inf below), so Z = Phi(1) and log Z = log 0.8413."""

    dim = 1
    name = "half-support"
    reference_is_normalized = True

    def __init__(self, cut=-1.0):
        self.cut = cut

    def log_likelihood(self, x):
        zero = torch.zeros_like(x[:, 0])
        return torch.where(x[:, 0] > self.cut, zero, torch.full_like(zero, -math.inf))

    def reference_log_prob(self, x):
        return -0.5 * x[:, 0] ** 2 - 0.5 * math.log(2 * math.pi)

    def reference_sample(self, n, generator):
        return torch.randn(n, 1, generator=generator, dtype=torch.float64)


def test_reference_without_iid_sampler_is_refused_before_running():
    with pytest.raises(TargetError, match="reference_sample"):
        nrpt.sample(NoSampler(), rounds=3)


def test_target_zero_on_part_of_the_reference_runs_and_says_so():
    R = 8
    res = nrpt.sample(HalfSupport(), rounds=8, chains=4, systems=R, explorer="slice", seed=4)
    assert np.isfinite(res.samples).all() and (res.samples > -1).all()
    share = res.summary["reference_zero_likelihood_share"]
    assert abs(share - 0.1587) < 4.5 * math.sqrt(0.16 * 0.84 / 512)  # binomial se, 512 draws
    assert "zero on" in str(res)
    # log Z = log Phi(1), within 4.5 standard errors over the R systems
    est = np.array(res.log_normalizer)
    assert abs(est.mean() - math.log(0.841344746)) < 4.5 * est.std(ddof=1) / math.sqrt(R)


def test_target_zero_on_all_reference_draws_is_a_clear_error():
    with pytest.raises(TargetError, match="-inf .* at all 512 reference draws"):
        nrpt.sample(HalfSupport(cut=50.0), rounds=2)


def test_unnormalized_reference_reports_only_a_ratio():
    class Unnormalized(ScaledGaussianPath):
        reference_is_normalized = False

    res = nrpt.sample(Unnormalized(2, 3.0), rounds=4, chains=4, explorer="rwmh")
    assert res.summary["log_normalizer_kind"] == "ratio"
    assert "only the ratio" in res.summary["log_normalizer_note"]
    assert "log Z ratio" in str(res) and "only the ratio" in str(res)


def test_temperature_ladder_reports_only_a_ratio():
    res = nrpt.sample(Gaussian(np.zeros(2), np.eye(2)), rounds=4, chains=3, explorer="rwmh")
    assert res.summary["log_normalizer_kind"] == "ratio"
    assert "temperature ladder" in res.summary["log_normalizer_note"]
    assert len(res.summary["schedule"]) == 3 and res.summary["schedule"][0] == pytest.approx(1)


@pytest.mark.parametrize("kwargs, match", [
    (dict(rounds=0), "rounds must be an integer >= 1"),
    (dict(rounds=31), r"rounds must be an integer in \[1, 30\]"),
    (dict(rounds=3, scheme="deo-w", window="auto"), "window 'auto' is not available"),
    (dict(rounds=3, target_acceptance=1.0), "target_acceptance must be"),
    (dict(rounds=3, slice_method="bracket"), "slice_method must be one of"),
    (dict(rounds=3, adapt_schedule="yes"), "adapt_schedule must be true or false"),
    (dict(rounds=2, thin=8), "thin .* must be <= the last round's length"),
])
def test_bad_round_configuration_is_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RunConfig(**kwargs)
