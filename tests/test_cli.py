"""The command-line contract: flags, run folder, summary keys, rerun from config.toml."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from nrpt.run.cli import main

SUMMARY_KEYS = {"round_trips", "round_trips_a5", "restarts", "swap_acceptance", "barrier",
                "schedule", "n_iterations", "wall_time_s"}


def run_cli(args, capsys):
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_run_writes_the_run_folder_and_summary(tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, _ = run_cli(["run", "--iterations", "400", "--chains", "6", "--scheme", "deo",
                               "--explorer", "mala", "--seed", "3", "--out", str(out),
                               "--no-progress"], capsys)
    assert code == 0
    assert "round trips" in stdout and "swap acceptance" in stdout
    for name in ("config.toml", "summary.json", "samples.npy", "index.npy", "checkpoint.pt"):
        assert (out / name).exists(), name
    summary = json.loads((out / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(summary)
    assert summary["n_iterations"] == 400 and summary["window"] == 1
    assert len(summary["swap_acceptance"]) == 5 and len(summary["schedule"]) == 6
    samples = np.load(out / "samples.npy")
    assert samples.shape == (400, 2) and np.isfinite(samples).all()
    index = np.load(out / "index.npy")
    assert index.shape == (401, 1, 6)
    assert (np.sort(index, axis=-1) == np.arange(6)).all()  # every row is a permutation

    # rerunning from config.toml reproduces the draws bit for bit
    again = tmp_path / "again"
    code, _, _ = run_cli(["run", "--config", str(out / "config.toml"), "--out", str(again),
                          "--no-progress"], capsys)
    assert code == 0
    assert np.array_equal(np.load(again / "samples.npy"), samples)


def test_window_auto_is_w_star_of_the_rejection_measured_while_tuning(tmp_path, capsys):
    # noisy swaps (DEO_W's setting; with exact Metropolis swaps a window > 1 is refused)
    noisy = ["--explorer", "sgld", "--noise-sd", "1.0"]
    out = tmp_path / "auto"
    code, _, _ = run_cli(["run", "--iterations", "600", "--scheme", "deo-w", "--window", "auto",
                          "--window-tune", "200", "--chains", "8", "--out", str(out),
                          "--no-progress", "--burn-in", "0", *noisy], capsys)
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    r = summary["window_rejection"]
    assert 0.0 < r < 1.0 and summary["window_source"] == "auto"
    # W* = ceil((log P + log log P) / -log r), Deng et al. (2023)
    expected = math.ceil((math.log(8) + math.log(math.log(8))) / -math.log(r))
    assert summary["window"] == expected
    # and the measured rejection is the tuning segment's (DEO): rerun only that segment
    tune = run_cli(["run", "--iterations", "200", "--chains", "8", "--scheme", "deo",
                    "--out", str(tmp_path / "tune"), "--no-progress", "--figures", "false",
                    "--burn-in", "0", *noisy], capsys)
    assert tune[0] == 0
    acc = json.loads((tmp_path / "tune" / "summary.json").read_text())["swap_acceptance"]
    assert r == pytest.approx(1.0 - float(np.mean(acc)), abs=1e-12)


def test_window_swap_rate_is_w_star_of_one_minus_s(tmp_path, capsys):
    out = tmp_path / "sr"
    code, _, _ = run_cli(["run", "--preset", "none", "--explorer", "sgd", "--iterations", "50",
                          "--chains", "16", "--scheme", "deo-w", "--window", "swap-rate",
                          "--swap-rate", "0.4", "--out", str(out), "--no-progress",
                          "--figures", "false"], capsys)
    assert code == 0
    assert json.loads((out / "summary.json").read_text())["window"] == 8  # Algorithm 1, P = 16


def test_user_target_file(tmp_path, capsys):
    f = tmp_path / "model.py"
    f.write_text(
        "import torch\n"
        "class Banana:\n"
        "    dim = 2\n"
        "    def energy(self, x):\n"
        "        return 0.5 * x[:, 0] ** 2 + 0.5 * (x[:, 1] - x[:, 0] ** 2) ** 2\n"
        "TARGET = Banana()\n"
    )
    code, stdout, _ = run_cli(["run", "--target", f"{f}:TARGET", "--iterations", "200",
                               "--no-progress"], capsys)
    assert code == 0 and "round trips" in stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--chains", "1"], "chains must be an integer >= 2"),
        (["--scheme", "deo-w", "--window", "0"], "window must be an integer >= 1"),
        (["--preset", "none", "--step-size", "-1"], "step_size must be a finite number > 0"),
        (["--preset", "none", "--temperatures", "1,3,2", "--chains", "3"],
         "strictly increasing"),
        (["--target", "no-such-target"], "no-such-target"),
        (["--preset", "none", "--noise-sd", "1"], "noise_sd does not apply"),
        (["--explorer", "sgd", "--momentum", "0.5"], "momentum does not apply"),
        (["--explorer", "sgld", "--step-size", "0.5"], "step_size does not apply"),
        (["--seed", str(2 ** 64)], "seed must be an integer in [0, 18446744073709551615]"),
        (["--rounds", "30"], "rounds must be an integer in [1, 24]"),
        (["--device", "foo"], "device must be"),
        (["--device", "meta"], "device must be cpu or an available accelerator"),
        (["--preset", "none", "--option", "penalty=maybe"], "penalty"),
    ],
)
def test_bad_flags_fail_with_a_message(args, message, capsys):
    code, _, err = run_cli(["run", "--iterations", "5", "--no-progress", *args], capsys)
    assert code == 2
    assert message in err


def test_out_at_a_file_and_config_at_a_directory_are_clear_errors(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    for args, message in [(["--out", str(f)], "is a file"),
                          (["--out", str(f / "sub")], "is under the file"),
                          (["--config", str(tmp_path)], "is a directory"),
                          (["--config", str(tmp_path / "none.toml")], "does not exist")]:
        code, _, err = run_cli(["run", "--iterations", "5", "--no-progress", *args], capsys)
        assert code == 2 and err.startswith("nrpt: error:") and message in err, (args, err)


def test_config_type_errors_name_the_setting(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    for text, message in [("version = 2\n[run]\ntarget = 5\n", "target must be a built-in"),
                          ("version = 2\n[run]\nchains = 3\n", "it belongs in [ladder]"),
                          ("version = 2\n[swap]\nwindow = 2\n", "window does not apply"),
                          ("chains = 'ten'\n", "chains must be an integer")]:
        bad.write_text(text)
        code, _, err = run_cli(["run", "--config", str(bad), "--no-progress"], capsys)
        assert code == 2 and message in err, (text, err)


def test_list_shows_every_registered_name(capsys):
    from nrpt.run import registry

    code, out, _ = run_cli(["list"], capsys)
    assert code == 0
    for role in ("explorer", "scheme", "rule", "adaptor", "target"):
        for name in registry.names(role):
            assert name in out


def test_unknown_scheme_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--scheme", "xyz"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_a_target_that_fails_mid_run_is_a_clear_error(tmp_path, capsys):
    f = tmp_path / "flaky.py"
    f.write_text(
        "import torch\n"
        "class Flaky:\n"
        "    dim = 1\n"
        "    calls = 0\n"
        "    def energy(self, x):\n"
        "        Flaky.calls += 1\n"
        "        if Flaky.calls > 300:\n"
        "            raise KeyError('lost the data')\n"
        "        return 0.5 * x[:, 0] ** 2\n"
        "TARGET = Flaky()\n")
    out = tmp_path / "run"
    code, _, err = run_cli(["run", "--target", f"{f}:TARGET", "--iterations", "2000",
                            "--checkpoint-every", "100", "--out", str(out), "--no-progress"],
                           capsys)
    assert code == 2
    assert err.startswith("nrpt: error: iteration") and "KeyError: 'lost the data'" in err
    assert "nrpt resume" in err and (out / "checkpoint.pt").exists()


def test_a_start_outside_the_support_says_what_a_cli_user_can_do(tmp_path, capsys):
    """The error named initial_states, which no flag sets: it says where to define them.
    The failed start leaves no run folder behind."""
    f = tmp_path / "halfline.py"
    body = ("import torch\n"
            "class HalfLine:\n"
            "    dim = 1\n"
            "    def energy(self, x):\n"
            "        return torch.where(x[:, 0] > 0, x[:, 0], torch.inf)\n"
            "{extra}"
            "TARGET = HalfLine()\n")
    f.write_text(body.format(extra=""))
    out = tmp_path / "run"
    args = ["run", "--target", f"{f}:TARGET", "--preset", "none", "--iterations", "50",
            "--out", str(out), "--no-progress", "--figures", "false"]
    code, _, err = run_cli(args, capsys)
    assert code == 2 and "non-finite energy" in err
    assert "initial_states(n, generator)" in err and "in that file" in err
    assert not out.exists()
    f.write_text(body.format(extra="    def initial_states(self, n, generator):\n"
                                   "        return torch.rand(n, 1, generator=generator, "
                                   "dtype=torch.float64) + 0.5\n"))
    code, stdout, _ = run_cli(args, capsys)
    assert code == 0 and "round trips" in stdout
