"""Deep runs' settings are declared like every other component's: each method declares the
options only it reads, a setting no chosen method reads is an error naming it (for a method
registered later too: a dummy one here), and ``nrpt deep``'s flags and ``--help`` groups are
generated from the declarations."""

from __future__ import annotations

import argparse

import pytest
import torch

from nrpt.deep import DeepConfig, fit
from nrpt.deep import methods as dm
from nrpt.options import Option, integer, parse_int


@pytest.fixture
def dummy():
    """A method registered from this module only: one momentum-SGD chain per replica whose
    number of collected slots is its own option ``dummy_slots``."""
    slots = Option("dummy_slots", integer(1), 1, parse=parse_int,
                   help="dummy: slots whose models are collected")

    @dm.method("dummy", options=(slots,))
    def build(ctx: dm.Context) -> dm.Setup:
        from nrpt.explorers.sgmcmc import MomentumSGD
        from nrpt.swap import Deterministic, NoSwap

        cfg = ctx.cfg
        eng = ctx.engine(MomentumSGD(ctx.estimator, momentum=cfg.momentum),
                         [0.0] * cfg.chains, cfg.lr_max / ctx.N, NoSwap(), Deterministic(0.0))
        return dm.Setup(eng, list(range(cfg.dummy_slots)))

    yield "dummy"
    del dm.BUILDERS["dummy"]


def test_a_registered_method_gets_its_option_and_others_refuse_it(dummy):
    cfg = DeepConfig(method=dummy, dummy_slots=2)
    assert cfg.dummy_slots == 2 and cfg.swap_rate is None and cfg.swag_rank is None
    assert DeepConfig(method=dummy).dummy_slots == 1  # its declared default
    with pytest.raises(ValueError, match="dummy_slots must be an integer >= 1; got 0"):
        DeepConfig(method=dummy, dummy_slots=0)
    # a setting the chosen method does not read is an error naming it and its method
    with pytest.raises(ValueError, match="dummy_slots does not apply to method 'deo': "
                                         "dummy_slots is for method 'dummy'"):
        DeepConfig(method="deo", dummy_slots=2)
    with pytest.raises(ValueError, match="swap_rate does not apply to method 'dummy'"):
        DeepConfig(method=dummy, swap_rate=0.1)
    # the run reads it: two slots collected per interval
    g = torch.Generator().manual_seed(0)
    X = torch.randn(60, 4, generator=g)
    y = (X[:, 0] > 0).long()
    net = torch.nn.Sequential(torch.nn.Linear(4, 2))
    res = fit(net, (X, y), (X, y), method=dummy, chains=2, epochs=2, batch_size=20,
              pretrain_epochs=0, strategy="loop", dummy_slots=2)
    assert res.summary["method"] == "dummy" and res.models.shape[0] == 2 * 2


def test_negative_control_an_unregistered_option_is_unknown():
    """Without the dummy method its option is no setting at all (the check above is not
    vacuous: the option exists only through the method's declaration)."""
    assert "dummy" not in dm.BUILDERS
    with pytest.raises(TypeError, match="unknown setting"):
        DeepConfig(dummy_slots=2)
    # and a method's own setting given to a method that reads it is accepted
    assert DeepConfig(method="swag", swag_rank=3).swag_rank == 3


@pytest.mark.parametrize("kwargs, name", [
    (dict(method="deo", window=3), "window"), (dict(method="ensemble", swap_rate=0.1), "swap_rate"),
    (dict(swag_rank=3), "swag_rank"), (dict(method="swag", temperature=0.5), "temperature"),
    (dict(method="cyclical", lr=0.1), "lr")])
def test_a_setting_the_method_does_not_read_is_refused_by_name(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name} does not apply to method"):
        DeepConfig(**kwargs)


def _deep_parser() -> argparse.ArgumentParser:
    from nrpt.run.cli import _parser

    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["deep"]


def test_flags_and_help_groups_come_from_the_declarations(dummy):
    from nrpt.deep.config import declarations

    p = _deep_parser()
    flags = {a.dest: a for a in p._actions if a.option_strings}
    for opt, _ in declarations():
        assert opt.name in flags, opt.name  # the dummy's too
    groups = {g.title: [a.dest for a in g._group_actions] for g in p._action_groups}
    assert groups["settings of method dummy"] == ["dummy_slots"]
    assert groups["settings of method swag"] == ["swag_rank", "swag_samples"]
    assert groups["settings of methods ensemble, swag"] == ["lr"]


def test_cli_refuses_a_setting_the_method_does_not_read(capsys):
    from nrpt.run.cli import main

    assert main(["deep", "--method", "ensemble", "--swag-rank", "3", "--no-progress"]) == 2
    assert "swag_rank does not apply to method 'ensemble'" in capsys.readouterr().err
    # the dataset's defaults are defaults: swap_rate (mnist1d: 0.05) is dropped for ensemble
    from nrpt.deep import cli

    ns = _deep_parser().parse_args(["--method", "ensemble", "--epochs", "0", "--no-progress"])
    with pytest.raises(ValueError, match="epochs must be a finite number > 0"):
        cli._start(ns)
