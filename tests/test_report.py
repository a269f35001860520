"""The printed report and the run folder's figures say how good the sample is: the histogram's
finite-sample TV floor, the exact moments where the target knows them, that DEO*-SGD is
approximate (and by how much), readable several-system tables, every system's schedule."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import nrpt
from nrpt.diagnostics.density import grid_errors, iid_floor
from nrpt.report import text as report
from nrpt.report.summary import exact_moments, format_summary
from nrpt.run.sgpt import HEADLINE
from nrpt.targets.gaussian import Gaussian


def quiet_sample(target, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return nrpt.sample(target, **options)


def headline(**changes):
    cfg = {k: (dict(v) if isinstance(v, dict) else v) for k, v in HEADLINE.items()}
    cfg.update(changes)
    return cfg


@pytest.fixture(scope="module")
def sgd_run(tmp_path_factory):
    """A short default (DEO*-SGD headline) run with its folder (its figures are written by the
    test that checks them)."""
    out = tmp_path_factory.mktemp("sgd") / "run"
    cfg = headline(iterations=1500, seed=0, figures=False)
    return quiet_sample(cfg.pop("target"), out=str(out), **cfg)


def test_the_tv_floor_reaches_the_density_figure(sgd_run, monkeypatch):
    # today's code called iid_floor(target, n), whose TypeError was swallowed: no floor
    from nrpt.report import figures as plots

    seen = {}
    real = plots.density

    def spy(x, target=None, **kw):
        seen["tv_floor"], seen["n"] = kw.get("tv_floor"), np.shape(x)[0]
        return real(x, target, **kw)

    monkeypatch.setattr(plots, "density", spy)
    res = sgd_run
    names = report.write_figures(res.out, run=_Run(res), summary=dict(res.summary),
                                 samples=res.samples, index=res.index, rows=res.rows)
    assert "density.png" in names
    grid = res.engine.target.density_grid()
    assert seen["tv_floor"] == pytest.approx(iid_floor(seen["n"], *grid)["tv"])


class _Run:
    """What write_figures reads of a run, rebuilt from a Result."""

    def __init__(self, res):
        self.engine, self.recorders = res.engine, res.recorders


def test_the_report_shows_the_tv_and_its_iid_floor(sgd_run):
    s = sgd_run.summary
    de = s["density_error"]
    x = sgd_run.samples.reshape(-1, 2)
    grid = sgd_run.engine.target.density_grid()
    assert de["n"] == x.shape[0] == 1350  # 1500 less the burn-in of 150
    assert de["tv"] == pytest.approx(grid_errors(x, *grid)["tv"])
    assert de["tv_iid_floor"] == pytest.approx(iid_floor(x.shape[0], *grid)["tv"])
    text = str(sgd_run)
    assert f"histogram TV    {de['tv']:.3g} vs {de['tv_iid_floor']:.3g} for 1350 exact iid" \
        in text


def test_deo_star_sgd_says_it_is_approximate_and_by_how_much(sgd_run):
    s = sgd_run.summary
    exact_sd = math.sqrt(float(sgd_run.engine.target.cov[0, 0]))
    assert s["exact_moments"]["sd"] == pytest.approx([exact_sd, exact_sd])
    assert exact_sd == pytest.approx(1.533, abs=1e-3)  # the 25 modes with the penalty
    note = s["approximation_note"]
    assert note.startswith("DEO*-SGD is approximate") and "deterministic swap rule" in note
    assert "vs exact [1.53, 1.53]" in note and "vs iid floor" in note
    assert f"note: {note}" in str(sgd_run)


def test_exact_moments_are_printed_for_a_known_target():
    target = Gaussian(torch.tensor([1.0, -2.0]), torch.tensor([[4.0, 0.0], [0.0, 0.25]]))
    res = quiet_sample(target, chains=4, max_temperature=4.0, iterations=300, seed=0,
                       figures=False)
    assert res.summary["exact_moments"] == {"mean": [1.0, -2.0], "sd": [2.0, 0.5]}
    text = str(res)
    assert "  exact           mean [1, -2], sd [2, 0.5]" in text
    # an exact method gets no approximation note
    assert "approximation_note" not in res.summary and "approximate" not in text


class Plain:
    """A user's target: a 1-D standard normal energy, no known moments."""
    dim = 1
    name = "plain"

    def energy(self, x):
        return 0.5 * (x * x).sum(1)

    def initial_states(self, n, generator, dtype=torch.float64):
        return torch.randn(n, 1, generator=generator, dtype=dtype)


def test_no_exact_moments_without_a_known_answer():
    assert exact_moments(Plain()) is None

    class Other:  # a `mean` that is not the target's mean (wrong shape): not taken
        mean = torch.zeros(3)
        cov = torch.eye(2)

    assert exact_moments(Other(), 3) is None
    res = quiet_sample(Plain(), chains=3, iterations=200, seed=0, figures=False)
    assert res.summary["exact_moments"] is None and "  exact  " not in str(res)
    assert res.summary.get("density_error") is None


def test_several_systems_print_one_system_per_line():
    res = quiet_sample("twenty-five-modes", chains=4, rounds=5, systems=3, seed=0,
                       figures=False)
    s = res.summary
    text = str(res)
    # every system's schedule, and system 0's under the old key
    assert len(s["schedules"]) == 3 and all(len(b) == 4 for b in s["schedules"])
    assert s["schedule"] == s["schedules"][0] and len(s["adapted_schedules"]) == 3
    lines = text.splitlines()
    for r in range(3):
        assert sum(line.startswith(f"    system {r} ") for line in lines) >= 3  # acc, temps, ...
    # the per-system scalars: a table with one row per system, and mean ± sd
    head = next(i for i, line in enumerate(lines) if line.startswith("  per system"))
    assert "restarts" in lines[head] and lines[head + 4].startswith("    mean ± sd")
    assert lines[head + 1].split()[2] == str(int(s["restarts"][0]))
    # no line holds the systems' values interleaved as a list of lists
    assert "[[" not in text


def test_format_summary_of_one_system_is_unchanged_in_shape():
    res = quiet_sample("twenty-five-modes", chains=4, iterations=300, seed=0, figures=False)
    text = format_summary(res.summary)
    assert "  per system " not in text and "mean ± sd" not in text
    assert "  temperatures    [1, " in text


def test_the_local_barrier_figure_uses_log_axes_when_lambda_spans_decades():
    from nrpt.report import figures as plots

    b = np.array([0.0, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0])  # a mixture model's schedule
    grid = np.linspace(0.0, 1.0, 51)
    spiky = 290.0 / (1.0 + 300.0 * grid) + 0.3
    fig = plots.local_barrier(grid, spiky, b, 290.0 / (1.0 + 300.0 * b) + 0.3)
    ax = fig.axes[0]
    assert ax.get_yscale() == "log" and ax.get_xscale() == "symlog"
    assert ax.get_xlim()[0] < 0.0 < 0.003 < ax.get_xlim()[1]  # beta = 0 stays on the axis
    mild = 1.0 + grid
    fig = plots.local_barrier(grid, mild, np.linspace(0, 1, 7), 1.0 + np.linspace(0, 1, 7))
    assert fig.axes[0].get_yscale() == "linear" and fig.axes[0].get_xscale() == "linear"
    fig = plots.local_barrier(grid, spiky, yscale="linear", xscale="linear")
    assert fig.axes[0].get_yscale() == "linear"


def test_trace_and_rank_plots_are_written_with_the_other_figures(sgd_run, tmp_path):
    res = sgd_run
    names = report.write_figures(tmp_path, run=_Run(res), summary=dict(res.summary),
                                 samples=res.samples, index=res.index, rows=res.rows)
    for name in ("trace.png", "rank.png"):
        assert name in names and (tmp_path / name).stat().st_size > 10_000


def test_a_runs_default_figures_leave_out_the_trace_and_rank_plots(sgd_run, tmp_path,
                                                                   monkeypatch):
    # figures = true (what `nrpt figures DIR` draws) writes the main figures; "all" adds
    # trace.png and rank.png, for a stochastic-approximation run swap_acceptance.png
    # (adaptation.png's last panel draws every pair's swap rate; the report prints the
    # per-pair acceptance) and the index process's zoom on its last iterations
    from nrpt.report import figures as plots

    zooms = []
    real = plots.index_process

    def spy(index, **kw):
        zooms.append(kw.get("zoom", "auto"))
        return real(index, **kw)

    monkeypatch.setattr(plots, "index_process", spy)
    res = sgd_run
    names = report.write_figures(tmp_path, run=_Run(res), summary=dict(res.summary),
                                 samples=res.samples, index=res.index, rows=res.rows,
                                 which=True)
    assert {"density.png", "index_process.png", "adaptation.png"} <= set(names)
    assert "trace.png" not in names and "rank.png" not in names
    assert not (tmp_path / "trace.png").exists()
    assert "swap_acceptance.png" not in names and not (tmp_path / "swap_acceptance.png").exists()
    (tmp_path / "all").mkdir()
    every = report.write_figures(tmp_path / "all", run=_Run(res), summary=dict(res.summary),
                                 samples=res.samples, index=res.index, rows=res.rows,
                                 which="all")
    assert set(every) == set(names) | {"trace.png", "rank.png", "swap_acceptance.png"}
    assert zooms == [None, "auto"]


def test_trace_and_rank_show_every_system_and_the_first_coordinates():
    from nrpt.report import figures as plots

    rs = np.random.default_rng(0)
    x = rs.normal(size=(3, 400, 10))
    fig = plots.trace(x)
    assert len(fig.axes) == 2 * 4  # the first 4 of 10 coordinates, histogram + trace each
    assert len(fig.axes[1].lines) == 3  # one trace per system
    assert "first 4 of 10 coordinates" in fig._suptitle.get_text()
    fig = plots.rank(x[:, :, :2])
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["system 0", "system 1", "system 2"]
    # one system: its quarters are the chains (a chain's own ranks are flat by construction)
    fig = plots.rank(x[0, :, :1])
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == [
        f"quarter {i}" for i in range(1, 5)]
    # a chain shifted away from the others piles its ranks at the top: the bars show it
    y = x[:, :, :1].copy()
    y[2] += 3.0
    fig = plots.rank(y, bins=4)
    heights = [p.get_height() for p in fig.axes[0].patches]
    top_of_shifted = heights[8:12]
    assert top_of_shifted[-1] > 2.5 * 0.4 and top_of_shifted[0] < 0.1 * 0.4


def test_recommended_chains_noisy_is_not_given_for_sgd_ladders(sgd_run):
    # Eq. 53's sigma_p / tau_{p+1} is not invariant to the unknown factor of tau ∝ eta: the
    # old summary passed the learning rates as temperatures
    s = sgd_run.summary
    assert s["recommended_chains_noisy"] is None
    assert "no temperature" in s["recommended_chains_noisy_note"]


def test_recommended_chains_noisy_uses_the_noise_temperatures_of_sgld():
    from nrpt.adapt.chains import recommended_chains_noisy
    from nrpt.targets.minibatch import MinibatchTarget

    g = torch.Generator().manual_seed(0)
    a = torch.randn(100, generator=g, dtype=torch.float64)
    y = 2.0 * a + torch.randn(100, generator=g, dtype=torch.float64)
    target = MinibatchTarget(torch.stack([a, y], 1),
                             lambda x, b: 0.5 * (b[..., 1] - b[..., 0] * x[:, :1]) ** 2, dim=1)
    res = quiet_sample(target, explorer="sgld", batch_size=10, chains=4, max_temperature=8.0,
                       learning_rates=[1e-3, 2e-3, 4e-3, 8e-3], iterations=100, seed=0,
                       figures=False)
    eng = res.engine
    sigma = eng.state.extras["energy_var"].gather(1, eng.replica_at).sqrt()[0].numpy()
    temps = [8.0 ** (p / 3) for p in range(4)]
    assert res.summary["noise_temperatures"] == pytest.approx(temps)
    assert res.summary["recommended_chains_noisy"] == pytest.approx(
        list(recommended_chains_noisy(sigma, temps)))


def test_a_targets_failing_exact_moments_is_reported_not_dropped():
    """A user's ``exact_moments()`` that raises or returns the wrong keys / size was swallowed
    (the report then showed no exact line, as for a target without a known answer)."""
    class Misnamed(Plain):  # "std" for "sd": the known answer must not vanish without a word
        name = "misnamed"

        def exact_moments(self):
            return {"mean": [0.0], "std": [1.0]}

    with pytest.raises(ValueError, match="exact_moments"):
        exact_moments(Misnamed(), 1)
    res = quiet_sample(Misnamed(), chains=3, iterations=200, seed=0, figures=False)
    assert res.summary["exact_moments"] is None
    assert "'sd'" in res.summary["exact_moments_failed"]
    assert "exact           could not be read" in str(res)
