"""Smoke tests of the benchmark scripts: they run end to end on tiny sizes and write what they
promise (no timing assertions: the numbers depend on the machine and its load)."""

import importlib.util
import json
import math
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # 5.5 s; make bench-scaling runs the script itself
def test_scaling_quick(tmp_path):
    scaling = _load("scaling")
    out = tmp_path / "scaling.json"
    result = scaling.main(["--quick", "--P", "4", "8", "--dims", "2", "20", "--dim-P", "4",
                           "--reps", "2", "--min-time", "0.002", "--warmup", "2",
                           "--leapfrog", "2", "--extra-systems", "2", "--logistic-dims", "30",
                           "--logistic-n", "20",
                           "--json", str(out), "--figures-dir", str(tmp_path)])
    data = json.loads(out.read_text())
    assert data["rows"] == json.loads(json.dumps(result["rows"]))
    meta = data["meta"]
    for key in ("torch_threads", "cpu_model", "torch", "reps", "leapfrog", "loadavg_start"):
        assert key in meta
    assert meta["torch_threads"] == 1
    rows = data["rows"]
    # P sweep: 3 explorers x 2 P, plus RWMH at R = 2; dimension sweep: 3 explorers x 2 d
    assert len([r for r in rows if r["sweep"] == "P"]) == 3 * 2 + 2
    assert len([r for r in rows if r["sweep"] == "dim"]) == 3 * 2
    logistic = [r for r in rows if r["sweep"] == "dim-logistic"]  # 3 explorers x 1 d
    assert len(logistic) == 3 and {r["target"] for r in logistic} == {"logistic-regression-30x20"}
    assert {r["explorer"] for r in rows} == {"rwmh", "mala", "hmc"}
    assert {r["systems"] for r in rows if r["sweep"] == "P"} == {1, 2}
    for r in rows:
        for key in ("full_us", "bare_us", "floor_us", "full_over_bare", "full_over_floor"):
            assert math.isfinite(r[key]) and r[key] > 0, (key, r)
        for kind in ("full", "bare", "floor"):
            reps = r["reps_us"][kind]
            assert len(reps) == 2 and all(math.isfinite(t) and t > 0 for t in reps)
            assert r["iterations_per_rep"][kind] >= 1
        assert r["loop_threads"] == 1
        assert r["evals_per_iteration"] == (2 if r["explorer"] == "hmc" else 1)
    for name in ("P", "dim"):
        fig = Path(data["figures"][name])
        assert fig.parent == tmp_path and fig.stat().st_size > 0
    assert {p.name for p in tmp_path.glob("*.png")} == {"scaling_P.png", "scaling_dim.png"}
