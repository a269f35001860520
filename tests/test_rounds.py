"""Adaptive NRPT (``nrpt.sample(target, rounds=N)``: the one run loop with the plan
``Plan.rounds(N)``) end to end: run folder contract and summary fields, ArviZ export, resume at
round boundaries (bit for bit), the CLI, explorer tuning between rounds, the label-switching
mixture example, and bad input (clear messages, no crash mid-run)."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
import torch

import nrpt
from nrpt.core.loop import Plan
from nrpt.diagnostics import count_round_trips
from nrpt.run.api import run_config
from nrpt.run.cli import main
from nrpt.run.config import RunConfig
from nrpt.targets import Gaussian
from nrpt.targets.gaussian_path import ScaledGaussianPath
from nrpt.targets.mixture_model import mixture_model
from nrpt.targets.protocol import TargetError

SMALL = {"dim": 3, "c": 4.0}


def round_lengths(n: int) -> list[int]:
    return [seg.iterations for seg in Plan.rounds(n).segments]


def test_round_lengths_double():
    plan = Plan.rounds(4)
    assert round_lengths(4) == [2, 4, 8, 16] and plan.total == 30
    assert all(seg.reset for seg in plan.segments)  # every round starts fresh statistics
    assert [seg.sample for seg in plan.segments] == [False, False, False, True]
    assert plan.sample_start == 14  # the samples are the last round's draws


def test_run_folder_contract_summary_and_arviz_export(tmp_path):
    out = tmp_path / "run"
    res = nrpt.sample("geometric-gaussian-path", target_options=SMALL, rounds=6, chains=6,
                      systems=2, explorer="slice", seed=3, out=str(out), figures=True)
    assert isinstance(res, nrpt.Result) and len(res.rows) == 6
    assert [row["iterations"] for row in res.rows] == round_lengths(6)
    K = sum(round_lengths(6))
    for name in ("config.toml", "summary.json", "samples.npy", "energies.npy", "index.npy",
                 "rounds.csv", "report.txt", "checkpoint.pt", "posterior.nc",
                 "index_process.png", "swap_acceptance.png", "local_barrier.png",
                 "schedules.png"):
        assert (out / name).is_file(), name
    # samples: the last round (64 iterations) of both systems; index: every iteration.  The
    # files are streamed (nrpt.recorders.draws): their last 64 draws are the last round's
    assert res.samples.shape == (2, 64, 3) and res.energies.shape == (2, 64)
    assert np.array_equal(np.load(out / "samples.npy")[:, -64:], res.samples)
    assert np.array_equal(np.load(out / "energies.npy")[:, -64:], res.energies)
    index = np.load(out / "index.npy")
    assert index.shape == (K + 1, 2, 6) and np.array_equal(index, res.index)
    s = json.loads((out / "summary.json").read_text())
    assert s["n_iterations"] == K and s["rounds"] == 6 and s["rounds_planned"] == 6
    assert "round 6" in s["statistics_from"]  # the summary describes the last round
    for key in ("log_normalizer", "log_normalizer_forward", "log_normalizer_reverse",
                "barrier", "restart_rate", "predicted_restart_rate", "asymptotic_restart_rate",
                "recommended_chains", "log_normalizer_per_slot", "restarts", "restarts_total"):
        assert len(s[key]) == 2, key  # one per system
    assert s["log_normalizer_kind"] == "log Z" and s.get("log_normalizer_note") is None
    assert len(s["schedule_per_round"]) == 6 and len(s["schedule_per_round"][0]) == 2
    # the rows: one per round, with the schedule each round ran on
    assert [row["b"] for row in res.rows] == s["schedule_per_round"]
    assert s["round_rows"] == json.loads(json.dumps(res.rows))
    assert res.rows[-1]["barrier"] == pytest.approx(np.mean(s["barrier"]))
    assert res.rows[-1]["log_normalizer"] == pytest.approx(np.mean(s["log_normalizer"]))
    assert len(s["local_barrier"]["grid"]) == len(s["local_barrier"]["values"][0]) == 51
    assert len((out / "rounds.csv").read_text().splitlines()) == 7
    assert len((out / "report.txt").read_text().splitlines()) == 7
    curve = s["restart_rate_curve"]
    assert len(curve["chains"]) == len(curve["predicted_restart_rate"]) >= 3
    # the index process on disk reproduces the online restart / round-trip counts: over the
    # whole run (``*_total``) and in the last round (the counters run on across rounds)
    counts = count_round_trips(index)
    before = count_round_trips(index[:K - 64 + 1])
    for key in ("restarts", "round_trips"):
        assert counts[key].tolist() == s[f"{key}_total"], key
        assert (counts[key] - before[key]).tolist() == s[key], key
    assert (np.array(s["restarts"]) / 64).tolist() == s["restart_rate"]
    assert res.rows[-1]["restarts"] == pytest.approx(np.mean(s["restarts"]))
    # what the user sees
    text = str(res)
    assert "log Z" in text and "restart rate" in text and "2Λ̂" in text
    # ArviZ: ESS and R-hat from the exported posterior (two systems = two chains)
    with warnings.catch_warnings():  # ArviZ's own deprecation notices are not ours to test
        warnings.simplefilter("ignore")
        az = pytest.importorskip("arviz")  # an optional extra (nrpt[arviz])
        idata = az.from_netcdf(str(out / "posterior.nc"))
        table = az.summary(idata, var_names=["x"])
    assert idata.posterior["x"].shape == (2, 64, 3)
    assert np.all(np.isfinite(table["ess_bulk"])) and np.all(np.isfinite(table["r_hat"]))
    assert idata.constant_data["schedule"].shape == (2, 6)


def test_resume_from_a_round_boundary_is_bit_for_bit(tmp_path):
    opts = dict(target="geometric-gaussian-path", target_options=SMALL, rounds=6, chains=5, seed=5,
                explorer="rwmh", figures=False)
    full = run_config(RunConfig(out=str(tmp_path / "full"), **opts))

    def interrupt(engine):  # called at every round's end: stop as round 5 finishes
        if engine.k >= sum(round_lengths(5)):
            raise KeyboardInterrupt

    part = run_config(RunConfig(out=str(tmp_path / "cut"), **opts), callback=interrupt)
    # the callback runs after round 5 was stored and adapted: 5 rounds done, then the stop
    assert part.summary["interrupted"] and part.summary["rounds"] == 5
    assert part.summary["n_iterations"] == sum(round_lengths(5)) and len(part.rows) == 5
    assert "round 5" in part.summary["statistics_from"]
    assert [r["b"] for r in part.rows] == [r["b"] for r in full.rows[:5]]
    resumed = nrpt.resume(tmp_path / "cut")
    assert resumed.summary["rounds"] == 6 and not resumed.summary["interrupted"]
    assert np.array_equal(resumed.samples, full.samples)
    assert np.array_equal(resumed.index, full.index)
    assert np.array_equal(np.load(tmp_path / "cut" / "index.npy"), full.index)
    for key in ("log_normalizer", "barrier", "schedule_per_round", "restarts", "round_trips",
                "local_barrier", "swap_acceptance", "restarts_total"):
        assert resumed.summary[key] == full.summary[key], key
    drop = lambda rows: [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]  # noqa: E731
    assert drop(resumed.rows) == drop(full.rows)


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
    assert "rounds must be an integer in [1, 24]" in capsys.readouterr().err


def test_step_sizes_are_tuned_towards_the_target_acceptance():
    # MALA started with a step far too large (acceptance ~0) on N(0, I_4) at temperatures
    # 1..8: between rounds the step shrinks until the acceptance is near 0.574
    target = Gaussian(np.zeros(4), np.eye(4))
    res = nrpt.sample(target, rounds=8, chains=4, max_temperature=8.0, explorer="mala",
                      step_size=6.0, systems=2, seed=2, figures=False)
    first = 6.0 * np.sqrt([1, 2, 4, 8])  # round 1: the scalar step times sqrt(temperature)
    last = np.array(res.summary["step_size"])  # the last round's step sizes [R, P]
    assert last.shape == (2, 4) and np.all(last < first)
    acc = np.array(res.summary["explorer_acceptance"])  # the last round's acceptance [R, P]
    assert np.all((acc > 0.4) & (acc < 0.75)), acc
    # switched off: the step size stays put
    fixed = nrpt.sample(target, rounds=4, chains=4, max_temperature=8.0, explorer="mala",
                        step_size=6.0, adapt_step_size=False, adapt_schedule=False,
                        figures=False)
    np.testing.assert_allclose(fixed.summary["step_size"], 6.0 * np.sqrt([1, 2, 4, 8]))
    assert np.allclose(fixed.rows[-1]["b"], fixed.rows[0]["b"])
    assert np.all(np.array(fixed.summary["explorer_acceptance"]) < 0.1)  # far off 0.574


def test_slice_width_follows_the_spread_of_each_slot():
    # N(0, I / (1 + 9 beta)): the sd of a coordinate is 1 at beta = 0 and 0.32 at beta = 1
    res = nrpt.sample("geometric-gaussian-path", target_options={"dim": 2, "c": 9.0},
                      rounds=7, chains=5, seed=1, figures=False)
    assert res.summary["explorer"] == "slice"  # the default explorer of adaptive runs
    w = np.array(res.summary["step_size"])  # the last round's widths, set from round 6
    sd = 1 / np.sqrt(1 + 9.0 * np.array(res.rows[-2]["b"][0]))
    np.testing.assert_allclose(w / sd, 2.5, rtol=0.35)


def test_mixture_model_visits_every_label_permutation():
    target = mixture_model()
    res = nrpt.sample_adaptive(target, rounds=8, chains=10, seed=0, figures=False)
    perms = target.label_permutation(res.samples)
    # all K! = 6 orderings in the last round (256 draws; seeds 0-5 all give >= 10 of each)
    assert set(perms.tolist()) == set(range(6))
    assert res.barrier > 1.0 and res.restarts > 0
    assert len(res.summary["schedule_per_round"]) == 8 == len(res.rows)
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
    assert "only log(Z_target / Z_reference)" in res.summary["log_normalizer_note"]
    assert "log Z ratio" in str(res) and "only log(Z_target / Z_reference)" in str(res)


def test_temperature_ladder_reports_only_a_ratio():
    res = nrpt.sample(Gaussian(np.zeros(2), np.eye(2)), rounds=4, chains=3, explorer="rwmh")
    assert res.summary["log_normalizer_kind"] == "ratio"
    assert "temperature ladder" in res.summary["log_normalizer_note"]
    assert len(res.summary["schedule"]) == 3 and res.summary["schedule"][0] == pytest.approx(1)


@pytest.mark.parametrize("kwargs, match", [
    (dict(rounds=0), r"rounds must be an integer in \[1, 24\]"),
    (dict(rounds=25), r"rounds must be an integer in \[1, 24\]"),
    (dict(rounds=3, scheme="deo-w", window="auto"), "window 'auto' .*not available with rounds"),
    (dict(rounds=3, explorer="rwmh", target_acceptance=1.0), "target_acceptance must be"),
    # settings that do not apply are errors, never silently ignored
    (dict(rounds=3, iterations=100), "iterations does not apply"),
    (dict(rounds=3, target_acceptance=0.5), "target_acceptance does not apply"),
    (dict(iterations=100, adapt_schedule=True), "adapt_schedule does not apply"),
    (dict(rounds=3, explorer="sgld"), "needs an exact explorer"),
    (dict(rounds=3, slice_method="bracket"), "slice_method must be one of"),
    (dict(rounds=3, adapt_schedule="yes"), "adapt_schedule must be true or false"),
    (dict(rounds=2, thin=8), "thin .* must be <= the last round's length"),
])
def test_bad_round_configuration_is_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RunConfig(**kwargs)
