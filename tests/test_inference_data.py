"""posterior.nc in the model's own variables (the ``model_variables`` hook) and nrpt's
diagnostics in ``sample_stats`` (:mod:`nrpt.report.posterior_file`)."""

from __future__ import annotations

import json
import math
import sys
import warnings

import numpy as np
import pytest
import torch

import nrpt
from nrpt.diagnostics import count_round_trips
from nrpt.report import posterior_file as inference_data

with warnings.catch_warnings():  # ArviZ's import-time FutureWarning is not ours to test
    warnings.simplefilter("ignore")
    az = pytest.importorskip("arviz")

CENTER = torch.tensor([0.5, -0.3, 1.0, -1.0], dtype=torch.float64)


class Hooked:
    """A 4-dim geometric target (N(0, I) reference, Gaussian likelihood) whose model variables
    are ``mu = x0``, ``sigma = exp(x1)`` and ``w = x[2:4]`` with a named dim ``group``."""

    dim = 4
    name = "hooked"
    reference_is_normalized = True
    model_dims = {"w": ["group"]}
    model_coords = {"group": ["north", "south"]}

    def log_likelihood(self, x):
        return -0.5 * (((x - CENTER.to(x)) / 0.6) ** 2).sum(-1)

    def reference_log_prob(self, x):
        return -0.5 * (x ** 2).sum(-1) - 0.5 * self.dim * math.log(2 * math.pi)

    def reference_sample(self, n, generator):
        return torch.randn(n, self.dim, generator=generator, dtype=torch.float64)

    def model_variables(self, x):
        x = np.asarray(x)
        return {"mu": x[:, 0], "sigma": np.exp(x[:, 1]), "w": x[:, 2:4]}


def _read(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return az.from_netcdf(str(path))


@pytest.fixture(scope="module")
def hooked_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("hooked")
    res = nrpt.sample(Hooked(), systems=2, chains=5, iterations=600, explorer="rwmh", seed=3,
                      figures=False, out=str(out))
    return res, out


def test_posterior_holds_the_model_variables(hooked_run):
    res, out = hooked_run
    assert res.summary["inference_data"] == "posterior.nc", res.summary
    idata = _read(out / "posterior.nc")
    post = idata.posterior
    assert set(post.data_vars) == {"mu", "sigma", "w"}  # no flat x in the posterior
    assert post["mu"].dims == ("chain", "draw") and post["mu"].shape == (2, 540)  # 600 - burn-in 60
    assert post["sigma"].shape == (2, 540)
    assert post["w"].dims == ("chain", "draw", "group") and post["w"].shape == (2, 540, 2)
    assert list(post["group"].values) == ["north", "south"]
    assert list(post["chain"].values) == [0, 1]
    # exactly the hook applied to the run's slot-0 draws, system by system
    for r in range(2):
        want = Hooked().model_variables(res.samples[r])
        for name, v in want.items():
            assert np.array_equal(post[name].values[r], v), name
    # the unconstrained draws are kept, in their own group
    assert np.array_equal(idata.unconstrained_posterior["x"].values, res.samples)


def test_arviz_summaries_and_plots_work_unchanged(hooked_run):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _, out = hooked_run
    idata = _read(out / "posterior.nc")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = az.summary(idata)
        assert list(table.index) == ["mu", "sigma", "w[north]", "w[south]"]
        assert np.all(np.isfinite(table["ess_bulk"])) and np.all(np.isfinite(table["r_hat"]))
        az.plot_trace(idata)
        az.plot_pair(idata, var_names=["mu", "sigma", "w"])
    plt.close("all")


def test_sample_stats_agree_with_the_summary(hooked_run):
    res, out = hooked_run
    summary = json.loads((out / "summary.json").read_text())
    stats = _read(out / "posterior.nc").sample_stats
    assert stats["path_energy"].shape == (2, 540)
    assert np.array_equal(stats["path_energy"].values, res.energies)
    # cumulative restarts / round trips end at the summary's counts, per system
    assert stats["restarts"].dims == ("chain", "draw")
    assert stats["restarts"].values[:, -1].tolist() == summary["restarts"]
    assert stats["round_trips"].values[:, -1].tolist() == summary["round_trips"]
    assert np.all(np.diff(stats["restarts"].values, axis=1) >= 0)
    # the replica at slot 0, and whether a swap moved it, from the index process
    index = res.index
    at0 = np.argmin(index, axis=-1)  # [K + 1, R]
    b = summary["burn_in"]  # the draws are those of iterations b + 1 .. K
    assert b == 60
    assert np.array_equal(stats["slot0_replica"].values, at0[b + 1:].T)
    assert np.array_equal(stats["target_swap_accepted"].values, (at0[b + 1:] != at0[b:-1]).T)
    # per system: log Z, its two stepping-stone halves and the barrier, as in summary.json
    for key in ("log_normalizer", "log_normalizer_forward", "log_normalizer_reverse",
                "barrier"):
        assert stats[key].dims == ("chain",), key
        assert stats[key].values.tolist() == summary[key], key
        assert "nan_means" not in stats[key].attrs  # every value defined here


def test_a_failing_hook_costs_only_the_file(tmp_path):
    class Broken(Hooked):
        def model_variables(self, x):
            raise RuntimeError("no model here")

    res = nrpt.sample(Broken(), chains=4, iterations=50, explorer="rwmh", figures=False,
                      out=str(tmp_path))
    assert res.summary["inference_data"] is None
    assert "no model here" in res.summary["inference_data_error"]
    assert not (tmp_path / "posterior.nc").exists()


@pytest.mark.parametrize("first", [0, 37])
def test_index_statistics_match_the_reference_counts(monkeypatch, first):
    # a random index process, read in blocks of a few rows (block boundaries everywhere)
    monkeypatch.setattr(inference_data, "_INDEX_BLOCK_BYTES", 8 * 3 * 4 * 7)
    rng = np.random.default_rng(0)
    K, R, P = 300, 3, 4
    index = np.stack([np.stack([rng.permutation(P) for _ in range(R)]) for _ in range(K + 1)])
    index = index.astype(np.int16)
    rows = np.arange(first + 1, K + 1, 2)
    st = inference_data.index_statistics(index, rows, first)
    for j, t in enumerate(rows):
        if j % 23:
            continue
        now, before = count_round_trips(index[:t + 1]), count_round_trips(index[:first + 1])
        assert st["restarts"][:, j].tolist() == (now["restarts"] - before["restarts"]).tolist()
        assert st["round_trips"][:, j].tolist() == \
            (now["round_trips"] - before["round_trips"]).tolist()
    at0 = np.argmin(index, axis=-1)
    assert np.array_equal(st["slot0_replica"], at0[rows].T)
    assert np.array_equal(st["target_swap_accepted"], (at0[rows] != at0[rows - 1]).T)


def test_undefined_per_system_values_are_nan_with_a_note():
    vals, undefined = inference_data._per_chain([1.5, None], 2)
    assert undefined and vals[0] == 1.5 and np.isnan(vals[1])
    vals, undefined = inference_data._per_chain(2.0, 1)
    assert not undefined and vals.tolist() == [2.0]


def test_writing_needs_no_arviz_xarray_or_pandas_import(tmp_path):
    # posterior.nc is written with h5netcdf alone: the imports of ArviZ (seconds), xarray and
    # pandas (0.5 s, more than the writing) are not paid; the file reads back (tests above)
    import subprocess

    code = ("import sys, nrpt; nrpt.sample('twenty-five-modes', iterations=64, chains=4, "
            "figures=False, out=sys.argv[1]); "
            "print([m for m in ('arviz', 'xarray', 'pandas') if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                          text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert (tmp_path / "posterior.nc").exists()


def test_adaptive_thinned_runs_count_from_the_last_round(tmp_path):
    # the draws of an adaptive run are the last round's, thinned: the cumulative counts start
    # at that round, as the summary's statistics do
    res = nrpt.sample(Hooked(), systems=2, chains=4, rounds=6, thin=2, explorer="rwmh",
                      seed=1, figures=False, out=str(tmp_path))
    stats = _read(tmp_path / "posterior.nc").sample_stats
    n = res.samples.shape[1]
    assert stats["restarts"].shape == (2, n)
    assert stats["restarts"].values[:, -1].tolist() == res.summary["restarts"]
    first = int(stats["restarts"].attrs["counted_from_iteration"])
    assert first == res.summary["n_iterations"] - 2 * n
    at0 = np.argmin(res.index, axis=-1)
    rows = first + 2 * np.arange(1, n + 1)
    assert np.array_equal(stats["slot0_replica"].values, at0[rows].T)


def test_unnamed_dims_and_boolean_variables(tmp_path):
    class Wider(Hooked):
        model_dims = {}
        model_coords = {}

        def model_variables(self, x):
            x = np.asarray(x)
            return {"positive": x[:, 0] > 0, "grid": np.stack([x[:, :2], 2 * x[:, 2:]], 1)}

    res = nrpt.sample(Wider(), chains=4, iterations=40, explorer="rwmh", figures=False,
                      out=str(tmp_path), burn_in=0)
    post = _read(tmp_path / "posterior.nc").posterior
    assert post["positive"].dtype == bool and post["positive"].shape == (1, 40)
    assert np.array_equal(post["positive"].values[0], res.samples[:, 0] > 0)
    # dims the model does not name get ArviZ's names and integer coordinates
    assert post["grid"].dims == ("chain", "draw", "grid_dim_0", "grid_dim_1")
    assert post["grid"].shape == (1, 40, 2, 2)
    assert list(post["grid_dim_1"].values) == [0, 1]
    assert np.array_equal(post["grid"].values[0, :, 1], 2 * res.samples[:, 2:])


def test_nan_only_where_the_summary_says_undefined(tmp_path):
    import types

    R, n = 2, 8
    swaps = types.SimpleNamespace(acceptance=lambda: torch.tensor([[0.5, math.nan]] * R),
                                  explorer_acceptance=lambda: torch.ones(R, 3))
    engine = types.SimpleNamespace(schedule=torch.ones(R, 3), step_size=torch.ones(R, 3),
                                   target=types.SimpleNamespace(dim=2))
    summary = {"log_normalizer": [1.25, None], "log_normalizer_forward": [1.0, 2.0],
               "log_normalizer_reverse": [1.5, None], "barrier": [0.5, 0.75]}
    name = inference_data.write_inference_data(
        tmp_path / "posterior.nc", samples=np.zeros((R, n, 2)), energies=np.zeros((R, n)),
        recorders={"swaps": swaps}, engine=engine, summary=summary)
    idata = _read(tmp_path / name)
    stats = idata.sample_stats
    assert stats["log_normalizer"].values[0] == 1.25 and np.isnan(stats["log_normalizer"][1])
    assert "null" in stats["log_normalizer"].attrs["nan_means"]
    assert "nan_means" not in stats["log_normalizer_forward"].attrs
    assert stats["barrier"].values.tolist() == [0.5, 0.75]
    # a never-attempted pair: NaN in constant_data, and the attrs say why
    assert np.isnan(idata.constant_data["swap_acceptance"].values[:, 1]).all()
    assert "never attempted" in idata.constant_data["swap_acceptance"].attrs["nan_means"]
    assert "nan_means" not in idata.constant_data["schedule"].attrs
    assert idata.posterior["x"].shape == (R, n, 2) and "restarts" not in stats  # no index


def test_blocks_are_sized_by_the_model_variables_too(tmp_path, monkeypatch):
    """A model variable far larger than the state (a per-observation Deterministic) must not
    make a block of draws hold gigabytes: the hook sees blocks sized by all it returns."""
    seen = []

    class Big(Hooked):
        model_dims = {}
        model_coords = {}

        def model_variables(self, x):
            x = np.asarray(x)
            seen.append(x.shape[0])
            return {"mu": x[:, 0], "fitted": np.repeat(x[:, :1], 1000, axis=1)}

    monkeypatch.setattr(inference_data, "DRAW_BLOCK_BYTES", 8 * 1000 * 50)  # 50 draws of fitted
    res = nrpt.sample(Big(), chains=4, iterations=300, explorer="rwmh", figures=False,
                      out=str(tmp_path), burn_in=0)
    assert max(seen) <= 50, seen  # control: sized by the 4-number state alone it would be 300
    post = _read(tmp_path / "posterior.nc").posterior
    assert post["fitted"].shape == (1, 300, 1000)
    assert np.array_equal(post["fitted"].values[0, :, 999], res.samples[:, 0])
