"""The mix25 protocol of the peer benchmark (benchmarks/peers): the nrpt target is normalized
(Z = 1/144 with the uniform prior), the NumPy likelihood the peers use is the same function,
and the scoring helpers (modes, frequencies, round trips, index rebuilt from swaps) are right
on synthetic data; negative controls show the checks can fail."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

PEERS = Path(__file__).resolve().parents[1] / "benchmarks" / "peers"
sys.path.insert(0, str(PEERS))

import protocol  # noqa: E402
from mix25_nrpt import Mix25  # noqa: E402

from nrpt.targets.protocol import validate_target  # noqa: E402


def _grid(h: float = 0.02):
    g = torch.arange(-protocol.BOX + h / 2, protocol.BOX, h, dtype=torch.float64)
    x, y = torch.meshgrid(g, g, indexing="ij")
    return torch.stack([x.reshape(-1), y.reshape(-1)], -1), h * h


def _evidence(target) -> float:
    """Z = int pi_0 L over the box by the midpoint rule (beta = 1)."""
    pts, area = _grid()
    log_f = target.reference_log_prob(pts) + target.log_likelihood(pts)
    return float(torch.exp(torch.logsumexp(log_f, 0)) * area)


class WrongSigma(Mix25):
    """Negative control: kernels of width 0.25 under the normalizing constant of sigma = 0.2."""

    def __init__(self):
        super().__init__(sigma=0.2)
        self.sigma = 0.25


def test_target_is_normalized_and_follows_the_protocol():
    t = Mix25()
    validate_target(t)
    assert t.reference_is_normalized
    z = _evidence(t)
    assert abs(z * 144.0 - 1.0) < 1e-3
    assert math.isclose(protocol.LOG_Z, -math.log(144.0))


def test_numpy_quadrature_of_the_peers_side():
    assert protocol.log_z_at(1.0, h=0.04) == pytest.approx(protocol.LOG_Z, abs=1e-6)
    assert -0.03 < protocol.log_z_at(protocol.BETA_MIN, h=0.04) < -0.01  # ~ 1e-3 E_prior[l]


def test_a_wrong_sigma_fails_the_normalization_check():
    z = _evidence(WrongSigma())
    assert abs(z * 144.0 - 1.0) > 0.5  # (0.25 / 0.2)^2 = 1.5625


def test_reference_is_uniform_on_the_box():
    t = Mix25()
    x = t.reference_sample(4000, torch.Generator().manual_seed(0))
    assert x.abs().max() <= protocol.BOX
    assert abs(float(x.mean())) < 0.2 and abs(float(x.var()) - 12.0) < 0.8  # var 144/12
    out = torch.tensor([[6.5, 0.0], [0.0, -7.0]], dtype=torch.float64)
    assert torch.isinf(t.reference_log_prob(out)).all()


def test_numpy_likelihood_of_the_peers_matches_the_nrpt_target():
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.uniform(-6, 6, (500, 2)),
                        protocol.CENTRES + 0.1 * rng.standard_normal((25, 2))])
    ours = Mix25().log_likelihood(torch.as_tensor(x)).numpy()
    np.testing.assert_allclose(protocol.log_likelihood(x), ours, rtol=1e-12, atol=1e-9)
    assert not np.allclose(protocol.log_likelihood(x, sigma=0.25), ours)  # negative control
    np.testing.assert_allclose(protocol.log_prior(x), protocol.LOG_Z)
    assert protocol.log_prior(np.array([6.1, 0.0])) == -np.inf


def test_ladder_and_scales():
    b = protocol.betas()
    assert len(b) == 8 and b[0] == 1.0 and math.isclose(b[-1], 1e-3)
    assert np.allclose(np.diff(np.log(b)), math.log(1e-3) / 7)
    s = protocol.scales()
    assert math.isclose(s[0], 0.35) and max(s) <= 12.0
    assert math.isclose(s[-1], min(12.0, 0.35 / math.sqrt(1e-3)))


def test_modes_and_frequencies_on_synthetic_draws():
    rng = np.random.default_rng(2)
    c = protocol.CENTRES
    assert (protocol.mode_of(c) == np.arange(25)).all()
    assert (protocol.mode_of(c + 0.3 * rng.uniform(-1, 1, c.shape)) == np.arange(25)).all()
    # nearest centre: (0.9, 0) -> (0, 0) = mode 12; (1.1, 0) -> (2, 0) = mode 17; far out
    # points go to the nearest corner mode
    assert protocol.mode_of(np.array([[0.9, 0.0], [1.1, 0.0], [-5.9, 5.9]])).tolist() == \
        [12, 17, 4]
    uniform = np.repeat(c, 40, axis=0)  # 40 draws in every mode
    assert protocol.modes_visited(uniform) == 25
    assert protocol.max_frequency_error(uniform) == pytest.approx(0.0)
    one = np.repeat(c[:1], 100, axis=0)
    assert protocol.modes_visited(one) == 1
    assert protocol.max_frequency_error(one) == pytest.approx(1 - 1 / 25)
    five = np.repeat(c[:5], 20, axis=0)
    assert protocol.modes_visited(five) == 5
    assert protocol.max_frequency_error(five) == pytest.approx(0.2 - 0.04)
    # draw_metrics: [S, K, 2]; the first half (all in mode 0) is burn-in, the second uniform
    first = np.repeat(c[:1], 50, axis=0)
    second = c[np.arange(50) % 25]
    draws = np.stack([np.concatenate([first, second])] * 3)
    m = protocol.draw_metrics(draws)
    assert m["modes_visited"] == 25 and m["max_freq_error"] == pytest.approx(0.0)
    assert m["n_draws"] == 300 and m["n_draws_kept"] == 150
    bad = protocol.draw_metrics(np.stack([np.concatenate([second, first])] * 3))
    assert bad["max_freq_error"] == pytest.approx(1 - 1 / 25)  # negative control


def test_round_trips_on_synthetic_index_processes():
    top = 7
    paths = np.array([
        [0, 3, 7, 4, 0, 7, 0, 5],  # from 0: two trips
        [7, 0, 7, 0, 3, 2, 1, 6],  # starts at the top: 0 -> 7 -> 0 is one trip
        [3, 7, 2, 0, 5, 7, 6, 1],  # top before any 0 does not count; then 0 -> 7, not back
        [0, 0, 1, 2, 1, 0, 0, 0],  # never reaches the top
    ]).T
    assert protocol.round_trips(paths, top).tolist() == [2, 1, 0, 0]
    m = protocol.trip_metrics(paths, top, iterations=7, systems_equivalent=2)
    assert m["round_trips_total"] == 3 and m["round_trips_per_system"] == 1.5
    assert m["round_trips_per_iter"] == pytest.approx(1.5 / 7)


def test_index_rebuilt_from_adjacent_swaps():
    # P = 4, R = 2: system 0 swaps pair (0, 1) then pair (1, 2); system 1 swaps (2, 3) twice
    acc = np.zeros((2, 3, 2), dtype=bool)
    acc[0, 0, 0] = True
    acc[1, 1, 0] = True
    acc[0, 2, 1] = acc[1, 2, 1] = True
    idx = protocol.index_from_adjacent_swaps(acc)  # slot_of[K + 1, R, P]
    assert idx[0].tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert idx[1, 0].tolist() == [1, 0, 2, 3]  # replicas 0 and 1 exchanged slots
    assert idx[2, 0].tolist() == [2, 0, 1, 3]  # then the replica at slot 1 (0) went to 2
    assert idx[1, 1].tolist() == [0, 1, 3, 2] and idx[2, 1].tolist() == [0, 1, 2, 3]
    # a full up-and-down trip through the adjacent swaps of one replica, R = 1, P = 3
    acc = np.zeros((4, 2, 1), dtype=bool)
    acc[0, 0, 0] = acc[1, 1, 0] = acc[2, 1, 0] = acc[3, 0, 0] = True
    idx = protocol.index_from_adjacent_swaps(acc)
    assert idx[:, 0, 0].tolist() == [0, 1, 2, 1, 0]
    assert protocol.round_trips(idx[:, 0, :], 2).tolist() == [1, 0, 0]


def test_one_run_per_process_by_default(monkeypatch, capsys):
    """Every runner times one run per process unless asked for a warm-up (the TFP runner used
    to execute its whole program twice): the ensemble runners' frame and nrpt's runner call
    their run once; ``--warmup 20`` (the negative control) adds the short run before it."""
    calls = []

    def fake(args, n, seed):
        calls.append((n, seed))

    res = protocol.warm_then_time(fake, protocol.ensemble_args("x", []))
    assert calls == [(protocol.ITERATIONS, 1)] and protocol.WARMUP == 0
    calls.clear()
    protocol.warm_then_time(fake, protocol.ensemble_args("x", ["--warmup", "20"]))
    assert calls == [(20, 1 + 10**6), (protocol.ITERATIONS, 1)]
    assert res[1] < 0.01  # no warm-up time

    import run_nrpt

    real = run_nrpt.run

    def counted(args, iterations, seed, ticks=None):
        calls.append((iterations, seed))
        return real(args, iterations, seed, ticks)

    monkeypatch.setattr(run_nrpt, "run", counted)
    for argv, want in (([], [(40, 1)]), (["--warmup", "8"], [(8, 1 + 10**6), (40, 1)])):
        calls.clear()
        run_nrpt.main(["--iterations", "40", "--systems", "2", *argv])
        assert calls == want
        assert '"warmup_s"' in capsys.readouterr().out
    tfp = (PEERS / "run_tfp.py").read_text()
    assert "default=protocol.WARMUP" in tfp and "if args.warmup > 0:" in tfp


def test_nrpt_runs_the_protocols_scales():
    """nrpt's fixed runner keeps the protocol's RWMH scales, as the peers do: nrpt's default
    re-tunes them in its burn-in (another kernel, 10 % fewer round trips on mix25, stop 36);
    the adaptive variant (the control) tunes them between rounds."""
    import argparse

    import run_nrpt

    args = argparse.Namespace(chains=8, systems=2, zero_end=False, variant="fixed")
    res = run_nrpt.run(args, 40, 1)
    assert res.summary["step_size_tuned_in_burn_in"] is False
    np.testing.assert_array_equal(np.asarray(res.summary["step_size"]),
                                  np.tile(protocol.scales(8), (2, 1)))
    res = run_nrpt.run(argparse.Namespace(**{**vars(args), "variant": "adaptive"}), 40, 1)
    assert not np.array_equal(np.asarray(res.summary["step_size"])[-1], protocol.scales(8))


def test_bench_byte_compiles_nrpt_and_the_runners(tmp_path, monkeypatch):
    """bench.py compiles nrpt's sources and the runners' modules before the timed runs (the
    peers' and torch's bytecode was written at install), into ``__pycache__`` even under
    PYTHONDONTWRITEBYTECODE, only the runners' folder itself (not the peer venv below it);
    the negative control: an uncompiled tree has no bytecode."""
    import bench

    root, here = tmp_path / "root", tmp_path / "root" / "benchmarks" / "peers"
    (root / "src" / "nrpt" / "sub").mkdir(parents=True)
    (root / "src" / "nrpt" / "sub" / "m.py").write_text("X = 1\n")
    (here / ".venv").mkdir(parents=True)
    (here / "runner.py").write_text("Y = 2\n")
    (here / ".venv" / "site.py").write_text("Z = 3\n")
    monkeypatch.setattr(bench, "ROOT", root)
    monkeypatch.setattr(bench, "HERE", here)
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    assert not list(root.rglob("*.pyc"))
    bench.byte_compile()
    assert list((root / "src" / "nrpt" / "sub" / "__pycache__").glob("m.*.pyc"))
    assert list((here / "__pycache__").glob("runner.*.pyc"))
    assert not (here / ".venv" / "__pycache__").exists()
