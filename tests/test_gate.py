"""DEO_W's gate (at most one swap per pair per window) with exact Metropolis swaps is refused.

The gate makes later swap attempts depend on earlier verdicts; when the verdicts depend on the
states and the energies are exact, slot 0 is biased (issue 21: a 2-D banana gave sd(x1) = 2.81
for 2 and E[x2] = 1.97 for 0 under ``--scheme deo-w --window auto``).  Every run passes
:func:`nrpt.swap.schemes.check_gate` in :func:`nrpt.run.build.build`: the Python API, the CLI and
config files alike.  The statistical demonstration that the refusal is needed (the biased
moment at a fixed seed, beyond the Monte Carlo error, while DEO passes) is
``tests/test_invariance.py::test_deo_w_with_exact_metropolis_swaps_is_biased_which_is_why_runs_refuse_it``.
"""

from __future__ import annotations

import pytest
import torch

import nrpt
from nrpt.run.api import run_config
from nrpt.run.cli import main
from nrpt.run.config import RunConfig
from nrpt.swap import FixedRate, Metropolis

FAST = dict(iterations=40, chains=4, figures=False)

BANANA = '''
class Banana:
    """x1 ~ N(0, 2^2), x2 | x1 ~ N((x1^2 - 4) / 2, 1): sd(x1) = 2, E[x2] = 0."""
    dim = 2
    name = "banana"

    def energy(self, x):
        x1, x2 = x[:, 0], x[:, 1]
        return x1 ** 2 / 8 + (x2 - 0.5 * (x1 ** 2 - 4)) ** 2 / 2


TARGET = Banana()
'''


def _says_why_and_what(message: str, window: str) -> None:
    for part in ("scheme 'deo-w'", f"window {window}", "swap_rule 'metropolis'",
                 "exact energies", "at most once per window", "use scheme 'deo'", "2.81"):
        assert part.lower() in message.lower(), (part, message)


@pytest.mark.parametrize("window, shown", [(2, "2"), ("auto", "'auto'"),
                                           ("swap-rate", "8 (window 'swap-rate')")])
def test_the_api_refuses_deo_w_with_exact_metropolis_swaps(window, shown):
    with pytest.raises(ValueError) as err:
        nrpt.sample("gaussian", scheme="deo-w", window=window, **{**FAST, "chains": 16})
    _says_why_and_what(str(err.value), shown)


def test_the_readme_recipe_is_refused_on_the_command_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_model.py").write_text(BANANA)
    code = main(["run", "--target", "my_model.py:TARGET", "--chains", "16", "--iterations", "50",
                 "--scheme", "deo-w", "--window", "auto", "--explorer", "mala", "--seed", "1",
                 "--out", "runs/mine", "--no-progress"])
    assert code != 0
    _says_why_and_what(capsys.readouterr().err, "'auto'")
    # ... and the corrected recipe runs
    code = main(["run", "--target", "my_model.py:TARGET", "--chains", "16", "--iterations", "50",
                 "--scheme", "deo", "--explorer", "mala", "--seed", "1", "--out", "runs/ok",
                 "--no-progress", "--figures", "false"])
    assert code == 0


def test_a_config_file_is_refused_too(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('version = 2\n[run]\ntarget = "gaussian"\niterations = 40\n'
                    '[swap]\nscheme = "deo-w"\nwindow = 4\n')
    with pytest.raises(ValueError) as err:
        run_config(RunConfig.from_toml(path))
    _says_why_and_what(str(err.value), "4")


def test_a_metropolis_rule_object_is_refused_and_a_state_free_rule_is_not():
    with pytest.raises(ValueError, match="would give a biased answer"):
        nrpt.sample("gaussian", scheme="deo-w", window=3, rule=Metropolis(), **FAST)
    # verdicts that ignore the states: the gate biases nothing (scheme studies, benchmarks)
    for rule in (FixedRate(0.3), None):
        res = nrpt.sample("gaussian", scheme="deo-w", window=3, rule=rule,
                          swap_rule=None if rule else "always", **FAST)
        assert res.summary["window"] == 3 and "approximations" not in res.summary


def test_window_one_is_deo_and_allowed():
    a = nrpt.sample("gaussian", scheme="deo-w", window=1, **FAST)
    b = nrpt.sample("gaussian", scheme="deo", **FAST)
    assert torch.equal(torch.as_tensor(a.samples), torch.as_tensor(b.samples))
    assert "approximations" not in a.summary


def test_noisy_swaps_keep_deo_w_and_say_it_is_approximate():
    # the paper's setting: noisy energies (here the bias-corrected rule); the gate's bias is
    # named in the summary rather than silent
    res = nrpt.sample("twenty-five-modes", explorer="sgld", noise_sd=1.0, scheme="deo-w",
                      window=2, **FAST)
    (note,) = res.summary["approximations"]
    assert "at most once per pair per window" in note and "'bias-corrected'" in note
    # the default DEO*-SGD recipe (deterministic rule) too
    res = nrpt.sample(explorer="sgd", scheme="deo-w", window="swap-rate", noise_sd=2.0, **FAST)
    assert "'deterministic'" in res.summary["approximations"][0]
    # bias-corrected swaps of exact energies are Metropolis swaps: refused like them
    with pytest.raises(ValueError, match="swap_rule 'bias-corrected' on exact energies"):
        nrpt.sample("twenty-five-modes", explorer="sgld", scheme="deo-w", window=2, **FAST)
