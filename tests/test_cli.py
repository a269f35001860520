"""The command-line contract: flags, run folder, summary keys, rerun from config.toml."""

from __future__ import annotations

import json

import numpy as np
import pytest

from nrpt.cli import main

SUMMARY_KEYS = {"round_trips", "round_trips_a5", "restarts", "swap_acceptance", "barrier",
                "schedule", "n_iterations", "wall_time_s"}


def run_cli(args, capsys):
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_run_writes_the_run_folder_and_summary(tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, _ = run_cli(["run", "--iterations", "400", "--chains", "6", "--scheme", "deo-w",
                               "--window", "2", "--explorer", "mala", "--seed", "3", "--out",
                               str(out), "--no-progress"], capsys)
    assert code == 0
    assert "round trips" in stdout and "swap acceptance" in stdout
    for name in ("config.toml", "summary.json", "samples.npy", "index.npy", "checkpoint.pt"):
        assert (out / name).exists(), name
    summary = json.loads((out / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(summary)
    assert summary["n_iterations"] == 400 and summary["window"] == 2
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


def test_window_auto_picks_w_star_after_tuning(tmp_path, capsys):
    out = tmp_path / "auto"
    code, _, _ = run_cli(["run", "--iterations", "600", "--scheme", "deo-w", "--window", "auto",
                          "--out", str(out), "--no-progress"], capsys)
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert isinstance(summary["window"], int) and summary["window"] >= 1


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
        (["--step-size", "-1"], "step_size must be > 0"),
        (["--temperatures", "1,3,2", "--chains", "3"], "strictly increasing"),
        (["--target", "no-such-target"], "no-such-target"),
    ],
)
def test_bad_flags_fail_with_a_message(args, message, capsys):
    code, _, err = run_cli(["run", "--iterations", "5", "--no-progress", *args], capsys)
    assert code == 2
    assert message in err


def test_unknown_scheme_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--scheme", "xyz"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
