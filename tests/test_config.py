"""RunConfig: sections, defaults that depend on the run, settings that do not apply are errors,
files of an unknown version refused, and a table of bad inputs that grows with every
setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from nrpt.run.config import SECTIONS, RunConfig

DATA = Path(__file__).parent / "data"


def test_defaults_depend_on_the_run_and_what_does_not_apply_is_none():
    exact = RunConfig()
    assert exact.explorer == "rwmh" and exact.step_size == 0.35 and exact.swap_rule == "metropolis"
    assert exact.lr_min is None and exact.noise_sd is None and exact.window is None
    sgd = RunConfig(explorer="sgd")
    assert sgd.step_size is None and sgd.lr_min == 0.003 and sgd.swap_rule == "deterministic"
    assert sgd.bottom_temperature == 1.0 and sgd.max_temperature is None
    sgld = RunConfig(explorer="sgld")
    assert sgld.swap_rule == "bias-corrected" and sgld.variance_every == 100
    # --rounds makes slice the default explorer for the API as for the CLI
    adaptive = RunConfig(rounds=4)
    assert adaptive.explorer == "slice" and adaptive.iterations is None
    assert RunConfig(scheme="deo-w").window == "auto"
    assert RunConfig(scheme="deo-w", iterations=500).window_tune == 50


def test_a_setting_that_does_not_apply_is_an_error_naming_it():
    # the review's example: sgld ignored step_size (identical samples at 0.01 and 0.5)
    for kw, name in [(dict(explorer="sgld", step_size=0.5), "step_size"),
                     (dict(noise_sd=1.0), "noise_sd"),
                     (dict(explorer="sgd", momentum=0.5), "momentum"),
                     (dict(scheme="deo", window=3), "window"),
                     (dict(rounds=3, iterations=100), "iterations"),
                     (dict(explorer="sgd", swap_rule="deterministic", variance_factor=2.0),
                      "variance_factor"),
                     (dict(leapfrog_steps=5), "leapfrog_steps"),
                     (dict(adapt_schedule=False), "adapt_schedule"),
                     (dict(explorer="msgd", temperatures=[1.0, 2.0]), "temperatures")]:
        with pytest.raises(ValueError, match=f"^{name} does not apply"):
            RunConfig(**kw)


def test_defaults_from_a_preset_are_dropped_when_they_do_not_apply():
    from nrpt.run.sgpt import HEADLINE

    cfg = RunConfig.from_dict({"scheme": "deo"}, defaults=HEADLINE)
    assert cfg.scheme == "deo" and cfg.window is None and cfg.explorer == "sgd"
    cfg = RunConfig.from_dict({"explorer": "sgld", "chains": 4}, defaults=HEADLINE)
    assert cfg.bottom_temperature is None and cfg.max_temperature == 25.0
    assert cfg.explicit == {"explorer", "chains"}


def test_toml_round_trip_in_sections(tmp_path):
    cfg = RunConfig(explorer="sghmc", chains=4, noise_sd=0.5, scheme="deo-w",
                    window="swap-rate", target_options={"penalty": True})
    cfg.write_toml(tmp_path / "c.toml")
    text = (tmp_path / "c.toml").read_text()
    for sec in SECTIONS:
        if sec != "adaptation":
            assert f"[{sec}]" in text, sec
    assert "step_size" not in text  # not applicable: not written
    again = RunConfig.from_toml(tmp_path / "c.toml")
    assert again == cfg
    assert again.replace(iterations=20).iterations == 20


def test_toml_strings_with_control_characters_read_back_equal(tmp_path):
    """config.toml is written by tomli-w: quotes, backslashes, newlines and other control
    characters in a setting are escaped (the old hand-written writer left them raw, and the
    file did not load)."""
    odd = 'tab\there, bell\x07, "quoted" \\ back\nslash\r\x1f end'
    cfg = RunConfig(target_options={"label": odd, "n": 3})
    cfg.write_toml(tmp_path / "c.toml")
    again = RunConfig.from_toml(tmp_path / "c.toml")
    assert again.target_options == {"label": odd, "n": 3} and again == cfg


def test_a_file_without_a_known_version_is_refused_saying_how_to_rewrite_it(tmp_path):
    """nrpt 0.1's flat files (no version) and files of an unknown version are refused with a
    message naming the version this nrpt reads (the 0.1 compatibility layer is gone)."""
    with pytest.raises(ValueError, match="has no version.*no longer read.*rewrite it in "
                                         "sections"):
        RunConfig.from_toml(DATA / "legacy_default.toml")
    f = tmp_path / "future.toml"
    f.write_text("version = 3\n[run]\nchains = 4\n")
    with pytest.raises(ValueError, match="config version 3 is not one this nrpt reads "
                                         r"\(version 2\)"):
        RunConfig.from_toml(f)


# -- the bad-input table: one row per way a setting can be wrong; grows with every setting
BAD = [
    (dict(chains=1), "chains must be an integer >= 2"),
    (dict(chains=2.5), "chains must be an integer"),
    (dict(chains=True), "chains must be an integer"),
    (dict(chains="auto"), "chains = 'auto' grows the ladder between adaptive rounds: give "
                          "rounds"),
    (dict(chains=10, max_chains=5, rounds=3), "max_chains must be >= chains"),
    (dict(max_chains=2, rounds=3), "max_chains must be an integer >= 3"),
    (dict(max_chains=20), "max_chains does not apply"),
    (dict(chains=4, min_chains=5, rounds=3), "min_chains must be <= chains"),
    (dict(min_chains=1, rounds=3), "min_chains must be an integer >= 2"),
    (dict(min_chains=2), "min_chains does not apply"),
    (dict(iterations=0), "iterations must be an integer >= 1"),
    (dict(burn_in=1.0), "burn_in must be a fraction of iterations in [0, 1)"),
    (dict(burn_in=-0.1), "burn_in must be a fraction"),
    (dict(burn_in=100, iterations=100), "integer count of iterations in [0, 99]"),
    (dict(burn_in=True), "burn_in must be"),
    (dict(burn_in="10%"), "burn_in must be"),
    (dict(burn_in=0.1, rounds=3), "burn_in does not apply"),
    (dict(burn_in=0, explorer="rwmh", adapt_step_size=True), "adapt_step_size does not apply"),
    (dict(explorer="slice", target_acceptance=0.5), "target_acceptance does not apply"),
    (dict(rounds=0), "rounds must be an integer in [1, 24]"),
    (dict(rounds=25), "rounds must be an integer in [1, 24]"),
    (dict(systems=0), "systems must be an integer >= 1"),
    (dict(seed=-1), "seed must be an integer in [0, "),
    (dict(seed=2 ** 64), "seed must be an integer in [0, "),
    (dict(dtype="float16"), "dtype must be one of float64, float32"),
    (dict(device="foo"), "device must be"),
    (dict(device=3), "device must be a torch device name"),
    (dict(target=5), "target must be a built-in name"),
    (dict(target_options=[1]), "target_options must be a table"),
    (dict(explorer="gibbs"),
     "explorer must be one of rwmh, mala, hmc, slice, automala, nuts, sgld"),
    (dict(scheme="zigzag"), "scheme must be one of adj, seo, deo, deo-w, ape, none"),
    (dict(scheme="deo-w", window=0), "window must be an integer >= 1"),
    (dict(scheme="deo-w", window="big"), "window must be an integer >= 1, 'auto'"),
    (dict(scheme="deo-w", window="auto", rounds=3), "window 'auto' (a tuning segment)"),
    (dict(scheme="deo-w", window="auto", iterations=100, window_tune=100),
     "window_tune must be an integer in [1, 99]"),
    (dict(step_size=0), "step_size must be a finite number > 0"),
    (dict(step_size=float("nan")), "step_size must be a finite number > 0"),
    (dict(step_size=[0.1, 0.2]), "step_size has 2 entries but chains = 10"),
    (dict(explorer="hmc", leapfrog_steps=0), "leapfrog_steps must be an integer >= 1"),
    (dict(n_explore=0), "n_explore must be an integer >= 1"),
    (dict(max_temperature=1.0), "max_temperature must be a finite number > 1"),
    (dict(chains=3, temperatures=[1, 3, 2]), "temperatures must be strictly increasing"),
    (dict(chains=3, temperatures=[2, 3, 4]), "temperatures[0] must be 1.0"),
    (dict(chains=3, temperatures=[1, 2]), "temperatures has 2 entries but chains = 3"),
    (dict(chains=3, betas=[1, 0.5, 0.7]), "betas must be strictly decreasing"),
    (dict(chains=3, betas=[1, 0.5, 0], temperatures=[1, 2, 3]), "not both"),
    (dict(explorer="slice", slice_method="bisect"), "slice_method must be one of"),
    (dict(explorer="nuts", max_tree_depth=0), "max_tree_depth must be an integer in"),
    (dict(explorer="automala", max_doublings=61), "max_doublings must be an integer in"),
    (dict(rounds=3, reference="posterior"), "reference must be one of prior, variational"),
    (dict(reference="variational"), "reference 'variational' is fitted between adaptive rounds"),
    (dict(explorer="sghmc", momentum=1.0), "momentum must be a finite number >= 0.0 and < 1.0"),
    (dict(explorer="sgd", domain="cube:1"), "domain"),
    (dict(explorer="sgd", lr_min=0.5, lr_max=0.1), "lr_max (0.1) must be larger than lr_min"),
    (dict(explorer="sgd", lr_min=-1), "lr_min must be a finite number > 0"),
    (dict(explorer="sgd", chains=3, learning_rates=[0.1, 0.05, 0.2]), "strictly increasing"),
    (dict(explorer="sgd", swap_rule="metropolis"), "swap_rule must be one of deterministic"),
    (dict(swap_rule="deterministic"), "swap_rule must be one of metropolis, always"),
    (dict(explorer="sgd", swap_rate=1.0), "swap_rate S must be a number in (0, 1)"),
    (dict(explorer="sgd", correction=float("inf")), "correction must be a finite number"),
    (dict(explorer="sgd", adapt="yes"), "adapt must be true or false"),
    (dict(explorer="sgd", sa_step=[1, 2]), "sa_step must be [a, kappa, b]"),
    (dict(explorer="sgd", sa_step=[1, 0.3, 1]), "sa_step kappa must be a finite number > 0.5"),
    (dict(explorer="sgd", ladder_update="geometric"), "ladder_update must be one of"),
    (dict(ladder_update="log-gaps"), "ladder_update"),
    (dict(explorer="sgd", bottom_temperature=-1), "bottom_temperature must be a finite number"),
    (dict(explorer="sgld", variance_factor=0.5), "variance_factor must be a finite number >= 1"),
    (dict(explorer="sgld", variance_every=0), "variance_every must be an integer >= 1"),
    (dict(rounds=3, adapt_step_size="no"), "adapt_step_size must be true or false"),
    (dict(rounds=3, explorer="rwmh", target_acceptance=1.5), "target_acceptance must be"),
    (dict(rounds=3, explorer="sgd"), "rounds (adaptive NRPT with exact swaps) needs an exact"),
    (dict(explorer="sgd", noise_sd=-1), "noise_sd must be a finite number >= 0.0"),
    (dict(explorer="sgd", grad_noise_sd=float("nan")), "grad_noise_sd must be a finite number"),
    (dict(rounds=3, adapt_schedule=1), "adapt_schedule must be true or false"),
    (dict(explorer="sgd", batch_size=1), "batch_size must be an integer >= 2"),
    (dict(explorer="sgd", vr_every=-1), "vr_every must be an integer >= 0"),
    (dict(thin=0), "thin must be an integer >= 1"),
    (dict(iterations=10, thin=11), "thin (11) must be <= iterations (10)"),
    (dict(rounds=3, thin=9), "thin (9) must be <= the last round's length"),
    (dict(checkpoint_every=0), "checkpoint_every must be an integer >= 1"),
    (dict(figures="no"), "figures must be true, false or all"),
    (dict(noise_dtype="half"), "noise_dtype must be one of float64, float32"),
    (dict(compile="yes"), "compile must be true or false"),
    (dict(compile=True, explorer="slice"), "compile is for explorers rwmh, mala, hmc"),
    (dict(fuse="yes"), "fuse must be auto, true, false or a chunk length"),
    (dict(fuse=0), "fuse must be auto, true, false or a chunk length"),
    (dict(fuse=True, explorer="slice"), "fuse is for explorers rwmh, mala, hmc"),
    (dict(out=5), "out must be a folder path"),
    (dict(rounds=3, explorer="mala", precondition="full"),
     "precondition must be one of none, diagonal, dense, auto"),
]


@pytest.mark.parametrize("kwargs, message", BAD, ids=[str(sorted(k)) for k, _ in BAD])
def test_bad_input_is_a_clear_error(kwargs, message):
    with pytest.raises(ValueError) as err:
        RunConfig(**kwargs)
    assert message in str(err.value)


def test_the_table_covers_every_setting():
    from nrpt.run.config import known_options

    covered = {k for kw, _ in BAD for k in kw}
    every = set(known_options()) | {"target_options"}
    # target_options' content is the target's business (checked when the target is built)
    assert every - covered == set()


# -- issue 26's fuzz cases: each one failed on the code before it (a KeyError traceback, or a
# NumPy / torch scalar refused as "must be a finite number ... got np.float32(0.3)")
def _np_torch_scalars():
    import numpy as np
    import torch

    return [
        (dict(explorer="sgd", swap_rate=np.float32(0.3)), "swap_rate", 0.3),
        (dict(step_size=np.float64(0.5)), "step_size", 0.5),
        (dict(step_size=torch.tensor(0.25)), "step_size", 0.25),
        (dict(chains=np.int64(4)), "chains", 4),
        (dict(iterations=torch.tensor(50)), "iterations", 50),
        (dict(seed=np.uint64(2 ** 63)), "seed", 2 ** 63),
        (dict(max_temperature=np.float32(12.5)), "max_temperature", 12.5),
        (dict(chains=3, temperatures=[1.0, np.float32(2.0), torch.tensor(4.0)]),
         "temperatures", [1.0, 2.0, 4.0]),
        (dict(explorer="sgd", sa_step=(np.int32(50), np.float16(0.75), 500)), "sa_step",
         [50.0, 0.75, 500.0]),
        (dict(figures=np.bool_(False)), "figures", False),
        (dict(burn_in=np.float32(0.2)), "burn_in", 0.2),
        (dict(target_options={"penalty": np.bool_(True)}), "target_options", {"penalty": True}),
    ]


def test_numpy_and_torch_scalars_are_numbers():
    for kwargs, name, want in _np_torch_scalars():
        got = getattr(RunConfig(**kwargs), name)
        assert got == want and type(got) is type(want), (kwargs, got)
        if isinstance(got, list):
            assert all(type(v) is float for v in got)


def test_numpy_and_torch_scalars_that_are_not_numbers_are_still_refused():
    import numpy as np
    import torch

    for kwargs, message in [(dict(chains=np.bool_(True)), "chains must be an integer"),
                            (dict(chains=torch.tensor(True)), "chains must be an integer"),
                            (dict(chains=np.float64(2.5)), "chains must be an integer"),
                            (dict(step_size=torch.tensor(1 + 2j)), "step_size must be a finite"),
                            (dict(step_size=torch.tensor([0.1, 0.2])), "step_size"),
                            (dict(step_size=np.float32("nan")), "step_size must be a finite")]:
        with pytest.raises(ValueError, match=message):
            RunConfig(**kwargs)


def test_built_in_target_options_take_numpy_and_torch_scalars():
    import numpy as np
    import torch

    from nrpt.targets.protocol import load_target

    t = load_target("geometric-gaussian-path", dim=np.int64(3), c=torch.tensor(4.0))
    assert t.dim == 3 and type(t.dim) is int
    # was: "penalty must be true or false; got np.True_"
    assert load_target("twenty-five-modes", penalty=np.bool_(True)).penalty is True


#: every boolean flag of `nrpt run` takes these words (any case), and refuses anything else
#: with an argparse error naming the flag (was: a KeyError traceback)
BOOL_FLAGS = [("--compile", []), ("--adapt", ["--explorer", "sgd"]),
              ("--adapt-schedule", ["--rounds", "2"]), ("--adapt-step-size", ["--rounds", "2"])]


@pytest.mark.parametrize("flag, rest", BOOL_FLAGS, ids=[f for f, _ in BOOL_FLAGS])
def test_boolean_flags_take_the_documented_words_or_name_them(flag, rest, capsys):
    from nrpt.run.cli import _parser

    for word, want in [("true", True), ("False", False), ("YES", True), ("no", False),
                       ("on", True), ("Off", False), ("1", True), ("0", False)]:
        args = _parser().parse_args(["run", *rest, flag, word])
        assert getattr(args, flag[2:].replace("-", "_")) is want
    for word in ("maybe", "2", "", "tru"):
        with pytest.raises(SystemExit) as err:
            _parser().parse_args(["run", *rest, flag, word])
        assert err.value.code == 2
        msg = capsys.readouterr().err
        assert f"argument {flag}: expected true or false" in msg and "yes/no" in msg, msg
    with pytest.raises(SystemExit):
        _parser().parse_args(["run", "--fuse", "maybe"])
    assert "argument --fuse: expected auto" in capsys.readouterr().err
    assert _parser().parse_args(["run", "--fuse", "On"]).fuse is True
    assert _parser().parse_args(["run", "--fuse", "16"]).fuse == 16


def test_figures_takes_the_boolean_words_or_all_and_names_itself(capsys):
    # figures = true writes the main figures, all adds the trace and rank plots
    from nrpt.run.cli import _parser

    for word, want in [("true", True), ("Off", False), ("1", True), ("ALL", "all")]:
        assert _parser().parse_args(["run", "--figures", word]).figures == want
    with pytest.raises(SystemExit):
        _parser().parse_args(["run", "--figures", "some"])
    assert "argument --figures: expected true/false (yes/no, on/off, 1/0) or all" in \
        capsys.readouterr().err
    assert RunConfig(figures="all").figures == "all"
