"""A component registered later owns its options like a built-in one: a dummy explorer with its
own option, registered through the public registry from this module alone.  Its option is
accepted with it and checked by its own checker, is an error naming it with any other explorer
(the negative control: the option is not simply accepted everywhere), round-trips through
config.toml in its section, and appears in `nrpt run --help` and `nrpt list`."""

from __future__ import annotations

import re

import pytest

from nrpt.explorers.base import STEP_SIZE
from nrpt.explorers.metropolis import RWMH
from nrpt.options import Option, number, parse_float
from nrpt.run import registry
from nrpt.run.cli import main
from nrpt.run.config import RunConfig, known_options


class Dummy(RWMH):
    """Random-walk Metropolis under another name, with one option of its own."""

    name = "dummy"
    options = (STEP_SIZE, Option("dummy_width", number(0.0, strict=True), default=1.5,
                                 section="explorer", parse=parse_float,
                                 help="proposal width of the dummy explorer"))


@pytest.fixture
def dummy():
    registry.register("explorer", "dummy", Dummy, tags=("exact",),
                      summary="a test's own explorer")
    yield
    registry.unregister("explorer", "dummy")


def test_its_option_is_accepted_with_it_and_checked_by_its_checker(dummy):
    assert RunConfig(explorer="dummy").dummy_width == 1.5  # the declared default
    assert RunConfig(explorer="dummy", dummy_width=3).dummy_width == 3.0
    for bad in (0.0, -1, float("nan"), "wide", True):
        with pytest.raises(ValueError, match=r"^dummy_width must be a finite number > 0\.0"):
            RunConfig(explorer="dummy", dummy_width=bad)


def test_its_option_is_an_error_with_another_explorer(dummy):
    assert RunConfig().dummy_width is None  # not applicable: None, never a silent default
    for other in ("rwmh", "slice", "sgld"):
        with pytest.raises(ValueError, match="^dummy_width does not apply to this .* run "
                                             r"\(explorer '" + other + "'.*dummy_width is for "
                                             "explorer 'dummy'; remove it"):
            RunConfig(explorer=other, dummy_width=2.0)
    # and once unregistered the setting does not exist at all
    registry.unregister("explorer", "dummy")
    try:
        assert "dummy_width" not in known_options()
        with pytest.raises(TypeError, match="unknown setting.*dummy_width"):
            RunConfig(dummy_width=2.0)
    finally:
        registry.register("explorer", "dummy", Dummy, tags=("exact",))


def test_its_option_round_trips_through_config_toml_in_its_section(dummy, tmp_path):
    cfg = RunConfig(explorer="dummy", dummy_width=0.25, chains=3)
    cfg.write_toml(tmp_path / "c.toml")
    text = (tmp_path / "c.toml").read_text()
    assert "[explorer]" in text and "dummy_width = 0.25" in text
    assert RunConfig.from_toml(tmp_path / "c.toml") == cfg


def test_its_option_is_a_flag_in_its_own_help_group_and_listed(dummy, capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = capsys.readouterr().out
    assert "[explorer] explorer dummy:" in text and "--dummy-width" in text
    assert "proposal width of the dummy explorer" in text
    assert main(["list", "explorers"]) == 0
    assert re.search(r"dummy +a test's own explorer \[exact\] \(options: step_size, "
                     r"dummy_width\)", capsys.readouterr().out)  # (names padded to the longest)
    with pytest.raises(SystemExit):  # the flag takes its parser's words only
        main(["run", "--explorer", "dummy", "--dummy-width", "wide"])
    assert "argument --dummy-width: expected a number" in capsys.readouterr().err


def test_without_it_the_flag_does_not_exist(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "--dummy-width" not in capsys.readouterr().out


def test_an_option_declared_twice_with_different_checks_is_refused():
    """Two components reading one setting share its declaration; a second, different
    declaration of the same name would make the setting's meaning depend on the explorer."""

    class Clash(RWMH):
        options = (Option("step_size", number(), default=1.0, section="explorer"),)

    registry.register("explorer", "clash", Clash, tags=("exact",))
    try:
        with pytest.raises(ValueError, match="option 'step_size' of explorer 'clash' is "
                                             "declared twice"):
            RunConfig()
    finally:
        registry.unregister("explorer", "clash")
    assert RunConfig().step_size == 0.35
