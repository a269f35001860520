"""nrpt.report.health: each check fires on a bad run and stays quiet on a good one (synthetic
inputs)."""

import ast
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from nrpt.report import health
from nrpt.report.health import (
    Finding,
    SamplingWarning,
    check_run,
    emit,
    format_findings,
    slot0_diagnostics,
)


def codes(findings):
    return [f.code for f in findings]


def ar1(rng, rho, shape):
    """AR(1) chains along axis 1 with N(0, 1) marginals."""
    x = np.empty(shape)
    x[:, 0] = rng.normal(size=(shape[0],) + shape[2:])
    s = math.sqrt(1 - rho**2)
    for t in range(1, shape[1]):
        x[:, t] = rho * x[:, t - 1] + s * rng.normal(size=(shape[0],) + shape[2:])
    return x


# ---------------------------------------------------------------- pair acceptance

def test_pair_acceptance_fires_on_blocked_pair():
    acc = np.array([[0.01, 0.6, 0.7], [0.03, 0.5, 0.6]])
    f = check_run(swap_acceptance=acc)
    assert codes(f) == ["pair-acceptance"]
    assert "slots 0 and 1" in f[0].message and "0.01" in f[0].message
    assert "chains" in f[0].knob and "rounds" in f[0].knob


def test_pair_acceptance_quiet_and_ignores_never_attempted():
    acc = np.array([[0.85, np.nan, 0.3], [0.9, 0.4, np.nan]])
    assert check_run(swap_acceptance=acc) == []
    assert check_run(swap_acceptance=[0.04, 0.5], pair_floor=0.03) == []


def test_pair_acceptance_many_pairs_is_one_finding():
    f = check_run(swap_acceptance=[0.01, 0.02, 0.5, 0.001])
    # (Lambda-hat = 3.5 on 5 chains: the ladder is also too short, said separately)
    assert codes(f) == ["pair-acceptance", "too-few-chains"]
    assert "3 of 4" in f[0].message and "slots 3 and 4" in f[0].message


# ---------------------------------------------------------------- restarts

def test_no_restarts_fires_when_some_were_expected():
    acc = np.full((2, 9), 0.5)  # predicted rate 1/20 per iteration
    f = check_run(swap_acceptance=acc, restarts=[0, 40], n_iterations=1000)
    assert codes(f) == ["no-restarts"]
    assert "1 of 2 systems" in f[0].message and "iterations" in f[0].knob


def test_no_restarts_fires_for_400d_like_ladder():
    # pair (0, 1) at 0.01: still ~40 restarts expected in 10k iterations (and the pair fires)
    acc = np.array([[0.01] + [0.6] * 8])
    f = check_run(swap_acceptance=acc, restarts=[0], n_iterations=10_000)
    assert codes(f) == ["pair-acceptance", "no-restarts"]


def test_no_restarts_quiet():
    acc = np.full((2, 9), 0.5)
    assert check_run(swap_acceptance=acc, restarts=[12, 40], n_iterations=1000) == []
    # too short a run to expect any: 20 iterations at rate 1/20 after the 9-step lead-in
    assert check_run(swap_acceptance=acc, restarts=[0, 0], n_iterations=20) == []
    # restarts without the iteration count: skipped
    assert check_run(restarts=[0]) == []


def test_no_restarts_without_swap_rates_uses_perfect_swaps():
    assert codes(check_run(restarts=0, n_iterations=100, n_chains=10)) == ["no-restarts"]
    assert check_run(restarts=0, n_iterations=12, n_chains=10) == []


# ---------------------------------------------------------------- explorer acceptance

def test_explorer_acceptance_fires_when_frozen():
    acc = np.array([[0.0015, 0.3, 0.35, 0.28]])
    f = check_run(explorer_acceptance=acc, explorer_target=0.3, explorer_name="hmc")
    assert codes(f) == ["explorer-acceptance"]
    assert "slot 0" in f[0].message and "0.0015" in f[0].message
    assert "too large" in f[0].message and f[0].knob == "step_size"


def test_explorer_acceptance_fires_when_steps_too_small():
    f = check_run(explorer_acceptance=[0.3, 0.5, 0.99], explorer_target=0.3)
    assert codes(f) == ["explorer-acceptance"] and "too small" in f[0].message


def test_explorer_acceptance_quiet():
    acc = np.array([[0.3, 0.25, 0.4], [0.31, 0.2, 0.5]])
    assert check_run(explorer_acceptance=acc, explorer_target=0.3) == []
    # no target (slice, SG explorers), inexact runs, exactly refreshed reference slot: skipped
    assert check_run(explorer_acceptance=[0.0015, 1.0], explorer_target=None) == []
    assert check_run(explorer_acceptance=[1.0, 1.0], explorer_target=0.3, exact=False) == []
    assert check_run(explorer_acceptance=[0.3, 0.99], explorer_target=0.3,
                     reference_exact=True) == []


# ---------------------------------------------------------------- hot slot

def test_hot_slot_stuck_fires_on_small_spread():
    rng = np.random.default_rng(1)
    hot = 0.1 * rng.normal(size=(2, 500, 3))
    f = check_run(hot_states=hot, reference_spread=np.ones(3))
    assert codes(f) == ["hot-slot-stuck"]
    assert "reference sd" in f[0].message and "max_temperature" in f[0].knob


def test_hot_slot_stuck_fires_when_systems_disagree():
    rng = np.random.default_rng(2)
    hot = rng.normal(size=(3, 500, 2))
    hot[1] += 10.0  # each system's hot chain sits near its own start
    f = check_run(hot_states=hot)
    assert codes(f) == ["hot-slot-stuck"] and "3 systems" in f[0].message
    # the same from summary statistics
    f = check_run(hot_states={"mean": hot.mean(axis=1), "sd": hot.std(axis=1)})
    assert codes(f) == ["hot-slot-stuck"]


def test_hot_slot_stuck_fires_when_frozen():
    f = check_run(hot_states=np.zeros((500, 2)))
    assert codes(f) == ["hot-slot-stuck"] and "never moved" in f[0].message


def test_hot_slot_quiet():
    rng = np.random.default_rng(3)
    hot = 5.0 * rng.normal(size=(4, 500, 3))
    assert check_run(hot_states=hot, reference_spread=5.0) == []
    assert check_run(hot_states=hot[0], reference_spread=[5.0, 5.0, 5.0]) == []
    assert check_run(hot_states={"mean": hot.mean(axis=1), "sd": hot.std(axis=1)}) == []


# ---------------------------------------------------------------- slot 0: R-hat and ESS

def test_r_hat_fires_on_systems_in_different_modes():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(2, 1000, 1))
    x[0] -= 5.0
    x[1] += 5.0
    f = check_run(slot0=x)
    assert "r-hat" in codes(f)
    r = next(g for g in f if g.code == "r-hat")
    assert "across 2 systems" in r.message and "iterations" in r.knob


def test_r_hat_and_ess_quiet_on_iid_systems():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(2, 2000, 3))
    assert check_run(slot0=x) == []
    assert check_run(slot0=slot0_diagnostics(x)) == []


def test_slot0_findings_from_the_draws_or_their_diagnostics_are_equal():
    """A run's summary hands check_run the slot0_diagnostics dict it already computed, not the
    draws (nrpt.report.summary._health): the findings must be the same for every branch --
    modes apart (r-hat), sticky (low-ess), frozen, one system, constant systems (inf / NaN
    R-hat) and healthy draws; the negative control: other draws give other findings."""
    rng = np.random.default_rng(11)
    apart = rng.normal(size=(2, 500, 2))
    apart[0] -= 5.0
    const = np.ones((2, 40, 2))
    const[1] += 1.0  # within-system sd 0, systems apart: R-hat inf / NaN
    cases = [apart, ar1(rng, 0.995, (2, 2000, 1)), np.zeros((2, 50, 1)), const,
             ar1(rng, 0.99, (1, 800, 3)), rng.normal(size=(3, 300, 2))]
    found = []
    for x in cases:
        f = check_run(slot0=x)
        assert check_run(slot0=slot0_diagnostics(x)) == f
        found.append(codes(f))
    assert found[0] != found[-1] and "r-hat" in found[0] and found[-1] == []


def test_low_ess_fires_on_sticky_chain():
    rng = np.random.default_rng(6)
    x = ar1(rng, 0.995, (2, 2000, 1))
    f = check_run(slot0=x)
    assert "low-ess" in codes(f)
    e = next(g for g in f if g.code == "low-ess")
    assert "below 200" in e.message


def test_slot0_diagnostics_iid():
    rng = np.random.default_rng(7)
    R, n = 4, 1000
    d = slot0_diagnostics(rng.normal(size=(R, n, 3)))
    assert d["n_systems"] == R and d["n_draws"] == n
    json.dumps(d)  # plain Python, JSON-ready
    for key in ("ess_bulk", "ess_tail"):
        assert all(abs(e - n * R) <= 0.2 * n * R for e in d[key]), (key, d[key])
    assert all(abs(r - 1.0) <= 0.01 for r in d["r_hat"])
    assert all(abs(m) < 0.1 for m in d["mean"]) and all(abs(s - 1) < 0.1 for s in d["sd"])


def test_slot0_diagnostics_one_system_and_shapes():
    rng = np.random.default_rng(8)
    d = slot0_diagnostics(rng.normal(size=(2000, 2)))  # [n, dim] = one system
    assert d["n_systems"] == 1 and len(d["r_hat"]) == 2
    assert all(abs(r - 1.0) <= 0.01 for r in d["r_hat"])
    assert slot0_diagnostics(rng.normal(size=500))["n_draws"] == 500  # [n]: one coordinate
    # one system whose halves disagree (a mode switch half way) is flagged by split R-hat
    x = rng.normal(size=(1000, 1))
    x[500:] += 5.0
    assert "r-hat" in codes(check_run(slot0=x))


def test_slot0_diagnostics_tiny_and_degenerate_inputs_are_quiet():
    # filterwarnings=error: no ArviZ / numpy warning may escape
    d = slot0_diagnostics(np.zeros((1, 3, 2)))
    assert d["r_hat"] == [None, None] and d["mean"] == [0.0, 0.0]
    d = slot0_diagnostics(np.ones((2, 1, 1)))
    assert d["sd"] == [0.0]
    d = slot0_diagnostics(np.array([[[np.nan], [1.0], [2.0], [3.0], [4.0]]]))
    assert d["mean"] == [None]
    f = check_run(slot0=np.zeros((2, 50, 1)))  # a frozen slot 0 (ArviZ reports ESS = n R)
    assert codes(f) == ["low-ess"] and "never change" in f[0].message


def test_slot0_diagnostics_do_not_need_arviz(monkeypatch):
    monkeypatch.setitem(sys.modules, "arviz", None)  # import arviz -> ImportError
    d = slot0_diagnostics(np.random.default_rng(9).normal(size=(2, 100, 2)))
    assert all(e > 50 for e in d["ess_bulk"]) and all(r < 1.1 for r in d["r_hat"])
    assert len(d["mean"]) == 2 and all(s is not None for s in d["sd"])


@pytest.mark.parametrize("shape,rho", [((4, 1000), 0.0), ((2, 501), 0.9), ((3, 64), 0.6),
                                       ((1, 400), 0.95)])
def test_ess_and_rhat_match_arviz(shape, rho):
    """nrpt's rank-normalized split R-hat and bulk/tail ESS are ArviZ's numbers (odd lengths,
    one chain, ties from rounding and a stuck chain included)."""
    az = pytest.importorskip("arviz")
    from nrpt.diagnostics import ess

    rng = np.random.default_rng(int(rho * 100) + shape[1])
    x = ar1(rng, rho, (*shape, 1))[..., 0]
    cases = [x, np.round(x, 1), np.concatenate([x[:1] + 3.0, x[1:]]) if shape[0] > 1 else x]
    for y in cases:
        ds = az.convert_to_dataset({"y": y})
        want = {"bulk": float(az.ess(ds, method="bulk")["y"]),
                "tail": float(az.ess(ds, method="tail")["y"])}
        np.testing.assert_allclose(ess.ess_bulk(y), want["bulk"], rtol=1e-9)
        np.testing.assert_allclose(ess.ess_tail(y), want["tail"], rtol=1e-9)
        if shape[0] >= 2:
            np.testing.assert_allclose(ess.rhat(y), float(az.rhat(ds)["y"]), rtol=1e-9)
    # negative control: the comparison sees a 1 % change in the draws' autocorrelation time
    assert abs(ess.ess_bulk(x) / float(az.ess(az.convert_to_dataset({"y": np.repeat(
        x, 2, axis=1)[:, :shape[1]]}), method="bulk")["y"]) - 1) > 0.01


# ---------------------------------------------------------------- output

def test_emit_raises_sampling_warning():
    f = check_run(explorer_acceptance=[0.0015], explorer_target=0.3)
    with pytest.warns(SamplingWarning, match=r"\(turn: step_size\)"):
        emit(f)
    assert issubclass(SamplingWarning, UserWarning)


def test_emit_points_at_the_caller():
    with pytest.warns(SamplingWarning) as rec:
        emit([Finding("x", "A sentence.", "knob")])
    assert rec[0].filename == __file__


def test_emit_nothing_is_silent():
    emit([])  # filterwarnings=error would turn any warning into a failure


def test_format_findings():
    f = [Finding("r-hat", "Slot-0 R-hat is 1.5.", "iterations")]
    assert format_findings(f) == ["[r-hat] Slot-0 R-hat is 1.5. (turn: iterations)"]


def test_combined_healthy_run_is_quiet():
    rng = np.random.default_rng(10)
    assert check_run(swap_acceptance=np.full((2, 9), 0.7), restarts=[80, 75], n_iterations=2000,
                     explorer_acceptance=np.full((2, 10), 0.3), explorer_target=0.3,
                     explorer_name="rwmh", hot_states=rng.normal(size=(2, 500, 2)),
                     reference_spread=1.0, slot0=rng.normal(size=(2, 2000, 2))) == []


def test_module_imports_only_numpy():
    tree = ast.parse(Path(health.__file__).read_text())
    top = set()
    for node in tree.body:  # module level only: arviz is imported lazily inside a function
        if isinstance(node, ast.Import):
            top |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "health must not import other nrpt modules"
            top.add(node.module.split(".")[0])
    assert top <= {"__future__", "logging", "math", "warnings", "collections", "contextlib",
                   "dataclasses", "numpy"}, top
