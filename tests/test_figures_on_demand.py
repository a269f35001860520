"""Figures on request (issue 24's outputs goal): a run draws none unless told (``figures =
false`` is the default), and ``nrpt figures DIR`` / :func:`nrpt.figures` draws them later from
the run folder, byte for byte what the run itself draws with ``figures = true`` / ``"all"``,
changing nothing else in the folder."""

from __future__ import annotations

import hashlib
import json

import pytest

import nrpt
from nrpt.run.cli import main

#: a short DEO*-SGD run (with its adaptation trace): density, index process and adaptation
HEADLINE = dict(explorer="sgd", chains=6, noise_sd=2.0, scheme="deo-w", window="auto",
                iterations=300, seed=5, progress=False)


def _digests(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.iterdir()) if p.is_file() and p.name != ".nrpt.lock"}


def test_default_run_draws_no_figures_and_figures_draws_the_runs_own(tmp_path):
    later, now, other = tmp_path / "later", tmp_path / "now", tmp_path / "other"
    res = nrpt.sample(out=str(later), **HEADLINE)
    assert not list(later.glob("*.png")) and "figures" not in res.summary
    assert f"`nrpt figures {later}` draws them" in str(res)
    before = _digests(later)
    summary_before = json.loads((later / "summary.json").read_text())
    names = nrpt.figures(later)
    assert names == ["density.png", "index_process.png", "adaptation.png"]
    nrpt.sample(out=str(now), figures=True, **HEADLINE)
    assert sorted(p.name for p in now.glob("*.png")) == sorted(names)
    for name in names:  # byte for byte the figures the run draws itself
        assert (later / name).read_bytes() == (now / name).read_bytes(), name
    # nothing else changed, but summary.json names the figures
    after = _digests(later)
    assert {k: v for k, v in after.items() if k not in names and k != "summary.json"} == \
        {k: v for k, v in before.items() if k != "summary.json"}
    saved = json.loads((later / "summary.json").read_text())
    assert saved["figures"] == names
    assert {k: v for k, v in saved.items() if k != "figures"} == summary_before
    # negative control: another seed's figures differ, so the comparison above can fail
    nrpt.sample(out=str(other), figures=True, **{**HEADLINE, "seed": 6})
    assert (other / "index_process.png").read_bytes() != (later / "index_process.png").read_bytes()


def test_figures_all_adds_the_trace_and_rank_plots(tmp_path):
    out = tmp_path / "run"
    nrpt.sample("gaussian", chains=4, iterations=200, seed=1, out=str(out), progress=False)
    main_names = nrpt.figures(out)
    assert "trace.png" not in main_names
    every = nrpt.figures(out, which="all")
    assert {"trace.png", "rank.png"} <= set(every) and set(main_names) < set(every)
    assert json.loads((out / "summary.json").read_text())["figures"] == every


def test_figures_refuses_an_unfinished_run_a_non_folder_and_a_bad_which(tmp_path, capsys):
    cut = tmp_path / "cut"

    def interrupt(engine):
        if engine.k >= 100:
            raise KeyboardInterrupt

    part = nrpt.run_config(nrpt.RunConfig(out=str(cut), target="gaussian", chains=4,
                                          iterations=400, seed=2, checkpoint_every=50),
                           callback=interrupt)
    assert part.summary["interrupted"]
    before = _digests(cut)
    with pytest.raises(ValueError, match=r"has not finished .*`nrpt resume .*cut` finishes it"):
        nrpt.figures(cut)
    assert _digests(cut) == before and not list(cut.glob("*.png"))
    assert main(["figures", str(cut)]) == 2
    assert "nrpt: error:" in capsys.readouterr().err
    nrpt.resume(cut, progress=False)  # finished, it draws
    assert nrpt.figures(cut)
    with pytest.raises(FileNotFoundError, match="not a run folder"):
        nrpt.figures(tmp_path / "nowhere")
    for bad in (False, "some", 1.5):
        with pytest.raises(ValueError, match="which must be true or all"):
            nrpt.figures(cut, which=bad)


def test_figures_refuses_an_extension_that_stopped_before_its_first_checkpoint(tmp_path):
    # `resume --iterations N` writes the new budget first; an extension that fails before its
    # first checkpoint leaves a finished run's checkpoint beside a larger budget, which the
    # loop would go on with: drawing must refuse and touch nothing
    out = tmp_path / "run"
    nrpt.sample("gaussian", chains=4, iterations=300, seed=1, out=str(out), progress=False)

    def boom(engine):
        if engine.k >= 256:
            raise RuntimeError("the target failed")

    with pytest.raises(RuntimeError, match="the target failed"):
        nrpt.resume(out, iterations=20000, callback=boom, progress=False)
    before = _digests(out)
    with pytest.raises(ValueError, match=r"iteration 300 of the 20000 .*`nrpt resume"):
        nrpt.figures(out)
    assert _digests(out) == before


def test_figures_of_an_adaptive_multi_system_run_and_all_match_the_runs_own(tmp_path, capsys):
    opts = dict(target_options={"dim": 2}, rounds=4, chains=5, systems=2, explorer="slice",
                seed=3, progress=False)
    now, later = tmp_path / "now", tmp_path / "later"
    nrpt.sample("geometric-gaussian-path", out=str(now), figures="all", **opts)
    nrpt.sample("geometric-gaussian-path", out=str(later), **opts)
    assert main(["figures", str(later), "--all"]) == 0
    capsys.readouterr()
    drawn = sorted(p.name for p in now.glob("*.png"))
    assert {"local_barrier.png", "schedules.png", "trace.png", "rank.png"} <= set(drawn)
    assert sorted(p.name for p in later.glob("*.png")) == drawn
    for name in drawn:
        assert (later / name).read_bytes() == (now / name).read_bytes(), name
    # the main figures drawn again: the trace and rank plots stay listed while they exist
    main_names = nrpt.figures(later)
    listed = json.loads((later / "summary.json").read_text())["figures"]
    assert listed[:len(main_names)] == main_names and {"trace.png", "rank.png"} <= set(listed)


def test_figures_refuses_a_deep_run_folder(tmp_path):
    deep = tmp_path / "deep"
    deep.mkdir()
    (deep / "cli.json").write_text("{}")
    with pytest.raises(ValueError, match="nrpt deep"):
        nrpt.figures(deep)


def test_figures_keeps_resumes_own_advice_where_it_does_not_apply(tmp_path):
    # an edited budget: the way out is to restore config.toml or extend with `nrpt resume`
    # (nrpt figures takes no --iterations), so that advice is left as resume words it
    out = tmp_path / "run"
    nrpt.sample("gaussian", chains=4, iterations=200, seed=1, out=str(out), progress=False)
    cfg = out / "config.toml"
    cfg.write_text(cfg.read_text().replace("iterations = 200", "iterations = 300"))
    with pytest.raises(ValueError, match=r"cannot draw the figures of .*`nrpt resume .* "
                                         r"--iterations N`"):
        nrpt.figures(out)
