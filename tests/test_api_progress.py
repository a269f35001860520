"""``nrpt.sample``'s progress default and ``Result.to_inference_data``."""

from __future__ import annotations

import builtins
import sys

import numpy as np
import pytest

import nrpt
from nrpt.run import api


def test_progress_defaults_to_off_under_pytest_and_on_at_a_prompt(monkeypatch, capsys):
    assert api.interactive() is False  # PYTEST_CURRENT_TEST is set
    nrpt.sample("gaussian", chains=4, iterations=300, figures=False)
    assert "round" not in capsys.readouterr().out  # no per-segment table
    monkeypatch.delenv("PYTEST_CURRENT_TEST")
    monkeypatch.setattr(sys, "ps1", ">>> ", raising=False)
    assert api.interactive() is True
    res = nrpt.sample("gaussian", chains=4, iterations=300, figures=False)
    out = capsys.readouterr().out
    # the per-segment rows the CLI prints: the warm-up windows (tuning), then the samples
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert "round" in out and len(lines) == 1 + len(res.rows)
    monkeypatch.delattr(sys, "ps1")
    res = nrpt.sample("gaussian", chains=4, iterations=300, figures=False, progress=False)
    assert capsys.readouterr().out == ""
    with pytest.raises(ValueError, match="progress must be True, False or None"):
        nrpt.sample("gaussian", chains=4, iterations=30, progress="yes")


def test_to_inference_data_is_the_posterior_file_in_memory(tmp_path):
    az = pytest.importorskip("arviz")
    res = nrpt.sample("gaussian", chains=4, iterations=400, systems=2, seed=2, figures=False,
                      out=str(tmp_path / "run"))
    idata = res.to_inference_data()
    on_disk = az.from_netcdf(tmp_path / "run" / "posterior.nc")
    assert set(idata.groups()) == set(on_disk.groups())
    for g in idata.groups():
        a, b = idata[g], on_disk[g]
        assert set(a.data_vars) == set(b.data_vars), g
        for v in a.data_vars:
            np.testing.assert_array_equal(a[v].values, b[v].values)
    assert idata.posterior["x"].shape == (2, 360, 2)  # the samples after the burn-in of 40
    np.testing.assert_array_equal(idata.posterior["x"].values, res.samples)
    # without a run folder too
    mem = nrpt.sample("gaussian", chains=4, iterations=100, figures=False).to_inference_data()
    assert mem.posterior["x"].shape == (1, 90, 2)


def test_to_inference_data_without_arviz_says_how_to_get_it(monkeypatch):
    res = nrpt.sample("gaussian", chains=4, iterations=50, figures=False)
    real = builtins.__import__

    def no_arviz(name, *args, **kwargs):
        if name == "arviz":
            raise ImportError("No module named 'arviz'", name="arviz")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_arviz)
    with pytest.raises(ImportError, match=r"pip install nrpt\[arviz\]"):
        res.to_inference_data()
