"""A target's ``default_settings`` (issue 25 item 5: a Stan program's runs pick MALA with a
per-slot preconditioner when the user chose no explorer)."""

import warnings

import numpy as np
import pytest
import torch

import nrpt
from nrpt.run import registry
from nrpt.run.api import DefaultsWarning, apply_target_defaults


class Scaled:
    """A correlated, badly scaled 3-d Gaussian given as an energy only (like a Stan program)."""

    dim = 3
    name = "scaled-gauss"
    default_reference = "gaussian"
    default_settings = {"explorer": "mala", "precondition": "auto"}

    def __init__(self):
        sd = torch.tensor([1.0, 0.05, 0.002], dtype=torch.float64)
        c = torch.tensor([[1.0, 0.9, 0.0], [0.9, 1.0, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
        self.cov = sd[:, None] * c * sd[None, :]
        self.prec = torch.linalg.inv(self.cov)

    def energy(self, x):
        return 0.5 * ((x @ self.prec.to(x.dtype)) * x).sum(-1)


def _run(**kw):
    # 6 rounds: the defaults (Laplace start, per-slot metric) pass by then; plain MALA has to
    # shrink its first step ~175x by the step tuner alone.  (At 8 rounds plain MALA passes
    # too since the tuner moves a slot frozen two rounds running 10x: the exact reference's
    # swaps then carry slot 0.)
    return nrpt.sample(Scaled(), rounds=6, systems=4, seed=3, figures=False, dtype="float64",
                       **kw)


def test_nothing_chosen_takes_the_targets_defaults_and_passes():
    res = _run()
    assert res.config.explorer == "mala" and res.config.precondition == "auto"
    assert res.summary["preconditioner"]  # a metric was estimated
    x = np.asarray(res.samples).reshape(-1, 3)
    sd = np.sqrt(np.diag(Scaled().cov.numpy()))
    ratio = x.std(0) / sd
    assert np.all((ratio > 0.85) & (ratio < 1.15)), ratio


def _old_target_defaults(target, options):
    """The rule before stop 34 (negative control): an explicit explorer dropped every default."""
    own = getattr(target, "default_settings", None)
    if not own or options.get("rounds") is None or options.get("explorer") is not None:
        return
    for name, value in dict(own).items():
        options.setdefault(name, value)


class StanLike(Scaled):
    """Scaled with a Stan program's defaults (explorer, metric, ladder fitted to the barrier)."""

    default_settings = {"explorer": "mala", "precondition": "auto", "chains": "auto",
                        "min_chains": 2}

    def grad_energy(self, x):  # (a Stan program has its gradient: the Laplace start uses it)
        return x @ self.prec.to(x.dtype)


def _explicit(monkeypatch=None, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DefaultsWarning)  # nothing dropped here
        warnings.simplefilter("ignore", nrpt.SamplingWarning)
        return nrpt.sample(StanLike(), rounds=3, systems=2, seed=3, figures=False,
                           dtype="float64", **kw)


def _keeps_the_defaults(res):
    from nrpt.run.config import AUTO_CHAINS, AUTO_MAX_CHAINS

    return (res.config.precondition == "auto" and res.config.chains == AUTO_CHAINS
            and res.config.max_chains == AUTO_MAX_CHAINS and res.config.min_chains == 2
            and bool(res.summary.get("laplace_start"))
            and bool(res.summary.get("preconditioner")))


@pytest.mark.parametrize("explorer", ["hmc", "slice", "mala"])
def test_a_chosen_explorer_keeps_the_defaults_it_takes(explorer):
    """An explicit explorer replaces the default explorer only: the metric (which every exact
    explorer declares), the Laplace start it brings, chains = "auto" and min_chains stay.
    (Before, ``explorer="hmc"`` silently ran 10 fixed chains with no metric and no Laplace
    start: the negative control below.)"""
    res = _explicit(explorer=explorer)
    assert res.config.explorer == explorer
    assert _keeps_the_defaults(res), (res.config.precondition, res.config.chains)


def test_the_old_rule_fails_the_same_check(monkeypatch):
    """Negative control: the rule that dropped every default fails ``_keeps_the_defaults``."""
    from nrpt.run import api

    monkeypatch.setattr(api, "_target_defaults", _old_target_defaults)
    res = _explicit(explorer="hmc")
    assert not _keeps_the_defaults(res)
    assert res.config.precondition == "none" and res.config.chains == 10


def test_given_settings_win_over_the_defaults():
    res = _explicit(explorer="hmc", precondition="diagonal", chains=4)
    assert res.config.precondition == "diagonal" and res.config.chains == 4
    assert res.config.min_chains != 2 and res.config.max_chains is None


def test_a_default_the_chosen_explorer_does_not_take_is_dropped_with_a_warning():
    """``leapfrog_steps`` (hmc's) under explorer mala, and the metric under an explorer that
    declares no ``precondition``: each left out, said in a warning naming the setting, its
    value and the explorer; the settings no explorer declares still join."""
    own = {"explorer": "hmc", "leapfrog_steps": 5, "precondition": "auto", "chains": "auto",
           "min_chains": 2}
    opts = {"rounds": 4, "explorer": "mala"}
    with pytest.warns(DefaultsWarning, match=r"leapfrog_steps = 5 .*'hmc'.*explorer 'mala' "
                                             r"does not take leapfrog_steps"):
        dropped = apply_target_defaults(own, opts, "target 'x'")
    assert dropped == ["leapfrog_steps"]
    assert opts == {"rounds": 4, "explorer": "mala", "precondition": "auto", "chains": "auto",
                    "min_chains": 2}
    # negative control: the default explorer named explicitly takes all of its settings
    opts = {"rounds": 4, "explorer": "hmc"}
    with warnings.catch_warnings():
        warnings.simplefilter("error", DefaultsWarning)
        assert apply_target_defaults(own, opts, "target 'x'") == []
    assert opts["leapfrog_steps"] == 5

    class Plain:  # a user's exact explorer without a preconditioner
        name = "plain-gp2-test"
        uses_gradient = False
        options = ()

    try:
        from nrpt.run.api import _registered_name

        _registered_name("explorer", Plain())
        opts = {"rounds": 4, "explorer": "plain-gp2-test"}
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            assert apply_target_defaults(own, opts, "t") == ["leapfrog_steps", "precondition"]
        assert [type(w.message) for w in said] == [DefaultsWarning] * 2
        assert "precondition = 'auto'" in str(said[1].message)
        assert "'plain-gp2-test' does not take precondition" in str(said[1].message)
        assert opts["chains"] == "auto" and "precondition" not in opts
    finally:
        registry.unregister("explorer", "plain-gp2-test")


def test_without_rounds_nothing_joins():
    opts = {"explorer": "hmc"}
    assert apply_target_defaults({"precondition": "auto", "chains": "auto"}, opts, "t") == []
    assert opts == {"explorer": "hmc"}


def test_the_command_line_keeps_a_stan_programs_defaults_with_a_named_explorer():
    from nrpt.run.cli import _stan_defaults

    data = {"target": "model.stan", "rounds": 6, "explorer": "hmc"}
    _stan_defaults(data)
    assert data == {"target": "model.stan", "rounds": 6, "explorer": "hmc",
                    "precondition": "auto", "chains": "auto", "min_chains": 2}
    data = {"target": "model.stan", "rounds": 6, "chains": 5}
    _stan_defaults(data)  # given chains: the ladder's bounds are the user's
    assert data == {"target": "model.stan", "rounds": 6, "chains": 5, "explorer": "mala-hmc",
                    "precondition": "auto"}


def test_without_the_defaults_the_same_run_fails():
    """Negative control: the target's defaults are what make the run pass at this length
    (plain MALA read sd ratios 0.82 / 2.17 / 1.18 here; seed 4: 0.49 / 1.85 / 1.07)."""
    res = _run(explorer="mala", precondition="none")
    x = np.asarray(res.samples).reshape(-1, 3)
    sd = np.sqrt(np.diag(Scaled().cov.numpy()))
    ratio = x.std(0) / sd
    assert not np.all((ratio > 0.85) & (ratio < 1.15)), ratio


def _cli_config(tmp_path, toml: str, *flags: str):
    from nrpt.run.cli import _config, _parser

    path = tmp_path / "run.toml"
    path.write_text(toml)
    return _config(_parser().parse_args(["run", "--config", str(path), *flags]))


def test_a_config_file_with_a_stan_program_takes_its_defaults(tmp_path):
    """``nrpt run --config FILE`` joins a .stan target's defaults as the flags alone do: the
    file's and the flags' settings stay, the rest join (before, a config file joined none)."""
    from nrpt.run.cli import _config, _parser

    def by_flags(*flags):
        return _config(_parser().parse_args(["run", *flags])).to_dict()

    head = 'version = 2\n[run]\ntarget = "model.stan"\nrounds = 6\n'
    cfg = _cli_config(tmp_path, head)
    assert cfg.to_dict() == by_flags("--target", "model.stan", "--rounds", "6")
    assert (cfg.explorer, cfg.precondition) == ("mala-hmc", "auto")
    cfg = _cli_config(tmp_path, head + '[explorer]\nexplorer = "hmc"\n', "--chains", "5")
    assert cfg.to_dict() == by_flags("--target", "model.stan", "--rounds", "6", "--explorer",
                                     "hmc", "--chains", "5")
    assert (cfg.explorer, cfg.chains, cfg.precondition) == ("hmc", 5, "auto")
    # control: without rounds nothing joins, so the built-in explorer stays
    cfg = _cli_config(tmp_path, 'version = 2\n[run]\ntarget = "model.stan"\n')
    assert cfg.explorer != "mala-hmc"
